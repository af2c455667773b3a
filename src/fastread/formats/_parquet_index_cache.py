"""The Parquet source's ranges index, kept in the node-local index cache
(issue 40): a Reader's ranged route (:mod:`._parquet_native`) finds each
uncompressed row group's values as file ranges by reading its image column
chunk and letting Arrow's decoder walk it, then reads every batch's rows by
range, so a first epoch reads each image byte twice. This module keeps those
ranges on disk, one entry per Parquet file, so that a later process's
Reader indexes nothing: a cached row group is served with no chunk read.

An entry (``pq-<hash>.frpq`` in :func:`._index_files.cache_dir`, the
directory WebDataset's index cache uses) holds, for the file as it was
indexed (absolute path, size, mtime_ns, the SHA-256 of its footer bytes and
the image leaf, all in the name's hash and again in the header):

- per row group that was ranged, per row its value's file offset and length
  (int64 each: 16 B a row; length -1: a null value);
- the row groups that were not rangeable (Arrow copied values: dictionary
  pages), which keep the route they take today.

The file: a 32-byte preamble (magic ``FRPQIDX1``, the JSON header's length,
the CRC-32 of header and arrays, the arrays' length), the JSON header (the
identity above, the row count of every row group, the ranged and plain row
groups), then the offsets of the ranged groups' rows and their lengths.
Written atomically (a temporary file renamed over the entry).

Trusted only when everything checks: magic, lengths and CRC; the identity
equal to the file's as the source read its footer and as it is when the
entry is opened (a rewritten file: another name, and the old entry is never
read; it ages out of the cache, :func:`prune`: the least recently used past
``ENTRIES``); the row
counts equal to the footer's; every range inside its row group's column
chunk, inside the file. Anything else: the entry is ignored, the row groups
indexed by reading their chunks as without a cache, and the entry rewritten.
A file modified less than ``RACY_NS`` before is not cached (its identity
could repeat after a rewrite within the timestamp granularity).
"""
import hashlib
import json
import os
import struct
import threading
import time
import warnings
import zlib

import numpy as np

from fastread.formats import _index_files

MAGIC = b"FRPQIDX1"
SUFFIX = ".frpq"
VERSION = 1
_PRE = struct.Struct("<8sIIQ8x")     # magic, header length, crc32, arrays' bytes
#: Entries of Parquet files the cache keeps (their own count: a Hub data set
#: has hundreds of files, ImageNet-1k 294, more than the 256 entries of
#: WebDataset's sets); past it the least recently used go.
ENTRIES = 4096


def prune(directory, keep=ENTRIES):
    """Removes the least recently used ``pq-*.frpq`` entries past ``keep``
    (and temporary files a crashed writer left over an hour ago)."""
    _index_files.cache_prune(directory, keep,
                             entry=lambda name: name.startswith("pq-") and name.endswith(SUFFIX))


def identity(path):
    """:func:`._index_files.identity` (size, mtime_ns), or None where the file
    cannot be stat'ed (then nothing is cached or trusted for it)."""
    try:
        return _index_files.identity(path)
    except OSError:
        return None


def _key(meta, leaf, ident):
    return {"version": VERSION, "path": os.path.abspath(meta.path), "size": ident[0],
            "mtime_ns": ident[1], "footer": hashlib.sha256(meta.thrift).hexdigest(),
            "leaf": leaf}


def entry_path(directory, key):
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(directory, f"pq-{h}{SUFFIX}")


def write_entry(path, key, rows, ranged, plain):
    """Writes an entry: ``ranged`` {group: (begin int64, length int64, -1
    null)}, ``plain`` the groups not rangeable; tmp + rename."""
    groups = sorted(ranged)
    header = dict(key, rows=[int(r) for r in rows], ranged=groups, plain=sorted(plain))
    hb = json.dumps(header, sort_keys=True).encode()
    begins = [np.ascontiguousarray(ranged[g][0], np.int64) for g in groups]
    lens = [np.ascontiguousarray(ranged[g][1], np.int64) for g in groups]
    body = b"".join(a.tobytes() for a in begins + lens)
    crc = zlib.crc32(body, zlib.crc32(hb))
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"   # pq-...: pruned if left
    try:
        with open(tmp, "wb") as f:
            f.write(_PRE.pack(MAGIC, len(hb), crc, len(body)))
            f.write(hb)
            f.write(body)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_entry(path, key, meta):
    """({group: (begin, length)}, plain groups) of a valid entry for the
    file ``meta`` as ``key`` describes it; ValueError / OSError where the
    entry is damaged, stale or does not fit the footer."""
    from fastread._safe_open import open_file
    # At most what an entry of this file can take (a header of 1 MiB at most).
    limit = _PRE.size + (1 << 20) + 16 * sum(int(r) for r in meta.rows)
    with open_file(path) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError("longer than an entry of this file can be")
    if len(raw) < _PRE.size:
        raise ValueError("truncated preamble")
    magic, hlen, crc, blen = _PRE.unpack_from(raw)
    if magic != MAGIC or len(raw) != _PRE.size + hlen + blen:
        raise ValueError("not an entry, or truncated")
    hb, body = raw[_PRE.size:_PRE.size + hlen], raw[_PRE.size + hlen:]
    if zlib.crc32(body, zlib.crc32(hb)) != crc:
        raise ValueError("CRC mismatch")
    header = json.loads(hb)
    if not isinstance(header, dict):
        raise ValueError("not an entry's header")
    if any(header.get(k) != v for k, v in key.items()):
        raise ValueError("another file's entry (stale)")
    rows = [int(r) for r in meta.rows]
    if header.get("rows") != rows:
        raise ValueError("row counts differ from the footer's")
    groups, plain = header.get("ranged"), header.get("plain")
    if not isinstance(groups, list) or not isinstance(plain, list) or \
            not all(isinstance(g, int) and 0 <= g < len(rows) for g in groups + plain) or \
            len(set(groups + plain)) != len(groups) + len(plain):
        raise ValueError("bad row group lists")
    total = sum(rows[g] for g in groups)
    if blen != 16 * total:
        raise ValueError("arrays do not match the row counts")
    begins = np.frombuffer(body, np.int64, total)
    lens = np.frombuffer(body, np.int64, total, 8 * total)
    out, at = {}, 0
    for g in groups:
        n = rows[g]
        b, ln = begins[at:at + n], lens[at:at + n]
        at += n
        offs, clens = meta.chunks[g]
        lo, hi = int(offs[0]), int(offs[0]) + int(clens[0])
        if hi > meta.size or (n and (ln.min() < -1 or b.min() < lo
                                     or (b + np.maximum(ln, 0)).max() > hi)):
            raise ValueError(f"row group {g}: a range outside its column chunk")
        out[g] = (b, ln)
    return out, set(plain)


def identities(source):
    """{file: (size, mtime_ns)} of the source's files whose ranges may be
    cached (local Parquet files on the native ranged route), taken when the
    source is built, after their footers were read."""
    if not source.ranged:
        return {}
    return {f: identity(m.path) for f, m in enumerate(source.metas)
            if m.kind == "parquet" and m.native is not None}


def for_reader(source, native_for):
    """A Reader's :class:`RangesIndex` over ``source``, or None where
    nothing is cached (``index_cache=False``, no ranged file)."""
    if not source._index_identity:
        return None
    directory = _index_files.cache_dir(source.index_cache)
    if directory is None:
        return None
    return RangesIndex(source, directory, {
        f: [g for g in range(len(source.metas[f].rows)) if native_for(source.metas[f], g)]
        for f in source._index_identity})


def stats(index):
    """The counters a Reader's ``stats()`` gives for the cache."""
    if index is None:
        return {"row_groups_index_cached": 0, "index_cache_written": 0,
                "index_cache_ignored": 0}
    return {"row_groups_index_cached": index.served, "index_cache_written": index.written,
            "index_cache_ignored": index.ignored}


class RangesIndex:
    """A Reader's view of the cache for one source's files: ranges looked
    up per (file, row group), recorded as row groups are indexed, an entry
    written when every rangeable row group of a file is known (at once: a
    process that ends after its first epoch without closing its Reader has
    cached it) and, for what is new, when the Reader closes."""

    def __init__(self, source, directory, candidates):
        self.source, self.directory = source, directory
        self._candidates = candidates       # file -> groups taking the ranged route
        self._lock = threading.Lock()
        self._files = {}                    # file -> _FileEntry
        self.served = 0                     # row groups served from the cache
        self.written = 0                    # entries written
        self.ignored = 0                    # entries found and not trusted
        self.pruned = False                 # the cache pruned once per Reader

    def _file(self, f):
        with self._lock:
            fe = self._files.get(f)
            if fe is None:
                fe = self._files[f] = _FileEntry(self, f)
            return fe

    def lookup(self, f, g):
        """(begin, end, valid or None) of row group ``g`` of file ``f`` from
        the cache, "plain" where it is known not rangeable, else None."""
        fe = self._file(f)
        with self._lock:
            if g in fe.plain:
                return "plain"
            hit = fe.ranged.get(g)
            if hit is None or g not in fe.loaded:
                return None
            self.served += 1
        b, ln = hit
        nulls = ln < 0
        if nulls.any():
            return b, b + np.maximum(ln, 0), ~nulls
        return b, b + ln, None

    def record(self, f, g, begin, end, valid):
        fe = self._file(f)
        ln = end - begin
        if valid is not None:
            ln = np.where(valid, ln, -1)
        with self._lock:
            fe.ranged[g] = (np.asarray(begin, np.int64), np.asarray(ln, np.int64))
            fe.new = True
            complete = fe.complete()
        if complete:
            fe.write()

    def record_plain(self, f, g):
        fe = self._file(f)
        with self._lock:
            if g in fe.plain:
                return
            fe.plain.add(g)
            fe.new = True
            complete = fe.complete()
        if complete:
            fe.write()

    def close(self):
        """Writes what is new of every file (row groups indexed since)."""
        with self._lock:
            files = [fe for fe in self._files.values() if fe.new]
        for fe in files:
            fe.write()


class _FileEntry:
    def __init__(self, index, f):
        self.index, self.f = index, f
        src = index.source
        meta = src.metas[f]
        self.meta = meta
        self.ranged, self.plain, self.loaded = {}, set(), set()
        self.new = False
        self.path = None
        ident = src._index_identity.get(f)
        # The file as it is now must be the file the footer was read from.
        if ident is None or identity(meta.path) != ident:
            return
        self.key = _key(meta, src._image_leaf, ident)
        self.path = entry_path(index.directory, self.key)
        self.cacheable = ident[1] < time.time_ns() - _index_files.RACY_NS
        if not os.path.exists(self.path):
            return
        try:
            ranged, plain = read_entry(self.path, self.key, meta)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            del e   # damaged, truncated or not ours: indexed again and rewritten
            index.ignored += 1
            self.new = True
            return
        self.ranged, self.plain, self.loaded = ranged, plain, set(ranged)
        _index_files.cache_touch(self.path)

    def complete(self):
        want = self.index._candidates.get(self.f, ())
        return self.new and all(g in self.ranged or g in self.plain for g in want)

    def write(self):
        if self.path is None or not self.cacheable:
            return
        with self.index._lock:
            if not self.new:
                return
            ranged, plain = dict(self.ranged), set(self.plain)
            self.new = False
        # Changed while it was read: the ranges may describe neither version.
        if identity(self.meta.path) != (self.key["size"], self.key["mtime_ns"]):
            return
        try:
            os.makedirs(self.index.directory, exist_ok=True)
            write_entry(self.path, self.key, self.meta.rows, ranged, plain)
        except OSError as e:
            warnings.warn(f"fastread: the Parquet ranges index of {self.meta.path!r} could not "
                          f"be cached in {self.index.directory!r} ({e}); it is rebuilt next "
                          "time", RuntimeWarning, stacklevel=2)
            return
        with self.index._lock:
            self.index.written += 1
            first, self.index.pruned = not self.index.pruned, True
        if first:
            prune(self.index.directory)
