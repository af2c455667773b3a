# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Engine contexts (:class:`Context`): one engine instance reading lists of
files or byte ranges into batches, each call with the GIL released."""
import os

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

from fastread._adapt cimport (cache_config, encode_path, engine_name, gpu_error, init_config,
                              make_ranges, path_pointers, raise_errno)
from fastread._batch cimport Batch, _PoolOwner
from fastread._cfastread cimport *

cnp.import_array()


cdef class Context:
    """One engine instance. Not for concurrent use: calls from several Python
    threads are serialized by a lock. ``engine``: the engine it reads with
    (for "auto", the core's choice); ``auto_fallback``: for "auto", why it
    reads with psync rather than io_uring (an errno), else 0."""
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
        cdef bytes eng = engine_name(engine)
        cdef bytes args = engine_args.encode()
        init_config(&cfg, eng, queue_depth, threads, o_direct, direct_alignment,
                     register_buffers, register_files, args, device_id, pin_memory,
                     device_output, spin_us, auto_engine)
        if remember_sizes is not None:
            # Paths whose sizes read() without ``sizes`` remembers for the
            # next read of them (fr_config.remember_sizes); 0: none.
            if not 0 <= remember_sizes <= 1 << 30:
                raise ValueError(f"remember_sizes must be in 0..2**30, got {remember_sizes!r}")
            cfg.remember_sizes = remember_sizes
        # Kept alive until fr_ctx_open has copied it.
        cdef bytes cache_b = cache_config(&cfg, cache_dir, cache_bytes)
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
        self.engine = fr_ctx_engine(self.ctx).decode()
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

    cdef fr_batch *_take_batch(self, size_t n, bint dense=False) except NULL:
        """A batch from the pool, ready for n samples (its status holds a
        preparation error), laid out dense or not (a pooled batch keeps the
        flag of its last read, so it is set on every one). Call with the
        lock held."""
        if self.ctx == NULL:
            raise ValueError("context is closed")
        cdef fr_batch *b = fr_pool_get(self.owner.pool)
        if b == NULL:
            raise MemoryError()
        b.dense = 1 if dense else 0
        b.status = fr_batch_prepare(b, n)
        return b

    def stat(self, str key):
        if self.ctx == NULL:
            raise ValueError("context is closed")
        return fr_ctx_stat(self.ctx, key.encode())

    @property
    def auto_fallback(self):
        return self.stat("auto_fallback")

    def pool_batches(self):
        return fr_pool_batches(self.owner.pool)

    def stats(self):
        """The object cache's counters (cache_dir; fr_ctx_stat's cache_*
        keys) and the s3 engine's requests, bytes and buffers
        (``s3_buffer_bytes``, ``s3_buffer_bytes_max``: see
        ``Reader.memory()``), where the context has them: a dict of the keys
        it knows."""
        from fastread._adapt import MEMORY_KEYS, STAT_KEYS
        if self.ctx == NULL:
            raise ValueError("context is closed")
        out = {}
        for key in STAT_KEYS + MEMORY_KEYS + ("cache_usage",):
            v = fr_ctx_stat(self.ctx, key.encode())
            if v >= 0:
                out[key] = v
        return out

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

    def read(self, paths, sizes=None, bint dense=False):
        """Reads every path; returns a Batch (check failures()). ``sizes``,
        if given, are the files' sizes when last read (-1: unknown): they let
        an engine skip sizing; a wrong one costs time, never bytes.
        ``dense``: the samples back to back in the arena, no padding between
        them, where the engine lays out whole files itself without O_DIRECT
        (``Batch.packed()`` then gives the batch as one buffer); else each
        starts 64-byte aligned."""
        # Our own list: its items stay alive while the GIL is released,
        # whatever the caller does to theirs.
        cdef list items = list(paths)
        cdef size_t n = len(items)
        cdef list encoded = []  # bytes made for items that are not ASCII str
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
        cdef size_t i
        try:
            path_pointers(items, cpaths, encoded)
            with self.lock:
                b = self._take_batch(n, dense)
                rc = b.status
                if rc == 0:
                    with nogil:
                        rc = fr_read_files(self.ctx, cpaths, hint_ptr, n, b)
                        if rc == 0 and b.dense_spill:
                            # A file of the dense batch took the slow path:
                            # its first read's growth check byte may sit on
                            # the next sample's first byte (fastread.h,
                            # fr_batch.dense_spill); only the file engines
                            # set it, so the paths are files. Failures
                            # become the samples' own errors.
                            for i in range(n):
                                if b.samples[i].length > 0:
                                    fr_batch_reread_first_byte(b, i, cpaths[i])
            if rc != 0:
                fr_batch_recycle(b)
                raise_errno(rc, f"engine {self.engine!r} failed a batch of {n} files"
                             + gpu_error(fr_ctx_gpu(self.ctx)))
            return Batch.wrap(b, self.owner)
        finally:
            free(cpaths)

    def read_ranges(self, path, offsets, lengths, bint dense=False):
        """Reads byte ranges ``[offsets[i], offsets[i] + lengths[i])`` of one
        file or block device (opened once and cached by the context) as the
        samples of a Batch, each with its true length (check failures()).
        With ``o_direct`` the offsets must be multiples of direct_alignment.
        ``dense``: as :meth:`read`'s (ranges without O_DIRECT)."""
        cdef bytes p = encode_path(path)
        cdef const char *cpath = PyBytes_AS_STRING(p)
        cdef size_t n = 0
        cdef fr_range *ranges = make_ranges(offsets, lengths, &n)
        cdef fr_batch *b = NULL
        cdef int rc
        try:
            with self.lock:
                b = self._take_batch(n, dense)
                rc = b.status
                if rc == 0:
                    with nogil:
                        rc = fr_read_ranges(self.ctx, cpath, ranges, n, b)
            if rc != 0:
                fr_batch_recycle(b)
                if rc == -95:  # EOPNOTSUPP
                    raise ValueError(f"engine {self.engine!r} cannot read ranges")
                raise_errno(rc, f"engine {self.engine!r} failed a batch of {n} ranges of {path}"
                             + gpu_error(fr_ctx_gpu(self.ctx)))
            return Batch.wrap(b, self.owner)
        finally:
            free(ranges)


    def read_keys(self, keys, bint dense=False):
        """Reads the rows of ``keys`` (a C-contiguous uint8 array of shape
        (n, key_len): uuids' 16 bytes, ...) with an engine that finds rows
        by key (cql), as the samples of a Batch (check failures(); labels,
        where the engine reads them: Batch.label_ints / label_blobs)."""
        cdef const unsigned char[:, ::1] table = keys
        cdef size_t n = table.shape[0], key_len = table.shape[1]
        cdef const uint8_t *kp = &table[0, 0] if n else NULL
        cdef fr_batch *b = NULL
        cdef int rc
        with self.lock:
            b = self._take_batch(n, dense)
            rc = b.status
            if rc == 0:
                with nogil:
                    rc = fr_read_keys(self.ctx, kp, key_len, n, b)
        if rc != 0:
            fr_batch_recycle(b)
            if rc == -95:  # EOPNOTSUPP
                raise ValueError(f"engine {self.engine!r} cannot read rows by key")
            raise_errno(rc, f"engine {self.engine!r} failed a batch of {n} rows"
                         + gpu_error(fr_ctx_gpu(self.ctx)))
        return Batch.wrap(b, self.owner)


def drop_stale_cache_entries(cache_dir, listing, str scope=""):
    """Removes the entries of the object cache at ``cache_dir`` whose
    object a listing names another version of (fr_cache_drop_stale):
    ``listing`` is ``(url, etag or None, size or -1)`` triples, ``scope``
    the entries' scope (the engine's: ``fastread._s3.Client.cache_scope``
    for S3). Returns how many went; OSError naming the directory or the
    entry otherwise."""
    cdef list items = list(listing)
    cdef size_t n = len(items), i
    if n == 0:
        return 0
    cdef bytes cdir = os.fsencode(cache_dir)
    cdef const char *dir_p = cdir
    cdef bytes cscope = scope.encode()
    cdef const char *scope_p = cscope
    cdef list keep = []
    cdef const char **urls = <const char **>malloc(n * sizeof(char *))
    cdef const char **versions = <const char **>malloc(n * sizeof(char *))
    cdef int64_t *sizes = <int64_t *>malloc(n * sizeof(int64_t))
    cdef char err[512]
    cdef long rc
    cdef bytes u, v
    err[0] = 0
    try:
        if urls == NULL or versions == NULL or sizes == NULL:
            raise MemoryError()
        for i in range(n):
            url, etag, size = items[i]
            u = os.fsencode(url)
            if b"\0" in u:
                raise ValueError(f"NUL character in the URL {url!r}")
            keep.append(u)
            urls[i] = PyBytes_AS_STRING(u)
            if etag:
                v = etag.encode()
                keep.append(v)
                versions[i] = PyBytes_AS_STRING(v)
            else:
                versions[i] = NULL
            sizes[i] = -1 if size is None else size
        with nogil:
            rc = fr_cache_drop_stale(dir_p, scope_p, urls, versions, sizes, n, err, sizeof(err))
        if rc < 0:
            raise OSError(<int>-rc, err.decode(errors="replace"))
        return rc
    finally:
        free(urls)
        free(versions)
        free(sizes)
