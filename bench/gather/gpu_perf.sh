#!/bin/bash
# Where a device gather's time goes, on a GPU machine: builds each source
# tree given (default: this one) without sanitizers, runs bench_gather_gpu
# (the table; FASTREAD_GATHER_TIMELINE=1 prints each gather's
# timeline), an Nsight Compute profile of one hot 1M-id gather kernel, the
# memmap / CuPy baselines, and test_gather_gpu (byte-for-byte checks).
# NO_NCU=1, NO_BASELINES=1, SKIP_TEST=1 leave parts out; SCENARIOS (or
# SCEN_<label>) picks bench scenarios.
# Usage: bench/gather/gpu_perf.sh [label=dir ...]; logs under $OUT.
set -u
RES=${OUT:-$PWD/gpu-out}
OUT=/var/tmp/fr-perf-logs   # everything here, one tarball to $RES at the end (8 files come back)
mkdir -p "$OUT" "$RES"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NVRTC_DIR=$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(os.path.dirname(nvidia.cuda_nvrtc.__file__), "lib"))' 2>/dev/null)
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1 && [ -n "$NVRTC_DIR" ]; then
    export FASTREAD_NVRTC=$NVRTC_DIR
fi
export TMPDIR=/var/tmp FASTREAD_CACHE_DIR=/var/tmp/fastread-kernels
FILE=/var/tmp/fr_bench_rows.bin
[ $# -eq 0 ] && set -- "this=$PWD"
for spec in "$@"; do
    label=${spec%%=*} dir=${spec#*=}
    ( cmake -S "$dir" -B "$dir/build/perf" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DFASTREAD_URING=OFF -DFASTREAD_XNVME=OFF -DFASTREAD_BUILD_TESTS=ON &&
      cmake --build "$dir/build/perf" --target bench_gather_gpu test_gather_gpu ) \
        >"$OUT/build-$label.log" 2>&1 || { echo "build $label failed"; tail -20 "$OUT/build-$label.log"; } &
done
wait
for spec in "$@"; do
    label=${spec%%=*} dir=${spec#*=}
    echo "=== bench $label"
    scen_var="SCEN_$label"   # SCEN_<label>: scenarios for that tree only
    FASTREAD_GATHER_TIMELINE=1 timeout 200 "$dir/build/perf/bench_gather_gpu" $FILE ${!scen_var:-${SCENARIOS:-}} \
        2>"$OUT/timeline-$label.log" | tee "$OUT/bench-$label.txt"
    grep -m3 -E "^fastread gather timeline: n 1000000" "$OUT/timeline-$label.log" | tail -1
    [ -n "${NO_NCU:-}" ] && continue
    echo "=== ncu $label: hot 1M gather (3rd launch)"
    timeout 150 $NCU --clock-control none --set full -k fr_gather_rows --launch-skip 2 --launch-count 1 \
        -o "$OUT/ncu-hot-$label" "$dir/build/perf/bench_gather_gpu" $FILE hot >"$OUT/ncu-run-$label.log" 2>&1
    $NCU --import "$OUT/ncu-hot-$label.ncu-rep" --page details >"$OUT/ncu-hot-$label.txt" 2>&1
    grep -E "^    (Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|L2 Hit Rate|Compute \(SM\) Throughput|Block Limit Registers|Warp Cycles Per Issued)" "$OUT/ncu-hot-$label.txt"
done
if [ -z "${NO_BASELINES:-}" ]; then
    echo "=== baselines"
    timeout 120 python3 bench/gather/gather_baselines.py $FILE 2>&1 | tee "$OUT/baselines.txt"
fi
if [ -z "${SKIP_TEST:-}" ]; then
    echo "=== test_gather_gpu (${1%%=*})"
    dir=${1#*=}
    FR_GPU_TEST_LOG=$OUT timeout 240 "$dir/build/perf/test_gather_gpu" >"$OUT/test-run.log" 2>&1
    echo "test_gather_gpu rc=$?"; grep -E "FAIL|M rows/s|ok$" "$OUT/test-run.log" | tail -25
fi
tar czf "$RES/logs.tgz" -C "$OUT" . && cp "$OUT"/bench-*.txt "$OUT/baselines.txt" "$RES"/ 2>/dev/null
ls -la "$RES"
