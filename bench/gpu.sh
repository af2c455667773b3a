#!/usr/bin/env bash
# The GPU-machine benchmark (one call of the device tool; DEVELOPERS.md says
# how DALI's wheels are staged into /tmp/site and liburing carried in .deps).
# Builds fastread there, generates the 20,000-JPEG tree and runs
# `fastread bench --device gpu` warm and cold, read-only and with the mixed
# decoder, at batch 64 and 256. Results go to $OUT (or bench-results/).
set -euo pipefail
out="${OUT:-bench-results}"
json=/tmp/fastread-gpu-json
mkdir -p "$out" "$json"
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
deps="$PWD/.deps/liburing/usr"
if [ -d "$deps" ]; then
    export LIBURING_ROOT="$deps" LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_PATH="$deps/lib/x86_64-linux-gnu/pkgconfig"
fi
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | grep -v -i warning || true
data=/tmp/fastread-imagenet-20k
python3 -m fastread.cli make-dataset "$data" --classes 20 --per-class 1000 --seed 0 --workers 16
python3 -m fastread.cli info
modes="${FASTREAD_GPU_MODES:-dali,python-file,fastread-io_uring,fastread-psync}"
for bs in 64 256; do
    for decode in "" "--decode"; do
        for cold in "" "--cold"; do
            tag="bs${bs}${decode:+-decode}${cold:+-cold}"
            echo "== $tag"
            python3 -m fastread.cli bench "$data" --device gpu --threads 8 --batchsize "$bs" \
                --modes "$modes" $decode $cold --no-progress --json "$json/$tag.json"
            tar -cf "$out/results.tar" -C "$json" .   # after each run: a timeout keeps what ran
        done
    done
done
# Cold reads want more I/O in flight: more workers, deeper queues, more threads.
tuned="--engine-option workers=8 --engine-option queue_depth=128 --engine-option threads=8"
for bs in 64 256; do
    tag="bs${bs}-cold-tuned"
    echo "== $tag ($tuned)"
    python3 -m fastread.cli bench "$data" --device gpu --threads 8 --batchsize "$bs" --cold \
        --modes dali,fastread-io_uring,fastread-psync $tuned --no-progress --json "$json/$tag.json"
    tar -cf "$out/results.tar" -C "$json" .
done
# Block level: pack the tree, read the image cold against file-level reads and
# DALI, and measure the disk's ceiling with the same engine.
img=/tmp/fastread-imagenet-20k.img
python3 -m fastread.cli pack "$data" "$img" --quiet
for bs in 64 256; do
    tag="bs${bs}-image-cold"
    echo "== $tag"
    FASTREAD_BENCH_IMAGE="$img" python3 -m fastread.cli bench "$data" --cold --threads 8 \
        --batchsize "$bs" --modes dali,fastread-io_uring,image-io_uring,image-dali-io_uring,image-psync \
        --engine-option queue_depth=128 --no-progress --json "$json/$tag.json"
    tar -cf "$out/results.tar" -C "$json" .
done
for qd in 32 128; do
    python3 bench/ceiling.py "$img" --cold --queue-depth "$qd"
done
# GPU tests (skipped elsewhere).
(cd tests && python3 -m pytest -q -p no:cacheprovider test_gpu.py test_dali.py 2>&1 | tail -4)
