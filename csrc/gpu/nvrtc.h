/*
 * Run-time compilation of CUDA kernels with NVRTC, for every kernel of the
 * core (the gather kernel, gather_kernel.c; the image augmentation kernel,
 * augment.c): NVRTC dlopen'ed (no CUDA toolkit at build time), the source
 * compiled to a cubin for the device's exact compute capability, cached on
 * disk, and loaded into the device's primary context through fr_gpu.
 * One owner of where NVRTC is looked for and of the cache's file names.
 * Thread-safe: no state beyond the call (NVRTC itself is reentrant).
 */
#ifndef FASTREAD_GPU_NVRTC_H
#define FASTREAD_GPU_NVRTC_H

#include <stddef.h>

#include "gpu/gpu.h"

typedef struct fr_nvrtc_program {
    const char *source;       /* the whole CUDA source */
    const char *file_name;    /* the source's name for NVRTC ("fastread_gather.cu") */
    const char *what;         /* for messages: "the gather kernel" */
    const char *cache_prefix; /* cached cubins are <cache_dir>/<prefix>-<hash>-sm<cc>.cubin */
    const char *function;     /* the __global__ function to look up (extern "C") */
    const char *cache_dir;    /* NULL: $FASTREAD_CACHE_DIR, else ~/.cache/fastread */
    const char *nvrtc_path;   /* only this one (a file or a directory); NULL:
                                 $FASTREAD_NVRTC, then libnvrtc.so.13/.12/.so */
} fr_nvrtc_program;

/* The device's compute capability as major * 10 + minor (90 for 9.0). */
int fr_nvrtc_device_cc(fr_gpu *gpu, int *cc, char *err, size_t err_len);

/* Compiles (or finds in the cache) and loads prog for compute capability cc:
 * *module (unload with fr_gpu_module_unload) and *fn. *how says how it was
 * built ("NVRTC 13.0, sm_90, cached in <dir>", "cached cubin <path>").
 * 0; -ENOENT when NVRTC is not found (tried: where it looked, err untouched);
 * other -errno with err set. */
int fr_nvrtc_load(fr_gpu *gpu, const fr_nvrtc_program *prog, int cc, void **module, void **fn,
                  char *how, size_t how_len, char *tried, size_t tried_len, char *err,
                  size_t err_len);

/* Loads a ready image (PTX or cubin) and looks up `function` in it. */
int fr_nvrtc_load_image(fr_gpu *gpu, const void *image, const char *function, void **module,
                        void **fn);

#endif
