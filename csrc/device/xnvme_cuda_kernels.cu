/*
 * xnvme-cuda kernels, compiled by nvcc at build time (cmake/xnvme_cuda.cmake)
 * into a fatbin that gather_xnvme_cuda.c embeds and loads with
 * cuModuleLoadData: the device side needs libxnvme.h, which NVRTC cannot
 * compile (see fastread_xnvme_cuda.cuh).
 */
#include "fastread_xnvme_cuda.cuh"

/* Reads pages[0..n) of the store into cache slots slots[0..n) (device
 * arrays), reporting into *st (zeroed by the caller). */
extern "C" __global__ void fr_xc_fill_pages(const fr_xc_view *v, const uint64_t *pages,
                                            const uint32_t *slots, uint32_t n,
                                            fr_xc_fill_status *st)
{
    fr_xc_fill_pages_dev(v, pages, slots, n, st);
}
