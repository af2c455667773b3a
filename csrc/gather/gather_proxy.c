/*
 * The "proxy" backend of the device path (gather_backend.h): GPU threads
 * submit page reads into a ring of cells in page-locked host memory mapped
 * into the device (fastread_device.cuh); host service threads drain it and
 * serve the reads into each cell's staging page, and post completions; the
 * GPU thread copies staging -> cache slot (or, for row lists, the warp
 * copies the rows to the output).
 *
 * Service threads: `nsvc` (a power of two) threads, thread k owning the
 * tickets k, k + nsvc, k + 2 nsvc, ... in order (one consumer per cell, so
 * no locks or CAS on the host side). A thread drains its shard in batches:
 * every consecutive submitted ticket, up to `batch_max`, becomes one
 * fr_read_ranges call on its own engine context (io_uring: one submit for
 * the whole batch; psync: its thread pool), so the queue depth seen by the
 * storage is nsvc * batch_max. They poll only between begin() and end()
 * (a gather in flight), spinning briefly, then sleeping 20 us between
 * looks; idle stores cost no CPU.
 *
 * Requests are pages of the array (page loads) or row lists
 * (FR_RING_ROWS: up to FR_RING_MAX_ROWS rows of one warp, whose offsets the
 * kernel writes into the cell's staging; row fetches). Each is served by the
 * first way that can:
 *   1. Mapped copies. Where reads are buffered the array is also mapped
 *      read-only, and a session whose array the page cache holds (fstat
 *      still finds it whole, and 32 pages drawn at random are resident:
 *      mincore, at the first begin()) is served by memcpy from the mapping,
 *      no syscall per row. 2-core VM, 1 GiB cached, random 512-byte rows,
 *      one thread: 1.5 us per preadv2, 0.27-0.33 us per copy. H100 machine,
 *      16M x 512 B rows, 1 GiB cache, 1M ids, warm: 3.5M rows/s with one
 *      preadv2 per row request, 8.0M with copies, 28.9M with copies of row
 *      lists (docs/results/gather-h100-16Mx128-rings-*). A page evicted
 *      mid-gather costs its thread a blocking fault (the kernel reads it).
 *      Each serve() of up to batch_max requests first checks the file's
 *      size (one fstat per up to 1024 rows), and a file found shrunk is
 *      read by the engine from then on, which names the lost rows; a file
 *      truncated in the microseconds between that check and the copies
 *      would still fault with SIGBUS, as np.memmap does at any time, so
 *      $FASTREAD_PROXY_MAPPED=0 turns copies off where files may shrink
 *      under a running gather.
 *   2. $FASTREAD_PROXY_URING=1 (io_uring built in; page requests): each
 *      service thread's own small ring, a batch of reads straight into
 *      staging in one io_uring_enter. Opt-in: on the H100 machine it was no
 *      faster than preadv2 for row requests (3.5M against 3.9M rows/s).
 *   3. preadv2(RWF_NOWAIT) of what the page cache holds, straight into
 *      staging.
 *   4. The engine, every piece left of the batch in one fr_read_ranges (the
 *      deep queue cold data needs).
 *
 * Counters are per service thread (summed by counters()): one shared
 * atomic per request was a contended line between 8-16 threads.
 *
 * O_DIRECT: with o_direct -1 where every page read is aligned as it stands
 * (offset a multiple of 4 KiB; pages are >= 4 KiB powers of two), else as
 * asked (1: reads are widened to aligned blocks and the page cut out).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifdef FASTREAD_HAVE_URING
#include <liburing.h>
#endif

#include "core/base.h"
#include "gather/gather_backend.h"
#include "gpu/gpu.h"

#define DIO_ALIGN ((uint64_t)4096)

typedef struct proxy proxy;

/* One per service thread, each on its own cache lines (the counters are
 * written per request). */
typedef struct svc {
    _Alignas(64) proxy *p;
    unsigned shard;
    pthread_t thread;
    int started;
    fr_ctx *ctx;
    fr_pool *pool;
    fr_batch *batch;
    uint64_t head; /* the next ticket of this shard */
    fr_range *ranges;
    uint64_t *starts;
    uint64_t *pos;   /* the ticket of each range (requests left to the engine) */
    uint32_t *ats;   /* where in its request's staging each range goes */
    atomic_ullong reads, bytes; /* this thread's, taken by counters() */
#ifdef FASTREAD_HAVE_URING
    struct io_uring ring; /* buffered reads into staging (p->uring) */
    int ring_ok;
    unsigned inflight;    /* reads submitted and not reaped */
    unsigned queued;      /* reads queued by serve, not yet submitted */
    unsigned room;        /* at most this many out (the SQ's size; the CQ holds twice) */
#endif
} svc;

struct proxy {
    char *path;
    char engine[32];
    uint64_t offset;
    uint32_t page_bytes;
    int direct;
    int fd;        /* buffered reads straight into staging (-1: none) */
    /* The array mapped read-only (NULL: none; see "Mapped copies" at the
     * top): map + (byte - map_lo) is the file's byte. mapped: this
     * session's gathers copy from it (decided at the first begin()). */
    const uint8_t *map;
    uint64_t map_lo, map_hi, map_seed;
    size_t map_len;
    atomic_int mapped;
    /* Dense cold batches: once a session's uncached requests pass
     * dense_after pages, the whole array is read ahead in large sequential
     * reads (0: never; see serve). */
    uint64_t data_bytes, dense_after;
    uint64_t pages, row_bytes;
    atomic_ullong cold_reqs;
    atomic_int prefetched;
    unsigned nsvc, batch_max;
    long delay_us; /* $FASTREAD_PROXY_DELAY_US: fault injection (tests) */
    int uring;     /* buffered reads through each thread's io_uring (see the top) */
    fr_gpu *gpu;
    const atomic_int *store_cancel;

    fr_dev_ring hring; /* host addresses, for the service threads */
    fr_dev_ring dring; /* device addresses, for the kernel */
    void *cells_h, *staging_h;
    uint64_t cells_d, staging_d, tail_d;
    size_t cells_bytes, staging_bytes;

    pthread_mutex_t lock;
    pthread_cond_t cv, idle_cv;
    int exiting;
    unsigned busy;      /* service threads inside an active period */
    atomic_int active;  /* a gather is in flight: poll */
    atomic_int cancelled;
    atomic_ullong mapped_reads; /* requests served from the mapping */
    unsigned sessions;  /* begin() calls not yet ended (they nest) */
    int reset_pending;  /* a failed gather ended inside another session */
    int err_rc;         /* first read error of the gather in flight */
    char err[FR_ERRLEN];
    svc *svcs;
};

/* One extent of a request: bytes [start, start + len) of the file go to
 * the cell's staging + at. A page request has one; a row list
 * (FR_RING_ROWS) one per row. */
typedef struct piece {
    uint64_t start;
    uint32_t len, at;
} piece;

/* The pieces of request pos (at most FR_RING_MAX_ROWS): their number, or
 * -EINVAL for a malformed request (only a bug in a kernel could make one),
 * with the reason in why. A row list's offsets are read out of staging
 * here, before anything is written there. */
static int request_pieces(const proxy *p, uint64_t pos, piece *pc, char *why, size_t why_len)
{
    const fr_dev_ring *r = &p->hring;
    const fr_dev_ring_cell *c = fr_ring_host_cell(r, pos);
    uint32_t len = c->len;
    if (!(len & FR_RING_ROWS)) {
        if (c->page >= p->pages || len == 0 || len > p->page_bytes) {
            snprintf(why, why_len, "a request for page %llu (%u bytes) of an array of %llu pages",
                     (unsigned long long)c->page, len, (unsigned long long)p->pages);
            return -EINVAL;
        }
        pc[0].start = p->offset + c->page * p->page_bytes;
        pc[0].len = len;
        pc[0].at = 0;
        return 1;
    }
    unsigned n = len & 0xFFFFu;
    uint64_t rb = c->page;
    if (n == 0 || n > FR_RING_MAX_ROWS || rb != p->row_bytes || n * rb > p->page_bytes) {
        snprintf(why, why_len, "a request for %u rows of %llu bytes (rows are %llu bytes)", n,
                 (unsigned long long)rb, (unsigned long long)p->row_bytes);
        return -EINVAL;
    }
    uint64_t off[FR_RING_MAX_ROWS];
    memcpy(off, fr_ring_host_staging(r, pos), n * sizeof(uint64_t));
    for (unsigned i = 0; i < n; i++) {
        if (off[i] % rb || off[i] >= p->data_bytes) {
            snprintf(why, why_len, "a request for the row at byte %llu of an array of %llu bytes",
                     (unsigned long long)off[i], (unsigned long long)p->data_bytes);
            return -EINVAL;
        }
        pc[i].start = p->offset + off[i];
        pc[i].len = (uint32_t)rb;
        pc[i].at = (uint32_t)(i * rb);
    }
    return (int)n;
}

/* What a piece is, for errors: "page 12" or "the row at byte 4096". */
static void piece_name(const proxy *p, const piece *pc, char *buf, size_t len)
{
    uint64_t rel = pc->start - p->offset;
    if (pc->len == p->row_bytes && pc->len != p->page_bytes)
        snprintf(buf, len, "the row at byte %llu", (unsigned long long)rel);
    else
        snprintf(buf, len, "page %llu", (unsigned long long)(rel / p->page_bytes));
}

static void record(proxy *p, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void record(proxy *p, int rc, const char *fmt, ...)
{
    pthread_mutex_lock(&p->lock);
    if (!p->err_rc) {
        p->err_rc = rc;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, sizeof(p->err), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&p->lock);
}

/* Reads what the page cache holds straight into the cell's staging page
 * and completes it: 1 when done, 0 when the engine must read it (not
 * cached, O_DIRECT, or a short read). RWF_NOWAIT makes the kernel refuse
 * rather than go to the device, so a cold page costs one cheap syscall and
 * goes to the engine's deep queue instead of blocking this thread. One copy
 * (page cache -> staging) instead of two (-> engine buffer -> staging). */
static int serve_cached(svc *v, uint64_t pos, const piece *pc, int np)
{
    proxy *p = v->p;
#ifdef RWF_NOWAIT
    if (p->fd < 0)
        return 0;
    const fr_dev_ring *r = &p->hring;
    uint8_t *staging = fr_ring_host_staging(r, pos);
    uint64_t total = 0;
    for (int i = 0; i < np; i++) {
        struct iovec iov = {staging + pc[i].at, pc[i].len};
        ssize_t got = preadv2(p->fd, &iov, 1, (off_t)pc[i].start, RWF_NOWAIT);
        if (got != (ssize_t)pc[i].len)
            return 0; /* EAGAIN (not cached), EOPNOTSUPP, short: the engine decides */
        total += pc[i].len;
    }
    atomic_fetch_add_explicit(&v->bytes, total, memory_order_relaxed);
    fr_ring_host_complete(r, pos, 0);
    return 1;
#else
    (void)p;
    (void)pos;
    (void)pc;
    (void)np;
    return 0;
#endif
}

/* Serves request pos by copies from the mapping (this session is mapped):
 * 1, or 0 when a piece falls outside it (then nothing was written). */
static int serve_mapped(svc *v, uint64_t pos, const piece *pc, int np)
{
    proxy *p = v->p;
    uint8_t *staging = fr_ring_host_staging(&p->hring, pos);
    uint64_t total = 0;
    for (int i = 0; i < np; i++)
        if (pc[i].start < p->map_lo || pc[i].start + pc[i].len > p->map_hi)
            return 0;
    for (int i = 0; i < np; i++) {
        memcpy(staging + pc[i].at, p->map + (pc[i].start - p->map_lo), pc[i].len);
        total += pc[i].len;
    }
    atomic_fetch_add_explicit(&v->bytes, total, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->mapped_reads, (uint64_t)np, memory_order_relaxed);
    fr_ring_host_complete(&p->hring, pos, 0);
    return 1;
}

/* Whether the file still holds the whole array (it may have shrunk). */
static int still_whole(const proxy *p)
{
    struct stat st;
    return fstat(p->fd, &st) == 0 && (uint64_t)st.st_size >= p->map_hi;
}

/* Whether this session's gathers copy from the mapping: the file still
 * holds the whole array and 32 of its pages drawn at random are all in the
 * page cache. */
static int decide_mapped(proxy *p)
{
    if (!p->map || !still_whole(p))
        return 0;
    unsigned asked, in = fr_resident_sample(p->map, p->map_len, 32, &p->map_seed, &asked);
    return asked == 32 && in == 32;
}

/* A batch that misses the page cache on many pages of the array will
 * likely touch most of it (random ids over a table read whole-page), and
 * one page-sized read per request costs a seek-sized request each on the
 * device (measured on the H100 machine, cold: 0.9 GB/s with 64 KiB reads).
 * Past dense_after uncached pages in a session (1/16 of the array's pages)
 * the whole array is handed to the kernel's readahead once (large
 * sequential reads, asynchronous); the page reads still in flight then
 * wait on those pages instead of issuing their own. Only for arrays that
 * fit a quarter of the memory free at open, so it never evicts the world.
 * Opt-in ($FASTREAD_PROXY_DENSE=1): see proxy_open. */
static void maybe_prefetch(proxy *p, unsigned cold)
{
    if (!p->dense_after || p->fd < 0 || cold == 0)
        return;
    uint64_t before = atomic_fetch_add(&p->cold_reqs, cold);
    if (before + cold < p->dense_after || atomic_exchange(&p->prefetched, 1))
        return;
    (void)posix_fadvise(p->fd, (off_t)p->offset, (off_t)p->data_bytes, POSIX_FADV_WILLNEED);
}

#ifdef FASTREAD_HAVE_URING
/* Completes the requests whose reads finished: a full read is done; an
 * error or a short read fails the request, naming it. `wait`: block for at
 * least one. Only page requests come this way (serve). */
static void uring_reap(svc *v, int wait)
{
    proxy *p = v->p;
    const fr_dev_ring *r = &p->hring;
    struct io_uring_cqe *cqe;
    if (wait && v->inflight) {
        int rc = io_uring_wait_cqe(&v->ring, &cqe);
        if (rc < 0 && rc != -EINTR)
            return;
    }
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&v->ring, head, cqe) {
        uint64_t pos = (uint64_t)io_uring_cqe_get_data64(cqe);
        const fr_dev_ring_cell *c = fr_ring_host_cell(r, pos);
        uint64_t start = p->offset + c->page * p->page_bytes;
        int32_t status = 0;
        if (cqe->res == (int)c->len) {
            atomic_fetch_add_explicit(&v->bytes, c->len, memory_order_relaxed);
        } else {
            status = cqe->res < 0 ? cqe->res : -EIO;
            record(p, status, "reading page %llu of %s (bytes %llu..%llu): %s",
                   (unsigned long long)c->page, p->path, (unsigned long long)start,
                   (unsigned long long)(start + c->len),
                   cqe->res < 0 ? strerror(-cqe->res) : "the file ended early");
        }
        fr_ring_host_complete(r, pos, status);
        seen++;
    }
    io_uring_cq_advance(&v->ring, seen);
    v->inflight -= seen;
}

/* Queues a read of page request pos into its staging (submitted by serve
 * with the rest of its batch, one enter). */
static void uring_queue(svc *v, uint64_t pos, const piece *pc)
{
    proxy *p = v->p;
    /* The CQ holds twice the SQ: reap before more than that is out. */
    while (v->inflight + 1 > v->room)
        uring_reap(v, 1);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&v->ring);
    if (!sqe) {
        io_uring_submit(&v->ring);
        sqe = io_uring_get_sqe(&v->ring);
    }
    if (!sqe) { /* cannot happen with the reaping above; fail the request, never hang */
        record(p, -EBUSY, "proxy for %s: no io_uring submission entry", p->path);
        fr_ring_host_complete(&p->hring, pos, -EBUSY);
        return;
    }
    io_uring_prep_read(sqe, p->fd, fr_ring_host_staging(&p->hring, pos), pc->len, pc->start);
    io_uring_sqe_set_data64(sqe, pos);
    v->inflight++;
    v->queued++;
}
#endif

/* Serves tickets head, head + nsvc, ... (n_all of them, all submitted), each
 * by the first way that can: copies from the mapping (a mapped session);
 * this thread's io_uring (page requests, FASTREAD_PROXY_URING=1); preadv2
 * of what the page cache holds; else the engine, every piece left of the
 * batch in one fr_read_ranges. */
static void serve(svc *v, unsigned n_all)
{
    proxy *p = v->p;
    const fr_dev_ring *r = &p->hring;
    uint64_t total = 0;
    int cancelled = atomic_load(&p->cancelled) || (p->store_cancel && atomic_load(p->store_cancel));
    int fast = !cancelled && p->delay_us <= 0;
    if (p->delay_us > 0) { /* a slow device, on purpose: tests of timeouts and cancels */
        struct timespec ts = {p->delay_us / 1000000, (p->delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    int mapped = fast && atomic_load_explicit(&p->mapped, memory_order_relaxed);
    if (mapped && !still_whole(p)) {
        /* Shrunk mid-session: the engine reads from now on and names what is lost. */
        atomic_store(&p->mapped, 0);
        mapped = 0;
    }
    unsigned n = 0; /* pieces left to the engine */
    for (unsigned i = 0; i < n_all; i++) {
        uint64_t pos = v->head + (uint64_t)i * p->nsvc;
        piece pc[FR_RING_MAX_ROWS];
        char why[160];
        int np = request_pieces(p, pos, pc, why, sizeof(why));
        if (np < 0) {
            record(p, np, "proxy for %s: %s", p->path, why);
            fr_ring_host_complete(r, pos, np);
            continue;
        }
        /* Reads are pages or rows, counted before their completion: end()
         * does not wait for this thread after a good gather, and the
         * gather's stats must include them. */
        atomic_fetch_add_explicit(&v->reads, (uint64_t)np, memory_order_relaxed);
        if (mapped && serve_mapped(v, pos, pc, np))
            continue;
#ifdef FASTREAD_HAVE_URING
        if (fast && v->ring_ok && !(fr_ring_host_cell(r, pos)->len & FR_RING_ROWS)) {
            uring_queue(v, pos, &pc[0]);
            continue;
        }
#endif
        if (fast && serve_cached(v, pos, pc, np))
            continue;
        for (int k = 0; k < np; k++) {
            uint64_t lo = p->direct ? pc[k].start & ~(DIO_ALIGN - 1) : pc[k].start;
            v->pos[n] = pos;
            v->starts[n] = pc[k].start;
            v->ats[n] = pc[k].at;
            v->ranges[n].offset = lo;
            v->ranges[n].length = pc[k].start + pc[k].len - lo;
            total += v->ranges[n].length;
            n++;
        }
    }
#ifdef FASTREAD_HAVE_URING
    if (v->queued) {
        int rc = io_uring_submit(&v->ring);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
            record(p, rc, "proxy for %s: io_uring_submit: %s", p->path, strerror(-rc));
        v->queued = 0;
        uring_reap(v, 0);
    }
#endif
    atomic_fetch_add_explicit(&v->bytes, total, memory_order_relaxed);
    v->head += (uint64_t)n_all * p->nsvc;
    if (n == 0)
        return;
    if (!cancelled)
        maybe_prefetch(p, n);
    int rc = cancelled ? -ECANCELED : 0;
    if (rc == 0)
        rc = fr_batch_prepare(v->batch, n);
    if (rc == 0)
        rc = fr_read_ranges(v->ctx, p->path, v->ranges, n, v->batch);
    if (rc && rc != -ECANCELED)
        record(p, rc, "reading pages of %s with %s: %s", p->path, p->engine, strerror(-rc));
    /* A request's pieces are consecutive: it completes with its last, failed
     * by the first piece that failed. */
    int32_t status = rc;
    for (unsigned i = 0; i < n; i++) {
        uint64_t pos = v->pos[i];
        uint32_t len = (uint32_t)(v->ranges[i].offset + v->ranges[i].length - v->starts[i]);
        if (rc == 0) {
            const fr_sample *s = &v->batch->samples[i];
            if (s->length == (int64_t)v->ranges[i].length) {
                memcpy(fr_ring_host_staging(r, pos) + v->ats[i],
                       v->batch->arena.base + s->offset + (v->starts[i] - v->ranges[i].offset),
                       len);
            } else if (status == 0) {
                status = s->length < 0 ? (int32_t)s->length : -EIO;
                piece pc = {v->starts[i], len, v->ats[i]};
                char what[64];
                piece_name(p, &pc, what, sizeof(what));
                record(p, status, "reading %s of %s (bytes %llu..%llu) with %s: %s", what, p->path,
                       (unsigned long long)v->starts[i],
                       (unsigned long long)(v->starts[i] + len), p->engine,
                       s->length < 0 ? strerror((int)-s->length) : "the file ended early");
            }
        }
        if (i + 1 == n || v->pos[i + 1] != pos) {
            fr_ring_host_complete(r, pos, status);
            status = rc;
        }
    }
}

static void *service(void *arg)
{
    svc *v = arg;
    proxy *p = v->p;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!atomic_load(&p->active) && !p->exiting)
            pthread_cond_wait(&p->cv, &p->lock);
        if (p->exiting)
            break;
        p->busy++;
        pthread_mutex_unlock(&p->lock);
        unsigned idle = 0;
        while (atomic_load(&p->active)) {
            unsigned n = 0;
            while (n < p->batch_max &&
                   fr_ring_host_submitted(&p->hring, v->head + (uint64_t)n * p->nsvc))
                n++;
            if (n) {
                serve(v, n);
                idle = 0;
#ifdef FASTREAD_HAVE_URING
            } else if (v->inflight) {
                uring_reap(v, 0); /* reads that went to the device */
                sched_yield();
#endif
            } else if (++idle < 2000) {
                sched_yield();
            } else {
                struct timespec ts = {0, 20000};
                nanosleep(&ts, NULL);
            }
        }
#ifdef FASTREAD_HAVE_URING
        /* Nothing of ours may write staging once the session is over (a
         * reset may follow): the reads still out are waited for. */
        while (v->inflight)
            uring_reap(v, 1);
#endif
        pthread_mutex_lock(&p->lock);
        if (--p->busy == 0)
            pthread_cond_broadcast(&p->idle_cv);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void proxy_close(void *state)
{
    proxy *p = state;
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->exiting = 1;
    atomic_store(&p->active, 0);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; p->svcs && i < p->nsvc; i++) {
        svc *v = &p->svcs[i];
        if (v->started)
            pthread_join(v->thread, NULL);
        if (v->batch)
            fr_batch_recycle(v->batch);
        if (v->pool)
            fr_pool_close(v->pool);
        fr_ctx_close(v->ctx);
#ifdef FASTREAD_HAVE_URING
        if (v->ring_ok)
            io_uring_queue_exit(&v->ring);
#endif
        free(v->ranges);
        free(v->starts);
        free(v->pos);
        free(v->ats);
    }
    if (p->map)
        munmap((void *)p->map, p->map_len);
    if (p->fd >= 0)
        close(p->fd);
    free(p->svcs);
    fr_gpu_mapped_free(p->gpu, p->cells_h);
    fr_gpu_mapped_free(p->gpu, p->staging_h);
    fr_gpu_free(p->gpu, p->tail_d);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->idle_cv);
    pthread_mutex_destroy(&p->lock);
    free(p->path);
    free(p);
}

static int proxy_probe(const fr_backend_env *env, char *why, size_t why_len)
{
    return fr_gpu_gather_api(env->gpu, why, why_len);
}

static unsigned pow2_floor(unsigned v)
{
    unsigned r = 1;
    while (r * 2 <= v)
        r *= 2;
    return r;
}

static int proxy_open(const fr_backend_env *env, void **state, char *err, size_t err_len)
{
    *state = NULL;
    unsigned n = env->ring_entries;
    if (n < 2 || (n & (n - 1)) != 0 || n > (1u << 20)) {
        fr_set_err(err, err_len, "ring_entries must be a power of two in 2..1048576, got %u", n);
        return -EINVAL;
    }
    proxy *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fd = -1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->idle_cv, NULL);
    p->path = strdup(env->path);
    p->offset = env->offset;
    p->page_bytes = env->page_bytes;
    p->gpu = env->gpu;
    p->store_cancel = env->cancel;
    snprintf(p->engine, sizeof(p->engine), "%s", env->engine);
    p->direct = env->o_direct > 0 || (env->o_direct < 0 && env->offset % DIO_ALIGN == 0);
    /* Buffered reads of cached pages straight into staging, unless the
     * user asked for O_DIRECT (o_direct 1: the page cache is to be left
     * alone) or $FASTREAD_PROXY_CACHED=0. Failing to open only costs that. */
    const char *cached = getenv("FASTREAD_PROXY_CACHED");
    if (env->o_direct <= 0 && !(cached && strcmp(cached, "0") == 0))
        p->fd = fr_open_data(env->path, 0, 1, NULL); /* < 0: a FIFO swapped in, not waited on */
    const char *mapped = getenv("FASTREAD_PROXY_MAPPED");
    if (p->fd >= 0 && !(mapped && strcmp(mapped, "0") == 0) && env->rows * env->row_bytes > 0) {
        /* Failing to map only costs the copies (an address space limit). */
        p->map_lo = env->offset & ~(DIO_ALIGN - 1);
        p->map_hi = env->offset + env->rows * env->row_bytes;
        p->map_len = (size_t)(p->map_hi - p->map_lo);
        void *m = mmap(NULL, p->map_len, PROT_READ, MAP_SHARED, p->fd, (off_t)p->map_lo);
        p->map = m == MAP_FAILED ? NULL : m;
        p->map_seed = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)p;
    }
    p->data_bytes = env->rows * env->row_bytes;
    p->pages = env->pages;
    p->row_bytes = env->row_bytes;
    long avp = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t avail = avp > 0 && psz > 0 ? (uint64_t)avp * (uint64_t)psz : 0;
    /* Off unless $FASTREAD_PROXY_DENSE=1: on the H100 machine's disk (about
     * 1 GB/s) it did not pay (cold 100k ids, 64K pages: 121 ms without, 147
     * ms with, in two runs that also differed by 25% on warm gathers), since
     * a batch that touches every page is bound by the disk either way. It
     * is meant for devices whose random reads lag their sequential ones. */
    const char *dense = getenv("FASTREAD_PROXY_DENSE");
    if (p->data_bytes <= avail / 4 && dense && strcmp(dense, "1") == 0)
        p->dense_after = env->pages / 16 > 16 ? env->pages / 16 : 16;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned t = env->threads ? env->threads : (cpus > 3 ? (unsigned)(cpus / 2) : 1);
    if (t > 8 && !env->threads)
        t = 8;
    p->nsvc = pow2_floor(t);
    if (p->nsvc > n)
        p->nsvc = n;
    p->batch_max = env->queue_depth ? env->queue_depth : 32;
    const char *delay = getenv("FASTREAD_PROXY_DELAY_US");
    p->delay_us = delay ? atol(delay) : 0;
#ifdef FASTREAD_HAVE_URING
    const char *uring = getenv("FASTREAD_PROXY_URING");
    p->uring = p->fd >= 0 && uring && strcmp(uring, "1") == 0;
#endif
    if (!p->path) {
        proxy_close(p);
        return -ENOMEM;
    }
    unsigned log2 = 0;
    while ((1u << log2) < n)
        log2++;
    p->cells_bytes = fr_round_up((size_t)n * sizeof(fr_dev_ring_cell), 4096);
    p->staging_bytes = (size_t)n * p->page_bytes;
    int rc = fr_gpu_mapped_alloc(p->gpu, p->cells_bytes, &p->cells_h, &p->cells_d);
    if (rc == 0)
        rc = fr_gpu_mapped_alloc(p->gpu, p->staging_bytes, &p->staging_h, &p->staging_d);
    if (rc == 0)
        rc = fr_gpu_alloc(p->gpu, sizeof(uint64_t), &p->tail_d);
    if (rc == 0)
        rc = fr_gpu_memset8(p->gpu, p->tail_d, 0, sizeof(uint64_t));
    if (rc) {
        char why[FR_ERRLEN];
        fr_gpu_last_error(p->gpu, why, sizeof(why));
        fr_set_err(err, err_len, "proxy backend: %u ring entries with %zu bytes of staging: %s", n,
                   p->staging_bytes, why);
        proxy_close(p);
        return rc;
    }
    memset(p->cells_h, 0, p->cells_bytes);
    p->hring.cells = p->cells_h;
    p->hring.staging = p->staging_h;
    p->hring.tail = NULL; /* the host never takes tickets */
    p->hring.log2_entries = log2;
    p->hring.page_bytes = p->page_bytes;
    p->dring = p->hring;
    p->dring.cells = (fr_dev_ring_cell *)(uintptr_t)p->cells_d;
    p->dring.staging = (uint8_t *)(uintptr_t)p->staging_d;
    p->dring.tail = (uint64_t *)(uintptr_t)p->tail_d;

    p->svcs = aligned_alloc(_Alignof(svc), p->nsvc * sizeof(svc));
    if (p->svcs)
        memset(p->svcs, 0, p->nsvc * sizeof(svc));
    if (!p->svcs) {
        proxy_close(p);
        return -ENOMEM;
    }
    fr_config c;
    fr_config_init(&c);
    c.engine = p->engine;
    c.engine_args = env->engine_args ? env->engine_args : "";
    c.o_direct = p->direct;
    c.direct_alignment = (unsigned)DIO_ALIGN;
    c.queue_depth = p->batch_max;
    c.threads = p->batch_max; /* psync: one pread per request of a batch at once */
    for (unsigned i = 0; i < p->nsvc; i++) {
        svc *v = &p->svcs[i];
        v->p = p;
        v->shard = i;
        v->head = i;
        char why[FR_ERRLEN];
        rc = fr_ctx_open(&c, &v->ctx, why, sizeof(why));
        if (rc) {
            fr_set_err(err, err_len, "proxy backend for %s: engine %s: %s", p->path, p->engine,
                       why);
            proxy_close(p);
            return rc;
        }
        v->pool = fr_pool_new();
        v->batch = v->pool ? fr_pool_get(v->pool) : NULL;
#ifdef FASTREAD_HAVE_URING
        if (p->uring) {
            /* No COOP_TASKRUN: completions of reads that went to io_uring's
             * workers must show up while this thread only peeks at the CQ
             * between syscalls of its own (sched_yield), not only inside
             * io_uring_enter. */
            v->room = 2 * p->batch_max;
            int urc = io_uring_queue_init(v->room, &v->ring, 0);
            v->ring_ok = urc == 0;
            if (!v->ring_ok)
                p->uring = 0; /* (RLIMIT_MEMLOCK, seccomp...): preadv2 and the engine */
        }
#endif
        /* A batch of requests is up to batch_max row lists of FR_RING_MAX_ROWS. */
        size_t pieces = (size_t)p->batch_max * FR_RING_MAX_ROWS;
        v->ranges = calloc(pieces, sizeof(fr_range));
        v->starts = calloc(pieces, sizeof(uint64_t));
        v->pos = calloc(pieces, sizeof(uint64_t));
        v->ats = calloc(pieces, sizeof(uint32_t));
        if (!v->batch || !v->ranges || !v->starts || !v->pos || !v->ats) {
            proxy_close(p);
            return -ENOMEM;
        }
        rc = pthread_create(&v->thread, NULL, service, v);
        if (rc) {
            fr_set_err(err, err_len, "proxy backend: cannot start service thread %u: %s", i,
                       strerror(rc));
            proxy_close(p);
            return -rc;
        }
        v->started = 1;
    }
    *state = p;
    return 0;
}

static void proxy_fill_view(void *state, fr_dev_fetch *view)
{
    proxy *p = state;
    memset(view, 0, sizeof(*view));
    view->ring = p->dring;
}

static int proxy_begin(void *state, char *err, size_t err_len)
{
    proxy *p = state;
    pthread_mutex_lock(&p->lock);
    p->err_rc = 0;
    p->err[0] = 0;
    if (p->sessions++ == 0) {
        atomic_store(&p->cold_reqs, 0);
        atomic_store(&p->prefetched, 0);
        atomic_store(&p->cancelled, 0);
        atomic_store(&p->mapped, decide_mapped(p));
        atomic_store(&p->active, 1);
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* Every cell free for lap 0, every shard at its first ticket, the device's
 * ticket counter 0. Only while nothing uses the ring. */
static int reset_ring(proxy *p, char *err, size_t err_len)
{
    fr_ring_host_reset(&p->hring);
    for (unsigned i = 0; i < p->nsvc; i++)
        p->svcs[i].head = i;
    int rc = fr_gpu_memset8(p->gpu, p->tail_d, 0, sizeof(uint64_t));
    if (rc)
        fr_gpu_last_error(p->gpu, err, err_len);
    return rc;
}

static int proxy_end(void *state, int failed, char *err, size_t err_len)
{
    proxy *p = state;
    pthread_mutex_lock(&p->lock);
    int last = --p->sessions == 0;
    if (failed)
        p->reset_pending = 1;
    if (last) {
        atomic_store(&p->active, 0);
        /* After a good gather every request was served and its cell freed
         * by the kernel: the threads only poll an idle ring, so they are
         * left to notice on their own (waiting for them cost ~100 us a
         * gather). A reset needs them gone first. */
        if (failed || p->reset_pending)
            while (p->busy > 0)
                pthread_cond_wait(&p->idle_cv, &p->lock);
    }
    int rc = p->err_rc;
    if (rc)
        fr_set_err(err, err_len, "%s", p->err);
    /* Waiters that gave up left cells submitted or done and tickets
     * unserved: the ring starts clean once no session uses it. */
    int reset = last && p->reset_pending;
    if (reset)
        p->reset_pending = 0;
    pthread_mutex_unlock(&p->lock);
    if (reset) {
        int mrc = reset_ring(p, rc ? NULL : err, err_len);
        if (mrc && !rc)
            rc = mrc;
    }
    return rc;
}

static void proxy_cancel(void *state)
{
    proxy *p = state;
    atomic_store(&p->cancelled, 1);
}

static void proxy_counters(void *state, fr_store_stats *add)
{
    proxy *p = state;
    for (unsigned i = 0; i < p->nsvc; i++) {
        add->storage_reads += atomic_exchange(&p->svcs[i].reads, 0);
        add->bytes_read += atomic_exchange(&p->svcs[i].bytes, 0);
    }
    add->mapped_reads += atomic_exchange(&p->mapped_reads, 0);
}

static void proxy_memory(void *state, fr_store_memory *add)
{
    proxy *p = state;
    add->rings += p->cells_bytes + sizeof(uint64_t);
    add->staging += p->staging_bytes;
    for (unsigned i = 0; i < p->nsvc; i++)
        add->host_buffers += p->svcs[i].batch->arena.capacity +
                             (size_t)p->batch_max * FR_RING_MAX_ROWS *
                                 (sizeof(fr_range) + 2 * sizeof(uint64_t) + sizeof(uint32_t));
}

const fr_gather_backend fr_gather_backend_proxy = {
    .name = "proxy",
    .fetch_define = "FR_FETCH_PROXY",
    .device_source = NULL,
    .probe = proxy_probe,
    .open = proxy_open,
    .map_cache = NULL,
    .fill_view = proxy_fill_view,
    .begin = proxy_begin,
    .end = proxy_end,
    .cancel = proxy_cancel,
    .counters = proxy_counters,
    .memory = proxy_memory,
    .close = proxy_close,
};
