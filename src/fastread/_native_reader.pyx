# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The native reader (:class:`NativeReader`): worker threads, each with its
own engine context, reading submitted batches ahead, delivered in order."""
import os

import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

from fastread._adapt cimport (cache_config, encode_path, engine_name, gpu_error, init_config,
                              path_pointers, raise_errno)
from fastread._batch cimport Batch, _PoolOwner
from fastread._cfastread cimport *

cnp.import_array()


def _tree_columns(table):
    """A PathTable's five columns as the tree reader borrows them: the blobs
    as uint8 arrays, the offsets as uint64, the ids as uint32 (views where
    they already are; the tree reader checks their values at open)."""
    return (np.ascontiguousarray(table.dirs.blob, dtype=np.uint8),
            np.ascontiguousarray(table.dirs.offsets).view(np.uint64)
            if table.dirs.offsets.dtype.itemsize == 8 else
            np.ascontiguousarray(table.dirs.offsets, dtype=np.uint64),
            np.ascontiguousarray(table.dir_ids, dtype=np.uint32),
            np.ascontiguousarray(table.names.blob, dtype=np.uint8),
            np.ascontiguousarray(table.names.offsets).view(np.uint64)
            if table.names.offsets.dtype.itemsize == 8 else
            np.ascontiguousarray(table.names.offsets, dtype=np.uint64))


def range_column(values, what):
    """``values`` as a contiguous uint64 column a range reader may borrow.
    A read-only int64/uint64 array (a memory-mapped index's column) is
    viewed, not copied; anything else is copied, so the caller changing its
    array later changes nothing read, and checked for negative values then
    (a borrowed column's bad range is that sample's error when read)."""
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{what} must be a 1-D sequence of integers")
    if not arr.flags.writeable and arr.flags.c_contiguous and arr.dtype.itemsize == 8 and \
            arr.dtype.kind in "iu" and arr.dtype.byteorder in "=<|":
        return arr.view(np.uint64)
    copy = np.array(arr, dtype=np.int64)
    if copy.size and copy.min() < 0:
        i = int(copy.argmin())
        raise ValueError(f"range {i}: {what} {int(copy[i])} must be >= 0")
    return copy.view(np.uint64)


cdef class NativeReader:
    """Native threads reading submitted batches of dataset indices ahead,
    delivered in submission order.

    Samples are files (``paths``), or, with ``image=``, byte ranges
    ``(offsets[i], lengths[i])`` of one packed image or block device (then
    ``paths`` is ignored and may be None), or, with ``keys=`` (a C-contiguous
    uint8 array of shape (n, key_len)), the rows of n keys that an engine
    finding rows by key reads (cql), or, with ``file_ids=`` (and
    ``offsets=``, ``lengths=``: uint64, or uint32 read as it is), byte
    ranges of many files: sample i is ``lengths[i]`` bytes at ``offsets[i]`` of ``paths[file_ids[i]]``
    (fr_reader_open_table: one reader, at most ``max_open_files``
    descriptors, whatever the number of files; the columns are borrowed,
    kept alive by this object, not copied). ``paths`` may be a
    :class:`fastread.PathTable`: its columns are read in place
    (fr_reader_open_tree), no string made a path."""
    cdef fr_reader *rd
    cdef _PoolOwner owner
    cdef readonly str engine
    cdef readonly size_t size
    cdef readonly unsigned long long taken  # next() calls that took a batch (or an error)
    # A batch taken from the native queue whose return a signal interrupted
    # (see next()): handed out first by the next call.
    cdef object held

    cdef readonly int device_id
    cdef readonly bint device_output
    cdef bint files  # samples are files (not ranges of an image)
    # A table reader's columns: the native reader reads them in place.
    cdef object _columns

    def __cinit__(self, paths, object engine="io_uring", unsigned queue_depth=64, unsigned threads=4,
                  bint o_direct=False, unsigned direct_alignment=4096,
                  bint register_buffers=True, bint register_files=True,
                  str engine_args="", int device_id=-1, bint pin_memory=False,
                  bint device_output=False, unsigned spin_us=50, int auto_engine=0,
                  unsigned prefetch=2,
                  unsigned workers=1, image=None, offsets=None, lengths=None,
                  cache_dir=None, cache_bytes=0, keys=None, file_ids=None,
                  unsigned max_open_files=0):
        tree = (getattr(paths, "dir_ids", None) is not None and image is None
                and keys is None and file_ids is None)
        cdef list encoded = ([] if image is not None or keys is not None or tree
                             else [encode_path(p) for p in paths])
        cdef const unsigned char[::1] w_dirs, w_names
        cdef const cnp.uint64_t[::1] w_doffs, w_noffs
        cdef const cnp.uint32_t[::1] w_ids
        cdef const char *c_dirs = NULL
        cdef const char *c_names = NULL
        cdef size_t w_ndirs = 0
        cdef const cnp.uint32_t[::1] t_files
        cdef const cnp.uint64_t[::1] t_offsets, t_lengths
        cdef const cnp.uint32_t[::1] t_lengths32
        cdef size_t t_n = 0
        cdef bint narrow = False
        if file_ids is not None:
            if offsets is None or lengths is None:
                raise ValueError("a table reader needs offsets= and lengths=")
            # uint32 lengths are read as they are (fr_reader_open_table32):
            # a mapped index's 4-byte column is not widened into a copy.
            narrow = np.asarray(lengths).dtype == np.uint32
            cols = (np.ascontiguousarray(file_ids, dtype=np.uint32),
                    np.ascontiguousarray(offsets, dtype=np.uint64),
                    np.ascontiguousarray(lengths, dtype=np.uint32 if narrow else np.uint64))
            t_n = len(cols[0])
            if cols[0].ndim != 1 or cols[1].shape != (t_n,) or cols[2].shape != (t_n,):
                raise ValueError("file_ids, offsets and lengths must be 1-D, one entry a sample")
            self._columns = cols
            t_files, t_offsets = cols[0], cols[1]
            if narrow:
                t_lengths32 = cols[2]
            else:
                t_lengths = cols[2]
        cdef const unsigned char[:, ::1] key_table = keys if keys is not None else None
        cdef size_t n = len(encoded), i
        cdef bytes image_b = encode_path(image) if image is not None else None
        cdef const char *cimage = PyBytes_AS_STRING(image_b) if image is not None else NULL
        cdef const cnp.uint64_t[::1] c_offsets, c_lengths
        if image is not None:
            if offsets is None or lengths is None:
                raise ValueError("a range reader needs offsets= and lengths=")
            # Borrowed columns (fr_reader_open_range_columns): nothing
            # copied or walked at open, whatever the sample count.
            cols = (range_column(offsets, "offsets"), range_column(lengths, "lengths"))
            if cols[0].shape != cols[1].shape:
                raise ValueError(f"{len(cols[0])} offsets but {len(cols[1])} lengths")
            self._columns = cols
            c_offsets, c_lengths = cols
            n = len(cols[0])
        elif keys is not None:
            n = key_table.shape[0]
        elif tree:
            cols = _tree_columns(paths)
            self._columns = cols
            w_dirs, w_doffs, w_ids, w_names, w_noffs = cols
            if len(w_doffs) < 1 or len(w_noffs) != len(w_ids) + 1:
                raise ValueError("a PathTable's offsets must have one entry more than its "
                                 "directories and its files")
            w_ndirs = len(w_doffs) - 1
            n = len(w_ids)
            c_dirs = <const char *>&w_dirs[0] if len(w_dirs) else NULL
            c_names = <const char *>&w_names[0] if len(w_names) else NULL
        cdef const char **cpaths = <const char **>malloc((n if n else 1) * sizeof(char *))
        if cpaths == NULL:
            raise MemoryError()
        cdef fr_config cfg
        cdef char err[256]
        err[0] = 0
        cdef bytes eng = engine_name(engine)
        cdef bytes args = engine_args.encode()
        cdef int rc
        cdef bytes cache_b  # kept alive until the reader has copied cfg.cache_dir
        try:
            init_config(&cfg, eng, queue_depth, threads, o_direct, direct_alignment,
                         register_buffers, register_files, args, device_id, pin_memory,
                         device_output, spin_us, auto_engine)
            cache_b = cache_config(&cfg, cache_dir, cache_bytes)
            cfg.max_open_files = max_open_files
            if file_ids is not None:
                for i in range(n):
                    cpaths[i] = PyBytes_AS_STRING(encoded[i])
                if narrow:
                    with nogil:
                        rc = fr_reader_open_table32(&cfg, cpaths, n,
                                                    &t_files[0] if t_n else NULL,
                                                    &t_offsets[0] if t_n else NULL,
                                                    &t_lengths32[0] if t_n else NULL, t_n,
                                                    prefetch, workers, &self.rd, err,
                                                    sizeof(err))
                else:
                    with nogil:
                        rc = fr_reader_open_table(&cfg, cpaths, n,
                                                  &t_files[0] if t_n else NULL,
                                                  &t_offsets[0] if t_n else NULL,
                                                  &t_lengths[0] if t_n else NULL, t_n,
                                                  prefetch, workers, &self.rd, err, sizeof(err))
                n = t_n
            elif keys is not None:
                with nogil:
                    rc = fr_reader_open_keys(&cfg, &key_table[0, 0] if n else NULL,
                                             key_table.shape[1], n, prefetch, workers,
                                             &self.rd, err, sizeof(err))
            elif tree:
                with nogil:
                    rc = fr_reader_open_tree(&cfg, c_dirs, &w_doffs[0], w_ndirs,
                                             &w_ids[0] if n else NULL, c_names, &w_noffs[0], n,
                                             prefetch, workers, &self.rd, err, sizeof(err))
            elif image is not None:
                with nogil:
                    rc = fr_reader_open_range_columns(&cfg, cimage,
                                                      &c_offsets[0] if n else NULL,
                                                      &c_lengths[0] if n else NULL, n,
                                                      prefetch, workers, &self.rd, err,
                                                      sizeof(err))
            else:
                for i in range(n):
                    cpaths[i] = PyBytes_AS_STRING(encoded[i])
                with nogil:
                    rc = fr_reader_open(&cfg, cpaths, n, prefetch, workers, &self.rd, err,
                                        sizeof(err))
        finally:
            free(cpaths)
        if rc != 0:
            msg = err.decode(errors="replace") or os.strerror(-rc)
            if rc == -22:
                raise ValueError(f"engine {engine!r}: {msg}")
            raise OSError(-rc, f"engine {engine!r}: {msg}")
        self.owner = _PoolOwner.wrap(fr_reader_pool(self.rd))
        self.engine = fr_reader_engine(self.rd).decode()
        self.size = n
        self.device_id = device_id
        self.device_output = device_output
        self.files = image is None and keys is None and file_ids is None

    def __dealloc__(self):
        self._close()

    cdef void _close(self) noexcept:
        self.held = None
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
            raise_errno(rc, "cannot queue a batch")

    def submit_paths(self, list paths, queue=None, entry=None):
        """Queues one batch of explicit paths (fr_reader_submit_paths):
        sample i is ``paths[i]``, read by the next free worker; its batch
        comes out of next() in submission order like any other. With
        ``queue``, ``entry`` is appended to it once the batch is queued, in
        the same call (a caller's own record of what it submitted, kept
        right across KeyboardInterrupt)."""
        cdef fr_reader *rd = self._get()
        cdef size_t n = len(paths)
        cdef list encoded = []  # bytes made for items that are not ASCII str
        cdef int rc
        cdef const char **cpaths = <const char **>malloc((n if n else 1) * sizeof(char *))
        if cpaths == NULL:
            raise MemoryError()
        try:
            # The reader copies the paths before returning.
            path_pointers(paths, cpaths, encoded)
            rc = fr_reader_submit_paths(rd, cpaths, n)
        finally:
            free(cpaths)
        if rc == -22:
            raise ValueError("a range reader reads ranges of its image, not lists of paths")
        if rc != 0:
            raise_errno(rc, "cannot queue a list of paths")
        if queue is not None:
            queue.append(entry)

    def next(self):
        """The oldest submitted batch, waiting for it with the GIL released;
        None when nothing is queued. Signals are handled while it waits, and
        once more when the batch has come: a KeyboardInterrupt (any exception
        a signal handler raises) leaves the batch queued, for the next call,
        whether it came while waiting or as the batch arrived. ``taken``
        counts the batches (and failed batches) this call and earlier ones
        handed out."""
        return self._take()

    def next_into(self, list out):
        """next(), appending the batch to ``out`` instead of returning it:
        True, or False when nothing is queued. The batch is in ``out`` or
        still queued when this returns or raises, with no moment between
        (a caller keeping parts of a batch across KeyboardInterrupt)."""
        cdef object b = self._take()
        if b is None:
            return False
        out.append(b)
        return True

    cdef object _take(self):
        cdef fr_reader *rd = self._get()
        cdef fr_batch *b = NULL
        cdef int rc
        cdef Batch batch
        cdef size_t i
        cdef char pathbuf[4096]  # a tree reader's paths are shorter (FR_PATH_TABLE_MAX)
        if self.held is not None:
            batch, self.held = self.held, None
        else:
            while True:
                with nogil:
                    rc = fr_reader_next_timed(rd, &b, 100)
                if rc != -110:  # ETIMEDOUT
                    break
                PyErr_CheckSignals()  # raises what a signal handler raised
                rd = self._get()  # a handler may have closed the reader
            if rc == -61:  # ENODATA
                self.taken += 1
                return None
            if rc != 0:
                self.taken += 1
                raise_errno(rc, f"reader thread ({self.engine}) stopped")
            if b.status != 0:
                rc = b.status
                fr_batch_recycle(b)
                self.taken += 1
                raise_errno(rc, f"engine {self.engine!r} failed a batch"
                             + gpu_error(fr_reader_gpu(rd)))
            if b.dense_spill and self.files:
                # A file of a dense batch took the slow path: the growth
                # check byte of its first read may sit on the next sample's
                # first byte (fastread.h, fr_batch.dense_spill). Failures
                # become the samples' own errors.
                with nogil:
                    for i in range(b.count):
                        if b.samples[i].length > 0 and fr_reader_path_copy(
                                rd, <size_t>b.indices[i], pathbuf, sizeof(pathbuf)) < \
                                sizeof(pathbuf):
                            fr_batch_reread_first_byte(b, i, pathbuf)
            batch = Batch.wrap(b, self.owner)
        # A signal that came while the batch arrived: its exception now,
        # with the batch kept (raised by the caller's next bytecode, it
        # would lose the batch).
        try:
            PyErr_CheckSignals()
        except BaseException:
            self.held = batch
            raise
        self.taken += 1
        return batch

    def set_dense(self, bint dense):
        """Lays out every batch the workers start from now on back to back
        (``Batch.dense_view`` is then one block for samples of one size),
        or not. O_DIRECT reads keep aligned slots either way."""
        fr_reader_set_dense(self._get(), dense)

    def reset(self):
        fr_reader_reset(self._get())
        self.held = None

    @property
    def pending(self):
        return fr_reader_pending(self._get()) + (self.held is not None)

    def path(self, size_t index):
        cdef fr_reader *rd = self._get()
        cdef size_t n = fr_reader_path_copy(rd, index, NULL, 0)
        if n == <size_t>-1:
            raise IndexError(index)
        buf = bytearray(n + 1)
        fr_reader_path_copy(rd, index, <char *>buf, n + 1)
        return os.fsdecode(bytes(buf[:n]))

    def pool_batches(self):
        return fr_pool_batches(self.owner.pool)

    def stat(self, str key):
        """A counter summed over the workers' contexts as of their last
        batch (fr_reader_stat): -1 for a key it does not sum."""
        return fr_reader_stat(self._get(), key.encode())

    def stats(self):
        """Every counter fr_reader_stat sums (STAT_KEYS), as a dict."""
        from fastread._adapt import STAT_KEYS
        return {key: self.stat(key) for key in STAT_KEYS}

    def pool_idle_bytes(self):
        return fr_pool_bytes(self.owner.pool)

    def pool_idle_device_bytes(self):
        return fr_pool_device_bytes(self.owner.pool)

    @property
    def auto_fallback(self):
        """For engine="auto": why its contexts read with psync rather than
        io_uring (an errno: io_uring's probe or set-up failed), else 0."""
        return fr_reader_auto_fallback(self._get())
