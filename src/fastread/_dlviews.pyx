# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""DLPack capsules over byte ranges of host arrays, released without the GIL.

A consumer that frees tensors on its own threads (DALI's executor drops the
samples of ``TensorListCPU.from_dlpack_list`` there) must take the GIL once
per sample to free a capsule NumPy made: measured on 2 cores, the WebDataset
reader's DALI worker threads spent most of their time waiting for the GIL to
drop NumPy views. The capsules made here share one allocation per call,
counted down by their deleters with an atomic and freed by the last one: no
Python runs when a consumer frees them.

The views hold no Python reference: :func:`range_views` returns them with a
:class:`ViewBlock` that holds the arrays (and through them the batches'
arena pools, so their memory stays mapped even after the reader closes)
and tells when every view has been released (``in_use``); the caller keeps
it until then. The bytes must also not be overwritten while in use
(fastread's DALI readers: a batch's arena is reused only ``ring_depth``
batches later, after DALI has dropped it).
"""
cimport numpy as cnp
from cpython.pycapsule cimport (PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_IsValid,
                               PyCapsule_New)
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint8_t
from libc.string cimport memcpy
from libc.stdlib cimport free, malloc

from fastread._dlpack cimport *

cnp.import_array()

cdef extern from *:
    """
    /* The views of one call count down one shared block; the last frees it.
       Deleters run on any thread. */
    static inline long fr_dlviews_drop(long *refs, long n) {
        return __atomic_sub_fetch(refs, n, __ATOMIC_ACQ_REL);
    }
    static inline long fr_dlviews_refs(long *refs) {
        return __atomic_load_n(refs, __ATOMIC_ACQUIRE);
    }
    """
    long fr_dlviews_drop(long *refs, long n) nogil
    long fr_dlviews_refs(long *refs) nogil


cdef struct _Block:
    long refs          # views (exported or not) not yet released, + 1 for the ViewBlock
    # then: DLManagedTensor views[count]; int64_t shapes[2 * count]


cdef void _release(DLManagedTensor *m) noexcept nogil:
    cdef _Block *block = <_Block *>m.manager_ctx
    if fr_dlviews_drop(&block.refs, 1) == 0:
        free(block)


cdef void _capsule_destructor(object capsule) noexcept:
    # Only a capsule nobody consumed still carries this name; a consumer
    # renames it and calls the deleter itself.
    if PyCapsule_IsValid(capsule, b"dltensor"):
        _release(<DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor"))


# The data pointer of empty views (a NULL data pointer is not valid DLPack
# for every consumer).
cdef unsigned char _EMPTY[8]


cdef cnp.ndarray _checked(obj, Py_ssize_t i, str fn):
    """obj if it is a C-contiguous 1-D uint8 array, else ValueError."""
    if not isinstance(obj, cnp.ndarray):
        raise ValueError(f"{fn}: item {i} is a {type(obj).__name__}, not a NumPy array")
    cdef cnp.ndarray a = obj
    if (cnp.PyArray_TYPE(a) != cnp.NPY_UINT8 or cnp.PyArray_NDIM(a) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(a)):
        raise ValueError(f"{fn}: array {i} is not a C-contiguous 1-D uint8 array "
                         f"({obj.dtype}, shape {obj.shape})")
    return a


cdef inline void _describe(DLManagedTensor *m, int ndim, int64_t *shape, uint8_t code,
                           uint8_t bits, _Block *block) noexcept:
    """A C-order host tensor over m.dl_tensor.data (set by the caller) whose
    deleter releases one reference of ``block``."""
    m.dl_tensor.device.device_type = kDLCPU
    m.dl_tensor.device.device_id = 0
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype.code = code
    m.dl_tensor.dtype.bits = bits
    m.dl_tensor.dtype.lanes = 1
    m.dl_tensor.shape = shape
    m.dl_tensor.strides = NULL  # C order
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = block
    m.deleter = _release


cdef tuple _int64_ranges(starts, ends, Py_ssize_t n, str fn):
    """``starts`` and ``ends`` as C-contiguous int64 arrays of ``n`` each;
    ValueError naming ``fn`` otherwise."""
    cdef cnp.ndarray first = cnp.PyArray_FROMANY(starts, cnp.NPY_INT64, 1, 1,
                                                 cnp.NPY_ARRAY_IN_ARRAY)
    cdef cnp.ndarray last = cnp.PyArray_FROMANY(ends, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_IN_ARRAY)
    if cnp.PyArray_DIM(first, 0) != n or cnp.PyArray_DIM(last, 0) != n:
        raise ValueError(f"{fn}: {n} arrays but {cnp.PyArray_DIM(first, 0)} starts and "
                         f"{cnp.PyArray_DIM(last, 0)} ends")
    return first, last


cdef class RangeView:
    """Bytes in host memory (a byte range, or a whole array) that DLPack consumers take
    without a copy (``__dlpack__``, once: the capsule owns the view after
    that). Made by :func:`range_views`."""
    cdef DLManagedTensor *m
    cdef readonly Py_ssize_t nbytes

    def __dealloc__(self):
        if self.m != NULL:   # never exported
            _release(self.m)
            self.m = NULL

    def __dlpack_device__(self):
        return (kDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """An unversioned DLPack capsule; a second call raises BufferError."""
        if self.m == NULL:
            raise BufferError("this RangeView was exported through DLPack already")
        capsule = PyCapsule_New(self.m, b"dltensor", <PyCapsule_Destructor>_capsule_destructor)
        self.m = NULL
        return capsule

    def __len__(self):
        return self.nbytes


cdef class ViewBlock:
    """What the views of one :func:`range_views` call need kept: the
    arrays they point into. ``in_use`` until every view is released (its
    consumer's deleter ran, or it was collected unexported)."""
    cdef _Block *block
    cdef readonly list arrays

    def __dealloc__(self):
        if self.block != NULL and fr_dlviews_drop(&self.block.refs, 1) == 0:
            free(self.block)
        self.block = NULL

    @property
    def in_use(self):
        return self.block != NULL and fr_dlviews_refs(&self.block.refs) > 1


cdef ViewBlock _new_block(Py_ssize_t slots, Py_ssize_t views, list arrays):
    """A ViewBlock holding ``arrays``, with room for ``slots`` tensors of up
    to 2 dimensions after it, and one reference per view plus its own."""
    cdef _Block *block = <_Block *>malloc(sizeof(_Block) + slots
                                          * (sizeof(DLManagedTensor) + 2 * sizeof(int64_t)))
    if block == NULL:
        raise MemoryError()
    block.refs = views + 1
    cdef ViewBlock keep
    try:
        keep = ViewBlock.__new__(ViewBlock)
    except BaseException:
        free(block)
        raise
    keep.block = block
    keep.arrays = arrays
    return keep


def range_views(list arrays, starts, ends):
    """``(views, block)``: one :class:`RangeView` per array, bytes
    ``starts[i]:ends[i]`` of ``arrays[i]`` (C-contiguous 1-D uint8 NumPy
    arrays), or an empty tensor where ``starts[i] < 0``; and the
    :class:`ViewBlock` to keep while ``block.in_use``. ``starts`` and
    ``ends`` are int64 sequences as long as ``arrays``. Raises ValueError for
    a range outside its array."""
    cdef cnp.ndarray first, last
    first, last = _int64_ranges(starts, ends, len(arrays), "range_views")
    cdef Py_ssize_t n = len(arrays), i
    cdef const int64_t *pf = <const int64_t *>first.data
    cdef const int64_t *pl = <const int64_t *>last.data
    cdef cnp.ndarray a
    for i in range(n):   # all checked first: a bad input allocates nothing
        a = _checked(arrays[i], i, "range_views")
        if pf[i] >= 0 and not (pf[i] <= pl[i] <= cnp.PyArray_DIM(a, 0)):
            raise ValueError(f"range_views: range {pf[i]}:{pl[i]} of array {i} is outside "
                             f"its {cnp.PyArray_DIM(a, 0)} bytes")
    cdef ViewBlock keep = _new_block(n if n else 1, n, list(arrays))
    cdef _Block *block = keep.block
    cdef DLManagedTensor *views = <DLManagedTensor *>(<char *>block + sizeof(_Block))
    cdef int64_t *shapes = <int64_t *>(<char *>views + n * sizeof(DLManagedTensor))
    cdef DLManagedTensor *m
    cdef RangeView v
    cdef list out = [None] * n
    for i in range(n):
        m = &views[i]
        a = arrays[i]
        if pf[i] >= 0:
            m.dl_tensor.data = <char *>cnp.PyArray_DATA(a) + pf[i]
            shapes[2 * i] = pl[i] - pf[i]
        else:
            m.dl_tensor.data = _EMPTY
            shapes[2 * i] = 0
        _describe(m, 1, &shapes[2 * i], kDLUInt, 8, block)
        try:
            v = RangeView.__new__(RangeView)
        except BaseException:
            # Views made so far release theirs when collected; drop the rest.
            if fr_dlviews_drop(&block.refs, n - i) == 0:
                free(block)
            raise
        v.m = m
        v.nbytes = shapes[2 * i]
        out[i] = v
    return out, keep


def array_view(cnp.ndarray array not None):
    """``(view, block)``: a :class:`RangeView` of the whole of ``array`` (a
    C-contiguous uint8 or int32 array of 1 or 2 dimensions; DALI's
    ``TensorListCPU(view.__dlpack__())`` makes a batch of its rows) and the
    :class:`ViewBlock` to keep while ``block.in_use``, as for
    :func:`range_views`."""
    cdef int ndim = cnp.PyArray_NDIM(array), d
    cdef int kind = cnp.PyArray_TYPE(array)
    if (kind not in (cnp.NPY_UINT8, cnp.NPY_INT32) or not 1 <= ndim <= 2
            or not cnp.PyArray_IS_C_CONTIGUOUS(array)):
        raise ValueError(f"array_view: takes a C-contiguous uint8 or int32 array of 1 or 2 "
                         f"dimensions, not {array.dtype} {(<object>array).shape}")
    cdef ViewBlock keep = _new_block(1, 1, [array])
    cdef _Block *block = keep.block
    cdef RangeView v
    cdef DLManagedTensor *m = <DLManagedTensor *>(<char *>block + sizeof(_Block))
    cdef int64_t *shape = <int64_t *>(<char *>m + sizeof(DLManagedTensor))
    for d in range(ndim):
        shape[d] = cnp.PyArray_DIM(array, d)
    m.dl_tensor.data = cnp.PyArray_DATA(array) if cnp.PyArray_SIZE(array) else <void *>_EMPTY
    if kind == cnp.NPY_UINT8:
        _describe(m, ndim, shape, kDLUInt, 8, block)
    else:
        _describe(m, ndim, shape, kDLInt, 32, block)
    try:
        v = RangeView.__new__(RangeView)
    except BaseException:
        fr_dlviews_drop(&block.refs, 1)   # the view's; the block's goes with keep
        raise
    v.m = m
    v.nbytes = cnp.PyArray_NBYTES(array)
    return v, keep


def pack_ranges(list arrays, starts, ends, cnp.ndarray out not None,
                cnp.ndarray lengths not None):
    """Copies bytes ``starts[i]:ends[i]`` of ``arrays[i]`` (nothing where
    ``starts[i] < 0``) to the start of row ``i`` of ``out`` (a C-contiguous
    2-D uint8 array with a row per array, wide enough) and its length to
    ``lengths[i]`` (a C-contiguous 1-D int32 array). The copies run without
    the GIL. Raises ValueError for a range outside its array or its row;
    the bytes past each length are left as they were."""
    cdef cnp.ndarray first, last
    first, last = _int64_ranges(starts, ends, len(arrays), "pack_ranges")
    cdef Py_ssize_t n = len(arrays), i
    if (cnp.PyArray_TYPE(out) != cnp.NPY_UINT8 or cnp.PyArray_NDIM(out) != 2
            or not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out)
            or cnp.PyArray_DIM(out, 0) != n):
        raise ValueError(f"pack_ranges: out must be a writable C-contiguous uint8 array of "
                         f"{n} rows, not {out.dtype} {(<object>out).shape}")
    if (cnp.PyArray_TYPE(lengths) != cnp.NPY_INT32 or cnp.PyArray_NDIM(lengths) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(lengths) or not cnp.PyArray_ISWRITEABLE(lengths)
            or cnp.PyArray_DIM(lengths, 0) != n):
        raise ValueError(f"pack_ranges: lengths must be a writable C-contiguous int32 array of "
                         f"{n}, not {lengths.dtype} {(<object>lengths).shape}")
    cdef const int64_t *pf = <const int64_t *>first.data
    cdef const int64_t *pl = <const int64_t *>last.data
    cdef Py_ssize_t width = cnp.PyArray_DIM(out, 1)
    cdef const unsigned char **src = <const unsigned char **>malloc(
        (n if n else 1) * sizeof(unsigned char *))
    if src == NULL:
        raise MemoryError()
    cdef cnp.ndarray a
    cdef int32_t *plen = <int32_t *>cnp.PyArray_DATA(lengths)
    cdef unsigned char *dst = <unsigned char *>cnp.PyArray_DATA(out)
    try:
        for i in range(n):
            a = _checked(arrays[i], i, "pack_ranges")
            if pf[i] < 0:
                src[i] = NULL
                continue
            if not (pf[i] <= pl[i] <= cnp.PyArray_DIM(a, 0)):
                raise ValueError(f"pack_ranges: range {pf[i]}:{pl[i]} of array {i} is outside "
                                 f"its {cnp.PyArray_DIM(a, 0)} bytes")
            if pl[i] - pf[i] > width or pl[i] - pf[i] > INT32_MAX:
                raise ValueError(f"pack_ranges: range {pf[i]}:{pl[i]} of array {i} does not fit "
                                 f"a row of {width} bytes")
            src[i] = <const unsigned char *>cnp.PyArray_DATA(a) + pf[i]
        with nogil:
            for i in range(n):
                if src[i] == NULL:
                    plen[i] = 0
                else:
                    plen[i] = <int32_t>(pl[i] - pf[i])
                    memcpy(dst + i * width, src[i], <size_t>plen[i])
    finally:
        free(src)
