#!/usr/bin/env bash
# The main job: generate the synthetic ImageNet-like tree (20,000 JPEGs,
# ~92 KB mean; reused if already there) and answer "how much faster does
# fastread read it than DALI's fn.readers.file and a plain Python external
# source, on this machine?": warm, and cold where the page cache can be
# dropped (root), with a verdict and a plot. Installs everything it needs.
#
# Extra arguments go to `fastread bench` (e.g. `--modes all`, `--list-modes`,
# `--cache warm`); results land in bench-results/ (JSON and a bar chart).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
setup_system
setup_python "dali,plot" no-torch

data="${FASTREAD_BENCH_DATA:-/var/tmp/fastread-bench/imagenet-20k}"
out="${FASTREAD_BENCH_OUT:-bench-results}"
mkdir -p "$out"
echo "== dataset: $data (made once, then reused)"
fastread make-dataset "$data" --classes 20 --per-class 1000 --seed 0
echo "== this machine"
fastread info
echo "== benchmark"
fastread bench "$data" --batchsize 64 --repeat 3 \
    --json "$out/bench.json" --plot "$out/bench.png" "$@"
