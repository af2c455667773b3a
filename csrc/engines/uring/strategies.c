/*
 * io_uring engine: the ways one ring reads the files (or ranges) of a phase,
 * each with its completion handler, and the pool's entry point that runs a
 * phase's strategy on each ring (see uring_internal.h for when each is used).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engines/uring/uring_internal.h"

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
    int buf_index = fr_uring_buffer_index(r, &u->batch->arena);
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
        if (fr_uring_turn(u, r, &inflight, linked_cqe) == (size_t)-1)
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
    int buf_index = fr_uring_buffer_index(r, &u->batch->arena);
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
        if (fr_uring_turn(u, r, &inflight, staged_cqe) == (size_t)-1) {
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
        if (fr_uring_turn(u, r, &inflight, open_cqe) == (size_t)-1)
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
    int buf_index = fr_uring_buffer_index(r, &u->batch->arena);
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
        if (fr_uring_turn(u, r, &ops, read_cqe) == (size_t)-1)
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

/* Reads of at most this many bytes in one submit take the next files' opens
 * along (see opens_this_turn). */
#define LOOKAHEAD_BYTES ((size_t)256 << 10)

/* The slot of a file of `size` bytes: its request, rounded to bump_align
 * (what fr_layout gives it in a batch that is not dense). */
size_t fr_uring_slot_len(const uring *u, int64_t size)
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
        size_t off = size < 0 ? SIZE_MAX : take_slot(u, fr_uring_slot_len(u, size));
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
    int buf_index = fr_uring_buffer_index(r, &u->batch->arena);
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
        if (fr_uring_turn(u, r, &ops, pipelined_cqe) == (size_t)-1) {
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
    size_t off = size < 0 || cqe->res < 0 ? SIZE_MAX : take_slot(u, fr_uring_slot_len(u, size));
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
    int buf_index = fr_uring_buffer_index(r, &u->batch->arena);
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
        if (fr_uring_turn(u, r, &ops, direct_cqe) == (size_t)-1) {
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
    int buf_index = fr_uring_buffer_index(r, &u->batch->arena);
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
        if (fr_uring_turn(u, r, &inflight, range_cqe) == (size_t)-1)
            return;
    }
}

/* The pool's entry point. With caller_ring, worker w (0: the caller) works
 * on ring w; otherwise worker w (1..nrings) on ring w - 1 and the caller on
 * none. */
void fr_uring_run_phase(void *arg, int phase, unsigned worker)
{
    uring *u = arg;
    unsigned k = u->caller_ring ? worker : worker - 1;
    if ((!u->caller_ring && worker == 0) || k >= u->nrings)
        return;
    uring_ring *r = &u->rings[k];
    switch ((enum phase)phase) {
    case PH_SETUP:
        fr_uring_ring_setup(u, r);
        break;
    case PH_TEARDOWN:
        fr_uring_ring_files_free(r);
        fr_uring_ring_teardown(r);
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
    case PH_FILE_RANGES:
        fr_uring_ring_files(u, r);
        break;
    }
}
