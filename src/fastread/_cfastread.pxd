# Declarations of the C core (csrc/include/fastread.h). Logic lives in the .pyx
# modules that cimport them (_core, _batch, _device_arrays, _adapt, _context,
# _native_reader).
from libc.stdint cimport int64_t, uint32_t, uint64_t, uint8_t


cdef extern from "fastread.h" nogil:
    const int FR_ERRLEN

    ctypedef struct fr_config:
        const char *engine
        unsigned queue_depth
        unsigned threads
        int o_direct
        unsigned direct_alignment
        int register_buffers
        int register_files
        const char *engine_args
        int device_id
        int pin_memory
        int device_output
        fr_gpu *gpu
        unsigned spin_us
        int auto_engine
        unsigned remember_sizes
        const char *cache_dir
        uint64_t cache_bytes
        unsigned max_open_files

    void fr_config_init(fr_config *cfg)
    const int FR_AUTO_URING
    const int FR_AUTO_PSYNC
    const unsigned FR_AUTO_MIN_SIZE
    const unsigned FR_AUTO_MIN_CPUS
    int fr_auto_rule(uint64_t mean_size, int resident, unsigned cpus, int o_direct)

    ctypedef struct fr_gpu:
        pass

    int fr_gpu_probe(int device, char *why, size_t why_len)
    void fr_gpu_last_error(fr_gpu *gpu, char *out, size_t len)

    ctypedef struct fr_arena:
        uint8_t *base
        size_t capacity
        size_t used
        uint64_t generation

    ctypedef struct fr_sample:
        uint64_t offset
        int64_t length

    ctypedef struct fr_pool:
        pass

    ctypedef struct fr_device_buffer:
        uint64_t ptr
        size_t capacity

    enum:
        FR_ON_HOST
        FR_ON_DEVICE

    ctypedef struct fr_batch:
        fr_arena arena
        fr_device_buffer device
        unsigned where
        fr_sample *samples
        size_t count
        int status
        uint64_t seq
        int64_t *indices
        int dense
        int dense_spill
        fr_sample *labels
        size_t label_count
        uint8_t *label_bytes
        fr_pool *pool

    int fr_batch_prepare(fr_batch *batch, size_t count)
    int fr_batch_reread_first_byte(fr_batch *batch, size_t i, const char *path) nogil

    fr_pool *fr_pool_new()
    fr_batch *fr_pool_get(fr_pool *pool)
    void fr_batch_retain(fr_batch *batch) nogil
    void fr_batch_recycle(fr_batch *batch) nogil
    void fr_pool_retain(fr_pool *pool)
    void fr_pool_close(fr_pool *pool)
    size_t fr_pool_bytes(fr_pool *pool)
    size_t fr_pool_batches(fr_pool *pool)
    void fr_pool_set_gpu(fr_pool *pool, fr_gpu *gpu, int pin)
    size_t fr_pool_device_bytes(fr_pool *pool)

    ctypedef struct fr_ctx:
        pass

    void fr_permutation(uint64_t seed, uint64_t epoch, int64_t *out, size_t n)
    enum: FR_ORDER_TABLE_MAX
    ctypedef enum fr_order_mode:
        FR_ORDER_SEQUENTIAL
        FR_ORDER_FULL
        FR_ORDER_BLOCK
    ctypedef struct fr_order:
        pass
    int fr_order_open(uint64_t seed, uint64_t epoch, uint64_t n, fr_order_mode mode,
                      uint64_t block, uint64_t window, fr_order **out)
    void fr_order_close(fr_order *order)
    uint64_t fr_order_size(const fr_order *order)
    size_t fr_order_memory(const fr_order *order)
    int64_t fr_order_at(const fr_order *order, uint64_t pos) nogil
    int fr_order_fill(const fr_order *order, uint64_t first, size_t count, int64_t *out) nogil
    int fr_buffer_shuffle(uint64_t seed, uint64_t epoch, int64_t *items, size_t n, size_t fill)

    const char *const *fr_engine_names()
    int fr_engine_probe(const char *engine, char *why, size_t why_len)
    int fr_cql_tls_probe(char *why, size_t why_len)
    int64_t fr_cql_token(const uint8_t *key, size_t len)
    const char *fr_engine_auto(int *rc, char *why, size_t why_len)
    int fr_ctx_open(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len)
    void fr_ctx_close(fr_ctx *ctx)
    const char *fr_ctx_engine(const fr_ctx *ctx)
    fr_gpu *fr_ctx_gpu(const fr_ctx *ctx)
    int fr_read_files(fr_ctx *ctx, const char *const *paths, const int64_t *size_hints, size_t n,
                      fr_batch *batch)
    long fr_ctx_stat(const fr_ctx *ctx, const char *key)
    long fr_cache_drop_stale(const char *dir, const char *scope, const char *const *urls,
                             const char *const *versions, const int64_t *sizes, size_t n,
                             char *err, size_t err_len)
    int fr_ctx_sample_error(const fr_ctx *ctx, size_t i, char *out, size_t len)
    int fr_read_keys(fr_ctx *ctx, const uint8_t *keys, size_t key_len, size_t n,
                     fr_batch *batch) nogil

    ctypedef struct fr_range:
        uint64_t offset
        uint64_t length

    int fr_read_ranges(fr_ctx *ctx, const char *path, const fr_range *ranges, size_t n,
                       fr_batch *batch)

    ctypedef struct fr_reader:
        pass

    int fr_reader_open(const fr_config *cfg, const char *const *paths, size_t npaths,
                       unsigned prefetch, unsigned workers, fr_reader **out, char *err,
                       size_t err_len)
    int fr_reader_open_ranges(const fr_config *cfg, const char *image, const fr_range *ranges,
                              size_t n, unsigned prefetch, unsigned workers, fr_reader **out,
                              char *err, size_t err_len)
    int fr_reader_open_range_columns(const fr_config *cfg, const char *image,
                                     const uint64_t *offsets, const uint64_t *lengths,
                                     size_t n, unsigned prefetch, unsigned workers,
                                     fr_reader **out, char *err, size_t err_len)
    int fr_reader_open_table(const fr_config *cfg, const char *const *paths, size_t npaths,
                             const uint32_t *file_ids, const uint64_t *offsets,
                             const uint64_t *lengths, size_t n, unsigned prefetch,
                             unsigned workers, fr_reader **out, char *err, size_t err_len)
    int fr_reader_open_table32(const fr_config *cfg, const char *const *paths, size_t npaths,
                               const uint32_t *file_ids, const uint64_t *offsets,
                               const uint32_t *lengths, size_t n, unsigned prefetch,
                               unsigned workers, fr_reader **out, char *err, size_t err_len)
    int fr_reader_open_keys(const fr_config *cfg, const uint8_t *keys, size_t key_len, size_t n,
                            unsigned prefetch, unsigned workers, fr_reader **out, char *err,
                            size_t err_len) nogil
    int fr_reader_submit(fr_reader *reader, const int64_t *indices, size_t n)
    int fr_reader_submit_paths(fr_reader *reader, const char *const *paths, size_t n)
    int fr_reader_next(fr_reader *reader, fr_batch **out)
    int fr_reader_next_timed(fr_reader *reader, fr_batch **out, unsigned timeout_ms)
    void fr_reader_reset(fr_reader *reader)
    size_t fr_reader_pending(fr_reader *reader)
    const char *fr_reader_path(const fr_reader *reader, size_t index)
    size_t fr_reader_path_copy(const fr_reader *reader, size_t index, char *buf, size_t cap) nogil
    int fr_reader_open_tree(const fr_config *cfg, const char *dirs, const uint64_t *dir_offsets,
                            size_t ndirs, const uint32_t *dir_ids, const char *names,
                            const uint64_t *name_offsets, size_t n, unsigned prefetch,
                            unsigned workers, fr_reader **out, char *err, size_t err_len) nogil
    size_t fr_reader_size(const fr_reader *reader)
    const char *fr_reader_engine(const fr_reader *reader)
    long fr_reader_auto_fallback(const fr_reader *reader)
    long fr_reader_stat(fr_reader *reader, const char *key)
    fr_pool *fr_reader_pool(fr_reader *reader)
    fr_gpu *fr_reader_gpu(fr_reader *reader)
    void fr_reader_set_dense(fr_reader *reader, int dense)
    void fr_reader_close(fr_reader *reader)


cdef extern from "core/base.h" nogil:
    int fr_populate_write(void *buf, size_t len)


cdef extern from "core/auto_trial.h" nogil:
    # engine="auto"'s timed trials for large cached files.
    const unsigned FR_AUTO_TRIAL_FIRST
    const unsigned FR_AUTO_TRIAL_EVERY
    const unsigned FR_AUTO_TRIAL_BATCHES
