# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Batches (:class:`Batch`): samples in one arena of a pool, as NumPy views
(host) or DeviceArrays (GPU), each view keeping its batch alive; the pool
stays mapped while anything can reach it (_PoolOwner)."""
cimport numpy as cnp
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

import numpy as np

from fastread._cfastread cimport *
from fastread._device_arrays cimport DeviceArray

cnp.import_array()


cdef class _PoolOwner:
    """Holds one reference on a batch pool, so arena memory stays mapped while
    any Python object that can reach it is alive."""

    @staticmethod
    cdef _PoolOwner wrap(fr_pool *pool):
        cdef _PoolOwner o = _PoolOwner.__new__(_PoolOwner)
        fr_pool_retain(pool)
        o.pool = pool
        return o

    def __dealloc__(self):
        if self.pool != NULL:
            fr_pool_close(self.pool)
            self.pool = NULL


cdef bint _one_stride(fr_batch *b, int64_t nbytes, uint64_t *first, uint64_t *stride):
    """Whether every sample of b (count >= 1) is `nbytes` long and lies
    `stride` bytes after the one before (back to back, or one per O_DIRECT
    slot), with *first and *stride set: the layout a dense view needs."""
    cdef size_t i, n = b.count
    first[0] = b.samples[0].offset
    if n > 1 and b.samples[1].offset < first[0]:
        return False
    stride[0] = b.samples[1].offset - first[0] if n > 1 else <uint64_t>nbytes
    if stride[0] < <uint64_t>nbytes:
        return False
    for i in range(n):
        if b.samples[i].length != nbytes or b.samples[i].offset != first[0] + i * stride[0]:
            return False
    return True


cdef tuple _dense_layout(dtype, shape, int64_t *nbytes):
    # A dense view's (dtype, shape as a tuple of ints), dtype None meaning
    # uint8; *nbytes: the bytes of one sample of that shape.
    import numpy as np
    dt = np.dtype(np.uint8 if dtype is None else dtype)
    shape = tuple(int(x) for x in shape)
    nbytes[0] = dt.itemsize
    for x in shape:
        nbytes[0] *= x
    return dt, shape


cdef class Batch:
    """One batch of samples in one arena. Views made by arrays() keep it
    alive; it returns to its pool when released or collected."""

    @staticmethod
    cdef Batch wrap(fr_batch *b, _PoolOwner owner):
        cdef Batch self = Batch.__new__(Batch)
        self.b = b
        self.owner = owner
        return self

    def __dealloc__(self):
        if self.b != NULL:
            fr_batch_recycle(self.b)
            self.b = NULL

    def release(self):
        """Hands the arena back for reuse now. Views made earlier stay mapped,
        but their bytes may be overwritten by later batches."""
        if self.b != NULL:
            fr_batch_recycle(self.b)
            self.b = NULL
        self.released = True

    cdef fr_batch *_get(self) except NULL:
        if self.b == NULL:
            raise ValueError("this batch was released")
        return self.b

    def __len__(self):
        return self._get().count

    @property
    def status(self):
        return self._get().status

    @property
    def nbytes(self):
        """Bytes of sample data (not counting alignment padding)."""
        cdef fr_batch *b = self._get()
        cdef size_t i, total = 0
        for i in range(b.count):
            if b.samples[i].length > 0:
                total += <size_t>b.samples[i].length
        return total

    @property
    def arena_capacity(self):
        return self._get().arena.capacity

    @property
    def on_device(self):
        """True when the samples are (also) in GPU memory."""
        return bool(self._get().where & FR_ON_DEVICE)

    @property
    def on_host(self):
        return bool(self._get().where & FR_ON_HOST)

    @property
    def device_ptr(self):
        """Address of the batch's device buffer (0 if none)."""
        return self._get().device.ptr

    def device_arrays(self, int device_id=0):
        """One DeviceArray per sample, in batch order, over the batch's device
        buffer (device output only). Failed samples appear empty."""
        cdef fr_batch *b = self._get()
        if not (b.where & FR_ON_DEVICE):
            raise ValueError("this batch is in host memory only (read it with device output)")
        cdef list out = []
        cdef size_t i
        cdef int64_t n
        for i in range(b.count):
            n = b.samples[i].length
            out.append(DeviceArray.wrap(b.device.ptr + b.samples[i].offset,
                                        <size_t>n if n > 0 else 0, device_id, self, b))
        return out

    def indices(self):
        """The dataset indices of a reader's batch, as an int64 array."""
        cdef fr_batch *b = self._get()
        cdef cnp.ndarray[cnp.int64_t, ndim=1] out = cnp.PyArray_EMPTY(1, [<cnp.npy_intp>b.count], cnp.NPY_INT64, 0)
        cdef size_t i
        for i in range(b.count):
            out[i] = b.indices[i]
        return out

    def failures(self):
        """[(position, errno)] for every sample that failed."""
        cdef fr_batch *b = self._get()
        cdef size_t i
        out = []
        for i in range(b.count):
            if b.samples[i].length < 0:
                out.append((i, <int>-b.samples[i].length))
        return out

    def lengths(self):
        cdef fr_batch *b = self._get()
        cdef cnp.ndarray[cnp.int64_t, ndim=1] out = cnp.PyArray_EMPTY(1, [<cnp.npy_intp>b.count], cnp.NPY_INT64, 0)
        cdef size_t i
        for i in range(b.count):
            out[i] = b.samples[i].length
        return out

    def has_labels(self):
        """True when the engine read a label per sample (a cql label column)."""
        return self._get().label_count == self._get().count

    def label_ints(self):
        """The labels an engine read, as int32 (4-byte big-endian CQL ints;
        a null label reads -1). ValueError when it read none or one is not
        4 bytes."""
        cdef fr_batch *b = self._get()
        if b.label_count != b.count:
            raise ValueError("this batch has no labels from its engine")
        cdef cnp.ndarray[cnp.int32_t, ndim=1] out = cnp.PyArray_EMPTY(1, [<cnp.npy_intp>b.count], cnp.NPY_INT32, 0)
        cdef size_t i
        cdef const uint8_t *p
        for i in range(b.count):
            if b.labels[i].length < 0:
                out[i] = -1
                continue
            if b.labels[i].length != 4:
                raise ValueError(f"label {i} has {b.labels[i].length} bytes, not 4 (an int)")
            p = b.label_bytes + b.labels[i].offset
            out[i] = <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) |
                               (<uint32_t>p[2] << 8) | p[3])
        return out

    def label_blobs(self):
        """The labels an engine read, as a list of uint8 arrays (copies; a
        null label is empty)."""
        cdef fr_batch *b = self._get()
        if b.label_count != b.count:
            raise ValueError("this batch has no labels from its engine")
        cdef list out = []
        cdef size_t i
        for i in range(b.count):
            if b.labels[i].length <= 0:
                out.append(np.empty(0, np.uint8))
            else:
                out.append(np.frombuffer(
                    (<char *>b.label_bytes)[b.labels[i].offset:
                                            b.labels[i].offset + <size_t>b.labels[i].length],
                    np.uint8).copy())
        return out

    def arrays(self):
        """A list of 1-D uint8 views, one per sample, in batch order. Failed
        samples must be checked with failures() first; they appear empty."""
        cdef fr_batch *b = self._get()
        if not (b.where & FR_ON_HOST):
            raise ValueError("this batch is in GPU memory only: use device_arrays()")
        # The list made at its final length, filled in place: no appends
        # growing it (which reallocates it several times for 256 arrays).
        cdef list out = PyList_New(<Py_ssize_t>b.count)
        cdef size_t i
        cdef cnp.npy_intp dim
        cdef object arr
        for i in range(b.count):
            dim = b.samples[i].length if b.samples[i].length > 0 else 0
            arr = cnp.PyArray_SimpleNewFromData(1, &dim, cnp.NPY_UINT8,
                                                b.arena.base + b.samples[i].offset)
            Py_INCREF(self)
            cnp.PyArray_SetBaseObject(<cnp.ndarray>arr, self)
            Py_INCREF(arr)  # the list's reference (PyList_SET_ITEM steals one)
            PyList_SET_ITEM(out, <Py_ssize_t>i, arr)
        return out

    def packed(self):
        """``(data, offsets)`` where the samples lie back to back in the
        arena (a dense read, ``Context.read(dense=True)``, of an engine that
        lays files out itself, with no failed sample): ``data`` a 1-D uint8
        view over them, no copy, keeping the batch alive; ``offsets`` int64,
        ``len(batch) + 1`` of them, sample i being
        ``data[offsets[i]:offsets[i + 1]]`` (an Arrow binary column's
        buffers). None where they do not (padding between samples, a failed
        sample)."""
        import numpy as np

        cdef fr_batch *b = self._get()
        if not (b.where & FR_ON_HOST):
            raise ValueError("this batch is in GPU memory only")
        cdef size_t i, n = b.count
        cdef cnp.ndarray[cnp.int64_t, ndim=1] offsets = cnp.PyArray_ZEROS(
            1, [<cnp.npy_intp>(n + 1)], cnp.NPY_INT64, 0)
        if n == 0:
            return np.empty(0, np.uint8), offsets
        cdef uint64_t first = b.samples[0].offset, at = first
        for i in range(n):
            if b.samples[i].length < 0 or (b.samples[i].length > 0 and b.samples[i].offset != at):
                return None
            at += <uint64_t>b.samples[i].length
            offsets[i + 1] = <int64_t>(at - first)
        cdef cnp.npy_intp dim = <cnp.npy_intp>(at - first)
        data = cnp.PyArray_SimpleNewFromData(1, &dim, cnp.NPY_UINT8, b.arena.base + first)
        Py_INCREF(self)
        cnp.PyArray_SetBaseObject(<cnp.ndarray>data, self)
        return data, offsets

    def dense_view(self, shape, dtype=None):
        """The batch as one array ``(len(batch),) + shape`` of ``dtype``
        (default uint8) over the arena, without a copy, or None where the
        samples do not lie one per fixed stride (a sample failed or has
        another size; object-cache hits and misses mixed). Dense batches
        (``NativeReader.set_dense``) give a C-contiguous array; O_DIRECT
        reads keep each sample in its aligned slot, so the array is strided
        by the slot then (each sample still contiguous). The array keeps
        the batch alive."""
        import numpy as np

        cdef fr_batch *b = self._get()
        if not (b.where & FR_ON_HOST):
            raise ValueError("this batch is in GPU memory only")
        cdef int64_t nbytes
        dt, shape = _dense_layout(dtype, shape, &nbytes)
        cdef size_t n = b.count
        if n == 0:
            return np.empty((0,) + shape, dt)
        cdef uint64_t first = 0, stride = 0
        if not _one_stride(b, nbytes, &first, &stride) or stride % dt.itemsize or \
                first % dt.alignment:
            return None
        cdef cnp.npy_intp dim = <cnp.npy_intp>(stride * (n - 1) + <uint64_t>nbytes)
        flat = cnp.PyArray_SimpleNewFromData(1, &dim, cnp.NPY_UINT8, b.arena.base + first)
        Py_INCREF(self)
        cnp.PyArray_SetBaseObject(<cnp.ndarray>flat, self)
        if stride == <uint64_t>nbytes:
            return flat.view(dt).reshape((n,) + shape)
        # Each sample C-ordered, `stride` bytes after the one before.
        return np.lib.stride_tricks.as_strided(flat.view(dt), shape=(n,) + shape,
                                               strides=(<Py_ssize_t>stride,) +
                                               np.empty(shape, dt).strides)

    def dense_device_view(self, shape, dtype=None, int device_id=0):
        """:meth:`dense_view` over the batch's device buffer (device output
        only): one :class:`DeviceArray` ``(len(batch),) + shape``, strided
        by the slot where the samples are not back to back (O_DIRECT), or
        None where they do not lie one per fixed stride."""
        import numpy as np

        cdef fr_batch *b = self._get()
        if not (b.where & FR_ON_DEVICE):
            raise ValueError("this batch is in host memory only (read it with device output)")
        cdef int64_t nbytes
        dt, shape = _dense_layout(dtype, shape, &nbytes)
        cdef size_t n = b.count
        if n == 0:
            return None
        cdef uint64_t first = 0, stride = 0
        if not _one_stride(b, nbytes, &first, &stride) or stride % dt.itemsize:
            return None
        cdef DeviceArray out = DeviceArray.wrap(b.device.ptr + first,
                                                <size_t>(stride * (n - 1) + <uint64_t>nbytes),
                                                device_id, self, b)
        out.shape = (n,) + shape
        out.typestr = dt.str
        if stride != <uint64_t>nbytes:
            out.strides = (<Py_ssize_t>stride,) + np.empty(shape, dt).strides
        return out

    @property
    def dense(self):
        """Whether the batch was laid out back to back (fr_batch.dense)."""
        return bool(self._get().dense)
