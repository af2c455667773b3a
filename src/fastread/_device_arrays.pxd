# DeviceArray's fields, for the modules that make them (_batch); logic in
# _device_arrays.pyx.
from libc.stdint cimport uint64_t

from fastread._cfastread cimport fr_batch


cdef class DeviceArray:
    cdef readonly uint64_t ptr
    cdef readonly size_t nbytes
    cdef readonly int device_id
    cdef readonly tuple shape
    cdef readonly str typestr
    cdef readonly tuple strides  # bytes per step of each dimension; None: C order
    cdef object owner  # the Batch, kept alive; its `released` is checked before export
    cdef fr_batch *batch

    @staticmethod
    cdef DeviceArray wrap(uint64_t ptr, size_t nbytes, int device_id, object owner,
                          fr_batch *batch)
