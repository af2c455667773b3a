"""What is installed and usable here: optional packages, CUDA devices and
fastread's engines, and the checks modes share (an engine, DALI, a GPU).

Every probe returns a value or a reason; none raises, so ``fastread info``
and ``fastread bench`` never show a traceback for a missing package. This
module is the bottom of :mod:`fastread.bench`: it imports nothing else of it.
"""
import dataclasses
import importlib

#: Optional packages reported by ``fastread info``: label -> (module, pip name).
PACKAGES = {
    "numpy": ("numpy", "numpy"),
    "DALI": ("nvidia.dali", "nvidia-dali-cuda120"),
    "torch": ("torch", "torch"),
    "cupy": ("cupy", "cupy-cuda12x"),
}

_imports = {}


def try_import(module):
    """(module, None) or (None, why not); cached."""
    if module not in _imports:
        try:
            _imports[module] = (importlib.import_module(module), None)
        except ImportError as e:
            if getattr(e, "name", None) and module.startswith(e.name):
                why = "not installed"
            else:
                why = f"installed but cannot be imported: {_one_line(e)}"
            _imports[module] = (None, why)
        except Exception as e:  # a broken install: OSError for a missing .so, ...
            _imports[module] = (None, f"installed but cannot be imported: {_one_line(e)}")
    return _imports[module]


def version(label):
    """The package's version, or 'not installed' (or why it cannot be used)."""
    module, _pip = PACKAGES[label]
    mod, why = try_import(module)
    if mod is None:
        return why
    return str(getattr(mod, "__version__", "unknown version"))


def cuda_devices(quick=False):
    """(list of device descriptions, reason if the list is empty).

    Asks DALI (what the GPU modes of ``fastread bench`` need), then torch,
    then CuPy; the first that sees devices wins. With ``quick``, DALI's
    answer is final when DALI is installed (no torch/CuPy import).
    """
    reasons = []
    dali, why = try_import("nvidia.dali.backend")
    if dali is not None:
        try:
            n = int(dali.GetCUDADeviceCount())
        except Exception as e:
            reasons.append(f"DALI: {_one_line(e)}")
        else:
            if n > 0:
                return _torch_names() or [f"cuda:{i}" for i in range(n)], None
            reasons.append("DALI sees 0 CUDA devices")
            if quick:
                return [], reasons[0]
    else:
        reasons.append(f"DALI {why}")
    names = _torch_names()
    if names:
        return names, None
    torch, why = try_import("torch")
    if torch is not None:
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        reasons.append("torch built without CUDA" if not cuda else "torch sees no CUDA device")
    else:
        reasons.append(f"torch {why}")
    cupy, why = try_import("cupy")
    if cupy is not None:
        try:
            n = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:
            reasons.append(f"cupy: {_one_line(e)}")
        else:
            if n > 0:
                return [f"cuda:{i} ({_cupy_name(cupy, i)})" for i in range(n)], None
            reasons.append("cupy sees 0 devices")
    else:
        reasons.append(f"cupy {why}")
    return [], "; ".join(reasons)


def _torch_names():
    torch, _ = try_import("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        return [f"cuda:{i} ({torch.cuda.get_device_name(i)})"
                for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def _cupy_name(cupy, i):
    try:
        name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown"


def _one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


# -- what the modes need to know about this machine ---------------------------------
#: Why a mode whose engine fastread does not list cannot run.
NOT_BUILT = "engine not built in this version"


@dataclasses.dataclass
class Environment:
    """fastread's engines and the optional packages the modes use."""
    engines: dict            # fastread.engines(): name -> EngineStatus
    dali_error: str = None   # why DALI cannot be used, or None
    fastread_dali_error: str = None
    _cuda: list = None

    def __post_init__(self):
        # A bare True or reason (a test's stand-in) answers for files and ranges alike.
        from fastread.engine import EngineStatus
        self.engines = {n: s if isinstance(s, EngineStatus) else EngineStatus(files=s, ranges=s)
                        for n, s in self.engines.items()}

    @property
    def cuda_error(self):
        """Why there is no CUDA device, or None (probed on first use)."""
        if self._cuda is None:
            devices, _why = cuda_devices(quick=True)
            self._cuda = [None if devices else "none found here (`fastread info` says why)"]
        return self._cuda[0]

    def engine_error(self, engine):
        """Why ``engine`` cannot read files here, or None."""
        status = self.engines.get(engine)
        if status is None:
            return NOT_BUILT
        return None if status.files is True else str(status.files)

    def range_engine_error(self, engine):
        """Why ``engine`` cannot read byte ranges (packed images) here, or None:
        range-only engines (xnvme) can, though they cannot read files."""
        status = self.engines.get(engine)
        if status is None:
            return NOT_BUILT
        return None if status.ranges is True else str(status.ranges)

    def dali_error_for(self, fastread_reader=False):
        """Why a DALI pipeline (with a fastread reader in it) cannot be built."""
        if self.dali_error:
            return self.dali_error
        if fastread_reader and self.fastread_dali_error:
            return self.fastread_dali_error
        return None


def probe_environment(engines=None):
    """Imports what the modes need; never raises. ``engines`` defaults to
    :func:`fastread.engines`."""
    if engines is None:
        import fastread
        engines = fastread.engines()
    env = Environment(engines=dict(engines))
    mod, why = try_import("nvidia.dali")
    if mod is None:
        env.dali_error = f"DALI {why} (pip install nvidia-dali-cuda120)"
    mod, why = try_import("fastread.dali")
    if mod is None:
        env.fastread_dali_error = f"fastread.dali {why}"
    return env
