"""WebDataset indexes as columns, and the files that keep them.

:class:`WdsIndex` is a set of shards' samples as columns (no object per
sample): per sample its byte range in its shard (``start``, ``length``),
per wanted component its offset from the start (-1: missing) and length
(``comp_off``, ``comp_len``, int32/uint32 where they fit; ``length``
uint32 where every sample is below 4 GiB), the keys as one
blob with offsets, and per shard its sample count and identity (size and
mtime_ns of the shard file as given; an index whose shard changed is
*stale*: never read).

Two file formats:

``fastread`` (``.fridx``): fastread's own, memory-mappable. A 64-byte
preamble (magic ``FRIDX\\0v1``, the JSON header's length and CRC-32), a JSON
header (the spec it was built for: ``ext``, ``case_sensitive``,
``grouping``, ``missing``; the shards with their identity and counts; each
column's dtype, shape and offset), then the columns, each 64-byte aligned.
:func:`open_fridx` maps the file and makes every column an
``np.frombuffer`` view of the map: opening reads the header only, the
columns' pages are read when used (a 10^8-sample index opens in the time
of its header). One file may hold one shard (``shard.tar.fridx``, beside
it) or a whole set (the cache's entries, ``fastread index --combined``).

``wds2idx`` (DALI's, as its ``wds2idx`` tool writes it and
``fn.readers.webdataset(index_paths=)`` reads it): a first line
``v1.2 <samples>`` (or ``v1.1``), then one line per sample with, per
component, ``<ext> <data offset> <size>`` (v1.1) or ``<ext> <data offset>
<size> <member name>`` (v1.2). It carries no shard identity: when read,
every component is checked to lie inside the shard and a few members'
tar headers are checked (checksum and size) where the index places them,
so a rewritten shard is refused rather than read wrong. Read, its members
are grouped by the reader's spec like a tar's
(:func:`fastread._formats.group_members`).
"""
import hashlib
import json
import mmap
import os
import re
import time
import zlib

import numpy as np

from fastread import _defaults
from fastread.formats.cifar import FormatError

__all__ = ["WdsIndex", "StaleIndexError", "open_fridx", "read_wds2idx", "write_wds2idx",
           "identity", "cache_path", "write_fridx", "load_index_paths", "beside_index", "beside_paths", "FRIDX_MAGIC", "FRIDX_SUFFIX", "WDS2IDX_SUFFIX"]

FRIDX_MAGIC = b"FRIDX\0v1"
FRIDX_SUFFIX = ".fridx"
WDS2IDX_SUFFIX = ".idx"
_PREAMBLE = 64
#: An index of a shard modified less than this long before is not cached
#: (its identity could repeat after a rewrite within the timestamp granularity).
RACY_NS = 2_000_000_000
_ALIGN = 64


_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")


def split_name(name):
    """``(key, extension)`` of a member name as webdataset splits it
    (``a/b.c.d`` -> ``('a/b', 'c.d')``), or None for a name with no
    extension."""
    m = _KEY_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


class StaleIndexError(FormatError):
    """An index file that does not describe its shard as the shard is now
    (rewritten since, or built for another spec)."""


def identity(path):
    """(size, mtime_ns) of a shard file: what an index of it records."""
    st = os.stat(path)
    return int(st.st_size), int(st.st_mtime_ns)


#: Component offsets kept in tar blocks (uint16, BLOCK_MISSING: missing)
#: where every one is a multiple of the block (a tar's always are) and
#: below 32 MiB: 2 bytes a component instead of 4.
BLOCK = 512
BLOCK_MISSING = 0xFFFF


def _narrow_offsets(a):
    """(column, unit) of component offsets ``a`` (bytes from the sample's
    start, -1: missing): uint16 tar blocks (unit 512) where they fit, else
    int32 / int64 bytes (unit 1)."""
    a = np.asarray(a)
    if not a.size:
        return a.astype(np.uint16), BLOCK
    present = a >= 0
    if ((a >= -1).all() and not (a[present] % BLOCK).any()
            and int(a.max()) // BLOCK < BLOCK_MISSING):
        out = (a // BLOCK).astype(np.uint16)
        out[~present] = BLOCK_MISSING
        return out, BLOCK
    return _narrow(a, "i"), 1


def _narrow_lengths(a):
    """Sample lengths ``a`` as uint32 where every one fits (version 3:
    4 B a sample, what the native table reader reads in place,
    fr_reader_open_table32), else int64."""
    a = np.asarray(a)
    if not a.size or (int(a.min()) >= 0 and int(a.max()) < 2 ** 32):
        return a.astype(np.uint32)
    return a.astype(np.int64)


#: The .fridx versions read: 1 (comp_off in bytes), 2 (comp_off in tar
#: blocks, comp_unit), 3 (the length column uint32 where it fits); the
#: writer writes 3.
FRIDX_VERSIONS = (1, 2, 3)
FRIDX_VERSION = 3


def _narrow(a, kind):
    """``a`` as int32 / uint32 where its values fit (the index's RAM)."""
    a = np.asarray(a)
    if not a.size:
        return a.astype(np.int32 if kind == "i" else np.uint32)
    if kind == "i" and a.min() >= -1 and a.max() < 2 ** 31:
        return a.astype(np.int32)
    if kind == "u" and a.max() < 2 ** 32:
        return a.astype(np.uint32)
    return a.astype(np.int64 if kind == "i" else np.uint64)


class WdsIndex:
    """Samples of a set of shards as columns (see the module's
    documentation). ``shards``: one dict per shard, ``path`` (as given),
    ``size``, ``mtime_ns``; ``counts``: samples per shard (int64)."""

    def __init__(self, spec, shards, counts, start, length, comp_off, comp_len, keys=None,
                 key_off=None, skipped=0, source=None, keep=None, file_ids=None, labels=None,
                 comp_unit=1):
        self.spec = dict(spec)
        self.shards = list(shards)
        self.counts = np.asarray(counts, np.int64)
        self.start, self.length = start, length
        # comp_off as kept: bytes (comp_unit 1, -1 missing) or tar blocks
        # (comp_unit BLOCK, uint16, BLOCK_MISSING missing); comp_offsets()
        # gives bytes.
        self.comp_off, self.comp_len = comp_off, comp_len
        self.comp_unit = int(comp_unit)
        self.keys, self.key_off = keys, key_off
        self.skipped = int(skipped)
        self.source = source      # the file it came from, if any
        self._keep = keep         # the mmap its columns view
        # The samples' shard numbers and labels (their numbers): columns of
        # a .fridx file (mapped: a 10^8-sample index opens without making
        # 800 MB of them), else made on first use.
        self._file_ids, self._labels = file_ids, labels

    def __len__(self):
        return len(self.start)

    def comp_offsets(self, rows=None):
        """Component offsets in bytes from each sample's start (int64, -1:
        missing), of every sample or of ``rows``."""
        raw = self.comp_off if rows is None else self.comp_off[rows]
        out = raw.astype(np.int64)
        if self.comp_unit != 1:
            missing = raw == BLOCK_MISSING
            out *= self.comp_unit
            out[missing] = -1
        return out

    @property
    def file_ids(self):
        """Each sample's shard number (uint32): the native reader's file column."""
        if self._file_ids is None:
            if len(self.shards) > 1 << 32:
                raise ValueError(f"an index of {len(self.shards)} shards: at most 2**32")
            self._file_ids = np.repeat(np.arange(len(self.shards), dtype=np.uint32),
                                       self.counts)
        return self._file_ids

    @property
    def labels(self):
        """Each sample's label: its number (int32)."""
        if self._labels is None:
            self._labels = np.arange(len(self), dtype=np.int32)
            self._labels.setflags(write=False)   # shared with readers, not copied
        return self._labels

    @property
    def nbytes(self):
        """Bytes of its columns (mapped ones included: what they can take in RAM)."""
        cols = [self.start, self.length, self.comp_off, self.comp_len, self.counts]
        cols += [c for c in (self.key_off, self._file_ids, self._labels) if c is not None]
        return sum(int(c.nbytes) for c in cols) + (len(self.keys) if self.keys is not None else 0)

    def bytes_per_sample(self):
        """Bytes a sample of its per-sample columns (keys and their offsets
        aside: names are counted apart), as :meth:`nbytes` counts them."""
        k = self.comp_off.shape[1] if self.comp_off.ndim == 2 else 0
        return (self.start.itemsize + self.length.itemsize + 4 + 4
                + k * (self.comp_off.itemsize + self.comp_len.itemsize))

    @classmethod
    def from_parts(cls, spec, shards, parts):
        """One index from per-shard column dicts (``start``, ``length``,
        ``comp_off``, ``comp_len``, ``keys``/``key_off`` or absent,
        ``skipped``) in shard order."""
        k = len(spec["ext"])
        counts = np.array([len(p["start"]) for p in parts], np.int64)
        cat = (lambda name, dt, shape: np.concatenate([np.asarray(p[name]) for p in parts])
               if parts else np.zeros(shape, dt))
        start = cat("start", np.int64, 0).astype(np.int64, copy=False)
        length = _narrow_lengths(cat("length", np.int64, 0))
        comp_off, unit = _narrow_offsets(cat("comp_off", np.int64, (0, k)).reshape(-1, k))
        comp_len = _narrow(cat("comp_len", np.uint64, (0, k)).reshape(-1, k), "u")
        keys = key_off = None
        if parts and all(p.get("keys") is not None for p in parts):
            keys = b"".join(bytes(p["keys"]) for p in parts)
            offs, base = [np.zeros(1, np.uint64)], 0
            for p in parts:
                ko = np.asarray(p["key_off"], np.uint64)
                offs.append(ko[1:] + np.uint64(base))
                base += len(p["keys"])
            key_off = np.concatenate(offs)
        skipped = sum(int(p.get("skipped", 0)) for p in parts)
        return cls(spec, shards, counts, start, length, comp_off, comp_len, keys, key_off,
                   skipped, comp_unit=unit)

    def shard_bounds(self):
        """(first, end) sample numbers of every shard."""
        ends = np.cumsum(self.counts)
        return np.r_[0, ends[:-1]].astype(np.int64), ends.astype(np.int64)

    def key(self, i):
        """Sample ``i``'s key (str), or its number where keys were not kept."""
        if self.key_off is None:
            return str(i)
        a, b = int(self.key_off[i]), int(self.key_off[i + 1])
        return bytes(self.keys[a:b]).decode("utf-8", "surrogateescape")

    def select(self, first, end):
        """Shards ``first..end-1`` as an index of their own (views)."""
        bounds = self.shard_bounds()
        a = int(bounds[0][first]) if first < len(self.shards) else len(self)
        b = int(bounds[1][end - 1]) if end > first else a
        key_off = keys = None
        if self.key_off is not None:
            base = int(self.key_off[a])
            keys = self.keys[base:int(self.key_off[b])]
            key_off = self.key_off[a:b + 1] - np.uint64(base)
        # The shard numbers restart at 0 in the selection: made anew when used.
        return WdsIndex(self.spec, self.shards[first:end], self.counts[first:end],
                        self.start[a:b], self.length[a:b], self.comp_off[a:b],
                        self.comp_len[a:b], keys, key_off, 0, self.source, self._keep,
                        labels=None, comp_unit=self.comp_unit)

    # -- checks ---------------------------------------------------------------------

    def check_spec(self, spec, where):
        """Raises StaleIndexError if this index was built for another spec."""
        mine = {k: self.spec.get(k) for k in spec}
        if mine != dict(spec):
            raise StaleIndexError(where, 0, f"index built for {mine}, the reader asks for "
                                            f"{dict(spec)}: rebuild it (fastread index)")

    def check_fresh(self, paths, where):
        """Raises StaleIndexError naming the first shard of ``paths`` (one per
        shard of this index) whose size or mtime is not what was indexed."""
        if len(paths) != len(self.shards):
            raise StaleIndexError(where, 0, f"index of {len(self.shards)} shards given for "
                                            f"{len(paths)} shards")
        for path, rec in zip(paths, self.shards):
            size, mtime = identity(path)
            if size != rec["size"] or mtime != rec["mtime_ns"]:
                raise StaleIndexError(
                    where, 0, f"stale index: shard {path!r} is {size} bytes, mtime_ns {mtime}; "
                              f"the index was built when it was {rec['size']} bytes, mtime_ns "
                              f"{rec['mtime_ns']} (rewritten since?): rebuild it "
                              "(fastread index)")

    # -- the fastread format ------------------------------------------------------

    def write(self, path):
        """Writes this index as a ``.fridx`` file, atomically (a temporary
        file renamed into place: readers see the old file or the new one)."""
        cols = [("start", np.ascontiguousarray(self.start, "<i8")),
                ("length", np.ascontiguousarray(
                    self.length, "<u4" if self.length.dtype == np.uint32 else "<i8")),
                ("comp_off", np.ascontiguousarray(self.comp_off, self.comp_off.dtype.newbyteorder("<"))),
                ("comp_len", np.ascontiguousarray(self.comp_len, self.comp_len.dtype.newbyteorder("<"))),
                ("counts", np.ascontiguousarray(self.counts, "<i8")),
                ("file_ids", np.ascontiguousarray(self.file_ids, "<u4")),
                ("labels", np.ascontiguousarray(self.labels, "<i4"))]
        if self.key_off is not None:
            cols.append(("key_off", np.ascontiguousarray(self.key_off, "<u8")))
            cols.append(("keys", np.frombuffer(bytes(self.keys), np.uint8)))
        header = {"spec": self.spec, "shards": self.shards, "samples": len(self),
                  "skipped": self.skipped, "comp_unit": self.comp_unit}
        arrays = dict(cols)
        write_fridx(path, header, [(name, arr.dtype.str, arr.shape) for name, arr in cols],
                    lambda name, out: out.__setitem__(Ellipsis, arrays[name]))


def write_fridx(path, header, columns, fill):
    """Writes a ``.fridx`` file of ``header`` (spec, shards, samples,
    skipped, comp_unit) and ``columns`` ``[(name, dtype str, shape)]``,
    each filled in place by ``fill(name, view)`` (a writable map of the
    column in the file: a column need not be held in RAM, e.g. a 10^8-sample
    synthetic index written in chunks). Atomic: a temporary file renamed
    into place (readers see the old file or the new one)."""
    # Version 2: comp_off may be in tar blocks (comp_unit); version 3: the
    # length column may be uint32. An older reader refuses the file rather
    # than read blocks as bytes or 4-byte lengths as 8-byte ones.
    header = {"format": "fastread-webdataset-index", "version": FRIDX_VERSION, **header,
              "columns": {}}
    sizes = {name: np.dtype(dt).itemsize * int(np.prod(shape)) for name, dt, shape in columns}
    # Offsets depend on the header's length, which depends on them: lay
    # out with room for the offsets' digits, then fix.
    for _ in range(3):
        blob = json.dumps(header, separators=(",", ":")).encode()
        at = _round(_PREAMBLE + len(blob) + 64)
        placed = {}
        for name, dt, shape in columns:
            placed[name] = {"dtype": dt, "shape": list(shape), "offset": at}
            at = _round(at + sizes[name])
        if placed == header["columns"]:
            break
        header["columns"] = placed
    blob = json.dumps(header, separators=(",", ":")).encode()
    first = min((c["offset"] for c in header["columns"].values()), default=at)
    if first < _PREAMBLE + len(blob):
        raise AssertionError("fridx layout")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb+") as f:
            pre = FRIDX_MAGIC + np.array([len(blob), zlib.crc32(blob)], "<u8").tobytes()
            f.write(pre.ljust(_PREAMBLE, b"\0"))
            f.write(blob)
            f.truncate(max(at, _PREAMBLE + len(blob)))
            if any(sizes.values()):
                with mmap.mmap(f.fileno(), 0) as m:
                    for name, dt, shape in columns:
                        if sizes[name]:
                            view = np.frombuffer(m, np.dtype(dt), int(np.prod(shape)),
                                                 header["columns"][name]["offset"])
                            fill(name, view.reshape(shape))
                            del view
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _round(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def is_fridx(path):
    try:
        with open(path, "rb") as f:
            return f.read(len(FRIDX_MAGIC)) == FRIDX_MAGIC
    except OSError:
        return False


def open_fridx(path):
    """The :class:`WdsIndex` of a ``.fridx`` file, its columns views of the
    file mapped read-only (nothing but the header read). Raises FormatError
    naming the file for anything that is not a well-formed index."""
    from fastread._safe_open import open_file

    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size < _PREAMBLE:
            raise FormatError(path, 0, f"not a fastread index file ({size} bytes)")
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    # A shuffled epoch touches the columns at random: no read-ahead around
    # every sample's page (a batch of 256 would map megabytes of neighbours).
    if hasattr(mmap, "MADV_RANDOM"):
        m.madvise(mmap.MADV_RANDOM)
    cols = {}
    try:
        if m[:len(FRIDX_MAGIC)] != FRIDX_MAGIC:
            raise FormatError(path, 0, "not a fastread index file (bad magic)")
        hlen, crc = np.frombuffer(m, "<u8", 2, len(FRIDX_MAGIC)).tolist()
        if hlen > size - _PREAMBLE:
            raise FormatError(path, 8, f"header of {hlen} bytes in a {size}-byte file: truncated")
        blob = m[_PREAMBLE:_PREAMBLE + hlen]
        if zlib.crc32(blob) != crc:
            raise FormatError(path, _PREAMBLE, "header checksum mismatch (corrupt index file)")
        try:
            header = json.loads(blob)
            version = header.get("version")
            if version not in FRIDX_VERSIONS or \
                    header.get("format") != "fastread-webdataset-index":
                raise FormatError(path, _PREAMBLE, f"unsupported index version {version!r} "
                                                   f"(versions {', '.join(map(str, FRIDX_VERSIONS))}"
                                                   " are read): rebuild it (fastread index)")
            for name, c in header["columns"].items():
                dt = np.dtype(c["dtype"])
                shape = tuple(int(x) for x in c["shape"])
                count = int(np.prod(shape)) if shape else 1
                off = int(c["offset"])
                if off < _PREAMBLE + hlen or off + count * dt.itemsize > size:
                    raise FormatError(path, off, f"column {name!r} runs past the end of the "
                                                 f"file ({size} bytes): truncated")
                cols[name] = np.frombuffer(m, dt, count, off).reshape(shape)
            spec, shards = header["spec"], header["shards"]
            unit = int(header.get("comp_unit", 1))
            if unit not in (1, BLOCK) or (unit == BLOCK and
                                          np.dtype(header["columns"]["comp_off"]["dtype"])
                                          != np.dtype("<u2")):
                raise FormatError(path, _PREAMBLE, f"comp_unit {unit} with a "
                                                   f"{header['columns']['comp_off']['dtype']} "
                                                   "comp_off column")
            n, k = int(header["samples"]), len(spec["ext"])
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, FormatError):
                raise
            raise FormatError(path, _PREAMBLE, f"malformed index header ({e})") from None
        for name, shape in (("start", (n,)), ("length", (n,)), ("comp_off", (n, k)),
                            ("comp_len", (n, k)), ("counts", (len(shards),))):
            if name not in cols or cols[name].shape != shape:
                raise FormatError(path, _PREAMBLE, f"column {name!r} missing or not of shape "
                                                   f"{shape}")
        # start int64 in every version; length int64, or (version 3) uint32.
        lengths_ok = ("<i8", "<u4") if version >= 3 else ("<i8",)
        for name, dts in (("start", ("<i8",)), ("length", lengths_ok)):
            if cols[name].dtype.str not in dts:
                raise FormatError(path, _PREAMBLE, f"column {name!r} of dtype "
                                                   f"{cols[name].dtype.str} in a version-"
                                                   f"{version} index (read: {', '.join(dts)})")
        if int(cols["counts"].sum()) != n:
            raise FormatError(path, _PREAMBLE, "shard sample counts do not add up to the "
                                               "samples")
        key_off = cols.get("key_off")
        if key_off is not None and key_off.shape != (n + 1,):
            raise FormatError(path, _PREAMBLE, "column 'key_off' not of one entry per sample "
                                               "+ 1")
        # file_ids and labels: optional (files written before they were kept
        # have them made on first use); their values are not read here (a
        # 10^8-sample index opens without paging 800 MB in): the native
        # reader refuses a shard number past the shards (-EINVAL, that
        # sample's error), and labels are the user's.
        for name, dts in (("file_ids", ("<u4",)), ("labels", ("<i4",))):
            c = cols.get(name)
            if c is not None and (c.shape != (n,) or c.dtype.str not in dts):
                raise FormatError(path, _PREAMBLE, f"column {name!r} not of one {dts[0]} "
                                                   "entry per sample")
        return WdsIndex(spec, shards, cols["counts"], cols["start"], cols["length"],
                        cols["comp_off"], cols["comp_len"], cols.get("keys"), key_off,
                        header.get("skipped", 0), source=path, keep=m,
                        file_ids=cols.get("file_ids"), labels=cols.get("labels"),
                        comp_unit=unit)
    except BaseException:
        cols.clear()   # the views go first, or the map cannot close
        try:
            m.close()
        except BufferError:
            pass       # a view still held by a traceback: closed when it goes
        raise


# -- DALI's wds2idx ------------------------------------------------------------------

def read_wds2idx(path, shard, parser="native"):
    """The tar members a DALI wds2idx index lists for ``shard``:
    ``(names, name_off, data_off, sizes)`` as
    :func:`fastread._formats.group_members` takes them, checked against
    the shard (:func:`_check_members`). Parsed in C
    (``fr_wds2idx_parse``) unless ``parser="python"`` (the reference the
    tests compare it with). Raises FormatError naming the index file and
    its line for anything malformed."""
    from fastread._safe_open import open_file

    with open_file(path) as f:
        text = f.read()
    if parser == "native":
        from fastread import _formats

        try:
            names, name_off, data_off, sz = _formats.parse_wds2idx(text)
        except ValueError as e:
            line, msg = e.args
            raise FormatError(path, None, msg) from None
    else:
        names, name_off, data_off, sz = _parse_wds2idx_python(path, text)
    _check_members(path, shard, data_off, sz)
    return names, name_off, data_off, sz


def _parse_wds2idx_python(path, text):
    """The reference parse of a wds2idx index's text (``read_wds2idx``'s
    ``parser="python"``); line numbers count the lines as they are in the
    file, blank ones included."""
    lines = text.split(b"\n")
    head = lines[0].split()
    if len(head) != 2 or head[0] not in (b"v1.1", b"v1.2"):
        raise FormatError(path, None, f"line 1: not a DALI wds2idx index (first line "
                                      f"{lines[0][:40]!r}; versions v1.1 and v1.2 are read)")
    per = 4 if head[0] == b"v1.2" else 3
    try:
        count = int(head[1])
    except ValueError:
        raise FormatError(path, None, f"line 1: sample count {head[1][:20]!r} is not a "
                                      "number") from None
    body = [(no, ln) for no, ln in enumerate(lines[1:], 2) if ln.strip()]
    if len(body) != count:
        raise FormatError(path, None, f"line 1: the first line says {count} samples, the "
                                      f"file has {len(body)}")
    names, offs, sizes = [], [], []
    for i, (no, ln) in enumerate(body):
        fields = ln.split()
        if not fields or len(fields) % per:
            raise FormatError(path, None, f"line {no}: {len(fields)} fields, not groups of "
                                          f"{per} ({'ext offset size name' if per == 4 else 'ext offset size'})")
        for j in range(0, len(fields), per):
            ext = fields[j]
            try:
                off, size = int(fields[j + 1]), int(fields[j + 2])
            except ValueError:
                raise FormatError(path, None, f"line {no}: offset/size not numbers") from None
            if off < 0 or size < 0:
                raise FormatError(path, None, f"line {no}: negative offset or size")
            # v1.2 names the member; v1.1 only its extension: the line is the key.
            names.append(fields[j + 3] if per == 4 else b"%d.%s" % (i, ext))
            offs.append(off)
            sizes.append(size)
    name_off = np.zeros(len(names) + 1, np.uint64)
    if names:
        name_off[1:] = np.cumsum([len(x) for x in names])
    return b"".join(names), name_off, np.array(offs, np.uint64), np.array(sizes, np.uint64)


def _check_members(index, shard, data_off, sizes, probes=8):
    """A wds2idx index has no shard identity: every member must lie inside
    the shard, and a few members' tar headers (first, last, spread between)
    must be where the index puts them, with the size it gives."""
    from fastread._safe_open import open_file

    with open_file(shard) as f:
        size = os.fstat(f.fileno()).st_size
        if len(data_off) == 0:
            return
        ends = data_off + sizes
        if int(ends.max()) > size or int(data_off.min()) < 512:
            i = int(np.argmax(ends > size)) if int(ends.max()) > size else int(data_off.argmin())
            raise StaleIndexError(index, 0, f"stale or foreign index: member {i} at "
                                            f"{int(data_off[i])} (+{int(sizes[i])}) is not inside "
                                            f"shard {shard!r} ({size} bytes)")
        picks = np.unique(np.linspace(0, len(data_off) - 1, min(probes, len(data_off))).astype(int))
        for i in picks.tolist():
            h = os.pread(f.fileno(), 512, int(data_off[i]) - 512)
            ok = len(h) == 512
            if ok:
                try:
                    stored = int(h[148:156].split(b"\0", 1)[0].strip(b" \0") or b"0", 8)
                    declared = int(h[124:136].split(b"\0", 1)[0].strip(b" \0") or b"0", 8) \
                        if not h[124] & 0x80 else int.from_bytes(h[125:136], "big")
                except ValueError:
                    ok = False
                else:
                    ok = (stored == sum(h[:148]) + 256 + sum(h[156:]) and
                          (declared == int(sizes[i]) or declared == 0))
            if not ok:
                raise StaleIndexError(index, 0, f"stale or foreign index: no tar header of a "
                                                f"{int(sizes[i])}-byte member before byte "
                                                f"{int(data_off[i])} of shard {shard!r} "
                                                "(rewritten since the index was made?)")


def write_wds2idx(path, names, name_off, data_off, sizes):
    """Writes DALI's wds2idx index of one shard from its tar members (as
    :func:`fastread._formats.walk_tar` gives them): members grouped into
    samples by key as DALI's tool does (consecutive members sharing the
    name up to the first dot of the base name; names with no such key
    left out), v1.2 (v1.1 where a name has white space, which v1.2 cannot
    hold). Atomic (written to a temporary file, renamed)."""
    samples, last = [], None
    no = np.asarray(name_off).tolist()
    offs, szs = np.asarray(data_off).tolist(), np.asarray(sizes).tolist()
    spaced = False
    for i in range(len(offs)):
        name = names[no[i]:no[i + 1]].decode("utf-8", "surrogateescape")
        parts = split_name(name)
        if parts is None or not parts[1]:
            continue
        spaced |= any(c.isspace() for c in name)
        if parts[0] != last:
            samples.append([])
            last = parts[0]
        samples[-1].append((parts[1], offs[i], szs[i], name))
    if not samples:
        raise FormatError(path, 0, "no samples to index (DALI refuses an empty index)")
    v12 = not spaced and not any(c.isspace() for s in samples for e, *_ in s for c in e)
    out = [f"{'v1.2' if v12 else 'v1.1'} {len(samples)}"]
    for s in samples:
        out.append(" ".join(f"{e} {o} {n} {nm}" if v12 else f"{e} {o} {n}"
                            for e, o, n, nm in s))
    data = ("\n".join(out) + "\n").encode("utf-8", "surrogateescape")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# -- the node-local cache --------------------------------------------------------

def cache_dir(option=None):
    """The index cache's directory: ``option``, else
    ``$FASTREAD_INDEX_CACHE_DIR``, else ``~/.cache/fastread/index``; None
    for ``"off"`` / False (no cache)."""
    d = option if option is not None else _defaults.get("index_cache_dir")
    if d is False or (isinstance(d, str) and d.lower() in ("off", "none", "0")):
        return None
    if not d:
        base = os.environ.get("FASTREAD_CACHE_DIR") or os.path.join(
            os.path.expanduser("~"), ".cache", "fastread")
        return os.path.join(base, "index")
    return os.fspath(d)


def cache_path(directory, spec, shards):
    """The cache entry of shards ``[(path, size, mtime_ns)]`` indexed for
    ``spec``: a name hashed from all of it, so a shard rewritten (new size
    or mtime) or another spec is another entry, never a stale one."""
    h = hashlib.sha256(json.dumps([spec, [[os.path.abspath(p), s, m] for p, s, m in shards]],
                                  sort_keys=True).encode())
    return os.path.join(directory, f"wds-{h.hexdigest()[:32]}{FRIDX_SUFFIX}")


#: Entries the index cache keeps; past it the least recently used go.
CACHE_ENTRIES = 256


def cache_touch(entry):
    """Marks a cache entry used (its mtime: the LRU order of cache_prune)."""
    try:
        os.utime(entry)
    except OSError:
        pass   # read-only or removed meanwhile: its order only


def _wds_or_listing(name):
    """WebDataset's cached indexes and readers.file's listings
    (fastread.dali._listing): the entries cache_prune counts by default."""
    return ((name.startswith("wds-") and name.endswith(FRIDX_SUFFIX)) or
            (name.startswith("files-") and name.endswith(".frlist")))


def cache_prune(directory, keep=CACHE_ENTRIES, entry=_wds_or_listing):
    """Removes the least recently used index cache entries past ``keep``
    (those whose name ``entry`` accepts; other kinds keep their own count)
    and temporary files a crashed writer left over an hour ago."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now, entries = time.time(), []
    for name in names:
        path = os.path.join(directory, name)
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if name.endswith(".tmp") and now - mtime > 3600:
            _remove(path)
        elif entry(name):
            entries.append((mtime, path))
    entries.sort(reverse=True)
    for _mtime, path in entries[keep:]:
        _remove(path)


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass   # another process removed it first


# -- where a reader finds an index ------------------------------------------------
# `members_part(shard, members)`: the reader's grouping of tar members into
# columns (WebDataset's), for wds2idx files, which list members.

def _index_file_part(index_path, shard, tar, spec, members_part):
    """(columns, identity record) of one shard from its index file (either format)."""
    if is_fridx(index_path):
        idx = open_fridx(index_path)
        idx.check_spec(spec, index_path)
        idx.check_fresh([shard], index_path)
        part = {"start": idx.start, "length": idx.length, "comp_off": idx.comp_offsets(),
                "comp_len": idx.comp_len, "keys": idx.keys, "key_off": idx.key_off,
                "skipped": idx.skipped}
        return part, idx.shards[0]
    members = read_wds2idx(index_path, tar)
    size, mtime = identity(shard)
    return members_part(shard, members), {"path": shard, "size": size, "mtime_ns": mtime}


def load_index_paths(index_paths, paths, tars, spec, members_part):
    """The index from ``index_paths``: one .fridx file for all shards, or a
    list with one file per shard (.fridx or DALI wds2idx, told apart by
    their first bytes). Stale or foreign files are refused (StaleIndexError
    naming the file and the shard)."""
    if isinstance(index_paths, (str, os.PathLike)):
        one = os.fspath(index_paths)
        if len(paths) > 1 or is_fridx(one):
            if not is_fridx(one):
                raise FormatError(one, 0, f"one index file for {len(paths)} shards must be a "
                                          "fastread index (.fridx); DALI's wds2idx files are "
                                          "one per shard")
            idx = open_fridx(one)
            idx.check_spec(spec, one)
            idx.check_fresh(paths, one)
            return idx
        index_paths = [one]
    index_paths = [os.fspath(p) for p in index_paths]
    if len(index_paths) != len(paths):
        raise ValueError(f"index_paths: {len(index_paths)} index files for {len(paths)} shards "
                         "(one per shard, in the same order, or one .fridx for all)")
    got = [_index_file_part(ip, p, t, spec, members_part) for ip, p, t in zip(index_paths, paths, tars)]
    return WdsIndex.from_parts(spec, [g[1] for g in got], [g[0] for g in got])


def beside_paths(shard):
    """Index files looked for next to a shard, in order: ``shard.tar.fridx``,
    ``shard.tar.idx``, and DALI's wds2idx default name ``shard.idx``."""
    base = shard[:shard.find(".", shard.rfind("/") + 2)] if "." in os.path.basename(shard) \
        else shard
    out = [shard + FRIDX_SUFFIX, shard + WDS2IDX_SUFFIX]
    if base != shard:
        out.append(base + WDS2IDX_SUFFIX)
    return out


def beside_index(paths, tars, spec, members_part):
    """The index from files next to every shard, or None where a shard has
    none that is fresh and of this spec (then the set is indexed anew)."""
    got = []
    for p, t in zip(paths, tars):
        found = None
        for cand in beside_paths(p):
            if not os.path.isfile(cand):
                continue
            try:
                found = _index_file_part(cand, p, t, spec, members_part)
                break
            except (FormatError, OSError, ValueError):
                continue   # stale, foreign or damaged: not used
        if found is None:
            return None
        got.append(found)
    return WdsIndex.from_parts(spec, [g[1] for g in got], [g[0] for g in got])
