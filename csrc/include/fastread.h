/*
 * fastread: batch reads of many files into reusable host buffers.
 *
 * The C core knows nothing of Python. A caller opens one context per reader
 * (fr_ctx), hands it a batch of paths and a batch buffer (fr_batch), and gets
 * back one result per sample: where its bytes start in the batch's arena and
 * how many there are, or a negative errno for that sample alone.
 *
 * Thread safety:
 *   - fr_ctx: not thread-safe. Use a context from one thread at a time (any
 *     thread, a different one at each call if need be). A context may own
 *     helper threads (psync's pool, io_uring's one thread per ring) that
 *     work only inside its calls; one fr_read_files call spreads its list
 *     over all of them.
 *   - fr_pool: every call is thread-safe (batches are returned from whatever
 *     thread drops the last reference to them).
 *   - fr_reader: submit/next/reset/close from one consumer thread; each of
 *     the reader's worker threads owns its context. fr_batch_recycle is
 *     thread-safe.
 *   - Nothing in the library is global: two readers share no state.
 */
#ifndef FASTREAD_H
#define FASTREAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FR_VERSION "0.1.0"

/* Longest engine-level error message, including the terminating NUL. */
#define FR_ERRLEN 256

typedef struct fr_config {
    const char *engine;        /* "io_uring", "psync", "s3" (see fr_engine_names), or "auto" */
    unsigned queue_depth;      /* io_uring: samples in flight per ring */
    unsigned threads;          /* psync: worker threads; io_uring: rings, each with its own
                                * thread (0: one per CPU, at most 16) */
    int o_direct;              /* open with O_DIRECT, bypassing the page cache */
    unsigned direct_alignment; /* O_DIRECT buffer/length alignment in bytes (power of two) */
    int register_buffers;      /* io_uring: register arenas as fixed buffers */
    int register_files;        /* io_uring: direct descriptors (linked open/read/close) */
    const char *engine_args;   /* engine-specific "key=value,key=value" (e.g. xNVMe's be=) */
    /* GPU delivery (see fr_gpu). device_id < 0: host only, CUDA is never
     * loaded. pin_memory page-locks the host arenas so host-to-device copies
     * (ours or the caller's) run at full speed. device_output delivers every
     * batch in device memory as well: one copy per batch of the arena's used
     * region, finished before the batch is handed out. The cufile engine
     * reads into device memory itself and needs device_id >= 0. */
    int device_id;
    int pin_memory;
    int device_output;
    struct fr_gpu *gpu;        /* optional, borrowed: an open fr_gpu for device_id */
    /* psync and io_uring: microseconds a helper thread polls for the next
     * phase after finishing one (yielding its core between polls) before
     * it sleeps, and the caller for the helpers. Default 50: a woken thread
     * can take tens of microseconds to run (futex wake-up, idle core), so a
     * short call finished before its helpers arrived; polling keeps them
     * awake across the phases of a call and from one call to the next.
     * 0: sleep at once. At most 100000. No polling where the context has
     * more threads than the process has CPUs (a poller would hold a core
     * its own pool needs). */
    unsigned spin_us;
    /* engine="auto": with engine io_uring and host output, each fr_read_files
     * batch goes to io_uring or to a psync pool (opened on first use, with
     * the same threads) by fr_auto_rule. Ranges always go to io_uring.
     * FR_AUTO_AS_MANY_CPUS: the same, as if the machine had FR_AUTO_MIN_CPUS
     * CPUs (for tests of the psync side on small machines). */
    int auto_engine;
    /* Paths whose sizes a context remembers from its reads without size
     * hints (fr_read_files), used as hints when it reads them again: with
     * every size known io_uring skips sizing (a stat per file). A stale
     * size costs time, never bytes. Only for engines that use hints
     * (io_uring, xnvme-file; auto while on io_uring) and small files
     * (FR_REMEMBER_MAX_MEAN). 0: none. Default FR_REMEMBER_SIZES. */
    unsigned remember_sizes;
    /* A node-local cache of objects read through a URL engine (s3): with
     * cache_dir set, an object is kept under it after its first read and
     * later reads take it from there with a file engine (io_uring, else
     * psync; a context opened on first use), the rest from the network.
     * Several processes may share one directory: an object is fetched by
     * one of them at a time, and a writer killed mid-write leaves no entry.
     * cache_bytes: the most the entries may hold (0: no limit); past it the
     * least recently used are removed down to 90%. Entries are checked at
     * every use by size (a size hint that differs is a changed object), and
     * the first time a context reads one by the CRC-32 of its bytes too;
     * one that fails is fetched again. An entry keeps its object's ETag;
     * an object rewritten with the same size is noticed only where a
     * listing is compared (fr_cache_drop_stale: readers over an s3://
     * prefix do it when they open). With a mix of hits and misses the
     * samples' bytes are not in list order in the arena (offsets say where
     * each is), and a dense batch may have a gap between the two. Ignored by file engines.
     * Entries are keyed by the engine's scope (s3: the endpoint and a hash
     * of the access key id) and the URL; a hit is not checked with the
     * store: any process that can read the directory gets the bytes
     * fetched into it.
     * csrc/core/object_cache.h has the layout, locking and eviction. */
    const char *cache_dir;
    uint64_t cache_bytes;
    /* fr_read_file_ranges: the most descriptors of the caller's files a
     * context keeps open (an LRU; see there). 0: FR_MAX_OPEN_FILES. A
     * reader over a table shares it out among its workers. */
    unsigned max_open_files;
} fr_config;

/* fr_config.remember_sizes's default: 65536 paths (a 2 MiB table at most).
 * Measured on the 16-core H200 (docs/results/h200-20261127b, one run): one
 * io_uring call on 256 cached 4 KiB files read before took 117.6 us with
 * remembered sizes against 145.3 sizing each file by stat(); a pass over
 * files never read costs 4-7% more than without (size_memo_probe.py). */
#define FR_REMEMBER_SIZES 65536u
/* Remembered sizes are used only while the context's last call without
 * hints read files of at most this mean size. With every size known
 * io_uring opens a ring's share of files, then reads and closes each as its
 * open completes (PH_CHAINED); without, it opens, sizes (stat) and reads
 * each file as soon as it can (PH_DIRECT): on the 16-core H200 the
 * first made read_files() 1.06-1.11x as fast on 4 KiB files (batch 64 and
 * 256, two runs) and 0.93x on 92 KiB ones at batch 64 (1.00x at 256;
 * docs/results/h200-20261127b). Sizes in between were not measured. */
#define FR_REMEMBER_MAX_MEAN (32u * 1024u)

/* engine="auto"'s rule, measured with bench/engines/engines.py (docs/engines.md, "Choosing an
 * engine"): psync for files of FR_AUTO_MIN_SIZE bytes or more (a running
 * mean over the context's batches; once on psync, down to 3/4 of it) that
 * are in the page cache, on a machine with FR_AUTO_MIN_CPUS or more CPUs;
 * io_uring for everything else (small files, cold files, O_DIRECT, ranges,
 * fewer CPUs). On a 16-core H200 machine, warm, with unsized reads through
 * direct descriptors (engines/uring/strategies.c's ring_direct), io_uring read 4 KiB
 * files twice as fast as psync, 92 KiB files faster and 256 KiB files as
 * fast or faster (read_files() 1.03-1.06x; a Reader 0.96-1.04x, two runs);
 * psync read 512 KiB files faster in 3 of 4 cells (1.03-1.05x) and 1 MiB
 * files in 7 of 8 cells over two runs (up to 1.19x: its threads copy in
 * parallel). So FR_AUTO_MIN_SIZE is 512 KiB (it was 160 KiB before the
 * direct path). On a 2-core VM io_uring was as fast or faster at every size
 * (FR_AUTO_MIN_CPUS lies between the two). For cached files of
 * FR_AUTO_MIN_SIZE or more the two engines ran close and the winner changed
 * between runs, so there the rule's pick is only where auto starts: it
 * times both and keeps the faster (auto_trial.h). resident: 1 cached, 0
 * not, -1 unknown (taken as not). */
#define FR_AUTO_URING 0
#define FR_AUTO_PSYNC 1
#define FR_AUTO_MIN_SIZE (512u * 1024u)
#define FR_AUTO_MIN_CPUS 8u
#define FR_AUTO_PROBE_PAGES 4u /* pages of one file sampled for residency */
#define FR_AUTO_SIZE_WEIGHT 8u /* a batch's weight in the running mean size: 1/8 */
#define FR_AUTO_AS_MANY_CPUS 2 /* fr_config.auto_engine for tests: see there */
int fr_auto_rule(uint64_t mean_size, int resident, unsigned cpus, int o_direct);

/* Fills in the defaults: io_uring, depth 64, 4 threads, buffered, 4096-byte
 * O_DIRECT alignment, registered buffers and files when the kernel has them,
 * host output (device_id -1). */
void fr_config_init(fr_config *cfg);

/* ------------------------------------------------------------------ arena */

/* Memory a batch reads into. Samples are stored at offsets, never pointers,
 * so the arena may move while it grows (before any I/O is in flight). A
 * region it moved out of stays mapped until the arena is freed. */
typedef struct fr_arena {
    uint8_t *base;
    size_t capacity;
    size_t used;
    uint64_t generation; /* bumped every time base or capacity changes */
    void *retired;       /* regions it grew out of, unmapped only when freed */
    struct fr_gpu *pin;  /* set by the pool: regions are page-locked through it */
} fr_arena;

int fr_arena_reserve(fr_arena *arena, size_t bytes); /* 0, -ENOMEM, or -EIO if pinning failed */
void fr_arena_free(fr_arena *arena);

/* One sample's outcome: its bytes are arena.base[offset, offset+length). */
typedef struct fr_sample {
    uint64_t offset;
    int64_t length; /* >= 0: bytes; < 0: -errno for this sample */
} fr_sample;

/* Device memory a batch is delivered in: the arena's layout, mirrored. */
typedef struct fr_device_buffer {
    uint64_t ptr; /* a CUdeviceptr; 0 when none */
    size_t capacity;
    struct fr_gpu *owner; /* retained while ptr is allocated */
    int cufile_registered; /* cuFileBufRegister: 1 done, -1 refused, 0 not tried */
} fr_device_buffer;

/* Where a batch's bytes are: samples[i].offset is an offset into each. */
enum { FR_ON_HOST = 1, FR_ON_DEVICE = 2 };

/* A batch: an arena and one fr_sample per requested file. */
typedef struct fr_batch {
    fr_arena arena;
    fr_device_buffer device;
    unsigned where;  /* FR_ON_HOST | FR_ON_DEVICE */
    fr_sample *samples;
    size_t count;
    size_t samples_cap;
    int status;      /* 0, or a batch-level -errno (then samples are not valid) */
    uint64_t seq;    /* submission number within a reader */
    int64_t *indices; /* reader only: the dataset indices this batch holds */
    /* Dense layout, asked for by the batch's owner and kept when the batch
     * is reused (fr_pool_get zeroes it once): without O_DIRECT, reads lay
     * samples back to back, with no alignment or padding between them, so
     * that a batch read without incident is one contiguous block (consumers
     * that want one buffer per batch, e.g. DALI). 0: every sample starts
     * 64-byte aligned. O_DIRECT reads ignore it (they need aligned slots). */
    int dense;
    /* Set by a dense read that took the slow path (fr_read_whole): a file
     * read whole may have changed size, and its first read's one extra byte
     * (the check for growth) may have landed on the first byte of the sample
     * laid out after it. Call fr_batch_reread_first_byte for every sample
     * before using the bytes. Reset when the next read lays the batch out. */
    int dense_spill;
    /* Engines whose samples are rows (cql) read a second column, the
     * label, beside the bytes: label_count == count then, and sample i's
     * label is label_bytes[labels[i].offset, + labels[i].length) (length
     * -1: null in that row). label_count 0: the read gave none. Host
     * memory, reused with the batch; never delivered to a device. */
    fr_sample *labels;
    size_t label_count, labels_cap;
    uint8_t *label_bytes;
    size_t label_bytes_used, label_bytes_cap;
    unsigned holds;  /* fr_batch_retain count + 1; guarded by the pool's lock */
    struct fr_pool *pool;
    struct fr_batch *next;
} fr_batch;

/* Makes room for `count` samples and resets the arena; 0 or -ENOMEM. */
int fr_batch_prepare(fr_batch *batch, size_t count);

/* For engines that read labels (fr_batch.labels): readies `n` labels, all
 * null; then sets label i to bytes[0, len). 0 or -ENOMEM. */
int fr_batch_labels_begin(fr_batch *batch, size_t n);
int fr_batch_set_label(fr_batch *batch, size_t i, const uint8_t *bytes, size_t len);

/* A dense batch with dense_spill set (see fr_batch): reads the first byte of
 * sample i again from `path` (the file it was read from). 0, or -errno, also
 * recorded as the sample's error. Thread-safe for distinct samples. */
int fr_batch_reread_first_byte(fr_batch *batch, size_t i, const char *path);

/* ------------------------------------------------------------------- pool */

/* A free list of batches whose arenas are reused, so steady-state reads touch
 * no new memory. Reference counted: freed when closed and every batch that
 * came from it has been returned. */
typedef struct fr_pool fr_pool;

fr_pool *fr_pool_new(void);
fr_batch *fr_pool_get(fr_pool *pool);         /* NULL on ENOMEM */
/* A batch goes back to its pool when the last of its holders recycles it:
 * the one fr_pool_get (or fr_reader_next) made, and one per fr_batch_retain.
 * Both are thread-safe, so a consumer (e.g. a DLPack deleter on another
 * library's thread) can keep a batch alive without any language runtime. */
void fr_batch_retain(fr_batch *batch);
void fr_batch_recycle(fr_batch *batch);       /* drops one hold */
void fr_pool_retain(fr_pool *pool);           /* one more owner reference */
void fr_pool_close(fr_pool *pool);            /* drop an owner reference */
size_t fr_pool_bytes(fr_pool *pool);          /* arena bytes of the idle batches */
size_t fr_pool_batches(fr_pool *pool);        /* batches allocated */
/* Page-locks the arenas of the pool's batches through `gpu` (retained until
 * the pool dies). Call before the first fr_pool_get. */
void fr_pool_set_gpu(fr_pool *pool, struct fr_gpu *gpu, int pin);
size_t fr_pool_device_bytes(fr_pool *pool);   /* device bytes of the idle batches */

/* -------------------------------------------------------------------- gpu */

/* One CUDA device, reached through the driver API (libcuda.so.1) and, for the
 * cufile engine, libcufile, both loaded at run time: the build needs no CUDA
 * and CUDA-less machines never load it. Work runs in the device's primary
 * context (the one the CUDA runtime, CuPy, PyTorch and DALI use). Reference
 * counted; every call is thread-safe. */
typedef struct fr_gpu fr_gpu;

/* 0 when the driver loads and device `device` exists; else -errno and why. */
int fr_gpu_probe(int device, char *why, size_t why_len);
int fr_gpu_open(int device, fr_gpu **out, char *err, size_t err_len);
void fr_gpu_retain(fr_gpu *gpu);
void fr_gpu_close(fr_gpu *gpu);
/* The most recent CUDA or cuFile error seen through this gpu, "" if none. */
void fr_gpu_last_error(fr_gpu *gpu, char *out, size_t len);
/* Loads libcufile and opens its driver (once per fr_gpu). 0, or -errno and
 * why. On success `mode` says "gds" (nvidia-fs is loaded) or "compat" (cuFile
 * reads through host bounce buffers). */
int fr_gpu_cufile(fr_gpu *gpu, const char **mode, char *why, size_t why_len);

/* ---------------------------------------------------------------- context */

typedef struct fr_ctx fr_ctx;

/* Names of every engine compiled in, NULL-terminated. */
const char *const *fr_engine_names(void);

/* 0 if the cql engine can open TLS connections (engine_args ssl=1: built
 * with OpenSSL), else -ENOTSUP and why in `why`. */
int fr_cql_tls_probe(char *why, size_t why_len);
/* Cassandra's Murmur3Partitioner token of a partition key's bytes (what
 * `SELECT token(id)` answers): the cql engine's routing. Thread-safe. */
int64_t fr_cql_token(const uint8_t *key, size_t len);

/* 0 if `engine` can run here; otherwise a negative errno and why in `why`. */
int fr_engine_probe(const char *engine, char *why, size_t why_len);

/* engine="auto" (fr_config.engine), decided here and nowhere else: the
 * engine a context opened with it reads with, io_uring where it is compiled
 * in and its probe passes (then with cfg.auto_engine on: fr_auto_rule and
 * the trials send batches to io_uring or psync), else psync. `why` (may be
 * NULL) gets io_uring's probe failure when it is passed over, and *rc (may
 * be NULL) its -errno (0 if it was not). */
const char *fr_engine_auto(int *rc, char *why, size_t why_len);

/* Opens a context; on failure returns -errno and says why in err. With
 * engine "auto" (fr_engine_auto) an io_uring that probed fine but cannot
 * be set up for a resource limit (-ENOMEM, -EPERM, -EMFILE, -ENFILE,
 * -EAGAIN: RLIMIT_MEMLOCK, RLIMIT_NOFILE) is replaced by psync; the stat
 * "auto_fallback" then says why (an errno; also when io_uring's probe
 * failed), 0 when auto read with its first choice. */
int fr_ctx_open(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len);
void fr_ctx_close(fr_ctx *ctx);
/* Thread-safe, unlike the other fr_ctx calls: callable from any thread
 * while a call runs on the context's own. on != 0 makes the call in
 * progress, and every later one until on == 0, end soon with -ECANCELED
 * where the engine can wait long (s3: requests in flight are dropped, a
 * stalled one included); other engines' calls run to their end. */
void fr_ctx_cancel(fr_ctx *ctx, int on);
const char *fr_ctx_engine(const fr_ctx *ctx); /* the engine it reads with ("auto" resolved) */
/* The context's GPU (borrowed), or NULL when it does no GPU work. Whoever
 * owns the batches' pool pins it through this gpu (fr_pool_set_gpu). */
struct fr_gpu *fr_ctx_gpu(const fr_ctx *ctx);

/* Reads every path into batch (after fr_batch_prepare-ing it for n). Each
 * sample gets its own result; the return value is 0, or a negative errno for
 * a failure of the whole batch (out of memory, a broken ring).
 * `size_hints` (may be NULL; entries < 0 mean unknown) are the sizes the
 * files had when last read: with every size known an engine can skip sizing
 * them. A wrong hint costs time, never bytes: a file whose size changed is
 * detected and read again. */
int fr_read_files(fr_ctx *ctx, const char *const *paths, const int64_t *size_hints, size_t n,
                  fr_batch *batch);

/* A byte range of one file or device: a sample of a packed image. */
typedef struct fr_range {
    uint64_t offset;
    uint64_t length;
} fr_range;

/* Reads each range of `path` (a regular file or a block device, opened once
 * and cached by the context) as one sample into batch. Every range comes
 * back with its true length; with O_DIRECT, offsets must be multiples of
 * direct_alignment and the engine reads whole aligned blocks. Ranges longer
 * than the engine's largest transfer are split. Engines without range reads
 * return -ENOTSUP. */
int fr_read_ranges(fr_ctx *ctx, const char *path, const fr_range *ranges, size_t n,
                   fr_batch *batch);

/* Reads the rows of `n` keys (keys[i * key_len, + key_len): a uuid's 16
 * bytes, a bigint's 8 big-endian ones, as the protocol sends them) as n
 * samples, with engines that find rows by key (cql; others -ENOTSUP).
 * Which table and columns: the engine's engine_args. Samples' bytes lie
 * back to back in the order their rows arrived (offsets say where), and
 * with a label column, batch->labels holds each row's label. Per-sample
 * errors as fr_read_files (a missing row: -ENOENT). */
int fr_read_keys(fr_ctx *ctx, const uint8_t *keys, size_t key_len, size_t n, fr_batch *batch);

/* Why sample i of the context's last fr_read_files or fr_read_ranges call
 * failed, in words beyond its errno, where the engine says more (s3: the
 * URL, the HTTP status and S3's error code, e.g. "s3://b/k: 403
 * SignatureDoesNotMatch"; never a secret): 1 and the message in out[len],
 * or 0 and "" when there is none. */
int fr_ctx_sample_error(const fr_ctx *ctx, size_t i, char *out, size_t len);

/* Facts about the context, for diagnostics: "fixed_files", "fixed_buffers",
 * "queue_depth", "threads", "o_direct"; "file_calls" and "file_call_ns"
 * (fr_read_files calls and the wall time inside them); psync and io_uring also their
 * helper pool's counters ("pool_phases", "pool_joins", "pool_skips",
 * "pool_alone", "pool_sleeps", "pool_wake_ns", "pool_spin_ns": see
 * threadpool.h); an auto context "auto_engine", "auto_last" (the engine of
 * the last batch: FR_AUTO_URING or FR_AUTO_PSYNC), "auto_uring_batches",
 * "auto_psync_batches", "auto_trials" and "auto_switches" (auto_trial.h);
 * the s3 engine "s3_requests", "s3_retries", "s3_bytes", "s3_inflight_max",
 * "s3_connections" (opened: far fewer than requests while connections are
 * kept), "s3_repairs" (objects whose known size was wrong, read again) and
 * its settings "inflight", "part_size", "retries", "deadline_ms",
 * "unsigned", "path_style"; with a cache_dir "cache_hits" (objects read
 * from the cache), "cache_misses" (read over the network), "cache_damaged"
 * (entries that failed their check, fetched again), "cache_bytes_written",
 * "cache_write_errors" (entries not stored: the bytes were still read),
 * "cache_evictions", "cache_waits" (objects another process was fetching,
 * waited for) and "cache_usage" (bytes the cache counts).
 * Returns -1 for an unknown key. */
long fr_ctx_stat(const fr_ctx *ctx, const char *key);

/* Removes the entries of the object cache at `dir` (fr_config.cache_dir)
 * whose object the store now holds another version of, as a listing says:
 * urls[i] with versions[i] (its ETag; NULL, or NULL entries or "":
 * unknown) and sizes[i] (may be NULL; < 0: unknown). An entry goes when
 * its size differs, or when it and the listing both have an ETag and they
 * differ. scope: the entries' scope, as the engine that stored them
 * names it (fr_s3_client_cache_scope for S3; NULL: none). Safe while
 * other processes use the cache (the entries' locks).
 * Entries dropped, or -errno and why in err. */
long fr_cache_drop_stale(const char *dir, const char *scope, const char *const *urls,
                         const char *const *versions, const int64_t *sizes, size_t n, char *err,
                         size_t err_len);

/* ---------------------------------------------------------------- shuffle */
/* An epoch's order of n samples, drawn from (seed, epoch) alone: the same
 * on every machine, rank and binding, so the Python readers and the DALI
 * operators read one order for one seed, whichever of them runs. Orders
 * are computed per position, so a reader asks for the positions a batch
 * needs (fr_order_at, fr_order_fill), never for the whole epoch.
 *
 * FR_ORDER_FULL: a permutation of all n samples. Up to FR_ORDER_TABLE_MAX
 * samples a table drawn by Fisher-Yates (uniform; n * 8 bytes, at most
 * 512 KiB); beyond, a keyed bijection (an 8-round Feistel network on the
 * next power of two, cycle-walked into [0, n)): about 200 bytes whatever
 * n, ~30 ns a position, batches that look uniformly drawn; every sample
 * of a batch is anywhere in the data set (one ranged read each in a
 * sharded format or object storage).
 *
 * FR_ORDER_BLOCK: blocks of `block` consecutive samples (the last one
 * shorter when block does not divide n), the blocks permuted (as FULL
 * does over the blocks), then cut into windows of `window` consecutive
 * blocks of that order, the samples of each window permuted among
 * themselves (a keyed network per window). Every window of window*block
 * positions therefore holds whole blocks: a reader reads `window` runs of
 * `block` consecutive samples per window*block samples, where FULL reads
 * one run per sample. Memory as FULL over n / block items.
 *
 * FR_ORDER_SEQUENTIAL: 0..n-1.
 *
 * An order is immutable once open: every call on it is thread-safe. */
#define FR_ORDER_TABLE_MAX 65536
typedef enum fr_order_mode {
    FR_ORDER_SEQUENTIAL = 0,
    FR_ORDER_FULL = 1,
    FR_ORDER_BLOCK = 2
} fr_order_mode;
typedef struct fr_order fr_order;
/* *out = the order of n samples in `epoch` (block and window: BLOCK's, else
 * ignored). 0; -EINVAL for another mode or a BLOCK block or window of 0;
 * -EOVERFLOW for n, or block * window, past INT64_MAX; -ENOMEM. */
int fr_order_open(uint64_t seed, uint64_t epoch, uint64_t n, fr_order_mode mode, uint64_t block,
                  uint64_t window, fr_order **out);
void fr_order_close(fr_order *order); /* NULL is fine */
uint64_t fr_order_size(const fr_order *order);
/* Bytes the order holds (its struct and table, if any). */
size_t fr_order_memory(const fr_order *order);
/* The sample at position pos of the epoch; -1 past its end. O(1). */
int64_t fr_order_at(const fr_order *order, uint64_t pos);
/* out[0..count) = the samples at positions first..first+count-1. 0;
 * -ERANGE if that runs past the end. O(count). */
int fr_order_fill(const fr_order *order, uint64_t first, size_t count, int64_t *out);
/* out[0..n) = FR_ORDER_FULL's order of n samples for (seed, epoch), whole
 * (for callers that want the array: small n, tests). No state:
 * thread-safe. */
void fr_permutation(uint64_t seed, uint64_t epoch, int64_t *out, size_t n);
/* Reorders items[0..n) in place as a shuffle buffer of `fill` slots emits
 * them (DALI's readers' random_shuffle with initial_fill, webdataset's
 * shuffle(n)): the buffer starts with the first `fill` items; each step
 * emits a uniformly drawn slot and refills it with the next item in order.
 * Item k therefore comes out at a position >= k - fill + 1: batches draw
 * from a window of neighbouring items (a few shards of a sharded format)
 * instead of the whole data set. Drawn from (seed, epoch) alone like
 * fr_permutation, thread-safe. 0; -EINVAL for fill 0; -ENOMEM. */
int fr_buffer_shuffle(uint64_t seed, uint64_t epoch, int64_t *items, size_t n, size_t fill);

/* ----------------------------------------------------------------- reader */

/* Native threads that read batches ahead, delivered in submission order. */
typedef struct fr_reader fr_reader;

/* `paths` is copied. `workers` threads (1..64) each own a context; at most
 * prefetch + workers - 1 batches are being read or waiting. */
int fr_reader_open(const fr_config *cfg, const char *const *paths, size_t npaths,
                   unsigned prefetch, unsigned workers, fr_reader **out, char *err,
                   size_t err_len);
/* A reader whose samples are the files of a tree, the paths given as
 * BORROWED columns instead of strings (core/path_table.h): path i is
 * dirs[dir_offsets[d], dir_offsets[d + 1]) + names[name_offsets[i],
 * name_offsets[i + 1]) with d = dir_ids[i], nothing NUL-terminated. The
 * caller keeps the five columns alive and unchanged until fr_reader_close;
 * the reader adds 8 bytes a file (the sizes it learns), so 10^6 files in
 * 1,000 folders cost their names' bytes plus 20 bytes each, not a copy of
 * every path. The columns are checked (offsets non-decreasing from 0, dir
 * ids < ndirs, no NUL, paths < 4096 bytes) in one walk: -EINVAL and why in
 * err. Otherwise fr_reader_open's reader. fr_reader_path is NULL for it:
 * use fr_reader_path_copy. */
int fr_reader_open_tree(const fr_config *cfg, const char *dirs, const uint64_t *dir_offsets,
                        size_t ndirs, const uint32_t *dir_ids, const char *names,
                        const uint64_t *name_offsets, size_t n, unsigned prefetch,
                        unsigned workers, fr_reader **out, char *err, size_t err_len);
/* A reader whose samples are ranges of one image (a packed image or a block
 * device) instead of files: sample i is ranges[i] (copied), read with
 * fr_read_ranges. Same submit/next semantics; fr_reader_path returns the
 * image for every index. -EINVAL (and why in err) for a range that
 * overflows or, with O_DIRECT, is not aligned to direct_alignment. */
int fr_reader_open_ranges(const fr_config *cfg, const char *image, const fr_range *ranges,
                          size_t n, unsigned prefetch, unsigned workers, fr_reader **out,
                          char *err, size_t err_len);
/* fr_reader_open_ranges over borrowed columns: sample i is lengths[i] bytes
 * at offsets[i] of the image. Nothing is copied or walked at open, so it
 * costs the same at 10^8 samples as at 10: the caller keeps both columns
 * alive and unchanged until fr_reader_close (a memory-mapped index's, say).
 * A range that overflows or, with O_DIRECT, is not aligned is that sample's
 * -EINVAL when its batch is read (fr_read_ranges' layout), not an error here. */
int fr_reader_open_range_columns(const fr_config *cfg, const char *image,
                                 const uint64_t *offsets, const uint64_t *lengths, size_t n,
                                 unsigned prefetch, unsigned workers, fr_reader **out,
                                 char *err, size_t err_len);
/* A reader whose samples are rows found by key (fr_read_keys): sample i is
 * the row of keys[i * key_len, + key_len) (copied: n * key_len bytes, no
 * per-sample allocation). Same submit/next semantics; fr_reader_path
 * returns "" for every index. key_len 1..256. */
int fr_reader_open_keys(const fr_config *cfg, const uint8_t *keys, size_t key_len, size_t n,
                        unsigned prefetch, unsigned workers, fr_reader **out, char *err,
                        size_t err_len);
/* Queues one batch of dataset indices (copied); 0, -EINVAL or -ENOMEM. */
int fr_reader_submit(fr_reader *reader, const int64_t *indices, size_t n);
/* Queues one batch of explicit paths (copied): sample i of its batch is
 * paths[i] (its index i), whatever paths the reader was opened with (a
 * reader opened over no paths reads only such lists). The workers share
 * the sizes of the files they read (at most cfg.remember_sizes paths): a
 * list whose every size is known is read with them as hints (fr_reader_stat
 * "hinted_lists" counts those), else without.
 * 0, -EINVAL for a range reader, -ENOMEM. */
int fr_reader_submit_paths(fr_reader *reader, const char *const *paths, size_t n);
/* Blocks until the oldest submitted batch is read. -ENODATA if none is queued. */
int fr_reader_next(fr_reader *reader, fr_batch **out);
/* fr_reader_next waiting at most timeout_ms: -ETIMEDOUT if the batch is not
 * read by then (it stays queued; call again). Lets a caller notice signals. */
int fr_reader_next_timed(fr_reader *reader, fr_batch **out, unsigned timeout_ms);
/* Drops every queued and finished batch not yet taken by fr_reader_next. */
void fr_reader_reset(fr_reader *reader);
size_t fr_reader_pending(fr_reader *reader); /* submitted and not yet taken */
/* Sample index's file (the image of a range reader, "" for a key reader);
 * NULL past the end and for a tree reader, whose paths are not stored
 * whole (fr_reader_path_copy names every reader's samples). */
const char *fr_reader_path(const fr_reader *reader, size_t index);
/* Sample index's path written with a NUL into buf if it fits in cap bytes;
 * returns its length either way (snprintf's contract), (size_t)-1 past the
 * end. Thread-safe: the reader's paths do not change once open. */
size_t fr_reader_path_copy(const fr_reader *reader, size_t index, char *buf, size_t cap);
size_t fr_reader_size(const fr_reader *reader);
/* The engine the reader's contexts read with (engine "auto" resolved, as
 * fr_ctx_engine), and their "auto_fallback" stat (fr_ctx_open). */
const char *fr_reader_engine(const fr_reader *reader);
long fr_reader_auto_fallback(const fr_reader *reader);
/* A counter summed over the reader's workers' contexts (fr_ctx_stat), as of
 * their last finished batch: "cache_hits", "cache_misses", "cache_damaged",
 * "cache_bytes_written", "cache_write_errors", "cache_evictions",
 * "cache_waits", "s3_requests", "s3_bytes", "file_calls"; 0 for a key no
 * worker's engine has; "hinted_lists" (explicit lists read with every size
 * known, fr_reader_submit_paths); -1 for any other key. Thread-safe. */
long fr_reader_stat(fr_reader *reader, const char *key);
fr_pool *fr_reader_pool(fr_reader *reader);
/* dense 1: every batch the workers start reading from now on is laid out
 * dense (fr_batch.dense), so a batch of samples of one size read without
 * incident is one block, an array (N, ...) as it lies; 0 (the default)
 * leaves each batch's own flag, which an owner may set per batch (the DALI
 * operator does). Thread-safe; call it before the first submit to have
 * every batch dense. */
void fr_reader_set_dense(fr_reader *reader, int dense);
struct fr_gpu *fr_reader_gpu(fr_reader *reader); /* borrowed; NULL without GPU work */
/* Stops the thread. Batches still held by the caller stay valid until they
 * are recycled. */
void fr_reader_close(fr_reader *reader);

/* ------------------------------------------------------- ranges of many files */

/* Default of fr_config.max_open_files. */
#define FR_MAX_OPEN_FILES 64u

/* One sample of fr_read_file_ranges: bytes [offset, offset + length) of
 * the caller's paths[file]. */
typedef struct fr_file_range {
    uint32_t file;
    uint32_t reserved; /* 0 */
    uint64_t offset;
    uint64_t length;
} fr_file_range;

/* Reads jobs[i] as sample i into batch, whatever files the jobs name:
 * ranges of thousands of shards (WebDataset, Squirrel, CIFAR batch files)
 * in one call on one context. Descriptors come from the context's LRU of
 * at most cfg.max_open_files (opened with the checks of a range read:
 * regular files and block devices only, never a FIFO's wait), keyed by the
 * file's index: they stay open across calls that pass the same `paths`
 * pointer, so the caller must not make an index name another file while
 * reusing a table (a new table pointer empties the LRU). The calling
 * thread and the engine's helper threads open the batch's missing files
 * and read the ranges in parallel; a batch touching more files than the
 * LRU holds is read in windows of that many files.
 * Per-sample errors: -errno of the file's open (-ENOENT, -EISDIR, -EINVAL
 * for a FIFO), -ENODATA where the file ends inside the range (a truncated
 * shard), -EINVAL for a file index >= npaths or a range that overflows.
 * Engines: psync; s3 (paths are s3:// URLs: ranged GETs of every object on
 * the context's one multi handle, connections kept across objects);
 * io_uring (and auto) contexts on their rings where the kernel has linked
 * direct opens (Linux 5.17) and register_files is on: each ring's share
 * of max_open_files files held in its registered file table, not the
 * process's descriptors; opened without the fstat (a path that stopped
 * being a regular file or block device is caught only when its read never
 * completes: -EINVAL after a second; a character device's bytes are read
 * as they come), fr_ctx_sample_error naming the path of a failed open or
 * read; elsewhere through a psync pool of the same threads (opened on
 * first use). Others: -ENOTSUP. O_DIRECT: -ENOTSUP.
 * `paths` (the array and its strings) must stay valid until the context's
 * next call: fr_ctx_sample_error reads the failed sample's path from it. */
int fr_read_file_ranges(fr_ctx *ctx, const char *const *paths, size_t npaths,
                        const fr_file_range *jobs, size_t n, fr_batch *batch);

/* A reader over a table of samples that are ranges of many files (or
 * objects): sample i is bytes [offsets[i], + lengths[i]) of
 * paths[file_ids[i]], read with fr_read_file_ranges. `paths` is copied;
 * the columns are BORROWED (n entries each; the caller keeps them alive
 * and unchanged until fr_reader_close): a memory-mapped index of 10^8
 * samples opens without being read. Threads: the `workers` and their
 * contexts' helpers, whatever the number of files; descriptors: at most
 * cfg.max_open_files in all (each worker's context keeps its share, at
 * least 1). A file index out of range is that sample's -EINVAL.
 * fr_reader_path(reader, i) is sample i's file. Engine io_uring reads on
 * its rings where fr_read_file_ranges can (else, and for auto, with psync
 * contexts), s3 with s3 ones. */
int fr_reader_open_table(const fr_config *cfg, const char *const *paths, size_t npaths,
                         const uint32_t *file_ids, const uint64_t *offsets,
                         const uint64_t *lengths, size_t n, unsigned prefetch,
                         unsigned workers, fr_reader **out, char *err, size_t err_len);
/* fr_reader_open_table with uint32 lengths (samples below 4 GiB, as a
 * WebDataset sample almost always is): the same borrowed columns at 4 B a
 * sample less, so a memory-mapped 10^8-sample index is read in place
 * rather than widened into a 800 MB copy. */
int fr_reader_open_table32(const fr_config *cfg, const char *const *paths, size_t npaths,
                           const uint32_t *file_ids, const uint64_t *offsets,
                           const uint32_t *lengths, size_t n, unsigned prefetch,
                           unsigned workers, fr_reader **out, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* FASTREAD_H */
