# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The binding to the C core: contexts, readers and batches.

Only adaptation happens here. Every native call that does I/O or waits runs
with the GIL released; results come back as NumPy views over engine-owned
arenas, each view keeping its batch alive.
"""
import os

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.pycapsule cimport (PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_IsValid,
                               PyCapsule_New)
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.errno cimport ENOMEM
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memchr

from fastread._cfastread cimport *
from fastread._dlpack cimport *
from fastread.errors import ReadError

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


def gpu_probe(int device=0):
    """(True, "") if CUDA device `device` is usable through the driver, else
    (False, why). Loads the driver only for the question."""
    cdef char why[256]
    why[0] = 0
    cdef int rc
    with nogil:
        rc = fr_gpu_probe(device, why, sizeof(why))
    return (rc == 0, why.decode(errors="replace"))


cdef str _gpu_error(fr_gpu *gpu):
    """The GPU's last CUDA/cuFile error, as a suffix for a message."""
    cdef char msg[256]
    if gpu == NULL:
        return ""
    msg[0] = 0
    fr_gpu_last_error(gpu, msg, sizeof(msg))
    return f" ({msg.decode(errors='replace')})" if msg[0] else ""


cdef class DeviceArray:
    """One sample in GPU memory, exposing ``__cuda_array_interface__`` and
    ``__dlpack__`` (CuPy, PyTorch, Numba and DALI take it without a copy): a
    1-D uint8 array of the sample's bytes, or a typed view of part of it
    (:meth:`view`). It keeps its batch, and so its device buffer, alive; so
    does every DLPack capsule made from it, until its consumer's deleter runs
    (from any thread, without the GIL)."""
    cdef readonly uint64_t ptr
    cdef readonly size_t nbytes
    cdef readonly int device_id
    cdef readonly tuple shape
    cdef readonly str typestr
    cdef object owner

    @staticmethod
    cdef DeviceArray wrap(uint64_t ptr, size_t nbytes, int device_id, object owner):
        cdef DeviceArray a = DeviceArray.__new__(DeviceArray)
        a.ptr = ptr
        a.nbytes = nbytes
        a.device_id = device_id
        a.owner = owner
        a.shape = (nbytes,)
        a.typestr = "|u1"
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
        cdef DeviceArray a = DeviceArray.wrap(self.ptr + offset, n, self.device_id, self.owner)
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
                "strides": None, "stream": None}

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


cdef class _PoolOwner:
    """Holds one reference on a batch pool, so arena memory stays mapped while
    any Python object that can reach it is alive."""
    cdef fr_pool *pool

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


cdef class Batch:
    """One batch of samples in one arena. Views made by arrays() keep it
    alive; it returns to its pool when released or collected."""
    cdef fr_batch *b
    cdef _PoolOwner owner
    cdef readonly bint released

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
                                        <size_t>n if n > 0 else 0, device_id, self))
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


cdef bytes _cache_config(fr_config *cfg, object cache_dir, object cache_bytes):
    """Sets the object cache of cfg (fr_config.cache_dir, cache_bytes);
    returns the bytes cfg.cache_dir points into (keep them alive until the
    C call that copies them)."""
    if cache_bytes is None:
        cache_bytes = 0
    if not isinstance(cache_bytes, int) or cache_bytes < 0 or cache_bytes >= 1 << 63:
        raise ValueError(f"cache_bytes must be an integer >= 0 (0: no limit), got {cache_bytes!r}")
    cfg.cache_bytes = cache_bytes
    if cache_dir is None or cache_dir == "":
        cfg.cache_dir = NULL
        return None
    cdef bytes b = os.fsencode(cache_dir)
    cfg.cache_dir = PyBytes_AS_STRING(b)
    return b


cdef void _init_config(fr_config *cfg, bytes engine, unsigned queue_depth, unsigned threads,
                       bint o_direct, unsigned direct_alignment, bint register_buffers,
                       bint register_files, bytes engine_args, int device_id,
                       bint pin_memory, bint device_output, unsigned spin_us,
                       int auto_engine):
    fr_config_init(cfg)
    cfg.spin_us = spin_us
    cfg.auto_engine = auto_engine
    cfg.engine = PyBytes_AS_STRING(engine)
    cfg.queue_depth = queue_depth
    cfg.threads = threads
    cfg.o_direct = o_direct
    cfg.direct_alignment = direct_alignment
    cfg.register_buffers = register_buffers
    cfg.register_files = register_files
    cfg.engine_args = PyBytes_AS_STRING(engine_args)
    cfg.device_id = device_id
    cfg.pin_memory = pin_memory
    cfg.device_output = device_output


cdef extern from "Python.h":
    # Not declared by Cython's cpython.unicode; a new reference, NULL on error.
    bytes PyUnicode_EncodeFSDefault(object unicode)
    bint PyUnicode_IS_COMPACT_ASCII(object unicode)
    void *PyUnicode_DATA(object unicode)
    Py_ssize_t PyUnicode_GET_LENGTH(object unicode)


cdef bytes _engine_name(engine):
    # A str subclass too (fastread.engine.AutoEngine, what engine="auto" resolves to).
    if not isinstance(engine, str):
        raise TypeError(f"engine must be a str, got {type(engine).__name__}")
    return str(engine).encode()


cdef bytes _encode_path(p):
    # str and bytes directly (PyUnicode_EncodeFSDefault is what os.fsencode
    # ends in: the file system encoding with surrogateescape); os.fsencode's
    # Python-level dispatch cost ~1 us a path, a sixth of reading a 4 KiB
    # file. Anything else (PathLike) goes through os.fsencode.
    cdef bytes b
    if type(p) is str:
        b = PyUnicode_EncodeFSDefault(p)
    elif type(p) is bytes:
        b = p
    else:
        b = os.fsencode(p)
    if memchr(PyBytes_AS_STRING(b), 0, <size_t>PyBytes_GET_SIZE(b)) != NULL:
        raise ValueError(f"path contains a NUL byte: {p!r}")
    return b


cdef _raise_errno(int rc, str what):
    raise OSError(-rc, f"{what}: {os.strerror(-rc)}")


cdef fr_range *_make_ranges(offsets, lengths, size_t *count) except NULL:
    """A malloc'ed fr_range array from two equal-length integer sequences."""
    cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] off = \
        cnp.PyArray_FROMANY(offsets, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
    cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] ln = \
        cnp.PyArray_FROMANY(lengths, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
    cdef size_t n = off.shape[0], i
    if <size_t>ln.shape[0] != n:
        raise ValueError(f"{n} offsets but {ln.shape[0]} lengths")
    cdef const int64_t *po = <const int64_t *>off.data
    cdef const int64_t *pl = <const int64_t *>ln.data
    for i in range(n):
        if po[i] < 0 or pl[i] < 0:
            raise ValueError(f"range {i}: offset {po[i]} and length {pl[i]} must be >= 0")
    cdef fr_range *r = <fr_range *>malloc((n if n else 1) * sizeof(fr_range))
    if r == NULL:
        raise MemoryError()
    for i in range(n):
        r[i].offset = <uint64_t>po[i]
        r[i].length = <uint64_t>pl[i]
    count[0] = n
    return r


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
    cdef fr_batch *b = (<Batch>a.owner)._get()
    cdef DLDataType dtype = _dl_dtype(a.typestr)
    cdef int ndim = len(a.shape), d
    cdef DLManagedTensor *m = <DLManagedTensor *>malloc(sizeof(DLManagedTensor)
                                                      + (ndim if ndim else 1) * sizeof(int64_t))
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
    m.dl_tensor.strides = NULL  # C order
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



cdef class Context:
    """One engine instance. Not for concurrent use: calls from several Python
    threads are serialized by a lock."""
    cdef fr_ctx *ctx
    cdef _PoolOwner owner
    cdef object lock
    cdef readonly str engine

    cdef readonly int device_id
    cdef readonly bint device_output

    def __cinit__(self, object engine="io_uring", unsigned queue_depth=64, unsigned threads=4,
                  bint o_direct=False, unsigned direct_alignment=4096,
                  bint register_buffers=True, bint register_files=True,
                  str engine_args="", int device_id=-1, bint pin_memory=False,
                  bint device_output=False, unsigned spin_us=50, int auto_engine=0,
                  remember_sizes=None, cache_dir=None, cache_bytes=0):
        import threading
        cdef fr_config cfg
        cdef char err[256]
        err[0] = 0
        cdef bytes eng = _engine_name(engine)
        cdef bytes args = engine_args.encode()
        _init_config(&cfg, eng, queue_depth, threads, o_direct, direct_alignment,
                     register_buffers, register_files, args, device_id, pin_memory,
                     device_output, spin_us, auto_engine)
        if remember_sizes is not None:
            # Paths whose sizes read() without ``sizes`` remembers for the
            # next read of them (fr_config.remember_sizes); 0: none.
            if not 0 <= remember_sizes <= 1 << 30:
                raise ValueError(f"remember_sizes must be in 0..2**30, got {remember_sizes!r}")
            cfg.remember_sizes = remember_sizes
        # Kept alive until fr_ctx_open has copied it.
        cdef bytes cache_b = _cache_config(&cfg, cache_dir, cache_bytes)
        cdef int rc
        with nogil:
            rc = fr_ctx_open(&cfg, &self.ctx, err, sizeof(err))
        if rc != 0:
            msg = err.decode(errors="replace") or os.strerror(-rc)
            if rc == -22:
                raise ValueError(f"engine {engine!r}: {msg}")
            raise OSError(-rc, f"engine {engine!r}: {msg}")
        cdef fr_pool *pool = fr_pool_new()
        if pool == NULL:
            fr_ctx_close(self.ctx)
            self.ctx = NULL
            raise MemoryError()
        if pin_memory and fr_ctx_gpu(self.ctx) != NULL:
            fr_pool_set_gpu(pool, fr_ctx_gpu(self.ctx), 1)
        self.owner = _PoolOwner.wrap(pool)
        fr_pool_close(pool)  # the owner object now holds the only reference
        self.lock = threading.Lock()
        self.engine = str(engine)
        self.device_id = device_id
        self.device_output = device_output

    def __dealloc__(self):
        # The context goes first: its ring unregisters arenas that the pool
        # may free afterwards.
        if self.ctx != NULL:
            fr_ctx_close(self.ctx)
            self.ctx = NULL

    def close(self):
        with self.lock:
            if self.ctx != NULL:
                fr_ctx_close(self.ctx)
                self.ctx = NULL

    cdef fr_batch *_take_batch(self, size_t n) except NULL:
        """A batch from the pool, ready for n samples (its status holds a
        preparation error). Call with the lock held."""
        if self.ctx == NULL:
            raise ValueError("context is closed")
        cdef fr_batch *b = fr_pool_get(self.owner.pool)
        if b == NULL:
            raise MemoryError()
        b.status = fr_batch_prepare(b, n)
        return b

    def stat(self, str key):
        if self.ctx == NULL:
            raise ValueError("context is closed")
        return fr_ctx_stat(self.ctx, key.encode())

    def stats(self):
        """The object cache's counters (cache_dir; fr_ctx_stat's cache_*
        keys) and the s3 engine's requests and bytes, where the context has
        them: a dict of the keys it knows."""
        if self.ctx == NULL:
            raise ValueError("context is closed")
        out = {}
        for key in STAT_KEYS + ("cache_usage",):
            v = fr_ctx_stat(self.ctx, key.encode())
            if v >= 0:
                out[key] = v
        return out

    def pool_batches(self):
        return fr_pool_batches(self.owner.pool)

    def sample_error(self, size_t i):
        """Why sample ``i`` of this context's last read failed, in the
        engine's words beyond its errno (s3: the URL, the HTTP status and
        S3's error code), or None when the engine says nothing more."""
        if self.ctx == NULL:
            raise ValueError("context is closed")
        cdef char msg[256]  # FR_ERRLEN
        cdef int found
        with self.lock:
            found = fr_ctx_sample_error(self.ctx, i, msg, sizeof(msg))
        return msg.decode(errors="replace") if found else None

    def read(self, paths, sizes=None):
        """Reads every path; returns a Batch (check failures()). ``sizes``,
        if given, are the files' sizes when last read (-1: unknown): they let
        an engine skip sizing; a wrong one costs time, never bytes."""
        # Our own list: its items stay alive while the GIL is released,
        # whatever the caller does to theirs.
        cdef list items = list(paths)
        cdef size_t n = len(items), i
        cdef list encoded = []  # bytes made for items that are not ASCII str
        cdef object p
        cdef const char *c
        cdef bytes enc
        cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] hints
        cdef const int64_t *hint_ptr = NULL
        if sizes is not None:
            hints = cnp.PyArray_FROMANY(sizes, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
            if hints.shape[0] != <cnp.npy_intp>n:
                raise ValueError(f"sizes has {hints.shape[0]} entries for {n} paths")
            hint_ptr = <const int64_t *>hints.data
        cdef const char **cpaths = <const char **>malloc((n if n else 1) * sizeof(char *))
        if cpaths == NULL:
            raise MemoryError()
        cdef fr_batch *b = NULL
        cdef int rc
        try:
            for i in range(n):
                p = items[i]
                if type(p) is str and PyUnicode_IS_COMPACT_ASCII(p):
                    # An ASCII str is its own file system encoding (every
                    # encoding Python runs with on POSIX is ASCII-compatible)
                    # and holds a NUL-terminated copy: passed as it is. Encoding
                    # cost ~100 ns a path, a fifth of a 64-file call's Python
                    # time on the 2-core VM.
                    c = <const char *>PyUnicode_DATA(p)
                    if memchr(c, 0, <size_t>PyUnicode_GET_LENGTH(p)) != NULL:
                        raise ValueError(f"path contains a NUL byte: {p!r}")
                    cpaths[i] = c
                else:
                    enc = _encode_path(p)
                    encoded.append(enc)
                    cpaths[i] = PyBytes_AS_STRING(enc)
            with self.lock:
                b = self._take_batch(n)
                rc = b.status
                if rc == 0:
                    with nogil:
                        rc = fr_read_files(self.ctx, cpaths, hint_ptr, n, b)
            if rc != 0:
                fr_batch_recycle(b)
                _raise_errno(rc, f"engine {self.engine!r} failed a batch of {n} files"
                             + _gpu_error(fr_ctx_gpu(self.ctx)))
            return Batch.wrap(b, self.owner)
        finally:
            free(cpaths)

    def read_ranges(self, path, offsets, lengths):
        """Reads byte ranges ``[offsets[i], offsets[i] + lengths[i])`` of one
        file or block device (opened once and cached by the context) as the
        samples of a Batch, each with its true length (check failures()).
        With ``o_direct`` the offsets must be multiples of direct_alignment."""
        cdef bytes p = _encode_path(path)
        cdef const char *cpath = PyBytes_AS_STRING(p)
        cdef size_t n = 0
        cdef fr_range *ranges = _make_ranges(offsets, lengths, &n)
        cdef fr_batch *b = NULL
        cdef int rc
        try:
            with self.lock:
                b = self._take_batch(n)
                rc = b.status
                if rc == 0:
                    with nogil:
                        rc = fr_read_ranges(self.ctx, cpath, ranges, n, b)
            if rc != 0:
                fr_batch_recycle(b)
                if rc == -95:  # EOPNOTSUPP
                    raise ValueError(f"engine {self.engine!r} cannot read ranges")
                _raise_errno(rc, f"engine {self.engine!r} failed a batch of {n} ranges of {path}"
                             + _gpu_error(fr_ctx_gpu(self.ctx)))
            return Batch.wrap(b, self.owner)
        finally:
            free(ranges)


#: The counters a NativeReader sums over its workers (fr_reader_stat) and
#: Context.stats() reports: the object cache's and the s3 engine's.
STAT_KEYS = ("cache_hits", "cache_misses", "cache_damaged", "cache_bytes_written",
             "cache_write_errors", "cache_evictions", "cache_waits", "s3_requests", "s3_bytes",
             "file_calls")


cdef class NativeReader:
    """Native threads reading submitted batches of dataset indices ahead,
    delivered in submission order.

    Samples are files (``paths``), or, with ``image=``, byte ranges
    ``(offsets[i], lengths[i])`` of one packed image or block device (then
    ``paths`` is ignored and may be None)."""
    cdef fr_reader *rd
    cdef _PoolOwner owner
    cdef readonly str engine
    cdef readonly size_t size
    cdef readonly unsigned long long taken  # next() calls that took a batch (or an error)

    cdef readonly int device_id
    cdef readonly bint device_output

    def __cinit__(self, paths, object engine="io_uring", unsigned queue_depth=64, unsigned threads=4,
                  bint o_direct=False, unsigned direct_alignment=4096,
                  bint register_buffers=True, bint register_files=True,
                  str engine_args="", int device_id=-1, bint pin_memory=False,
                  bint device_output=False, unsigned spin_us=50, int auto_engine=0,
                  unsigned prefetch=2,
                  unsigned workers=1, image=None, offsets=None, lengths=None,
                  cache_dir=None, cache_bytes=0):
        cdef list encoded = [] if image is not None else [_encode_path(p) for p in paths]
        cdef size_t n = len(encoded), i
        cdef bytes image_b = _encode_path(image) if image is not None else None
        cdef const char *cimage = PyBytes_AS_STRING(image_b) if image is not None else NULL
        cdef fr_range *ranges = NULL
        if image is not None:
            if offsets is None or lengths is None:
                raise ValueError("a range reader needs offsets= and lengths=")
            ranges = _make_ranges(offsets, lengths, &n)
        cdef const char **cpaths = <const char **>malloc((n if n else 1) * sizeof(char *))
        if cpaths == NULL:
            free(ranges)
            raise MemoryError()
        cdef fr_config cfg
        cdef char err[256]
        err[0] = 0
        cdef bytes eng = _engine_name(engine)
        cdef bytes args = engine_args.encode()
        cdef int rc
        cdef bytes cache_b
        try:
            _init_config(&cfg, eng, queue_depth, threads, o_direct, direct_alignment,
                         register_buffers, register_files, args, device_id, pin_memory,
                         device_output, spin_us, auto_engine)
            cache_b = _cache_config(&cfg, cache_dir, cache_bytes)
            if ranges != NULL:
                with nogil:
                    rc = fr_reader_open_ranges(&cfg, cimage, ranges, n, prefetch, workers,
                                               &self.rd, err, sizeof(err))
            else:
                for i in range(n):
                    cpaths[i] = PyBytes_AS_STRING(encoded[i])
                with nogil:
                    rc = fr_reader_open(&cfg, cpaths, n, prefetch, workers, &self.rd, err,
                                        sizeof(err))
        finally:
            free(cpaths)
            free(ranges)
        if rc != 0:
            msg = err.decode(errors="replace") or os.strerror(-rc)
            if rc == -22:
                raise ValueError(f"engine {engine!r}: {msg}")
            raise OSError(-rc, f"engine {engine!r}: {msg}")
        self.owner = _PoolOwner.wrap(fr_reader_pool(self.rd))
        self.engine = str(engine)
        self.size = n
        self.device_id = device_id
        self.device_output = device_output

    def __dealloc__(self):
        self._close()

    cdef void _close(self) noexcept:
        if self.rd != NULL:
            with nogil:
                fr_reader_close(self.rd)
            self.rd = NULL

    cdef fr_reader *_get(self) except NULL:
        if self.rd == NULL:
            raise ValueError("reader is closed")
        return self.rd

    def close(self):
        self._close()

    def submit(self, indices):
        cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] idx = \
            cnp.PyArray_FROMANY(indices, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
        cdef fr_reader *rd = self._get()
        cdef int rc = fr_reader_submit(rd, <const int64_t *>idx.data, idx.shape[0])
        if rc == -22:
            raise IndexError(f"sample index out of range 0..{self.size - 1}")
        if rc != 0:
            _raise_errno(rc, "cannot queue a batch")

    def next(self):
        """The oldest submitted batch, waiting for it with the GIL released;
        None when nothing is queued. Signals are handled while it waits (a
        KeyboardInterrupt leaves the batch queued: ``taken`` counts the
        batches this call and earlier ones took)."""
        cdef fr_reader *rd = self._get()
        cdef fr_batch *b = NULL
        cdef int rc
        while True:
            with nogil:
                rc = fr_reader_next_timed(rd, &b, 100)
            if rc != -110:  # ETIMEDOUT
                break
            PyErr_CheckSignals()  # raises what a signal handler raised
            rd = self._get()  # a handler may have closed the reader
        self.taken += 1
        if rc == -61:  # ENODATA
            return None
        if rc != 0:
            _raise_errno(rc, f"reader thread ({self.engine}) stopped")
        if b.status != 0:
            rc = b.status
            fr_batch_recycle(b)
            _raise_errno(rc, f"engine {self.engine!r} failed a batch"
                         + _gpu_error(fr_reader_gpu(rd)))
        return Batch.wrap(b, self.owner)

    def reset(self):
        fr_reader_reset(self._get())

    @property
    def pending(self):
        return fr_reader_pending(self._get())

    def path(self, size_t index):
        cdef const char *p = fr_reader_path(self._get(), index)
        if p == NULL:
            raise IndexError(index)
        return os.fsdecode(<bytes>p)

    def pool_batches(self):
        return fr_pool_batches(self.owner.pool)

    def stat(self, str key):
        """A counter summed over the workers' contexts as of their last
        batch (fr_reader_stat): -1 for a key it does not sum."""
        return fr_reader_stat(self._get(), key.encode())

    def stats(self):
        """Every counter fr_reader_stat sums (STAT_KEYS), as a dict."""
        return {key: self.stat(key) for key in STAT_KEYS}

    def pool_idle_bytes(self):
        return fr_pool_bytes(self.owner.pool)

    def pool_idle_device_bytes(self):
        return fr_pool_device_bytes(self.owner.pool)
