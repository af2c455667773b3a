"""Engine selection: which engines exist, which run here, and their options."""
import threading

from fastread import _core, _defaults

# Every engine fastread knows, in order of preference for engine="auto", and
# what is needed to build it when this build lacks it.
KNOWN_ENGINES = {
    "io_uring": "liburing was not found by pkg-config when fastread was built "
                "(install liburing-dev and reinstall)",
    "psync": "not compiled in",
    "xnvme-file": "xNVMe was not found by pkg-config (`xnvme`) when fastread was built "
                  "(install xNVMe, then reinstall fastread; "
                  "-Ccmake.define.FASTREAD_XNVME=ON makes its absence a build error)",
    "xnvme": "xNVMe was not found by pkg-config (`xnvme`) when fastread was built "
             "(install xNVMe, then reinstall fastread; "
             "-Ccmake.define.FASTREAD_XNVME=ON makes its absence a build error)",
    "cufile": "not compiled in",
}

#: Engines that read into GPU memory: they always serve a device.
GPU_ENGINES = ("cufile",)

#: Engines that read byte ranges of one device or image (Context.read_ranges,
#: fastread.PackedImage) but not whole files: engines() reports them with this
#: text (so read_files and engine="auto" never pick them), and they can still
#: be opened by name.
RANGE_ONLY = {
    "xnvme": "range reads only (Context.read_ranges / PackedImage on a device or image "
             "file); read_files is not supported, use 'xnvme-file'",
}

XNVME_ENGINES = ("xnvme-file", "xnvme")

#: Friendly options of the xNVMe engines, folded into engine_args:
#: Python option -> (engine_args key, engines that take it).
XNVME_OPTIONS = {
    "xnvme_be": ("be", XNVME_ENGINES),
    "xnvme_async": ("async", XNVME_ENGINES),
    "xnvme_sync": ("sync", XNVME_ENGINES),
    "xnvme_admin": ("admin", XNVME_ENGINES),
    "xnvme_mem": ("mem", XNVME_ENGINES),
    "xnvme_direct": ("direct", XNVME_ENGINES),
    "xnvme_qdepth": ("qdepth", XNVME_ENGINES),
    "xnvme_queue": ("queue", ("xnvme-file",)),
    "xnvme_inflight": ("inflight", ("xnvme-file",)),
    "xnvme_bounce": ("bounce", ("xnvme",)),
    "xnvme_nsid": ("nsid", ("xnvme",)),
}

# Options every engine accepts; an engine ignores those it has no use for.
OPTION_NAMES = ("queue_depth", "threads", "o_direct", "direct_alignment",
                "register_buffers", "register_files", "engine_args")
# Where batches go: device_id (a CUDA device, or None), device_output
# (batches delivered in GPU memory), pin_memory (page-locked host arenas).
GPU_OPTION_NAMES = ("device_id", "device_output", "pin_memory")


def _status(name, built):
    """True if engine `name` can read files here, else why not."""
    if name not in built:
        return f"not built: {KNOWN_ENGINES[name]}"
    ok, why = _probe(name)
    if ok and name in RANGE_ONLY:
        return f"{RANGE_ONLY[name]} ({why})" if why else RANGE_ONLY[name]
    return True if ok else why


def _probe(name):
    # Probing a GPU engine loads the CUDA driver and cuFile: costly, so done
    # once per process. The others are cheap and may change (a kernel
    # setting, a library installed), so they are asked every time.
    if name in GPU_ENGINES:
        if name not in _gpu_probes:
            _gpu_probes[name] = _core.probe(name)
        return _gpu_probes[name]
    return _core.probe(name)


_gpu_probes = {}


def engines():
    """Engine name -> True if it can read files here, else a string saying
    why not (for range-only engines such as 'xnvme': what they do instead)."""
    built = set(_core.engine_names())
    return {name: _status(name, built) for name in KNOWN_ENGINES}


def xnvme_version():
    """(version string of the libxnvme the engines run on, None) or
    (None, why the xNVMe engines are absent or unusable)."""
    built = set(_core.engine_names())
    if "xnvme-file" not in built:
        return None, f"not built: {KNOWN_ENGINES['xnvme-file']}"
    ok, why = _core.probe("xnvme-file")
    if not ok:
        return None, why
    # The probe says "xNVMe X.Y.Z (built against A.B.C)".
    return why.removeprefix("xNVMe ").strip() or "unknown version", None


def _usable_by_name(name):
    """True if `name` can be opened explicitly (range-only engines included)."""
    if name not in RANGE_ONLY or name not in _core.engine_names():
        return False
    return _core.probe(name)[0]


def resolve(engine):
    """Turns 'auto' (or the FASTREAD_ENGINE default) into an available engine;
    raises ValueError naming an unknown or unavailable one. Probes only the
    engines it needs to: 'auto' stops at the first that runs here."""
    if engine is None:
        engine = _defaults.get("engine")
    built = set(_core.engine_names())
    if engine == "auto":
        for name in KNOWN_ENGINES:
            if name not in GPU_ENGINES and _status(name, built) is True:
                return name
        raise ValueError(f"no engine can read files here: {engines()}")
    elif engine in KNOWN_ENGINES:
        status = _status(engine, built)
        if status is True or _usable_by_name(engine):
            return engine
        raise ValueError(f"engine {engine!r} is unavailable here: {status}; "
                         f"available engines: {', '.join(_usable())}")
    raise ValueError(f"unknown engine {engine!r}; available engines: {', '.join(_usable())}")


def _usable():
    return [n for n, ok in engines().items() if ok is True]


def _fold_xnvme(engine, opts):
    """Moves xnvme_* options into engine_args ("key=value,..."), checking that
    the engine takes each; returns the remaining options."""
    given = {k: v for k, v in opts.items() if k in XNVME_OPTIONS and v is not None}
    rest = {k: v for k, v in opts.items() if k not in XNVME_OPTIONS}
    if not given:
        return rest
    wrong = sorted(k for k in given if engine not in XNVME_OPTIONS[k][1])
    if wrong:
        takers = sorted({e for k in wrong for e in XNVME_OPTIONS[k][1]})
        raise TypeError(f"engine option(s) {', '.join(map(repr, wrong))} apply only to engine(s) "
                        f"{', '.join(map(repr, takers))}, not {engine!r}")
    parts = []
    for k, v in given.items():
        if isinstance(v, bool):
            v = int(v)
        v = str(v)
        if not v or any(c in v for c in ",= "):
            raise ValueError(f"engine option {k} must be a plain word or number, got {v!r}")
        parts.append(f"{XNVME_OPTIONS[k][0]}={v}")
    base = rest.get("engine_args")
    if base is None:
        base = _defaults.get("engine_args")
    rest["engine_args"] = ",".join(([base] if base else []) + parts)
    return rest


def options(engine, **opts):
    """Validated engine options with defaults filled in from fastread._defaults.
    The xNVMe engines also take xnvme_be, xnvme_async, ... (see XNVME_OPTIONS),
    which are folded into engine_args."""
    valid = OPTION_NAMES + GPU_OPTION_NAMES + (
        tuple(k for k, (_, es) in XNVME_OPTIONS.items() if engine in es))
    unknown = sorted(set(opts) - set(valid) - set(XNVME_OPTIONS))
    if unknown:
        raise TypeError(f"unknown engine option(s) {', '.join(map(repr, unknown))} for engine "
                        f"{engine!r}; valid options: {', '.join(valid)}")
    opts = _fold_xnvme(engine, opts)
    out = {}
    for name in OPTION_NAMES:
        value = opts.get(name)
        out[name] = _defaults.get(name) if value is None else value
    for name in ("queue_depth", "threads", "direct_alignment"):
        v = out[name]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"engine option {name} must be a non-negative integer, got {v!r}")
    if out["queue_depth"] < 1:
        raise ValueError(f"engine option queue_depth must be >= 1, got {out['queue_depth']}")
    for name in ("o_direct", "register_buffers", "register_files"):
        out[name] = bool(out[name])
    if not isinstance(out["engine_args"], str):
        raise ValueError(f"engine option engine_args must be a string, got {out['engine_args']!r}")
    out.update(_gpu_options(engine, opts))
    return out


def _gpu_options(engine, opts):
    """device_id / device_output / pin_memory, with defaults: a reader that
    serves a GPU (device output, a device_id, or a GPU engine) uses
    FASTREAD_DEVICE_ID unless given and pins its host arenas unless told not
    to (FASTREAD_PIN_MEMORY); one that serves none never loads CUDA."""
    device_id = opts.get("device_id")
    output = opts.get("device_output") or False
    pin = opts.get("pin_memory")
    if device_id is not None and (not isinstance(device_id, int) or isinstance(device_id, bool)
                                  or device_id < -1):
        raise ValueError(f"device_id must be a CUDA device number (>= 0) or None, got {device_id!r}")
    if device_id == -1:
        device_id = None
    if device_id is None and (output or engine in GPU_ENGINES or pin):
        device_id = _defaults.get("device_id")
    if device_id is None:
        return {"device_id": -1, "device_output": False, "pin_memory": False}
    if pin is None:
        # A GPU engine's arenas are staging for the rare repair only.
        pin = engine not in GPU_ENGINES and _defaults.get("pin_memory")
    return {"device_id": device_id, "device_output": bool(output), "pin_memory": bool(pin)}


def open_context(engine="auto", **opts):
    """A fresh engine context (one per reader; not shared between threads)."""
    name = resolve(engine)
    return _core.Context(name, **options(name, **opts))


_local = threading.local()


def cached_context(engine="auto", **opts):
    """This thread's context for these settings, opened on first use."""
    name = resolve(engine)
    resolved = options(name, **opts)
    key = (name,) + tuple(sorted(resolved.items()))
    cache = getattr(_local, "contexts", None)
    if cache is None:
        cache = _local.contexts = {}
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = _core.Context(name, **resolved)
    return ctx
