# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The binding to the C row-gather API (csrc/include/fastread_gather.h): one Store per
fr_store. Only adaptation happens here (fastread.features has the logic):
configuration in, errors out as Python exceptions, every C call with the GIL
released.

Errors: a C failure ``-errno`` becomes OSError(errno, message) -- so a
timeout is a TimeoutError, a missing file a FileNotFoundError -- except
EINVAL (ValueError), ENOMEM (MemoryError), ENODEV / ENOSYS / ENOTSUP
(RuntimeError: no GPU, NVRTC missing, a backend not built) and ERANGE
(IndexError with ``position``: the first out-of-range id's place in the ids).
"""
import errno
import os
import threading

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memchr

from fastread._cgather cimport *

cnp.import_array()

cdef enum:
    ERRLEN = 512

#: host_bytes that asks the C core to size the host tier from free memory.
HOST_BYTES_AUTO = 0xFFFFFFFFFFFFFFFF


cdef bytes _c_str(object s, str what):
    cdef bytes b = os.fsencode(s) if not isinstance(s, bytes) else s
    if memchr(PyBytes_AS_STRING(b), 0, <size_t>PyBytes_GET_SIZE(b)) != NULL:
        raise ValueError(f"{what} contains a NUL byte: {s!r}")
    return b


def _error(int rc, str msg):
    """The Python exception for C status ``rc`` (-errno) and its message."""
    cdef int e = -rc
    if not msg:
        msg = os.strerror(e)
    if e == errno.EINVAL:
        return ValueError(msg)
    if e == errno.ENOMEM:
        return MemoryError(msg)
    if e in (errno.ENODEV, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return RuntimeError(msg)
    return OSError(e, msg)


def route_rule():
    """The rule backend "auto" picks each gather's path by, in words."""
    return fr_store_route_rule().decode()


def device_header():
    """The source of fastread_device.cuh compiled into the library."""
    cdef const char *src
    with nogil:
        src = fr_store_device_header()
    return src.decode() if src != NULL else ""


cdef class Store:
    """An open fr_store.

    ``close()`` may be called while gathers run on other threads: no new
    gather starts, device gathers in flight are cancelled (fr_store_cancel:
    they raise soon, whatever their timeout), and the store is freed once
    those running have left. Python counts its own callers (``_users``): a
    thread that read the store pointer and released the GIL may not yet be
    inside the C call, where fr_store_close would count it, so freeing
    without waiting for it would be a use after free; fr_store_cancel leaves
    the store allocated for them."""
    cdef fr_store *s
    cdef object _cv    # guards s, _users; held by the short calls, never by a gather
    cdef int _users    # gathers between their check of s and their return
    cdef object _hot  # the hot-id array, kept while the C core may read it
    cdef readonly str path
    cdef readonly uint64_t rows
    cdef readonly uint64_t row_bytes
    cdef readonly int device_id
    cdef readonly str backend
    cdef readonly str backend_reason  # why "auto" fell back to "host" ("" if it did not)
    cdef readonly str kernel_source   # where the gather kernel came from ("" without one)

    def __cinit__(self, path, uint64_t offset, uint64_t rows, uint64_t row_bytes, *,
                  str backend="auto", str engine="auto", str engine_args="", int o_direct=-1,
                  unsigned queue_depth=0, unsigned threads=0, int device_id=-1,
                  uint64_t cache_bytes=0, uint32_t page_bytes=0, uint64_t host_bytes=0,
                  hot_ids=None, unsigned ring_entries=0, uint32_t timeout_ms=0,
                  cache_dir=None, nvrtc_path=None):
        cdef bytes bpath = _c_str(path, "path")
        cdef bytes bbackend = _c_str(backend, "backend")
        cdef bytes bengine = _c_str(engine, "engine")
        cdef bytes bargs = _c_str(engine_args, "engine_args")
        cdef bytes bcache = _c_str(cache_dir, "cache_dir") if cache_dir is not None else None
        cdef bytes bnvrtc = _c_str(nvrtc_path, "nvrtc_path") if nvrtc_path is not None else None
        cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] hot
        cdef fr_store_config cfg
        cdef char err[ERRLEN]
        cdef int rc
        err[0] = 0
        fr_store_config_init(&cfg)
        cfg.path = PyBytes_AS_STRING(bpath)
        cfg.offset = offset
        cfg.rows = rows
        cfg.row_bytes = row_bytes
        cfg.backend = PyBytes_AS_STRING(bbackend)
        cfg.engine = PyBytes_AS_STRING(bengine)
        cfg.engine_args = PyBytes_AS_STRING(bargs)
        cfg.o_direct = o_direct
        cfg.queue_depth = queue_depth
        cfg.threads = threads
        cfg.device_id = device_id
        if cache_bytes:
            cfg.cache_bytes = cache_bytes
        if page_bytes:
            cfg.page_bytes = page_bytes
        cfg.host_bytes = host_bytes
        if hot_ids is not None:
            hot = cnp.PyArray_FROMANY(hot_ids, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
            self._hot = hot
            cfg.hot_ids = <const int64_t *>hot.data
            cfg.n_hot = hot.shape[0]
        if ring_entries:
            cfg.ring_entries = ring_entries
        if timeout_ms:
            cfg.timeout_ms = timeout_ms
        if bcache is not None:
            cfg.cache_dir = PyBytes_AS_STRING(bcache)
        if bnvrtc is not None:
            cfg.nvrtc_path = PyBytes_AS_STRING(bnvrtc)
        with nogil:
            rc = fr_store_open(&cfg, &self.s, err, sizeof(err))
        if rc != 0:
            self.s = NULL
            raise _error(rc, err.decode(errors="replace"))
        cdef const char *name
        cdef const char *reason
        cdef const char *kernel
        with nogil:
            name = fr_store_backend(self.s)
            reason = fr_store_backend_reason(self.s)
            kernel = fr_store_kernel_source(self.s)
        self.backend = name.decode()
        self.backend_reason = reason.decode(errors="replace") if reason != NULL else ""
        self.kernel_source = kernel.decode(errors="replace") if kernel != NULL else ""
        self.path = os.fsdecode(bpath)
        self.rows = rows
        self.row_bytes = row_bytes
        self.device_id = device_id
        self._cv = threading.Condition(threading.Lock())

    def __dealloc__(self):
        if self.s != NULL:
            with nogil:
                fr_store_close(self.s)
            self.s = NULL

    @property
    def closed(self):
        return self.s == NULL

    cdef fr_store *_get(self) except NULL:
        if self.s == NULL:
            raise ValueError(f"feature store {self.path!r} is closed")
        return self.s

    cdef fr_store *_enter(self) except NULL:
        cdef fr_store *s
        with self._cv:
            s = self._get()
            self._users += 1
        return s

    cdef void _leave(self):
        with self._cv:
            self._users -= 1
            if self._users == 0:
                self._cv.notify_all()

    def close(self):
        """Refuses new gathers, cancels the device gathers running, waits for
        them to leave (the GIL released), frees the store."""
        cdef fr_store *s
        with self._cv:
            s = self.s
            self.s = NULL
            if s != NULL and self._users > 0:
                with nogil:
                    fr_store_cancel(s)
            while self._users > 0:
                self._cv.wait()
        if s != NULL:
            with nogil:
                fr_store_close(s)

    def gather_host(self, cnp.ndarray ids not None, cnp.ndarray out not None):
        """Rows ``ids`` (C-contiguous int64) into ``out`` (C-contiguous,
        writable, ``len(ids) * row_bytes`` bytes), through the host backend."""
        if ids.dtype.num != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(ids):
            raise TypeError("ids must be a C-contiguous int64 array")
        if not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out):
            raise ValueError("out must be a writable C-contiguous array")
        cdef size_t n = cnp.PyArray_SIZE(ids)
        if <uint64_t>cnp.PyArray_NBYTES(out) != n * self.row_bytes:
            raise ValueError(f"out has {cnp.PyArray_NBYTES(out)} bytes; {n} rows need "
                             f"{n * self.row_bytes}")
        cdef const int64_t *pids = <const int64_t *>cnp.PyArray_DATA(ids)
        cdef void *pout = cnp.PyArray_DATA(out)
        cdef size_t bad = 0
        cdef char err[ERRLEN]
        cdef int rc
        err[0] = 0
        cdef fr_store *s = self._enter()
        try:
            with nogil:
                rc = fr_store_gather_host(s, pids, n, pout, &bad, err, sizeof(err))
        finally:
            self._leave()
        if rc != 0:
            self._raise(rc, err, bad)

    def gather_device(self, uint64_t ids, int id_bytes, size_t n, uint64_t out,
                      uint64_t stream=0):
        """Rows to device memory: ``ids`` a device pointer to ``n`` ids of
        ``id_bytes`` (4 or 8), ``out`` a device pointer to ``n * row_bytes``
        bytes, ``stream`` a CUstream (0: the legacy default stream). Returns
        once the rows are there."""
        if id_bytes != 4 and id_bytes != 8:
            raise TypeError(f"ids must be int32 or int64, not {id_bytes}-byte integers")
        cdef size_t bad = 0
        cdef char err[ERRLEN]
        cdef int rc
        err[0] = 0
        cdef fr_store *s = self._enter()
        try:
            with nogil:
                rc = fr_store_gather_device(s, ids, id_bytes, n, out, <void *>stream, &bad,
                                            err, sizeof(err))
        finally:
            self._leave()
        if rc != 0:
            self._raise(rc, err, bad)

    cdef _raise(self, int rc, char *err, size_t bad):
        msg = err.decode(errors="replace")
        if rc == -errno.ERANGE:
            e = IndexError(msg or "row id out of range")
            e.position = bad
            raise e
        if rc == -errno.ECANCELED:
            raise OSError(errno.ECANCELED, msg or f"gather cancelled: feature store "
                                                  f"{self.path!r} was closed")
        raise _error(rc, msg)

    def stats(self):
        cdef fr_store_stats st
        cdef fr_store *s
        with self._cv:  # close() waits for it
            s = self._get()
            with nogil:
                fr_store_stats_get(s, &st)
        return st

    def route(self):
        """Where the last gather of backend "auto" ran, and why ("" before one)."""
        cdef char buf[512]
        cdef fr_store *s
        with self._cv:  # close() waits for it
            s = self._get()
            with nogil:
                fr_store_route_get(s, buf, sizeof(buf))
        return buf.decode(errors="replace")

    def memory(self):
        cdef fr_store_memory m
        cdef fr_store *s
        with self._cv:  # close() waits for it
            s = self._get()
            with nogil:
                fr_store_memory_get(s, &m)
        return m

    def device_view(self):
        """Device address of the store's fr_dev_store (0 without a device path)."""
        cdef uint64_t v
        cdef fr_store *s
        with self._cv:  # close() waits for it
            s = self._get()
            with nogil:
                v = fr_store_device_view(s)
        return v
