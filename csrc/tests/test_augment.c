/* The augmentation's host side (fastread_augment.h): crop parameters that
 * depend on (seed, epoch, index) alone and lie inside the image, the
 * centre-crop fallback, bad options refused naming them; and, against the
 * mock CUDA driver, fr_augment_open without NVRTC failing with a message
 * that names NVRTC and where it looked, holding nothing afterwards. The
 * kernel itself runs on a real GPU in tests/test_augment.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastread_augment.h"
#include "harness.h"

#define N 2000

static const fr_augment_crop torchvision = {{0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, 0.5};

static void test_params(void)
{
    static int64_t idx[N], rev[N];
    static int32_t a[4 * N], b[4 * N], c[4 * N];
    static uint8_t fa[N], fb[N], fc[N];
    char err[FR_ERRLEN];
    for (int i = 0; i < N; i++) {
        idx[i] = i;
        rev[i] = N - 1 - i;
    }
    CHECK(fr_augment_crop_params(7, 2, idx, N, 100, 150, &torchvision, a, fa, err,
                                 sizeof(err)) == 0);
    /* The same samples in another order (another batch, shard) get the same crops. */
    CHECK(fr_augment_crop_params(7, 2, rev, N, 100, 150, &torchvision, b, fb, err,
                                 sizeof(err)) == 0);
    int same = 1, flips = 0;
    for (int i = 0; i < N; i++) {
        same &= !memcmp(a + 4 * i, b + 4 * (N - 1 - i), 4 * sizeof(int32_t)) &&
                fa[i] == fb[N - 1 - i];
        const int32_t *x = a + 4 * i;
        CHECK(x[0] >= 0 && x[1] >= 0 && x[2] >= 1 && x[3] >= 1 && x[0] + x[2] <= 100 &&
              x[1] + x[3] <= 150);
        flips += fa[i];
    }
    CHECK(same);
    CHECK(flips > N * 0.45 && flips < N * 0.55);
    /* Another epoch: other crops. */
    CHECK(fr_augment_crop_params(7, 3, idx, N, 100, 150, &torchvision, c, fc, err,
                                 sizeof(err)) == 0);
    CHECK(memcmp(a, c, sizeof(a)) != 0);

    /* Every try fails (the whole area at an aspect the image lacks): the centre crop. */
    fr_augment_crop never = {{1.0, 1.0}, {2.0, 3.0}, 0.0};
    CHECK(fr_augment_crop_params(1, 0, idx, 10, 100, 100, &never, c, fc, err, sizeof(err)) == 0);
    CHECK(c[0] == 25 && c[1] == 0 && c[2] == 50 && c[3] == 100 && fc[0] == 0);

    fr_augment_crop bad = torchvision;
    bad.scale[0] = 0;
    CHECK(fr_augment_crop_params(1, 0, idx, 1, 10, 10, &bad, c, fc, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "scale") != NULL);
    bad = torchvision;
    bad.ratio[0] = 2, bad.ratio[1] = 1;
    CHECK(fr_augment_crop_params(1, 0, idx, 1, 10, 10, &bad, c, fc, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "ratio") != NULL);
    bad = torchvision;
    bad.flip = 1.5;
    CHECK(fr_augment_crop_params(1, 0, idx, 1, 10, 10, &bad, c, fc, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "flip") != NULL);
    CHECK(fr_augment_crop_params(1, 0, idx, 1, 0, 10, &torchvision, c, fc, err, sizeof(err)) ==
          -EINVAL);
    CHECK(strstr(err, "image size") != NULL);
}

static void test_open_without_nvrtc(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    long (*live)(const char *) = lib ? (long (*)(const char *))dlsym(lib, "mock_cuda_live") : NULL;
    if (!live) {
        fprintf(stderr, "test_augment: no mock CUDA driver; the open test is skipped\n");
        if (lib)
            dlclose(lib);
        return;
    }
    long ctx0 = live("contexts"), mod0 = live("modules");
    fr_augment *aug = NULL;
    char err[FR_ERRLEN] = "";
    CHECK(fr_augment_open(0, "/nonexistent/nvrtc-dir", NULL, &aug, err, sizeof(err)) == -ENOENT);
    CHECK(aug == NULL);
    CHECK(strstr(err, "NVRTC was not found") != NULL && strstr(err, "/nonexistent/nvrtc-dir"));
    CHECK(live("contexts") == ctx0 && live("modules") == mod0);
    setenv("MOCK_CUDA_DEVICES", "0", 1);
    CHECK(fr_augment_open(0, NULL, NULL, &aug, err, sizeof(err)) < 0 && aug == NULL);
    unsetenv("MOCK_CUDA_DEVICES");
    fr_augment_close(NULL); /* closing nothing is fine */
    dlclose(lib);
}

/* fr_augment_run_host: a whole-image box at the image's own size is an
 * exact copy (every sample position lands on a pixel centre), mirrored
 * where flipped, channels first; float32 normalizes it; bad boxes are
 * refused naming the sample; threads beyond the samples are harmless. */
static void test_host(void)
{
    enum { NS = 5, IH = 7, IW = 9 };
    uint8_t *img = malloc(NS * IH * IW * 3);
    uint8_t *out8 = malloc(NS * 3 * IH * IW);
    float *out32 = malloc(NS * 3 * IH * IW * sizeof(float));
    int32_t boxes[NS * 4];
    uint8_t flips[NS];
    for (int i = 0; i < NS * IH * IW * 3; i++)
        img[i] = (uint8_t)(i * 37 + 11);
    for (int s = 0; s < NS; s++) {
        boxes[4 * s] = 0, boxes[4 * s + 1] = 0, boxes[4 * s + 2] = IH, boxes[4 * s + 3] = IW;
        flips[s] = (uint8_t)(s & 1);
    }
    fr_augment_batch b;
    memset(&b, 0, sizeof(b));
    b.src = (uint64_t)(uintptr_t)img;
    b.src_stride = IH * IW * 3;
    b.height = IH, b.width = IW, b.out_height = IH, b.out_width = IW;
    b.dst = (uint64_t)(uintptr_t)out8;
    b.dtype = FR_AUGMENT_UINT8;
    b.n = NS;
    b.boxes = boxes;
    b.flips = flips;
    for (int c = 0; c < 3; c++)
        b.mean[c] = 10.0f * (float)c, b.std[c] = 2.0f;
    char err[FR_ERRLEN];
    CHECK(fr_augment_run_host(&b, 8, err, sizeof(err)) == 0);
    int bad = 0;
    for (int s = 0; s < NS; s++)
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < IH; y++)
                for (int x = 0; x < IW; x++) {
                    int sx = flips[s] ? IW - 1 - x : x;
                    uint8_t want = img[((s * IH + y) * IW + sx) * 3 + c];
                    bad += out8[((s * 3 + c) * IH + y) * IW + x] != want;
                }
    CHECK(bad == 0);
    b.dst = (uint64_t)(uintptr_t)out32;
    b.dtype = FR_AUGMENT_FLOAT32;
    CHECK(fr_augment_run_host(&b, 1, err, sizeof(err)) == 0);
    CHECK(out32[(1 * 3 + 2) * IH * IW] == ((float)img[(1 * IH * IW + IW - 1) * 3 + 2] - 20.0f) / 2.0f);
    boxes[4 * 3] = 1; /* top 1 + height IH: past the image */
    CHECK(fr_augment_run_host(&b, 2, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "sample 3's crop box") != NULL);
    free(img);
    free(out8);
    free(out32);
}

int main(void)
{
    test_host();
    test_params();
    test_open_without_nvrtc();
    if (fr_test_failures)
        fprintf(stderr, "test_augment: %d failures\n", fr_test_failures);
    return fr_test_failures ? 1 : 0;
}
