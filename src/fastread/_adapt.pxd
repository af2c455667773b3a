# What _context and _native_reader share (logic in _adapt.pyx).
from fastread._cfastread cimport fr_config, fr_gpu, fr_range

cdef extern from "Python.h":
    # Not declared by Cython's cpython.unicode; a new reference, NULL on error.
    bytes PyUnicode_EncodeFSDefault(object unicode)
    bint PyUnicode_IS_COMPACT_ASCII(object unicode)
    void *PyUnicode_DATA(object unicode)
    Py_ssize_t PyUnicode_GET_LENGTH(object unicode)


cdef str gpu_error(fr_gpu *gpu)
cdef void init_config(fr_config *cfg, bytes engine, unsigned queue_depth, unsigned threads,
                      bint o_direct, unsigned direct_alignment, bint register_buffers,
                      bint register_files, bytes engine_args, int device_id,
                      bint pin_memory, bint device_output, unsigned spin_us,
                      int auto_engine)
cdef bytes engine_name(engine)
cdef bytes cache_config(fr_config *cfg, object cache_dir, object cache_bytes)
cdef bytes encode_path(p)
cdef int path_pointers(list items, const char **cpaths, list encoded) except -1
cdef raise_errno(int rc, str what)
cdef fr_range *make_ranges(offsets, lengths, size_t *count) except NULL
