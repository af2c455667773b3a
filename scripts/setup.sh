# Sourced by scripts/test.sh and scripts/bench.sh: installs what fastread
# needs on a fresh Debian/Ubuntu machine, system packages included.
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

setup_system() {
    local need=()
    pkg-config --exists liburing 2>/dev/null || need+=(liburing-dev)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    command -v cc >/dev/null || need+=(build-essential)
    if [ ${#need[@]} -gt 0 ]; then
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
    fi
}

# setup_python EXTRAS: fastread itself with the given extras, built from this
# checkout. torch is pinned: an unpinned torch pulls gigabytes of CUDA wheels.
setup_python() {
    local extras="$1"
    python3 -m pip install -q "torch==${FASTREAD_TORCH_VERSION:-2.13.0}" cmake ninja
    python3 -m pip install -q ".[${extras}]"
}
