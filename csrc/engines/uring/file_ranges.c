/*
 * io_uring engine: ranges of many files (fr_read_file_ranges), for tables
 * of thousands of shards (WebDataset, Squirrel, CIFAR batch files).
 *
 * psync pays open + fstat + preadv + close, four system calls, for a
 * sample of a shard its LRU does not hold (a shuffled epoch over 10^4
 * shards of 3 samples: nearly every one). Here a miss is one linked chain,
 * submitted with the rest of the ring's turn in one io_uring_enter:
 *
 *   OPENAT into a slot of the ring's registered file table (a direct
 *   descriptor: no entry in the process's table, no fd-table lock)
 *   -> IOSQE_IO_LINK -> READV of the run's ranges on that slot
 *   (IOSQE_FIXED_FILE).
 *
 * No fstat: the index knows every range, and a read that comes back short
 * (a truncated shard) is read again the slow way, which says -ENODATA. No
 * close either: each ring keeps the files it opened in an LRU of slots
 * (fd_cache.c, keys_only: the values are slot numbers), at most files_cap
 * of them (max_open_files shared out among the rings); an evicted slot is
 * simply opened into again, and the kernel drops the file it held.
 *
 * Runs (fr_file_runs: nearby ranges of one file, one vector read) go to
 * the ring a hash of their file names, so each ring holds its own share of
 * the shards and the rings' LRUs add up (claimed by any ring, 100 shards
 * read shuffled through 4 rings of 64 slots opened a file for a third of
 * the samples: every ring wanted every shard); a ring that has read its
 * own takes the rest of another's whose runs are all of one shard (a
 * batch of few shards, read in order, is still read by every ring, each
 * opening those few; a shuffled batch's runs stay with their ring: taken
 * by another they would be opened twice, and evict: 100 shards shuffled,
 * runs of 2-3 a shard in a batch, still opened a file for 14% of them). A run of a file this ring holds is one
 * READV, a run of a file whose open is still
 * in flight on this ring waits for it (its read is queued once the open
 * completes: it may not be linked behind a chain it is not part of). A
 * slot is pinned while anything of this call may still use it; a ring
 * that needs a slot while every one is pinned waits until nothing is in
 * flight, then unpins them all (psync's window, per ring).
 *
 * Errors are per run, so per sample: a failed open fails the runs of its
 * file (its linked read completes -ECANCELED and takes the open's error),
 * nothing else. The stuck check (ring.c, STUCK_CHECK_MS) cancels reads of
 * paths that are no regular file or block device any more (a FIFO with a
 * writer, put in a shard's place, would be polled forever): -EINVAL.
 *
 * Needs direct opens and linked requests that take their fixed file when
 * they run, not when submitted (IORING_FEAT_LINKED_FILE, Linux 5.17);
 * where a kernel lacks them (or register_files is off) the context reads
 * file ranges through its psync pool instead (ctx.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engines/fd_cache.h"
#include "engines/uring/uring_internal.h"

#define NONE UINT32_MAX
/* Runs of a call worth opening the first shard's directory for: shards in
 * it are opened relative to it (openat of the last component), as psync's
 * DIR_MIN_MISSES. */
#define DIR_MIN_RUNS 8
/* A slot whose open is in flight (fr_state); 0: open. */
#define SLOT_OPENING 1

/* One call's state: written by the caller before the phase, read by the
 * rings; run entries are written only by the ring that claimed the run. */
typedef struct uring_files {
    const char *const *paths;
    size_t npaths;
    const fr_file_range *jobs;
    fr_batch *batch;
    size_t cap;           /* jobs the arrays below hold */
    fr_range *ranges;     /* the jobs as fr_range, for the layout */
    uint32_t *sorted;     /* job numbers by (file, offset) */
    uint32_t *runs;       /* run k: sorted positions runs[k] .. runs[k+1] - 1 */
    uint32_t *job_run;    /* job -> its run, NONE for a job refused at layout */
    uint32_t *run_iov;    /* run k's vectors: iov[run_iov[k] .. run_iov[k+1]) */
    struct iovec *iov;    /* 2 * cap + 1 */
    uint64_t *run_len;    /* bytes from the run's first offset to its last end */
    int64_t *run_res;     /* the read's result; -ECANCELED until it completes */
    int64_t *run_open;    /* 0, or the failed open's -errno of the run's file */
    int64_t *run_stuck;   /* 0, or why the stuck check cancelled the read */
    uint32_t *run_next;   /* the ring's lists (waiters of a slot, ready reads) */
    unsigned *run_slot;   /* the slot the run reads */
    _Atomic(uring_ring *) *run_live; /* the ring with the run's requests in flight */
    size_t nruns, njobs;
    /* The runs by ring: ring w's are by_ring[ring_end[w - 1] .. ring_end[w])
     * (ring_end[-1] = 0), taken in order through next[w]. */
    uint32_t *by_ring;
    size_t *ring_end;
    atomic_size_t *next;
    unsigned char *stealable; /* ring w's runs are of one file: others may take them */
    unsigned nrings;
    unsigned char *gap;   /* FR_COALESCE_GAP bytes the gaps between ranges land in */
    fr_shard_dir dir;     /* the first shard's directory (O_PATH), or none */
    int last;             /* the engine's last call was one of these */
    long repairs;         /* jobs read again the slow way */
} uring_files;

/* One ring's LRU of files in slots [base, base + cap) of its table. */
typedef struct ring_files {
    fr_fd_cache lru;
    unsigned base, cap;
    unsigned *free;      /* slots holding no file of the LRU */
    unsigned nfree;
    int64_t *state;      /* per slot: SLOT_OPENING or 0 */
    uint32_t *waiters;   /* per slot: first run waiting for its open */
    uint32_t ready;      /* runs whose file's open completed: reads to queue */
    long reads;
} ring_files;

int fr_uring_files_check(struct io_uring *ring, char *why, size_t why_len)
{
    if (!(ring->features & IORING_FEAT_LINKED_FILE)) {
        fr_set_err(why, why_len, "io_uring: this kernel resolves a linked request's fixed file "
                                 "at submit (IORING_FEAT_LINKED_FILE needs Linux >= 5.17)");
        return -ENOTSUP;
    }
    /* The ring's own probe: io_uring_get_probe() would set up (and tear
     * down) one more ring on the calling thread (engine.c: run_off_thread). */
    struct io_uring_probe *probe = io_uring_get_probe_ring(ring);
    /* Direct opens came with Linux 5.15, as IORING_OP_LINKAT: a kernel that
     * has LINKAT honours openat's file_index (an older one would ignore it
     * and install an ordinary descriptor, leaking it). */
    int ok = probe && io_uring_opcode_supported(probe, IORING_OP_LINKAT) &&
             io_uring_opcode_supported(probe, IORING_OP_READV) &&
             io_uring_opcode_supported(probe, IORING_OP_OPENAT);
    if (probe)
        io_uring_free_probe(probe);
    if (!ok) {
        fr_set_err(why, why_len, "io_uring: no direct openat or readv in this kernel "
                                 "(needs Linux >= 5.15)");
        return -ENOTSUP;
    }
    return 0;
}

static uring_files *files_of(uring *u)
{
    if (!u->files) {
        uring_files *F = calloc(1, sizeof(*F));
        if (!F)
            return NULL;
        fr_shard_dir_init(&F->dir);
        F->nrings = u->nrings;
        F->ring_end = calloc(u->nrings, sizeof(*F->ring_end));
        F->next = calloc(u->nrings, sizeof(*F->next));
        F->stealable = calloc(u->nrings, 1);
        if (!F->ring_end || !F->next || !F->stealable) {
            free(F->ring_end);
            free((void *)F->next);
            free(F->stealable);
            free(F);
            return NULL;
        }
        u->files = F;
    }
    return u->files;
}

static uint32_t run_file(const uring_files *F, size_t k)
{
    return F->jobs[F->sorted[F->runs[k]]].file;
}

/* The ring that reads file `file`'s runs (a multiplicative hash: shard
 * numbers in order spread over every ring). */
static unsigned ring_of(const uring_files *F, uint32_t file)
{
    return (unsigned)(((uint64_t)(file * 2654435761u) * F->nrings) >> 32);
}

static int grow_files(uring_files *F, size_t n)
{
    if (n <= F->cap && F->gap)
        return 0;
    size_t cap = n > 2 * F->cap ? n : 2 * F->cap;
    if (cap < 64)
        cap = 64;
#define GROW(field, count)                                                  \
    do {                                                                    \
        void *p_ = realloc(F->field, (count) * sizeof(*F->field));          \
        if (!p_)                                                            \
            return -ENOMEM;                                                 \
        F->field = p_;                                                      \
    } while (0)
    GROW(ranges, cap);
    GROW(sorted, cap);
    GROW(runs, cap + 1);
    GROW(job_run, cap);
    GROW(run_iov, cap + 1);
    GROW(iov, 2 * cap + 1);
    GROW(run_len, cap);
    GROW(run_res, cap);
    GROW(run_open, cap);
    GROW(run_stuck, cap);
    GROW(run_next, cap);
    GROW(run_slot, cap);
    GROW(run_live, cap);
    GROW(by_ring, cap);
#undef GROW
    F->cap = cap;
    if (!F->gap && !(F->gap = malloc(FR_COALESCE_GAP)))
        return -ENOMEM;
    return 0;
}

int fr_uring_files_prepare(uring *u, const char *const *paths, size_t npaths,
                           const fr_file_range *jobs, size_t n, fr_batch *batch, size_t *nruns)
{
    *nruns = 0;
    uring_files *F = files_of(u);
    if (!F)
        return -ENOMEM;
    F->last = 1;
    F->nruns = F->njobs = 0;
    int rc = grow_files(F, n);
    if (rc)
        return rc;
    size_t valid;
    if ((rc = fr_prepare_file_jobs(batch, jobs, n, npaths, F->ranges, u->cfg.direct_alignment,
                                   F->sorted, &valid)))
        return rc;
    for (size_t i = 0; i < n; i++)
        F->job_run[i] = NONE;
    F->jobs = jobs; /* run_file's, below */
    size_t nr = fr_file_runs(jobs, F->sorted, 0, valid, F->runs);
    /* Each run's vectors: its ranges' slots, the gaps between them into
     * the discard buffer (the kernel may write it from several reads at
     * once: its bytes are never looked at). */
    size_t v = 0;
    for (size_t k = 0; k < nr; k++) {
        F->run_iov[k] = (uint32_t)v;
        uint64_t start = jobs[F->sorted[F->runs[k]]].offset, at = start;
        for (uint32_t pos = F->runs[k]; pos < F->runs[k + 1]; pos++) {
            uint32_t j = F->sorted[pos];
            const fr_file_range *r = &jobs[j];
            F->job_run[j] = (uint32_t)k;
            if (r->offset > at)
                F->iov[v++] = (struct iovec){F->gap, (size_t)(r->offset - at)};
            if (r->length)
                F->iov[v++] = (struct iovec){batch->arena.base + batch->samples[j].offset,
                                             (size_t)r->length};
            at = r->offset + r->length;
        }
        F->run_len[k] = at - start;
        F->run_res[k] = -ECANCELED;
        F->run_open[k] = 0;
        F->run_stuck[k] = 0;
        F->run_live[k] = NULL;
    }
    F->run_iov[nr] = (uint32_t)v;
    /* Grouped by ring (a counting sort: each ring's runs in sorted order). */
    for (unsigned w = 0; w < F->nrings; w++)
        F->ring_end[w] = 0;
    for (size_t k = 0; k < nr; k++)
        F->ring_end[ring_of(F, jobs[F->sorted[F->runs[k]]].file)]++;
    size_t at = 0;
    for (unsigned w = 0; w < F->nrings; w++) {
        size_t c = F->ring_end[w];
        F->ring_end[w] = at; /* for now: the start */
        atomic_store_explicit(&F->next[w], at, memory_order_relaxed);
        at += c;
    }
    for (size_t k = 0; k < nr; k++) {
        unsigned w = ring_of(F, jobs[F->sorted[F->runs[k]]].file);
        F->by_ring[F->ring_end[w]++] = (uint32_t)k;
    }
    for (unsigned w = 0; w < F->nrings; w++) {
        size_t a = w ? F->ring_end[w - 1] : 0, files = 0;
        for (size_t x = a; x < F->ring_end[w]; x++)
            files += x == a || run_file(F, F->by_ring[x]) != run_file(F, F->by_ring[x - 1]);
        F->stealable[w] = files == 1 && F->ring_end[w] - a >= 2;
    }
    F->paths = paths;
    F->npaths = npaths;
    F->jobs = jobs;
    F->batch = batch;
    F->nruns = nr;
    F->njobs = n;
    if (nr >= DIR_MIN_RUNS)
        fr_shard_dir_open(&F->dir, paths[jobs[F->sorted[0]].file]);
    *nruns = nr;
    return 0;
}

/* A job read again the slow way: a fresh descriptor, pread until its end
 * (-ENODATA where the file ends inside it). */
static void repair_run(uring *u, uring_files *F, size_t k)
{
    (void)u;
    for (uint32_t pos = F->runs[k]; pos < F->runs[k + 1]; pos++) {
        uint32_t j = F->sorted[pos];
        const fr_file_range *r = &F->jobs[j];
        fr_range range = {.offset = r->offset, .length = r->length};
        if (r->length)
            fr_read_range_plain(F->batch, j, F->paths[r->file], &range);
        F->repairs++;
    }
}

void fr_uring_files_settle(uring *u, fr_batch *batch)
{
    uring_files *F = u->files;
    fr_shard_dir_close(&F->dir);
    for (size_t k = 0; k < F->nruns; k++) {
        int64_t res = F->run_res[k];
        if (F->run_stuck[k])
            res = F->run_stuck[k]; /* no regular file any more: cancelled */
        else if (F->run_open[k] < 0)
            res = F->run_open[k]; /* the read was cancelled by its failed open */
        if (res >= 0 && (uint64_t)res >= F->run_len[k]) {
            for (uint32_t pos = F->runs[k]; pos < F->runs[k + 1]; pos++) {
                uint32_t j = F->sorted[pos];
                batch->samples[j].length = (int64_t)F->jobs[j].length;
            }
        } else if (res < 0 && !retryable(res)) {
            for (uint32_t pos = F->runs[k]; pos < F->runs[k + 1]; pos++)
                batch->samples[F->sorted[pos]].length = res;
        } else {
            /* Short (the file ends inside the run, or was cut), or
             * interrupted, refused for a moment, or never run (a broken
             * ring): each job on its own, the sure way. */
            repair_run(u, F, k);
        }
        F->run_live[k] = NULL;
    }
    F->batch = NULL;
}

/* ---- on the ring's thread ---- */

static ring_files *ring_files_of(uring *u, uring_ring *r)
{
    if (r->files)
        return r->files;
    ring_files *R = calloc(1, sizeof(*R));
    if (!R)
        return NULL;
    R->cap = u->files_cap;
    R->base = r->depth + 1;
    R->free = malloc(R->cap * sizeof(*R->free));
    R->state = calloc(R->cap, sizeof(*R->state));
    R->waiters = malloc(R->cap * sizeof(*R->waiters));
    if (!R->free || !R->state || !R->waiters || fr_fd_cache_init(&R->lru, R->cap) != 0) {
        free(R->free);
        free(R->state);
        free(R->waiters);
        free(R);
        return NULL;
    }
    R->lru.keys_only = 1;
    /* Opens that cannot finish inline (a path not in the dentry cache) go
     * to this thread's io-wq workers: one at a time per ring, as psync's
     * threads open one file each, so a table reader's threads stay bounded
     * (workers x rings, plus as many io-wq workers at most, when cold).
     * The limit is the thread's (io-wq is per task): a caller's thread
     * driving ring 0 keeps it. Refused (before Linux 5.15): the default. */
    unsigned limits[2] = {1, 1};
    (void)io_uring_register_iowq_max_workers(&r->ring, limits);
    r->files = R;
    return R;
}

/* Every slot free (a new table of paths: the LRU was emptied). */
static void reset_slots(ring_files *R)
{
    R->nfree = 0;
    for (unsigned s = R->cap; s-- > 0;)
        R->free[R->nfree++] = R->base + s;
}

void fr_uring_ring_files_free(uring_ring *r)
{
    ring_files *R = r->files;
    if (!R)
        return;
    fr_fd_cache_free(&R->lru); /* keys_only: closes nothing; the ring's exit drops the files */
    free(R->free);
    free(R->state);
    free(R->waiters);
    free(R);
    r->files = NULL;
}

/* The next run for ring `w`: its own first, then the rest of the others'
 * that may be taken; SIZE_MAX when none is left for it. Each run taken
 * takes one of the pool's items too (fr_threadpool_claim, its number
 * unused), so the pool sees every item claimed only once every run is:
 * then rings not yet woken skip the phase, and only then. */
static size_t take_run(uring_files *F, unsigned w)
{
    for (unsigned d = 0; d < F->nrings; d++) {
        unsigned o = (w + d) % F->nrings;
        if (d && !F->stealable[o])
            continue;
        size_t at = atomic_fetch_add_explicit(&F->next[o], 1, memory_order_relaxed);
        if (at < F->ring_end[o])
            return F->by_ring[at];
    }
    return SIZE_MAX;
}

/* Queues run k's read from slot `slot`: one READV, or a READ (into the
 * registered arena where it is) for a run of one vector. */
static struct io_uring_sqe *queue_run_read(uring *u, uring_ring *r, uring_files *F, size_t k,
                                           unsigned slot, int buf_index)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    uint32_t a = F->run_iov[k], niov = F->run_iov[k + 1] - a;
    uint64_t off = F->jobs[F->sorted[F->runs[k]]].offset;
    if (niov == 1 && buf_index >= 0 && F->iov[a].iov_base != F->gap)
        io_uring_prep_read_fixed(sqe, (int)slot, F->iov[a].iov_base, (unsigned)F->iov[a].iov_len,
                                 off, buf_index);
    else if (niov <= 1) /* none: a run of empty ranges, read as 0 bytes */
        io_uring_prep_read(sqe, (int)slot, niov ? F->iov[a].iov_base : F->gap,
                           niov ? (unsigned)F->iov[a].iov_len : 0, off);
    else
        io_uring_prep_readv(sqe, (int)slot, &F->iov[a], niov, off);
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, pack(k, slot, OP_READ));
    F->run_slot[k] = slot;
    F->run_live[k] = r;
    return sqe;
}

/* Starts run k: its read if this ring holds its file, queued behind the
 * file's open if that is in flight, else an open into a slot linked to
 * the read. 0 when no slot is free or unpinned (nothing was queued). */
static int start_run(uring *u, uring_ring *r, ring_files *R, size_t k, int buf_index,
                     size_t *inflight)
{
    uring_files *F = u->files;
    uint32_t file = run_file(F, k);
    int slot = fr_fd_cache_get(&R->lru, file); /* pinned for the call */
    if (slot >= 0) {
        unsigned s = (unsigned)slot - R->base;
        if (R->state[s] == SLOT_OPENING) {
            F->run_slot[k] = (unsigned)slot;
            F->run_next[k] = R->waiters[s];
            R->waiters[s] = (uint32_t)k;
        } else {
            queue_run_read(u, r, F, k, (unsigned)slot, buf_index);
            (*inflight)++;
        }
        return 1;
    }
    int victim;
    uint32_t nvictims;
    if (fr_fd_cache_reserve_take(&R->lru, 1, &victim, &nvictims) != 0)
        return 0;
    if (nvictims)
        R->free[R->nfree++] = (unsigned)victim; /* the open below replaces its file */
    unsigned fresh = R->free[--R->nfree];
    (void)fr_fd_cache_put(&R->lru, file, (int)fresh); /* room was reserved */
    R->state[fresh - R->base] = SLOT_OPENING;
    R->waiters[fresh - R->base] = NONE;
    const char *path = F->paths[file], *name = path;
    int dir;
    name = fr_shard_dir_name(&F->dir, path, &dir);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    /* O_NONBLOCK: a FIFO put in a shard's place opens at once instead of
     * waiting for a writer (no O_CLOEXEC: direct descriptors refuse it). */
    io_uring_prep_openat_direct(sqe, dir, name, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, fresh);
    io_uring_sqe_set_data64(sqe, pack(k, fresh, OP_OPEN));
    sqe->flags |= IOSQE_IO_LINK;
    queue_run_read(u, r, F, k, fresh, buf_index);
    *inflight += 2;
    return 1;
}

static void files_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    uring_files *F = u->files;
    ring_files *R = r->files;
    size_t k = ud_index(cqe->user_data);
    unsigned slot = ud_slot(cqe->user_data);
    switch (ud_op(cqe->user_data)) {
    case OP_OPEN: {
        unsigned s = slot - R->base;
        uint32_t w = R->waiters[s];
        R->waiters[s] = NONE;
        if (cqe->res < 0) {
            /* Nothing was installed: forget the file (its next use opens
             * it again), fail the runs waiting for it; the linked read
             * completes -ECANCELED and takes this error (settle). */
            F->run_open[k] = cqe->res;
            R->state[s] = 0;
            fr_fd_cache_drop(&R->lru, run_file(F, k));
            R->free[R->nfree++] = slot;
            for (; w != NONE; w = F->run_next[w])
                F->run_open[w] = cqe->res;
        } else {
            R->state[s] = 0;
            while (w != NONE) { /* their reads go in at the next turn */
                uint32_t next = F->run_next[w];
                F->run_next[w] = R->ready;
                R->ready = w;
                w = next;
            }
        }
        break;
    }
    case OP_READ:
        F->run_res[k] = cqe->res;
        F->run_live[k] = NULL;
        R->reads++;
        break;
    default:
        break; /* a cancel's own completion */
    }
}

void fr_uring_ring_files(uring *u, uring_ring *r)
{
    ring_files *R = ring_files_of(u, r);
    if (!R) {
        int zero = 0;
        atomic_compare_exchange_strong(&u->phase_err, &zero, -ENOMEM);
        return; /* the other rings read the runs; this batch fails */
    }
    uring_files *F = u->files;
    if (R->lru.table != (const void *)F->paths) {
        fr_fd_cache_use_table(&R->lru, F->paths);
        reset_slots(R);
    }
    int buf_index = fr_uring_buffer_index(r, &F->batch->arena);
    size_t inflight = 0, pending = SIZE_MAX; /* pending: a claimed run waiting for a slot */
    int more = 1;
    R->ready = NONE;
    /* At most 2 * depth requests in flight: the SQ holds 4 entries a slot
     * of depth, the CQ twice that. */
    size_t most = 2 * (size_t)r->depth;
    while (more || inflight > 0 || pending != SIZE_MAX || R->ready != NONE) {
        while (R->ready != NONE && inflight < most) {
            uint32_t k = R->ready;
            R->ready = F->run_next[k];
            queue_run_read(u, r, F, k, F->run_slot[k], buf_index);
            inflight++;
        }
        if (pending != SIZE_MAX && R->ready == NONE) {
            /* Every slot was pinned: once nothing is in flight none is
             * used by this call any more. */
            if (inflight == 0)
                fr_fd_cache_unpin_all(&R->lru);
            if (inflight + 2 <= most && start_run(u, r, R, pending, buf_index, &inflight))
                pending = SIZE_MAX;
        }
        size_t took = 0;
        while (pending == SIZE_MAX && more && took < u->per_turn && inflight + 2 <= most) {
            size_t k = take_run(F, (unsigned)(r - u->rings)), token;
            if (k == SIZE_MAX) {
                more = 0;
                break;
            }
            (void)fr_threadpool_claim(u->pool, &token); /* see take_run */
            took++;
            if (!start_run(u, r, R, k, buf_index, &inflight))
                pending = k;
        }
        if (inflight == 0)
            continue;
        if (fr_uring_turn(u, r, &inflight, files_cqe) == (size_t)-1) {
            /* Broken ring (drained): runs not read keep -ECANCELED and are
             * read the slow way by settle. Slots whose open never ran are
             * forgotten with the rest. */
            fr_fd_cache_clear(&R->lru);
            reset_slots(R);
            R->ready = NONE;
            return;
        }
    }
    fr_fd_cache_unpin_all(&R->lru);
}

size_t fr_uring_files_stuck(uring *u, uring_ring *r)
{
    uring_files *F = u->files;
    size_t issued = 0;
    for (size_t k = 0; k < F->nruns; k++) {
        if (F->run_live[k] != r || F->run_stuck[k])
            continue;
        struct stat st;
        const char *path = F->paths[run_file(F, k)];
        if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))
            continue;
        F->run_stuck[k] = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) {
            io_uring_submit(&r->ring);
            sqe = io_uring_get_sqe(&r->ring);
        }
        if (!sqe)
            break;
        io_uring_prep_cancel64(sqe, pack(k, F->run_slot[k], OP_READ), 0);
        io_uring_sqe_set_data64(sqe, pack(0, 0, OP_CANCEL));
        issued++;
    }
    return issued;
}

const char *fr_uring_files_run_path(const uring *u, size_t k)
{
    const uring_files *F = u->files;
    return F && k < F->nruns ? F->paths[run_file(F, k)] : NULL;
}

void fr_uring_files_last_off(uring *u)
{
    u->files->last = 0;
}

int fr_uring_files_error(const uring *u, size_t i, char *out, size_t len)
{
    const uring_files *F = u->files;
    if (!F || !F->last || i >= F->njobs)
        return 0;
    uint32_t k = F->job_run[i];
    if (k == NONE || k >= F->nruns)
        return 0;
    const char *path = F->paths[run_file(F, k)];
    if (F->run_stuck[k]) {
        snprintf(out, len, "%s: no regular file any more (its read never completed)", path);
        return 1;
    }
    if (F->run_open[k] < 0) {
        snprintf(out, len, "cannot open %s: %s", path, strerror((int)-F->run_open[k]));
        return 1;
    }
    if (F->run_res[k] < 0 && !retryable(F->run_res[k])) {
        snprintf(out, len, "cannot read %s: %s", path, strerror((int)-F->run_res[k]));
        return 1;
    }
    return 0; /* read again the slow way: its errno says it */
}

int fr_uring_files_stat(const uring *u, const char *key, long *out)
{
    if (strncmp(key, "fd_cache_", 9) != 0 && strncmp(key, "file_range", 10) != 0)
        return 0;
    long opens = 0, hits = 0, evictions = 0, open = 0, reads = 0;
    for (unsigned k = 0; k < u->nrings; k++) {
        const ring_files *R = u->rings[k].files;
        if (!R)
            continue;
        opens += R->lru.opens;
        hits += R->lru.hits;
        evictions += R->lru.evictions;
        open += R->lru.used;
        reads += R->reads;
    }
    if (strcmp(key, "fd_cache_opens") == 0)
        *out = opens;
    else if (strcmp(key, "fd_cache_hits") == 0)
        *out = hits;
    else if (strcmp(key, "fd_cache_evictions") == 0)
        *out = evictions;
    else if (strcmp(key, "fd_cache_open") == 0)
        *out = open;
    else if (strcmp(key, "fd_cache_reads") == 0)
        *out = reads;
    else if (strcmp(key, "file_range_repairs") == 0)
        *out = u->files ? u->files->repairs : 0;
    else if (strcmp(key, "file_ranges_native") == 0)
        *out = u->files_native;
    else if (strcmp(key, "fd_cache_slots") == 0)
        *out = (long)u->files_cap * u->nrings;
    else
        return 0;
    return 1;
}

void fr_uring_files_free(uring *u)
{
    uring_files *F = u->files;
    if (!F)
        return;
    fr_shard_dir_close(&F->dir);
    free(F->ranges);
    free(F->sorted);
    free(F->runs);
    free(F->job_run);
    free(F->run_iov);
    free(F->iov);
    free(F->run_len);
    free(F->run_res);
    free(F->run_open);
    free(F->run_stuck);
    free(F->run_next);
    free(F->run_slot);
    free(F->run_live);
    free(F->by_ring);
    free(F->ring_end);
    free((void *)F->next);
    free(F->stealable);
    free(F->gap);
    free(F);
    u->files = NULL;
}
