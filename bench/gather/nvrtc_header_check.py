"""Compiles fastread_device.cuh with NVRTC through CuPy's RawModule, as a
user's own kernel would (GPU machine only; run by bench/gather/gpu_gather.sh).
Exits 77 where CuPy or a GPU is missing."""
import os
import sys

try:
    import cupy
    cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # no CuPy, no GPU
    print(f"nvrtc_header_check: skipped: {e}")
    sys.exit(77)

inc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc", "gather", "device")
src = """
#include <cuda/std/cstdint>
#define FR_DEFINE_GATHER_KERNEL 1
#define FR_FETCH_PROXY 1
#include "fastread_device.cuh"
extern "C" __global__ void user_rows(const fr_dev_store *s, const long long *ids, int n,
                                     unsigned char *out) {
    fr_dev_counts c = {};
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) fr_dev_read_row(s, ids[i], out + (unsigned long long)i * s->row_bytes, &c);
}
"""
mod = cupy.RawModule(code=src, options=("-I" + inc, "--std=c++17"))
for name in ("fr_gather_rows", "user_rows"):
    mod.get_function(name)
print("nvrtc_header_check: fastread_device.cuh compiles with NVRTC (CuPy RawModule), "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
