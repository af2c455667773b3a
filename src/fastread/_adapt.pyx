# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""What the classes adapting the C core share: an fr_config from Python
arguments, engine names and paths as C strings, byte ranges as fr_range
arrays, errors as exceptions. No classes; cimported by _context and
_native_reader (declarations in _adapt.pxd)."""
import os

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport malloc
from libc.string cimport memchr

from fastread._cfastread cimport *

cnp.import_array()


cdef str gpu_error(fr_gpu *gpu):
    """The GPU's last CUDA/cuFile error, as a suffix for a message."""
    cdef char msg[256]
    if gpu == NULL:
        return ""
    msg[0] = 0
    fr_gpu_last_error(gpu, msg, sizeof(msg))
    return f" ({msg.decode(errors='replace')})" if msg[0] else ""



cdef void init_config(fr_config *cfg, bytes engine, unsigned queue_depth, unsigned threads,
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


cdef bytes engine_name(engine):
    # An engine's name, or "auto" (the core chooses: fr_engine_auto).
    if not isinstance(engine, str):
        raise TypeError(f"engine must be a str, got {type(engine).__name__}")
    return str(engine).encode()


cdef bytes encode_path(p):
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


cdef int path_pointers(list items, const char **cpaths, list encoded) except -1:
    # cpaths[i]: items[i] as a NUL-terminated path for C, valid while items
    # and encoded live. An ASCII str is its own file system encoding (every
    # encoding Python runs with on POSIX is ASCII-compatible) and holds a
    # NUL-terminated copy: passed as it is (encoding cost ~100 ns a path, a
    # fifth of a 64-file Context.read's Python time on the 2-core VM).
    # Anything else goes through encode_path, its bytes appended to encoded.
    cdef Py_ssize_t i
    cdef object p
    cdef const char *c
    cdef bytes enc
    for i in range(len(items)):
        p = items[i]
        if type(p) is str and PyUnicode_IS_COMPACT_ASCII(p):
            c = <const char *>PyUnicode_DATA(p)
            if memchr(c, 0, <size_t>PyUnicode_GET_LENGTH(p)) != NULL:
                raise ValueError(f"path contains a NUL byte: {p!r}")
            cpaths[i] = c
        else:
            enc = encode_path(p)
            encoded.append(enc)
            cpaths[i] = PyBytes_AS_STRING(enc)
    return 0


cdef raise_errno(int rc, str what):
    raise OSError(-rc, f"{what}: {os.strerror(-rc)}")


cdef fr_range *make_ranges(offsets, lengths, size_t *count) except NULL:
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


#: The counters a NativeReader sums over its workers (fr_reader_stat) and
#: Context.stats() reports: the object cache's and the s3 engine's.
STAT_KEYS = ("cache_hits", "cache_misses", "cache_damaged", "cache_bytes_written",
             "cache_write_errors", "cache_evictions", "cache_waits", "s3_requests", "s3_bytes",
             "file_calls", "cql_requests", "cql_retries", "cql_bytes", "cql_inflight_max")
# Gauges of memory an engine holds beyond the arenas (the s3 engine's
# probe and receive buffers): Context.stats() and Reader.memory().
MEMORY_KEYS = ("s3_buffer_bytes", "s3_buffer_bytes_max")


cdef bytes cache_config(fr_config *cfg, object cache_dir, object cache_bytes):
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
