"""Run-time settings of feature stores (fastread.features), each overridable
by an environment variable, read at call time as in :mod:`fastread._defaults`
(explicit arguments always win).

Byte sizes take a plain number or one with a binary suffix: ``64K``,
``512M``, ``8G`` (KiB, MiB, GiB, TiB).
"""
import os

from fastread._defaults import parse_value

AUTO = "auto"

_SETTINGS = {
    # name: (environment variable, default, kind)
    # "auto": proxy where a GPU and NVRTC are present, else host.
    "backend": ("FASTREAD_GATHER_BACKEND", "auto", str),
    # Engine of host-side reads; "auto" follows FASTREAD_ENGINE.
    "engine": ("FASTREAD_GATHER_ENGINE", "auto", str),
    # HBM page cache of the device path.
    "cache_bytes": ("FASTREAD_GATHER_CACHE_BYTES", 1 << 30, "bytes"),
    # Cache page: a power of two, 4 KiB..1 MiB, that the row size divides.
    "page_bytes": ("FASTREAD_GATHER_PAGE_BYTES", 64 << 10, "bytes"),
    # Page-locked host tier: 0 none, "auto" sized from free memory.
    "host_bytes": ("FASTREAD_GATHER_HOST_BYTES", 0, "bytes_or_auto"),
    # Submission ring entries (a power of two); 0: the core's choice (4096,
    # fewer where the staging pages, entries * page_bytes, would pass 256 MiB).
    "ring_entries": ("FASTREAD_GATHER_RING_ENTRIES", 0, int),
    # Device-side waits give up after this many milliseconds.
    "timeout_ms": ("FASTREAD_GATHER_TIMEOUT_MS", 10_000, int),
    # Host threads serving reads, and reads in flight per thread (0: the core's default).
    "threads": ("FASTREAD_GATHER_THREADS", 0, int),
    "queue_depth": ("FASTREAD_GATHER_QUEUE_DEPTH", 0, int),
    # O_DIRECT host reads: auto (where offsets are aligned), on, off.
    "o_direct": ("FASTREAD_GATHER_O_DIRECT", "auto", "tristate"),
    # Compiled device kernels; empty: $FASTREAD_CACHE_DIR or ~/.cache/fastread.
    "cache_dir": ("FASTREAD_GATHER_KERNEL_CACHE", "", str),
}

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(raw, what):
    """An int from ``raw`` (int, or a string such as ``"512M"``); ``what``
    names the setting in errors."""
    if isinstance(raw, bool):
        raise ValueError(f"{what}={raw!r}: expected a byte count")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"{what}={raw!r}: expected a byte count >= 0")
        return raw
    text = str(raw).strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        value = float(text[:-1] if unit else text)
    except ValueError:
        raise ValueError(f"{what}={raw!r}: expected a byte count such as 1048576, 64K, 512M "
                         "or 8G") from None
    if value < 0 or value != value:
        raise ValueError(f"{what}={raw!r}: expected a byte count >= 0")
    return int(value * _UNITS[unit])


def _parse(name, raw):
    var, _, kind = _SETTINGS[name]
    if kind == "bytes":
        return parse_bytes(raw, var)
    if kind == "bytes_or_auto":
        return AUTO if str(raw).strip().lower() == AUTO else parse_bytes(raw, var)
    if kind == "tristate":
        return AUTO if str(raw).strip().lower() == AUTO else parse_value(var, raw, bool)
    return parse_value(var, raw, kind)


def get(name):
    """The setting's value: the environment variable if set, else the default."""
    var, default, _ = _SETTINGS[name]
    raw = os.environ.get(var)
    return default if raw is None else _parse(name, raw)


def env_var(name):
    """The environment variable that overrides setting ``name``."""
    return _SETTINGS[name][0]


def all_settings():
    return {name: get(name) for name in _SETTINGS}


def names():
    return list(_SETTINGS)


def nvrtc_wheel_dir():
    """The lib directory of an installed ``nvidia-cuda-nvrtc`` wheel (CUDA 13
    lays it out as ``nvidia/cu13/lib``, CUDA 12 as ``nvidia/cuda_nvrtc/lib``),
    or None. The core's own search (FASTREAD_NVRTC, then the loader's path)
    cannot see a wheel: its lib directory is on no loader path."""
    import importlib.util

    for pkg in ("nvidia.cu13", "nvidia.cuda_nvrtc", "nvidia.cu12"):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            lib = os.path.join(root, "lib")
            try:
                names = os.listdir(lib)
            except OSError:
                continue
            if any(n.startswith("libnvrtc.so") for n in names):
                return lib
    return None
