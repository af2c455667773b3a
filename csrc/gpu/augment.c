/*
 * Image augmentation on the GPU (fastread_augment.h): the crop parameters
 * drawn on the host, and the launcher of the fused kernel
 * (device/augment_kernel.cu, compiled through gpu/nvrtc.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "fastread_augment.h"
#include "gpu/device/augment_params.h"
#include "gpu/gpu.h"
#include "gpu/nvrtc.h"

/* Generated at build time (cmake/embed.cmake). */
extern const char fr_embedded_augment_params[];
extern const char fr_embedded_augment_kernel[];

_Static_assert(sizeof(fr_aug_params) <= 4096, "kernel parameters over cuLaunchKernel's 4 KiB");

/* ------------------------------------------------------------ parameters */

/* One generator per (seed, epoch, sample): each key mixed in with its own
 * splitmix64 step, so neighbouring seeds, epochs and indices give unrelated
 * streams, and a sample's draws depend on nothing else (batching, shards). */
static uint64_t sample_stream(uint64_t seed, uint64_t epoch, uint64_t index)
{
    uint64_t s = seed ^ 0x6a09e667f3bcc909ull; /* augment's own streams, not the shuffle's */
    uint64_t k = fr_splitmix64(&s);
    k ^= epoch;
    k = fr_splitmix64(&k);
    k ^= index;
    return fr_splitmix64(&k);
}

/* Uniform in [0, 1), 53 bits. */
static double uniform(uint64_t *state) { return (double)(fr_splitmix64(state) >> 11) * 0x1p-53; }

/* Uniform integer in [lo, hi) (hi > lo), as random.randint(lo, hi - 1). */
static int randint(uint64_t *state, int lo, int hi)
{
    int v = lo + (int)floor(uniform(state) * (double)(hi - lo));
    return v < hi ? v : hi - 1;
}

static int check_crop(const fr_augment_crop *c, char *err, size_t err_len)
{
    if (!(c->scale[0] > 0 && c->scale[0] <= c->scale[1] && isfinite(c->scale[1]))) {
        fr_set_err(err, err_len, "scale must be (low, high) with 0 < low <= high, got (%g, %g)",
                   c->scale[0], c->scale[1]);
        return -EINVAL;
    }
    if (!(c->ratio[0] > 0 && c->ratio[0] <= c->ratio[1] && isfinite(c->ratio[1]))) {
        fr_set_err(err, err_len, "ratio must be (low, high) with 0 < low <= high, got (%g, %g)",
                   c->ratio[0], c->ratio[1]);
        return -EINVAL;
    }
    if (!(c->flip >= 0 && c->flip <= 1)) {
        fr_set_err(err, err_len, "flip must be a probability in [0, 1], got %g", c->flip);
        return -EINVAL;
    }
    return 0;
}

/* torchvision.transforms.RandomResizedCrop.get_params, term for term:
 * Python's round() is round-half-even, as nearbyint in the default mode. */
static void draw_box(uint64_t *st, int height, int width, const fr_augment_crop *c, int32_t *box)
{
    double area = (double)height * (double)width;
    double log_lo = log(c->ratio[0]), log_hi = log(c->ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (c->scale[0] + uniform(st) * (c->scale[1] - c->scale[0]));
        double aspect = exp(log_lo + uniform(st) * (log_hi - log_lo));
        double wf = nearbyint(sqrt(target * aspect)), hf = nearbyint(sqrt(target / aspect));
        if (wf > 0 && wf <= width && hf > 0 && hf <= height) {
            int w = (int)wf, h = (int)hf;
            box[0] = randint(st, 0, height - h + 1);
            box[1] = randint(st, 0, width - w + 1);
            box[2] = h;
            box[3] = w;
            return;
        }
    }
    /* The fallback: the centre crop of the image's aspect clamped to ratio. */
    double in_ratio = (double)width / (double)height;
    int w = width, h = height;
    if (in_ratio < c->ratio[0])
        h = (int)nearbyint((double)w / c->ratio[0]);
    else if (in_ratio > c->ratio[1])
        w = (int)nearbyint((double)h * c->ratio[1]);
    if (h < 1)
        h = 1;
    if (w < 1)
        w = 1;
    box[0] = (height - h) / 2;
    box[1] = (width - w) / 2;
    box[2] = h;
    box[3] = w;
}

int fr_augment_crop_params(uint64_t seed, uint64_t epoch, const int64_t *indices, size_t n,
                           int height, int width, const fr_augment_crop *crop, int32_t *boxes,
                           uint8_t *flips, char *err, size_t err_len)
{
    int rc = check_crop(crop, err, err_len);
    if (rc)
        return rc;
    if (height < 1 || width < 1) {
        fr_set_err(err, err_len, "image size must be positive, got %d x %d", height, width);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t st = sample_stream(seed, epoch, (uint64_t)indices[i]);
        /* The flip first: its draw does not depend on how many tries the box took. */
        flips[i] = uniform(&st) < crop->flip;
        draw_box(&st, height, width, crop, boxes + 4 * i);
    }
    return 0;
}

/* ---------------------------------------------------------------- kernel */

struct fr_augment {
    fr_gpu *gpu;
    void *module;
    void *fn;
    char how[512];
};

int fr_augment_open(int device, const char *nvrtc_path, const char *cache_dir, fr_augment **out,
                    char *err, size_t err_len)
{
    *out = NULL;
    fr_augment *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    int rc = fr_gpu_open(device, &a->gpu, err, err_len);
    if (rc) {
        free(a);
        return rc;
    }
    char why[FR_ERRLEN] = "";
    int cc = 0;
    char *src = NULL;
    if ((rc = fr_gpu_gather_api(a->gpu, why, sizeof(why))) != 0) {
        fr_set_err(err, err_len, "the augmentation kernel needs %s", why);
        goto fail;
    }
    if ((rc = fr_nvrtc_device_cc(a->gpu, &cc, err, err_len)) != 0)
        goto fail;
    size_t len = strlen(fr_embedded_augment_params) + strlen(fr_embedded_augment_kernel) + 2;
    if (!(src = malloc(len))) {
        rc = -ENOMEM;
        goto fail;
    }
    snprintf(src, len, "%s\n%s", fr_embedded_augment_params, fr_embedded_augment_kernel);
    fr_nvrtc_program prog = {.source = src,
                             .file_name = "fastread_augment.cu",
                             .what = "the augmentation kernel",
                             .cache_prefix = "augment",
                             .function = "fr_augment_rrc",
                             .cache_dir = cache_dir,
                             .nvrtc_path = nvrtc_path};
    char tried[1024] = "";
    rc = fr_nvrtc_load(a->gpu, &prog, cc, &a->module, &a->fn, a->how, sizeof(a->how), tried,
                       sizeof(tried), err, err_len);
    free(src);
    if (rc == -ENOENT)
        fr_set_err(err, err_len,
                   "the augmentation kernel is compiled at run time, and NVRTC was not found "
                   "(tried %s): install the CUDA toolkit or pip install nvidia-cuda-nvrtc, or "
                   "set FASTREAD_NVRTC",
                   tried);
    if (rc)
        goto fail;
    *out = a;
    return 0;
fail:
    fr_gpu_close(a->gpu);
    free(a);
    return rc;
}

void fr_augment_close(fr_augment *a)
{
    if (!a)
        return;
    fr_gpu_module_unload(a->gpu, a->module);
    fr_gpu_close(a->gpu);
    free(a);
}

const char *fr_augment_kernel_source(const fr_augment *a) { return a->how; }

static int check_on_device(fr_augment *a, uint64_t ptr, const char *what, char *err,
                           size_t err_len)
{
    int dev = -1;
    if (fr_gpu_pointer_device(a->gpu, ptr, &dev) != 0) {
        fr_set_err(err, err_len, "the %s (0x%llx) is not GPU memory CUDA knows", what,
                   (unsigned long long)ptr);
        return -EINVAL;
    }
    if (dev != fr_gpu_device_id(a->gpu)) {
        fr_set_err(err, err_len, "the %s is on GPU %d, the augmentation runs on GPU %d", what,
                   dev, fr_gpu_device_id(a->gpu));
        return -EINVAL;
    }
    return 0;
}

static int check_batch(fr_augment *a, const fr_augment_batch *b, char *err, size_t err_len)
{
    const int lim = FR_AUG_MAX_SIDE;
    if (b->height < 1 || b->width < 1 || b->height > lim || b->width > lim) {
        fr_set_err(err, err_len, "image size %d x %d: each side must be 1 to %d", b->height,
                   b->width, lim);
        return -EINVAL;
    }
    if (b->out_height < 1 || b->out_width < 1 || b->out_height > lim || b->out_width > lim) {
        fr_set_err(err, err_len, "size %d x %d: each side of the output must be 1 to %d",
                   b->out_height, b->out_width, lim);
        return -EINVAL;
    }
    if (b->dtype != FR_AUGMENT_FLOAT32 && b->dtype != FR_AUGMENT_FLOAT16 &&
        b->dtype != FR_AUGMENT_UINT8) {
        fr_set_err(err, err_len, "dtype %d is not FR_AUGMENT_FLOAT32, FLOAT16 or UINT8",
                   b->dtype);
        return -EINVAL;
    }
    if (b->src_stride < (uint64_t)b->height * (uint64_t)b->width * 3u) {
        fr_set_err(err, err_len, "sample stride %llu is less than one %d x %d x 3 image",
                   (unsigned long long)b->src_stride, b->height, b->width);
        return -EINVAL;
    }
    for (int c = 0; c < 3; c++)
        if (!(b->std[c] != 0 && isfinite(b->std[c]) && isfinite(b->mean[c]))) {
            fr_set_err(err, err_len, "mean and std must be finite and std non-zero (channel %d: "
                       "mean %g, std %g)", c, b->mean[c], b->std[c]);
            return -EINVAL;
        }
    for (size_t i = 0; i < b->n; i++) {
        const int32_t *x = b->boxes + 4 * i;
        /* In 64 bits: a top near INT32_MAX must not wrap the sum below the
         * height and send the kernel rows past the image. */
        if (x[0] < 0 || x[1] < 0 || x[2] < 1 || x[3] < 1 ||
            (int64_t)x[0] + x[2] > b->height || (int64_t)x[1] + x[3] > b->width) {
            fr_set_err(err, err_len, "sample %zu's crop box (top %d, left %d, %d x %d) is not "
                       "inside its %d x %d image", i, x[0], x[1], x[2], x[3], b->height,
                       b->width);
            return -EINVAL;
        }
    }
    int rc = check_on_device(a, b->src, "input batch", err, err_len);
    return rc ? rc : check_on_device(a, b->dst, "output batch", err, err_len);
}

int fr_augment_run(fr_augment *a, const fr_augment_batch *b, char *err, size_t err_len)
{
    if (b->n == 0)
        return 0;
    int rc = check_batch(a, b, err, err_len);
    if (rc)
        return rc;
    fr_aug_params p;
    memset(&p, 0, sizeof(p));
    p.src_stride = b->src_stride;
    p.in_h = b->height;
    p.in_w = b->width;
    p.out_h = b->out_height;
    p.out_w = b->out_width;
    p.dtype = b->dtype;
    for (int c = 0; c < 3; c++) {
        p.scale[c] = 1.0f / b->std[c];
        p.bias[c] = -b->mean[c] / b->std[c];
    }
    const uint64_t plane = (uint64_t)b->out_height * (uint64_t)b->out_width;
    const uint64_t out_sample = plane * 3u * (b->dtype == FR_AUGMENT_FLOAT32 ? 4u
                                             : b->dtype == FR_AUGMENT_FLOAT16 ? 2u : 1u);
    const unsigned block = 256;
    /* Samples per launch: the parameters' room, and a grid under 2^31 blocks. */
    uint64_t per = FR_AUG_CHUNK;
    uint64_t grid_cap = ((1ull << 31) - 1) * block / plane;
    if (per > grid_cap)
        per = grid_cap; /* >= 1: plane < 2^30 */
    for (size_t first = 0; first < b->n; first += per) {
        size_t count = b->n - first < per ? b->n - first : per;
        p.src = b->src + first * b->src_stride;
        p.dst = b->dst + first * out_sample;
        p.n = (int)count;
        for (size_t i = 0; i < count; i++) {
            const int32_t *x = b->boxes + 4 * (first + i);
            p.box[i][0] = (unsigned short)x[0];
            p.box[i][1] = (unsigned short)x[1];
            p.box[i][2] = (unsigned short)x[2];
            p.box[i][3] = (unsigned short)(x[3] | (b->flips && b->flips[first + i] ? FR_AUG_FLIP
                                                                                  : 0));
        }
        uint64_t threads = plane * count;
        unsigned grid = (unsigned)((threads + block - 1) / block);
        void *args[] = {&p};
        rc = fr_gpu_launch(a->gpu, a->fn, grid, block, (fr_CUstream)b->stream, args);
        if (rc) {
            fr_gpu_last_error(a->gpu, err, err_len);
            return rc;
        }
    }
    return 0;
}
