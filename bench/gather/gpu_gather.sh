#!/bin/bash
# The gather core on a GPU machine (no liburing there: psync): build the C
# core and tests without sanitizers (ASan and the CUDA driver do not mix),
# run the C tests (mock ones included), the real-GPU gather test and an NVRTC
# compile of the device header through CuPy. Logs go to $OUT (or ./gpu-out).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_gather.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
ls /usr/local/cuda/lib64 2>/dev/null | grep -i nvrtc || echo "no libnvrtc in /usr/local/cuda/lib64"
NVRTC_DIR=$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(os.path.dirname(nvidia.cuda_nvrtc.__file__), "lib"))' 2>/dev/null)
[ -n "$NVRTC_DIR" ] && echo "nvrtc wheel: $NVRTC_DIR" && ls "$NVRTC_DIR"
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1 && [ -n "$NVRTC_DIR" ]; then
    export FASTREAD_NVRTC=$NVRTC_DIR
fi
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFASTREAD_URING=OFF \
      -DFASTREAD_XNVME=OFF -DFASTREAD_BUILD_TESTS=ON >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep fastread: "$OUT/cmake.log"
cmake --build build/gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
export TMPDIR=/var/tmp FASTREAD_CACHE_DIR=/var/tmp/fastread-kernels
ctest --test-dir build/gpu --output-on-failure -E test_gather_gpu --timeout 120 >"$OUT/ctest.log" 2>&1; tail -15 "$OUT/ctest.log"
echo "=== test_gather_device (mock driver) with the toolkit's NVRTC: its disk cache"
FASTREAD_NVRTC=/usr/local/cuda/lib64 LD_LIBRARY_PATH=$PWD/build/gpu/mockcuda timeout 120 build/gpu/test_gather_device; echo "rc=$?"
echo "=== test_gather_gpu"
FR_GPU_TEST_LOG=$OUT timeout 300 build/gpu/test_gather_gpu; echo "test_gather_gpu rc=$?"
echo "=== nvrtc_header_check"
timeout 120 python3 bench/gather/nvrtc_header_check.py; echo "nvrtc_header_check rc=$?"
ls -la /var/tmp/fastread-kernels 2>/dev/null
