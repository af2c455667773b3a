# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The binding to the C augmentation API (csrc/include/fastread_augment.h).
Only adaptation happens here (fastread.augment has the checks and the
array handling): arguments in, errors out as Python exceptions (EINVAL:
ValueError; a missing GPU or NVRTC: RuntimeError), C calls without the GIL."""
import errno
import os

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from fastread._caugment cimport *

cnp.import_array()

cdef enum:
    ERRLEN = 512

DTYPES = {"float32": FR_AUGMENT_FLOAT32, "float16": FR_AUGMENT_FLOAT16, "uint8": FR_AUGMENT_UINT8}


cdef void fill_batch(fr_augment_batch *b, uint64_t src, uint64_t src_stride, int height,
                     int width, uint64_t dst, int out_height, int out_width, str dtype,
                     cnp.ndarray boxes, cnp.ndarray flips, mean, std) except *:
    """One batch's description (the arrays checked by fastread.augment)."""
    b.src, b.src_stride, b.height, b.width = src, src_stride, height, width
    b.dst, b.out_height, b.out_width = dst, out_height, out_width
    b.dtype = DTYPES[dtype]
    b.n = <size_t>boxes.shape[0]
    b.boxes = <const int32_t *>cnp.PyArray_DATA(boxes)
    b.flips = <const uint8_t *>cnp.PyArray_DATA(flips)
    cdef int c
    for c in range(3):
        b.mean[c] = mean[c]
        b.std[c] = std[c]


def _error(int rc, str msg):
    cdef int e = -rc
    if not msg:
        msg = os.strerror(e)
    if e == errno.EINVAL:
        return ValueError(msg)
    if e == errno.ENOMEM:
        return MemoryError(msg)
    return RuntimeError(msg)


def crop_params(cnp.ndarray indices, int height, int width, uint64_t seed, uint64_t epoch,
                double scale_lo, double scale_hi, double ratio_lo, double ratio_hi, double flip):
    """(boxes (n, 4) int32, flips (n,) uint8) for the int64 C-contiguous ``indices``."""
    cdef Py_ssize_t n = indices.shape[0]
    cdef cnp.ndarray boxes = cnp.PyArray_ZEROS(2, [n, 4], cnp.NPY_INT32, 0)
    cdef cnp.ndarray flips = cnp.PyArray_ZEROS(1, [n], cnp.NPY_UINT8, 0)
    cdef fr_augment_crop c
    c.scale[0], c.scale[1], c.ratio[0], c.ratio[1], c.flip = (scale_lo, scale_hi, ratio_lo,
                                                             ratio_hi, flip)
    cdef char err[ERRLEN]
    err[0] = 0
    cdef int rc
    cdef const int64_t *ip = <const int64_t *>cnp.PyArray_DATA(indices)
    cdef int32_t *bp = <int32_t *>cnp.PyArray_DATA(boxes)
    cdef uint8_t *fp = <uint8_t *>cnp.PyArray_DATA(flips)
    with nogil:
        rc = fr_augment_crop_params(seed, epoch, ip, <size_t>n, height, width, &c, bp, fp, err,
                                    ERRLEN)
    if rc:
        raise _error(rc, err.decode(errors="replace"))
    return boxes, flips


cdef class Kernel:
    """The fused kernel loaded on one GPU (fr_augment)."""
    cdef fr_augment *aug
    cdef readonly int device_id

    def __cinit__(self, int device_id, nvrtc_path=None, cache_dir=None):
        cdef bytes bn = os.fsencode(nvrtc_path) if nvrtc_path is not None else None
        cdef bytes bc = os.fsencode(cache_dir) if cache_dir is not None else None
        cdef const char *pn = NULL
        cdef const char *pc = NULL
        if bn is not None:
            pn = bn
        if bc is not None:
            pc = bc
        cdef char err[ERRLEN]
        err[0] = 0
        cdef int rc
        self.device_id = device_id
        with nogil:
            rc = fr_augment_open(device_id, pn, pc, &self.aug, err, ERRLEN)
        if rc:
            raise _error(rc, err.decode(errors="replace"))

    def __dealloc__(self):
        if self.aug != NULL:
            fr_augment_close(self.aug)
            self.aug = NULL

    @property
    def kernel_source(self):
        return fr_augment_kernel_source(self.aug).decode()

    def run(self, uint64_t src, uint64_t src_stride, int height, int width, uint64_t dst,
            int out_height, int out_width, str dtype, cnp.ndarray boxes, cnp.ndarray flips,
            mean, std, uint64_t stream):
        """Queues the kernel; boxes (n, 4) int32 and flips (n,) uint8, C-contiguous."""
        cdef fr_augment_batch b
        fill_batch(&b, src, src_stride, height, width, dst, out_height, out_width, dtype, boxes,
                   flips, mean, std)
        b.stream = <void *>stream
        cdef char err[ERRLEN]
        err[0] = 0
        cdef int rc
        with nogil:
            rc = fr_augment_run(self.aug, &b, err, ERRLEN)
        if rc:
            raise _error(rc, err.decode(errors="replace"))


def run_host(uint64_t src, uint64_t src_stride, int height, int width, uint64_t dst,
             int out_height, int out_width, str dtype, cnp.ndarray boxes, cnp.ndarray flips,
             mean, std, unsigned threads, images, out):
    """fr_augment_run_host with the GIL released; ``images`` and ``out``
    (the arrays src and dst point into) are held for the call."""
    cdef fr_augment_batch b
    fill_batch(&b, src, src_stride, height, width, dst, out_height, out_width, dtype, boxes,
               flips, mean, std)
    b.stream = NULL
    cdef char err[ERRLEN]
    err[0] = 0
    cdef int rc
    with nogil:
        rc = fr_augment_run_host(&b, threads, err, ERRLEN)
    if rc:
        raise _error(rc, err.decode(errors="replace"))

