#!/usr/bin/env bash
# Interleaved rounds of bench/engines/file_ranges_prof.py: every
# (python, kind, shards, engine) once a round, in that order, each in a
# process of its own; one JSON line each into OUT/runs.jsonl (with the
# python it ran under, so that builds before and after a change compare in
# the same rounds). PERF=record|stat|none (default none); with record or
# stat the profiles are OUT/<round>-<tag>.data / .stat.txt.
#
#   PYTHONS="/work/venvs/a/bin/python /work/venvs/b/bin/python" ROUNDS=3 \
#   KINDS="table reader" SHARDS="100 10000" ENGINES="psync io_uring@256 io_uring" \
#   ORDER=shuffled EPOCHS=3 PERF=none bash bench/engines/file_ranges_prof_rounds.sh DIR OUT
set -euo pipefail
dir=$1
out=$2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
PYTHONS=${PYTHONS:-python3}
ROUNDS=${ROUNDS:-3}
KINDS=${KINDS:-table}
SHARDS=${SHARDS:-"100 10000"}
ENGINES=${ENGINES:-"psync io_uring@256 io_uring"}
ORDER=${ORDER:-shuffled}
EPOCHS=${EPOCHS:-3}
PERF=${PERF:-none}
echo "# $(date -u) $(uname -n) $(nproc) CPUs; load $(cat /proc/loadavg)" >> "$out/log.txt"
for r in $(seq 1 "$ROUNDS"); do
    for py in $PYTHONS; do
        venv=$(basename "$(dirname "$(dirname "$py")")")
        for kind in $KINDS; do
            for s in $SHARDS; do
                for e in $ENGINES; do
                    tag="$venv-$kind-$s-$e-$ORDER"
                    line=$("$py" "$here/file_ranges_prof.py" --dir "$dir" --shards "$s" \
                        --engine "$e" --order "$ORDER" --kind "$kind" --epochs "$EPOCHS" \
                        --perf "$PERF" --out "$out/$r-$tag")
                    echo "{\"round\": $r, \"venv\": \"$venv\", ${line#\{}" >> "$out/runs.jsonl"
                    echo "$r $tag $line" >> "$out/log.txt"
                done
            done
        done
    done
done
echo "# $(date -u) done; load $(cat /proc/loadavg)" >> "$out/log.txt"
