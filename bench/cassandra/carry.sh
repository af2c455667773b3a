#!/usr/bin/env bash
# A Cassandra that travels to a machine with no Java and no network (the GPU
# machine of bench/gpu.sh, whose device tool carries at most 64 MiB a call):
# a jlink'd Java 17 runtime with only the modules Cassandra 5 needs, and the
# jars a one-node test server loads (bench/cassandra/carry-jars.txt, measured
# by `measure`), with the native libraries of other platforms taken out of
# them. Nothing it makes is committed: everything goes under $OUT
# (FASTREAD_CASSANDRA_CARRY, default /var/tmp/fastread-cassandra/carry).
#
#   bash bench/cassandra/carry.sh build     OUT/jre and OUT/<version>/lib: run the
#                                           tests with JAVA_HOME=OUT/jre
#                                           FASTREAD_CASSANDRA_CACHE=OUT to check them
#   bash bench/cassandra/carry.sh measure   the Cassandra tests on OUT/jre and every
#                                           fetched jar, each class load logged; writes
#                                           carry-jars.txt (the jars any class came from)
#   bash bench/cassandra/carry.sh stage DIR DIR/part-* (PART_MB each, default 44) and
#                                           DIR/SHA256 for bench/gpu.sh's stage_wheels:
#                                           site.tar.xz (DALI's wheels and the Python
#                                           driver's, unpacked) and cassandra.tar.xz
#                                           (OUT/jre + the jars)
#
# The modules: what `jdeps --print-module-deps` finds in cassandra-all and
# the jars it loads (java.base, java.compiler, java.desktop for snakeyaml's
# java.beans, java.instrument, java.management.rmi, java.naming, java.sql,
# jdk.management, jdk.unsupported), what those require (java.logging,
# java.management, java.rmi, java.xml), jdk.attach (jvm17-server.options'
# -Djdk.attach.allowAttachSelf) and jdk.crypto.ec (TLS key exchange: the
# TLS test). The JVM warns about, and ignores, the --add-exports of modules
# left out (jdk.compiler).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${FASTREAD_CASSANDRA_CARRY:-/var/tmp/fastread-cassandra/carry}
jdk=${JDK17:-/usr/lib/jvm/java-17-openjdk-amd64}
modules=java.base,java.compiler,java.desktop,java.instrument,java.logging,java.management
modules=$modules,java.management.rmi,java.naming,java.rmi,java.sql,java.xml,jdk.attach
modules=$modules,jdk.crypto.ec,jdk.management,jdk.unsupported
keep=bench/cassandra/carry-jars.txt
py=${PYTHON:-python3}
version=$($py -c 'import sys; sys.path.insert(0, "tests"); import cassandra_server as c; print(c.VERSION)')
full_lib=$($py -c 'import sys; sys.path.insert(0, "tests"); import cassandra_server as c; print(c.lib_dir())')

make_jre() {
    if [ -x "$out/jre/bin/java" ]; then return 0; fi
    [ -d "$jdk/jmods" ] || { echo "no $jdk/jmods to jlink from (apt-get install openjdk-17-jdk-headless, or set JDK17)" >&2; exit 1; }
    rm -rf "$out/jre.partial"
    mkdir -p "$out"
    "$jdk/bin/jlink" --module-path "$jdk/jmods" --add-modules "$modules" --strip-debug \
        --no-man-pages --no-header-files --compress=2 --output "$out/jre.partial"
    # Debian's libjvm.so keeps its symbol table: 3.5 MB the JVM never reads.
    strip --strip-unneeded "$out/jre.partial/lib/server/libjvm.so"
    mv "$out/jre.partial" "$out/jre"
    echo "jre: $(du -sh "$out/jre" | cut -f1) in $out/jre ($modules)"
}

make_lib() {
    [ -f "$keep" ] || { echo "no $keep: run \`bash bench/cassandra/carry.sh measure\` first" >&2; exit 1; }
    [ -f "$full_lib/cassandra-all-$version.jar" ] || { echo "no jars in $full_lib: run \`python3 tests/cassandra_server.py fetch\`" >&2; exit 1; }
    local dest="$out/$version/lib"
    rm -rf "$dest.partial" && mkdir -p "$dest.partial"
    # Each kept jar copied without the native libraries of other systems and
    # processors (zstd-jni, snappy, jna, jffi, lz4 ship them all): the JVM
    # here only ever extracts the Linux x86-64 ones.
    $py - "$full_lib" "$dest.partial" "$keep" <<'EOF'
import os, re, sys, zipfile
src, dest, keep = sys.argv[1:4]
names = [l.split("#")[0].strip() for l in open(keep)]
native = re.compile(r"\.(so|dylib|dll|jnilib|a)$")
ours = re.compile(r"(amd64|x86[_-]64)")
other_os = re.compile(r"(aix|darwin|osx|macos|bsd|sunos|solaris|win)", re.I)
dropped = 0
for name in filter(None, names):
    with zipfile.ZipFile(os.path.join(src, name)) as zin, \
            zipfile.ZipFile(os.path.join(dest, name), "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            p = info.filename
            if native.search(p) and (not ours.search(p) or other_os.search(p)):
                dropped += info.file_size
                continue
            zout.writestr(info, zin.read(info))
print(f"jars: {len(list(filter(None, names)))} of {sum(n.endswith('.jar') for n in os.listdir(src))} kept, "
      f"{dropped / 1e6:.1f} MB of other platforms' native libraries dropped")
EOF
    rm -rf "$dest" && mv "$dest.partial" "$dest"
    echo "jars: $(du -sh "$dest" | cut -f1) in $dest"
}

case "${1:-build}" in
build)
    make_jre
    make_lib
    ;;
measure)
    make_jre
    logs=$(mktemp -d /var/tmp/fastread-classload-XXXXXX)
    # Every JVM the tests start (the node, keytool) logs where each class
    # came from; the full fetched set, so that what is missing cannot hide
    # what would be loaded.
    (cd tests && JAVA_HOME="$out/jre" JAVA_TOOL_OPTIONS="-Xlog:class+load=info:file=$logs/cl-%p.log" \
        FASTREAD_TEST_REQUIRE=cassandra $py -m pytest -q -p no:cacheprovider \
        test_cassandra.py test_cassandra_dali.py test_cassandra_workflow.py) || {
        echo "the tests failed on $out/jre: carry-jars.txt left as it was" >&2; exit 1; }
    # And the benchmark's paths (no authentication, the 20k tree's ingest).
    JAVA_HOME="$out/jre" JAVA_TOOL_OPTIONS="-Xlog:class+load=info:file=$logs/cl-%p.log" \
        $py bench/cassandra/loop_read.py --images 512 --rounds 1 --delays 0,5 \
        --modes fastread-reader,python-driver --workdir "$logs/bench" >/dev/null
    $py - "$logs" "$full_lib" "$keep" <<'EOF'
import collections, glob, os, re, sys
logs, lib, keep = sys.argv[1:4]
count = collections.Counter()
for path in glob.glob(os.path.join(logs, "cl-*.log")):
    for line in open(path, errors="replace"):
        m = re.search(r"source: (?:jar:)?file:(\S+?\.jar)", line)
        if m:
            count[os.path.basename(m.group(1))] += 1
# Jars of native code alone for this platform (Netty's epoll transport and
# its OpenSSL): loaded as resources, not classes, by the classes of a jar
# kept above; without them Netty falls back to NIO and the JDK's TLS.
natives = [n for n in os.listdir(lib) if re.search(r"-linux-x86_64\.jar$", n)
           and n.split("-4.1")[0].split("-2.0")[0].replace("-boringssl-static", "")
           in {"netty-transport-native-epoll", "netty-tcnative"}]
total = {n: os.path.getsize(os.path.join(lib, n)) for n in os.listdir(lib) if n.endswith(".jar")}
kept = sorted(set(count) | set(natives))
with open(keep, "w") as f:
    f.write("# The jars a one-node test server loads classes from (bench/cassandra/carry.sh\n"
            "# measure: the Cassandra tests and loop_read.py, -Xlog:class+load), with\n"
            "# the classes loaded from each; the Linux x86-64 native jars of Netty.\n")
    for n in kept:
        f.write(f"{n}  # {count.get(n, 0)} classes\n" if count.get(n) else f"{n}  # native\n")
print(f"{len(kept)} of {len(total)} jars loaded: {sum(total[n] for n in kept) / 1e6:.1f} of "
      f"{sum(total.values()) / 1e6:.1f} MB; written to {keep}")
EOF
    rm -rf "$logs"
    ;;
stage)
    dir=${2:?stage needs the folder for the parts}
    make_jre
    make_lib
    wheels=${FASTREAD_CARRY_WHEELS:-/var/tmp/fastread-cassandra/wheels}
    mkdir -p "$wheels"
    # DALI for CUDA 13 and what its metadata pins (nvImageCodec: its decoders;
    # nvCOMP left out: no decompression operator runs here), and the Python
    # driver (the fixture's sessions, ingest, the baseline) with its own.
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
        platforms+=(--platform "$p")
    done
    $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$wheels" nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20 \
        astunparse==1.6.3 gast==0.7.0 optree==0.20.0 nvtx==0.2.17 makefun==1.16.0 libcst==1.9.0 \
        cassandra-driver==3.30.1 geomet==1.1.0 deprecated==3.0.1
    pick=$(mktemp -d)
    trap 'rm -rf "$pick"' EXIT
    # The wheels unpacked as `pip install --target` lays them out (none has
    # more than a script in its .data) and xz'd whole: 27% smaller than the
    # deflated wheels (DALI's 199 MB wheel: 143 MB), a part fewer to carry.
    mkdir -p "$pick/site" "$pick/cassandra"
    for w in nvidia_dali_cuda130-2.4.0 nvidia_nvimgcodec_cu13-0.9.0.20 astunparse-1.6.3 gast-0.7.0 \
             optree-0.20.0 nvtx-0.2.17 makefun-1.16.0 libcst-1.9.0 cassandra_driver-3.30.1 \
             geomet-1.1.0 deprecated-3.0.1; do
        unzip -q -o "$wheels/$w"-*.whl -d "$pick/site"
    done
    rm -rf "$pick"/site/*.data
    tar -C "$pick/site" -cf - . | xz -T0 -6 >"$pick/cassandra/site.tar.xz"
    rm -rf "$pick/site"
    tar -C "$out" -cf - jre "$version" | xz -T0 -6 >"$pick/cassandra/cassandra.tar.xz"
    rm -rf "$dir" && mkdir -p "$dir"
    tar -cf - -C "$pick" . | split -b "${PART_MB:-44}m" -d - "$dir/part-"
    cat "$dir"/part-* | sha256sum >"$dir/SHA256"
    echo "staged in $dir: $(ls "$dir" | grep -c '^part-') parts; $(du -h "$pick"/cassandra/*.tar.xz | tr '\n\t' '  ')"
    ls -l "$dir"
    ;;
*)
    echo "usage: carry.sh build | measure | stage DIR" >&2
    exit 2
    ;;
esac
