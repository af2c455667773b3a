/*
 * The gather kernel's source and how it is loaded (gather_kernel.h): NVRTC
 * through the core's shared loader (gpu/nvrtc.c, which also caches the
 * cubin), else the PTX nvcc built in.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "gather/gather_kernel.h"
#include "gpu/nvrtc.h"

/* Generated at build time (cmake/embed.cmake): the device header, and the
 * kernel's PTX where nvcc was found ("" otherwise). */
extern const char fr_embedded_device_header[];
extern const char fr_embedded_gather_ptx[];

const char *fr_kernel_device_header(void) { return fr_embedded_device_header; }

static char *build_source(const fr_kernel_request *rq)
{
    const char *hdr = fr_embedded_device_header;
    const char *extra = rq->backend_source ? rq->backend_source : "";
    size_t n = strlen(hdr) + strlen(extra) + 256;
    char *src = malloc(n);
    if (src)
        snprintf(src, n, "#define FR_DEFINE_GATHER_KERNEL 1\n#define %s 1\n%s\n%s\n",
                 rq->fetch_define, hdr, extra);
    return src;
}

int fr_kernel_load(fr_gpu *gpu, const fr_kernel_request *rq, void **module, void **fn, char *how,
                   size_t how_len, char *err, size_t err_len)
{
    *module = NULL;
    *fn = NULL;
    int cc = 0;
    int rc = fr_nvrtc_device_cc(gpu, &cc, err, err_len);
    if (rc)
        return rc;
    if (cc < 70) {
        fr_set_err(err, err_len,
                   "GPU %d has compute capability %d.%d; the gather kernel needs 7.0 or newer "
                   "(__match_any_sync, __nanosleep, %%globaltimer)",
                   fr_gpu_device_id(gpu), cc / 10, cc % 10);
        return -ENOTSUP;
    }
    const char *mode = getenv("FASTREAD_KERNEL_SOURCE");
    if (!mode || !mode[0])
        mode = "auto";
    if (strcmp(mode, "auto") && strcmp(mode, "nvrtc") && strcmp(mode, "ptx")) {
        fr_set_err(err, err_len, "FASTREAD_KERNEL_SOURCE must be auto, nvrtc or ptx, got '%s'",
                   mode);
        return -EINVAL;
    }
    char tried[1024] = "";
    if (strcmp(mode, "ptx") != 0) {
        char *src = build_source(rq);
        if (!src)
            return -ENOMEM;
        fr_nvrtc_program prog = {.source = src,
                                 .file_name = "fastread_gather.cu",
                                 .what = "the gather kernel",
                                 .cache_prefix = "gather",
                                 .function = "fr_gather_rows",
                                 .cache_dir = rq->cache_dir,
                                 .nvrtc_path = rq->nvrtc_path};
        rc = fr_nvrtc_load(gpu, &prog, cc, module, fn, how, how_len, tried, sizeof(tried), err,
                           err_len);
        free(src);
        if (rc != -ENOENT)
            return rc;
        if (strcmp(mode, "nvrtc") == 0) {
            fr_set_err(err, err_len, "NVRTC not found (tried %s); install the CUDA toolkit or "
                                     "pip install nvidia-cuda-nvrtc, or set FASTREAD_NVRTC", tried);
            return -ENOENT;
        }
    }
    int builtin = strcmp(rq->fetch_define, "FR_FETCH_PROXY") == 0;
    if (!builtin || !fr_embedded_gather_ptx[0]) {
        fr_set_err(err, err_len,
                   "no way to build the gather kernel: NVRTC not found (tried %s) and %s; "
                   "install the CUDA toolkit or pip install nvidia-cuda-nvrtc, or set "
                   "FASTREAD_NVRTC",
                   tried[0] ? tried : "nothing: FASTREAD_KERNEL_SOURCE=ptx",
                   builtin ? "this build has no PTX built in (FASTREAD_NVCC found no nvcc)"
                           : "this backend's kernel is only built with NVRTC");
        return -ENOENT;
    }
    rc = fr_nvrtc_load_image(gpu, fr_embedded_gather_ptx, "fr_gather_rows", module, fn);
    if (rc) {
        char why[FR_ERRLEN];
        fr_gpu_last_error(gpu, why, sizeof(why));
        fr_set_err(err, err_len, "the built-in gather PTX does not load (driver too old for it?): %s",
                   why);
        return rc;
    }
    snprintf(how, how_len, "embedded PTX (JIT-compiled by the driver for sm_%d)", cc);
    return 0;
}
