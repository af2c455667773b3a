"""Bounded decompression of gzip'd shards (``.tar.gz`` WebDataset shards,
gzip'd Squirrel shards) into the formats' cache (:mod:`._cache`).

A shard is untrusted input, and gzip inflates up to ~1000x: a 2 MB shard
can be 2 GiB of zeros. Three bounds hold, whatever the shard holds:

- Memory: each step inflates at most :data:`STEP` bytes (zlib's
  ``max_length``; the input it has not used waits in ``unconsumed_tail``)
  from reads of :data:`READ` bytes, and writes them out before the next:
  about 2 MiB besides the interpreter's own, at any compression ratio.
- Size: the inflated stream may total at most ``max_inflated`` bytes (the
  formats' ``max_inflated=`` argument, else ``$FASTREAD_FORMATS_MAX_INFLATED``,
  else :data:`DEFAULT_MAX_INFLATED`, 16 GiB: the default bound of the whole
  cache); past it, FormatError naming the shard and the offset reached.
- What the format can need: a ``bound`` (the format's own, fed each
  inflated step) stops the inflating at the first byte the format says
  cannot be there: a tar's headers are followed as their declared sizes
  place them (a header that is no header, a member declared past
  ``max_inflated``, more than a little after the end-of-archive block all
  fail at once: a stream of zeros is an empty tar followed by a bomb), a
  Squirrel shard must start with a MessagePack map.

Time follows: a bomb fails after inflating what its bound allows, at
zlib's speed (the 2 GiB bomb of issue 43 fails in its first step).
"""
import os
import threading
import zlib

from fastread import _defaults
from fastread._safe_open import open_file
from fastread.formats._cache import parse_bytes
from fastread.formats.cifar import FormatError

__all__ = ["DEFAULT_MAX_INFLATED", "MAX_INFLATED_VAR", "READ", "STEP", "gunzip_to",
           "max_inflated"]

MAX_INFLATED_VAR = _defaults.env_var("formats_max_inflated")
DEFAULT_MAX_INFLATED = _defaults.default("formats_max_inflated")
#: Compressed bytes read at a time.
READ = 256 << 10
#: The most bytes one decompression step may give (zlib's max_length).
STEP = 1 << 20


def max_inflated(value=None):
    """The most bytes a shard may inflate to: ``value`` if given (an int or
    a size such as ``'64GiB'``), else ``$FASTREAD_FORMATS_MAX_INFLATED``,
    else 16 GiB. ValueError naming the argument or the variable."""
    if value is not None:
        return parse_bytes(value, "max_inflated")
    return parse_bytes(_defaults.get("formats_max_inflated"), MAX_INFLATED_VAR)


def gunzip_to(path, dest, *, limit=None, bound=None):
    """Decompresses the gzip file ``path`` (one or more members) into
    ``dest``, atomically, within the bounds of the module's documentation:
    ``limit`` bytes in all (None: :func:`max_inflated`), and ``bound``, an
    object whose ``feed(data)`` sees every inflated step in order and
    raises FormatError where the format can need no more. A bad, truncated
    or over-long stream is a FormatError naming ``path`` and the compressed
    offset; ``dest`` is then not written."""
    limit = max_inflated() if limit is None else limit
    # One temporary per writer (process and thread: two threads of one
    # process opening one name truncated each other's copy, and the first
    # renamed a file with a hole, which indexed as a short shard); digits
    # only, as _cache._TMP_RE expects. A leftover of a crashed writer with
    # the same ids is replaced.
    tmp = f"{dest}.{os.getpid()}{threading.get_native_id()}.tmp"
    try:
        try:
            out_f = open(tmp, "xb")
        except FileExistsError:
            os.remove(tmp)
            out_f = open(tmp, "xb")
        with open_file(path) as src, out_f as out:
            _inflate(path, src, out, limit, bound)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _inflate(path, src, out, limit, bound):
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    consumed = 0        # compressed bytes used so far
    total = 0           # bytes inflated
    started = False     # a member's first byte was read
    while True:
        data = src.read(READ)
        if not data:
            break
        while True:
            if d.eof:
                # Past a member's end: another member, or zero padding (as gzip(1) allows).
                if not data.strip(b"\0"):
                    consumed += len(data)
                    break
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            started = True
            try:
                chunk = d.decompress(data, STEP)
            except zlib.error as e:
                raise FormatError(path, consumed, f"bad gzip stream: {e}") from None
            rest = d.unused_data if d.eof else d.unconsumed_tail
            consumed += len(data) - len(rest)
            data = rest
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise FormatError(path, consumed, f"inflates to more than {limit} bytes "
                                      f"(max_inflated; ${MAX_INFLATED_VAR}): a decompression "
                                      "bomb, or a shard to decompress before use")
                if bound is not None:
                    bound.feed(chunk)
                out.write(chunk)
            # A full step may leave output inside zlib with no input left: ask again.
            if not data and len(chunk) < STEP:
                break
    if not started:
        raise FormatError(path, 0, "empty file (not a gzip stream)")
    if not d.eof:
        raise FormatError(path, consumed, "truncated gzip stream (it ends before its end marker)")
