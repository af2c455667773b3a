"""Engine selection: which engines exist, which run here, and their options
(:class:`EngineOptions`)."""
import dataclasses
import errno as _errno
import os
import resource
import threading
import warnings
from collections.abc import Mapping
from typing import Optional, Union

import numpy as np

from fastread import _core, _defaults
from fastread import s3 as _s3

# Every engine fastread knows, in order of preference for engine="auto", and
# what is needed to build it when this build lacks it.
KNOWN_ENGINES = {
    "io_uring": "liburing was not found by pkg-config when fastread was built, or the "
                "build had FASTREAD_URING=OFF (install liburing-dev and reinstall)",
    "psync": "not compiled in",
    "xnvme-file": "xNVMe was not found by pkg-config (`xnvme`) when fastread was built "
                  "(install xNVMe, then reinstall fastread; "
                  "-Ccmake.define.FASTREAD_XNVME=ON makes its absence a build error)",
    "xnvme": "xNVMe was not found by pkg-config (`xnvme`) when fastread was built "
             "(install xNVMe, then reinstall fastread; "
             "-Ccmake.define.FASTREAD_XNVME=ON makes its absence a build error)",
    "cufile": "not compiled in",
    "s3": _s3.NOT_BUILT,
    "cql": "not compiled in",
}

#: Options of the URL engines, folded into engine_args (the s3 engine's:
#: a fastread.s3.S3Options or a mapping of its options).
URL_OPTIONS = ("s3",)

#: Engines that read objects at URLs (s3://bucket/key), not local files:
#: engine="auto" never picks them for local paths, and picks "s3" for lists
#: of s3:// URLs (:func:`for_paths`). engines() reports them, where they
#: run, with this text and the library they run on (as RANGE_ONLY engines:
#: not True, since they read no local file), and they open by name.
URL_ONLY = {
    "s3": "s3:// URLs only (read_files, scan, Reader, ranges of objects; engine='auto' "
          "picks it for s3:// paths)",
}
URL_ENGINES = tuple(URL_ONLY)

#: Engines that read rows of a table by key (Context.read_keys, a NativeReader
#: over keys: fastread.cassandra.CassandraSource), neither files nor ranges:
#: engines() reports them, where they run, with this text (not True).
KEY_ONLY = {
    "cql": "rows of Cassandra/ScyllaDB tables by key only (fastread.cassandra."
           "CassandraSource, readers.cassandra)",
}

#: Engines that read into GPU memory: they always serve a device.
GPU_ENGINES = ("cufile",)

#: Engines that read byte ranges of one device or image (Context.read_ranges,
#: fastread.PackedImage) but not whole files: engines() gives them this
#: reason under ``files`` (so read_files and engine="auto" never pick them)
#: and ``ranges=True``; they can still be opened by name.
RANGE_ONLY = {
    "xnvme": "read_files is not supported: this engine reads byte ranges of a device or "
             "image file only (Context.read_ranges / PackedImage); use 'xnvme-file' for files",
}


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """What one engine can do here, as :func:`engines` reports it. Each of
    ``files`` and ``ranges`` is ``True`` where that kind of read works here,
    else a string saying why not:

    * ``files``: whole files (``read_files()``, a ``Reader`` over a tree or a
      file list; what ``engine="auto"`` considers);
    * ``ranges``: byte ranges of one file or device (``PackedImage``,
      ``FileRanges``, ``Context.read_ranges``).

    ``why`` is the first reason (files' first), or None when both work.
    Test the fields, not the object: ``bool(status)`` raises ``TypeError``,
    since "works" has two meanings here."""

    files: Union[bool, str]
    ranges: Union[bool, str]

    @property
    def why(self) -> Optional[str]:
        for v in (self.files, self.ranges):
            if v is not True:
                return v
        return None

    def __bool__(self):
        raise TypeError("an EngineStatus has two answers: test status.files or "
                        "status.ranges (each True, or why not)")

    def as_dict(self):
        """{"files": True | why not, "ranges": True | why not} (JSON)."""
        return {"files": self.files, "ranges": self.ranges}


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
                "register_buffers", "register_files", "engine_args", "spin_us",
                "cache_dir", "cache_bytes")
# Where batches go: device_id (a CUDA device, or None), device_output
# (batches delivered in GPU memory), pin_memory (page-locked host arenas).
GPU_OPTION_NAMES = ("device_id", "device_output", "pin_memory")


def _status(name, built):
    """True if engine `name` can read files here, else why not."""
    return _engine_status(name, built).files


def _engine_status(name, built):
    if name not in built:
        why = f"not built: {KNOWN_ENGINES[name]}"
        return EngineStatus(files=why, ranges=why)
    ok, why = _probe(name)
    if not ok:
        return EngineStatus(files=why, ranges=why)
    if name in URL_ONLY or name in KEY_ONLY:
        # Objects at URLs or rows by key, not local files or images: not
        # True, so loops over the engines that read local files pass it by.
        what = URL_ONLY.get(name) or KEY_ONLY[name]
        said = f"{what}: {why}" if why else what
        return EngineStatus(files=said, ranges=said)
    return EngineStatus(files=RANGE_ONLY.get(name, True), ranges=True)


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
    """Engine name -> :class:`EngineStatus` for every engine fastread knows:
    ``files`` and ``ranges``, each ``True`` where that kind of read works
    here, else why not. E.g. ``{'io_uring': EngineStatus(files=True,
    ranges=True), 'xnvme': EngineStatus(files='read_files is not supported:
    ...', ranges=True), 'cufile': EngineStatus(files='no CUDA driver: ...',
    ranges='no CUDA driver: ...'), ...}``."""
    built = set(_core.engine_names())
    return {name: _engine_status(name, built) for name in KNOWN_ENGINES}


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
    if name in URL_ONLY or name in KEY_ONLY:
        # Its status is never True (it reads no local file or image), so
        # engine="s3" by name was refused even where it runs: built and
        # probed is what opening it needs.
        return name in set(_core.engine_names()) and _probe(name)[0]
    if name not in RANGE_ONLY:
        return False
    return _engine_status(name, set(_core.engine_names())).ranges is True


#: engine="auto": the rule, measured with bench/engines/engines.py (read_files() and
#: Reader; 4 KiB to 1 MiB files; warm and cold; batch 64 and 256) on 16-core
#: H100 and H200 machines and a 2-core VM, applied per batch by the C core
#: (fr_auto_rule in csrc/include/fastread.h, which gives the numbers): on 16 cores,
#: warm, io_uring reads files up to 256 KiB as fast or faster, psync 512 KiB
#: and larger (its threads copy out of the page cache in parallel); cold and
#: on 2 cores, io_uring. GPU engines and range-only engines are only used by
#: name; ranges always go to io_uring.
AUTO_RULE = (f"per batch: io_uring for small or uncached files, O_DIRECT, ranges and GPU "
             f"output; for cached files of {_core.AUTO_MIN_SIZE // 1024} KiB or more (a running "
             f"mean over the batches; once there, down to 3/4 of that) psync on machines "
             f"with {_core.AUTO_MIN_CPUS} or more CPUs, else io_uring, and every "
             f"{_core.AUTO_TRIAL_EVERY} batches (first after {_core.AUTO_TRIAL_FIRST}) "
             f"{_core.AUTO_TRIAL_BATCHES} with the other engine, keeping the one that read "
             f"faster per byte")


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_choice():
    """(engine, why) for engine="auto" here, as the C core decides it
    (``fr_engine_auto``); engine is None if none runs. Where auto chooses
    per batch, engine is "io_uring" (the context it opens) and why says when
    batches go to psync instead."""
    built = set(_core.engine_names())
    name, passed_over = _core.auto_engine()
    status = _status(name, built)
    if status is not True:
        return None, f"no engine can read files here: io_uring: {passed_over}; {name}: {status}"
    if name == "io_uring":
        cpus = _cpus()
        first, other = (("psync", "io_uring")
                        if _core.auto_rule(_core.AUTO_MIN_SIZE, 1, cpus) == "psync"
                        else ("io_uring", "psync"))
        here = (f"this machine has {cpus} CPUs: cached files of "
                f"{_core.AUTO_MIN_SIZE // 1024} KiB or more go to {first}, or to "
                f"{other} while it reads them faster")
        return name, f"{AUTO_RULE}; {here}"
    return name, f"io_uring where it runs, else psync; io_uring: {_status('io_uring', built)}"


def resolve(engine):
    """The engine ``engine`` reads with here: 'auto' (or the FASTREAD_ENGINE
    default) as the C core decides it (``fr_engine_auto``: io_uring, else
    psync), a named engine if it can run; ValueError naming an unknown or
    unavailable one. For reports: readers and contexts pass 'auto' to the
    core as it is (:func:`check_engine`)."""
    engine = check_engine(engine)
    if engine != "auto":
        return engine
    name, passed_over = _core.auto_engine()
    if "Cannot allocate memory" in passed_over:
        _warn_once("io_uring-memlock",
                   f"fastread: io_uring cannot start here ({passed_over}; {_limits_hint()}); "
                   "'auto' reads with psync instead")
    if _status(name, set(_core.engine_names())) is not True:
        raise ValueError(f"no engine can read files here: {engines()}")
    return name


def check_engine(engine):
    """The engine to open for ``engine``: None means the FASTREAD_ENGINE
    default; 'auto' stays 'auto' (the C core resolves it when a context or
    reader opens: ``fr_engine_auto``); a named engine is checked to run
    here, else ValueError naming it and the engines that do."""
    if engine is None:
        engine = _defaults.get("engine")
    if engine == "auto":
        return engine
    if engine in KNOWN_ENGINES:
        status = _status(engine, set(_core.engine_names()))
        if status is True or _usable_by_name(engine):
            return engine
        raise ValueError(f"engine {engine!r} is unavailable here: {status}; "
                         f"available engines: {', '.join(_usable())}")
    raise ValueError(f"unknown engine {engine!r}; available engines: {', '.join(_usable())}")


def for_paths(engine, first_path):
    """The engine to read a list starting with ``first_path``: ``engine``,
    except that 'auto' (given, or FASTREAD_ENGINE's default) reads s3://
    URLs with the s3 engine. One owner for that choice: read_files(),
    SampleSource.read() and the Readers all ask here. Only the first path is
    looked at (a call costs no pass over a long list): a local path among
    URLs, or a URL among local paths, fails as that sample's error."""
    if (isinstance(first_path, str) and first_path.startswith("s3://") and
            (engine == "auto" or (engine is None and _defaults.get("engine") == "auto"))):
        return "s3"
    return engine


def s3_version():
    """(description of the libcurl the s3 engine runs on, None) or (None,
    why the s3 engine is absent or cannot run)."""
    if "s3" not in _core.engine_names():
        return None, f"not built: {KNOWN_ENGINES['s3']}"
    ok, why = _core.probe("s3")
    return (why, None) if ok else (None, why)


def _usable():
    return [n for n, st in engines().items() if st.files is True]


def _fold_xnvme(engine, given, engine_args):
    """engine_args ("key=value,...") with the xnvme_* options in `given`
    appended, checking that the engine takes each."""
    if not given:
        return engine_args
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
    return ",".join(([engine_args] if engine_args else []) + parts)


# The checks of each option, made where an option enters (EngineOptions, the
# keyword arguments of every public call) and again on defaults that come
# from the environment. The C core checks the ranges too, but its messages
# name neither where a value came from nor, for a wrong type, the option.
# Integer options: name -> (lowest, highest).
_INT_RANGES = {"queue_depth": (1, 4096), "threads": (0, 1024), "spin_us": (0, 100000),
               "remember_sizes": (0, 1 << 30), "cache_bytes": (0, (1 << 63) - 1)}
_BOOL_OPTIONS = ("o_direct", "register_buffers", "register_files", "pin_memory", "device_output")


def _origin(name, from_env):
    return f" (from {_defaults.env_var(name)})" if from_env else ""


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_option(name, v, from_env=False):
    """`v` as the option's type; ValueError naming the option if it is wrong."""
    where = _origin(name, from_env)
    if name in _INT_RANGES:
        lo, hi = _INT_RANGES[name]
        if not _is_int(v) or not lo <= v <= hi:
            raise ValueError(f"engine option {name} must be an integer in {lo}..{hi}, "
                             f"got {v!r}{where}")
        return int(v)
    if name == "direct_alignment":
        # At most 2**31: the C core holds it in an unsigned int.
        if not _is_int(v) or v < 512 or v > 1 << 31 or v & (v - 1):
            raise ValueError(f"engine option direct_alignment must be a power of two in "
                             f"512..2**31, got {v!r}{where}")
        return int(v)
    if name in _BOOL_OPTIONS:
        # 0 and 1 too: command lines and config files spell booleans so.
        if isinstance(v, (bool, np.bool_)) or (_is_int(v) and v in (0, 1)):
            return bool(v)
        raise ValueError(f"engine option {name} must be True or False, got {v!r}{where}")
    if name == "engine_args":
        if not isinstance(v, str):
            raise ValueError(f"engine option engine_args must be a string of key=value pairs, "
                             f"got {v!r}{where}")
        return v
    if name == "cache_dir":
        if not isinstance(v, (str, os.PathLike)) or (isinstance(v, str) and "\0" in v):
            raise ValueError(f"engine option cache_dir must be a directory path (\"\": no "
                             f"cache), got {v!r}{where}")
        return os.fspath(v)
    if name == "device_id":
        if not _is_int(v) or v < -1:
            raise ValueError(f"device_id must be a CUDA device number (>= 0) or None, "
                             f"got {v!r}{where}")
        return int(v)
    if name in XNVME_OPTIONS:
        if not (isinstance(v, str) or _is_int(v) or isinstance(v, bool)):
            raise ValueError(f"engine option {name} must be a word or a number, got {v!r}")
        return v
    if name == "s3":
        return _s3.S3Options.coerce(v)
    raise TypeError(f"unknown engine option {name!r}")


@dataclasses.dataclass(frozen=True, repr=False)
class EngineOptions:
    """How an engine reads: one object for every engine option, as KvikIO's
    defaults and DALI's reader arguments group theirs.

    ``None`` (every field's default) means the setting's default from
    :mod:`fastread._defaults`, read from its environment variable
    (``FASTREAD_QUEUE_DEPTH``, ...) when the options are resolved for an
    engine; explicit values win. Values are checked on construction: a
    wrong type or range raises ``ValueError`` naming the option.

    - ``queue_depth`` (1..4096): files or ranges in flight (io_uring, xNVMe).
    - ``threads`` (0..1024, 0: one per CPU): native threads (psync).
    - ``o_direct``, ``direct_alignment`` (a power of two >= 512): ``O_DIRECT``
      reads and the alignment they use.
    - ``register_buffers``, ``register_files``: io_uring registration.
    - ``engine_args``: engine-specific ``"key=value,..."``.
    - ``spin_us`` (0..100000): how long psync's and io_uring's helper
      threads poll for work before sleeping (``FASTREAD_SPIN_US``).
    - ``device_id``, ``pin_memory``, ``device_output``: the GPU a reader
      serves, page-locked host arenas, batches delivered in GPU memory.
    - ``xnvme_be``, ``xnvme_async``, ...: the xNVMe engines' options, folded
      into ``engine_args`` (only for the engines that take them).
    - ``cache_dir``, ``cache_bytes`` (``FASTREAD_OBJECT_CACHE_DIR``,
      ``FASTREAD_OBJECT_CACHE_BYTES``): a node-local cache of the objects the s3
      engine reads: kept on local disk after their first read, read from
      there with io_uring/psync afterwards, shared by every process of the
      node; at most ``cache_bytes`` (0: no limit), least recently used
      removed first. File engines ignore them.
    - ``s3``: how the s3 engine reaches a bucket (a
      :class:`fastread.s3.S3Options` or a mapping of its options: endpoint_url,
      region, credentials, ...), folded into ``engine_args``.

    repr() never shows a secret: the values of secret engine_args keys
    (``secret_access_key``, ``session_token``) and of S3 credentials are
    replaced by ``***``.

    :meth:`resolve` gives the complete, checked mapping for one engine;
    :meth:`coerce` builds options from an object, a mapping and keyword
    arguments (how every public call accepts them).
    """

    queue_depth: Optional[int] = None
    threads: Optional[int] = None
    o_direct: Optional[bool] = None
    direct_alignment: Optional[int] = None
    register_buffers: Optional[bool] = None
    register_files: Optional[bool] = None
    engine_args: Optional[str] = None
    spin_us: Optional[int] = None
    device_id: Optional[int] = None
    pin_memory: Optional[bool] = None
    device_output: bool = False
    xnvme_be: Union[str, int, None] = None
    xnvme_async: Union[str, int, None] = None
    xnvme_sync: Union[str, int, None] = None
    xnvme_admin: Union[str, int, None] = None
    xnvme_mem: Union[str, int, None] = None
    xnvme_direct: Union[str, int, None] = None
    xnvme_qdepth: Union[str, int, None] = None
    xnvme_queue: Union[str, int, None] = None
    xnvme_inflight: Union[str, int, None] = None
    xnvme_bounce: Union[str, int, None] = None
    xnvme_nsid: Union[str, int, None] = None
    s3: Optional["_s3.S3Options"] = None
    cache_dir: Optional[str] = None
    cache_bytes: Optional[int] = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                object.__setattr__(self, f.name, check_option(f.name, v))

    @classmethod
    def coerce(cls, options=None, /, **kwargs):
        """Options from ``options`` (an EngineOptions, a mapping of option
        names, or None) and keyword arguments; an unknown name raises
        TypeError listing the valid ones, an option given both ways raises
        TypeError naming it."""
        if options is None:
            base = {}
        elif isinstance(options, EngineOptions):
            base = options._given()
        elif isinstance(options, Mapping):
            base = dict(options)
        else:
            raise TypeError(f"options must be an EngineOptions, a mapping of option names to "
                            f"values, or None; got {type(options).__name__}")
        twice = sorted(k for k in kwargs if kwargs[k] is not None and base.get(k) is not None)
        if twice:
            raise TypeError(f"engine option(s) {', '.join(map(repr, twice))} given twice: in "
                            "options= and as keyword arguments")
        merged = {**base, **{k: v for k, v in kwargs.items() if v is not None}}
        unknown = sorted(set(merged) - set(_FIELD_NAMES))
        if unknown:
            raise TypeError(f"unknown engine option(s) {', '.join(map(repr, unknown))}; valid "
                            f"options: {', '.join(_FIELD_NAMES)}")
        if isinstance(options, EngineOptions) and not kwargs:
            return options
        return cls(**merged)

    def __repr__(self):
        # Only what was set: the rest comes from the environment at resolve().
        given = ", ".join(
            f"{k}={_s3.redact_engine_args(v)!r}" if k == "engine_args" else f"{k}={v!r}"
            for k, v in self._given().items() if not (k == "device_output" and v is False))
        return f"EngineOptions({given})"

    __str__ = __repr__

    def _given(self):
        """The options set explicitly (not None), by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    def replace(self, **changes):
        """A copy with some options changed (checked like the constructor)."""
        return dataclasses.replace(self, **changes)

    def resolve(self, engine):
        """The complete options for ``engine`` (a resolved engine name), as
        :class:`fastread.Context` and :class:`fastread.NativeReader` take
        them (``engine`` may be 'auto'): defaults filled in from :mod:`fastread._defaults`, the xNVMe
        options folded into ``engine_args``, the GPU settings decided."""
        given = self._given()
        out = {}
        for name in OPTION_NAMES:
            if name in given:
                out[name] = given[name]
            else:
                out[name] = check_option(name, _defaults.get(name), from_env=True)
        xnvme = {k: v for k, v in given.items() if k in XNVME_OPTIONS}
        out["engine_args"] = _fold_xnvme(engine, xnvme, out["engine_args"])
        if "s3" in given:
            if engine not in URL_ENGINES:
                raise TypeError(f"engine option 's3' applies only to engine 's3', not {engine!r}")
            out["engine_args"] = _s3.engine_args_for(out["engine_args"], given["s3"])
        out.update(_gpu_options(engine, given))
        return out


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(EngineOptions))


def options(engine, **opts):
    """Validated engine options with defaults filled in from fastread._defaults,
    as a dict (see :meth:`EngineOptions.resolve`). The xNVMe engines also take
    xnvme_be, xnvme_async, ... (see XNVME_OPTIONS), which are folded into
    engine_args."""
    return EngineOptions.coerce(**opts).resolve(engine)


def _gpu_options(engine, given):
    """device_id / device_output / pin_memory, with defaults: a reader that
    serves a GPU (device output, a device_id, or a GPU engine) uses
    FASTREAD_DEVICE_ID unless given and pins its host arenas unless told not
    to (FASTREAD_PIN_MEMORY); one that serves none never loads CUDA."""
    device_id = given.get("device_id")
    output = given.get("device_output") or False
    pin = given.get("pin_memory")
    if device_id == -1:
        device_id = None
    if device_id is None and (output or engine in GPU_ENGINES or pin):
        device_id = check_option("device_id", _defaults.get("device_id"), from_env=True)
    if device_id is None:
        return {"device_id": -1, "device_output": False, "pin_memory": False}
    if pin is None:
        # A GPU engine's arenas are staging for the rare repair only.
        pin = engine not in GPU_ENGINES and check_option(
            "pin_memory", _defaults.get("pin_memory"), from_env=True)
    return {"device_id": device_id, "device_output": bool(output), "pin_memory": bool(pin)}


# Why an engine that probed fine may still not open: the kernel charges
# io_uring rings (and registered buffers) to RLIMIT_MEMLOCK, and each ring
# and registered file table to RLIMIT_NOFILE.
_LIMIT_ERRNOS = (_errno.ENOMEM, _errno.EPERM, _errno.EMFILE, _errno.ENFILE, _errno.EAGAIN)


_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _limits_hint():
    def fmt(v):
        return "unlimited" if v == resource.RLIM_INFINITY else str(v)
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (f"RLIMIT_MEMLOCK is {fmt(memlock)} bytes and RLIMIT_NOFILE {fmt(nofile)}: raise them "
            "(ulimit -l / -n), lower queue_depth, or use engine='psync'")


# Files an engine context opens at once at most (the engines' WINDOW).
FILES_AT_ONCE = 256


def warn_if_few_fds(contexts, batch_size):
    """Warns (once) when ``contexts`` engine contexts opening up to
    ``batch_size`` files each (at most FILES_AT_ONCE) would run past
    RLIMIT_NOFILE: the engines then open fewer files at a time (correct
    bytes, fewer I/Os in flight)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return
    need = contexts * min(int(batch_size), FILES_AT_ONCE) + 64
    if soft < need:
        _warn_once("nofile", f"fastread: RLIMIT_NOFILE is {soft}, below the ~{need} descriptors "
                             f"{contexts} reader thread(s) opening up to "
                             f"{min(int(batch_size), FILES_AT_ONCE)} files each may want: "
                             "the engines will open fewer files at a time (slower, same bytes); "
                             "raise it with ulimit -n")


def open_engine(engine, open_one):
    """``open_one(name)``, a :class:`fastread.Context` or
    :class:`fastread.NativeReader` opened for ``name`` =
    :func:`check_engine` (``engine``): 'auto' goes to the C core as it is,
    which reads with psync where io_uring cannot be set up for a resource
    limit; that is warned about here (the opened object's ``engine`` says
    what it reads with). An io_uring named explicitly raises OSError saying
    which limits to raise. Returns ``(name, opened)``."""
    name = check_engine(engine)
    try:
        opened = open_one(name)
    except OSError as e:
        if name != "io_uring" or e.errno not in _LIMIT_ERRNOS:
            raise
        raise OSError(e.errno, f"{e.strerror} ({_limits_hint()})") from None
    # auto_fallback: why 'auto' reads with psync (io_uring's probe or set-up
    # failed). A resource limit is worth a warning; a policy (EPERM: seccomp,
    # io_uring_disabled) or a kernel without io_uring is not.
    fell_back = getattr(opened, "auto_fallback", 0)  # 0 too for sources read from memory
    if fell_back in _LIMIT_ERRNOS and fell_back != _errno.EPERM:
        warnings.warn(f"fastread: io_uring could not start ({os.strerror(fell_back)}; "
                      f"{_limits_hint()}); reading with psync instead",
                      RuntimeWarning, stacklevel=3)
    return name, opened


def open_context(engine="auto", options=None, **opts):
    """A fresh engine context (one per reader; not shared between threads).
    ``options``: an :class:`EngineOptions` or a mapping; keyword arguments
    are engine options too."""
    coerced = EngineOptions.coerce(options, **opts)
    return open_engine(engine, lambda name: _core.Context(name, **coerced.resolve(name)))[1]


# This thread's contexts (cached_context), the one cache behind
# read_files() and SampleSource.read(). A fork()ed child (a DataLoader
# worker) cannot use its parent's contexts (their helper threads stayed in
# the parent: the C core refuses them with ECHILD), so it forgets them.
_local = threading.local()


def _forget_contexts():
    _local.__dict__.clear()


os.register_at_fork(after_in_child=_forget_contexts)


def cached_context(engine="auto", options=None, *, all_cpus=False, **opts):
    """This thread's context for these settings, opened on first use.

    ``all_cpus``: unless ``threads`` (or FASTREAD_THREADS) says otherwise,
    one helper thread per CPU (``threads=0``): read_files()'s default, one
    call using the whole machine.

    The arguments and the FASTREAD_* environment are looked up first as
    given, before the options are checked and coerced (~60-90 us a call on
    the 2-core VM, a sixth of reading 64 small files; checking a named
    engine probes it, and io_uring's probe sets up a ring). The common call
    (no options) checks the last one first: the same engine and environment
    as last time is a tuple comparison, where hashing a key cost ~0.3 us.
    An open context keeps working even if the engine's probe would now say
    otherwise."""
    mine = _local.__dict__  # this thread's
    env = _defaults.env_snapshot()
    plain = options is None and not opts
    if plain:
        last = mine.get("last")
        if last is not None and last[0] == engine and last[1] == env and last[2] == all_cpus:
            return last[3]
        fast_key = (engine, env, all_cpus)  # no options to order
    else:
        try:
            given = options if options is None or isinstance(options, EngineOptions) else \
                tuple(sorted(dict(options).items()))
            fast_key = (engine, given, tuple(sorted(opts.items())), env, all_cpus)
            hash(fast_key)
        except TypeError:  # an unhashable option value: no shortcut
            fast_key = None
    fast = mine.setdefault("fast", {})
    ctx = fast.get(fast_key) if fast_key is not None else None
    if ctx is None:
        coerced = EngineOptions.coerce(options, **opts)
        if all_cpus and coerced.threads is None and "FASTREAD_THREADS" not in os.environ:
            coerced = coerced.replace(threads=0)
        name = check_engine(engine)
        resolved = coerced.resolve(name)
        # A context setting, not an engine option: from the environment only.
        remember = check_option("remember_sizes", _defaults.get("remember_sizes"), from_env=True)
        key = (name, remember) + tuple(sorted(resolved.items()))
        contexts = mine.setdefault("contexts", {})
        ctx = contexts.get(key)
        if ctx is None:
            _, ctx = open_engine(name, lambda n: _core.Context(n, **resolved,
                                                               remember_sizes=remember))
            contexts[key] = ctx
        if fast_key is not None:
            fast[fast_key] = ctx
    if plain:
        mine["last"] = (engine, env, all_cpus, ctx)
    return ctx
