# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The binding to the C core, one module per concept: :class:`Batch`
(``_batch``), :class:`DeviceArray` (``_device_arrays``), :class:`Context`
(``_context``), :class:`NativeReader` (``_native_reader``), and what the
last two share (``_adapt``). This module is their facade
(``fastread._core.Context``, ...) and holds the core's functions: the
engine registry and probes, engine "auto"'s rule and choice, and the
shuffle orders.

Only adaptation happens here. Every native call that does I/O or waits runs
with the GIL released; results come back as NumPy views over engine-owned
arenas, each view keeping its batch alive.
"""
cimport numpy as cnp
from libc.errno cimport EINVAL, ENOMEM, EOVERFLOW
from libc.stdint cimport int64_t, uint64_t

from fastread._cfastread cimport *

from fastread._batch import Batch
from fastread._context import Context, drop_stale_cache_entries
from fastread._device_arrays import DeviceArray
from fastread._native_reader import NativeReader

cnp.import_array()


def engine_names():
    """Engines compiled into this build, in order of preference."""
    cdef const char *const *names = fr_engine_names()
    out = []
    cdef size_t i = 0
    while names[i] != NULL:
        out.append(names[i].decode())
        i += 1
    return out


def permutation(uint64_t seed, uint64_t epoch, Py_ssize_t n):
    """A permutation of range(n) drawn from (seed, epoch) by the core
    (fr_permutation), as an int64 array: the order every fastread reader and
    DALI operator shuffles an epoch into."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out = cnp.PyArray_EMPTY(1, [n], cnp.NPY_INT64, 0)
    cdef int64_t *p = <int64_t *>cnp.PyArray_DATA(out)
    with nogil:
        fr_permutation(seed, epoch, p, <size_t>n)
    return out


#: Orders of up to this many samples are a Fisher-Yates table (fr_order).
ORDER_TABLE_MAX = FR_ORDER_TABLE_MAX

_ORDER_MODES = {"sequential": FR_ORDER_SEQUENTIAL, "full": FR_ORDER_FULL,
                "block": FR_ORDER_BLOCK}


cdef class Order:
    """An epoch's order of ``n`` samples drawn from ``(seed, epoch)`` by the
    core (``fr_order``), computed per position: ``order[i]``, ``order[a:b]``
    (a new int64 array) and :meth:`fill` cost what they return, not ``n``.
    ``mode``: ``"full"`` (every sample anywhere: :func:`permutation`'s
    order), ``"block"`` (blocks of ``block`` consecutive samples permuted,
    samples permuted within windows of ``window`` blocks) or
    ``"sequential"``. Immutable: any thread may read it."""
    cdef fr_order *_order
    cdef readonly str mode

    def __cinit__(self, uint64_t seed, uint64_t epoch, int64_t n, str mode="full",
                  int64_t block=0, int64_t window=0):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if mode not in _ORDER_MODES:
            raise ValueError(f"mode must be one of {sorted(_ORDER_MODES)}, got {mode!r}")
        if mode == "block" and (block < 1 or window < 1):
            raise ValueError(f"block order: block and window must be >= 1, got block={block}, "
                             f"window={window}")
        cdef int rc = fr_order_open(seed, epoch, <uint64_t>n, _ORDER_MODES[mode],
                                    <uint64_t>max(block, 0), <uint64_t>max(window, 0),
                                    &self._order)
        if rc == -ENOMEM:
            raise MemoryError()
        if rc == -EOVERFLOW:
            raise OverflowError(f"block order: block={block} x window={window} samples is too "
                                f"large")
        if rc:
            raise ValueError(f"fr_order_open refused n={n}, mode={mode!r}, block={block}, "
                             f"window={window} ({rc})")
        self.mode = mode

    def __dealloc__(self):
        fr_order_close(self._order)

    def __len__(self):
        return <Py_ssize_t>fr_order_size(self._order)

    def memory(self):
        """Bytes the order holds (its table, if any: at most 512 KiB)."""
        return fr_order_memory(self._order)

    def fill(self, int64_t first, Py_ssize_t count):
        """The samples at positions ``first .. first + count - 1``: a new
        int64 array; IndexError past the end."""
        cdef uint64_t n = fr_order_size(self._order)
        if first < 0 or count < 0 or <uint64_t>first > n or <uint64_t>count > n - <uint64_t>first:
            raise IndexError(f"positions [{first}, {first + count}) of an order of {n}")
        out = cnp.PyArray_EMPTY(1, [count], cnp.NPY_INT64, 0)
        cdef int64_t *p = <int64_t *>cnp.PyArray_DATA(out)
        with nogil:
            fr_order_fill(self._order, <uint64_t>first, <size_t>count, p)
        return out

    def take(self, positions):
        """The samples at ``positions`` (any int64 array-like, each in
        [0, n)): a new int64 array of their shape; IndexError otherwise."""
        pos = cnp.PyArray_FROMANY(positions, cnp.NPY_INT64, 0, 0, cnp.NPY_ARRAY_C_CONTIGUOUS)
        out = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(pos), cnp.PyArray_DIMS(pos), cnp.NPY_INT64, 0)
        cdef const int64_t *src = <const int64_t *>cnp.PyArray_DATA(pos)
        cdef int64_t *dst = <int64_t *>cnp.PyArray_DATA(out)
        cdef Py_ssize_t count = cnp.PyArray_SIZE(pos), i
        cdef uint64_t n = fr_order_size(self._order)
        cdef Py_ssize_t bad = -1
        with nogil:
            for i in range(count):
                if src[i] < 0 or <uint64_t>src[i] >= n:
                    bad = i
                    break
                dst[i] = fr_order_at(self._order, <uint64_t>src[i])
        if bad >= 0:
            raise IndexError(f"position {src[bad]} of an order of {n}")
        return out

    def __getitem__(self, key):
        cdef Py_ssize_t n = <Py_ssize_t>fr_order_size(self._order)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                raise ValueError("an Order's slices take no step")
            return self.fill(start, max(0, stop - start))
        cdef Py_ssize_t i = key
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"position {key} of an order of {n}")
        return fr_order_at(self._order, <uint64_t>i)


def buffer_shuffle(uint64_t seed, uint64_t epoch, items, Py_ssize_t fill):
    """``items`` (int64) reordered as a shuffle buffer of ``fill`` slots
    emits them, drawn from (seed, epoch) by the core (fr_buffer_shuffle):
    a new int64 array. Item k comes out at a position >= k - fill + 1."""
    if fill < 1:
        raise ValueError(f"fill must be >= 1, got {fill}")
    out = cnp.PyArray_FROMANY(items, cnp.NPY_INT64, 1, 1,
                              cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ENSURECOPY)
    cdef int64_t *p = <int64_t *>cnp.PyArray_DATA(out)
    cdef size_t n = <size_t>cnp.PyArray_DIM(out, 0)
    cdef int rc
    with nogil:
        rc = fr_buffer_shuffle(seed, epoch, p, n, <size_t>fill)
    if rc == -ENOMEM:
        raise MemoryError()
    return out


def auto_rule(uint64_t mean_size, int resident, unsigned cpus, bint o_direct=False):
    """engine="auto"'s per-batch rule (fr_auto_rule): "psync" or "io_uring"
    for files of mean_size bytes, resident 1 (cached) / 0 / -1 (unknown),
    on `cpus` CPUs."""
    return "psync" if fr_auto_rule(mean_size, resident, cpus, o_direct) == FR_AUTO_PSYNC else "io_uring"


AUTO_MIN_SIZE = FR_AUTO_MIN_SIZE
AUTO_MIN_CPUS = FR_AUTO_MIN_CPUS
# For large cached files, auto's trials of its other engine
# (csrc/core/auto_trial.h): the first after this many batches, then every
# AUTO_TRIAL_EVERY, each of AUTO_TRIAL_BATCHES batches.
AUTO_TRIAL_FIRST = FR_AUTO_TRIAL_FIRST
AUTO_TRIAL_EVERY = FR_AUTO_TRIAL_EVERY
AUTO_TRIAL_BATCHES = FR_AUTO_TRIAL_BATCHES


def probe(str engine):
    """(True, "") if the engine can run here, else (False, why)."""
    cdef char why[256]
    why[0] = 0
    b = engine.encode()
    cdef int rc = fr_engine_probe(b, why, sizeof(why))
    return (rc == 0, why.decode(errors="replace"))


def cql_tls():
    """(True, "") if the cql engine opens TLS connections (built with
    OpenSSL), else (False, why)."""
    cdef char why[256]
    why[0] = 0
    cdef int rc = fr_cql_tls_probe(why, sizeof(why))
    return (rc == 0, why.decode(errors="replace"))


def cql_token(bytes key):
    """Cassandra's Murmur3 token of a partition key's bytes (the cql
    engine's routing; what ``SELECT token(id)`` answers)."""
    return fr_cql_token(<const unsigned char *>key, len(key))


def auto_engine():
    """(engine, why) for engine="auto" here, as the core decides it
    (fr_engine_auto): "io_uring" (then choosing per batch between io_uring
    and psync) where io_uring runs, else "psync"; `why`: io_uring's probe
    failure when it is passed over, else ""."""
    cdef char why[256]
    cdef int rc = 0
    cdef const char *name
    with nogil:
        name = fr_engine_auto(&rc, why, sizeof(why))
    return name.decode(), why.decode(errors="replace")


def gpu_probe(int device=0):
    """(True, "") if CUDA device `device` is usable through the driver, else
    (False, why). Loads the driver only for the question."""
    cdef char why[256]
    why[0] = 0
    cdef int rc
    with nogil:
        rc = fr_gpu_probe(device, why, sizeof(why))
    return (rc == 0, why.decode(errors="replace"))


def populate_write(unsigned char[::1] buf):
    """Faults in the whole pages of the writable buffer ``buf`` for writing
    in one ``madvise(MADV_POPULATE_WRITE)``: the kernel allocates and zeroes
    them without a page fault per 4 KiB page (the Parquet source pre-faults
    the memory Arrow decodes a row group into; docs/parquet.md). Returns 0,
    or the errno (EINVAL: a kernel before 5.14; nothing was done). Thread-
    safe; the GIL is released."""
    cdef size_t n = buf.shape[0]
    cdef int rc = 0
    if n == 0:
        return 0
    with nogil:
        rc = fr_populate_write(&buf[0], n)
    return rc
