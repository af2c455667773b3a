/*
 * Image augmentation on the GPU (fastread_augment.h): the crop parameters
 * drawn on the host, and the launcher of the fused kernel
 * (device/augment_kernel.cu, compiled through gpu/nvrtc.c).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
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

/* What a batch must be wherever it runs: sizes, dtype, stride, mean and
 * std, every box inside its image. */
static int check_shape(const fr_augment_batch *b, char *err, size_t err_len)
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
    return 0;
}

static int check_batch(fr_augment *a, const fr_augment_batch *b, char *err, size_t err_len)
{
    int rc = check_shape(b, err, err_len);
    if (rc == 0)
        rc = check_on_device(a, b->src, "input batch", err, err_len);
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

/* ------------------------------------------------------------ on the host */

/* float to IEEE half, rounded to nearest even (cvt.rn.f16.f32's rounding):
 * overflow to infinity, NaN kept quiet, subnormals rounded too. */
static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
    if (mag >= 0x477ff000u) /* rounds to 65536 or more */
        return (uint16_t)(sign | 0x7c00u);
    if (mag < 0x38800000u) { /* below 2^-14: a subnormal half (or zero) */
        if (mag < 0x33000000u) /* below half the smallest subnormal */
            return sign;
        uint32_t m = (mag & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(mag >> 23); /* 14..24 */
        uint32_t h = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((mag >> 13) - (112u << 10)), rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

typedef struct host_job {
    const fr_augment_batch *b;
    float scale[3], bias[3];
    size_t next; /* the next sample to take (atomic) */
    int failed;  /* a worker had no memory for its columns (atomic) */
} host_job;

/* Per output column of one sample: the two source byte offsets in a row
 * and the weight of the second; and two source rows interpolated across
 * (channel planes of out_width floats), with the rows they hold (a
 * worker's, reused across its samples). */
typedef struct host_cols {
    int *c0, *c1;
    float *lx;
    float *row[2];
    int held[2];
} host_cols;

/* Source row y of the sample interpolated across, as the kernel's top_v /
 * bot_v: kept in one of hc's two rows unless it is there already, never
 * in the slot of row `keep` (the other row the output row needs). */
static const float *across(host_cols *hc, const unsigned char *src_row, int y, int keep, int ow)
{
    for (int k = 0; k < 2; k++)
        if (hc->held[k] == y)
            return hc->row[k];
    int k = hc->held[0] == keep ? 1 : 0;
    float *out = hc->row[k];
    for (int ox = 0; ox < ow; ox++) {
        const int a0 = hc->c0[ox], a1 = hc->c1[ox];
        const float lx = hc->lx[ox];
        for (int c = 0; c < 3; c++)
            out[c * ow + ox] =
                (float)src_row[a0 + c] + lx * ((float)src_row[a1 + c] - (float)src_row[a0 + c]);
    }
    hc->held[k] = y;
    return out;
}

/* One sample, exactly the kernel's arithmetic (augment_kernel.cu) in the
 * same order, so host and device agree to float rounding. Separable: a
 * source row is interpolated across once however many output rows use it
 * (enlarged crops reuse most), and the blend down runs over contiguous
 * floats. */
static void host_sample(const host_job *j, size_t s, host_cols *hc)
{
    const fr_augment_batch *b = j->b;
    const int32_t *box = b->boxes + 4 * s;
    const int top = box[0], left = box[1], bh = box[2], bw = box[3];
    const int flip = b->flips && b->flips[s];
    const int oh = b->out_height, ow = b->out_width;
    const size_t plane = (size_t)oh * (size_t)ow;
    const unsigned char *img = (const unsigned char *)(uintptr_t)b->src + s * b->src_stride;
    const size_t row = 3u * (size_t)b->width;
    const size_t out0 = s * 3u * plane;
    for (int ox = 0; ox < ow; ox++) {
        const int cx = flip ? ow - 1 - ox : ox;
        float fx = ((float)cx + 0.5f) * ((float)bw / (float)ow) - 0.5f;
        fx = fx > 0.0f ? fx : 0.0f;
        const int x0 = (int)fx < bw - 1 ? (int)fx : bw - 1;
        const int x1 = x0 + 1 < bw - 1 ? x0 + 1 : bw - 1;
        hc->lx[ox] = fx - (float)x0;
        hc->c0[ox] = 3 * (left + x0);
        hc->c1[ox] = 3 * (left + x1);
    }
    hc->held[0] = hc->held[1] = -1; /* the columns changed: rows held are stale */
    for (int oy = 0; oy < oh; oy++) {
        float fy = ((float)oy + 0.5f) * ((float)bh / (float)oh) - 0.5f;
        fy = fy > 0.0f ? fy : 0.0f;
        const int y0 = (int)fy < bh - 1 ? (int)fy : bh - 1;
        const int y1 = y0 + 1 < bh - 1 ? y0 + 1 : bh - 1;
        const float ly = fy - (float)y0;
        const float *t = across(hc, img + (size_t)(top + y0) * row, y0, y1, ow);
        const float *u = across(hc, img + (size_t)(top + y1) * row, y1, y0, ow);
        const size_t r = (size_t)oy * (size_t)ow;
        for (int c = 0; c < 3; c++) {
            const float *tc = t + c * ow, *uc = u + c * ow;
            const size_t o = out0 + (size_t)c * plane + r;
            const float sc = j->scale[c], bi = j->bias[c];
            if (b->dtype == FR_AUGMENT_FLOAT32) {
                float *dst = (float *)(uintptr_t)b->dst + o;
                for (int ox = 0; ox < ow; ox++)
                    dst[ox] = (tc[ox] + ly * (uc[ox] - tc[ox])) * sc + bi;
            } else if (b->dtype == FR_AUGMENT_FLOAT16) {
                uint16_t *dst = (uint16_t *)(uintptr_t)b->dst + o;
                for (int ox = 0; ox < ow; ox++)
                    dst[ox] = f32_to_f16((tc[ox] + ly * (uc[ox] - tc[ox])) * sc + bi);
            } else {
                unsigned char *dst = (unsigned char *)(uintptr_t)b->dst + o;
                for (int ox = 0; ox < ow; ox++) {
                    const float q = rintf(tc[ox] + ly * (uc[ox] - tc[ox]));
                    dst[ox] = (unsigned char)(q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q);
                }
            }
        }
    }
}

static void *host_worker(void *arg)
{
    host_job *j = arg;
    const size_t ow = (size_t)j->b->out_width;
    host_cols hc = {malloc(ow * sizeof(int)),
                    malloc(ow * sizeof(int)),
                    malloc(ow * sizeof(float)),
                    {malloc(3 * ow * sizeof(float)), malloc(3 * ow * sizeof(float))},
                    {-1, -1}};
    if (!hc.c0 || !hc.c1 || !hc.lx || !hc.row[0] || !hc.row[1]) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    } else {
        for (;;) {
            size_t s = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
            if (s >= j->b->n)
                break;
            host_sample(j, s, &hc);
        }
    }
    free(hc.c0);
    free(hc.c1);
    free(hc.lx);
    free(hc.row[0]);
    free(hc.row[1]);
    return NULL;
}

int fr_augment_run_host(const fr_augment_batch *b, unsigned threads, char *err, size_t err_len)
{
    if (b->n == 0)
        return 0;
    int rc = check_shape(b, err, err_len);
    if (rc)
        return rc;
    if (!b->src || !b->dst) {
        fr_set_err(err, err_len, "the input and output batches must be host memory (got NULL)");
        return -EINVAL;
    }
    host_job j;
    memset(&j, 0, sizeof(j));
    j.b = b;
    for (int c = 0; c < 3; c++) {
        j.scale[c] = 1.0f / b->std[c];
        j.bias[c] = -b->mean[c] / b->std[c];
    }
    if (threads < 1)
        threads = 1;
    if (threads > 64)
        threads = 64;
    if ((size_t)threads > b->n)
        threads = (unsigned)b->n;
    pthread_t helpers[63];
    unsigned started = 0;
    for (unsigned t = 1; t < threads; t++) {
        if (pthread_create(&helpers[started], NULL, host_worker, &j) != 0)
            break; /* fewer threads: the caller's share grows, nothing is lost */
        started++;
    }
    host_worker(&j);
    for (unsigned t = 0; t < started; t++)
        pthread_join(helpers[t], NULL);
    if (__atomic_load_n(&j.failed, __ATOMIC_RELAXED)) {
        /* The samples it would have taken went to the others, unless every
         * worker failed: then some are not written. */
        if (__atomic_load_n(&j.next, __ATOMIC_RELAXED) <= b->n) {
            fr_set_err(err, err_len, "out of memory for the output's %d columns", b->out_width);
            return -ENOMEM;
        }
    }
    return 0;
}
