# Declarations of the optional Parquet shim over Arrow's C++ Parquet library
# (parquet_native/pq_native.h). Logic lives in _parquet_native.pyx.


from libc.stdint cimport int64_t, uint8_t


cdef extern from "pq_native.h" nogil:
    ctypedef struct fr_pqn_footer:
        pass

    const char *fr_pqn_arrow_version()
    int fr_pqn_footer_open(const uint8_t *bytes, size_t len, fr_pqn_footer **out, char *err,
                           size_t errlen)
    void fr_pqn_footer_close(fr_pqn_footer *footer)
    int fr_pqn_chunk_info(const fr_pqn_footer *footer, int group, int column, int64_t *values,
                          int *compressed, char *err, size_t errlen)
    int fr_pqn_read_chunk(const fr_pqn_footer *footer, int group, int column,
                          const uint8_t *chunk, int64_t chunk_len, int64_t rows,
                          int64_t side_hint, int64_t *begin, int64_t *length, uint8_t **side,
                          int64_t *side_len, int64_t *copied, char *err, size_t errlen)
    void fr_pqn_free(void *p)
