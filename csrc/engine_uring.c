/*
 * io_uring: a batch with up to queue_depth files in flight.
 *
 * When every file's size is known (a reader remembers them from earlier
 * epochs), each file is one linked chain: openat into a direct descriptor ->
 * read (into a registered buffer when possible) -> close, hard-linked so a
 * failed read never leaks the descriptor slot. The arena is laid out before
 * anything is submitted.
 *
 * Otherwise files are sized first, in windows of WINDOW: openat (which the
 * kernel completes inline when the path is cached), fstat on the descriptor
 * (cheap: the inode is in memory once open), lay the window out, then
 * read -> close. statx is not used for sizing: io_uring always hands it to a
 * worker thread, which costs more than the read of a small file.
 *
 * Anything the fast path cannot finish (a short read, a file whose size
 * changed, a read cut at FR_MAX_REQUEST) is repaired synchronously afterwards.
 *
 * Registered buffers are cached per arena and identified by the arena's
 * address and generation, so the context must be closed before the arenas it
 * read into are freed (the reader and the Python layer guarantee this).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "io_common.h"
#include "range_io.h"

#define NBUF_SLOTS 16
#define MAX_FIXED_BUF ((size_t)1 << 30) /* the kernel's limit per buffer */

enum op { OP_OPEN = 1, OP_READ, OP_CLOSE, OP_CANCEL };

/* A wait for completions that lasts this long checks the paths still being
 * opened or read: one that is no regular file (a FIFO with no writer, which
 * io_uring's open or poll-armed read would wait on forever) is cancelled and
 * fails with EINVAL. Regular files are never cancelled, however slow. */
#define STUCK_CHECK_MS 1000

#define WINDOW 256

typedef struct buf_slot {
    const fr_arena *arena;
    uint64_t generation;
    uint64_t last_used;
} buf_slot;

typedef struct uring {
    fr_config cfg;
    struct io_uring ring;
    unsigned depth;
    int fixed_files;
    int fixed_buffers;
    buf_slot bufs[NBUF_SLOTS];
    uint64_t tick;
    unsigned *free_slots;
    unsigned nfree;
    long direct_fallbacks;
    /* Files sized at once: WINDOW, less once the process ran out of
     * descriptors (RLIMIT_NOFILE; see engine_psync.c). */
    size_t window;
    long window_shrinks;

    /* Range reads: the cached image, registered at fixed slot `depth` when
     * direct descriptors are on. */
    fr_image_cache image;
    int image_fixed; /* the image sits in the fixed table */
    size_t rcap;
    uint32_t *chunks_left; /* per range: chunks still in flight */
    int64_t *range_res;    /* per range: 0, or the first failed chunk's result */

    /* Per-call scratch, grown as needed. */
    size_t cap;
    int64_t *sizes;
    int64_t *open_res;
    int64_t *read_res;
    int64_t *stuck; /* per file: 0, or the error of a cancelled open/read */
    int *fds;
} uring;

static inline uint64_t pack(size_t i, unsigned slot, enum op op)
{
    return ((uint64_t)i << 24) | ((uint64_t)slot << 4) | (uint64_t)op;
}
static inline size_t ud_index(uint64_t ud) { return (size_t)(ud >> 24); }
static inline unsigned ud_slot(uint64_t ud) { return (unsigned)((ud >> 4) & 0xFFFFF); }
static inline enum op ud_op(uint64_t ud) { return (enum op)(ud & 0xF); }

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

static void uring_close(void *state)
{
    uring *u = state;
    if (!u)
        return;
    io_uring_queue_exit(&u->ring);
    fr_image_cache_close(&u->image);
    free(u->chunks_left);
    free(u->range_res);
    free(u->free_slots);
    free(u->sizes);
    free(u->open_res);
    free(u->read_res);
    free(u->stuck);
    free(u->fds);
    free(u);
}

static int uring_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    uring *u = calloc(1, sizeof(*u));
    if (!u)
        return -ENOMEM;
    u->cfg = *cfg;
    u->depth = cfg->queue_depth;
    u->window = WINDOW;
    fr_image_cache_init(&u->image);
    /* Three SQEs per file in flight, rounded up by the kernel to a power of 2. */
    unsigned entries = u->depth * 4;
    struct io_uring_params params;
    memset(&params, 0, sizeof(params));
    params.flags = IORING_SETUP_COOP_TASKRUN;
    int rc = io_uring_queue_init_params(entries, &u->ring, &params);
    if (rc == -EINVAL) { /* kernels before 5.19 */
        memset(&params, 0, sizeof(params));
        rc = io_uring_queue_init_params(entries, &u->ring, &params);
    }
    if (rc < 0) {
        fr_set_err(err, err_len, "io_uring: cannot set up a ring of %u entries: %s", entries,
                   strerror(-rc));
        free(u);
        return rc;
    }
    u->free_slots = malloc(u->depth * sizeof(unsigned));
    if (!u->free_slots) {
        uring_close(u);
        return -ENOMEM;
    }
    /* One slot per file in flight, and one more for a range reader's image. */
    if (cfg->register_files && io_uring_register_files_sparse(&u->ring, u->depth + 1) == 0) {
        u->fixed_files = 1;
        for (unsigned i = 0; i < u->depth; i++)
            u->free_slots[i] = u->depth - 1 - i;
        u->nfree = u->depth;
    }
    if (cfg->register_buffers && io_uring_register_buffers_sparse(&u->ring, NBUF_SLOTS) == 0)
        u->fixed_buffers = 1;
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
    GROW(stuck);
    GROW(fds);
#undef GROW
    u->cap = cap;
    return 0;
}

/* Returns the registered-buffer index for the arena, or -1 to read unregistered. */
static int buffer_index(uring *u, const fr_arena *arena)
{
    if (!u->fixed_buffers || arena->capacity > MAX_FIXED_BUF)
        return -1;
    u->tick++;
    int lru = 0;
    for (int i = 0; i < NBUF_SLOTS; i++) {
        buf_slot *b = &u->bufs[i];
        if (b->arena == arena && b->generation == arena->generation) {
            b->last_used = u->tick;
            return i;
        }
        if (b->last_used < u->bufs[lru].last_used)
            lru = i;
    }
    struct iovec iov = {.iov_base = arena->base, .iov_len = arena->capacity};
    int rc = io_uring_register_buffers_update_tag(&u->ring, (unsigned)lru, &iov, NULL, 1);
    if (rc < 0) {
        /* Usually RLIMIT_MEMLOCK: carry on with plain reads. */
        u->fixed_buffers = 0;
        return -1;
    }
    u->bufs[lru] = (buf_slot){.arena = arena, .generation = arena->generation, .last_used = u->tick};
    return lru;
}

static struct io_uring_sqe *get_sqe(uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    return sqe;
}

/* Submits what is queued and waits for at least one completion. Returns 0 or
 * a -errno the ring cannot recover from. */
static int submit_wait(uring *u)
{
    for (;;) {
        int rc = io_uring_submit_and_wait(&u->ring, 1);
        if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY)
            return 0; /* EAGAIN/EBUSY: completions must be reaped first */
        if (rc != -EINTR)
            return rc;
    }
}

/* submit_wait, but returns -ETIME after STUCK_CHECK_MS without a completion
 * (where the kernel can time a wait: IORING_FEAT_EXT_ARG, Linux 5.11). */
static int submit_wait_timed(uring *u)
{
    if (!(u->ring.features & IORING_FEAT_EXT_ARG))
        return submit_wait(u);
    struct __kernel_timespec ts = {.tv_sec = STUCK_CHECK_MS / 1000,
                                   .tv_nsec = (STUCK_CHECK_MS % 1000) * 1000000L};
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, &ts, NULL);
        if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY)
            return 0;
        if (rc == -ETIME)
            return rc;
        if (rc != -EINTR)
            return rc;
    }
}

/* The error for a path that must not be opened or read through io_uring
 * (it may never complete), or 0 for a regular file or block device (or one
 * that cannot be looked at now: its own request will say why). */
static int64_t not_a_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))
        return 0;
    return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
}

/* Asks the kernel to cancel the request with user data `ud`; its cancel's
 * own completion is one more in flight. */
static void cancel(uring *u, uint64_t ud, size_t *inflight)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (!sqe)
        return;
    io_uring_prep_cancel64(sqe, ud, 0);
    io_uring_sqe_set_data64(sqe, pack(0, 0, OP_CANCEL));
    (*inflight)++;
}

/* After a broken ring, waits for everything in flight so no completion can
 * land in memory the caller is about to reuse. */
static void drain(uring *u, size_t inflight_ops)
{
    while (inflight_ops > 0) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&u->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            return;
        io_uring_cqe_seen(&u->ring, cqe);
        inflight_ops--;
    }
}

static void prep_read(uring *u, struct io_uring_sqe *sqe, int fd, fr_batch *batch, size_t i,
                      int buf_index)
{
    size_t len = fr_request_len((size_t)u->sizes[i], u->cfg.o_direct, u->cfg.direct_alignment);
    void *dst = batch->arena.base + batch->samples[i].offset;
    if (buf_index >= 0)
        io_uring_prep_read_fixed(sqe, fd, dst, (unsigned)len, 0, buf_index);
    else
        io_uring_prep_read(sqe, fd, dst, (unsigned)len, 0);
}

static int open_flags(const uring *u)
{
    return O_RDONLY | (u->cfg.o_direct ? O_DIRECT : 0);
}

/* Every size known: one linked chain per file. */
static int read_chained(uring *u, const char *const *paths, size_t n, fr_batch *batch,
                        int buf_index)
{
    size_t next = 0, inflight = 0;
    for (size_t i = 0; i < n; i++)
        u->fds[i] = -1;
    while (next < n || inflight > 0) {
        while (next < n && u->nfree > 0 && io_uring_sq_space_left(&u->ring) >= 3) {
            size_t i = next++;
            if (u->sizes[i] < 0)
                continue;
            unsigned slot = u->free_slots[--u->nfree];
            u->fds[i] = (int)slot; /* the chain is live until its close completes */
            struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
            io_uring_prep_openat_direct(sqe, AT_FDCWD, paths[i], open_flags(u), 0, slot);
            io_uring_sqe_set_data64(sqe, pack(i, slot, OP_OPEN));
            sqe->flags |= IOSQE_IO_LINK;

            sqe = io_uring_get_sqe(&u->ring);
            prep_read(u, sqe, (int)slot, batch, i, buf_index);
            io_uring_sqe_set_data64(sqe, pack(i, slot, OP_READ));
            sqe->flags |= IOSQE_FIXED_FILE | IOSQE_IO_HARDLINK;

            sqe = io_uring_get_sqe(&u->ring);
            io_uring_prep_close_direct(sqe, slot);
            io_uring_sqe_set_data64(sqe, pack(i, slot, OP_CLOSE));
            inflight += 3;
        }
        if (inflight == 0)
            continue; /* every remaining sample failed at statx */
        int rc = submit_wait_timed(u);
        if (rc == -ETIME) {
            /* Something waits: cancel the chains of paths that are no longer
             * regular files (a FIFO put in a file's place since its size was
             * recorded). */
            for (size_t i = 0; i < next; i++) {
                if (u->fds[i] < 0 || u->stuck[i] || !(u->stuck[i] = not_a_file(paths[i])))
                    continue;
                cancel(u, pack(i, (unsigned)u->fds[i], OP_OPEN), &inflight);
                cancel(u, pack(i, (unsigned)u->fds[i], OP_READ), &inflight);
            }
            continue;
        }
        if (rc < 0) {
            drain(u, inflight);
            return rc;
        }
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&u->ring, head, cqe)
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
                /* The chain is over whatever happened: the slot is free again. */
                u->free_slots[u->nfree++] = ud_slot(cqe->user_data);
                u->fds[i] = -1;
                break;
            default:
                break;
            }
            inflight--;
            seen++;
        }
        io_uring_cq_advance(&u->ring, seen);
    }
    return 0;
}

/* Opens files [first, first+count) with regular descriptors, many in flight,
 * and sizes each with fstat. Failures land in sizes[] as -errno. */
static int open_window(uring *u, const char *const *paths, size_t first, size_t count)
{
    size_t next = first, end = first + count, inflight = 0;
    while (next < end || inflight > 0) {
        while (next < end && inflight < u->depth) {
            struct io_uring_sqe *sqe = get_sqe(u);
            if (!sqe)
                break;
            io_uring_prep_openat(sqe, AT_FDCWD, paths[next], open_flags(u) | O_CLOEXEC, 0);
            io_uring_sqe_set_data64(sqe, pack(next, 0, OP_OPEN));
            u->fds[next] = -1;
            u->open_res[next] = 1; /* in flight */
            next++;
            inflight++;
        }
        int rc = submit_wait_timed(u);
        if (rc == -ETIME) {
            /* A FIFO opened from a path the kernel had to look up waits for
             * a writer in an io-wq worker: cancel opens of such paths. */
            for (size_t i = first; i < next; i++) {
                if (u->open_res[i] != 1 || u->stuck[i] || !(u->stuck[i] = not_a_file(paths[i])))
                    continue;
                cancel(u, pack(i, 0, OP_OPEN), &inflight);
            }
            continue;
        }
        if (rc < 0) {
            drain(u, inflight);
            for (size_t i = first; i < next; i++)
                if (u->fds[i] >= 0)
                    close(u->fds[i]);
            return rc;
        }
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&u->ring, head, cqe)
        {
            size_t i = ud_index(cqe->user_data);
            if (ud_op(cqe->user_data) == OP_OPEN) {
                u->open_res[i] = cqe->res < 0 ? cqe->res : 0;
                if (cqe->res >= 0)
                    u->fds[i] = cqe->res;
            }
            inflight--;
            seen++;
        }
        io_uring_cq_advance(&u->ring, seen);
    }
    for (size_t i = first; i < end; i++) {
        int fd = u->fds[i];
        if (fd < 0 && u->stuck[i]) {
            u->sizes[i] = u->stuck[i]; /* its open was cancelled */
            continue;
        }
        if (fd < 0) {
            /* O_DIRECT refused by this file system: the repair step reads it. */
            u->sizes[i] = (u->open_res[i] == -EINVAL && u->cfg.o_direct) ? 0 : u->open_res[i];
            continue;
        }
        struct stat st;
        int64_t size;
        if (fstat(fd, &st) != 0)
            size = -errno;
        else if (!S_ISREG(st.st_mode))
            size = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        else
            size = st.st_size;
        u->sizes[i] = size;
        if (size < 0) {
            close(fd);
            u->fds[i] = -1;
        }
    }
    return 0;
}

/* Reads and closes files [first, first+count) opened by open_window. */
static int read_opened(uring *u, size_t first, size_t count, fr_batch *batch, int buf_index)
{
    size_t next = first, end = first + count, ops = 0;
    while (next < end || ops > 0) {
        while (next < end && ops + 2 <= 2 * (size_t)u->depth &&
               io_uring_sq_space_left(&u->ring) >= 2) {
            size_t i = next++;
            int fd = u->fds[i];
            if (fd < 0)
                continue;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
            prep_read(u, sqe, fd, batch, i, buf_index);
            io_uring_sqe_set_data64(sqe, pack(i, 0, OP_READ));
            sqe->flags |= IOSQE_IO_HARDLINK;
            sqe = io_uring_get_sqe(&u->ring);
            io_uring_prep_close(sqe, fd);
            io_uring_sqe_set_data64(sqe, pack(i, 0, OP_CLOSE));
            ops += 2;
        }
        if (ops == 0)
            continue;
        int rc = submit_wait(u);
        if (rc < 0) {
            drain(u, ops);
            return rc;
        }
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&u->ring, head, cqe)
        {
            size_t i = ud_index(cqe->user_data);
            if (ud_op(cqe->user_data) == OP_READ)
                u->read_res[i] = cqe->res;
            else
                u->fds[i] = -1;
            ops--;
            seen++;
        }
        io_uring_cq_advance(&u->ring, seen);
    }
    return 0;
}

static int layout_window(uring *u, fr_batch *batch, size_t first, size_t count)
{
    fr_sample *saved = batch->samples;
    batch->samples = saved + first;
    int rc = fr_layout(batch, u->sizes + first, count, u->cfg.o_direct, u->cfg.direct_alignment);
    batch->samples = saved;
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
        u->stuck[i] = 0;
    }
    int known = u->fixed_files && size_hints != NULL;
    for (size_t i = 0; known && i < n; i++)
        known = size_hints[i] >= 0;

    if (known) {
        memcpy(u->sizes, size_hints, n * sizeof(*u->sizes));
        rc = fr_layout(batch, u->sizes, n, u->cfg.o_direct, u->cfg.direct_alignment);
        if (rc)
            return rc;
        rc = read_chained(u, paths, n, batch, buffer_index(u, &batch->arena));
        if (rc)
            return rc;
    } else {
        size_t count;
        for (size_t first = 0; first < n; first += count) {
            count = n - first < u->window ? n - first : u->window;
            rc = open_window(u, paths, first, count);
            if (rc == 0 && count > 1) {
                size_t opened = 0, out_of_fds = 0;
                for (size_t i = first; i < first + count; i++) {
                    opened += u->fds[i] >= 0;
                    out_of_fds += u->sizes[i] == -EMFILE || u->sizes[i] == -ENFILE;
                }
                if (out_of_fds) {
                    /* Out of descriptors: close the window and size fewer
                     * files at a time (one at worst, where EMFILE stays). */
                    for (size_t i = first; i < first + count; i++)
                        if (u->fds[i] >= 0) {
                            close(u->fds[i]);
                            u->fds[i] = -1;
                        }
                    u->window = opened / 2 > 1 ? opened / 2 : 1;
                    u->window_shrinks++;
                    count = 0; /* the same files again */
                    continue;
                }
            }
            if (rc == 0)
                rc = layout_window(u, batch, first, count);
            if (rc == 0)
                rc = read_opened(u, first, count, batch, buffer_index(u, &batch->arena));
            if (rc) {
                for (size_t i = first; i < first + count; i++)
                    if (u->fds[i] >= 0)
                        close(u->fds[i]);
                return rc;
            }
        }
    }

    for (size_t i = 0; i < n; i++) {
        if (u->sizes[i] < 0)
            continue; /* fr_layout already recorded the error */
        fr_sample *s = &batch->samples[i];
        if (u->stuck[i]) {
            s->length = u->stuck[i]; /* no regular file any more: cancelled */
            continue;
        }
        int64_t size = u->sizes[i];
        int64_t open_res = u->open_res[i], read_res = u->read_res[i];
        size_t slot = fr_request_len((size_t)size, u->cfg.o_direct, u->cfg.direct_alignment);
        int direct_refused = u->cfg.o_direct && (open_res == -EINVAL || read_res == -EINVAL);
        if (open_res < 0 && !direct_refused) {
            s->length = open_res; /* e.g. the file vanished since it was sized */
        } else if (read_res == size) {
            s->length = size;
        } else if (read_res < 0 && !direct_refused && read_res != -EAGAIN &&
                   read_res != -EINTR && read_res != -ECANCELED) {
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
    return 0;
}


/* ---- range reads ---- */

/* Range index in the high bits, chunk number in the low 24 (16 TiB ranges). */
static inline uint64_t range_ud(size_t i, size_t chunk) { return ((uint64_t)i << 24) | chunk; }

static int grow_range_scratch(uring *u, size_t n)
{
    if (n <= u->rcap)
        return 0;
    size_t cap = u->rcap ? u->rcap : 64;
    while (cap < n)
        cap *= 2;
    uint32_t *c = realloc(u->chunks_left, cap * sizeof(*c));
    if (!c)
        return -ENOMEM;
    u->chunks_left = c;
    int64_t *r = realloc(u->range_res, cap * sizeof(*r));
    if (!r)
        return -ENOMEM;
    u->range_res = r;
    u->rcap = cap;
    return 0;
}

/* Opens (or reuses) the image and keeps fixed slot `depth` pointing at it.
 * Returns the descriptor to use (a fixed index when *fixed), or -errno. */
static int image_fd(uring *u, const char *path, int *fixed)
{
    int changed = fr_image_cache_get(&u->image, path, u->cfg.o_direct);
    if (changed < 0)
        return changed;
    if (u->image.fd < 0)
        return u->image.err;
    if (changed || !u->image_fixed) {
        u->image_fixed = 0;
        if (u->fixed_files) {
            int fd = u->image.fd;
            if (io_uring_register_files_update(&u->ring, u->depth, &fd, 1) == 1)
                u->image_fixed = 1;
        }
    }
    *fixed = u->image_fixed;
    return u->image_fixed ? (int)u->depth : u->image.fd;
}

static int uring_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                             fr_batch *batch)
{
    uring *u = state;
    int rc = grow_range_scratch(u, n);
    if (rc)
        return rc;
    int fixed = 0;
    int fd = image_fd(u, path, &fixed);
    if (fd == -ENOMEM)
        return fd;
    int direct = fd >= 0 && u->image.direct;
    size_t align = u->cfg.direct_alignment;
    rc = fr_layout_ranges(batch, ranges, n, direct, align);
    if (rc)
        return rc;
    if (fd < 0) { /* the image cannot be opened: every sample says why */
        for (size_t i = 0; i < n; i++)
            batch->samples[i].length = fd;
        return 0;
    }
    int buf_index = buffer_index(u, &batch->arena);

    size_t next = 0, next_chunk = 0, inflight = 0;
    for (size_t i = 0; i < n; i++) {
        u->range_res[i] = batch->samples[i].length; /* 0, or -EINVAL from the layout */
        u->chunks_left[i] = 0;
    }
    while (next < n || inflight > 0) {
        while (next < n && inflight < u->depth) {
            if (u->range_res[next] < 0 || ranges[next].length == 0) {
                next++;
                next_chunk = 0;
                continue;
            }
            struct io_uring_sqe *sqe = get_sqe(u);
            if (!sqe)
                break;
            size_t i = next;
            size_t req = fr_range_request_len(ranges[i].length, direct, align);
            size_t off = next_chunk * FR_RANGE_CHUNK;
            size_t len = req - off < FR_RANGE_CHUNK ? req - off : FR_RANGE_CHUNK;
            uint8_t *dst = batch->arena.base + batch->samples[i].offset + off;
            uint64_t at = ranges[i].offset + off;
            if (buf_index >= 0)
                io_uring_prep_read_fixed(sqe, fd, dst, (unsigned)len, at, buf_index);
            else
                io_uring_prep_read(sqe, fd, dst, (unsigned)len, at);
            if (fixed)
                sqe->flags |= IOSQE_FIXED_FILE;
            io_uring_sqe_set_data64(sqe, range_ud(i, next_chunk));
            u->chunks_left[i]++;
            inflight++;
            if (off + len >= req) {
                next++;
                next_chunk = 0;
            } else {
                next_chunk++;
            }
        }
        if (inflight == 0)
            continue;
        rc = submit_wait(u);
        if (rc < 0) {
            drain(u, inflight);
            return rc;
        }
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&u->ring, head, cqe)
        {
            size_t i = (size_t)(cqe->user_data >> 24);
            size_t chunk = (size_t)(cqe->user_data & 0xFFFFFF);
            /* Every completion is checked: a chunk must deliver each byte of
             * the range it covers (the O_DIRECT tail past the range's end may
             * be missing at the end of the image). */
            uint64_t start = (uint64_t)chunk * FR_RANGE_CHUNK;
            uint64_t want = ranges[i].length - start;
            if (want > FR_RANGE_CHUNK)
                want = FR_RANGE_CHUNK;
            if (cqe->res < 0) {
                if (u->range_res[i] == 0)
                    u->range_res[i] = cqe->res;
            } else if ((uint64_t)cqe->res < want && u->range_res[i] == 0) {
                u->range_res[i] = -EAGAIN; /* short: finished on the slow path */
            }
            u->chunks_left[i]--;
            inflight--;
            seen++;
        }
        io_uring_cq_advance(&u->ring, seen);
    }
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
    if (strcmp(key, "fixed_files") == 0)
        return u->fixed_files;
    if (strcmp(key, "fixed_buffers") == 0)
        return u->fixed_buffers;
    if (strcmp(key, "queue_depth") == 0)
        return u->depth;
    if (strcmp(key, "o_direct") == 0)
        return u->cfg.o_direct;
    if (strcmp(key, "direct_fallbacks") == 0)
        return u->direct_fallbacks;
    if (strcmp(key, "image_fixed") == 0)
        return u->image_fixed;
    if (strcmp(key, "image_direct") == 0)
        return u->image.fd >= 0 ? u->image.direct : -1;
    if (strcmp(key, "window") == 0)
        return (long)u->window;
    if (strcmp(key, "window_shrinks") == 0)
        return u->window_shrinks;
    return -1;
}

const fr_engine fr_engine_uring = {
    .name = "io_uring",
    .probe = uring_probe,
    .open = uring_open,
    .close = uring_close,
    .read_files = uring_read_files,
    .stat = uring_stat,
    .read_ranges = uring_read_ranges,
};
