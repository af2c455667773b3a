# Declarations of the s3 engine's client (csrc/engines/s3/s3_client.h).
# Logic lives in _s3.pyx.


from libc.stdint cimport int64_t, uint64_t


cdef extern from "engines/s3/s3_client.h" nogil:
    ctypedef struct fr_s3_client:
        pass

    int fr_s3_client_open(const char *engine_args, fr_s3_client **out, char *err, size_t err_len)
    void fr_s3_client_close(fr_s3_client *c)
    long fr_s3_client_request(fr_s3_client *c, const char *method, const char *bucket,
                              const char *key, const char *query, const void *body,
                              size_t body_len, char **resp, size_t *resp_len, char *err,
                              size_t err_len)
    long fr_s3_client_get_range(fr_s3_client *c, const char *bucket, const char *key,
                                uint64_t first, uint64_t len, char **resp, size_t *resp_len,
                                uint64_t *total, char *err, size_t err_len)
    long fr_s3_client_requests(const fr_s3_client *c)
    long long fr_s3_client_bytes(const fr_s3_client *c)
    long fr_s3_client_retries(const fr_s3_client *c)
    void fr_s3_client_cache_scope(const fr_s3_client *c, char *out, size_t len)
    void fr_s3_free(void *p)
    int fr_s3_describe(char *out, size_t len)


cdef extern from "engines/s3/s3_list.h" nogil:
    ctypedef struct fr_s3_strings:
        char *blob
        uint64_t *off
        size_t n
        size_t blob_len

    ctypedef struct fr_s3_listing:
        fr_s3_strings keys
        fr_s3_strings etags
        int64_t *sizes
        fr_s3_strings left
        long requests
        long retries
        long long bytes
        int inflight_max

    int fr_s3_list(const char *engine_args, const char *bucket, const char *prefix,
                   int delimiter, int max_depth, int inflight, fr_s3_listing *out, char *err,
                   size_t err_len)
    void fr_s3_listing_free(fr_s3_listing *l)
    int fr_s3_list_native()
