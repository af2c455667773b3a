/* The translation unit of fastread's own gather kernel (fr_gather_rows) with
 * the proxy's ring fetch: compiled to PTX by nvcc at build time where CMake
 * finds it (FASTREAD_NVCC), embedded in the library, and JIT-compiled by the
 * driver on machines without NVRTC. At run time with NVRTC the same source
 * is compiled from the embedded header instead (gather_kernel.c). */
#define FR_DEFINE_GATHER_KERNEL 1
#define FR_FETCH_PROXY 1
#include "fastread_device.cuh"
