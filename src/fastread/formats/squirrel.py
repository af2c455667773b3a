"""Squirrel MessagePack stores as a sample source.

A store written by squirrel-core (``SquirrelStore(url,
serializer=MessagepackSerializer())``) is a directory of shards
``<key>.gz``: each a gzip stream of MessagePack objects written one after
another, one per sample, NumPy arrays encoded by ``msgpack_numpy`` as maps
``{nd: True, type: <dtype str>, kind: b'', shape: [...], data: <bin>}``.
A shard that is not gzip'd (no gzip magic) is read as it is.

Index (once, when the source is built): each shard is decompressed with
zlib into ``cache_dir`` (a plain copy, reused while the shard is
unchanged; the cache is bounded by ``cache_bytes``, see
:mod:`fastread.formats._cache`) and walked by a small MessagePack parser (:func:`walk_sample`,
fuzzed): every sample's byte range, and for each key either the offset,
dtype and shape of its array's raw bytes inside the sample, or its value
when it is not an array (labels). Reading is then one byte range per sample
by the native engine, and each array a zero-copy view of it.

Samples are numbered shard after shard in the order of the store's keys
(sorted) and of their position in the shard; :class:`fastread.Reader`
shuffles over all of them (one permutation per epoch), not shard keys
plus an item buffer as squirrel's streaming iterator does.
"""
import math
import mmap
import os
import struct

import numpy as np

from fastread._safe_open import open_file
from fastread.formats import _cache, _gzip
from fastread.formats._multi import MultiFileRanges
from fastread.formats.cifar import FormatError
from fastread.npy import shape_problem
from fastread.source import FileRanges

__all__ = ["SquirrelStore", "walk_sample", "value_end", "store_shards"]

_FIXED = {0xc0: 0, 0xc2: 0, 0xc3: 0, 0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8,
          0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8, 0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}
_LEN = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}        # bin, str
_EXT = {0xc7: 1, 0xc8: 2, 0xc9: 4}
_CONTAINER = {0xdc: (2, 1), 0xdd: (4, 1), 0xde: (2, 2), 0xdf: (4, 2)}  # array, map
_UINT = {1: ">B", 2: ">H", 4: ">I"}


def _uint(buf, pos, size, end, shard):
    if pos + size > end:
        raise FormatError(shard, pos, "truncated MessagePack object")
    return struct.unpack_from(_UINT[size], buf, pos)[0]


def value_end(buf, pos, end, shard):
    """Where the MessagePack value starting at ``pos`` ends (its nested
    values included), in ``buf[:end]``. FormatError naming the offset for a
    truncated value or the never-used byte 0xc1."""
    remaining = 1
    while remaining:
        if pos >= end:
            raise FormatError(shard, pos, "truncated MessagePack object")
        b = buf[pos]
        remaining -= 1
        pos += 1
        if b <= 0x7f or b >= 0xe0:
            continue
        if 0x80 <= b <= 0x8f:
            remaining += 2 * (b & 0x0f)
        elif 0x90 <= b <= 0x9f:
            remaining += b & 0x0f
        elif 0xa0 <= b <= 0xbf:
            pos += b & 0x1f
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _LEN:
            n = _uint(buf, pos, _LEN[b], end, shard)
            pos += _LEN[b] + n
        elif b in _EXT:
            n = _uint(buf, pos, _EXT[b], end, shard)
            pos += _EXT[b] + 1 + n
        elif b in _CONTAINER:
            size, per = _CONTAINER[b]
            remaining += per * _uint(buf, pos, size, end, shard)
            pos += size
        else:
            raise FormatError(shard, pos - 1, f"byte 0x{b:02x} is not a MessagePack type")
        if remaining > end:  # cannot fit: a corrupt count
            raise FormatError(shard, pos, "truncated MessagePack object")
    if pos > end:
        raise FormatError(shard, end, "truncated MessagePack object")
    return pos


def _map_header(buf, pos, end, shard):
    """(pairs, position after the header) of a map at ``pos``, or None."""
    b = buf[pos]
    if 0x80 <= b <= 0x8f:
        return b & 0x0f, pos + 1
    if b in (0xde, 0xdf):
        size = 2 if b == 0xde else 4
        return _uint(buf, pos + 1, size, end, shard), pos + 1 + size
    return None


def _bin_payload(buf, pos, end, shard):
    """(offset, length) of a bin value's bytes at ``pos``, or None."""
    b = buf[pos]
    if b in (0xc4, 0xc5, 0xc6):
        size = _LEN[b]
        n = _uint(buf, pos + 1, size, end, shard)
        return pos + 1 + size, n
    return None


class _Refused(ValueError):
    """A msgpack_numpy map this reader will not rebuild (see _numpy_hook)."""


def _get(obj, key):
    """``obj[key]`` under its str or its bin spelling (msgpack_numpy writes
    bin keys; other writers str), or None."""
    v = obj.get(key.encode())
    return obj.get(key) if v is None else v


def _safe_dtype(descr, kind):
    """The dtype of a msgpack_numpy map: its ``type`` string for a plain
    array (``kind`` empty) or scalar, a structured description for kind
    ``V``; _Refused for anything holding Python objects."""
    if kind in (b"", "", None):
        if not isinstance(descr, (str, bytes)):
            raise _Refused(f"array type {descr!r} is not a dtype string")
        dtype = np.dtype(descr.decode("latin1") if isinstance(descr, bytes) else descr)
    elif kind in (b"V", "V"):
        dtype = np.dtype([tuple(t.decode("latin1") if isinstance(t, bytes) else t for t in d)
                          for d in descr])
    else:
        # kind 'O' is a pickle (msgpack_numpy calls pickle.loads on it): never run it.
        raise _Refused(f"array of kind {kind!r} (a pickled object array) is refused")
    if dtype.hasobject:
        raise _Refused(f"array type {dtype} holds Python objects, refused")
    if dtype.itemsize == 0:
        # '|V0': no bytes to view as items, whatever the shape says.
        raise _Refused(f"array type {dtype} has items of 0 bytes")
    return dtype


def _numpy_hook(obj):
    """msgpack object_hook: msgpack_numpy's arrays, scalars and complex
    numbers rebuilt from their raw bytes, without its pickle path (a shard
    must not run code when it is indexed; cifar's _SafeUnpickler and npy
    refuse pickles likewise). Other maps are returned as they are."""
    nd, data = _get(obj, "nd"), _get(obj, "data")
    if nd is None:
        if _get(obj, "complex") is True and isinstance(data, (str, bytes)):
            return complex(data.decode("ascii") if isinstance(data, bytes) else data)
        return obj
    kind = _get(obj, "kind")
    if nd is True and kind not in (b"", "", b"V", "V", None):
        _safe_dtype(None, kind)   # refuses: kind 'O' is a pickle
    if type(nd) is not bool or not isinstance(data, bytes) or _get(obj, "type") is None \
            or (nd is True and _get(obj, "shape") is None):
        return obj   # a map of the user's own, as msgpack_numpy leaves it
    dtype = _safe_dtype(_get(obj, "type"), kind)
    if nd is not True:   # a NumPy scalar
        return np.frombuffer(data, dtype, count=1)[0]
    shape = _shape(_get(obj, "shape"))
    if math.prod(shape) * dtype.itemsize != len(data):
        raise _Refused(f"{len(data)} bytes of data for shape {shape} {dtype}")
    return np.frombuffer(data, dtype).reshape(shape)


def _shape(shape):
    """A stored shape as a tuple of non-negative ints, or _Refused."""
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise _Refused(f"bad shape {shape!r}: {e}") from None
    if any(d < 0 for d in shape):
        raise _Refused(f"negative dimension in shape {shape}")
    return shape


def _small(buf, a, b, shard, what):
    """The MessagePack value in ``buf[a:b]`` (arrays as NumPy arrays, see
    _numpy_hook); FormatError naming the shard and offset otherwise."""
    import msgpack

    try:
        return msgpack.unpackb(bytes(buf[a:b]), object_hook=_numpy_hook, raw=False,
                               use_list=False, strict_map_key=False)
    except _Refused as e:
        raise FormatError(shard, a, f"{what}: {e}") from None
    except Exception as e:  # msgpack raises several kinds for corrupt input
        raise FormatError(shard, a, f"{what} cannot be decoded: {type(e).__name__}: {e}") from None


def walk_sample(buf, pos, end, shard):
    """One sample (a MessagePack map) at ``pos``: ``(end, fields)`` where
    fields maps each key to ``("array", data offset, nbytes, dtype, shape)``
    for a msgpack_numpy array, or ``("value", python value)``."""
    header = _map_header(buf, pos, end, shard) if pos < end else None
    if header is None:
        raise FormatError(shard, pos, "a sample is not a MessagePack map")
    pairs, p = header
    fields = {}
    for _ in range(pairs):
        k_end = value_end(buf, p, end, shard)
        key = _small(buf, p, k_end, shard, "a key")
        if isinstance(key, bytes):
            key = key.decode("utf-8", "surrogateescape")
        v_end = value_end(buf, k_end, end, shard)
        fields[str(key)] = _field(buf, k_end, v_end, shard, key)
        p = v_end
    return p, fields


def _field(buf, pos, end, shard, key):
    header = _map_header(buf, pos, end, shard)
    if header is not None:
        pairs, p = header
        meta, data = {}, None
        for _ in range(pairs):
            k_end = value_end(buf, p, end, shard)
            k = _small(buf, p, k_end, shard, f"a key of {key!r}")
            k = k.decode("latin1") if isinstance(k, bytes) else k
            if not isinstance(k, (str, int, float)):   # a map or list key: not a field name
                raise FormatError(shard, p, f"a key of {key!r} is a {type(k).__name__}")
            v_end = value_end(buf, k_end, end, shard)
            if k == "data" and _bin_payload(buf, k_end, end, shard) is not None:
                data = _bin_payload(buf, k_end, end, shard)
            else:
                meta[k] = _small(buf, k_end, v_end, shard, f"{key!r}.{k}")
            p = v_end
        if meta.get("nd") is True and data is not None and meta.get("kind", b"") in (b"", ""):
            try:
                dtype = _safe_dtype(meta.get("type"), "")
                shape = _shape(meta.get("shape"))
            except (TypeError, ValueError) as e:   # _Refused included
                raise FormatError(shard, pos, f"array {key!r}: bad type or shape: {e}") from None
            if math.prod(shape) * dtype.itemsize != data[1]:
                raise FormatError(shard, pos, f"array {key!r}: {data[1]} bytes of data for "
                                              f"shape {shape} {dtype}")
            why = shape_problem(shape, dtype)
            if why is not None:   # fields() could not view the bytes so
                raise FormatError(shard, pos, f"array {key!r}: shape {shape} {dtype}: {why}")
            return ("array", data[0], data[1], dtype, shape)
    return ("value", _small(buf, pos, end, shard, f"value of {key!r}"))


def store_shards(url):
    """The shard files of a squirrel store directory, in sorted key order."""
    url = os.fspath(url)
    if not os.path.isdir(url):
        raise FileNotFoundError(f"squirrel store {url!r} is not a directory")
    shards = sorted(os.path.join(url, n) for n in os.listdir(url) if n.endswith(".gz"))
    if not shards:
        raise FileNotFoundError(f"squirrel store {url!r} has no *.gz shards")
    return shards


class _MapFirst:
    """What a Squirrel shard can need, checked while it is inflated (the
    ``bound`` of :func:`fastread.formats._gzip.gunzip_to`): its first byte
    starts a MessagePack map (a shard is a run of them, one per sample), so
    a stream of zeros or junk fails in its first step; the samples
    themselves are walk_sample's to check."""

    def __init__(self, shard):
        self.shard, self.checked = shard, False

    def feed(self, data):
        if not self.checked and data:
            self.checked = True
            if not (0x80 <= data[0] <= 0x8f or data[0] in (0xde, 0xdf)):   # as _map_header
                raise FormatError(self.shard, 0, f"the inflated shard starts with byte "
                                  f"0x{data[0]:02x}, not a MessagePack map (a sample)")


def _plain(path, cache_dir, limit):
    with open_file(path) as f:
        magic = f.read(2)
    if magic != b"\x1f\x8b":
        return path
    return _cache.cached_copy(path, cache_dir, ".msgpack", lambda p, dest: _gzip.gunzip_to(
        p, dest, limit=limit, bound=_MapFirst(p)))


class _Shard(FileRanges):
    def __init__(self, shard, plain, offsets, lengths):
        super().__init__(plain, offsets, lengths)
        self.shard = shard

    def sample_name(self, i):
        return f"{self.shard}[{self.names[i]}]"


def _reference_walk(m, size, path, keys):
    """(starts, lengths, per-sample field rows) of one inflated shard by
    the Python reference (walk_sample); FormatError for a bad shard."""
    starts, ends, rows = [], [], []
    pos = 0
    while pos < size:
        end, fields = walk_sample(m, pos, size, path)
        row = []
        for k in keys:
            if k not in fields:
                raise FormatError(path, pos, f"sample {len(starts)} has no "
                                  f"key {k!r} (it has {sorted(fields)})")
            fld = fields[k]
            row.append(("array", fld[1] - pos, fld[2], fld[3], fld[4])
                       if fld[0] == "array" else fld)
        rows.append(tuple(row))
        starts.append(pos)
        ends.append(end)
        pos = end
    starts = np.array(starts, np.int64)
    return starts, np.array(ends, np.int64) - starts, rows


def _native_walk(m, path, keys, seen=None):
    """What _reference_walk gives, from the C walk (fr_sq_walk): the shard's
    structure walked in C, and each wanted field decoded by the reference
    (:func:`_field`) once per distinct layout: an array field's bytes but
    its payload (type, shape, the payload's length) or a plain value's
    bytes (labels), so a store of one image shape and 1,000 labels decodes
    ~1,000 fields. ``seen``: the layouts decoded so far (shared by a
    store's shards). None where the walk leaves the shard to the reference
    (which words the error, if any)."""
    from fastread import _formats

    try:
        cols = _formats.squirrel_walk(m, keys)
    except ValueError:
        return None
    seen = {} if seen is None else seen
    start = cols["start"].astype(np.int64)
    per_key = []
    for j, key in enumerate(keys):
        fa = (cols["fa"][:, j] + start).tolist()
        fb = (cols["fb"][:, j] + start).tolist()
        doff = cols["data_off"][:, j]
        d = np.where(doff < 0, -1, doff + start).tolist()
        e = (np.where(doff < 0, -1, doff + start) + cols["data_len"][:, j]).tolist()
        # A layout: the field's bytes, its array payload (if any) left out.
        layouts = [(key, m[x:w]) if y < 0 else (key, m[x:y], m[z:w])
                   for x, y, z, w in zip(fa, d, e, fb)]
        out = []
        for i, lay in enumerate(layouts):
            got = seen.get(lay)
            if got is None:
                fld = _field(m, fa[i], fb[i], path, key)
                # An array's place depends on the sample; its meaning on the layout.
                got = seen[lay] = (fld if fld[0] != "array" else
                                   ("array", fld[1] - fa[i], fld[2], fld[3], fld[4]))
            out.append(got)
        per_key.append([got if got[0] != "array" else
                        ("array", got[1] + x - st, got[2], got[3], got[4])
                        for got, x, st in zip(out, fa, start.tolist())])
    return start, cols["length"].astype(np.int64), list(zip(*per_key))


class SquirrelStore(MultiFileRanges):
    """The samples of a squirrel MessagePack store ``url`` (a directory of
    ``*.gz`` shards; or ``shards=`` paths), with the fields ``keys``. Each
    key is an array in every sample (given as a view of the sample's bytes,
    dtype and shape as stored) or a plain value (given from the index).
    A sample lacking a key is a FormatError naming the shard and offset;
    an empty shard has no samples. ``labels`` are the samples' numbers.
    ``cache_dir``, ``cache_bytes`` and ``max_inflated`` are WebDataset's
    (decompressed copies under ``.../squirrel``). ``indexer``: ``"native"``
    (the C walk, :func:`_native_walk`; a shard it leaves is redone by the
    reference) or ``"python"`` (the reference, :func:`walk_sample`).
    """

    def __init__(self, url=None, keys=("image", "label"), shards=None, cache_dir=None,
                 cache_bytes=None, max_inflated=None, indexer="native"):
        self.url = url
        self.shard_paths = [os.fspath(s) for s in shards] if shards is not None \
            else store_shards(url)
        if isinstance(keys, str):
            keys = (keys,)
        self.keys = tuple(keys)
        if not self.keys:
            raise ValueError("keys must name at least one field")
        self.cache_dir = cache_dir = _cache.cache_dir_for("squirrel", cache_dir)
        limit = _cache.cache_bytes(cache_bytes)
        inflated = _gzip.max_inflated(max_inflated)
        if indexer not in ("native", "python"):
            raise ValueError(f"indexer must be 'native' or 'python', got {indexer!r}")
        self.indexer = indexer
        parts = []
        self._fields = []   # per sample: tuple per key
        seen = {}           # field layouts decoded (_native_walk)
        for path in self.shard_paths:
            plain = _plain(path, cache_dir, inflated)
            with open_file(plain) as f:
                size = os.fstat(f.fileno()).st_size
                if not size:
                    starts, lengths = np.zeros(0, np.int64), np.zeros(0, np.int64)
                else:
                    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                        got = (_native_walk(m, path, self.keys, seen) if indexer == "native"
                               else None)
                        if got is None:
                            got = _reference_walk(m, size, path, self.keys)
                        starts, lengths, rows = got
                        self._fields.extend(rows)
            parts.append(_Shard(path, plain, starts, lengths))
        if any(p.path != p.shard for p in parts):
            _cache.prune(cache_dir, limit, keep=[p.path for p in parts])
        super().__init__(parts)
        self.labels = np.arange(len(self), dtype=np.int32)

    def __repr__(self):
        return f"SquirrelStore({self.url!r}, {len(self.shard_paths)} shards, {len(self)} samples)"

    def fields(self, arrays, indices):
        """The batch's samples cut into fields: one list per key, arrays as
        zero-copy views (dtype and shape as stored), values as NumPy
        arrays."""
        outs = [[] for _ in self.keys]
        table = self._fields
        for a, i in zip(arrays, indices.tolist() if hasattr(indices, "tolist") else indices):
            for out, fld in zip(outs, table[i]):
                if fld[0] == "array":
                    _, rel, n, dtype, shape = fld
                    out.append(a[rel:rel + n].view(dtype).reshape(shape))
                else:
                    out.append(np.asarray(fld[1]))
        return outs
