# Batch's and _PoolOwner's fields, for the modules that make them
# (_context, _native_reader); logic in _batch.pyx.
from fastread._cfastread cimport fr_batch, fr_pool


cdef class _PoolOwner:
    cdef fr_pool *pool

    @staticmethod
    cdef _PoolOwner wrap(fr_pool *pool)


cdef class Batch:
    cdef fr_batch *b
    cdef _PoolOwner owner
    cdef readonly bint released

    @staticmethod
    cdef Batch wrap(fr_batch *b, _PoolOwner owner)

    cdef fr_batch *_get(self) except NULL
