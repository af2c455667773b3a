/*
 * io_uring engine: one ring, driven by one thread (see uring_internal.h):
 * setup and teardown, registered buffers, and the submit/wait/reap turn
 * every read strategy runs, with its check for requests that can never
 * complete.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engines/uring/uring_internal.h"

#define MAX_FIXED_BUF ((size_t)1 << 30) /* the kernel's limit per buffer */

/* A ring that waits this long for a completion checks the paths it is still
 * opening or reading: one that is no regular file or block device (a FIFO
 * put in a file's place since its size hint, whose poll-armed read never
 * completes; a FIFO whose open went to an io-wq worker and waits for a
 * writer) has its requests cancelled and fails with EINVAL (EISDIR for a
 * directory). Regular files are never cancelled, however slow; the fast path
 * pays nothing. */
#define STUCK_CHECK_MS 1000

/* Tried in this order from u->first_choice (see uring_internal.h). */
const unsigned fr_uring_setup_choices[NCHOICES] = {
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN,
    IORING_SETUP_COOP_TASKRUN,
    0,
};

void fr_uring_ring_setup(uring *u, uring_ring *r)
{
    /* Up to three SQEs per file in flight, rounded up by the kernel to a
     * power of 2. */
    unsigned entries = r->depth * 4;
    int rc = -EINVAL;
    for (unsigned c = u->first_choice; c < NCHOICES; c++) {
        for (int extra = u->extra_flags ? 1 : 0; extra >= 0; extra--) {
            struct io_uring_params params;
            memset(&params, 0, sizeof(params));
            params.flags = fr_uring_setup_choices[c] | (extra ? u->extra_flags : 0);
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
    /* One slot per file in flight, one more for a range reader's image, and
     * files_cap for the LRU of fr_read_file_ranges (file_ranges.c). */
    if (u->cfg.register_files &&
        io_uring_register_files_sparse(&r->ring, r->depth + 1 + u->files_cap) == 0) {
        r->fixed_files = 1;
        for (unsigned i = 0; i < r->depth; i++)
            r->free_slots[i] = r->depth - 1 - i;
        r->nfree = r->depth;
    }
    if (u->cfg.register_buffers && io_uring_register_buffers_sparse(&r->ring, NBUF_SLOTS) == 0)
        r->fixed_buffers = 1;
}

void fr_uring_ring_teardown(uring_ring *r)
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
int fr_uring_buffer_index(uring_ring *r, const fr_arena *arena)
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

/* The -errno a test's fault plan makes this submit fail with instead of
 * being made (fault_op=submit), or 0. */
static inline int submit_fault(uring *u)
{
    return u->fault.mode == FAULT_OFF ? 0 : fr_uring_fault_submit(u);
}

/* Submits what is queued and waits for at least one completion. Returns 0 or
 * a -errno the ring cannot recover from. */
static int submit_wait(uring *u, uring_ring *r)
{
    for (;;) {
        int rc = submit_fault(u);
        if (rc == 0)
            rc = io_uring_submit_and_wait(&r->ring, 1);
        if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY)
            return 0; /* EAGAIN/EBUSY: completions must be reaped first */
        if (rc != -EINTR)
            return rc;
    }
}

/* submit_wait, but -ETIME after STUCK_CHECK_MS without a completion where
 * the kernel can time a wait (IORING_FEAT_EXT_ARG, Linux 5.11). */
static int submit_wait_timed(uring *u, uring_ring *r)
{
    if (!(r->ring.features & IORING_FEAT_EXT_ARG))
        return submit_wait(u, r);
    struct __kernel_timespec ts = {.tv_sec = STUCK_CHECK_MS / 1000,
                                   .tv_nsec = (STUCK_CHECK_MS % 1000) * 1000000L};
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = submit_fault(u);
        if (rc == 0)
            rc = io_uring_submit_and_wait_timeout(&r->ring, &cqe, 1, &ts, NULL);
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

/* Cancels the requests of every file in flight on ring r that is no longer a
 * file (see STUCK_CHECK_MS). Returns the cancel requests submitted: each
 * completes too. */
static size_t cancel_stuck(uring *u, uring_ring *r)
{
    size_t issued = 0, n = u->cap;
    if (u->phase == PH_FILE_RANGES)
        return u->files_stuck(u, r);
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
            fr_uring_fault_inject(u, &faulted);
            fn(u, r, &faulted);
        } else {
            fn(u, r, cqe);
        }
        seen++;
    }
    io_uring_cq_advance(&r->ring, seen);
    return seen;
}

/* After a broken submit: the requests the kernel did not take (a failed
 * io_uring_enter leaves them in the submission queue) are taken back, so the
 * next call's first submit does not send them with this call's user data
 * and buffers, and no drain waits for their completions. The ring is used
 * by its own thread only, without SQPOLL: the kernel reads the queue only
 * inside io_uring_enter, so moving its tail back is safe. Returns how many. */
static size_t discard_unsubmitted(uring_ring *r)
{
    struct io_uring_sq *sq = &r->ring.sq;
    unsigned head = io_uring_smp_load_acquire(sq->khead);
    size_t pending = (size_t)(sq->sqe_tail - head);
    sq->sqe_head = sq->sqe_tail = head;
    io_uring_smp_store_release(sq->ktail, head);
    return pending;
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
size_t fr_uring_turn(uring *u, uring_ring *r, size_t *inflight, cqe_fn fn)
{
    int rc = submit_wait_timed(u, r);
    if (rc == -ETIME) {
        *inflight += cancel_stuck(u, r);
        return 0;
    }
    if (rc < 0) {
        drain(u, r, *inflight - discard_unsubmitted(r), fn);
        fail_phase(u, rc);
        return (size_t)-1;
    }
    *inflight -= reap(u, r, fn);
    return 0;
}
