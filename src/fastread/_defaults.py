"""Run-time settings, each overridable by an environment variable.

Read once per call of :func:`get`, so tests and users may change the
environment at run time. Explicit arguments always win over these.
"""
import os

_SETTINGS = {
    # name: (environment variable, default, type)
    "engine": ("FASTREAD_ENGINE", "auto", str),
    "queue_depth": ("FASTREAD_QUEUE_DEPTH", 64, int),
    "threads": ("FASTREAD_THREADS", 4, int),
    "o_direct": ("FASTREAD_O_DIRECT", False, bool),
    "direct_alignment": ("FASTREAD_DIRECT_ALIGNMENT", 4096, int),
    "register_buffers": ("FASTREAD_REGISTER_BUFFERS", True, bool),
    "register_files": ("FASTREAD_REGISTER_FILES", True, bool),
    "engine_args": ("FASTREAD_ENGINE_ARGS", "", str),
    # Microseconds the psync and io_uring helper threads poll for the next
    # piece of work before they sleep (yielding their core between polls;
    # 0: sleep at once). A sleeping thread takes tens of microseconds to
    # wake (more from an idle core), longer than a whole read_files() call
    # on 64 cached small files: without polling the calling thread read
    # nearly all of them alone. Polling is bounded: an idle pool sleeps; a
    # context with more threads than CPUs never polls.
    "spin_us": ("FASTREAD_SPIN_US", 50, int),
    # Paths whose sizes a context remembers from reads without sizes
    # (read_files()), used as hints when it reads them again: with every
    # size known io_uring skips a stat per file (16-core H200, 256 cached
    # 4 KiB files read before: 117.6 against 145.3 us a call; a first pass
    # costs 4-7% more). A stale size costs time, never bytes. At most this
    # many paths (a table of 32 bytes a path at most); 0: none.
    "remember_sizes": ("FASTREAD_REMEMBER_SIZES", 65536, int),
    # A node-local cache of objects read over the network (the s3 engine):
    # objects are kept in this directory after their first read, and later
    # reads (the next epochs) take them from local disk with io_uring or
    # psync. Shared safely by every process of a node (ranks, DataLoader
    # workers): each object is fetched once. "": no cache.
    "cache_dir": ("FASTREAD_OBJECT_CACHE_DIR", "", str),
    # The most bytes the cache's entries may hold; past it the least
    # recently used are removed down to 90%. 0: no limit.
    "cache_bytes": ("FASTREAD_OBJECT_CACHE_BYTES", 0, int),
    # The most bytes the record formats' decompressed copies of compressed
    # shards (.tar.gz WebDataset, gzip'd Squirrel) may hold in their cache
    # directory; least recently used copies of other shards are deleted past
    # it. A byte count or a size such as 20GiB (fastread.formats._cache
    # parses it). The formats' cache_bytes= argument wins.
    "formats_cache_bytes": ("FASTREAD_FORMATS_CACHE_BYTES", 16 << 30, str),
    # The most bytes one compressed shard may inflate to (a bound on a
    # decompression bomb's disk and time: fastread.formats._gzip); a size
    # such as 64GiB. The formats' max_inflated= argument wins.
    "formats_max_inflated": ("FASTREAD_FORMATS_MAX_INFLATED", 16 << 30, str),
    # Where the record formats keep the indexes they build (WebDataset: one
    # memory-mappable file per set of shards, keyed by the shards' paths,
    # sizes and mtimes and the reader's spec), so the next run and the
    # node's other ranks open it instead of parsing the shards again;
    # written atomically by rename. "": ~/.cache/fastread/index; "off": none.
    "index_cache_dir": ("FASTREAD_INDEX_CACHE_DIR", "", str),
    "prefetch": ("FASTREAD_PREFETCH", 2, int),
    # Descriptors a reader over ranges of many files (WebDataset, Squirrel,
    # CIFAR shards: fastread.formats.MultiFileRanges) keeps open at most, an
    # LRU shared out among its workers: 10,000 shards read with this many,
    # whatever their count. 0: min(256, RLIMIT_NOFILE's soft limit / 4). A
    # value past the soft limit's headroom is clamped, with a warning
    # (max_open_files below).
    "max_open_files": ("FASTREAD_MAX_OPEN_FILES", 0, int),
    # Reader threads, each with its own engine context; 0: one per 2 CPUs.
    "workers": ("FASTREAD_WORKERS", 0, int),
    # The CUDA device a reader serves when it needs one (GPU output, the
    # cufile engine) and none is given.
    "device_id": ("FASTREAD_DEVICE_ID", 0, int),
    # Page-lock host arenas whenever a reader serves a GPU, so copies to it
    # run at full speed (costs locked host memory: prefetch + workers +
    # in-use batches).
    "pin_memory": ("FASTREAD_PIN_MEMORY", True, bool),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_value(var, raw, kind):
    """``raw`` (an environment variable's text) as ``kind`` (bool, int or
    str); ValueError naming ``var``. Every settings module parses with it."""
    if kind is bool:
        v = raw.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise ValueError(f"{var}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
    if kind is int:
        try:
            return int(raw, 0)
        except ValueError:
            raise ValueError(f"{var}={raw!r}: expected an integer") from None
    return raw


def _parse(name, raw, kind):
    return parse_value(_SETTINGS[name][0], raw, kind)


def get(name):
    """The setting's value: the environment variable if set, else the default."""
    var, default, kind = _SETTINGS[name]
    raw = os.environ.get(var)
    return default if raw is None else _parse(name, raw, kind)


def default(name):
    """The setting's default, when its environment variable is unset."""
    return _SETTINGS[name][1]


def env_var(name):
    """The environment variable that overrides setting `name`."""
    return _SETTINGS[name][0]


def reader_workers(workers=None):
    """Reader threads: explicit, else FASTREAD_WORKERS, else one per 2 CPUs
    of this rank's share of the node (at least 1, at most 8). Cold reads
    want many files in flight, and each worker keeps up to queue_depth of
    its own: on a 16-core H200 machine, 8 workers read a cold batch-256
    epoch 1.6x as fast as 4. Under torchrun the LOCAL_WORLD_SIZE ranks of a
    node share its CPUs: 8 ranks of 8 workers each would run 64 readers
    (each with its engine's threads) on 16 cores, so each rank takes
    cpus / 2 / LOCAL_WORLD_SIZE."""
    if workers is None:
        workers = get("workers")
    if not isinstance(workers, int) or isinstance(workers, bool) or not 0 <= workers <= 64:
        raise ValueError(f"workers must be an integer in 0..64, got {workers!r}")
    if workers == 0:
        ranks = node_env()["local_world_size"]
        workers = min(8, max(1, (os.cpu_count() or 1) // 2 // ranks))
    return workers


# Descriptors left to the rest of the process when max_open_files is
# clamped to RLIMIT_NOFILE's headroom (sockets, rings, the caller's files).
_FD_RESERVE = 32


def max_open_files(value=None, engine=None, files=None, workers=1):
    """The descriptors a reader over many files may keep open: ``value``,
    else FASTREAD_MAX_OPEN_FILES, else (0) min(256, soft limit / 4); never
    more than the soft RLIMIT_NOFILE's headroom (the limit less the
    descriptors open now, less a reserve of 32): a larger value is clamped
    with a RuntimeWarning naming the option. At least 1.

    The automatic value for ``engine="io_uring"`` over ``files`` files
    read by ``workers`` contexts, where files <= soft limit / 2, is
    (files * 1.25 + 64) * workers where that is more (within the headroom,
    silently): every worker's context reads any shard, and its rings share
    the files out by a hash (hence the slack). The rings hold them in their
    registered tables, not in process descriptors, and each ring's table is
    bounded by RLIMIT_NOFILE alone, so every shard of a 10^4-shard set stays
    open and a shuffled epoch opens none (1 KB samples, 10^4 shards, 2-core
    VM: 1.4-1.9x the samples/s of 256, 3.7-3.8 against 5.6-6.3 us of CPU a
    sample; docs/benchmarks.md "Many shards at real sample sizes"). Only
    where it holds them all: an LRU holding a part of 10^5 one-sample
    shards saves no opens (a shard comes back once an epoch), so past that
    the 256 stands. Where io_uring cannot hold files
    (no linked direct opens) the reader falls back to psync and the value
    bounds real descriptors: hence never past the headroom."""
    import resource
    import warnings
    given = value is not None
    if value is None:
        value = get("max_open_files")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"max_open_files must be an integer >= 0 (0: automatic), got {value!r}")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    auto = value == 0
    if auto:
        value = max(1, min(256, soft // 4))
        want = (files + files // 4 + 64) * max(1, workers) if files else 0
        if not (engine == "io_uring" and files and files <= soft // 2 and want > value):
            return value
        value = want
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 0
    headroom = max(1, soft - open_now - _FD_RESERVE)
    if auto:
        return max(1, min(value, headroom))
    if value > headroom:
        where = "" if given else f" (from {env_var('max_open_files')})"
        warnings.warn(f"max_open_files={value}{where} is past RLIMIT_NOFILE's headroom ({soft} "
                      f"soft limit, {open_now} descriptors open): using {headroom}",
                      RuntimeWarning, stacklevel=3)
        value = headroom
    return value


def all_settings():
    return {name: get(name) for name in _SETTINGS}


def names():
    return list(_SETTINGS)


def env_int(name):
    """An integer from environment variable ``name`` (torchrun's RANK,
    WORLD_SIZE, LOCAL_RANK), None if unset; ValueError naming it otherwise."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def node_env():
    """Where this process stands in a torchrun (or compatible) job, from
    its environment: ``rank`` / ``world_size`` (RANK, WORLD_SIZE: the
    global shard), ``local_rank`` / ``local_world_size`` (LOCAL_RANK,
    LOCAL_WORLD_SIZE: this node's ranks, which share its CPUs, its GPUs and
    its object cache) and ``group_rank`` (GROUP_RANK: the node's index).
    Unset: a single process (0, 1, 0, 1, 0); a rank is checked against its
    size where both are set (LOCAL_RANK alone may name a GPU). ValueError
    naming the variable that is not an integer or out of range."""
    got = {key: env_int(var) for key, var in (
        ("rank", "RANK"), ("world_size", "WORLD_SIZE"), ("local_rank", "LOCAL_RANK"),
        ("local_world_size", "LOCAL_WORLD_SIZE"), ("group_rank", "GROUP_RANK"))}
    out = {"rank": got["rank"] or 0, "world_size": got["world_size"] or 1,
           "local_rank": got["local_rank"] or 0,
           "local_world_size": got["local_world_size"] or 1,
           "group_rank": got["group_rank"] or 0}
    for key, var, size, size_var in (("rank", "RANK", "world_size", "WORLD_SIZE"),
                                     ("local_rank", "LOCAL_RANK", "local_world_size",
                                      "LOCAL_WORLD_SIZE")):
        if out[size] < 1:
            raise ValueError(f"environment variable {size_var}={out[size]} must be >= 1")
        if out[key] < 0 or (got[size] is not None and out[key] >= out[size]):
            raise ValueError(f"environment variable {var}={out[key]} must be in "
                             f"[0, {size_var}={out[size]})")
    if out["group_rank"] < 0:
        raise ValueError(f"environment variable GROUP_RANK={out['group_rank']} must be >= 0")
    if got["world_size"] is not None and out["local_world_size"] > out["world_size"]:
        raise ValueError(f"environment variable LOCAL_WORLD_SIZE={out['local_world_size']} "
                         f"exceeds WORLD_SIZE={out['world_size']}")
    return out


# env_snapshot's lookup: os.environ's raw bytes mapping where CPython keeps
# one (POSIX), else os.environ itself.
_ENV_NAMES = tuple(v[0] for v in _SETTINGS.values())
_ENV_DATA = getattr(os.environ, "_data", None)
if isinstance(_ENV_DATA, dict) and os.name == "posix":
    _ENV_KEYS, _ENV_GET = tuple(map(os.fsencode, _ENV_NAMES)), _ENV_DATA.get
else:
    _ENV_KEYS, _ENV_GET = _ENV_NAMES, os.environ.get


def env_snapshot():
    """The FASTREAD_* variables' values, for caches keyed by the environment.
    os.environ.get encodes the name and decodes the value on every call (13
    of them cost 28 us on the 2-core VM, as much as reading 7 small files):
    where os.environ keeps its raw bytes mapping (CPython on POSIX) this
    reads that instead; writes through os.environ update it, so a changed
    setting is still seen at the next call."""
    return tuple(map(_ENV_GET, _ENV_KEYS))
