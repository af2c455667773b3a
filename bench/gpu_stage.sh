#!/usr/bin/env bash
# Prepares, on a machine with package access, what bench/gpu.sh needs carried
# to the GPU machine (which has none): DALI's cp312 CUDA 13 wheels and their
# pure or cp312 dependencies tarred and split into .stage/part-* of under
# 50 MB each (one part per device call: the call's working tree plus a part
# stay under the tool's 64 MiB) with .stage/SHA256 of the joined parts, and
# liburing unpacked into .deps/liburing (without it io_uring is silently not
# built there). bench/gpu.sh joins the parts as they arrive, checks the
# checksum and installs the wheels into /tmp/site.
#
#   bash bench/gpu_stage.sh          # then, per device call: carry .stage/part-0K,
#                                    # .stage/SHA256 and .deps/liburing
#
# The three folders are kept out of git (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.stage/ /.deps/ /.whl/; do
    grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >>"$(git rev-parse --git-common-dir)/info/exclude"
done
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64; do
    platforms+=(--platform "$p")
done
# DALI 2.4 for CUDA 13 (the GPU machine's CUDA), the versions its metadata pins,
# and the record formats' reference libraries for the formats section.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$wheels" \
    nvidia-dali-cuda130==2.4.0 "nvidia-nvimgcodec-cu13>=0.9,<0.10" nvidia-libnvcomp-cu13==5.3.0.16 \
    astunparse==1.6.3 gast==0.7.0 optree nvtx makefun "libcst~=1.8" \
    webdataset braceexpand msgpack msgpack-numpy squirrel-core
rm -rf .stage && mkdir -p .stage
tar -cf - -C "$wheels" . | split -b 50m -d - .stage/part-
cat .stage/part-* | sha256sum >.stage/SHA256
echo "staged $(ls "$wheels" | wc -l) wheels in $(ls .stage | grep -c '^part-') parts:"
ls -l .stage
if [ ! -d .deps/liburing/usr/include ]; then
    debs=$(mktemp -d)
    (cd "$debs" && apt-get download liburing2 liburing-dev >/dev/null)
    mkdir -p .deps/liburing
    for f in "$debs"/*.deb; do dpkg -x "$f" .deps/liburing; done
    rm -rf "$debs"
fi
echo "liburing for the GPU machine: $(ls .deps/liburing/usr/lib/x86_64-linux-gnu | tr '\n' ' ')"
