#!/bin/bash
# Issue 31, items 1-2, in one GPU call: build fastread as bench/gpu.sh does
# (liburing from ../.deps or .deps), then the gather matrix the targets are
# judged on (bench/gather/gather.py, the 16M x 128 float32 table, 8 GiB):
# warm and hot, 1M ids, uniform and zipf, against memmap and the host tier;
# the GPU feature tests; cold, 100k and 1M uniform ids, against memmap and
# backend="host". "default" is FeatureStore(path) as a user opens it.
# Results in $OUT: gather-warmhot.json, gather-cold.json, tests.log.
set -u
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"
deps="$PWD/../.deps/liburing/usr"
[ -d "$deps" ] || deps="$PWD/.deps/liburing/usr"
if [ -d "$deps" ]; then
    export LIBURING_ROOT="$deps" LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_PATH="$deps/lib/x86_64-linux-gnu/pkgconfig"
    export CPATH="$deps/include${CPATH:+:$CPATH}" LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . >"$out/install.log" 2>&1 ||
    { grep -v -i warning "$out/install.log" | tail -40; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
export PYTHONUNBUFFERED=1
common=(--device cuda --rows 16M --dim 128 --workdir /var/tmp --repeat 3 --cold-repeat 2 --small-cache 1G)
timeout "${WARMHOT_S:-170}" python3 bench/gather/gather.py "${common[@]}" --batches 1M --dists uniform,zipf \
    --states warm,hot --modes "${WARMHOT_MODES:-memmap,default,proxy-hosttier}" \
    --time-budget "${WARMHOT_BUDGET:-130}" --json "$out/gather-warmhot.json" || echo "(warm/hot stopped early)"
(cd tests && timeout "${TESTS_S:-120}" python3 -m pytest -q -ra -p no:cacheprovider \
    test_features_gpu.py test_features.py) >"$out/tests.log" 2>&1; echo "tests rc=$?"
tail -25 "$out/tests.log"
timeout "${COLD_S:-150}" python3 bench/gather/gather.py "${common[@]}" --batches 100k,1M --dists uniform \
    --states cold --modes memmap,default,host --time-budget "${COLD_BUDGET:-120}" \
    --json "$out/gather-cold.json" || echo "(cold stopped early)"
echo "total $(( $(date +%s) - t0 )) s"
