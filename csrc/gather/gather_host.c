/*
 * The host backend of row gathers (gather_host.h).
 *
 * One gather: (1) validate the ids in input order (the first bad position is
 * what the caller reports); (2) sort (id, position) pairs with an LSD radix
 * sort over just the bits that row numbers use (1M ids: 2 passes of 11 bits
 * for 4M rows), stable, so duplicates keep input order; (3) walk the sorted
 * ids and coalesce nearby rows into one range read, merging across a gap of
 * unneeded bytes when reading the gap costs less than a separate request
 * (see GAP_*); (4) cut the ranges into chunks of a few MiB and let every
 * host thread read chunks through its own engine context (fr_read_ranges)
 * into its own arena; (5) each thread copies the rows of its chunk to their
 * input positions in `out` (disjoint, so no locks).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "fastread.h"
#include "gather/gather_host.h"
#include "core/threadpool.h"

/* O_DIRECT granularity assumed for coalescing (the engines' default
 * direct_alignment; 4 KiB is the logical block of every NVMe/ext4/xfs setup
 * we read). */
#define DIO_ALIGN ((uint64_t)4096)

/* Merge two runs of rows when the bytes between them are at most this: a
 * separate request costs a fixed ~2-4 us through the page cache (syscall or
 * SQE + completion, page lookups), about what copying 16 KiB costs; on a
 * cold NVMe drive a request costs ~10-80 us, about 64 KiB of transfer at a
 * few GB/s, and O_DIRECT reads never touch the page cache, so the larger
 * gap is used with O_DIRECT. */
#define GAP_BUFFERED ((uint64_t)16 << 10)
#define GAP_DIRECT ((uint64_t)64 << 10)
/* A merged range stops growing here, so chunks stay balanced across threads. */
#define MAX_RANGE_BYTES ((uint64_t)4 << 20)
/* A chunk (one fr_read_ranges call) holds at most this many bytes or ranges. */
#define CHUNK_BYTES ((uint64_t)8 << 20)
#define CHUNK_RANGES ((size_t)1024)

typedef struct pair {
    uint64_t id;
    uint64_t pos;
} pair;

/* One coalesced read: file bytes [lo, hi), serving sorted[first, first+count). */
typedef struct hrange {
    uint64_t lo, hi;
    size_t first, count;
} hrange;

typedef struct worker {
    fr_ctx *ctx;
    fr_pool *pool;
    fr_batch *batch;
    fr_range *fr;
    size_t fr_cap;
} worker;

struct fr_host_gather {
    char *path;
    uint64_t offset, rows, row_bytes;
    int direct;
    uint64_t gap;
    const atomic_int *cancel;
    char engine[32];

    unsigned nthreads;
    worker *w;
    fr_threadpool *pool;

    /* Scratch kept between gathers (gathers run one at a time). */
    pair *a, *b;
    size_t pair_cap;
    hrange *ranges;
    size_t range_cap, nranges;
    size_t *chunk; /* chunk k: ranges [chunk[k], chunk[k+1]) */
    size_t chunk_cap, nchunks;

    /* The last gather's time: checks, sort and plan; reads and scatter. */
    double prep_us, read_us;

    /* The gather in flight. */
    uint8_t *out;
    atomic_uint next_slot;
    pthread_mutex_t err_lock;
    int rc;
    char err[FR_ERRLEN];
};

int fr_host_file_size(const char *path, uint64_t *size, char *err, size_t err_len)
{
    struct stat st;
    int fd = fr_open_data(path, 0, 1, &st);
    if (fd == -EISDIR || fd == -EINVAL) {
        fr_set_err(err, err_len, "%s is not a regular file or block device", path);
        return fd;
    }
    if (fd < 0) {
        fr_set_err(err, err_len, "cannot open %s: %s", path, strerror(-fd));
        return fd;
    }
    int rc = 0;
    if (S_ISREG(st.st_mode)) {
        *size = (uint64_t)st.st_size;
    } else {
        uint64_t bytes = 0;
        if (ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
            rc = -errno;
            fr_set_err(err, err_len, "cannot size block device %s: %s", path, strerror(-rc));
        }
        *size = bytes;
    }
    close(fd);
    return rc;
}

static void set_run_error(fr_host_gather *g, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_run_error(fr_host_gather *g, int rc, const char *fmt, ...)
{
    pthread_mutex_lock(&g->err_lock);
    if (g->rc == 0) {
        g->rc = rc;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->err, sizeof(g->err), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&g->err_lock);
}

static int run_failed(fr_host_gather *g)
{
    pthread_mutex_lock(&g->err_lock);
    int rc = g->rc;
    pthread_mutex_unlock(&g->err_lock);
    return rc;
}

/* Reads and scatters one chunk with worker w. */
static void do_chunk(fr_host_gather *g, worker *w, size_t k)
{
    size_t r0 = g->chunk[k], r1 = g->chunk[k + 1], m = r1 - r0;
    if (w->fr_cap < m) {
        fr_range *nf = realloc(w->fr, m * sizeof(*nf));
        if (!nf) {
            set_run_error(g, -ENOMEM, "out of memory for %zu range reads", m);
            return;
        }
        w->fr = nf;
        w->fr_cap = m;
    }
    for (size_t i = 0; i < m; i++) {
        w->fr[i].offset = g->ranges[r0 + i].lo;
        w->fr[i].length = g->ranges[r0 + i].hi - g->ranges[r0 + i].lo;
    }
    int rc = fr_batch_prepare(w->batch, m);
    if (rc == 0)
        rc = fr_read_ranges(w->ctx, g->path, w->fr, m, w->batch);
    if (rc) {
        set_run_error(g, rc, "reading rows of %s with %s: %s", g->path, g->engine,
                      strerror(-rc));
        return;
    }
    const pair *sorted = g->a;
    for (size_t i = 0; i < m; i++) {
        const hrange *r = &g->ranges[r0 + i];
        const fr_sample *s = &w->batch->samples[i];
        if (s->length != (int64_t)(r->hi - r->lo)) {
            int e = s->length < 0 ? (int)s->length : -ENODATA;
            set_run_error(g, e == -ENODATA ? -EIO : e,
                          "reading rows of %s (bytes %llu..%llu) with %s: %s", g->path,
                          (unsigned long long)r->lo, (unsigned long long)r->hi, g->engine,
                          s->length < 0 ? strerror((int)-s->length) : "the file ended early");
            return;
        }
        const uint8_t *base = w->batch->arena.base + s->offset;
        for (size_t j = r->first; j < r->first + r->count; j++) {
            uint64_t at = g->offset + sorted[j].id * g->row_bytes - r->lo;
            memcpy(g->out + sorted[j].pos * g->row_bytes, base + at, g->row_bytes);
        }
    }
}

static void phase_fn(void *arg, int phase)
{
    (void)phase;
    fr_host_gather *g = arg;
    unsigned slot = atomic_fetch_add(&g->next_slot, 1);
    worker *w = &g->w[slot];
    size_t k;
    while (fr_threadpool_claim(g->pool, &k)) {
        if (run_failed(g))
            continue; /* drain the claims; the gather already failed */
        if (g->cancel && atomic_load(g->cancel)) {
            set_run_error(g, -ECANCELED, "gather from %s cancelled: the store is closing",
                          g->path);
            continue;
        }
        do_chunk(g, w, k);
    }
}

static void close_workers(fr_host_gather *g)
{
    if (!g->w)
        return;
    for (unsigned i = 0; i < g->nthreads; i++) {
        worker *w = &g->w[i];
        if (w->batch)
            fr_batch_recycle(w->batch);
        if (w->pool)
            fr_pool_close(w->pool);
        fr_ctx_close(w->ctx);
        free(w->fr);
    }
    free(g->w);
    g->w = NULL;
}

void fr_host_gather_close(fr_host_gather *g)
{
    if (!g)
        return;
    fr_threadpool_stop(g->pool);
    close_workers(g);
    pthread_mutex_destroy(&g->err_lock);
    free(g->a);
    free(g->b);
    free(g->ranges);
    free(g->chunk);
    free(g->path);
    free(g);
}

static unsigned default_threads(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned t = cpus > 1 ? (unsigned)(cpus / 2) : 1;
    return t > 8 ? 8 : t;
}

int fr_host_gather_open(const fr_host_gather_config *cfg, fr_host_gather **out, char *err,
                        size_t err_len)
{
    *out = NULL;
    if (!cfg->path || !cfg->path[0]) {
        fr_set_err(err, err_len, "a store needs a path");
        return -EINVAL;
    }
    if (cfg->row_bytes == 0 || cfg->rows == 0) {
        fr_set_err(err, err_len, "%s: rows and row_bytes must be > 0 (got %llu rows of %llu bytes)",
                   cfg->path, (unsigned long long)cfg->rows, (unsigned long long)cfg->row_bytes);
        return -EINVAL;
    }
    if (cfg->rows > UINT64_MAX / cfg->row_bytes ||
        cfg->offset > UINT64_MAX - cfg->rows * cfg->row_bytes) {
        fr_set_err(err, err_len, "%s: offset + rows * row_bytes overflows", cfg->path);
        return -EOVERFLOW;
    }
    uint64_t need = cfg->offset + cfg->rows * cfg->row_bytes, size = 0;
    /* An s3:// object is no local file to stat: the caller sized it
     * (fastread.FeatureStore, from a listing) and an object that shrank
     * since fails the gather that reads past its end (ENODATA). */
    const int url = strncmp(cfg->path, "s3://", 5) == 0;
    int rc = url ? 0 : fr_host_file_size(cfg->path, &size, err, err_len);
    if (rc)
        return rc;
    if (!url && size < need) {
        fr_set_err(err, err_len,
                   "%s holds %llu bytes, shorter than offset %llu + %llu rows x %llu bytes = %llu",
                   cfg->path, (unsigned long long)size, (unsigned long long)cfg->offset,
                   (unsigned long long)cfg->rows, (unsigned long long)cfg->row_bytes,
                   (unsigned long long)need);
        return -EINVAL;
    }
    const char *engine = cfg->engine && cfg->engine[0] ? cfg->engine : "auto";
    if (strcmp(engine, "auto") == 0) /* the core's choice (ctx.c), named for messages */
        engine = fr_engine_auto(NULL, NULL, 0);

    fr_host_gather *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    if (pthread_mutex_init(&g->err_lock, NULL) != 0) {
        free(g);
        return -ENOMEM;
    }
    g->path = strdup(cfg->path);
    g->offset = cfg->offset;
    g->rows = cfg->rows;
    g->row_bytes = cfg->row_bytes;
    g->cancel = cfg->cancel;
    snprintf(g->engine, sizeof(g->engine), "%s", engine);
    /* -1: O_DIRECT only where every row read is block-aligned as it stands
     * (no read amplification and no page-cache copy); rows smaller than a
     * block are better served by the page cache, which also keeps them warm. */
    g->direct = cfg->o_direct > 0 ||
                (cfg->o_direct < 0 && cfg->offset % DIO_ALIGN == 0 &&
                 cfg->row_bytes % DIO_ALIGN == 0);
    g->gap = g->direct ? GAP_DIRECT : GAP_BUFFERED;
    g->nthreads = cfg->threads ? cfg->threads : default_threads();
    if (g->nthreads > 64)
        g->nthreads = 64;
    g->w = calloc(g->nthreads, sizeof(*g->w));
    if (!g->path || !g->w) {
        fr_host_gather_close(g);
        return -ENOMEM;
    }
    fr_config c;
    fr_config_init(&c);
    c.engine = g->engine;
    c.engine_args = cfg->engine_args ? cfg->engine_args : "";
    c.o_direct = g->direct;
    c.direct_alignment = (unsigned)DIO_ALIGN;
    if (cfg->queue_depth)
        c.queue_depth = cfg->queue_depth;
    /* psync's depth is its thread count: about 32 preads in flight over all
     * host threads unless queue_depth says otherwise. */
    unsigned depth = cfg->queue_depth ? cfg->queue_depth : 32;
    c.threads = depth / g->nthreads ? depth / g->nthreads : 1;
    for (unsigned i = 0; i < g->nthreads; i++) {
        worker *w = &g->w[i];
        char why[FR_ERRLEN];
        rc = fr_ctx_open(&c, &w->ctx, why, sizeof(why));
        if (rc) {
            fr_set_err(err, err_len, "store %s: engine %s: %s", g->path, g->engine, why);
            fr_host_gather_close(g);
            return rc;
        }
        w->pool = fr_pool_new();
        w->batch = w->pool ? fr_pool_get(w->pool) : NULL;
        if (!w->batch) {
            fr_host_gather_close(g);
            return -ENOMEM;
        }
        if (i == 0 && (rc = fr_read_ranges(w->ctx, g->path, NULL, 0, w->batch)) != 0) {
            fr_set_err(err, err_len, "store %s: engine %s cannot read byte ranges (%s)", g->path,
                       g->engine, strerror(-rc));
            fr_host_gather_close(g);
            return rc;
        }
    }
    rc = fr_threadpool_start(&g->pool, g->nthreads - 1, phase_fn, g, "fastread store", err,
                             err_len);
    if (rc) {
        fr_host_gather_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Stable LSD radix sort of pairs by id (ids < rows), 11 bits a pass. The
 * result lands in g->a. */
static void sort_pairs(fr_host_gather *g, size_t n)
{
    if (n < 64) {
        pair *a = g->a;
        for (size_t i = 1; i < n; i++) {
            pair x = a[i];
            size_t j = i;
            for (; j > 0 && a[j - 1].id > x.id; j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    unsigned bits = 0;
    while (bits < 64 && (g->rows - 1) >> bits)
        bits++;
    pair *src = g->a, *dst = g->b;
    for (unsigned shift = 0; shift < bits; shift += 11) {
        size_t count[2048] = {0};
        for (size_t i = 0; i < n; i++)
            count[(src[i].id >> shift) & 2047]++;
        size_t sum = 0;
        for (size_t d = 0; d < 2048; d++) {
            size_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i].id >> shift) & 2047]++] = src[i];
        pair *t = src;
        src = dst;
        dst = t;
    }
    if (src != g->a) {
        g->b = g->a;
        g->a = src;
    }
}

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (*cap >= want)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < want)
        c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np)
        return -ENOMEM;
    *p = np;
    *cap = c;
    return 0;
}

/* Coalesces the sorted ids into ranges and the ranges into chunks. */
static int plan(fr_host_gather *g, size_t n, fr_host_gather_counts *counts)
{
    g->nranges = 0;
    const pair *s = g->a;
    hrange *cur = NULL;
    for (size_t j = 0; j < n; j++) {
        uint64_t lo = g->offset + s[j].id * g->row_bytes, hi = lo + g->row_bytes;
        uint64_t lo_al = g->direct ? lo & ~(DIO_ALIGN - 1) : lo;
        if (cur && lo_al <= cur->hi + g->gap && hi - cur->lo <= MAX_RANGE_BYTES) {
            if (hi > cur->hi)
                cur->hi = hi;
            cur->count++;
            continue;
        }
        if (grow((void **)&g->ranges, &g->range_cap, g->nranges + 1, sizeof(hrange)))
            return -ENOMEM;
        cur = &g->ranges[g->nranges++];
        cur->lo = lo_al;
        cur->hi = hi;
        cur->first = j;
        cur->count = 1;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < g->nranges; i++)
        total += g->ranges[i].hi - g->ranges[i].lo;
    counts->reads += g->nranges;
    counts->bytes += total;
    counts->coalesced += n - g->nranges;
    /* Chunks: about four per thread for balance, within CHUNK_BYTES/RANGES. */
    uint64_t target = total / ((uint64_t)g->nthreads * 4) + 1;
    if (target > CHUNK_BYTES)
        target = CHUNK_BYTES;
    if (target < ((uint64_t)256 << 10))
        target = (uint64_t)256 << 10;
    g->nchunks = 0;
    if (grow((void **)&g->chunk, &g->chunk_cap, 1, sizeof(size_t)))
        return -ENOMEM;
    g->chunk[0] = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < g->nranges; i++) {
        bytes += g->ranges[i].hi - g->ranges[i].lo;
        if (bytes >= target || i + 1 - g->chunk[g->nchunks] >= CHUNK_RANGES ||
            i + 1 == g->nranges) {
            if (grow((void **)&g->chunk, &g->chunk_cap, g->nchunks + 2, sizeof(size_t)))
                return -ENOMEM;
            g->chunk[++g->nchunks] = i + 1;
            bytes = 0;
        }
    }
    return 0;
}

static double mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int run_any(fr_host_gather *g, const void *ids, int id_bytes, size_t n, void *out,
                   size_t *bad_index, fr_host_gather_counts *counts, char *err, size_t err_len)
{
    g->prep_us = g->read_us = 0;
    if (n == 0)
        return 0;
    double t0 = mono_us();
    if (grow((void **)&g->a, &g->pair_cap, n, sizeof(pair)))
        return -ENOMEM;
    /* g->b (the radix sort's other buffer) follows g->a's capacity. */
    pair *nb = realloc(g->b, g->pair_cap * sizeof(pair));
    if (!nb)
        return -ENOMEM;
    g->b = nb;
    for (size_t i = 0; i < n; i++) {
        int64_t id = id_bytes == 4 ? (int64_t)((const int32_t *)ids)[i] : ((const int64_t *)ids)[i];
        if (id < 0 || (uint64_t)id >= g->rows) {
            if (bad_index)
                *bad_index = i;
            fr_set_err(err, err_len, "row id %lld at position %zu is out of range [0, %llu) of %s",
                       (long long)id, i, (unsigned long long)g->rows, g->path);
            return -ERANGE;
        }
        g->a[i].id = (uint64_t)id;
        g->a[i].pos = i;
    }
    sort_pairs(g, n);
    int rc = plan(g, n, counts);
    if (rc)
        return rc;
    double t1 = mono_us();
    g->out = out;
    g->rc = 0;
    g->err[0] = 0;
    atomic_store(&g->next_slot, 0);
    fr_threadpool_run(g->pool, 0, g->nchunks);
    g->prep_us = t1 - t0;
    g->read_us = mono_us() - t1;
    if (g->rc)
        fr_set_err(err, err_len, "%s", g->err);
    return g->rc;
}

int fr_host_gather_run(fr_host_gather *g, const int64_t *ids, size_t n, void *out,
                       size_t *bad_index, fr_host_gather_counts *counts, char *err,
                       size_t err_len)
{
    return run_any(g, ids, 8, n, out, bad_index, counts, err, err_len);
}

int fr_host_gather_run32(fr_host_gather *g, const int32_t *ids, size_t n, void *out,
                         size_t *bad_index, fr_host_gather_counts *counts, char *err,
                         size_t err_len)
{
    return run_any(g, ids, 4, n, out, bad_index, counts, err, err_len);
}

uint64_t fr_host_gather_bytes(fr_host_gather *g)
{
    uint64_t b = (uint64_t)g->pair_cap * 2 * sizeof(pair) + g->range_cap * sizeof(hrange) +
                 g->chunk_cap * sizeof(size_t);
    for (unsigned i = 0; i < g->nthreads; i++)
        b += g->w[i].batch->arena.capacity + g->w[i].fr_cap * sizeof(fr_range) +
             g->w[i].batch->samples_cap * sizeof(fr_sample);
    return b;
}

const char *fr_host_gather_engine(const fr_host_gather *g) { return g->engine; }
void fr_host_gather_last_times(const fr_host_gather *g, double *prep_us, double *read_us)
{
    *prep_us = g->prep_us;
    *read_us = g->read_us;
}
int fr_host_gather_direct(const fr_host_gather *g) { return g->direct; }
