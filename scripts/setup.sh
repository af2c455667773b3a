# Sourced by scripts/test.sh and scripts/bench.sh: installs what fastread
# needs on a fresh Debian/Ubuntu machine, system packages included, saying
# what it installs and why as it goes.
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "setup: $*"; }

setup_system() {
    local need=()
    pkg-config --exists liburing 2>/dev/null || need+=(liburing-dev)
    pkg-config --exists libcurl 2>/dev/null || need+=(libcurl4-openssl-dev)
    pkg-config --exists zlib 2>/dev/null || need+=(zlib1g-dev)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    command -v cc >/dev/null || need+=(build-essential)
    if [ ${#need[@]} -eq 0 ]; then
        say "system packages present (liburing $(pkg-config --modversion liburing), libcurl $(pkg-config --modversion libcurl), pkg-config, a C compiler)"
        return
    fi
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    say "apt-get: installing ${need[*]} (liburing-dev: the io_uring engine; libcurl4-openssl-dev: the s3 engine; zlib1g-dev: the object cache's checksums; pkg-config and a C compiler: the build)"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
}

# pip_install WHAT ARGS...: says WHAT, then runs pip, showing what it
# downloads and builds (not the packages that are already there).
pip_install() {
    local what="$1"; shift
    say "pip: $what"
    python3 -m pip install --progress-bar off "$@" 2>&1 |
        sed -u -E '/^(Requirement already satisfied|Using cached|Looking in|  )/d'
}

# DALI's headers include cuda_runtime.h, which includes crt/ and CCCL's
# headers: the toolkit's where one is installed, else the CUDA wheels' (what
# cmake/dali_plugin.cmake looks for). torch's CUDA 13 wheels bring
# cuda_runtime.h without crt/ and cccl/, so without this step a fresh machine
# silently built fastread without its native DALI operators. Headers only
# (a few MB), of the CUDA version torch installed, else 13.0.
setup_cuda_headers() {
    local home="${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}"
    if [ -e "$home/include/crt/host_config.h" ]; then
        say "CUDA headers for the DALI plugin: $home/include"
        return
    fi
    local cuda
    cuda=$(python3 -c 'import importlib.metadata as m; v = m.version("nvidia-cuda-runtime").split("."); print(".".join(v[:2]))' 2>/dev/null || echo 13.0)
    pip_install "CUDA $cuda headers (nvidia-cuda-runtime, -crt, -cccl: DALI's headers include them; the native DALI operators are compiled against them, nothing of CUDA is linked)" \
        "nvidia-cuda-runtime==$cuda.*" "nvidia-cuda-crt==$cuda.*" "nvidia-cuda-cccl==$cuda.*"
}

# setup_python EXTRAS [no-torch]: fastread itself with the given extras,
# built from this checkout, and torch unless told not to (the tests need it,
# the benchmark does not). torch is pinned: an unpinned torch pulls
# gigabytes of CUDA wheels.
setup_python() {
    local extras="$1" torch="${2:-torch}"
    pip_install "build tools (cmake, ninja)" cmake ninja
    if [ "$torch" != no-torch ]; then
        pip_install "torch==${FASTREAD_TORCH_VERSION:-2.13.0} (fastread.torch and its tests; a large download the first time)" \
            "torch==${FASTREAD_TORCH_VERSION:-2.13.0}"
    fi
    if pkg-config --exists xnvme 2>/dev/null &&
        grep -qs xnvme_libconf_get "$(pkg-config --variable=includedir xnvme)/libxnvme_libconf.h"; then
        # xNVMe's main line (still 0.7.5 by version; cmake/xnvme_api.cmake
        # tells them apart the same way) dropped symbols the bindings bind
        # at import (xnvme_be_attr_list_bundled).
        say "libxnvme here is xNVMe's main line (libxnvme_libconf.h declares xnvme_libconf_get): the xNVMe engines are built, but the Python bindings xnvme==0.7.5 do not load against it (undefined symbol xnvme_be_attr_list_bundled) and are not installed (the xnvme-ctypes baseline says so)"
    elif pkg-config --exists xnvme 2>/dev/null; then
        # With or without liburing and libaio: the bindings call only what
        # every 0.7.5 build exports, and the baseline reads with async=emu.
        pip_install "xNVMe's Python bindings xnvme==0.7.5 (libxnvme $(pkg-config --modversion xnvme) is here: the xnvme-ctypes baseline)" \
            "xnvme==0.7.5"
    else
        say "libxnvme not found by pkg-config: no xNVMe engines, and the xnvme Python bindings are not installed (the xnvme-ctypes baseline says so)"
    fi
    case ",$extras," in
        *,dali,*)
            # Before fastread, not with it: the native DALI operators are
            # built only where nvidia.dali imports at build time, and one pip
            # command builds fastread before it installs the extras (on a
            # fresh machine the plugin was silently left out).
            pip_install "DALI first (the native DALI operators are compiled against it)" \
                "nvidia-dali-cuda120>=1.30"
            setup_cuda_headers ;;
    esac
    pip_install "fastread from this checkout with [${extras}] (compiles the C core and the Cython module: a minute or two)" \
        ".[${extras}]"
}

# setup_cassandra: what the Cassandra tests and benchmark run a real node
# with: Java 17 and Maven (apt), then Cassandra's jars, fetched once by
# Maven into /var/tmp/fastread-cassandra (tests/cassandra_server.py fetch;
# 3.3 s with a warm ~/.m2, 9.2 s from an empty one, 66 MB) and reused after.
setup_cassandra() {
    local need=()
    command -v java >/dev/null || need+=(openjdk-17-jre-headless)
    command -v mvn >/dev/null || need+=(maven)
    if [ ${#need[@]} -gt 0 ]; then
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        say "apt-get: installing ${need[*]} (a real Cassandra node for the tests and benchmark)"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
    fi
    say "Cassandra's jars (Maven; fetched once, then reused)"
    python3 tests/cassandra_server.py fetch
}
