# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Samples in GPU memory (:class:`DeviceArray`): the CUDA array interface
and DLPack over a batch's device buffer, each capsule holding the batch
until its consumer's deleter runs (any thread, no GIL)."""
from cpython.pycapsule cimport (PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_IsValid,
                               PyCapsule_New)
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc

from fastread._cfastread cimport *
from fastread._dlpack cimport *


cdef class DeviceArray:
    """One sample in GPU memory, exposing ``__cuda_array_interface__`` and
    ``__dlpack__`` (CuPy, PyTorch, Numba and DALI take it without a copy): a
    1-D uint8 array of the sample's bytes, or a typed view of part of it
    (:meth:`view`). It keeps its batch, and so its device buffer, alive; so
    does every DLPack capsule made from it, until its consumer's deleter runs
    (from any thread, without the GIL)."""

    @staticmethod
    cdef DeviceArray wrap(uint64_t ptr, size_t nbytes, int device_id, object owner,
                          fr_batch *batch):
        cdef DeviceArray a = DeviceArray.__new__(DeviceArray)
        a.batch = batch
        a.ptr = ptr
        a.nbytes = nbytes
        a.device_id = device_id
        a.owner = owner
        a.shape = (nbytes,)
        a.typestr = "|u1"
        a.strides = None
        return a

    def view(self, size_t offset, tuple shape, str typestr, size_t itemsize):
        """A C-ordered array of `shape` and NumPy type string `typestr`
        (items of `itemsize` bytes) starting `offset` bytes in."""
        cdef size_t n = itemsize, d
        for d in shape:
            n *= d
        if offset + n > self.nbytes:
            raise ValueError(f"a {shape} {typestr} view at offset {offset} needs {offset + n} "
                             f"bytes; the sample has {self.nbytes}")
        cdef DeviceArray a = DeviceArray.wrap(self.ptr + offset, n, self.device_id, self.owner,
                                              self.batch)
        a.shape = shape
        a.typestr = typestr
        return a

    def __len__(self):
        return self.shape[0] if self.shape else 1

    @property
    def __cuda_array_interface__(self):
        # The batch's device copy finished before it was handed out: no
        # stream to wait on.
        return {"shape": self.shape, "typestr": self.typestr,
                "data": (self.ptr if self.nbytes else 0, False), "version": 3,
                "strides": self.strides, "stream": None}

    def __dlpack_device__(self):
        return (kDLCUDA, self.device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """An unversioned DLPack capsule over the same device memory. The
        batch's copy finished before it was handed out, so there is nothing
        for the consumer's ``stream`` to wait on."""
        if dl_device is not None and tuple(dl_device) != (kDLCUDA, self.device_id):
            raise BufferError(f"this array is on CUDA device {self.device_id}; "
                              f"cannot export it to {dl_device}")
        if copy:
            raise BufferError("fastread.DeviceArray exports its memory without copying only")
        return _dlpack_capsule(self)

    def __repr__(self):
        return (f"<fastread.DeviceArray {self.shape} {self.typestr} ({self.nbytes} bytes) "
                f"on GPU {self.device_id}>")


# NumPy type kinds as DLPack type codes.
cdef dict _DL_CODES = {"u": kDLUInt, "i": kDLInt, "f": kDLFloat, "c": kDLComplex, "b": kDLBool}


cdef DLDataType _dl_dtype(str typestr) except *:
    cdef DLDataType t
    t.lanes = 1
    if typestr == "|u1":  # every whole-sample array: skip the parsing
        t.code = kDLUInt
        t.bits = 8
        return t
    if len(typestr) < 3 or typestr[0] not in "|<=":
        raise BufferError(f"DLPack takes little-endian data only, not {typestr!r}")
    code = _DL_CODES.get(typestr[1])
    if code is None:
        raise BufferError(f"no DLPack type for {typestr!r}")
    t.code = code
    t.bits = 8 * int(typestr[2:])
    return t


cdef void _dlpack_release(DLManagedTensor *m) noexcept nogil:
    # Runs on the consumer's thread (DALI frees samples on its own): the
    # batch hold is native, so no GIL is taken here.
    fr_batch_recycle(<fr_batch *>m.manager_ctx)
    free(m)


cdef void _dlpack_capsule_destructor(object capsule) noexcept:
    # Only a capsule nobody consumed still carries this name; a consumer
    # renames it and calls the deleter itself.
    if PyCapsule_IsValid(capsule, b"dltensor"):
        _dlpack_release(<DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor"))


cdef object _dlpack_capsule(DeviceArray a):
    if a.owner.released:  # its Batch; a view of a released batch may hold other bytes
        raise ValueError("this batch was released")
    cdef fr_batch *b = a.batch
    cdef DLDataType dtype = _dl_dtype(a.typestr)
    cdef int ndim = len(a.shape), d
    cdef size_t item = dtype.bits // 8
    if a.strides is not None and any(s % item for s in a.strides):
        raise BufferError(f"strides {a.strides} are not whole items of {a.typestr}")
    # shape, then strides (DLPack counts them in items), after the tensor.
    cdef DLManagedTensor *m = <DLManagedTensor *>malloc(sizeof(DLManagedTensor)
                                                      + 2 * (ndim if ndim else 1) * sizeof(int64_t))
    if m == NULL:
        raise MemoryError()
    m.dl_tensor.data = <void *>a.ptr
    m.dl_tensor.device.device_type = kDLCUDA
    m.dl_tensor.device.device_id = a.device_id
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype = dtype
    m.dl_tensor.shape = <int64_t *>(<char *>m + sizeof(DLManagedTensor))
    for d in range(ndim):
        m.dl_tensor.shape[d] = a.shape[d]
    if a.strides is None:
        m.dl_tensor.strides = NULL  # C order
    else:
        m.dl_tensor.strides = m.dl_tensor.shape + ndim
        for d in range(ndim):
            m.dl_tensor.strides[d] = a.strides[d] // item
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = b
    m.deleter = _dlpack_release
    try:
        capsule = PyCapsule_New(m, b"dltensor", <PyCapsule_Destructor>_dlpack_capsule_destructor)
    except BaseException:
        free(m)
        raise
    fr_batch_retain(b)
    return capsule
