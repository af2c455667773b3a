"""Parquet footers, labels and row-group decoding for
:mod:`fastread.formats.parquet` (see its documentation): the parts that
read a file's metadata through fastread's engines and hand bytes to Arrow."""
import concurrent.futures as _futures
import functools
import mmap
import os

import numpy as np

from fastread._safe_open import open_file
from fastread.engine import EngineOptions, cached_context
from fastread.formats.cifar import FormatError
from fastread.s3 import is_url

_EIO = 5
#: Bytes read from the end of each file for its footer (one read for most).
FOOTER_GUESS = 64 << 10
#: Files whose footers are read at once (one engine context per thread).
FOOTER_THREADS = 8
_MAGIC = b"PAR1"


def _pa():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:  # pragma: no cover - pyarrow is a dependency of this module
        raise ImportError("fastread.formats.Parquet needs pyarrow: pip install pyarrow") from None
    return pyarrow


class _FileMeta:
    """What the footer says about one file: its row groups' row counts and
    the byte ranges of the column chunks the source reads."""
    __slots__ = ("path", "size", "kind", "metadata", "rows", "chunks", "arrow_batches",
                 "schema", "thrift", "native", "native_column")


def _chunk_ranges(meta, g, leaves):
    """(offsets, lengths) of the column chunks of ``leaves`` in row group
    ``g`` of a Parquet file, checked against the file's size."""
    rg = meta.metadata.row_group(g)
    offs, lens = [], []
    wanted = set(leaves)
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema not in wanted:
            continue
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None \
                and 0 < col.dictionary_page_offset < start:
            start = col.dictionary_page_offset
        length = col.total_compressed_size
        if start < 4 or length < 0 or start + length > meta.size:
            raise FormatError(meta.path, start, f"row group {g} column {col.path_in_schema!r}: "
                              f"its chunk ({length} bytes from {start}) lies outside the "
                              f"{meta.size}-byte file: a corrupt footer or a truncated file")
        offs.append(start)
        lens.append(length)
    return np.array(offs, np.int64), np.array(lens, np.int64)


# -- footers ---------------------------------------------------------------------

def _context_for(path, s3):
    if is_url(path):
        return cached_context("s3", EngineOptions(s3=s3))
    return cached_context("psync")


def _read_range(path, offset, length, s3):
    """Bytes [offset, offset + length) of ``path`` through fastread's engine."""
    from fastread.files import raise_failures
    ctx = _context_for(path, s3)
    batch = ctx.read_ranges(path, [offset], [length])
    raise_failures(batch, lambda i: path, paths=False, context=ctx)
    data = batch.arrays()[0]
    if len(data) != length:
        raise FormatError(path, offset, f"{len(data)} of {length} bytes read: the file is "
                                        "shorter than its footer says (truncated)")
    return data


def _one_footer(path, size, s3):
    pa = _pa()
    import pyarrow.parquet as pq
    meta = _FileMeta()
    meta.path = path
    if path.endswith(".arrow"):
        return _arrow_meta(meta, path)
    if size is None:
        try:
            size = os.stat(path).st_size
        except OSError as e:
            raise type(e)(e.errno, f"{path}: {e.strerror}") from None
    meta.size, meta.kind, meta.arrow_batches = size, "parquet", None
    if size < 12:
        raise FormatError(path, 0, f"{size} bytes: too short for a Parquet file (truncated?)")
    guess = min(size, FOOTER_GUESS)
    tail = _read_range(path, size - guess, guess, s3)
    if bytes(tail[-4:]) != _MAGIC:
        if bytes(tail[-4:]) == b"PARE":
            raise FormatError(path, size - 4, "an encrypted Parquet footer (not supported)")
        raise FormatError(path, size - 4, f"not a Parquet file (ends {bytes(tail[-4:])!r}, not "
                                          "b'PAR1'): truncated or not Parquet")
    footer_len = int.from_bytes(bytes(tail[-8:-4]), "little")
    if footer_len + 12 > size:
        raise FormatError(path, size - 8, f"footer length {footer_len} does not fit in the "
                                          f"{size}-byte file (corrupt footer)")
    if footer_len + 8 > guess:
        tail = _read_range(path, size - 8 - footer_len, footer_len + 8, s3)
    footer = bytes(tail[len(tail) - 8 - footer_len:])
    try:
        md = pq.read_metadata(pa.BufferReader(pa.py_buffer(_MAGIC + footer)))
    except (OSError, pa.ArrowException) as e:
        raise FormatError(path, size - 8 - footer_len, f"corrupt Parquet footer ({e})") from None
    meta.metadata = md
    # The Thrift bytes, for the native route's own parse (_parquet_native).
    meta.thrift = footer[:-8]
    meta.native = meta.native_column = None
    meta.rows = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    try:
        meta.schema = md.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as e:
        raise FormatError(path, None, f"Parquet schema Arrow cannot read ({e})") from None
    return meta


def _arrow_meta(meta, path):
    """An Arrow IPC file (stream or file format), memory-mapped: its record
    batches are its row groups, views of the map."""
    pa = _pa()
    # Opened as untrusted input (a FIFO or device is refused, never waited
    # on), then mapped: record batches are zero-copy views of the map,
    # which the Arrow buffer keeps alive.
    with open_file(path) as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise FormatError(path, 0, "empty file (not an Arrow IPC file)")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    source = pa.BufferReader(pa.py_buffer(mapped))
    batches = None
    errors = []
    for opener in (pa.ipc.open_file, pa.ipc.open_stream):
        try:
            source.seek(0)
            reader = opener(source)
            if opener is pa.ipc.open_file:
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            else:
                batches = list(reader)
            schema = reader.schema
            break
        except (OSError, pa.ArrowException) as e:
            errors.append(str(e))
    if batches is None:
        raise FormatError(path, None, f"not an Arrow IPC file ({errors[-1]})")
    meta.size, meta.kind, meta.metadata = source.size(), "arrow", None
    meta.thrift = meta.native = meta.native_column = None
    meta.arrow_batches = batches
    meta.rows = [b.num_rows for b in batches]
    meta.schema = schema
    meta.chunks = None
    return meta


def _read_footers(paths, sizes, s3):
    """Every file's footer (_FileMeta), FOOTER_THREADS files at a time."""
    if len(paths) == 1:
        return [_one_footer(paths[0], sizes[0], s3)]
    with _futures.ThreadPoolExecutor(min(FOOTER_THREADS, len(paths)),
                                     thread_name_prefix="fastread-parquet-footer") as ex:
        return list(ex.map(lambda ps: _one_footer(ps[0], ps[1], s3), zip(paths, sizes)))


def _read_labels(meta, label, s3):
    """The label column of every row group of one file (int32; null: -1)."""
    if meta.kind == "arrow":
        parts = [b.column(b.schema.get_field_index(label)) for b in meta.arrow_batches]
        return _labels_of(meta.path, parts, label)
    offs, lens, spans = [], [], []
    for g in range(len(meta.rows)):
        o, n = _chunk_ranges(meta, g, [label])
        spans.append((len(offs), len(offs) + len(o)))
        offs += o.tolist()
        lens += n.tolist()
    if not offs:
        return np.zeros(0, np.int32)
    from fastread.files import raise_failures
    ctx = _context_for(meta.path, s3)
    batch = ctx.read_ranges(meta.path, offs, lens)
    raise_failures(batch, lambda i: f"{meta.path}[label chunk {i}]", paths=False, context=ctx)
    arrays = batch.arrays()
    parts = []
    for g, (a, b) in enumerate(spans):
        pieces = list(zip(offs[a:b], arrays[a:b]))
        table = _decode(meta, g, [label], pieces)
        parts.append(table.column(0))
    return _labels_of(meta.path, parts, label)


def _labels_of(path, parts, label):
    pa = _pa()
    out = []
    for col in parts:
        chunks = col.chunks if hasattr(col, "chunks") else [col]
        for arr in chunks:
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            if not (pa.types.is_integer(arr.type) or pa.types.is_boolean(arr.type)):
                raise ValueError(f"{path}: label column {label!r} holds {arr.type}, not "
                                 "integers")
            v = arr.fill_null(-1).to_numpy(zero_copy_only=False)
            if v.size and (v.min() < -(1 << 31) or v.max() >= 1 << 31):
                raise ValueError(f"{path}: label column {label!r} has values outside int32")
            out.append(v.astype(np.int32))
    return np.concatenate(out) if out else np.zeros(0, np.int32)


# -- decoding ----------------------------------------------------------------------

class _Pieces:
    """A Parquet file as Arrow reads it through ``pyarrow.PythonFile``: only
    the byte ranges fastread read (``pieces``: (offset, uint8 array)), each
    read handed out as a zero-copy memoryview of the engine's buffer. A read
    outside them raises (Arrow reports it as an error: no crash)."""

    def __init__(self, path, size, pieces):
        self.path, self._size = path, size
        self._pieces = sorted(pieces, key=lambda p: p[0])
        self._pos = 0
        self.closed = False

    def readable(self):
        return True

    def seekable(self):
        return True

    def writable(self):
        return False

    def seek(self, pos, whence=0):
        if whence == 1:
            pos += self._pos
        elif whence == 2:
            pos += self._size
        self._pos = pos
        return pos

    def tell(self):
        return self._pos

    def size(self):
        return self._size

    def read(self, n=-1):
        pos = self._pos
        if n is None or n < 0:
            n = self._size - pos
        for start, data in self._pieces:
            if start <= pos and pos + n <= start + len(data):
                self._pos = pos + n
                return memoryview(data)[pos - start:pos - start + n]
        raise OSError(_EIO, f"{self.path}: Arrow asked for bytes {pos}..{pos + n}, outside "
                            "the column chunks the footer gives")

    def close(self):
        self.closed = True


@functools.lru_cache(maxsize=None)
def decode_pool():
    """The Arrow memory pool row groups are decoded into: jemalloc's where
    the wheel has it, else Arrow's default pool. Why: a row group's decoded
    value buffer is ~90 MB, and a global shuffle keeps every row group of
    the data set decoded at once, so an epoch's decoding writes ~the data
    set's size of fresh memory. From Arrow's default pool (mimalloc) that
    memory came as transparent huge pages, which the kernel compacts memory
    for and zeroes 2 MiB at a time: 1.8 GB of fresh 90 MB buffers cost
    3.7 s of CPU to write, 1.1-1.5 s from jemalloc's 4 KiB pages (2-core
    VM), and page zeroing (clear_page in perf) was 73% of the Parquet
    Reader's CPU. No allocator setting is changed (the pool is jemalloc's
    as Arrow configures it; the process's default pool is untouched)."""
    pa = _pa()
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, AttributeError, pa.ArrowException):
        return pa.default_memory_pool()


def _leaf_indices(meta, leaves):
    schema = meta.metadata.schema
    wanted = set(leaves)
    return [i for i in range(meta.metadata.num_columns) if schema.column(i).path in wanted]


def _prefault(meta, g, leaves, pool):
    """Hands jemalloc's pool the row group's decoded size of pages already
    faulted in, just before Arrow decodes it: one buffer of the leaves'
    uncompressed size, its pages populated by one
    ``madvise(MADV_POPULATE_WRITE)`` (fastread._core.populate_write), then
    freed, so that the allocations Arrow makes next in this thread's arena
    take those pages from jemalloc's dirty extents. Why: a fresh process's
    first epoch of a global shuffle writes ~the data set's size of fresh
    memory (every row group is kept decoded), one page fault per 4 KiB
    page (446k for the 1.8 GB 20k set: 1.5-3 s of system CPU on the 2-core
    VM, most of the epoch); populated at once the same pages cost 25-40%
    less system CPU (docs/parquet.md). Only for jemalloc (the reuse of a
    freed extent is its behaviour); a kernel without the advice (EINVAL,
    before Linux 5.14) or a failed call only loses the gain. The page
    faults counted stay the same: the populated pages are the ones Arrow
    writes (had they not been reused, twice as many would be counted)."""
    if getattr(pool, "backend_name", "") != "jemalloc":
        return
    rg = meta.metadata.row_group(g)
    size = 0
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema in leaves:
            size += int(col.total_uncompressed_size)
    if size <= 0:
        return
    from fastread import _core
    buf = _pa().allocate_buffer(size, memory_pool=pool)
    _core.populate_write(memoryview(buf).cast("B"))   # Arrow exports "b"
    del buf


def _decode(meta, g, leaves, pieces):
    """Row group ``g`` of columns ``leaves`` decoded by Arrow's C++ reader
    from the bytes fastread read (``pieces``), as a pyarrow Table, into
    :func:`decode_pool`."""
    pa = _pa()
    f = pa.PythonFile(_Pieces(meta.path, meta.size, pieces), mode="r")
    try:
        from pyarrow._parquet import ParquetReader
        pool = decode_pool()
        _prefault(meta, g, leaves, pool)
        reader = ParquetReader(memory_pool=pool)
    except (ImportError, TypeError):  # pragma: no cover - an Arrow without it
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(f, metadata=meta.metadata, pre_buffer=False)
        return pf.read_row_group(g, columns=leaves, use_threads=False)
    # ParquetFile has no memory_pool argument; its reader (ParquetReader,
    # which ParquetFile wraps) takes one. Leaves are given by index.
    reader.open(f, metadata=meta.metadata, pre_buffer=False)
    return reader.read_row_group(g, column_indices=_leaf_indices(meta, leaves),
                                 use_threads=False)
