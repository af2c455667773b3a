/* Engine registry and the context that dispatches to one engine (or, for
 * engine="auto", to io_uring or psync per batch: see fr_auto_rule). Reads
 * through the node-local object cache are in ctx_cache.c; the struct both
 * use is in ctx_internal.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/ctx_internal.h"

static const fr_engine *const engines[] = {
#ifdef FASTREAD_HAVE_URING
    &fr_engine_uring,
#endif
    &fr_engine_psync,
#ifdef FASTREAD_HAVE_XNVME
    &fr_engine_xnvme_file,
    &fr_engine_xnvme,
#endif
    &fr_engine_cufile,
#ifdef FASTREAD_HAVE_S3
    &fr_engine_s3,
#endif
    &fr_engine_cql,
    NULL,
};

static const char *const engine_names[] = {
#ifdef FASTREAD_HAVE_URING
    "io_uring",
#endif
    "psync",
#ifdef FASTREAD_HAVE_XNVME
    "xnvme-file",
    "xnvme",
#endif
    "cufile",
#ifdef FASTREAD_HAVE_S3
    "s3",
#endif
    "cql",
    NULL,
};


void fr_config_init(fr_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->engine = "io_uring";
    cfg->queue_depth = 64;
    cfg->remember_sizes = FR_REMEMBER_SIZES;
    cfg->threads = 4;
    cfg->o_direct = 0;
    cfg->direct_alignment = 4096;
    cfg->register_buffers = 1;
    cfg->register_files = 1;
    cfg->engine_args = "";
    cfg->device_id = -1;
    cfg->pin_memory = 0;
    cfg->device_output = 0;
    cfg->gpu = NULL;
    cfg->spin_us = 50;
    cfg->auto_engine = 0;
}

int fr_auto_rule(uint64_t mean_size, int resident, unsigned cpus, int o_direct)
{
    if (o_direct || cpus < FR_AUTO_MIN_CPUS || mean_size < FR_AUTO_MIN_SIZE || resident != 1)
        return FR_AUTO_URING;
    return FR_AUTO_PSYNC;
}

const char *const *fr_engine_names(void) { return engine_names; }

/* Engines whose paths are URLs of remote objects: only they use a
 * cache_dir (a file engine's files are local already). */
static int engine_reads_urls(const fr_engine *e)
{
#ifdef FASTREAD_HAVE_S3
    return e == &fr_engine_s3;
#else
    (void)e;
    return 0;
#endif
}

static const fr_engine *find_engine(const char *name)
{
    for (size_t i = 0; engines[i]; i++)
        if (strcmp(engines[i]->name, name) == 0)
            return engines[i];
    return NULL;
}

int fr_engine_probe(const char *engine, char *why, size_t why_len)
{
    const fr_engine *e = engine ? find_engine(engine) : NULL;
    if (!e) {
        fr_set_err(why, why_len, "engine '%s' is not compiled into this build",
                   engine ? engine : "(null)");
        return -ENOENT;
    }
    return e->probe(why, why_len);
}

static int check_config(const fr_config *cfg, char *err, size_t err_len)
{
    unsigned a = cfg->direct_alignment;
    if (a < 512 || (a & (a - 1)) != 0) {
        fr_set_err(err, err_len, "direct_alignment must be a power of two >= 512, got %u", a);
        return -EINVAL;
    }
    if (cfg->queue_depth == 0 || cfg->queue_depth > 4096) {
        fr_set_err(err, err_len, "queue_depth must be in 1..4096, got %u", cfg->queue_depth);
        return -EINVAL;
    }
    if (cfg->spin_us > 100000) {
        fr_set_err(err, err_len, "spin_us must be in 0..100000, got %u", cfg->spin_us);
        return -EINVAL;
    }
    if (cfg->threads > 1024) {
        fr_set_err(err, err_len, "threads must be in 0..1024, got %u", cfg->threads);
        return -EINVAL;
    }
    if (cfg->device_id < 0 && (cfg->device_output || cfg->pin_memory)) {
        fr_set_err(err, err_len, "%s needs a device_id (a CUDA device number)",
                   cfg->device_output ? "device output" : "pin_memory");
        return -EINVAL;
    }
    if (cfg->gpu && fr_gpu_device_id(cfg->gpu) != cfg->device_id) {
        fr_set_err(err, err_len, "the gpu handed in is device %d, not device_id %d",
                   fr_gpu_device_id(cfg->gpu), cfg->device_id);
        return -EINVAL;
    }
    return 0;
}

const char *fr_engine_auto(int *rc, char *why, size_t why_len)
{
    char scratch[FR_ERRLEN];
    if (!why || !why_len) {
        why = scratch;
        why_len = sizeof(scratch);
    }
    why[0] = 0;
#ifdef FASTREAD_HAVE_URING
    int probe = fr_engine_uring.probe(why, why_len);
#else
    int probe = -ENOENT;
    fr_set_err(why, why_len, "io_uring is not compiled into this build");
#endif
    if (rc)
        *rc = probe;
    return probe == 0 ? "io_uring" : "psync";
}

static int ctx_open(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len);

/* Why an io_uring that probed fine may still not open: the kernel charges
 * rings and registered buffers to RLIMIT_MEMLOCK, rings and registered
 * file tables to RLIMIT_NOFILE. */
static int is_limit(int rc)
{
    return rc == -ENOMEM || rc == -EPERM || rc == -EMFILE || rc == -ENFILE || rc == -EAGAIN;
}

/* engine "auto": fr_engine_auto's pick, io_uring with the per-batch choice
 * (cfg.auto_engine, unless the caller set it), psync when io_uring does not
 * run here or cannot be set up for a resource limit. */
static int open_auto(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len)
{
    fr_config c = *cfg;
    int probe = 0;
    c.engine = fr_engine_auto(&probe, NULL, 0);
    if (!c.auto_engine)
        c.auto_engine = 1;
    int rc = ctx_open(&c, out, err, err_len);
    int fallback = -probe;
    if (rc && probe == 0 && is_limit(rc)) {
        c.engine = "psync";
        char err2[FR_ERRLEN] = "";
        if (ctx_open(&c, out, err2, sizeof(err2)) != 0)
            return rc; /* the first error, io_uring's, says more */
        if (err_len)
            err[0] = 0;
        fallback = -rc;
        rc = 0;
    }
    if (rc == 0)
        (*out)->auto_fallback = fallback;
    return rc;
}

int fr_ctx_open(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len)
{
    if (cfg->engine && strcmp(cfg->engine, "auto") == 0) {
        *out = NULL;
        return open_auto(cfg, out, err, err_len);
    }
    return ctx_open(cfg, out, err, err_len);
}

static int ctx_open(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len)
{
    *out = NULL;
    const fr_engine *e = cfg->engine ? find_engine(cfg->engine) : NULL;
    if (!e) {
        fr_set_err(err, err_len, "unknown engine '%s'", cfg->engine ? cfg->engine : "(null)");
        return -ENOENT;
    }
    int rc = check_config(cfg, err, err_len);
    if (rc)
        return rc;
    fr_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->engine = e;
    ctx->device_output = cfg->device_output;
    ctx->pid = getpid();
    ctx->remember_sizes = cfg->remember_sizes;
#ifdef FASTREAD_HAVE_URING
    /* Only between io_uring and psync, for buffered host reads (the rule
     * gives io_uring for O_DIRECT anyway): */
    ctx->auto_engine =
        cfg->auto_engine && e == &fr_engine_uring && cfg->device_id < 0 && !cfg->o_direct;
#endif
    if (ctx->auto_engine) {
        ctx->alt_cfg = *cfg;
        ctx->alt_cfg.engine = "psync";
        ctx->alt_cfg.engine_args = ""; /* io_uring's, not psync's (psync takes none) */
        ctx->alt_cfg.gpu = NULL;
        ctx->cpus = fr_usable_cpus();
        if (cfg->auto_engine == FR_AUTO_AS_MANY_CPUS && ctx->cpus < FR_AUTO_MIN_CPUS)
            ctx->cpus = FR_AUTO_MIN_CPUS;
        ctx->resident = -1;
        ctx->seed = (uint64_t)(uintptr_t)ctx;
    }
    /* The psync side of fr_read_file_ranges for io_uring: only the settings
     * psync reads, none of the strings (they are the caller's). */
    ctx->ranges_cfg = *cfg;
    ctx->ranges_cfg.engine = "psync";
    ctx->ranges_cfg.engine_args = "";
    ctx->ranges_cfg.gpu = NULL;
    ctx->ranges_cfg.cache_dir = NULL;
    fr_config local = *cfg;
    /* CUDA is loaded only for a context that has GPU work to do. */
    if (cfg->device_id >= 0 &&
        (cfg->device_output || cfg->pin_memory || e == &fr_engine_cufile)) {
        if (cfg->gpu) {
            fr_gpu_retain(cfg->gpu);
            ctx->gpu = cfg->gpu;
        } else if ((rc = fr_gpu_open(cfg->device_id, &ctx->gpu, err, err_len))) {
            free(ctx);
            return rc;
        }
        if ((rc = fr_gpu_stream_create(ctx->gpu, &ctx->stream))) {
            fr_gpu_last_error(ctx->gpu, err, err_len);
            fr_gpu_close(ctx->gpu);
            free(ctx);
            return rc;
        }
        local.gpu = ctx->gpu;
    }
    rc = e->open(&local, &ctx->state, err, err_len);
    if (rc) {
        fr_gpu_stream_destroy(ctx->gpu, ctx->stream);
        fr_gpu_close(ctx->gpu);
        free(ctx);
        return rc;
    }
    if (cfg->cache_dir && cfg->cache_dir[0] && engine_reads_urls(e)) {
        char scope[1024] = "";
        if (e->cache_scope)
            e->cache_scope(ctx->state, scope, sizeof(scope));
        rc = fr_ocache_open(cfg->cache_dir, cfg->cache_bytes, scope, &ctx->cache, err, err_len);
        if (rc) {
            fr_ctx_close(ctx);
            return rc;
        }
        /* The hits' engine reads local files for this host: the
         * context's own settings, none of its engine's or GPU's. */
        ctx->file_cfg = *cfg;
        ctx->file_cfg.engine_args = "";
        ctx->file_cfg.gpu = NULL;
        ctx->file_cfg.device_id = -1;
        ctx->file_cfg.device_output = 0;
        ctx->file_cfg.pin_memory = 0;
        ctx->file_cfg.auto_engine = 0;
        ctx->file_cfg.cache_dir = NULL;
    }
    *out = ctx;
    return 0;
}

void fr_ctx_cancel(fr_ctx *ctx, int on)
{
    /* Only the main engine can wait long: the cache tier's file engine and
     * auto's psync read local files. */
    if (ctx && ctx->engine->cancel && ctx->pid == getpid())
        ctx->engine->cancel(ctx->state, on);
}

void fr_ctx_close(fr_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->pid != getpid()) {
        /* A forked child: the engine's close would join threads that only
         * exist in the parent, and the GPU's driver state is the parent's.
         * The engine's state is left to the child's exit. */
        free(ctx);
        return;
    }
    ctx->engine->close(ctx->state);
    fr_size_memo_free(ctx->memo);
    free(ctx->memo_scratch);
    if (ctx->alt_state)
        fr_engine_psync.close(ctx->alt_state);
    if (ctx->ranges_state)
        fr_engine_psync.close(ctx->ranges_state);
    if (ctx->file_engine)
        ctx->file_engine->close(ctx->file_state);
    fr_ocache_close(ctx->cache);
    fr_arena_free(&ctx->scratch.arena);
    free(ctx->scratch.samples);
    free(ctx->scratch.indices);
    fr_ctx_cache_work_free(&ctx->work);
    if (ctx->gpu) {
        fr_gpu_stream_destroy(ctx->gpu, ctx->stream);
        fr_gpu_close(ctx->gpu);
    }
    free(ctx);
}

fr_gpu *fr_ctx_gpu(const fr_ctx *ctx) { return ctx->gpu; }

const char *fr_ctx_engine(const fr_ctx *ctx) { return ctx->engine->name; }

/* Readies batch for n samples: 1 if there is reading to do, else 0 or -errno. */
static int begin_batch(fr_batch *batch, size_t n)
{
    if (batch->samples_cap < n)
        return -EINVAL;
    batch->count = n;
    batch->status = 0;
    batch->where = FR_ON_HOST;
    batch->label_count = 0;
    return n > 0;
}

/* Moves a read batch to where the caller wants it: to the GPU for device
 * output, back to the host when an engine read into the GPU for a host
 * caller. One copy of the arena's used region either way. */
static int end_batch(fr_ctx *ctx, fr_batch *batch, int rc)
{
    if (rc == 0 && ctx->gpu) {
        if (ctx->device_output && !(batch->where & FR_ON_DEVICE)) {
            rc = fr_gpu_upload(ctx->gpu, ctx->stream, batch);
            if (rc == 0)
                batch->where |= FR_ON_DEVICE;
        } else if (!ctx->device_output && !(batch->where & FR_ON_HOST)) {
            rc = fr_gpu_download(ctx->gpu, ctx->stream, batch);
            if (rc == 0)
                batch->where |= FR_ON_HOST;
        }
    }
    return batch->status = rc;
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Whether the file at `path` is in the page cache: FR_AUTO_PROBE_PAGES of
 * its pages drawn at random, all cached. 1, 0, or -1 when it cannot tell
 * (cannot open or map it, empty): then the batch's own read says why. */
static int path_resident(const char *path, uint64_t *seed)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    int verdict = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map != MAP_FAILED) {
            unsigned asked;
            unsigned in = fr_resident_sample(map, (size_t)st.st_size, FR_AUTO_PROBE_PAGES, seed,
                                             &asked);
            if (asked > 0)
                verdict = in == asked;
            munmap(map, (size_t)st.st_size); /* fails only for a bad range */
        }
    }
    close(fd);
    return verdict;
}

/* Which engine an auto context reads this batch with. Batches of large
 * cached files are "the band", where the two engines run close: there the
 * trials of auto_trial.h pick, starting from fr_auto_rule's pick for this
 * machine; every other batch goes to io_uring. The band is judged on a
 * running mean of the batches' file sizes (each batch's from the hints
 * where every one is known, a reader's later epochs, else from one stat of
 * its first file; weight 1/FR_AUTO_SIZE_WEIGHT), and once in it a context
 * stays until that mean falls below 3/4 of FR_AUTO_MIN_SIZE: with the first
 * file alone deciding, a data set of 92 KiB JPEGs (p5 52 KiB) sent one batch
 * in six to the other engine, and each switch left the other pool's helpers
 * polling for their next phase on the cores the chosen pool needed (on a
 * 16-core H100, auto read 0.87-0.90 of the slower engine in those cells).
 * Residency comes from one file, sampled at every batch of large files: a
 * data set that becomes cached after its first epoch moves over, and one
 * evicted between epochs moves back to io_uring at once. The sample (open,
 * mmap, mincore of 4 pages) costs microseconds against milliseconds for
 * such a batch; sampled every 16th batch, as before, a Reader whose data
 * was evicted after an epoch read a whole cold epoch of 2,000 1 MiB files in
 * batches of 256 with psync. Costs one stat per batch besides, where there
 * are no size hints. */
static int leave_band(fr_ctx *ctx)
{
    ctx->in_band = 0;
    return FR_AUTO_URING;
}

static int auto_pick(fr_ctx *ctx, const char *const *paths, const int64_t *size_hints, size_t n)
{
    ctx->band_batch = 0;
    if (ctx->alt_failed)
        return leave_band(ctx);
    uint64_t total = 0;
    size_t known = 0;
    for (size_t i = 0; size_hints && i < n && size_hints[i] >= 0; i++, known++)
        total += (uint64_t)size_hints[i];
    uint64_t mean;
    if (size_hints && known == n) {
        mean = total / n;
    } else {
        struct stat st;
        if (stat(paths[0], &st) != 0 || !S_ISREG(st.st_mode))
            return ctx->last_pick; /* the read will say what is wrong */
        mean = (uint64_t)st.st_size;
    }
    if (mean == 0)
        mean = 1;
    /* Two batches in a row 4x or more off the running mean: the context
     * reads another data set now (a read_files() context is one per thread
     * and settings), and the mean starts over from this batch instead of
     * taking ~16 batches to get there; one outlier file does not. */
    int jump = mean / 4 >= ctx->size_est || ctx->size_est / 4 >= mean;
    ctx->size_jumps = jump ? ctx->size_jumps + 1 : 0;
    if (ctx->size_est == 0 || ctx->size_jumps >= 2) {
        ctx->size_est = mean;
        ctx->in_band = 0; /* another data set: its engines are timed afresh */
    } else {
        ctx->size_est = ctx->size_est - ctx->size_est / FR_AUTO_SIZE_WEIGHT + mean / FR_AUTO_SIZE_WEIGHT;
    }
    /* Hysteresis: the band keeps a mean down to 3/4 of the threshold. */
    uint64_t seen = ctx->in_band ? ctx->size_est / 3 * 4 : ctx->size_est;
    if (seen < FR_AUTO_MIN_SIZE)
        return leave_band(ctx); /* small files: no residency sample needed */
    /* A file the sample cannot tell about (smaller than a page, gone) keeps
     * the last verdict: one batch of tiny files among large ones is an
     * outlier, not a sign of eviction. */
    int verdict = path_resident(paths[ctx->seed % n], &ctx->seed);
    if (verdict >= 0 || ctx->resident < 0)
        ctx->resident = verdict == 1;
    if (ctx->resident != 1)
        return leave_band(ctx);
    /* Large cached files: the band, on any machine. The rule's pick for this
     * one first (psync on FR_AUTO_MIN_CPUS or more, else io_uring), then
     * whichever the trials find faster. Two lists in a row 2x longer or
     * shorter than the band's are timed afresh: which engine wins can turn
     * with the list length (1 MiB files on the H200: io_uring for lists of
     * 64, psync for 256), and a context that kept io_uring from lists of 64
     * read lists of 256 at 0.90 of psync until its next trial. One such list
     * is an epoch's short last one: restarting on it, 1 MiB lists of 64 ran
     * 16 trials in 512 batches. */
    int other_length = n >= 2 * ctx->band_files || ctx->band_files >= 2 * n;
    ctx->band_length_jumps = other_length ? ctx->band_length_jumps + 1 : 0;
    if (ctx->band_length_jumps >= 2)
        ctx->in_band = 0;
    if (!ctx->in_band) {
        fr_auto_trial_reset(&ctx->trial, fr_auto_rule(seen, 1, ctx->cpus, 0));
        ctx->in_band = 1;
        ctx->band_files = n;
        ctx->band_length_jumps = 0;
    }
    ctx->band_batch = 1;
    return fr_auto_trial_pick(&ctx->trial);
}

static int read_files_untimed(fr_ctx *ctx, const char *const *paths, const int64_t *size_hints,
                              size_t n, fr_batch *batch)
{
    int rc = begin_batch(batch, n);
    if (rc <= 0)
        return rc;
    const fr_engine *e = ctx->engine;
    void *state = ctx->state;
    int pick = FR_AUTO_URING;
    if (ctx->auto_engine) {
        pick = auto_pick(ctx, paths, size_hints, n);
        if (pick == FR_AUTO_PSYNC && !ctx->alt_state &&
            fr_engine_psync.open(&ctx->alt_cfg, &ctx->alt_state, NULL, 0) != 0) {
            ctx->alt_failed = 1; /* out of threads or memory: io_uring reads on */
            ctx->alt_state = NULL;
            pick = FR_AUTO_URING;
        }
        ctx->last_pick = pick;
        ctx->auto_batches[pick]++;
        if (pick == FR_AUTO_PSYNC) {
            e = &fr_engine_psync;
            state = ctx->alt_state;
        }
    }
    /* band_batch: an auto pick made by the trials, which compare the
     * engine call alone. */
    long t0 = ctx->band_batch ? now_ns() : 0;
    ctx->cache_call = ctx->cache != NULL;
    ctx->ranges_call = 0;
    if (ctx->cache)
        rc = fr_ctx_cached_read(ctx, paths, size_hints, n, batch);
    else
        rc = e->read_files(state, paths, size_hints, n, batch);
    if (ctx->band_batch)
        fr_auto_trial_record(&ctx->trial, pick, rc == 0 ? batch->arena.used : 0, now_ns() - t0);
    return end_batch(ctx, batch, rc);
}

/* Looks a call's paths up in the memo, for a call without hints: how many
 * were found (their sizes in ctx->memo_scratch[0..n), the paths' hashes
 * after them), or -1 when the memo is not used for this call. */
static long look_up_sizes(fr_ctx *ctx, const char *const *paths, size_t n)
{
    /* Only for an engine that uses hints, for auto while it reads with
     * io_uring (psync, its other engine, ignores them), and for small files
     * (FR_REMEMBER_MAX_MEAN). */
    if (!ctx->remember_sizes || n == 0 || !ctx->engine->uses_size_hints ||
        (ctx->auto_engine && ctx->last_pick == FR_AUTO_PSYNC) ||
        (ctx->unhinted_mean > FR_REMEMBER_MAX_MEAN &&
         ctx->engine->uses_size_hints != FR_HINTS_ANY_SIZE))
        return -1;
    if (!ctx->memo && !(ctx->memo = fr_size_memo_new(ctx->remember_sizes)))
        return -1;
    if (n > ctx->memo_cap) {
        int64_t *scratch = realloc(ctx->memo_scratch, 2 * n * sizeof(*scratch));
        if (!scratch)
            return -1;
        ctx->memo_scratch = scratch;
        ctx->memo_cap = n;
    }
    size_t found = fr_size_memo_lookup(ctx->memo, paths, n,
                                       (uint64_t *)(ctx->memo_scratch + n), ctx->memo_scratch);
    ctx->memo_calls += found == n;
    return (long)found;
}

int fr_read_files(fr_ctx *ctx, const char *const *paths, const int64_t *size_hints, size_t n,
                  fr_batch *batch)
{
    if (ctx->pid != getpid())
        return -ECHILD; /* opened by the parent process: see struct fr_ctx */
    long t0 = now_ns();
    long found = size_hints ? -1 : look_up_sizes(ctx, paths, n);
    const int64_t *hints = size_hints ? size_hints : found > 0 ? ctx->memo_scratch : NULL;
    int rc = read_files_untimed(ctx, paths, hints, n, batch);
    if (rc == 0 && found >= 0)
        fr_size_memo_store(ctx->memo, (const uint64_t *)(ctx->memo_scratch + n), batch->samples,
                           ctx->memo_scratch, n);
    /* The arena's bytes a file (sizes and alignment padding) stand for the
     * files' mean size without another pass over the samples. */
    if (rc == 0 && !size_hints && n > 0 && ctx->remember_sizes && ctx->engine->uses_size_hints)
        ctx->unhinted_mean = batch->arena.used / n;
    ctx->file_call_ns += now_ns() - t0;
    ctx->file_calls++;
    return rc;
}

int fr_read_ranges(fr_ctx *ctx, const char *path, const fr_range *ranges, size_t n,
                   fr_batch *batch)
{
    if (!ctx->engine->read_ranges)
        return -ENOTSUP;
    if (ctx->pid != getpid())
        return -ECHILD;
    int rc = begin_batch(batch, n);
    if (rc <= 0)
        return rc;
    ctx->ranges_call = 0;
    return end_batch(ctx, batch, ctx->engine->read_ranges(ctx->state, path, ranges, n, batch));
}

int fr_read_file_ranges(fr_ctx *ctx, const char *const *paths, size_t npaths,
                        const fr_file_range *jobs, size_t n, fr_batch *batch)
{
    if (ctx->pid != getpid())
        return -ECHILD;
    const fr_engine *e = ctx->engine;
    void *state = ctx->state;
    int via_psync = !e->read_file_ranges;
#ifdef FASTREAD_HAVE_URING
    /* io_uring reads them on its rings (engines/uring/file_ranges.c) where
     * the kernel takes direct opens linked to reads; otherwise through a
     * psync pool of the same threads. */
    if (e == &fr_engine_uring) {
        if (ctx->gpu)
            return -ENOTSUP;
        via_psync = e->stat(state, "file_ranges_native") != 1;
    }
#endif
    if (via_psync) {
#ifdef FASTREAD_HAVE_URING
        if (e != &fr_engine_uring)
            return -ENOTSUP;
        if (ctx->ranges_failed)
            return ctx->ranges_failed;
        if (!ctx->ranges_state) {
            int rc = fr_engine_psync.open(&ctx->ranges_cfg, &ctx->ranges_state, NULL, 0);
            if (rc) {
                ctx->ranges_state = NULL;
                ctx->ranges_failed = rc;
                return rc;
            }
        }
        e = &fr_engine_psync;
        state = ctx->ranges_state;
#else
        return -ENOTSUP;
#endif
    }
    int rc = begin_batch(batch, n);
    if (rc <= 0)
        return rc;
    ctx->cache_call = 0;
    ctx->ranges_call = state == ctx->ranges_state;
    long t0 = now_ns();
    rc = end_batch(ctx, batch, e->read_file_ranges(state, paths, npaths, jobs, n, batch));
    ctx->file_call_ns += now_ns() - t0;
    ctx->file_calls++;
    return rc;
}

int fr_read_keys(fr_ctx *ctx, const uint8_t *keys, size_t key_len, size_t n, fr_batch *batch)
{
    if (!ctx->engine->read_keys)
        return -ENOTSUP;
    if (ctx->pid != getpid())
        return -ECHILD;
    int rc = begin_batch(batch, n);
    if (rc <= 0)
        return rc;
    ctx->cache_call = 0;
    ctx->ranges_call = 0;
    long t0 = now_ns();
    rc = end_batch(ctx, batch, ctx->engine->read_keys(ctx->state, keys, key_len, n, batch));
    ctx->file_call_ns += now_ns() - t0;
    ctx->file_calls++;
    return rc;
}

int fr_ctx_sample_error(const fr_ctx *ctx, size_t i, char *out, size_t len)
{
    if (len)
        out[0] = 0;
    if (ctx->cache_call) {
        /* The engine's calls were over parts of the list: the messages
         * were kept by the caller's index (keep_note). */
        for (size_t j = 0; j < ctx->work.nnotes; j++)
            if (ctx->work.notes[j].sample == i) {
                snprintf(out, len, "%s", ctx->work.notes[j].msg);
                return 1;
            }
        return 0;
    }
    /* An auto context's psync side has no messages: its errno says it all;
     * nor has the psync side of io_uring's fr_read_file_ranges. */
    if (!ctx->engine->sample_error || (ctx->auto_engine && ctx->last_pick == FR_AUTO_PSYNC) ||
        ctx->ranges_call)
        return 0;
    return ctx->engine->sample_error(ctx->state, i, out, len);
}

long fr_ctx_stat(const fr_ctx *ctx, const char *key)
{
    if (strcmp(key, "auto_engine") == 0)
        return ctx->auto_engine;
    if (strcmp(key, "file_calls") == 0)
        return ctx->file_calls;
    if (strcmp(key, "remembered_paths") == 0)
        return ctx->memo ? (long)fr_size_memo_count(ctx->memo) : 0;
    if (strcmp(key, "remembered_calls") == 0)
        return ctx->memo_calls;
    if (strcmp(key, "file_call_ns") == 0)
        return ctx->file_call_ns;
    if (strcmp(key, "auto_uring_batches") == 0)
        return ctx->auto_batches[FR_AUTO_URING];
    if (strcmp(key, "auto_psync_batches") == 0)
        return ctx->auto_batches[FR_AUTO_PSYNC];
    if (strcmp(key, "auto_trials") == 0)
        return ctx->trial.trials;
    if (strcmp(key, "auto_switches") == 0)
        return ctx->trial.switches;
    if (strcmp(key, "auto_fallback") == 0)
        return ctx->auto_fallback;
    if (strcmp(key, "auto_last") == 0)
        return ctx->auto_engine ? ctx->last_pick : -1;
    if (ctx->cache) {
        static const struct {
            const char *key;
            size_t off;
        } cache_keys[] = {
            {"cache_hits", offsetof(fr_ctx, cache_hits)},
            {"cache_misses", offsetof(fr_ctx, cache_misses)},
            {"cache_damaged", offsetof(fr_ctx, cache_damaged)},
            {"cache_write_errors", offsetof(fr_ctx, cache_write_errors)},
            {"cache_evictions", offsetof(fr_ctx, cache_evictions)},
            {"cache_waits", offsetof(fr_ctx, cache_waits)},
        };
        for (size_t j = 0; j < sizeof(cache_keys) / sizeof(cache_keys[0]); j++)
            if (strcmp(key, cache_keys[j].key) == 0)
                return *(const long *)((const char *)ctx + cache_keys[j].off);
        if (strcmp(key, "cache_bytes_written") == 0)
            return (long)ctx->cache_bytes_written;
        if (strcmp(key, "cache_usage") == 0)
            return (long)fr_ocache_usage(ctx->cache);
        if (strncmp(key, "cache_file.", 11) == 0) /* the hits' engine */
            return ctx->file_engine ? ctx->file_engine->stat(ctx->file_state, key + 11) : -1;
    }
    if (strncmp(key, "fd_cache_", 9) == 0 && ctx->ranges_state) /* io_uring's file ranges */
        return fr_engine_psync.stat(ctx->ranges_state, key);
    if (strncmp(key, "psync.", 6) == 0) /* the auto context's psync side */
        return ctx->alt_state ? fr_engine_psync.stat(ctx->alt_state, key + 6) : -1;
    return ctx->engine->stat ? ctx->engine->stat(ctx->state, key) : -1;
}
