"""Engine selection: which engines exist, which run here, and their options."""
import threading

from fastread import _core, _defaults

# Every engine fastread knows, in order of preference for engine="auto", and
# what is needed to build it when this build lacks it.
KNOWN_ENGINES = {
    "io_uring": "liburing was not found by pkg-config when fastread was built "
                "(install liburing-dev and reinstall)",
    "psync": "not compiled in",
}

# Options every engine accepts; an engine ignores those it has no use for.
OPTION_NAMES = ("queue_depth", "threads", "o_direct", "direct_alignment",
                "register_buffers", "register_files", "pin_memory", "engine_args")


def engines():
    """Engine name -> True if it can run here, else a string saying why not."""
    built = set(_core.engine_names())
    out = {}
    for name, missing in KNOWN_ENGINES.items():
        if name not in built:
            out[name] = f"not built: {missing}"
            continue
        ok, why = _core.probe(name)
        out[name] = True if ok else why
    return out


def resolve(engine):
    """Turns 'auto' (or the FASTREAD_ENGINE default) into an available engine;
    raises ValueError naming an unknown or unavailable one."""
    if engine is None:
        engine = _defaults.get("engine")
    avail = engines()
    usable = [n for n, ok in avail.items() if ok is True]
    if engine == "auto":
        return usable[0]
    if engine not in avail:
        raise ValueError(f"unknown engine {engine!r}; available engines: {', '.join(usable)}")
    if avail[engine] is not True:
        raise ValueError(f"engine {engine!r} is unavailable here: {avail[engine]}; "
                         f"available engines: {', '.join(usable)}")
    return engine


def options(engine, **opts):
    """Validated engine options with defaults filled in from fastread._defaults."""
    unknown = sorted(set(opts) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown engine option(s) {', '.join(map(repr, unknown))} for engine "
                        f"{engine!r}; valid options: {', '.join(OPTION_NAMES)}")
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
    for name in ("o_direct", "register_buffers", "register_files", "pin_memory"):
        out[name] = bool(out[name])
    if not isinstance(out["engine_args"], str):
        raise ValueError(f"engine option engine_args must be a string, got {out['engine_args']!r}")
    return out


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
