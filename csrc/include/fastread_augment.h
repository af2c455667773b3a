/*
 * Image augmentation on the GPU for decoded packs (docs/augment.md): a
 * random resized crop (torchvision's RandomResizedCrop), a horizontal flip
 * and per-channel normalization of a batch of uint8 HWC images, one fused
 * kernel per batch (compiled at run time with NVRTC, gpu/nvrtc.h), writing
 * one channels-first batch.
 *
 * The crop boxes and flips are drawn on the host (fr_augment_crop_params):
 * a pure function of (seed, epoch, sample index), so a seed reproduces the
 * same crops whatever the batch boundaries, shards or threads.
 *
 * Thread-safety: fr_augment_crop_params has no state; an fr_augment may be
 * used by several threads at once (fr_augment_run only reads it).
 */
#ifndef FASTREAD_AUGMENT_H
#define FASTREAD_AUGMENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FR_AUGMENT_FLOAT32 = 0, FR_AUGMENT_FLOAT16 = 1, FR_AUGMENT_UINT8 = 2 };

typedef struct fr_augment_crop {
    double scale[2]; /* fraction of the image's area: torchvision's (0.08, 1.0) */
    double ratio[2]; /* width / height: torchvision's (3/4, 4/3) */
    double flip;     /* probability of a horizontal flip: 0.5 */
} fr_augment_crop;

/* For each of the n samples (their data-set indices), the crop box of an
 * height x width image as torchvision's RandomResizedCrop.get_params draws
 * it (10 tries of a uniform area fraction and a log-uniform aspect ratio,
 * then the centre crop fallback), and the flip. boxes: n x 4 int32 (top,
 * left, height, width); flips: n bytes, 0 or 1. 0, or -EINVAL with err set
 * (the option at fault named). */
int fr_augment_crop_params(uint64_t seed, uint64_t epoch, const int64_t *indices, size_t n,
                           int height, int width, const fr_augment_crop *crop, int32_t *boxes,
                           uint8_t *flips, char *err, size_t err_len);

typedef struct fr_augment fr_augment;

/* Opens the kernel on CUDA device `device`: compiled with NVRTC (or taken
 * from the cubin cache), nvrtc_path and cache_dir as gpu/nvrtc.h says (NULL:
 * the defaults). 0, or -errno with err saying what is missing. */
int fr_augment_open(int device, const char *nvrtc_path, const char *cache_dir, fr_augment **out,
                    char *err, size_t err_len);
void fr_augment_close(fr_augment *aug);
/* How the kernel was built ("NVRTC 13.0, sm_90, cached in ..."). */
const char *fr_augment_kernel_source(const fr_augment *aug);

typedef struct fr_augment_batch {
    uint64_t src;        /* device address of sample 0: uint8 height x width x 3, rows packed */
    uint64_t src_stride; /* bytes from one sample to the next (>= height * width * 3) */
    int height, width;
    uint64_t dst; /* device address of the output: n x 3 x out_height x out_width, C order */
    int out_height, out_width;
    int dtype;    /* FR_AUGMENT_*; UINT8 is not normalized (rounded to nearest) */
    size_t n;
    const int32_t *boxes; /* host: n x 4 (top, left, height, width), inside the image */
    const uint8_t *flips; /* host: n; NULL: none */
    float mean[3], std[3]; /* in pixel units (0..255): (pixel - mean) / std */
    void *stream;          /* CUstream to launch on; NULL: the legacy default stream */
} fr_augment_batch;

/* Queues the kernel(s) for the batch on b->stream and returns: the output
 * is ready when the stream reaches it, and src must stay unchanged until
 * then. 0, or -errno with err set (a bad box or size names the sample). */
int fr_augment_run(fr_augment *aug, const fr_augment_batch *b, char *err, size_t err_len);

/* The same on the CPU, no GPU or NVRTC needed: src and dst are host
 * addresses; the batch's samples are shared out over `threads` threads (the
 * caller's among them; 1..64) and done when this returns. The kernel's
 * arithmetic in the same order (float16 rounded to nearest even). b->stream
 * is ignored. Thread-safe: no state beyond the call. 0, or -errno with err
 * set, as fr_augment_run. */
int fr_augment_run_host(const fr_augment_batch *b, unsigned threads, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
