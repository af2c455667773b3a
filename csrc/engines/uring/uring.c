/*
 * io_uring: a batch spread over `threads` rings, each driven by one thread
 * (the caller's for ring 0, a pool thread's for the others), with up to
 * queue_depth files in flight on each.
 *
 * Why several rings: on cached files nearly all the work is the kernel's
 * (path walk, page-cache copy), and io_uring does it inline in the thread
 * that submits. One ring is one core: measured on the 2-core VM, one ring
 * spends 14-17 us of CPU per 92 KB file against psync's 16-19 us per file
 * per thread (no io-wq workers appear), yet psync with 4 threads read 1.4x
 * as many files a second because it used both cores. So every context owns
 * `threads` rings; each ring's thread claims files from the batch a few at a
 * time (see run_rings), so one call on one list uses every ring
 * (fr_read_files runs near a reader's speed).
 *
 * By default the calling thread drives ring 0 and pool threads the others.
 * Asked for SINGLE_ISSUER ("taskrun=defer|single"), every ring is created,
 * submitted to, waited on and torn down by its own pool thread, never by the
 * caller (who may be a different thread at every call: the context is only
 * used by one thread at a time). That is what allows
 * IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN (task work,
 * e.g. the next op of a linked chain, runs only when the ring's thread
 * waits). They are not the default: on the 2-core VM (6.18 kernel), 21 paired
 * rounds of 4,096 cached 92 KB files, 2 rings, batch 64, DEFER_TASKRUN used
 * 22.9 us of CPU per file against COOP_TASKRUN's 19.8 without size hints
 * and 18.7 against 18.0 with them (less CPU in only 10 and 7 of the 21
 * rounds): every op here completes inline, so there is little task work to
 * defer. So rings get COOP_TASKRUN (Linux 5.19), then plain rings where
 * refused; engine_args "taskrun=defer|single|coop|plain" picks the first
 * choice tried, and fr_ctx_stat "setup_flags" says what the kernel granted.
 *
 * When every file's size is known (a reader remembers them from earlier
 * epochs), the arena is laid out before anything is submitted, and each file
 * is opened into a direct descriptor, then read (into a registered buffer
 * when possible) -> close, hard-linked so a failed read never leaks the
 * descriptor slot (see ring_chained for why the open is not linked too).
 *
 * Otherwise each file is sized as it opens: openat (which the kernel
 * completes inline when the path is cached), then a stat (cheap: the inode
 * is in memory once open; also the check that it is a regular file, which
 * no read result can stand in for: a FIFO with a writer or /dev/null gives
 * a short read too), then read -> close. In a batch that is not dense, of
 * files that were at most PIPELINE_MAX_SLOT on average last call, the ring
 * reads each file as soon as it is sized, into room reserved in the arena,
 * one phase per window: through a direct descriptor, sized by stat() of the
 * path (ring_direct, which explains why), or where the rings have none
 * through an ordinary one, sized by fstat (ring_pipelined). Otherwise (a
 * dense batch, laid out in input order; large files) it sizes a whole
 * window first with ordinary descriptors (ring_open, then ring_read: two
 * phases). The stat is a system call on the ring's thread, not io_uring's
 * statx, which io_uring always hands to a worker thread, which costs more
 * than the read of a small file.
 *
 * Anything the fast path cannot finish (a short read, a file whose size
 * changed, a read cut at FR_MAX_REQUEST) is repaired synchronously afterwards,
 * by the caller, once every ring is idle.
 *
 * Registered buffers are cached per ring and arena and identified by the
 * arena's address and generation, so the context must be closed before the
 * arenas it read into are freed (the reader and the Python layer guarantee
 * this).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engines/engine.h"
#include "engines/io_common.h"
#include "engines/range_io.h"
#include "core/threadpool.h"

#define NBUF_SLOTS 16
#define MAX_FIXED_BUF ((size_t)1 << 30) /* the kernel's limit per buffer */
#define MAX_RINGS 64

enum op { OP_OPEN = 1, OP_READ, OP_CLOSE, OP_CANCEL };

/* A ring that waits this long for a completion checks the paths it is still
 * opening or reading: one that is no regular file or block device (a FIFO
 * put in a file's place since its size hint, whose poll-armed read never
 * completes; a FIFO whose open went to an io-wq worker and waits for a
 * writer) has its requests cancelled and fails with EINVAL (EISDIR for a
 * directory). Regular files are never cancelled, however slow; the fast path
 * pays nothing. */
#define STUCK_CHECK_MS 1000

/* What the pool's threads are asked to do. */
enum phase {
    PH_SETUP,
    PH_TEARDOWN,
    PH_CHAINED,
    PH_OPEN,
    PH_READ,
    PH_PIPELINED,
    PH_DIRECT,
    PH_RANGES
};

/* Setup flag sets, tried in order from the one asked for until the kernel
 * takes one: DEFER_TASKRUN needs SINGLE_ISSUER and Linux 6.1, COOP_TASKRUN
 * 5.19. The default starts at COOP_DEFAULT (see the top of the file). */
static const unsigned setup_choices[] = {
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN,
    IORING_SETUP_COOP_TASKRUN,
    0,
};
#define NCHOICES (sizeof(setup_choices) / sizeof(setup_choices[0]))
#define COOP_DEFAULT 2

#define WINDOW 256

typedef struct buf_slot {
    const fr_arena *arena;
    uint64_t generation;
    uint64_t last_used;
} buf_slot;

/* One ring and everything the kernel keeps per ring. Touched only by the
 * pool thread that owns it (see the top of the file). */
typedef struct uring_ring {
    struct io_uring ring;
    int up;
    int setup_rc; /* 0, or why the ring could not be set up */
    unsigned flags; /* setup flags the kernel took */
    unsigned depth; /* files in flight on this ring */
    int fixed_files;
    int fixed_buffers;
    buf_slot bufs[NBUF_SLOTS];
    uint64_t tick;
    unsigned *free_slots;
    unsigned nfree;
    struct opened {
        size_t index;
        unsigned slot;
    } *opened; /* files opened whose read is not submitted yet */
    unsigned nopened;
    unsigned busy; /* PH_PIPELINED: files opened whose close has not completed */
    uint64_t image_gen; /* the image generation in fixed slot `depth`, 0: none */
} uring_ring;

/* Test-only fault injection (engine_args fault_*=, see parse_args): makes
 * chosen completions of this context's rings fail, come back short or late,
 * as a disk, a network file system or a signal would, so tests can prove
 * every such completion surfaces per sample or is retried. Off (mode
 * FAULT_OFF) it costs one predictable branch per completion. */
enum fault_mode { FAULT_OFF = 0, FAULT_EIO, FAULT_EINTR, FAULT_EAGAIN, FAULT_SHORT, FAULT_STALL };

typedef struct fault_plan {
    enum fault_mode mode;
    enum op op;       /* OP_OPEN or OP_READ (range reads are reads) */
    char path[64];    /* substring of the paths to fault; empty: every path */
    long stall_ms;    /* how long FAULT_STALL holds a completion back */
    atomic_long left; /* faults still to inject: -1 every one, shared by the rings */
    atomic_long done; /* faults injected so far (fr_ctx_stat "faults_injected") */
} fault_plan;

typedef struct uring {
    fr_config cfg;
    fault_plan fault;
    unsigned nrings;
    unsigned depth; /* queue_depth: files in flight per ring */
    unsigned first_choice; /* index into setup_choices */
    unsigned extra_flags;  /* engine_args setup_extra=: tried first, dropped if refused */
    int linked;            /* engine_args open=linked: openat linked to its read */
    int unsized_windows;   /* engine_args unsized=windows: no PH_PIPELINED */
    int unsized_fds;       /* PH_PIPELINED, not PH_DIRECT: see DIRECT_MIN_CPUS */
    int caller_ring;       /* ring 0 is driven by the calling thread (see uring_open) */
    uring_ring *rings;           /* rings[w - 1] belongs to pool thread w */
    fr_threadpool *pool;
    long direct_fallbacks;
    /* Files sized at once: WINDOW, less once the process ran out of
     * descriptors (RLIMIT_NOFILE): a window that hits EMFILE is closed and
     * sized again at half the files it got (one at a time at worst). */
    size_t window;
    long window_shrinks;

    /* The phase being run: set by the caller before it hands the phase to
     * the pool, read-only while the threads run. */
    enum phase phase;
    const char *const *paths;
    fr_batch *batch;
    size_t first; /* window start: claimed item k is file item(u, first + k) */
    const size_t *order; /* NULL, or the files a phase works on (see item) */

    /* PH_PIPELINED: slots are taken from [bump, bump_limit) of the arena as
     * files are sized (see pipelined_cqe). */
    atomic_size_t bump;
    size_t bump_limit;
    size_t bump_align;
    size_t est_slot;    /* mean slot of the last call's files, for the next reservation */
    size_t *leftover;   /* files a pipelined window could not finish (grown with cap) */
    unsigned char *placed; /* PH_PIPELINED: file i has its slot */
    long pipelined_windows;
    long direct_windows; /* of those, read through direct descriptors (PH_DIRECT) */
    long deferred_files; /* files sized in a pipelined window but read after it (no room) */
    const fr_range *ranges;
    int range_direct;
    atomic_int phase_err; /* the first batch-level -errno of a phase */
    size_t per_turn;      /* files (ranges) a ring claims per submit: see run_rings */
    size_t phase_count;   /* items of the running phase */

    /* Range reads: the image, opened by the caller; each ring puts it in its
     * fixed slot `depth` when direct descriptors are on. */
    fr_image_cache image;
    uint64_t image_gen; /* bumped whenever the cached image changes */
    size_t rcap;
    int64_t *range_res; /* per range: 0, or the first failed chunk's result */

    /* Per-call results, grown as needed. Entry i is written only by the
     * thread that claimed file i, and read by the caller after the phase
     * (the pool's lock orders the two). */
    size_t cap;
    int64_t *sizes;
    int64_t *open_res;
    int64_t *read_res;
    int *fds;
    /* The ring with requests of file i in flight, or NULL: written by the
     * thread that claimed file i, read by every ring's stuck check. */
    _Atomic(uring_ring *) *live;
    unsigned *live_slot; /* its direct-descriptor slot (chained, linked) */
    int64_t *stuck;      /* 0, or the error of file i's cancelled requests */
} uring;

static inline uint64_t pack(size_t i, unsigned slot, enum op op)
{
    return ((uint64_t)i << 24) | ((uint64_t)slot << 4) | (uint64_t)op;
}
static inline size_t ud_index(uint64_t ud) { return (size_t)(ud >> 24); }
static inline unsigned ud_slot(uint64_t ud) { return (unsigned)((ud >> 4) & 0xFFFFF); }
static inline enum op ud_op(uint64_t ud) { return (enum op)(ud & 0xF); }

/* The file at position k of the running phase: order[k], or k itself. */
static inline size_t item(const uring *u, size_t k) { return u->order ? u->order[k] : k; }

static int uring_probe(char *why, size_t why_len)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) {
        fr_set_err(why, why_len, "io_uring_queue_init failed: %s%s", strerror(-rc),
                   rc == -EPERM || rc == -ENOSYS
                       ? " (io_uring disabled by the kernel, seccomp or a container policy)"
                       : "");
        return rc;
    }
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    int missing = 0;
    if (probe) {
        if (!io_uring_opcode_supported(probe, IORING_OP_OPENAT) ||
            !io_uring_opcode_supported(probe, IORING_OP_READ) ||
            !io_uring_opcode_supported(probe, IORING_OP_CLOSE))
            missing = 1;
        io_uring_free_probe(probe);
    }
    io_uring_queue_exit(&ring);
    if (missing) {
        fr_set_err(why, why_len, "the kernel's io_uring lacks openat/read/close (needs Linux >= 5.6)");
        return -ENOTSUP;
    }
    return 0;
}

/* ---- one ring, on its own thread ---- */

static void ring_setup(uring *u, uring_ring *r)
{
    /* Up to three SQEs per file in flight, rounded up by the kernel to a
     * power of 2. */
    unsigned entries = r->depth * 4;
    int rc = -EINVAL;
    for (unsigned c = u->first_choice; c < NCHOICES; c++) {
        for (int extra = u->extra_flags ? 1 : 0; extra >= 0; extra--) {
            struct io_uring_params params;
            memset(&params, 0, sizeof(params));
            params.flags = setup_choices[c] | (extra ? u->extra_flags : 0);
            rc = io_uring_queue_init_params(entries, &r->ring, &params);
            if (rc == 0) {
                r->flags = params.flags;
                goto ready;
            }
            /* EINVAL: a flag this kernel does not know or allow; anything
             * else (ENOMEM, EMFILE, EPERM) no other flag set will cure. */
            if (rc != -EINVAL)
                goto failed;
        }
    }
failed:
    r->setup_rc = rc;
    return;
ready:
    r->up = 1;
    r->free_slots = malloc(r->depth * sizeof(unsigned));
    r->opened = malloc(r->depth * sizeof(*r->opened));
    if (!r->free_slots || !r->opened) {
        r->setup_rc = -ENOMEM;
        return;
    }
    /* One slot per file in flight, and one more for a range reader's image. */
    if (u->cfg.register_files && io_uring_register_files_sparse(&r->ring, r->depth + 1) == 0) {
        r->fixed_files = 1;
        for (unsigned i = 0; i < r->depth; i++)
            r->free_slots[i] = r->depth - 1 - i;
        r->nfree = r->depth;
    }
    if (u->cfg.register_buffers && io_uring_register_buffers_sparse(&r->ring, NBUF_SLOTS) == 0)
        r->fixed_buffers = 1;
}

static void ring_teardown(uring_ring *r)
{
    if (r->up)
        io_uring_queue_exit(&r->ring);
    r->up = 0;
    free(r->free_slots);
    r->free_slots = NULL;
    free(r->opened);
    r->opened = NULL;
}

/* Returns the registered-buffer index for the arena, or -1 to read unregistered. */
static int buffer_index(uring_ring *r, const fr_arena *arena)
{
    if (!r->fixed_buffers || arena->capacity > MAX_FIXED_BUF)
        return -1;
    r->tick++;
    int lru = 0;
    for (int i = 0; i < NBUF_SLOTS; i++) {
        buf_slot *b = &r->bufs[i];
        if (b->arena == arena && b->generation == arena->generation) {
            b->last_used = r->tick;
            return i;
        }
        if (b->last_used < r->bufs[lru].last_used)
            lru = i;
    }
    struct iovec iov = {.iov_base = arena->base, .iov_len = arena->capacity};
    int rc = io_uring_register_buffers_update_tag(&r->ring, (unsigned)lru, &iov, NULL, 1);
    if (rc < 0) {
        /* Usually RLIMIT_MEMLOCK: carry on with plain reads. */
        r->fixed_buffers = 0;
        return -1;
    }
    r->bufs[lru] = (buf_slot){.arena = arena, .generation = arena->generation, .last_used = r->tick};
    return lru;
}

/* Submits what is queued and waits for at least one completion. Returns 0 or
 * a -errno the ring cannot recover from. */
static int submit_wait(uring_ring *r)
{
    for (;;) {
        int rc = io_uring_submit_and_wait(&r->ring, 1);
        if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY)
            return 0; /* EAGAIN/EBUSY: completions must be reaped first */
        if (rc != -EINTR)
            return rc;
    }
}

/* submit_wait, but -ETIME after STUCK_CHECK_MS without a completion where
 * the kernel can time a wait (IORING_FEAT_EXT_ARG, Linux 5.11). */
static int submit_wait_timed(uring_ring *r)
{
    if (!(r->ring.features & IORING_FEAT_EXT_ARG))
        return submit_wait(r);
    struct __kernel_timespec ts = {.tv_sec = STUCK_CHECK_MS / 1000,
                                   .tv_nsec = (STUCK_CHECK_MS % 1000) * 1000000L};
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_submit_and_wait_timeout(&r->ring, &cqe, 1, &ts, NULL);
        if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY)
            return 0;
        if (rc != -EINTR)
            return rc; /* -ETIME, or broken */
    }
}

/* The error for a path whose open or read may never complete (no regular
 * file or block device), or 0 (also when it cannot be looked at: its own
 * request says why). */
static int64_t not_a_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))
        return 0;
    return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
}

/* Marks file i's requests as in flight on ring r (r NULL: no longer). Entry i
 * is touched only by the thread that claimed file i. */
static inline void set_live(uring *u, size_t i, uring_ring *r, unsigned slot)
{
    u->live[i] = r;
    u->live_slot[i] = slot;
}

/* Cancels the requests of every file in flight on ring r that is no longer a
 * file (see STUCK_CHECK_MS). Returns the cancel requests submitted: each
 * completes too. */
static size_t cancel_stuck(uring *u, uring_ring *r)
{
    size_t issued = 0, n = u->cap;
    if (!u->paths)
        return 0; /* ranges of an image: opened and checked by the caller */
    for (size_t i = 0; i < n; i++) {
        if (u->live[i] != r || u->stuck[i] || !(u->stuck[i] = not_a_file(u->paths[i])))
            continue;
        for (enum op op = OP_OPEN; op <= OP_READ; op++) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            if (!sqe) {
                io_uring_submit(&r->ring);
                sqe = io_uring_get_sqe(&r->ring);
            }
            if (!sqe)
                break;
            io_uring_prep_cancel64(sqe, pack(i, u->live_slot[i], op), 0);
            io_uring_sqe_set_data64(sqe, pack(0, 0, OP_CANCEL));
            issued++;
        }
    }
    return issued;
}

/* Errors the repair path retries (EINTR, EAGAIN), not the sample's error. */
static inline int retryable(int64_t res) { return res == -EINTR || res == -EAGAIN; }

typedef void (*cqe_fn)(uring *u, uring_ring *r, const struct io_uring_cqe *cqe);

/* 1 if this completion is to be faulted (takes one of the plan's faults). */
static int fault_take(fault_plan *f, const char *path)
{
    if (f->path[0] && (!path || !strstr(path, f->path)))
        return 0;
    long left = atomic_load(&f->left);
    while (left != 0) {
        if (left < 0)
            return 1;
        if (atomic_compare_exchange_weak(&f->left, &left, left - 1))
            return 1;
    }
    return 0;
}

/* Applies the fault plan to a copy of one completion (see fault_plan). */
static void fault_inject(uring *u, struct io_uring_cqe *cqe)
{
    fault_plan *f = &u->fault;
    enum op op;
    const char *path;
    if (u->phase == PH_RANGES) {
        op = OP_READ;
        path = u->image.path;
    } else {
        op = ud_op(cqe->user_data);
        path = u->paths ? u->paths[ud_index(cqe->user_data)] : NULL;
    }
    if (op != f->op || (f->mode == FAULT_SHORT && cqe->res <= 0) || !fault_take(f, path))
        return;
    atomic_fetch_add(&f->done, 1);
    switch (f->mode) {
    case FAULT_STALL: {
        struct timespec ts = {f->stall_ms / 1000, (f->stall_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        return;
    }
    case FAULT_SHORT:
        cqe->res /= 2;
        return;
    default:
        break;
    }
    /* An open that did succeed gave a descriptor: a plain one is closed
     * here; a direct one stays in its slot until the next open into the
     * slot replaces it or the ring closes. */
    if (op == OP_OPEN && cqe->res >= 0 && (u->phase == PH_OPEN || u->phase == PH_PIPELINED))
        close(cqe->res);
    cqe->res = f->mode == FAULT_EIO ? -EIO : f->mode == FAULT_EINTR ? -EINTR : -EAGAIN;
}

/* Hands every completion that is ready to fn, in one pass over the CQ ring
 * (one head update for all of them). Returns how many. */
static size_t reap(uring *u, uring_ring *r, cqe_fn fn)
{
    unsigned head, seen = 0;
    struct io_uring_cqe *cqe;
    io_uring_for_each_cqe(&r->ring, head, cqe)
    {
        if (u->fault.mode != FAULT_OFF) {
            struct io_uring_cqe faulted = *cqe;
            fault_inject(u, &faulted);
            fn(u, r, &faulted);
        } else {
            fn(u, r, cqe);
        }
        seen++;
    }
    io_uring_cq_advance(&r->ring, seen);
    return seen;
}

/* After a broken submit, waits for everything in flight so no completion can
 * land in memory the caller is about to reuse, and still hands each to fn
 * (an open that succeeded must have its descriptor closed). */
static void drain(uring *u, uring_ring *r, size_t inflight, cqe_fn fn)
{
    while (inflight > 0) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&r->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            return;
        inflight -= reap(u, r, fn);
    }
}

static void fail_phase(uring *u, int rc)
{
    int zero = 0;
    atomic_compare_exchange_strong(&u->phase_err, &zero, rc);
}

/* Submits, waits and reaps once, taking what completed off *inflight; a wait
 * that lasts STUCK_CHECK_MS cancels requests of paths that are no files. On
 * a broken ring drains it and records the error. Returns 0, or (size_t)-1
 * when broken. */
static size_t turn(uring *u, uring_ring *r, size_t *inflight, cqe_fn fn)
{
    int rc = submit_wait_timed(r);
    if (rc == -ETIME) {
        *inflight += cancel_stuck(u, r);
        return 0;
    }
    if (rc < 0) {
        drain(u, r, *inflight, fn);
        fail_phase(u, rc);
        return (size_t)-1;
    }
    *inflight -= reap(u, r, fn);
    return 0;
}

static void prep_read(uring *u, struct io_uring_sqe *sqe, int fd, size_t i, int buf_index)
{
    fr_batch *batch = u->batch;
    size_t len = fr_request_len((size_t)u->sizes[i], u->cfg.o_direct, u->cfg.direct_alignment);
    void *dst = batch->arena.base + batch->samples[i].offset;
    if (buf_index >= 0)
        io_uring_prep_read_fixed(sqe, fd, dst, (unsigned)len, 0, buf_index);
    else
        io_uring_prep_read(sqe, fd, dst, (unsigned)len, 0);
}

/* Sample i's read from an opened descriptor (ordinary, not direct), then
 * its close, hard-linked so the close runs whatever the read returned: two
 * SQEs the caller has room for. */
static void queue_read_close(uring *u, uring_ring *r, int fd, size_t i, int buf_index)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    prep_read(u, sqe, fd, i, buf_index);
    io_uring_sqe_set_data64(sqe, pack(i, 0, OP_READ));
    sqe->flags |= IOSQE_IO_HARDLINK;
    sqe = io_uring_get_sqe(&r->ring);
    io_uring_prep_close(sqe, fd);
    io_uring_sqe_set_data64(sqe, pack(i, 0, OP_CLOSE));
}

static int open_flags(const uring *u)
{
    return O_RDONLY | (u->cfg.o_direct ? O_DIRECT : 0);
}

/* -- every size known: open into a direct descriptor, then read -> close -- */

/* Queues file i's open into a free direct-descriptor slot of r (the caller
 * checked r->nfree); returns its SQE. */
static struct io_uring_sqe *queue_direct_open(uring *u, uring_ring *r, size_t i)
{
    unsigned slot = r->free_slots[--r->nfree];
    set_live(u, i, r, slot);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    io_uring_prep_openat_direct(sqe, AT_FDCWD, u->paths[i], open_flags(u), 0, slot);
    io_uring_sqe_set_data64(sqe, pack(i, slot, OP_OPEN));
    return sqe;
}

/* Queues file i's read from direct-descriptor slot `slot`, then the slot's
 * close, hard-linked so the close runs whatever the read returned: two
 * SQEs. */
static void queue_read_close_direct(uring *u, uring_ring *r, size_t i, unsigned slot,
                                    int buf_index)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    prep_read(u, sqe, (int)slot, i, buf_index);
    io_uring_sqe_set_data64(sqe, pack(i, slot, OP_READ));
    sqe->flags |= IOSQE_FIXED_FILE | IOSQE_IO_HARDLINK;
    sqe = io_uring_get_sqe(&r->ring);
    io_uring_prep_close_direct(sqe, slot);
    io_uring_sqe_set_data64(sqe, pack(i, slot, OP_CLOSE));
}

/* Queues the read -> close of every file in r->opened and empties it.
 * Returns the SQEs queued; adds the reads' bytes to *bytes if given. */
static size_t queue_opened_reads(uring *u, uring_ring *r, int buf_index, size_t *bytes)
{
    size_t queued = 0;
    while (r->nopened > 0) {
        r->nopened--;
        size_t i = r->opened[r->nopened].index;
        queue_read_close_direct(u, r, i, r->opened[r->nopened].slot, buf_index);
        queued += 2;
        if (bytes)
            *bytes += (size_t)u->sizes[i];
    }
    return queued;
}

/* Not one linked openat -> read -> close chain: when the open cannot finish
 * inline (a path not in the dentry cache) it goes to an io-wq worker, and a
 * read linked behind it then runs in that worker too, blocking it for the
 * disk, at most 4 per CPU of them. Submitted from the ring's thread once the
 * open is done, a read of an uncached file is an async buffered read that
 * holds no thread. Measured on the 2-core VM, cold 4 KiB files: the chain
 * read 12.6k files/s in a Reader (size hints) against 19.5k for the sizing
 * path (open, then read) of read_files(). Warm it costs one more submit per
 * ring-full of files: every open completes inline in the first. */
/* The linked variant (engine_args "open=linked"): openat -> read -> close as
 * one chain per file, one submit for all. */
static void linked_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    size_t i = ud_index(cqe->user_data);
    switch (ud_op(cqe->user_data)) {
    case OP_OPEN:
        u->open_res[i] = cqe->res;
        break;
    case OP_READ:
        u->read_res[i] = cqe->res;
        break;
    case OP_CLOSE:
        r->free_slots[r->nfree++] = ud_slot(cqe->user_data);
        set_live(u, i, NULL, 0);
        break;
    default:
        break;
    }
}

static void ring_linked(uring *u, uring_ring *r)
{
    int buf_index = buffer_index(r, &u->batch->arena);
    size_t inflight = 0;
    int more = 1;
    while (more || inflight > 0) {
        size_t took = 0;
        while (more && r->nfree > 0 && took++ < u->per_turn) {
            size_t k;
            if (!fr_threadpool_claim(u->pool, &k)) {
                more = 0;
                break;
            }
            size_t i = item(u, u->first + k);
            if (u->sizes[i] < 0)
                continue;
            queue_direct_open(u, r, i)->flags |= IOSQE_IO_LINK;
            queue_read_close_direct(u, r, i, u->live_slot[i], buf_index);
            inflight += 3;
        }
        if (inflight == 0)
            continue;
        if (turn(u, r, &inflight, linked_cqe) == (size_t)-1)
            return;
    }
}

/* File i is open in direct-descriptor slot `slot`: its read goes in next turn. */
static inline void push_opened(uring_ring *r, size_t i, unsigned slot)
{
    r->opened[r->nopened].index = i;
    r->opened[r->nopened].slot = slot;
    r->nopened++;
}

static void staged_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    size_t i = ud_index(cqe->user_data);
    unsigned slot = ud_slot(cqe->user_data);
    switch (ud_op(cqe->user_data)) {
    case OP_OPEN:
        u->open_res[i] = cqe->res;
        if (cqe->res < 0) {
            r->free_slots[r->nfree++] = slot; /* nothing was installed */
            set_live(u, i, NULL, 0);
        } else {
            push_opened(r, i, slot);
        }
        break;
    case OP_READ:
        u->read_res[i] = cqe->res;
        break;
    case OP_CLOSE:
        /* The read is over whatever happened: the slot is free again. */
        r->free_slots[r->nfree++] = slot;
        set_live(u, i, NULL, 0);
        break;
    default:
        break;
    }
}

static void ring_chained(uring *u, uring_ring *r)
{
    int buf_index = buffer_index(r, &u->batch->arena);
    size_t inflight = 0;
    int more = 1;
    r->nopened = 0;
    while (more || inflight > 0 || r->nopened > 0) {
        /* Reads of the files opened so far (the SQ holds 4 entries per
         * slot: at most 2 per opened file plus 1 per open below). */
        inflight += queue_opened_reads(u, r, buf_index, NULL);
        size_t took = 0;
        while (more && r->nfree > 0 && took++ < u->per_turn) {
            size_t k;
            if (!fr_threadpool_claim(u->pool, &k)) {
                more = 0;
                break;
            }
            size_t i = item(u, u->first + k);
            if (u->sizes[i] < 0)
                continue;
            queue_direct_open(u, r, i);
            inflight++;
        }
        if (inflight == 0)
            continue; /* every sample claimed so far had failed before */
        if (turn(u, r, &inflight, staged_cqe) == (size_t)-1) {
            /* Broken ring: opened slots keep their files until reused (a
             * direct open replaces what a slot holds) or the ring closes. */
            for (size_t k = 0; k < r->nopened; k++)
                r->free_slots[r->nfree++] = r->opened[k].slot;
            r->nopened = 0;
            return;
        }
    }
}

/* -- sizes unknown: open and size a window, lay it out, read and close -- */

/* The size a stat or fstat found (rc: what it returned), or why there is
 * none to trust: -errno, -EISDIR, or -EINVAL for anything else that is no
 * regular file. */
static int64_t stat_size(int rc, const struct stat *st)
{
    if (rc != 0)
        return -errno;
    if (!S_ISREG(st->st_mode))
        return S_ISDIR(st->st_mode) ? -EISDIR : -EINVAL;
    return st->st_size;
}

/* Records file i's failed open (res: -errno). O_DIRECT refused by this file
 * system, or an open interrupted or refused for a moment: size 0, the repair
 * step reads it (retrying); otherwise the error is the sample's. Returns
 * u->sizes[i]. */
static int64_t open_failed(uring *u, size_t i, int res)
{
    u->open_res[i] = res;
    u->sizes[i] = (res == -EINVAL && u->cfg.o_direct) || retryable(res) ? 0 : res;
    return u->sizes[i];
}

/* Records the outcome of file i's open (res: a descriptor or -errno) and
 * sizes it: on success u->fds[i] holds the descriptor and u->sizes[i] the
 * size; otherwise the descriptor (if any) is closed and u->sizes[i] is the
 * error (0 where the repair step is to read it). Returns u->sizes[i]. */
static int64_t open_sized(uring *u, size_t i, int res)
{
    set_live(u, i, NULL, 0);
    if (res < 0)
        return open_failed(u, i, res);
    int fd = res;
    u->open_res[i] = 0;
    /* Sized here, on the ring's thread, so the fstats of a window run in
     * parallel too. Also the check that this is a regular file: a FIFO with
     * a writer or a character device would give some bytes to any read. */
    struct stat st;
    int64_t size = stat_size(fstat(fd, &st), &st);
    u->sizes[i] = size;
    if (size < 0)
        close(fd); /* nothing to do about a failed close of a file never read */
    else
        u->fds[i] = fd;
    return size;
}

static void open_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    (void)r;
    if (ud_op(cqe->user_data) != OP_OPEN)
        return; /* a cancel's own completion */
    (void)open_sized(u, ud_index(cqe->user_data), cqe->res);
}

static void ring_open(uring *u, uring_ring *r)
{
    size_t inflight = 0;
    int more = 1;
    while (more || inflight > 0) {
        size_t took = 0;
        while (more && inflight < r->depth && io_uring_sq_space_left(&r->ring) >= 1 &&
               took++ < u->per_turn) {
            size_t k;
            if (!fr_threadpool_claim(u->pool, &k)) {
                more = 0;
                break;
            }
            size_t i = item(u, u->first + k);
            set_live(u, i, r, 0);
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            io_uring_prep_openat(sqe, AT_FDCWD, u->paths[i], open_flags(u) | O_CLOEXEC, 0);
            io_uring_sqe_set_data64(sqe, pack(i, 0, OP_OPEN));
            inflight++;
        }
        if (inflight == 0)
            continue;
        if (turn(u, r, &inflight, open_cqe) == (size_t)-1)
            return;
    }
}

static void read_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    (void)r;
    size_t i = ud_index(cqe->user_data);
    if (ud_op(cqe->user_data) == OP_READ)
        u->read_res[i] = cqe->res;
    else if (ud_op(cqe->user_data) == OP_CLOSE)
        u->fds[i] = -1; /* closed (or the close failed: the fd is gone either way) */
}

static void ring_read(uring *u, uring_ring *r)
{
    int buf_index = buffer_index(r, &u->batch->arena);
    size_t ops = 0;
    int more = 1;
    while (more || ops > 0) {
        size_t took = 0;
        while (more && ops + 2 <= 2 * (size_t)r->depth &&
               io_uring_sq_space_left(&r->ring) >= 2 && took++ < u->per_turn) {
            size_t k;
            if (!fr_threadpool_claim(u->pool, &k)) {
                more = 0;
                break;
            }
            size_t i = item(u, u->first + k);
            int fd = u->fds[i];
            if (fd < 0)
                continue;
            queue_read_close(u, r, fd, i, buf_index);
            ops += 2;
        }
        if (ops == 0)
            continue;
        if (turn(u, r, &ops, read_cqe) == (size_t)-1)
            return;
    }
}

/* -- sizes unknown, batch not dense: open, size, take a slot, read, close,
 *    each file on its own as its open completes, in one phase --
 *
 * The sizing path above runs two phases per window (every open, then every
 * read), so each window is two fork-joins of the rings' threads and a
 * barrier where the ring that finished its opens first waits for the other.
 * Here a ring reads a file as soon as it is sized: slots come from room in
 * the arena reserved before the phase (the last call's mean slot times the
 * files, plus an eighth) and are taken in completion order, so samples are
 * not laid out in input order; dense batches, which promise exactly that,
 * keep the sizing path. A file sized when the room is spent keeps its
 * descriptor and is read after the phase, once the arena has grown for it. */

/* Files whose mean slot (the last call's) is larger keep the two-phase path:
 * their reads dwarf a phase's hand-off, and the pipelined path's tail (a ring
 * holding files another could read) showed instead. On the 2-core VM, in
 * one process (engine_args unsized=), 1 MiB files, batch 256: 0.95-1.01 of
 * the two-phase path's files/s over four runs of 15 rounds; 4 KiB: 1.00-1.42,
 * 92 KiB: 0.92-1.06. */
#define PIPELINE_MAX_SLOT ((size_t)512 << 10)

/* Reads of at most this many bytes in one submit take the next files' opens
 * along (see opens_this_turn). */
#define LOOKAHEAD_BYTES ((size_t)256 << 10)

/* The slot of a file of `size` bytes: its request, rounded to bump_align
 * (what fr_layout gives it in a batch that is not dense). */
static size_t slot_len(const uring *u, int64_t size)
{
    return fr_round_up(fr_request_len((size_t)size, u->cfg.o_direct, u->cfg.direct_alignment),
                       u->bump_align);
}

/* Takes `len` bytes of the reserved room; their offset, or SIZE_MAX when
 * the room is spent. Any ring's thread. */
static size_t take_slot(uring *u, size_t len)
{
    size_t off = atomic_load_explicit(&u->bump, memory_order_relaxed);
    for (;;) {
        size_t start = fr_round_up(off, u->bump_align);
        if (start > u->bump_limit || len > u->bump_limit - start)
            return SIZE_MAX;
        if (atomic_compare_exchange_weak_explicit(&u->bump, &off, start + len,
                                                  memory_order_relaxed, memory_order_relaxed))
            return start;
    }
}

static void pipelined_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    size_t i = ud_index(cqe->user_data);
    switch (ud_op(cqe->user_data)) {
    case OP_OPEN: {
        int64_t size = open_sized(u, i, cqe->res);
        size_t off = size < 0 ? SIZE_MAX : take_slot(u, slot_len(u, size));
        if (off != SIZE_MAX) {
            u->batch->samples[i].offset = off;
            u->batch->samples[i].length = 0;
            u->placed[i] = 1;
        }
        if (off != SIZE_MAX && u->fds[i] >= 0) {
            r->opened[r->nopened].index = i;
            r->nopened++;
        } else {
            /* Failed, left to the repair step (no descriptor), or no room:
             * read after the phase with its descriptor kept in fds[i]. */
            r->busy--;
        }
        break;
    }
    case OP_READ:
        u->read_res[i] = cqe->res;
        break;
    case OP_CLOSE:
        u->fds[i] = -1; /* closed (or the close failed: the fd is gone either way) */
        r->busy--;
        break;
    default:
        break;
    }
}

/* How many new files a ring of the one-phase paths (ring_pipelined,
 * ring_direct) opens in this turn, whose reads total `reading` bytes, having
 * claimed up to item `claimed`. Near the end of the list, the next files'
 * opens go in the same submit as these reads only while the reads are small
 * (then the submit is a share of the work worth saving): behind large cached
 * reads, which finish inside the submit, they would be files this ring holds
 * while another ring runs out of work. Earlier they always go along: cold
 * reads, which finish later, then fill the ring as fast as the two-phase
 * path's reads did. */
static size_t opens_this_turn(const uring *u, size_t claimed, size_t reading)
{
    size_t left = u->phase_count - (claimed < u->phase_count ? claimed : u->phase_count);
    return reading <= LOOKAHEAD_BYTES || left > 2 * (size_t)u->nrings * u->per_turn
               ? u->per_turn
               : 0;
}

static void ring_pipelined(uring *u, uring_ring *r)
{
    int buf_index = buffer_index(r, &u->batch->arena);
    size_t ops = 0, claimed = 0; /* claimed: items handed out, as of this ring's last claim */
    int more = 1;
    r->nopened = 0;
    r->busy = 0;
    while (more || ops > 0 || r->nopened > 0) {
        /* Reads of the files sized so far: at most depth files are busy, so
         * the SQ (4 entries per file) holds their reads and closes and the
         * opens below. */
        size_t reading = 0; /* bytes of the reads submitted in this turn */
        while (r->nopened > 0) {
            r->nopened--;
            size_t i = r->opened[r->nopened].index;
            int fd = u->fds[i];
            queue_read_close(u, r, fd, i, buf_index);
            ops += 2;
            reading += (size_t)u->sizes[i];
        }
        size_t took = 0, allowed = opens_this_turn(u, claimed, reading);
        while (more && r->busy < r->depth && took++ < allowed) {
            size_t k;
            if (!fr_threadpool_claim(u->pool, &k)) {
                more = 0;
                break;
            }
            claimed = k + 1; /* items are handed out in order */
            size_t i = item(u, u->first + k);
            set_live(u, i, r, 0);
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            io_uring_prep_openat(sqe, AT_FDCWD, u->paths[i], open_flags(u) | O_CLOEXEC, 0);
            io_uring_sqe_set_data64(sqe, pack(i, 0, OP_OPEN));
            r->busy++;
            ops++;
        }
        if (ops == 0)
            continue;
        if (turn(u, r, &ops, pipelined_cqe) == (size_t)-1) {
            /* Broken ring: the descriptors of files sized but not read stay
             * in fds[] for the caller to close. */
            r->nopened = 0;
            return;
        }
    }
}

/* -- sizes unknown, batch not dense, direct descriptors: PH_DIRECT --
 *
 * PH_PIPELINED with the process's descriptor table left alone: each file is
 * opened into one of the ring's direct-descriptor slots, sized by stat() of
 * its path (the open just brought its dentry and inode into memory, so this
 * never waits for the disk), read into its slot of the reserved room and
 * closed, all on the ring's thread.
 *
 * Why: a regular descriptor's open and close each take the table's lock,
 * one per process. Measured on the 16-core H200 machine
 * (bench/tools/fdtable_probe.c: open, fstat, pread, close of cached 4 KiB
 * files), threads sharing the table read 1.07M files/s with 4 threads,
 * 1.04M with 8 and 0.95M with 16 (16.8 us of CPU a file), against 4.0M
 * with 16 threads each on a private table (4.0 us). PH_PIPELINED's
 * read_files() on lists of 64 such files spent 81 us a call in the engine
 * with 16 rings, where a Reader, which reads known sizes through direct
 * descriptors (PH_CHAINED), spent 5.6 us of CPU a file.
 *
 * The stat after the open sees the path again: a file renamed in between
 * gives a size that does not match what the descriptor reads (size + 1
 * bytes are asked for), and the repair step reads the path again. A file
 * sized when the reserved room is spent gives its slot back (the next open
 * into it replaces the file) and is read after the window, its size known,
 * through PH_CHAINED. */

/* Below this many CPUs, PH_PIPELINED (ordinary descriptors, fstat) is the
 * default: few threads hardly contend for the table's lock, and stat() of
 * the path costs more than fstat. On the 2-core VM, read_files() of 64
 * cached 4 KiB files ran 0.91x as fast through PH_DIRECT (92 KiB: 1.01x);
 * on the 16-core H200 1.59x (92 KiB: 0.97x at 64 files, 1.13x at 256).
 * engine_args unsized=direct|fds overrides. */
#define DIRECT_MIN_CPUS 4

/* Records file i's direct open (res: 0 or -errno) and sizes it by path, as
 * open_sized does for a descriptor. Returns u->sizes[i]. */
static int64_t direct_sized(uring *u, size_t i, int res)
{
    set_live(u, i, NULL, 0);
    if (res < 0)
        return open_failed(u, i, res);
    u->open_res[i] = 0;
    struct stat st;
    return u->sizes[i] = stat_size(stat(u->paths[i], &st), &st);
}

static void direct_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    if (ud_op(cqe->user_data) != OP_OPEN) {
        staged_cqe(u, r, cqe); /* reads and closes: as with size hints */
        return;
    }
    size_t i = ud_index(cqe->user_data);
    unsigned slot = ud_slot(cqe->user_data);
    int64_t size = direct_sized(u, i, cqe->res);
    size_t off = size < 0 || cqe->res < 0 ? SIZE_MAX : take_slot(u, slot_len(u, size));
    if (off != SIZE_MAX) {
        u->batch->samples[i].offset = off;
        u->batch->samples[i].length = 0;
        u->placed[i] = 1;
        push_opened(r, i, slot);
    } else {
        /* Failed, or no room: the slot is free again (a file it still
         * holds is dropped by the next open into it). */
        r->free_slots[r->nfree++] = slot;
    }
}

static void ring_direct(uring *u, uring_ring *r)
{
    int buf_index = buffer_index(r, &u->batch->arena);
    size_t ops = 0, claimed = 0; /* claimed: as in ring_pipelined */
    int more = 1;
    r->nopened = 0;
    while (more || ops > 0 || r->nopened > 0) {
        /* The SQ (4 entries a slot) holds two for each file sized and one
         * open for each free slot. */
        size_t reading = 0;
        ops += queue_opened_reads(u, r, buf_index, &reading);
        size_t took = 0, allowed = opens_this_turn(u, claimed, reading);
        while (more && r->nfree > 0 && took++ < allowed) {
            size_t k;
            if (!fr_threadpool_claim(u->pool, &k)) {
                more = 0;
                break;
            }
            claimed = k + 1;
            queue_direct_open(u, r, item(u, u->first + k));
            ops++;
        }
        if (ops == 0)
            continue;
        if (turn(u, r, &ops, direct_cqe) == (size_t)-1) {
            /* Broken ring (drained): files sized but not read give their
             * slots back and are left to the repair step. */
            for (size_t k = 0; k < r->nopened; k++) {
                u->placed[r->opened[k].index] = 0;
                r->free_slots[r->nfree++] = r->opened[k].slot;
            }
            r->nopened = 0;
            return;
        }
    }
}

/* -- ranges of one image -- */

/* Range index in the high bits, chunk number in the low 24 (16 TiB ranges). */
static inline uint64_t range_ud(size_t i, size_t chunk) { return ((uint64_t)i << 24) | chunk; }

static void range_cqe(uring *u, uring_ring *r, const struct io_uring_cqe *cqe)
{
    (void)r;
    size_t i = (size_t)(cqe->user_data >> 24);
    size_t chunk = (size_t)(cqe->user_data & 0xFFFFFF);
    /* Every completion is checked: a chunk must deliver each byte of the
     * range it covers (the O_DIRECT tail past the range's end may be missing
     * at the end of the image). */
    uint64_t start = (uint64_t)chunk * FR_RANGE_CHUNK;
    uint64_t want = u->ranges[i].length - start;
    if (want > FR_RANGE_CHUNK)
        want = FR_RANGE_CHUNK;
    if (cqe->res < 0) {
        if (u->range_res[i] == 0)
            u->range_res[i] = cqe->res;
    } else if ((uint64_t)cqe->res < want && u->range_res[i] == 0) {
        u->range_res[i] = -EAGAIN; /* short: finished on the slow path */
    }
}

/* Keeps this ring's fixed slot `depth` on the current image. Returns the
 * descriptor to read with and sets *fixed when it is a fixed index. */
static int ring_image_fd(uring *u, uring_ring *r, int *fixed)
{
    *fixed = 0;
    if (r->fixed_files && r->image_gen != u->image_gen) {
        int fd = u->image.fd;
        r->image_gen = io_uring_register_files_update(&r->ring, r->depth, &fd, 1) == 1
                           ? u->image_gen
                           : 0;
    }
    if (r->fixed_files && r->image_gen == u->image_gen) {
        *fixed = 1;
        return (int)r->depth;
    }
    return u->image.fd;
}

static void ring_ranges(uring *u, uring_ring *r)
{
    int fixed;
    int fd = ring_image_fd(u, r, &fixed);
    int buf_index = buffer_index(r, &u->batch->arena);
    size_t align = u->cfg.direct_alignment;
    size_t inflight = 0, cur = 0, next_chunk = 0;
    int have = 0, more = 1;
    while (more || have || inflight > 0) {
        size_t took = 0;
        while (inflight < r->depth && io_uring_sq_space_left(&r->ring) >= 1) {
            if (!have) {
                if (!more || took >= u->per_turn)
                    break;
                took++;
                if (!fr_threadpool_claim(u->pool, &cur)) {
                    more = 0;
                    break;
                }
                if (u->range_res[cur] < 0 || u->ranges[cur].length == 0)
                    continue;
                have = 1;
                next_chunk = 0;
            }
            size_t i = cur;
            size_t req = fr_range_request_len(u->ranges[i].length, u->range_direct, align);
            size_t off = next_chunk * FR_RANGE_CHUNK;
            size_t len = req - off < FR_RANGE_CHUNK ? req - off : FR_RANGE_CHUNK;
            uint8_t *dst = u->batch->arena.base + u->batch->samples[i].offset + off;
            uint64_t at = u->ranges[i].offset + off;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            if (buf_index >= 0)
                io_uring_prep_read_fixed(sqe, fd, dst, (unsigned)len, at, buf_index);
            else
                io_uring_prep_read(sqe, fd, dst, (unsigned)len, at);
            if (fixed)
                sqe->flags |= IOSQE_FIXED_FILE;
            io_uring_sqe_set_data64(sqe, range_ud(i, next_chunk));
            inflight++;
            if (off + len >= req)
                have = 0;
            else
                next_chunk++;
        }
        if (inflight == 0)
            continue;
        if (turn(u, r, &inflight, range_cqe) == (size_t)-1)
            return;
    }
}

/* The pool's entry point. With caller_ring, worker w (0: the caller) works
 * on ring w; otherwise worker w (1..nrings) on ring w - 1 and the caller on
 * none. */
static void run_phase(void *arg, int phase, unsigned worker)
{
    uring *u = arg;
    unsigned k = u->caller_ring ? worker : worker - 1;
    if ((!u->caller_ring && worker == 0) || k >= u->nrings)
        return;
    uring_ring *r = &u->rings[k];
    switch ((enum phase)phase) {
    case PH_SETUP:
        ring_setup(u, r);
        break;
    case PH_TEARDOWN:
        ring_teardown(r);
        break;
    case PH_CHAINED:
        if (u->linked)
            ring_linked(u, r);
        else
            ring_chained(u, r);
        break;
    case PH_OPEN:
        ring_open(u, r);
        break;
    case PH_READ:
        ring_read(u, r);
        break;
    case PH_PIPELINED:
        ring_pipelined(u, r);
        break;
    case PH_DIRECT:
        ring_direct(u, r);
        break;
    case PH_RANGES:
        ring_ranges(u, r);
        break;
    }
}

/* ---- the engine, on the caller's thread ---- */

static void uring_close(void *state)
{
    uring *u = state;
    if (!u)
        return;
    if (u->pool) {
        fr_threadpool_run_helpers(u->pool, PH_TEARDOWN, 0);
        fr_threadpool_stop(u->pool);
    }
    if (u->caller_ring && u->rings)
        ring_teardown(&u->rings[0]);
    fr_image_cache_close(&u->image);
    free(u->rings);
    free(u->range_res);
    free(u->sizes);
    free(u->open_res);
    free(u->read_res);
    free(u->fds);
    free(u->live);
    free(u->live_slot);
    free(u->stuck);
    free(u->leftover);
    free(u->placed);
    free(u);
}

/* engine_args: "taskrun=defer|single|coop|plain" (the first setup choice
 * tried: SINGLE_ISSUER + DEFER_TASKRUN, SINGLE_ISSUER + COOP_TASKRUN,
 * COOP_TASKRUN, none; default coop), "open=staged|linked" (with size hints:
 * read once the open is done, or openat -> read -> close linked; see
 * ring_chained), "unsized=pipelined|direct|fds|windows" (sizes unknown,
 * batch not dense: one phase per window, the default, through direct
 * descriptors on machines of DIRECT_MIN_CPUS or more, else ordinary ones;
 * always direct (ring_direct; ordinary where the rings have no direct
 * ones); always ordinary (ring_pipelined); or the two-phase windows of
 * dense batches; for A/B measurements in one process) and "setup_extra=<flags>" (more
 * IORING_SETUP_* bits, tried first and dropped if refused: for experiments
 * and for testing the fallback).
 *
 * For tests only, fault injection (fault_plan): "fault_mode=eio|eintr|eagain|
 * short|stall" turns it on; "fault_op=open|read" (default read: file and
 * range reads), "fault_path=<substring>" (default: every path; a range's
 * path is its image's), "fault_count=<n>" (default 1; -1: every matching
 * completion; counted per context, over all its rings) and
 * "fault_stall_ms=<ms>" (default 200) choose where. eio/eintr/eagain replace
 * the completion's result with that -errno, short halves a read's byte
 * count, stall holds the completion back in the ring's thread. */
static int parse_args(uring *u, const char *args, char *err, size_t err_len)
{
    const char *p = args ? args : "";
    int faulted = 0; /* a fault_* item was given */
    u->fault.op = OP_READ;
    u->fault.stall_ms = 200;
    atomic_store(&u->fault.left, 1);
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len >= sizeof(item)) {
            fr_set_err(err, err_len, "io_uring: engine_args item too long: %.*s", (int)len, p);
            return -EINVAL;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *eq = strchr(item, '=');
        const char *val = eq ? eq + 1 : "";
        if (eq)
            *eq = 0;
        if (len == 0) {
            /* empty item: nothing */
        } else if (strcmp(item, "taskrun") == 0 && strcmp(val, "defer") == 0) {
            u->first_choice = 0;
        } else if (strcmp(item, "taskrun") == 0 && strcmp(val, "single") == 0) {
            u->first_choice = 1;
        } else if (strcmp(item, "taskrun") == 0 && strcmp(val, "coop") == 0) {
            u->first_choice = 2;
        } else if (strcmp(item, "taskrun") == 0 && strcmp(val, "plain") == 0) {
            u->first_choice = 3;
        } else if (strcmp(item, "open") == 0 && strcmp(val, "linked") == 0) {
            u->linked = 1;
        } else if (strcmp(item, "open") == 0 && strcmp(val, "staged") == 0) {
            u->linked = 0;
        } else if (strcmp(item, "unsized") == 0 && strcmp(val, "windows") == 0) {
            u->unsized_windows = 1;
            u->unsized_fds = 0;
        } else if (strcmp(item, "unsized") == 0 && strcmp(val, "pipelined") == 0) {
            u->unsized_windows = 0; /* PH_DIRECT or PH_PIPELINED, as the CPUs say */
        } else if (strcmp(item, "unsized") == 0 && strcmp(val, "fds") == 0) {
            u->unsized_windows = 0;
            u->unsized_fds = 1;
        } else if (strcmp(item, "unsized") == 0 && strcmp(val, "direct") == 0) {
            u->unsized_windows = 0;
            u->unsized_fds = 0;
        } else if (strcmp(item, "fault_mode") == 0) {
            static const char *const modes[] = {"eio", "eintr", "eagain", "short", "stall"};
            u->fault.mode = FAULT_OFF;
            for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++)
                if (strcmp(val, modes[m]) == 0)
                    u->fault.mode = (enum fault_mode)(FAULT_EIO + m);
            if (u->fault.mode == FAULT_OFF) {
                fr_set_err(err, err_len,
                           "io_uring: fault_mode=%s is not one of eio|eintr|eagain|short|stall", val);
                return -EINVAL;
            }
            faulted = 1;
        } else if (strcmp(item, "fault_op") == 0 &&
                   (strcmp(val, "open") == 0 || strcmp(val, "read") == 0)) {
            u->fault.op = strcmp(val, "open") == 0 ? OP_OPEN : OP_READ;
            faulted = 1;
        } else if (strcmp(item, "fault_path") == 0) {
            snprintf(u->fault.path, sizeof(u->fault.path), "%s", val); /* fits: item < 64 */
            faulted = 1;
        } else if ((strcmp(item, "fault_count") == 0 || strcmp(item, "fault_stall_ms") == 0) &&
                   *val) {
            char *e;
            long v = strtol(val, &e, 10);
            int is_count = item[6] == 'c';
            if (*e || v < (is_count ? -1 : 0) || v > 3600000) {
                fr_set_err(err, err_len, "io_uring: %s=%s is not %s", item, val,
                           is_count ? "a count (-1: every completion)" : "milliseconds");
                return -EINVAL;
            }
            if (is_count)
                atomic_store(&u->fault.left, v);
            else
                u->fault.stall_ms = v;
            faulted = 1;
        } else if (strcmp(item, "setup_extra") == 0 && *val) {
            char *e;
            unsigned long v = strtoul(val, &e, 0);
            if (*e || v > 0xFFFFFFFFul) {
                fr_set_err(err, err_len, "io_uring: setup_extra=%s is not a number", val);
                return -EINVAL;
            }
            u->extra_flags = (unsigned)v;
        } else {
            fr_set_err(err, err_len,
                       "io_uring: unknown engine_args item '%s' (known: taskrun=defer|single|coop|plain, "
                       "open=staged|linked, unsized=pipelined|direct|fds|windows, setup_extra=<flags>; "
                       "for tests only: "
                       "fault_mode=eio|eintr|eagain|short|stall, fault_op=open|read, "
                       "fault_path=<substring>, fault_count=<n|-1>, fault_stall_ms=<ms>)",
                       item);
            return -EINVAL;
        }
        p = end ? end + 1 : p + len;
    }
    if (faulted && u->fault.mode == FAULT_OFF) {
        fr_set_err(err, err_len, "io_uring: fault_* items need fault_mode=eio|eintr|eagain|short|stall");
        return -EINVAL;
    }
    return 0;
}

static int uring_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    uring *u = calloc(1, sizeof(*u));
    if (!u)
        return -ENOMEM;
    u->cfg = *cfg;
    u->window = WINDOW;
    u->unsized_fds = fr_usable_cpus() < DIRECT_MIN_CPUS; /* engine_args may say otherwise */
    u->cfg.engine_args = NULL; /* borrowed: not kept */
    u->depth = cfg->queue_depth;
    fr_image_cache_init(&u->image);
    u->first_choice = COOP_DEFAULT;
    int rc = parse_args(u, cfg->engine_args, err, err_len);
    if (rc) {
        free(u);
        return rc;
    }
    /* threads: rings, each with its own thread (0: one per CPU, as psync). */
    unsigned n = cfg->threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
        if (n > 16)
            n = 16;
    }
    if (n > MAX_RINGS)
        n = MAX_RINGS;
    u->nrings = n;
    u->rings = calloc(n, sizeof(*u->rings));
    if (!u->rings) {
        free(u);
        return -ENOMEM;
    }
    /* queue_depth per ring, not shared out: cold files want many reads in
     * flight (2-core VM, 6,000 cold 92 KB files, 4 rings: 6.6k files/s with
     * 64 in flight in all, 8.9k with 256), and warm ones are bounded by the
     * batch anyway. */
    for (unsigned k = 0; k < n; k++)
        u->rings[k].depth = u->depth;
    /* Without SINGLE_ISSUER any thread may submit to a ring, so the caller
     * drives ring 0 itself: it starts at once instead of sleeping while
     * every ring thread wakes, twice per call without size hints (size,
     * then read). With SINGLE_ISSUER asked for, every ring has its own
     * thread, because the caller may be a different thread at each call. */
    u->caller_ring = setup_choices[u->first_choice] & IORING_SETUP_SINGLE_ISSUER ? 0 : 1;
    unsigned helpers = n - (unsigned)u->caller_ring;
    rc = fr_threadpool_start_ex(&u->pool, helpers, run_phase, u, "uring", err, err_len);
    if (rc) {
        free(u->rings);
        free(u);
        return rc;
    }
    fr_threadpool_set_spin(u->pool, (long)cfg->spin_us * 1000);
    /* Each thread sets up its own ring, so a SINGLE_ISSUER ring belongs to
     * the one thread that will ever submit to it. */
    if (u->caller_ring)
        ring_setup(u, &u->rings[0]);
    fr_threadpool_run_helpers(u->pool, PH_SETUP, 0);
    for (unsigned k = 0; k < n; k++) {
        if (u->rings[k].setup_rc) {
            rc = u->rings[k].setup_rc;
            fr_set_err(err, err_len, "io_uring: cannot set up ring %u of %u (%u entries): %s", k,
                       n, u->rings[k].depth * 4, strerror(-rc));
            uring_close(u);
            return rc;
        }
    }
    *state = u;
    return 0;
}

static int grow_scratch(uring *u, size_t n)
{
    if (n <= u->cap)
        return 0;
    size_t cap = u->cap ? u->cap : 64;
    while (cap < n)
        cap *= 2;
#define GROW(field)                                                         \
    do {                                                                    \
        void *p_ = realloc(u->field, cap * sizeof(*u->field));              \
        if (!p_)                                                            \
            return -ENOMEM;                                                 \
        u->field = p_;                                                      \
    } while (0)
    GROW(sizes);
    GROW(open_res);
    GROW(read_res);
    GROW(fds);
    GROW(live);
    GROW(live_slot);
    GROW(stuck);
    GROW(leftover);
    GROW(placed);
#undef GROW
    for (size_t i = u->cap; i < cap; i++)
        u->live[i] = NULL;
    u->cap = cap;
    return 0;
}

/* Runs one phase on every ring; 0 or the first batch-level -errno.
 *
 * A ring takes at most per_turn new files per submit. Taking as many as its
 * depth allows, the first ring thread to wake took the whole batch (64 files,
 * depth 64) before the others woke, and cached files, which complete inside
 * the submit, were read by one thread. Small turns keep every ring busy
 * until the list ends; 16 files per io_uring_enter keeps the syscall a small
 * share of the work, and cold rings still fill up to their depth over a few
 * turns (a turn returns at the first completion). */
static int run_rings(uring *u, enum phase phase, size_t count)
{
    size_t per_turn = count / (4 * (size_t)u->nrings);
    u->per_turn = per_turn < 1 ? 1 : per_turn > 16 ? 16 : per_turn;
    u->phase_count = count;
    atomic_store(&u->phase_err, 0);
    u->phase = phase;
    if (u->caller_ring)
        fr_threadpool_run_claimed(u->pool, (int)phase, count); /* ring 0 claims to the end */
    else
        fr_threadpool_run_helpers(u->pool, (int)phase, count);
    return atomic_load(&u->phase_err);
}

static int layout_window(uring *u, fr_batch *batch, size_t first, size_t count)
{
    if (u->order) {
        /* Files of a list (leftovers of pipelined windows): appended. */
        size_t off = fr_round_up(batch->arena.used, u->bump_align);
        for (size_t k = first; k < first + count; k++) {
            size_t i = u->order[k];
            if (u->sizes[i] < 0)
                continue; /* recorded by the final pass */
            batch->samples[i].offset = off;
            batch->samples[i].length = 0;
            off += slot_len(u, u->sizes[i]);
        }
        int rc = fr_arena_reserve(&batch->arena, off);
        if (rc == 0)
            batch->arena.used = off;
        return rc;
    }
    fr_sample *saved = batch->samples;
    batch->samples = saved + first;
    int rc = fr_layout(batch, u->sizes + first, count, u->cfg.o_direct, u->cfg.direct_alignment);
    batch->samples = saved;
    return rc;
}

static void close_window(uring *u, size_t first, size_t count)
{
    for (size_t k = first; k < first + count; k++) {
        size_t i = item(u, k);
        if (u->fds[i] >= 0) {
            close(u->fds[i]);
            u->fds[i] = -1;
        }
    }
}

/* Sizes, lays out and reads files 0..n-1 (u->order[0..n-1] if set) in
 * windows of u->window, two phases each: every open (sizing), then every
 * read. 0 or a batch-level -errno. */
static int read_sized_windows(uring *u, fr_batch *batch, size_t n)
{
    size_t count;
    unsigned fd_waits = 0;
    for (size_t first = 0; first < n; first += count) {
        count = n - first < u->window ? n - first : u->window;
        u->first = first;
        int rc = run_rings(u, PH_OPEN, count);
        size_t opened = 0, out_of_fds = 0;
        for (size_t k = first; rc == 0 && k < first + count; k++) {
            size_t i = item(u, k);
            if (u->stuck[i])
                u->sizes[i] = u->stuck[i]; /* its open was cancelled */
            opened += u->fds[i] >= 0;
            out_of_fds += u->sizes[i] == -EMFILE || u->sizes[i] == -ENFILE;
        }
        if (rc == 0 && out_of_fds && (count > 1 || fd_waits < FR_RETRY_LIMIT)) {
            /* Out of descriptors: close the window and size fewer files
             * at a time. At one file, other threads (a reader's other
             * workers) may hold them all for a moment: wait a little,
             * FR_RETRY_LIMIT times at most, before EMFILE is the error. */
            close_window(u, first, count);
            if (count == 1) {
                fd_waits++;
                fr_pause_1ms();
            }
            u->window = opened / 2 > 1 ? opened / 2 : 1;
            u->window_shrinks++;
            count = 0; /* the same files again */
            continue;
        }
        fd_waits = 0;
        if (rc == 0)
            rc = layout_window(u, batch, first, count);
        if (rc == 0)
            rc = run_rings(u, PH_READ, count);
        if (rc) {
            close_window(u, first, count);
            return rc;
        }
    }
    return 0;
}

/* The rings all have direct descriptors, or none has (same kernel, same
 * request): the first one says. */
static int all_fixed_files(const uring *u)
{
    for (unsigned k = 0; k < u->nrings; k++)
        if (!u->rings[k].fixed_files)
            return 0;
    return 1;
}

/* Unknown sizes, a batch that is not dense: windows of PH_PIPELINED (see
 * ring_pipelined). What a window leaves (files sized when the reserved
 * room was spent, files refused a descriptor) goes through the two-phase
 * path as a list before the next window starts, so descriptors stay bounded
 * by the window. 0 or a batch-level -errno. */
static int read_pipelined(uring *u, fr_batch *batch, size_t n)
{
    u->bump_align = u->cfg.o_direct ? u->cfg.direct_alignment : FR_SAMPLE_ALIGN;
    size_t start = fr_round_up(batch->arena.used, u->bump_align);
    /* Room for every file at the last call's mean slot, and an eighth more
     * (a batch of 256 ImageNet JPEGs, sizes varying by about 70%, varies by
     * about 5% in sum): refused (memory) it is simply less room, the
     * leftovers then reserve exactly what they need and fail the batch if
     * that is refused too. */
    size_t per_file = u->est_slot + u->est_slot / 8;
    if (per_file > 0 && n <= (SIZE_MAX - start) / per_file)
        (void)fr_arena_reserve(&batch->arena, start + n * per_file);
    int direct = all_fixed_files(u) && !u->unsized_fds;
    size_t count;
    for (size_t first = 0; first < n; first += count) {
        count = n - first < u->window ? n - first : u->window;
        u->order = NULL;
        u->first = first;
        atomic_store(&u->bump, fr_round_up(batch->arena.used, u->bump_align));
        u->bump_limit = batch->arena.capacity;
        memset(u->placed + first, 0, count);
        int rc = run_rings(u, direct ? PH_DIRECT : PH_PIPELINED, count);
        u->pipelined_windows++;
        u->direct_windows += direct;
        if (rc) {
            close_window(u, first, count);
            return rc;
        }
        size_t end = atomic_load(&u->bump);
        if (end > batch->arena.used)
            batch->arena.used = end;
        /* Leftovers: no room from the front of the list, no descriptor from
         * its back. */
        size_t *list = u->leftover;
        size_t roomless = 0, fdless = 0;
        for (size_t i = first; i < first + count; i++) {
            if (u->stuck[i])
                u->sizes[i] = u->stuck[i];
            if (u->sizes[i] >= 0 && !u->placed[i])
                list[first + roomless++] = i;
            else if (u->sizes[i] == -EMFILE || u->sizes[i] == -ENFILE)
                list[first + count - 1 - fdless++] = i;
        }
        if (roomless) {
            /* Sized, laid out at the arena's end, read: through their open
             * descriptors, or (PH_DIRECT, which closed them) opened again
             * into direct ones, their sizes now known. */
            u->deferred_files += (long)roomless;
            u->order = list + first;
            u->first = 0;
            rc = layout_window(u, batch, 0, roomless);
            if (rc == 0)
                rc = run_rings(u, direct ? PH_CHAINED : PH_READ, roomless);
            if (rc) {
                close_window(u, 0, roomless);
                u->order = NULL;
                return rc;
            }
        }
        if (fdless) {
            /* Opened again, the two-phase way, whose windows shrink until
             * descriptors suffice. */
            u->order = list + first + count - fdless;
            for (size_t k = 0; k < fdless; k++) {
                size_t i = u->order[k];
                u->open_res[i] = 0;
                u->sizes[i] = 0;
            }
            rc = read_sized_windows(u, batch, fdless);
            u->order = NULL;
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Forgets the call's paths (a later range phase has none) and every file
 * still marked in flight (a broken ring leaves some). Returns rc. */
static int end_call(uring *u, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        u->live[i] = NULL;
    u->paths = NULL;
    return rc;
}

static int uring_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                            size_t n, fr_batch *batch)
{
    uring *u = state;
    int rc = grow_scratch(u, n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        u->open_res[i] = 0;
        u->read_res[i] = -ECANCELED;
        u->fds[i] = -1;
        u->stuck[i] = 0;
    }
    u->paths = paths;
    u->batch = batch;
    u->first = 0;
    int known = size_hints != NULL && all_fixed_files(u);
    for (size_t i = 0; known && i < n; i++)
        known = size_hints[i] >= 0;

    if (known) {
        memcpy(u->sizes, size_hints, n * sizeof(*u->sizes));
        rc = fr_layout(batch, u->sizes, n, u->cfg.o_direct, u->cfg.direct_alignment);
        if (rc == 0)
            rc = run_rings(u, PH_CHAINED, n);
        if (rc)
            return end_call(u, n, rc);
    } else {
        u->bump_align = u->cfg.o_direct ? u->cfg.direct_alignment : FR_SAMPLE_ALIGN;
        size_t start = fr_round_up(batch->arena.used, u->bump_align);
        rc = batch->dense || u->unsized_windows || u->est_slot > PIPELINE_MAX_SLOT
                 ? read_sized_windows(u, batch, n)
                 : read_pipelined(u, batch, n);
        u->order = NULL;
        if (rc)
            return end_call(u, n, rc);
        size_t sized = 0;
        for (size_t i = 0; i < n; i++)
            sized += u->sizes[i] >= 0;
        if (sized && batch->arena.used > start)
            u->est_slot = (batch->arena.used - start) / sized;
    }

    for (size_t i = 0; i < n; i++) {
        fr_sample *s = &batch->samples[i];
        if (u->sizes[i] < 0) {
            /* Recorded by fr_layout; not by the pipelined path. */
            s->offset = 0;
            s->length = u->sizes[i];
            continue;
        }
        if (u->stuck[i]) {
            s->length = u->stuck[i]; /* no regular file any more: cancelled */
            continue;
        }
        int64_t size = u->sizes[i];
        int64_t open_res = u->open_res[i], read_res = u->read_res[i];
        size_t slot = fr_request_len((size_t)size, u->cfg.o_direct, u->cfg.direct_alignment);
        int direct_refused = u->cfg.o_direct && (open_res == -EINVAL || read_res == -EINVAL);
        if (open_res < 0 && !direct_refused && !retryable(open_res)) {
            s->length = open_res; /* e.g. the file vanished since it was sized */
        } else if (read_res == size) {
            s->length = size;
        } else if (read_res < 0 && !direct_refused && !retryable(read_res) &&
                   read_res != -ECANCELED) {
            s->length = read_res;
        } else {
            /* Short, changed size, cut at FR_MAX_REQUEST, O_DIRECT refused by
             * the file system, or a hinted file that moved: finish it the
             * slow, sure way. */
            if (direct_refused)
                u->direct_fallbacks++;
            fr_read_whole(batch, i, paths[i], slot);
        }
    }
    return end_call(u, n, 0);
}

static int grow_range_scratch(uring *u, size_t n)
{
    if (n <= u->rcap)
        return 0;
    size_t cap = u->rcap ? u->rcap : 64;
    while (cap < n)
        cap *= 2;
    int64_t *r = realloc(u->range_res, cap * sizeof(*r));
    if (!r)
        return -ENOMEM;
    u->range_res = r;
    u->rcap = cap;
    return 0;
}

static int uring_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                             fr_batch *batch)
{
    uring *u = state;
    int rc = grow_range_scratch(u, n);
    if (rc)
        return rc;
    int changed = fr_image_cache_get(&u->image, path, u->cfg.o_direct);
    if (changed < 0)
        return changed;
    if (changed)
        u->image_gen++; /* every ring re-points its fixed slot */
    int fd = u->image.fd >= 0 ? u->image.fd : u->image.err;
    int direct = fd >= 0 && u->image.direct;
    rc = fr_layout_ranges(batch, ranges, n, direct, u->cfg.direct_alignment);
    if (rc)
        return rc;
    if (fd < 0) { /* the image cannot be opened: every sample says why */
        for (size_t i = 0; i < n; i++)
            batch->samples[i].length = fd;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        u->range_res[i] = batch->samples[i].length; /* 0, or -EINVAL from the layout */
    u->batch = batch;
    u->ranges = ranges;
    u->range_direct = direct;
    rc = run_rings(u, PH_RANGES, n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        fr_sample *s = &batch->samples[i];
        int64_t res = u->range_res[i];
        if (s->length < 0)
            continue; /* a bad range */
        if (res == 0) {
            s->length = (int64_t)ranges[i].length;
        } else if (res == -EAGAIN || res == -EINTR || res == -ECANCELED ||
                   (res == -EINVAL && direct)) {
            if (res == -EINVAL)
                u->direct_fallbacks++;
            fr_read_range_plain(batch, i, path, &ranges[i]);
        } else {
            s->length = res;
        }
    }
    return 0;
}

static long uring_stat(const void *state, const char *key)
{
    const uring *u = state;
    const uring_ring *r0 = &u->rings[0];
    if (strcmp(key, "fixed_files") == 0)
        return all_fixed_files(u);
    if (strcmp(key, "fixed_buffers") == 0)
        return r0->fixed_buffers;
    if (strcmp(key, "queue_depth") == 0)
        return u->depth;
    if (strcmp(key, "threads") == 0 || strcmp(key, "rings") == 0)
        return u->nrings;
    if (strcmp(key, "setup_flags") == 0)
        return (long)r0->flags;
    if (strcmp(key, "o_direct") == 0)
        return u->cfg.o_direct;
    if (strcmp(key, "direct_fallbacks") == 0)
        return u->direct_fallbacks;
    if (strcmp(key, "image_fixed") == 0)
        return r0->fixed_files && r0->image_gen != 0 && r0->image_gen == u->image_gen;
    if (strcmp(key, "image_direct") == 0)
        return u->image.fd >= 0 ? u->image.direct : -1;
    if (strcmp(key, "window") == 0)
        return (long)u->window;
    if (strcmp(key, "window_shrinks") == 0)
        return u->window_shrinks;
    if (strcmp(key, "pipelined_windows") == 0)
        return u->pipelined_windows;
    if (strcmp(key, "direct_windows") == 0)
        return u->direct_windows;
    if (strcmp(key, "deferred_files") == 0)
        return u->deferred_files;
    if (strcmp(key, "est_slot") == 0)
        return (long)u->est_slot;
    if (strcmp(key, "faults_injected") == 0)
        return atomic_load(&u->fault.done);
    return fr_threadpool_stat(u->pool, key);
}

const fr_engine fr_engine_uring = {
    .name = "io_uring",
    .probe = uring_probe,
    .open = uring_open,
    .close = uring_close,
    .read_files = uring_read_files,
    .uses_size_hints = 1,
    .stat = uring_stat,
    .read_ranges = uring_read_ranges,
};
