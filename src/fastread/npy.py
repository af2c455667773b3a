"""``.npy`` headers without the data: the groundwork of a numpy-file reader.

A reader like DALI's ``fn.readers.numpy`` must know, before it reads a batch,
where each file's array data starts and what shape and type it has.  This
module gets that from the first few KB of every file, fast enough for whole
datasets, and turns read bytes back into arrays without copying:

- :func:`parse_header` parses one header held in memory (format versions
  1.0, 2.0 and 3.0 of :mod:`numpy.lib.format`).
- :meth:`NpyIndex.build` probes many files (one small ``os.pread`` each; on
  a thread pool when the files wait on storage, as the system calls release
  the GIL) and checks that every file holds exactly its header and its data.
- :func:`array_view` views the data part of a uint8 buffer as the array.

The layout (see ``numpy.lib.format``)::

    b"\\x93NUMPY" major minor  HEADER_LEN  HEADER              DATA
    6 bytes       u1    u1     u2 (1.0)    latin-1 (1.0, 2.0)  prod(shape) * itemsize
                               u4 (2.0, 3.0)  utf-8 (3.0)

``HEADER`` is the repr of a dict ``{'descr': ..., 'fortran_order': ...,
'shape': ...}``, parsed with :func:`ast.literal_eval` exactly as NumPy does.
Arrays of object dtype are pickles, not raw data, and are refused.
"""
from __future__ import annotations

import ast
import errno as _errno
import math
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Sequence

import numpy as np
from numpy.lib.format import descr_to_dtype

from fastread._safe_open import open_fd
from fastread.errors import ReadError

__all__ = ["NpyError", "NpyHeader", "NpyIndex", "array_view", "header_size", "parse_header",
           "shape_problem", "MAGIC", "MAX_HEADER_SIZE", "PROBE_BYTES"]

MAGIC = b"\x93NUMPY"
#: Longest header text accepted, in bytes: the default limit of ``np.load``
#: (which counts characters), so files that ``np.load`` refuses without
#: ``allow_pickle`` are refused here too (a huge literal is slow and
#: memory-hungry to evaluate, and a corrupt length must not make us read GBs).
MAX_HEADER_SIZE = 10_000
#: First read of every file in :meth:`NpyIndex.build`.  ``np.save`` writes
#: 128-byte headers for any ordinary array, so one small read nearly always
#: holds the whole header; longer ones are read again in full.
PROBE_BYTES = 4096

# NpyIndex.build's default probes chunks of this many files on the calling
# thread until one shows that it waited on storage (see _waited).
_ADAPT_CHUNK = 256

# version -> (length field format, its size, text encoding), as numpy.lib.format.
_VERSIONS = {(1, 0): ("<H", 2, "latin1"), (2, 0): ("<I", 4, "latin1"), (3, 0): ("<I", 4, "utf8")}
_KEYS = {"descr", "fortran_order", "shape"}
# Parsed headers by their exact bytes: a dataset's files usually share a
# handful of headers, so most files skip literal_eval.  Bounded so that a
# dataset of all-different shapes cannot grow it without limit.
_CACHE: dict = {}
_CACHE_MAX = 4096


class NpyError(ValueError):
    """A file is not a well-formed ``.npy`` file; ``path`` names it."""

    def __init__(self, path, what):
        self.path = os.fspath(path) if path is not None else None
        self.what = what
        super().__init__(f"{self.path}: {what}" if self.path is not None else what)


class NpyHeader(NamedTuple):
    """What a ``.npy`` header says about the array that follows it."""

    data_offset: int          # bytes before the array data (magic + lengths + header text)
    shape: tuple              # tuple of ints; () for a 0-d array
    dtype: np.dtype           # byte order as stored (may be non-native)
    fortran_order: bool       # data in column-major order
    nbytes: int               # size of the array data: prod(shape) * dtype.itemsize


def header_size(buf, path=None) -> int:
    """Bytes the header of a ``.npy`` file takes (its ``data_offset``).

    Needs only the first 12 bytes of ``buf`` (10 for version 1.0); a reader
    uses it to tell whether a first small read holds the whole header.
    Raises :class:`NpyError` (a ``ValueError``) for a bad magic string, an
    unknown version, or too few bytes.
    """
    buf = memoryview(buf).cast("B")
    if len(buf) < 8:
        if bytes(buf) != MAGIC[: len(buf)]:
            raise NpyError(path, f"not a .npy file (starts with {bytes(buf)!r}, not {MAGIC!r})")
        raise NpyError(path, f"truncated header ({len(buf)} bytes, a .npy file starts with 10 or more)")
    if bytes(buf[:6]) != MAGIC:
        raise NpyError(path, f"not a .npy file (starts with {bytes(buf[:6])!r}, not {MAGIC!r})")
    version = (buf[6], buf[7])
    info = _VERSIONS.get(version)
    if info is None:
        raise NpyError(path, f"unsupported .npy format version {version[0]}.{version[1]} "
                             f"(supported: 1.0, 2.0, 3.0)")
    fmt, width, _ = info
    if len(buf) < 8 + width:
        raise NpyError(path, f"truncated header ({len(buf)} bytes, version {version[0]}.0 "
                             f"needs {8 + width} to give the header length)")
    (hlen,) = struct.unpack_from(fmt, buf, 8)
    if hlen > MAX_HEADER_SIZE:  # checked before anything reads that much
        raise NpyError(path, f"header of {hlen} bytes is longer than the {MAX_HEADER_SIZE} "
                             f"accepted (np.load's limit)")
    return 8 + width + hlen


def parse_header(buf, path=None) -> NpyHeader:
    """Parses the header at the start of ``buf`` (bytes, bytearray, memoryview,
    or a uint8 array); ``buf`` may go on into the data or stop at its start.

    ``path`` only names the file in errors.  Raises :class:`NpyError` (a
    ``ValueError``) when the header is malformed or truncated, or when the
    dtype holds Python objects (such files are pickles, not raw arrays).
    """
    buf = memoryview(buf).cast("B")
    offset = header_size(buf, path)
    if len(buf) < offset:
        raise NpyError(path, f"truncated header ({len(buf)} bytes, the header needs {offset})")
    key = bytes(buf[:offset])
    hdr = _CACHE.get(key)
    if hdr is None:
        hdr = _parse(key, path)
        if len(_CACHE) < _CACHE_MAX:
            _CACHE[key] = hdr
    return hdr


def _parse(raw: bytes, path) -> NpyHeader:
    version = (raw[6], raw[7])
    _, width, encoding = _VERSIONS[version]
    try:
        text = raw[8 + width:].decode(encoding)
    except UnicodeDecodeError as e:
        raise NpyError(path, f"header is not {encoding} text: {e}") from None
    try:
        d = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
        raise NpyError(path, f"cannot parse header {text.strip()!r}: {e}") from None
    if not isinstance(d, dict) or set(d) != _KEYS:
        raise NpyError(path, f"header is not a dict with keys 'descr', 'fortran_order', "
                             f"'shape': {text.strip()!r}")
    shape, fortran = d["shape"], d["fortran_order"]
    if not isinstance(shape, tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise NpyError(path, f"shape is not a tuple of non-negative ints: {shape!r}")
    if not isinstance(fortran, bool):
        raise NpyError(path, f"fortran_order is not a bool: {fortran!r}")
    try:
        dtype = descr_to_dtype(d["descr"])
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise NpyError(path, f"descr is not a valid dtype: {d['descr']!r} ({e})") from None
    if dtype.hasobject:
        raise NpyError(path, f"dtype {dtype} holds Python objects (the data is a pickle, "
                             f"not a raw array)")
    why = shape_problem(shape, dtype)
    if why is not None:
        raise NpyError(path, f"shape {shape} of {dtype} is no NumPy array: {why}")
    return NpyHeader(len(raw), shape, dtype, fortran, math.prod(shape) * dtype.itemsize)


def shape_problem(shape, dtype):
    """Why NumPy cannot make an array of ``shape`` and ``dtype`` (more
    dimensions than it takes, a size past its limits: a shape with a 0 in
    it holds no bytes, so the size check of the data does not catch it), or
    None. Tried on a view of one item (zero strides), so nothing is
    allocated."""
    try:
        np.ndarray(shape, dtype, buffer=bytes(dtype.itemsize), strides=(0,) * len(shape))
    except (ValueError, TypeError, OverflowError) as e:
        return str(e)
    return None


# --------------------------------------------------------------------------
# many files
# --------------------------------------------------------------------------


class NpyIndex:
    """Headers of many ``.npy`` files, one entry per path, in input order.

    Per-sample attributes: ``paths`` (list of str), ``data_offset``,
    ``nbytes`` and ``file_size`` (int64 arrays), ``fortran_order`` (bool
    array), ``shape`` (list of tuples) and ``dtype`` (list of np.dtype).
    Every file satisfies ``data_offset + nbytes == file_size``.
    """

    def __init__(self, paths, headers: Sequence[NpyHeader], file_size):
        n = len(paths)
        if len(headers) != n or len(file_size) != n:
            raise ValueError(f"{n} paths but {len(headers)} headers and {len(file_size)} sizes")
        self.paths = list(paths)
        self.data_offset = np.fromiter((h.data_offset for h in headers), np.int64, n)
        self.nbytes = np.fromiter((h.nbytes for h in headers), np.int64, n)
        self.file_size = np.asarray(file_size, dtype=np.int64).reshape(n)
        self.fortran_order = np.fromiter((h.fortran_order for h in headers), bool, n)
        self.shape = [h.shape for h in headers]
        self.dtype = [h.dtype for h in headers]

    @classmethod
    def build(cls, paths, *, threads: int | None = None) -> "NpyIndex":
        """Reads and checks the header of every file in ``paths``.

        Each file is opened, ``fstat``-ed and read with one ``os.pread`` of
        :data:`PROBE_BYTES` (more only for a longer header); headers shared
        by many files are parsed once.

        ``threads``: an int runs that many threads (1: the calling thread
        only).  None (the default) adapts: the calling thread goes on alone
        while it is busy computing (files in the page cache), and hands the
        rest to a pool of ``min(32, cpus + 4)`` threads once a chunk of files
        spent most of its time waiting on storage (cold or remote files: the
        system calls run without the GIL and the waits overlap).  Threads
        cost a GIL hand-off at every system call, so on cached files they
        are slower.  Measured on 16 cores, 50,000 files: cached, 165k-189k
        files/s on one thread, about 50k on 4 to 64; uncached (evicted with
        fadvise), 23k-28k on one, 45k-50k on 4 to 64; the default got
        139k-181k cached and 43k-51k uncached.

        Errors, for the first failing file in input order:
        :class:`fastread.errors.ReadError` (an ``OSError`` with ``filename``
        and ``errno``; ``failures`` lists every file that could not be read)
        for missing or unreadable files; :class:`NpyError` (a ``ValueError``
        naming the path) for a malformed header, an object dtype, or a file
        size other than header + data ("truncated" or "trailing bytes").
        """
        paths = [os.fspath(p) for p in paths]
        adaptive = threads is None
        if adaptive:
            threads = min(32, (os.cpu_count() or 1) + 4)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        n = len(paths)
        results: list = [None] * n
        pos = 0
        if adaptive or threads == 1:
            while pos < n:
                end = min(n, pos + _ADAPT_CHUNK)
                wall, cpu = time.perf_counter(), time.thread_time()
                results[pos:end] = _probe_chunk(paths[pos:end])
                waited = _waited(time.perf_counter() - wall, time.thread_time() - cpu)
                pos = end
                if waited and threads > 1:
                    break
        if pos < n:
            # Chunks amortize the per-future overhead over many small files,
            # yet leave enough of them to keep every thread busy.
            size = max(1, min(1024, -(-(n - pos) // (threads * 4))))
            starts = range(pos, n, size)
            with ThreadPoolExecutor(max_workers=min(threads, len(starts)),
                                    thread_name_prefix="fastread-npy") as pool:
                for s, part in zip(starts, pool.map(_probe_chunk,
                                                    (paths[s:s + size] for s in starts))):
                    results[s:s + size] = part
        first = next((r for r in results if isinstance(r, Exception)), None)
        if first is not None:
            if isinstance(first, ReadError):
                failed = [(e.filename, e.errno) for e in results if isinstance(e, ReadError)]
                raise ReadError(first.errno, first.filename, failed)
            raise first
        return cls(paths, [r[0] for r in results], [r[1] for r in results])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> NpyHeader:
        """The header of sample ``i``."""
        return NpyHeader(int(self.data_offset[i]), self.shape[i], self.dtype[i],
                         bool(self.fortran_order[i]), int(self.nbytes[i]))

    def uniform(self):
        """``(shape, dtype)`` shared by every sample (same memory order too),
        else None; None for an empty index."""
        if not self.paths:
            return None
        s0, d0 = self.shape[0], self.dtype[0]
        f0 = self.fortran_order[0]
        if (all(s == s0 for s in self.shape) and all(d == d0 for d in self.dtype)
                and bool((self.fortran_order == f0).all())):
            return s0, d0
        return None


def _waited(wall: float, cpu: float) -> bool:
    """Whether a chunk waited on storage more than it computed.

    thread_time counts this thread's user and system time, so reads served
    from the page cache count as computing; time off the CPU is waiting
    (for the disk, or, rarely, for a CPU).  A machine-independent test, unlike
    a files-per-second threshold.
    """
    return wall - cpu > max(cpu, 1e-3)


def _probe_chunk(paths):
    """[(NpyHeader, file_size) or the exception] per path; never raises."""
    out = []
    for p in paths:
        try:
            out.append(_probe(p))
        except (ReadError, NpyError) as e:
            out.append(e)
    return out


def _probe(path: str):
    try:
        # O_NONBLOCK left set: only pread follows, which regular files ignore it for.
        fd, st = open_fd(path, blocking=False)
    except ReadError:
        raise
    except OSError as e:
        raise ReadError(e.errno or _errno.EIO, path) from None
    try:
        size = st.st_size
        head = os.pread(fd, PROBE_BYTES, 0)
        need = header_size(head, path) if len(head) >= 12 or len(head) == size else None
        if need is None:  # a short read of a longer file: read the preamble in full
            head = _pread_full(fd, 12, 0)
            need = header_size(head, path)
        if need > len(head):
            head += _pread_full(fd, need - len(head), len(head))
    except OSError as e:
        raise ReadError(e.errno or _errno.EIO, path) from None
    finally:
        os.close(fd)
    hdr = parse_header(head, path)
    end = hdr.data_offset + hdr.nbytes
    if end > size:
        raise NpyError(path, f"truncated: header says {hdr.nbytes} bytes of data "
                             f"({hdr.shape}, {hdr.dtype}) from byte {hdr.data_offset}, "
                             f"the file has {size} bytes, {end - size} short")
    if end < size:
        raise NpyError(path, f"trailing bytes: header says the data ends at byte {end} "
                             f"({hdr.shape}, {hdr.dtype}), the file has {size - end} more")
    return hdr, size


def _pread_full(fd: int, n: int, offset: int) -> bytes:
    """Up to n bytes from offset; fewer only at end of file."""
    parts = []
    while n > 0:
        b = os.pread(fd, n, offset)
        if not b:
            break
        parts.append(b)
        n -= len(b)
        offset += len(b)
    return b"".join(parts)


# --------------------------------------------------------------------------
# arrays from read bytes
# --------------------------------------------------------------------------


def array_view(buf, header: NpyHeader, *, offset: int | None = None) -> np.ndarray:
    """The array stored in ``buf``, as a view (no copy) of it.

    ``buf`` is a 1-D uint8 array (or any contiguous buffer) holding the file
    from its start (the default: the data begins at ``header.data_offset``)
    or, with ``offset=0``, only the data part.  The result has the header's
    shape, dtype (byte order as stored) and memory order, is writable when
    ``buf`` is, and keeps ``buf`` alive.  Data at an offset that is not a
    multiple of the item alignment gives an unaligned (slower) view; np.save
    aligns data to 64 bytes.
    """
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
            raise ValueError(f"buf must be a contiguous 1-D uint8 array, got {buf.dtype} "
                             f"with shape {buf.shape}")
        size = buf.shape[0]
    else:
        size = memoryview(buf).nbytes
    start = header.data_offset if offset is None else offset
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    if size < start + header.nbytes:
        raise ValueError(f"buf holds {size} bytes; the array ({header.shape}, {header.dtype}) "
                         f"needs {header.nbytes} from byte {start}")
    return np.ndarray(header.shape, header.dtype, buffer=buf, offset=int(start),
                      order="F" if header.fortran_order else "C")
