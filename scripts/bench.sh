#!/usr/bin/env bash
# The main job: generate the synthetic ImageNet-like tree (20,000 JPEGs,
# ~92 KB mean; reused if already there) and benchmark fastread against DALI's
# fn.readers.file and the seed's Python loops. Installs everything it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
setup_system
setup_python "dali,plot"

data="${FASTREAD_BENCH_DATA:-/var/tmp/fastread-bench/imagenet-20k}"
out="${FASTREAD_BENCH_OUT:-bench-results}"
mkdir -p "$out"
fastread make-dataset "$data" --classes 20 --per-class 1000 --seed 0
fastread info
fastread bench "$data" --batchsize 64 --repeat 3 \
    --json "$out/bench.json" --plot "$out/bench.png" "$@"
