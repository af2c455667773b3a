"""The decompression cache of the record formats: compressed shards
(``.tar.gz`` WebDataset shards, gzip'd Squirrel shards) are decompressed
once into a cache directory and read as byte ranges from there.

Bounded: after a source has made the copies it needs, the least recently
used copies of *other* shards in that directory are deleted until the
directory holds at most ``cache_bytes`` (argument, else the environment
variable ``FASTREAD_FORMATS_CACHE_BYTES``, e.g. ``20GiB``; default 16 GiB;
0 keeps nothing but what the source being built needs). A source's own
copies are never deleted while it is built (it reads them later), so a
source larger than the bound still works: the directory then holds exactly
what it needs. "Used" is the copy's modification time, touched every time
a source uses it. Half-written copies left by a killed process
(``*.tmp``) are deleted once they are an hour old.

A copy is named after the shard's absolute path, size and modification
time, so a changed shard gets a new copy and the old one ages out.

Another process may still be reading a copy this one deletes: on Linux its
open descriptors keep working; a source in that process that opens the
copy again later fails that read with a ReadError naming the copy. Give
concurrent jobs a bound that holds all their shards (or their own
``cache_dir``).
"""
import hashlib
import os
import re
import time
import warnings

from fastread import _defaults

__all__ = ["CACHE_BYTES_VAR", "DEFAULT_CACHE_BYTES", "cache_bytes", "cache_dir_for", "parse_bytes",
           "cached_copy", "prune"]

# The environment default is a fastread._defaults setting (fastread info lists it).
CACHE_BYTES_VAR = _defaults.env_var("formats_cache_bytes")
DEFAULT_CACHE_BYTES = _defaults.default("formats_cache_bytes")
# A copy: "<16 hex digits>-<shard's base name><suffix>"; only these are pruned.
_COPY_RE = re.compile(r"^[0-9a-f]{16}-.+\.(tar|msgpack)$")
_TMP_RE = re.compile(r"^[0-9a-f]{16}-.+\.(tar|msgpack)\.\d+\.tmp$")
_STALE_TMP_SECONDS = 3600
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2,
          "g": 1000 ** 3, "gb": 1000 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value, what):
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a byte count, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{what}={value!r}: expected a byte count such as 1000000, "
                             "500MB or 20GiB")
        n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise ValueError(f"{what} must be a byte count (an int or a string such as '20GiB'), "
                         f"got {type(value).__name__}")
    if n < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return n


def cache_bytes(value=None):
    """The cache bound in bytes: ``value`` if given (an int or a string such
    as ``'20GiB'``), else ``$FASTREAD_FORMATS_CACHE_BYTES``, else 16 GiB.
    ValueError naming the argument or the variable."""
    if value is not None:
        return parse_bytes(value, "cache_bytes")
    return parse_bytes(_defaults.get("formats_cache_bytes"), CACHE_BYTES_VAR)


def cache_dir_for(fmt, cache_dir=None):
    """``cache_dir``, else ``$FASTREAD_CACHE_DIR/<fmt>``, else
    ``~/.cache/fastread/<fmt>``."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    base = os.environ.get("FASTREAD_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastread")
    return os.path.join(base, fmt)


def cached_copy(path, cache_dir, suffix, make):
    """The path of ``path``'s decompressed copy in ``cache_dir``: made with
    ``make(path, dest)`` (which must write ``dest`` atomically) if absent,
    its modification time touched if present (it is the most recently
    used now)."""
    st = os.stat(path)
    tag = hashlib.sha1(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    dest = os.path.join(cache_dir, f"{tag.hexdigest()[:16]}-{os.path.basename(path)}{suffix}")
    try:
        os.utime(dest)
        return dest
    except FileNotFoundError:
        pass
    os.makedirs(cache_dir, exist_ok=True)
    make(path, dest)
    return dest


def prune(cache_dir, limit, keep=()):
    """Deletes the least recently used copies in ``cache_dir`` (not those in
    ``keep``) until the copies there total at most ``limit`` bytes, and
    half-written ones an hour old. Returns the paths deleted. Copies that
    vanish meanwhile (another process pruning) are fine."""
    keep = {os.path.abspath(k) for k in keep}
    try:
        names = os.listdir(cache_dir)
    except FileNotFoundError:
        return []
    entries, total, removed = [], 0, []
    now = time.time()
    for name in names:
        full = os.path.join(cache_dir, name)
        try:
            st = os.stat(full)
        except FileNotFoundError:
            continue
        if _TMP_RE.match(name):
            if now - st.st_mtime > _STALE_TMP_SECONDS and _unlink(full):
                removed.append(full)
            continue
        if not _COPY_RE.match(name):
            continue   # not ours: never touched
        total += st.st_size
        if os.path.abspath(full) not in keep:
            entries.append((st.st_mtime_ns, name, full, st.st_size))
    entries.sort()
    for _mtime, _name, full, size in entries:
        if total <= limit:
            break
        if _unlink(full):
            removed.append(full)
        total -= size
    return removed


def _unlink(path):
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:   # the cache is an optimisation: reading goes on
        warnings.warn(f"cannot prune the decompression cache: {path}: {e.strerror}",
                      RuntimeWarning, stacklevel=3)
        return False
