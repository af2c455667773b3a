"""Finding and loading fastread's native DALI operator library.

``libfastread_dali.so`` is built beside the Python extension when DALI was
importable at build time (CMake ``FASTREAD_DALI_PLUGIN=AUTO|ON|OFF``) and
installed into the ``fastread`` package with ``fastread_dali.version``, the
DALI version it was compiled against. Loading it registers in DALI
``fn.fastread.readers.file`` (``ops.fastread.readers.File``; files as bytes,
or as arrays for ``readers.numpy``), for the CPU backend and the GPU one
(``device="gpu"``: outputs in GPU memory),
``fn.fastread.readers.webdataset`` (CPU outputs) and
``fn.fastread.readers.cassandra`` (rows by key through the cql engine; CPU
and GPU).

:func:`load` loads it once per process and returns whether it is there;
:func:`reason` says why not (not built, built against another DALI, DALI
missing, the loader's own error); :func:`require` raises with that reason.
``FASTREAD_DALI_PLUGIN=0`` in the environment keeps it unloaded (the
external-source readers are used); ``FASTREAD_DALI_PLUGIN_PATH`` names
another library file (a build tree's).

Private to ``fastread.dali``; imports nothing else of fastread.
"""
import os

__all__ = ["OP_NAME", "load", "reason", "require", "library_path", "info",
           "register_engine_args"]

#: The operator's name in DALI's registry (``fn.fastread.readers.file``).
OP_NAME = "fastread__readers__File"
_LIBRARY = "libfastread_dali.so"
_VERSION_FILE = "fastread_dali.version"

# One load per process: DALI cannot unload an operator library.
_state = {"tried": False, "loaded": False, "reason": None, "path": None}


def library_path():
    """Where the plugin library is looked for (it may not exist)."""
    override = os.environ.get("FASTREAD_DALI_PLUGIN_PATH")
    if override:
        return override
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), _LIBRARY)


def _built_against(path):
    vfile = os.path.join(os.path.dirname(path), _VERSION_FILE)
    try:
        with open(vfile) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _try_load():
    if os.environ.get("FASTREAD_DALI_PLUGIN", "").strip().lower() in ("0", "off", "false", "no"):
        return False, "disabled by FASTREAD_DALI_PLUGIN=" + os.environ["FASTREAD_DALI_PLUGIN"]
    try:
        import nvidia.dali as dali
        from nvidia.dali import plugin_manager
    except ImportError as e:
        return False, f"DALI is not installed (import nvidia.dali failed: {e})"
    path = library_path()
    _state["path"] = path
    if not os.path.exists(path):
        return False, (f"the native DALI plugin was not built ({path} does not exist): fastread "
                       "was built where nvidia.dali was not importable, or with "
                       "FASTREAD_DALI_PLUGIN=OFF; reinstall fastread with DALI installed")
    built = _built_against(path)
    if built is not None and built != dali.__version__:
        return False, (f"the native DALI plugin {path} was built against DALI {built}, but DALI "
                       f"{dali.__version__} is installed: reinstall fastread")
    try:
        plugin_manager.load_library(path)
    except Exception as e:  # DALI raises RuntimeError; ctypes OSError
        return False, f"DALI could not load the native plugin {path}: {e}"
    return True, None


def load():
    """Loads the plugin (once); True if its operators are registered."""
    if not _state["tried"]:
        _state["tried"] = True
        _state["loaded"], _state["reason"] = _try_load()
    return _state["loaded"]


def reason():
    """Why the plugin is not loaded (None when it is)."""
    load()
    return _state["reason"]


def require(what="the native DALI reader"):
    """Loads the plugin or raises RuntimeError saying why it cannot."""
    if not load():
        raise RuntimeError(f"{what} needs fastread's DALI plugin: {_state['reason']}")


def register_engine_args(token, engine_args):
    """Gives the loaded plugin ``engine_args`` under ``token``, for an
    operator built with ``engine_args="fastread_engine_args_ref=<token>"``
    (dali_plugin/engine_args_ref.h: secrets kept out of serialized
    pipelines). RuntimeError if the plugin is not loaded or refuses."""
    import ctypes

    require("registering engine arguments with the native DALI plugin")
    lib = ctypes.CDLL(_state["path"])   # the library DALI loaded: the same table
    fn = lib.fastread_dali_register_engine_args
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    rc = fn(token.encode(), engine_args.encode())
    if rc != 0:
        raise RuntimeError(f"the native DALI plugin refused to keep engine arguments "
                           f"(error {-rc}: {os.strerror(-rc)})")


def info():
    """For ``fastread info``: the plugin's path, the DALI version it was
    built against, and whether it loads (or why not)."""
    loaded = load()
    path = _state["path"] or library_path()
    return {"path": path, "built_against": _built_against(path) if os.path.exists(path) else None,
            "loaded": loaded, "reason": _state["reason"],
            "operators": _registered_operators() if loaded else []}


def _registered_operators():
    """The plugin's operators as DALI's registry has them, with their
    backends: ["fn.fastread.readers.file (CPU, GPU, Mixed)", ...]."""
    import re

    from nvidia.dali import backend

    gpu, mixed = set(backend.RegisteredGPUOps()), set(backend.RegisteredMixedOps())
    out = []
    for name in sorted(o for o in backend.RegisteredCPUOps() if o.startswith("fastread__")):
        *scope, op = name.split("__")
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()
        kinds = ["CPU"] + ["GPU"] * (name in gpu) + ["Mixed"] * (name in mixed)
        out.append(f"fn.{'.'.join(scope)}.{snake} ({', '.join(kinds)})")
    return out
