# Declarations of the record formats' native indexers (csrc/formats/tar_index.h).
# Logic lives in _formats.pyx.

from libc.stdint cimport int64_t, uint64_t


cdef extern from "formats/tar_index.h" nogil:
    int FR_WDS_DEFER

    ctypedef struct fr_tar_members:
        size_t n
        uint64_t *data_off
        uint64_t *size
        uint64_t *header_off
        uint64_t *name_off
        char *names
        size_t names_len

    void fr_tar_members_free(fr_tar_members *m)
    int fr_wds2idx_parse(const char *buf, size_t len, fr_tar_members *out, size_t *bad_line,
                         char *err, size_t err_len)
    int fr_tar_walk(const unsigned char *buf, uint64_t len, fr_tar_members *out,
                    uint64_t *bad_at, char *err, size_t err_len)

    ctypedef struct fr_wds_spec:
        int k
        size_t n_wanted
        const char *const *wanted
        const size_t *wanted_len
        const int *wanted_col
        int fold_case
        int dali
        int missing
        int want_keys

    ctypedef struct fr_wds_samples:
        size_t n
        int k
        uint64_t *start
        uint64_t *length
        int64_t *comp_off
        uint64_t *comp_len
        uint64_t *key_off
        char *keys
        size_t keys_len
        uint64_t skipped

    void fr_wds_samples_free(fr_wds_samples *s)
    int fr_wds_group(const fr_wds_spec *spec, const char *names, const uint64_t *name_off,
                     const uint64_t *data_off, const uint64_t *size, size_t n_members,
                     fr_wds_samples *out, char *err, size_t err_len)

    ctypedef struct fr_wds_shard:
        int rc
        int stage
        uint64_t bad_at
        uint64_t file_size
        int64_t mtime_ns
        char err[256]
        fr_wds_samples samples

    int fr_wds_index_files(const char *const *paths, size_t n, const fr_wds_spec *spec,
                           unsigned threads, fr_wds_shard *out)


cdef extern from "formats/squirrel_walk.h" nogil:
    ctypedef struct fr_sq_samples:
        size_t n
        int k
        uint64_t *start
        uint64_t *length
        uint64_t *fa
        uint64_t *fb
        int64_t *data_off
        uint64_t *data_len

    void fr_sq_samples_free(fr_sq_samples *s)
    int fr_sq_walk(const unsigned char *buf, uint64_t len, const char *const *keys,
                   const size_t *key_len, int k, fr_sq_samples *out, uint64_t *bad_at,
                   char *err, size_t err_len)
