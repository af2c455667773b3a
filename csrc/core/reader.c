/*
 * A reader: `workers` native threads, each owning an engine context, read
 * submitted batches ahead of the consumer. Batches are handed out strictly in
 * submission order, whichever worker finished first. At most
 * prefetch + workers - 1 batches are read or waiting at any time.
 *
 * Several workers keep more I/O in flight (cold caches, fast devices) and
 * use more cores for the copies out of the page cache.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base.h"
#include "core/reader_internal.h"
#include "core/path_table.h"
#include "core/size_memo.h"
#include "engines/engine.h"
#include "gpu/gpu.h"
#include "engines/range_io.h"


/* Context counters a reader sums over its workers (fr_reader_stat). */
static const char *const summed_keys[] = {
    "cache_hits",  "cache_misses", "cache_damaged", "cache_bytes_written", "cache_write_errors",
    "cache_evictions", "cache_waits", "s3_requests", "s3_bytes", "file_calls",
    "cql_requests", "cql_retries", "cql_bytes",
    /* the cql engine's peak of requests in flight: the sum of the workers' peaks */
    "cql_inflight_max",
    /* table readers (fr_read_file_ranges): files opened, descriptors evicted,
     * reads (one per run of nearby ranges: psync.c) */
    "fd_cache_opens", "fd_cache_evictions", "fd_cache_reads", "fd_cache_hits",
    /* gauges: a worker adds its change, so the total is the sum of now's */
    "s3_buffer_bytes", "s3_buffer_bytes_max",
    "fd_cache_open", /* descriptors the workers' LRUs hold */
    "file_ranges_native", /* workers reading file ranges on io_uring rings */
};
#define NSUMMED (sizeof(summed_keys) / sizeof(summed_keys[0]))
_Static_assert(NSUMMED == FR_READER_NSUMMED, "FR_READER_NSUMMED (reader_internal.h) counts summed_keys");

/* A submitted batch: dataset indices (fr_reader_submit), or a list of
 * paths of its own (fr_reader_submit_paths: indices NULL, `paths` pointing
 * into `blob`, both owned by the request). */
typedef struct request {
    int64_t *indices;
    const char **paths;
    char *blob;
    size_t n;
    struct request *next;
} request;

static void free_request(request *r)
{
    free(r->indices);
    free(r->paths);
    free(r->blob);
    free(r);
}


static void free_requests(request *r)
{
    while (r) {
        request *next = r->next;
        free_request(r);
        r = next;
    }
}

typedef struct scratch {
    const char **paths;
    int64_t *hints;
    uint64_t *hashes; /* explicit lists: the paths' hashes in the memo */
    fr_range *ranges;
    uint8_t *keys;
    fr_file_range *jobs;
    char *pbuf; /* a tree reader's batch of paths, back to back */
    size_t cap, rcap, kcap, jcap, pcap;
} scratch;

static int read_keys_request(fr_reader *rd, fr_ctx *ctx, const request *req, fr_batch *b,
                             scratch *sc)
{
    if (fr_grow((void **)&sc->keys, &sc->kcap, req->n, rd->key_len, req->n))
        return -ENOMEM;
    for (size_t i = 0; i < req->n; i++) {
        b->indices[i] = req->indices[i];
        memcpy(sc->keys + i * rd->key_len, rd->keys + (size_t)req->indices[i] * rd->key_len,
               rd->key_len);
    }
    return fr_read_keys(ctx, sc->keys, rd->key_len, req->n, b);
}

static int read_ranges_request(fr_reader *rd, fr_ctx *ctx, const request *req, fr_batch *b,
                               scratch *sc)
{
    if (fr_grow((void **)&sc->ranges, &sc->rcap, req->n, sizeof(*sc->ranges), req->n))
        return -ENOMEM;
    for (size_t i = 0; i < req->n; i++) {
        b->indices[i] = req->indices[i];
        size_t idx = (size_t)req->indices[i];
        sc->ranges[i] = rd->ranges ? rd->ranges[idx]
                                   : (fr_range){.offset = rd->c_offsets[idx],
                                                .length = rd->c_lengths[idx]};
    }
    return fr_read_ranges(ctx, rd->image, sc->ranges, req->n, b);
}

static int read_table_request(fr_reader *rd, fr_ctx *ctx, const request *req, fr_batch *b,
                              scratch *sc)
{
    if (fr_grow((void **)&sc->jobs, &sc->jcap, req->n, sizeof(*sc->jobs), req->n))
        return -ENOMEM;
    for (size_t i = 0; i < req->n; i++) {
        size_t idx = (size_t)req->indices[i];
        b->indices[i] = req->indices[i];
        /* A file index past the table is that sample's -EINVAL (the engine's
         * check): the columns are not walked at open. */
        sc->jobs[i] = (fr_file_range){.file = rd->t_files[idx],
                                      .offset = rd->t_offsets[idx],
                                      .length = rd->t_lengths32 ? rd->t_lengths32[idx]
                                                                : rd->t_lengths[idx]};
    }
    return fr_read_file_ranges(ctx, rd->paths, rd->nfiles, sc->jobs, req->n, b);
}

static int grow_scratch(scratch *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    const char **p = realloc(sc->paths, n * sizeof(*p));
    if (!p)
        return -ENOMEM;
    sc->paths = p;
    int64_t *h = realloc(sc->hints, n * sizeof(*h));
    if (!h)
        return -ENOMEM;
    sc->hints = h;
    uint64_t *x = realloc(sc->hashes, n * sizeof(*x));
    if (!x)
        return -ENOMEM;
    sc->hashes = x;
    sc->cap = n;
    return 0;
}

/* The shared memo of explicit lists' sizes, made on first use; NULL when
 * sizes are not remembered (cfg.remember_sizes 0) or out of memory. */
static fr_size_memo *list_memo(fr_reader *rd)
{
    if (!rd->cfg.remember_sizes)
        return NULL;
    pthread_mutex_lock(&rd->lock);
    if (!rd->memo && rd->memo_made)
        rd->memo = fr_size_memo_new(rd->cfg.remember_sizes);
    fr_size_memo *m = rd->memo;
    pthread_mutex_unlock(&rd->lock);
    return m;
}

/* An explicit list: sample i is its i-th path, read with the sizes a
 * worker learnt from an earlier read of its files (as hints: a stale one
 * costs time, never bytes), or without hints the first time. */
/* A dense list batch whose read took the slow path: its first bytes are
 * reread here, from the list's paths, which only the request knows (a
 * batch's indices are positions in its list, not in the reader's paths, so
 * the consumer's repair by index would read another file's byte). */
static void repair_list_spill(const request *req, fr_batch *b)
{
    if (!b->dense_spill)
        return;
    for (size_t i = 0; i < req->n; i++)
        if (b->samples[i].length > 0)
            (void)fr_batch_reread_first_byte(b, i, req->paths[i]); /* errors land in the sample */
    b->dense_spill = 0;
}

static int read_list_request(fr_reader *rd, fr_ctx *ctx, const request *req, fr_batch *b,
                             scratch *sc)
{
    size_t n = req->n;
    for (size_t i = 0; i < n; i++)
        b->indices[i] = (int64_t)i;
    fr_size_memo *memo = n ? list_memo(rd) : NULL;
    if (!memo || grow_scratch(sc, n) != 0) {
        int rc = fr_read_files(ctx, req->paths, NULL, n, b);
        if (rc == 0)
            repair_list_spill(req, b);
        return rc;
    }
    pthread_rwlock_rdlock(&rd->memo_lock);
    size_t found = fr_size_memo_lookup(memo, req->paths, n, sc->hashes, sc->hints);
    pthread_rwlock_unlock(&rd->memo_lock);
    int rc = fr_read_files(ctx, req->paths, found == n ? sc->hints : NULL, n, b);
    if (rc)
        return rc;
    repair_list_spill(req, b);
    int changed = found != n;
    for (size_t i = 0; i < n && !changed; i++)
        changed = b->samples[i].length != sc->hints[i];
    if (changed) {
        pthread_rwlock_wrlock(&rd->memo_lock);
        fr_size_memo_store(memo, sc->hashes, b->samples, sc->hints, n);
        pthread_rwlock_unlock(&rd->memo_lock);
    }
    if (found == n) {
        pthread_mutex_lock(&rd->lock);
        rd->hinted_lists++;
        pthread_mutex_unlock(&rd->lock);
    }
    return 0;
}

static int read_request(fr_reader *rd, fr_ctx *ctx, const request *req, fr_batch *b, scratch *sc)
{
    int rc = fr_batch_prepare(b, req->n);
    if (rc)
        return rc;
    if (rd->image)
        return read_ranges_request(rd, ctx, req, b, sc);
    if (rd->table)
        return read_table_request(rd, ctx, req, b, sc);
    if (rd->keys)
        return read_keys_request(rd, ctx, req, b, sc);
    if (req->paths)
        return read_list_request(rd, ctx, req, b, sc);
    if ((rc = grow_scratch(sc, req->n)) != 0)
        return rc;
    if (rd->is_tree && (rc = fr_path_table_fill(&rd->tree, req->indices, req->n, &sc->pbuf,
                                                 &sc->pcap, sc->paths)) != 0)
        return rc;
    for (size_t i = 0; i < req->n; i++) {
        int64_t idx = req->indices[i];
        b->indices[i] = idx;
        if (!rd->is_tree)
            sc->paths[i] = rd->paths[idx];
        sc->hints[i] = __atomic_load_n(&rd->sizes[idx], __ATOMIC_RELAXED);
    }
    rc = fr_read_files(ctx, sc->paths, sc->hints, req->n, b);
    if (rc == 0)
        for (size_t i = 0; i < req->n; i++)
            __atomic_store_n(&rd->sizes[req->indices[i]],
                             b->samples[i].length >= 0 ? b->samples[i].length : -1,
                             __ATOMIC_RELAXED);
    return rc;
}

/* Inserts b into the ready list, kept sorted by seq. */
static void insert_ready(fr_reader *rd, fr_batch *b)
{
    fr_batch **at = &rd->ready;
    while (*at && (*at)->seq < b->seq)
        at = &(*at)->next;
    b->next = *at;
    *at = b;
    rd->nready++;
}

static int may_start(const fr_reader *rd)
{
    return rd->req_head && rd->nready + rd->nbusy < rd->prefetch + rd->nworkers - 1;
}

static void *worker_main(void *arg)
{
    fr_reader *rd = arg;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    char name[16];
    snprintf(name, sizeof(name), "fr-%.12s", rd->engine); /* 15 chars at most */
    pthread_setname_np(pthread_self(), name);
    /* Each worker opens its own context, so the thread that submits also set
     * it up. */
    int rc = fr_ctx_open(&rd->cfg, &ctx, err, sizeof(err));
    if (rc == 0 && strcmp(fr_ctx_engine(ctx), rd->engine) != 0) { /* "auto" resolved */
        snprintf(name, sizeof(name), "fr-%.12s", fr_ctx_engine(ctx));
        pthread_setname_np(pthread_self(), name);
    }
    pthread_mutex_lock(&rd->lock);
    if (rc && rd->open_rc == 0) {
        rd->open_rc = rc;
        memcpy(rd->open_err, err, sizeof(err));
    }
    if (rc == 0 && !rd->opened_engine[0]) {
        snprintf(rd->opened_engine, sizeof(rd->opened_engine), "%s", fr_ctx_engine(ctx));
        rd->auto_fallback = fr_ctx_stat(ctx, "auto_fallback");
    }
    rd->started++;
    pthread_cond_broadcast(&rd->ready_cv);
    if (rc) {
        pthread_mutex_unlock(&rd->lock);
        return NULL;
    }
    unsigned me = rd->nctxs++; /* < FR_READER_MAX_WORKERS: one per thread */
    rd->ctxs[me] = ctx;

    scratch sc = {0};
    long seen[NSUMMED] = {0}; /* this context's counters already in rd->totals */
    while (!rd->stop) {
        if (!may_start(rd)) {
            /* Woken by one signal per startable request (enqueue,
             * next_batch); the 100 ms bound re-checks anyway, so a signal
             * lost to glibc's condition-variable bug (sourceware 25847)
             * costs a pause, not a hang. */
            struct timespec until;
            if (clock_gettime(CLOCK_REALTIME, &until) != 0) {
                pthread_cond_wait(&rd->work_cv, &rd->lock);
                continue;
            }
            until.tv_nsec += 100000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            (void)pthread_cond_timedwait(&rd->work_cv, &rd->lock, &until); /* rechecked above */
            continue;
        }
        request *req = rd->req_head;
        rd->req_head = req->next;
        if (!rd->req_head)
            rd->req_tail = NULL;
        uint64_t gen = rd->generation;
        uint64_t seq = rd->next_seq++;
        int dense = rd->dense;
        rd->nbusy++;
        rd->reading[me] = 1;
        rd->reading_gen[me] = gen;
        fr_ctx_cancel(ctx, 0); /* a batch of this generation: read it */
        pthread_mutex_unlock(&rd->lock);

        fr_batch *b = fr_pool_get(rd->pool);
        if (b) {
            b->seq = seq;
            if (dense >= 0)
                b->dense = dense; /* the batch is this worker's alone until it is ready */
            rc = read_request(rd, ctx, req, b, &sc);
            if (rc) {
                b->count = 0;
                b->status = rc;
            }
        }
        free_request(req);

        long now[NSUMMED];
        for (size_t k = 0; k < NSUMMED; k++)
            now[k] = fr_ctx_stat(ctx, summed_keys[k]);
        pthread_mutex_lock(&rd->lock);
        for (size_t k = 0; k < NSUMMED; k++)
            if (now[k] >= 0) {
                rd->totals[k] += now[k] - seen[k];
                seen[k] = now[k];
            }
        rd->nbusy--;
        rd->reading[me] = 0;
        if (gen != rd->generation) {
            pthread_mutex_unlock(&rd->lock);
            fr_batch_recycle(b);
            pthread_mutex_lock(&rd->lock);
            pthread_cond_broadcast(&rd->work_cv);
            continue;
        }
        if (!b) {
            /* No memory for even a batch header: report it through the
             * consumer rather than dropping the request. */
            rd->open_rc = -ENOMEM;
            rd->stop = 1;
            pthread_cond_broadcast(&rd->ready_cv);
            pthread_cond_broadcast(&rd->work_cv);
            break;
        }
        insert_ready(rd, b);
        pthread_cond_broadcast(&rd->ready_cv);
    }
    rd->ctxs[me] = NULL; /* reset no longer cancels it: it is closed below */
    pthread_mutex_unlock(&rd->lock);
    free(sc.paths);
    free(sc.hints);
    free(sc.hashes);
    free(sc.ranges);
    free(sc.keys);
    free(sc.jobs);
    free(sc.pbuf);
    fr_ctx_close(ctx);
    return NULL;
}

void fr_reader_free_unstarted(fr_reader *rd)
{
    fr_size_memo_free(rd->memo);
    if (rd->memo_made)
        pthread_rwlock_destroy(&rd->memo_lock);
    fr_pool_close(rd->pool);
    fr_gpu_close(rd->gpu);
    free(rd->blob);
    free(rd->paths);
    free(rd->sizes);
    free(rd->image);
    free(rd->ranges);
    free(rd->keys);
    free(rd->engine_args);
    free(rd->cache_dir);
    free(rd);
}

/* The common part of opening: checks, the config copy and the pool. */
int fr_reader_new_unstarted(const fr_config *cfg, unsigned prefetch, unsigned workers,
                            fr_reader **out, char *err, size_t err_len)
{
    *out = NULL;
    if (prefetch == 0) {
        fr_set_err(err, err_len, "prefetch must be at least 1");
        return -EINVAL;
    }
    if (workers == 0 || workers > FR_READER_MAX_WORKERS) {
        fr_set_err(err, err_len, "workers must be in 1..%d, got %u", FR_READER_MAX_WORKERS, workers);
        return -EINVAL;
    }
    fr_reader *rd = calloc(1, sizeof(*rd));
    if (!rd)
        return -ENOMEM;
    rd->cfg = *cfg;
    rd->dense = -1;
    snprintf(rd->engine, sizeof(rd->engine), "%s", cfg->engine ? cfg->engine : "");
    rd->cfg.engine = rd->engine;
    rd->engine_args = strdup(cfg->engine_args ? cfg->engine_args : "");
    rd->cache_dir = strdup(cfg->cache_dir ? cfg->cache_dir : "");
    rd->pool = fr_pool_new();
    if (!rd->engine_args || !rd->cache_dir || !rd->pool) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    rd->cfg.engine_args = rd->engine_args;
    rd->cfg.cache_dir = rd->cache_dir;
    if (cfg->device_id >= 0 && !cfg->gpu &&
        (cfg->device_output || cfg->pin_memory || strcmp(rd->engine, "cufile") == 0)) {
        /* One fr_gpu for every worker: one driver load, one cuFile driver. */
        int rc = fr_gpu_open(cfg->device_id, &rd->gpu, err, err_len);
        if (rc) {
            fr_reader_free_unstarted(rd);
            return rc;
        }
        rd->cfg.gpu = rd->gpu;
    } else if (cfg->gpu) {
        fr_gpu_retain(cfg->gpu);
        rd->gpu = cfg->gpu;
    }
    if (rd->gpu && cfg->pin_memory)
        fr_pool_set_gpu(rd->pool, rd->gpu, 1);
    rd->prefetch = prefetch;
    rd->nworkers = workers;
    *out = rd;
    return 0;
}

int fr_reader_start(fr_reader *rd, fr_reader **out, char *err, size_t err_len)
{
    pthread_mutex_init(&rd->lock, NULL);
    /* Without it the lists are read without shared sizes (list_memo). */
    rd->memo_made = pthread_rwlock_init(&rd->memo_lock, NULL) == 0;
    pthread_cond_init(&rd->work_cv, NULL);
    pthread_cond_init(&rd->ready_cv, NULL);

    int rc = 0;
    for (unsigned i = 0; i < rd->nworkers; i++) {
        rc = pthread_create(&rd->threads[i], NULL, worker_main, rd);
        if (rc != 0) {
            fr_set_err(err, err_len, "cannot start reader thread %u: %s", i, strerror(rc));
            rc = -rc;
            break;
        }
        rd->nthreads++;
    }
    pthread_mutex_lock(&rd->lock);
    while (rd->started < rd->nthreads)
        pthread_cond_wait(&rd->ready_cv, &rd->lock);
    if (rc == 0 && rd->open_rc) {
        rc = rd->open_rc;
        fr_set_err(err, err_len, "%s", rd->open_err);
    }
    pthread_mutex_unlock(&rd->lock);
    if (rc) {
        fr_reader_close(rd);
        return rc;
    }
    *out = rd;
    return 0;
}

static void enqueue(fr_reader *rd, request *req);

int fr_reader_submit(fr_reader *rd, const int64_t *indices, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (indices[i] < 0 || (size_t)indices[i] >= rd->npaths)
            return -EINVAL;
    request *req = malloc(sizeof(*req));
    int64_t *copy = malloc((n ? n : 1) * sizeof(*copy));
    if (!req || !copy) {
        free(req);
        free(copy);
        return -ENOMEM;
    }
    memcpy(copy, indices, n * sizeof(*copy));
    *req = (request){.indices = copy, .n = n};
    enqueue(rd, req);
    return 0;
}

int fr_reader_submit_paths(fr_reader *rd, const char *const *paths, size_t n)
{
    if (rd->image || rd->keys || rd->table)
        return -EINVAL; /* a range, key or table reader reads its own samples only */
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += strlen(paths[i]) + 1;
    request *req = calloc(1, sizeof(*req));
    char *blob = malloc(total ? total : 1);
    const char **copy = malloc((n ? n : 1) * sizeof(*copy));
    if (!req || !blob || !copy) {
        free(req);
        free(blob);
        free(copy);
        return -ENOMEM;
    }
    char *p = blob;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(paths[i]) + 1;
        memcpy(p, paths[i], len);
        copy[i] = p;
        p += len;
    }
    *req = (request){.paths = copy, .blob = blob, .n = n};
    enqueue(rd, req);
    return 0;
}

static void enqueue(fr_reader *rd, request *req)
{
    pthread_mutex_lock(&rd->lock);
    if (rd->req_tail)
        rd->req_tail->next = req;
    else
        rd->req_head = req;
    rd->req_tail = req;
    rd->outstanding++;
    /* One worker, and only if one may start now: a wake that finds the
     * read-ahead full puts the worker straight back to sleep (see
     * next_batch). */
    if (may_start(rd))
        pthread_cond_signal(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
}

/* timeout_ms < 0: wait as long as it takes. */
static int next_batch(fr_reader *rd, fr_batch **out, long timeout_ms)
{
    *out = NULL;
    struct timespec deadline;
    if (timeout_ms >= 0) {
        if (clock_gettime(CLOCK_REALTIME, &deadline) != 0)
            return -errno;
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&rd->lock);
    if (rd->outstanding == 0) {
        pthread_mutex_unlock(&rd->lock);
        return -ENODATA;
    }
    while (!(rd->ready && rd->ready->seq == rd->deliver_seq) && !rd->stop) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&rd->ready_cv, &rd->lock);
        } else if (pthread_cond_timedwait(&rd->ready_cv, &rd->lock, &deadline) == ETIMEDOUT &&
                   !(rd->ready && rd->ready->seq == rd->deliver_seq) && !rd->stop) {
            pthread_mutex_unlock(&rd->lock);
            return -ETIMEDOUT;
        }
    }
    if (!(rd->ready && rd->ready->seq == rd->deliver_seq)) {
        int rc = rd->open_rc ? rd->open_rc : -EPIPE;
        pthread_mutex_unlock(&rd->lock);
        return rc;
    }
    fr_batch *b = rd->ready;
    rd->ready = b->next;
    rd->nready--;
    rd->outstanding--;
    rd->deliver_seq++;
    b->next = NULL;
    /* Taking a batch frees one place in the read-ahead: one worker may
     * start, if a request waits. A broadcast here woke every idle worker
     * per batch, all but one to sleep again, and read_batches (whose lists
     * come one per next) paid it with nothing queued: on 16 cores, where
     * the consumer's thread is the limit, those wakes are its time. A
     * worker that is busy now checks may_start before it waits. */
    if (may_start(rd))
        pthread_cond_signal(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    *out = b;
    return 0;
}

int fr_reader_next(fr_reader *rd, fr_batch **out) { return next_batch(rd, out, -1); }

int fr_reader_next_timed(fr_reader *rd, fr_batch **out, unsigned timeout_ms)
{
    return next_batch(rd, out, (long)timeout_ms);
}

void fr_reader_reset(fr_reader *rd)
{
    pthread_mutex_lock(&rd->lock);
    request *reqs = rd->req_head;
    fr_batch *ready = rd->ready;
    rd->req_head = rd->req_tail = NULL;
    rd->ready = NULL;
    rd->nready = 0;
    rd->outstanding = 0;
    rd->generation++;
    /* Batches being read now carry older seqs and the old generation: they
     * are dropped when they finish. */
    rd->deliver_seq = rd->next_seq;
    for (unsigned w = 0; w < rd->nctxs; w++)
        if (rd->ctxs[w] && rd->reading[w] && rd->reading_gen[w] != rd->generation)
            fr_ctx_cancel(rd->ctxs[w], 1);
    pthread_cond_broadcast(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    free_requests(reqs);
    while (ready) {
        fr_batch *next = ready->next;
        fr_batch_recycle(ready);
        ready = next;
    }
}

size_t fr_reader_pending(fr_reader *rd)
{
    pthread_mutex_lock(&rd->lock);
    size_t n = rd->outstanding;
    pthread_mutex_unlock(&rd->lock);
    return n;
}

const char *fr_reader_path(const fr_reader *rd, size_t index)
{
    if (index >= rd->npaths || rd->is_tree)
        return NULL;
    if (rd->keys)
        return "";
    if (rd->table) {
        uint32_t f = rd->t_files[index];
        return f < rd->nfiles ? rd->paths[f] : NULL;
    }
    return rd->image ? rd->image : rd->paths[index];
}

size_t fr_reader_path_copy(const fr_reader *rd, size_t index, char *buf, size_t cap)
{
    if (index < rd->npaths && rd->is_tree)
        return fr_path_table_get(&rd->tree, index, buf, cap);
    const char *p = fr_reader_path(rd, index);
    if (!p)
        return (size_t)-1;
    size_t len = strlen(p);
    if (len < cap)
        memcpy(buf, p, len + 1);
    return len;
}

const char *fr_reader_engine(const fr_reader *reader)
{
    return reader->opened_engine[0] ? reader->opened_engine : reader->engine;
}

long fr_reader_auto_fallback(const fr_reader *reader) { return reader->auto_fallback; }

size_t fr_reader_size(const fr_reader *rd) { return rd->npaths; }

long fr_reader_stat(fr_reader *rd, const char *key)
{
    long v = -1;
    pthread_mutex_lock(&rd->lock);
    if (strcmp(key, "hinted_lists") == 0)
        v = rd->hinted_lists;
    for (size_t k = 0; k < NSUMMED; k++)
        if (strcmp(key, summed_keys[k]) == 0)
            v = rd->totals[k];
    pthread_mutex_unlock(&rd->lock);
    return v;
}

fr_pool *fr_reader_pool(fr_reader *rd) { return rd->pool; }

fr_gpu *fr_reader_gpu(fr_reader *rd) { return rd->gpu; }

void fr_reader_set_dense(fr_reader *rd, int dense)
{
    pthread_mutex_lock(&rd->lock);
    rd->dense = dense ? 1 : 0;
    pthread_mutex_unlock(&rd->lock);
}

void fr_reader_close(fr_reader *rd)
{
    if (!rd)
        return;
    fr_reader_reset(rd);
    pthread_mutex_lock(&rd->lock);
    rd->stop = 1;
    pthread_cond_broadcast(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    for (unsigned i = 0; i < rd->nthreads; i++)
        pthread_join(rd->threads[i], NULL);
    pthread_cond_destroy(&rd->work_cv);
    pthread_cond_destroy(&rd->ready_cv);
    pthread_mutex_destroy(&rd->lock);
    /* Batches the caller still holds keep the pool, and their memory, alive. */
    fr_reader_free_unstarted(rd);
}
