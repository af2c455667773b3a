# Declarations of the row-gather API (csrc/include/fastread_gather.h). Logic lives in _gather.pyx.
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef extern from "fastread_gather.h" nogil:
    ctypedef struct fr_store:
        pass

    ctypedef struct fr_store_config:
        const char *path
        uint64_t offset
        uint64_t rows
        uint64_t row_bytes
        const char *backend
        const char *engine
        const char *engine_args
        int o_direct
        unsigned queue_depth
        unsigned threads
        int device_id
        uint64_t cache_bytes
        uint32_t page_bytes
        uint64_t host_bytes
        const int64_t *hot_ids
        size_t n_hot
        unsigned ring_entries
        uint32_t timeout_ms
        const char *cache_dir
        const char *nvrtc_path

    void fr_store_config_init(fr_store_config *cfg)
    int fr_store_open(const fr_store_config *cfg, fr_store **out, char *err, size_t err_len)
    void fr_store_close(fr_store *store)
    void fr_store_cancel(fr_store *store)
    const char *fr_store_backend(const fr_store *store)
    const char *fr_store_backend_reason(const fr_store *store)
    const char *fr_store_kernel_source(const fr_store *store)

    int fr_store_gather_host(fr_store *store, const int64_t *ids, size_t n, void *out,
                             size_t *bad_index, char *err, size_t err_len)
    int fr_store_gather_device(fr_store *store, uint64_t ids, int id_bytes, size_t n,
                               uint64_t out, void *stream, size_t *bad_index, char *err,
                               size_t err_len)

    ctypedef struct fr_store_stats:
        uint64_t gathers
        uint64_t rows
        uint64_t cache_hits
        uint64_t cache_misses
        uint64_t coalesced
        uint64_t host_tier_rows
        uint64_t direct_rows
        uint64_t storage_reads
        uint64_t mapped_reads
        uint64_t bytes_read
        uint64_t evictions
        uint64_t row_hits
        uint64_t admitted
        uint64_t host_routed

    void fr_store_stats_get(fr_store *store, fr_store_stats *out)
    void fr_store_route_get(fr_store *store, char *buf, size_t len)
    const char *fr_store_route_rule()

    ctypedef struct fr_store_memory:
        uint64_t device_cache
        uint64_t device_meta
        uint64_t host_tier
        uint64_t rings
        uint64_t staging
        uint64_t host_buffers

    void fr_store_memory_get(fr_store *store, fr_store_memory *out)
    uint64_t fr_store_device_view(fr_store *store)
    const char *fr_store_device_header()
