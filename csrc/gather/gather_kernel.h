/*
 * The gather kernel (fastread_device.cuh's fr_gather_rows) for one device:
 * compiled at run time with NVRTC, loaded with dlopen (no CUDA toolkit at
 * build time), for the device's own compute capability, and cached on disk;
 * or, where NVRTC is missing, the PTX that nvcc compiled at build time
 * (FASTREAD_NVCC), which the driver JIT-compiles. Internal to the device
 * path (gather_device.c).
 */
#ifndef FASTREAD_GATHER_KERNEL_H
#define FASTREAD_GATHER_KERNEL_H

#include <stddef.h>

#include "gpu/gpu.h"

typedef struct fr_kernel_request {
    const char *fetch_define;   /* "FR_FETCH_PROXY", "FR_FETCH_EXTERN" */
    const char *backend_source; /* FR_FETCH_EXTERN: the backend's device code */
    const char *cache_dir;      /* NULL: $FASTREAD_CACHE_DIR, else ~/.cache/fastread */
    const char *nvrtc_path;     /* only this one; NULL: $FASTREAD_NVRTC, then
                                   libnvrtc.so.13/.12/.so */
} fr_kernel_request;

/* Loads the kernel into the device's primary context: *module (unload with
 * fr_gpu_module_unload) and *fn (fr_gather_rows). *how says where it came
 * from ("NVRTC 13.0, sm_90", "cache <path>", "embedded PTX"). The source is
 * chosen by $FASTREAD_KERNEL_SOURCE: auto (NVRTC, else embedded PTX),
 * nvrtc, ptx. -errno and a message naming what is missing. */
int fr_kernel_load(fr_gpu *gpu, const fr_kernel_request *rq, void **module, void **fn, char *how,
                   size_t how_len, char *err, size_t err_len);

/* fastread_device.cuh as embedded at build time. */
const char *fr_kernel_device_header(void);

#endif
