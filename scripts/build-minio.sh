#!/usr/bin/env bash
# Builds MinIO, the optional second S3 server of the tests and benchmarks
# (tests/s3_minio.py), with `go install` of one pinned version from the Go
# module proxy into a cache folder outside the checkout (never committed).
# MinIO has no binary on PyPI, and the module proxy serves this one version
# of github.com/minio/minio (a pseudo-version of its master of 2026-02-12;
# release tags are not semver, so the proxy refuses them).
# A cold build takes ~10-15 minutes on 2 shared cores and ~1.5 GB of module
# cache; a second run finds the binary and returns at once.
#   bash scripts/build-minio.sh            # -> /var/tmp/fastread-minio/bin/minio
#   FASTREAD_MINIO_DIR=/some/dir bash scripts/build-minio.sh
set -euo pipefail
VERSION="${FASTREAD_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
DIR="${FASTREAD_MINIO_DIR:-/var/tmp/fastread-minio}"
BIN="$DIR/bin/minio"
if [ -x "$BIN" ] && [ "$(cat "$DIR/VERSION" 2>/dev/null)" = "$VERSION" ]; then
    echo "MinIO $VERSION already built: $BIN"
    exit 0
fi
command -v go >/dev/null || { echo "build-minio.sh: no go toolchain on PATH" >&2; exit 1; }
mkdir -p "$DIR/bin"
# niced: the build would otherwise take both cores from whatever else runs.
GOBIN="$DIR/bin" GOFLAGS=-buildvcs=false nice -n 15 \
    go install -trimpath "github.com/minio/minio@$VERSION"
echo "$VERSION" > "$DIR/VERSION"
"$BIN" --version | head -1
echo "built $BIN (the tests find it there; or set FASTREAD_MINIO)"
