# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The optional Parquet shim (parquet_native/pq_native.h): a column chunk of
binary values decoded by Arrow's C++ Parquet library with the GIL released,
each value given as (begin, length) into the chunk's own bytes where Arrow's
decoder points into them (uncompressed PLAIN pages), else copied into one
side buffer. Built only where pyarrow's headers were found at build time;
fastread.formats._parquet_native says whether it is used here and why not."""
cimport numpy as cnp
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t, uint8_t

import errno

import numpy as np

from fastread._cparquet_native cimport *

cnp.import_array()

#: The Arrow C++ version this module was compiled against.
ARROW_VERSION = fr_pqn_arrow_version().decode()

cdef enum:
    ERRLEN = 512


cdef object _raise(int rc, const char *err, str what):
    msg = f"{what}: {err.decode('utf-8', 'replace')}"
    if rc == -errno.EOPNOTSUPP:
        raise NotImplementedError(msg)
    if rc == -errno.ENOMEM:
        raise MemoryError(msg)
    if rc == -errno.EINVAL:
        raise ValueError(msg)
    raise OSError(-rc, msg)


cdef class _Side:
    """Owns the side buffer the shim malloc'd: the base of its NumPy view."""
    cdef uint8_t *p

    def __dealloc__(self):
        if self.p != NULL:
            fr_pqn_free(self.p)
            self.p = NULL


cdef class Footer:
    """One file's footer parsed by Arrow (the Thrift bytes, without the
    trailing length and magic); read-only, shared by threads."""
    cdef fr_pqn_footer *f

    def __cinit__(self, const uint8_t[::1] thrift):
        cdef char err[ERRLEN]
        cdef int rc
        err[0] = 0
        with nogil:
            rc = fr_pqn_footer_open(&thrift[0] if thrift.shape[0] else NULL,
                                    <size_t>thrift.shape[0], &self.f, err, ERRLEN)
        if rc:
            _raise(rc, err, "Arrow cannot parse the footer")

    def __dealloc__(self):
        if self.f != NULL:
            fr_pqn_footer_close(self.f)
            self.f = NULL

    def chunk_info(self, int group, int column):
        """(values, compressed) of a leaf's column chunk; NotImplementedError
        saying why the shim does not read it."""
        cdef char err[ERRLEN]
        cdef int64_t values = 0
        cdef int compressed = 0
        err[0] = 0
        rc = fr_pqn_chunk_info(self.f, group, column, &values, &compressed, err, ERRLEN)
        if rc:
            _raise(rc, err, f"row group {group} column {column}")
        return int(values), bool(compressed)

    def read_chunk(self, int group, int column, const uint8_t[::1] chunk, int64_t rows,
                   int64_t side_hint=0):
        """(begin, length, side, copied): int64 arrays of ``rows`` entries
        (begin >= 0: offset in ``chunk``; < 0: at -(begin + 1) in ``side``;
        length -1: null), ``side`` a uint8 array or None, ``copied`` the
        values copied into it. OSError(EIO) where Arrow cannot decode it."""
        cdef char err[ERRLEN]
        cdef cnp.ndarray begin = np.empty(rows, np.int64)
        cdef cnp.ndarray length = np.empty(rows, np.int64)
        cdef uint8_t *side = NULL
        cdef int64_t side_len = 0, copied = 0
        cdef int64_t n = chunk.shape[0]
        cdef const uint8_t *data = &chunk[0] if n else NULL
        cdef int64_t *b = <int64_t *>cnp.PyArray_DATA(begin)
        cdef int64_t *l = <int64_t *>cnp.PyArray_DATA(length)
        cdef int rc
        err[0] = 0
        with nogil:
            rc = fr_pqn_read_chunk(self.f, group, column, data, n, rows, side_hint, b, l,
                                   &side, &side_len, &copied, err, ERRLEN)
        if rc:
            if side != NULL:
                fr_pqn_free(side)
            _raise(rc, err, f"row group {group} column {column}")
        if side == NULL:
            return begin, length, None, int(copied)
        cdef _Side owner = _Side.__new__(_Side)
        owner.p = side
        cdef cnp.npy_intp dim = side_len
        arr = cnp.PyArray_SimpleNewFromData(1, &dim, cnp.NPY_UINT8, side)
        Py_INCREF(owner)
        cnp.PyArray_SetBaseObject(<cnp.ndarray>arr, owner)
        return begin, length, arr, int(copied)
