/*
 * xnvme-file: whole files through xNVMe's file API (xnvme_file_open, the file
 * read command, xnvme_file_close), a batch per native call.
 *
 * Like psync, a batch runs in windows of WINDOW files, each in two phases on
 * a pool of native threads (the calling thread among them): every file is
 * sized with stat() (only regular files are read: xNVMe opens without
 * O_NONBLOCK, so a FIFO would block its open), the arena is laid out once,
 * then every file is opened read-only with xnvme_file_open, read and closed.
 * When every file of the window comes with a size hint (the Reader's sizes
 * from earlier epochs), the layout uses the hints and the stat moves into the
 * read phase, just before the open: one pass over the pool per window, not
 * two; a file that no longer fits its slot goes to fr_read_whole. Reads ask
 * for one byte more than the size (fr_request_len), so a file that changed
 * size since its stat is noticed and read again by fr_read_whole.
 *
 * Per file that is 5 syscalls: stat, open + fstat (inside xnvme_file_open),
 * the read(s) and close, and one struct xnvme_dev (~17 KiB) live per file in
 * flight, not per file of the window: with a window's worth held open across
 * the layout, malloc trimmed and re-faulted that memory every batch (about
 * 2.6 page faults per file, measured). Nothing
 * here calls an xnvme_dev_get_* accessor that identifies the device (geo,
 * nsid, ns, ident...): for a file the first such call runs xNVMe's identify
 * emulation, two more fstat()s and two cleared 4 KiB buffers, only to report
 * what is known already: the size (our stat's st_size, which is geo.tbytes),
 * a fixed 1 MiB mdts (FILE_MDTS) and nsid 1 (FILE_NSID). So reads are the
 * command xnvme_file_pread() builds, passed with xnvme_cmd_pass() (read_cmd).
 *
 * Reads go through xNVMe queues. xNVMe binds a queue to the device it was
 * created on (io_uring/libaio/posix take the descriptor from the queue's
 * device), so one queue serves one file: each thread keeps up to `inflight`
 * files open with a queue each, submits every chunk of them (at most
 * FILE_MDTS each) and pokes its queues until they are done.
 * Queues are created, used and torn down by one thread only (xNVMe's queue
 * calls are not thread-safe). The async engine is engine_args' async=
 * (io_uring, libaio, thrpool, posix, emu); queue=0 reads synchronously instead
 * (the command on a queue-less context).
 *
 * Every completion's status is checked. A failed open or command, an
 * O_DIRECT read the file system refused, or a short read from a stale errno
 * (xNVMe's psync path calls a short read an error when errno happens to be
 * set) is settled by fr_read_whole after the phase, which retries what may
 * be retried and reports the file's real errno. Out of descriptors (EMFILE
 * on an open or a queue), a thread keeps fewer files in flight.
 *
 * The stack: regular files are read with sync=psync whatever async is
 * chosen (fr_xnvme_apply_opts); stacks for devices (sync=nvme or block,
 * io_uring_cmd), nil, an async interface the library was built without, or
 * one it has no file stack for (posix on xNVMe main) are refused at open,
 * by name (fr_xnvme_check_stack, fr_xnvme_try_file).
 * Reads land straight in the arena: the linux backend's memory is plain host
 * memory, so xnvme_buf_alloc is not needed for it (mem= other than posix is
 * refused).
 *
 * read_ranges (a packed image) is the xnvme engine's, with the same options.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <libxnvme.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engines/engine.h"
#include "engines/io_common.h"
#include "core/threadpool.h"
#include "engines/xnvme/xnvme_path.h"

/* Shared with engine_xnvme.c (see there). */
typedef struct fr_xnvme_args {
    char be[24], async[24], sync[24], admin[24], mem[24];
    int direct;
    unsigned qdepth;
    int bounce;
    int queue;
    unsigned inflight;
    unsigned nsid;
} fr_xnvme_args;
int fr_xnvme_parse_args(const char *engine, const char *s, int ranges, fr_xnvme_args *a,
                        char *err, size_t err_len);
int fr_xnvme_check_stack(const char *engine, const fr_xnvme_args *a, int files_only, char *err,
                         size_t err_len);
int fr_xnvme_try_file(const char *engine, const fr_xnvme_args *a, char *err, size_t err_len);
void fr_xnvme_apply_opts(const fr_xnvme_args *a, int direct, const char *path, mode_t type,
                         struct xnvme_opts *o);
int fr_xnvme_probe(const char *engine, char *why, size_t why_len);
void fr_xnvme_idle_pause(unsigned *passes);

#define WINDOW 256
#define MAX_THREADS 16
#define DEFAULT_QDEPTH 16
/* Largest read of one command: what xNVMe's geometry of a regular file says
 * (mdts_nbytes, 1 MiB), without deriving it (see the top). */
#define FILE_MDTS ((size_t)1 << 20)
/* The namespace id of a regular file opened by xNVMe's linux backend. */
#define FILE_NSID 1

enum phase { PHASE_SIZE, PHASE_READ };

struct xfile;

/* One file being read by one thread. */
typedef struct slot {
    struct xfile *x;
    size_t k;                 /* index in the window */
    struct xnvme_dev *dev;
    struct xnvme_queue *q;
    size_t want, next_off;    /* bytes to ask for; next chunk to submit */
    unsigned outstanding;
    unsigned *thread_cmds;    /* the reading thread's commands in flight */
    uint64_t got;
    int failed;
} slot;

typedef struct xfile {
    fr_config cfg;
    fr_xnvme_args a;
    struct xnvme_opts opts;
    int direct;
    unsigned qcap, inflight;
    fr_threadpool *pool;

    const char *const *paths;
    fr_batch *batch;
    size_t first, count;
    int64_t sizes[WINDOW];    /* stat()'s size, or -errno */
    size_t slot_len[WINDOW];  /* bytes laid out for the file (fr_request_len) */
    int hinted;               /* laid out from size hints: stat as part of the read */
    unsigned char repair[WINDOW];
    atomic_long direct_fallbacks, repairs;
    atomic_long path_fallbacks; /* files read with pread: xNVMe cannot take their path */
    atomic_long fd_shrinks;     /* out of descriptors: a thread kept fewer files in flight */
    /* The most commands, and files, one thread had in flight at once: the
     * queue depth the stack actually saw (a file of up to 1 MiB is one
     * command, so its own queue never holds more than one). */
    atomic_long peak_cmds, peak_files;
    void *ranges; /* the xnvme engine's state, for read_ranges (opened on first use) */
} xfile;

static int xf_probe(char *why, size_t why_len) { return fr_xnvme_probe("xnvme-file", why, why_len); }

static size_t want_of(const xfile *x, size_t k)
{
    return fr_request_len((size_t)x->sizes[k], x->direct, x->cfg.direct_alignment);
}

/* PHASE_SIZE: only regular files are read (xNVMe opens without O_NONBLOCK,
 * so a FIFO would block its open), sized by this stat(). */
static void size_one(xfile *x, size_t k)
{
    struct stat st;
    if (stat(x->paths[x->first + k], &st) != 0)
        x->sizes[k] = -errno;
    else if (!S_ISREG(st.st_mode))
        x->sizes[k] = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    else
        x->sizes[k] = (int64_t)st.st_size;
}

/* PHASE_READ: opens a sized file. On failure *err is xNVMe's errno (EMFILE
 * and ENFILE matter: the caller opens fewer files at a time) and the file is
 * left to fr_read_whole, which reads it or reports its real errno: xNVMe's
 * is unreliable (later backends overwrite it, a bad option leaves it
 * negative) and it retries nothing, EINTR included. */
static struct xnvme_dev *open_one(xfile *x, size_t k, int *err)
{
    const char *path = x->paths[x->first + k];
    struct xnvme_opts o = x->opts; /* xNVMe may write to it */
    errno = 0;
    struct xnvme_dev *dev = xnvme_file_open(path, &o);
    if (!dev) {
        *err = errno < 0 ? -errno : errno;
        return NULL;
    }
    *err = 0;
    if (x->direct && !xnvme_dev_get_opts(dev)->direct)
        atomic_fetch_add(&x->direct_fallbacks, 1); /* xNVMe retried without O_DIRECT */
    return dev;
}

static int out_of_fds(int err) { return err == EMFILE || err == ENFILE; }

/* PHASE_READ: whether to open and read file k. A window laid out from size
 * hints stats each file here, just before its open, and leaves one that no
 * longer fits its slot to fr_read_whole. */
static int to_read(xfile *x, size_t k)
{
    fr_sample *s = &x->batch->samples[x->first + k];
    if (x->hinted) {
        size_one(x, k);
        if (x->sizes[k] < 0) {
            s->offset = 0;
            s->length = x->sizes[k];
            return 0;
        }
        if (want_of(x, k) > x->slot_len[k]) {
            x->repair[k] = 1;
            return 0;
        }
    }
    if (x->sizes[k] < 0)
        return 0;
    if (!fr_xnvme_path_ok(x->paths[x->first + k], FR_XNVME_PATH_MAX)) {
        /* xnvme_file_open would refuse it with a bare EINVAL (a path of 384+
         * bytes, or one with '?'): read it with pread (fr_read_whole). */
        atomic_fetch_add(&x->path_fallbacks, 1);
        x->repair[k] = 1;
        return 0;
    }
    return 1;
}

/* The read xnvme_file_pread() passes (opcode, nsid, byte offset as slba),
 * minus its xnvme_dev_get_nsid(): on a device's first command that runs the
 * identify emulation (see the top) just to return nsid 1, the namespace the
 * linux backend gives every regular file at open. Sync and async alike. */
static int read_cmd(struct xnvme_cmd_ctx *ctx, void *buf, size_t len, size_t off)
{
    ctx->cmd.common.opcode = XNVME_SPEC_FS_OPC_READ;
    ctx->cmd.common.nsid = FILE_NSID;
    ctx->cmd.nvm.slba = off;
    return xnvme_cmd_pass(ctx, buf, len, NULL, 0);
}

/* Settles a file's sample (or marks it for fr_read_whole) and closes it. */
static void finish(xfile *x, size_t k, struct xnvme_dev *dev, uint64_t got, int failed)
{
    fr_sample *s = &x->batch->samples[x->first + k];
    if (!failed && got == (uint64_t)x->sizes[k])
        s->length = (int64_t)got;
    else
        x->repair[k] = 1;
    xnvme_file_close(dev);
}

static void on_chunk(struct xnvme_cmd_ctx *ctx, void *arg)
{
    slot *sl = arg;
    if (xnvme_cmd_ctx_cpl_status(ctx))
        sl->failed = 1;
    else
        sl->got += ctx->cpl.result;
    sl->outstanding--;
    (*sl->thread_cmds)--;
    int rc = xnvme_queue_put_cmd_ctx(ctx->async.queue, ctx);
    if (rc)
        sl->failed = 1;
}

/* Submits chunks of the slot's file until its queue is full. 0 or -errno. */
static int submit_chunks(slot *sl, size_t chunk)
{
    xfile *x = sl->x;
    uint8_t *base = x->batch->arena.base + x->batch->samples[x->first + sl->k].offset;
    while (sl->next_off < sl->want && sl->outstanding < x->qcap) {
        size_t len = sl->want - sl->next_off < chunk ? sl->want - sl->next_off : chunk;
        struct xnvme_cmd_ctx *ctx = xnvme_queue_get_cmd_ctx(sl->q);
        if (!ctx)
            return -ENOMEM;
        memset(&ctx->cpl, 0, sizeof(ctx->cpl)); /* pooled ctxs keep the last status */
        xnvme_cmd_ctx_set_cb(ctx, on_chunk, sl);
        int rc = read_cmd(ctx, base + sl->next_off, len, sl->next_off);
        if (rc) {
            int prc = xnvme_queue_put_cmd_ctx(sl->q, ctx);
            (void)prc;
            return rc == -EBUSY || rc == -EAGAIN ? 0 : rc; /* full: poke, then more */
        }
        sl->outstanding++;
        (*sl->thread_cmds)++;
        sl->next_off += len;
    }
    return 0;
}

static size_t chunk_of(const xfile *x)
{
    size_t chunk = FILE_MDTS - FILE_MDTS % x->cfg.direct_alignment;
    return chunk ? chunk : x->cfg.direct_alignment;
}

/* queue=0: synchronous reads, chunk by chunk. */
static void read_sync(xfile *x, size_t k)
{
    int err;
    struct xnvme_dev *dev = open_one(x, k, &err);
    if (!dev) {
        x->repair[k] = 1; /* one descriptor at a time: nothing to shrink */
        return;
    }
    size_t want = want_of(x, k), chunk = chunk_of(x);
    uint8_t *base = x->batch->arena.base + x->batch->samples[x->first + k].offset;
    uint64_t got = 0;
    int failed = 0;
    for (size_t off = 0; off < want; off += chunk) {
        size_t len = want - off < chunk ? want - off : chunk;
        struct xnvme_cmd_ctx ctx = xnvme_file_get_cmd_ctx(dev);
        errno = 0; /* a short read is an error to psync iff errno is set */
        int rc = read_cmd(&ctx, base + off, len, off);
        if (rc || xnvme_cmd_ctx_cpl_status(&ctx)) {
            failed = 1;
            break;
        }
        got += ctx.cpl.result;
        if (ctx.cpl.result < len)
            break; /* end of file */
    }
    finish(x, k, dev, got, failed);
}

static int start_slot(slot *sl, size_t k, struct xnvme_dev *dev)
{
    xfile *x = sl->x;
    *sl = (slot){.x = x, .k = k, .dev = dev, .want = want_of(x, k)};
    size_t chunks = (sl->want + chunk_of(x) - 1) / chunk_of(x);
    unsigned cap = 2;
    while (cap < chunks && cap < x->qcap)
        cap *= 2;
    int rc = xnvme_queue_init(sl->dev, (uint16_t)cap, 0, &sl->q);
    if (rc) {
        sl->q = NULL;
        return rc;
    }
    return 0;
}

static void end_slot(slot *sl)
{
    xfile *x = sl->x;
    /* Whatever failed, nothing may still be in flight into the arena. */
    if (sl->outstanding) {
        errno = 0;
        if (xnvme_queue_drain(sl->q) < 0 || sl->outstanding)
            sl->failed = 1;
    }
    if (xnvme_queue_term(sl->q) != 0)
        sl->failed = 1;
    sl->q = NULL;
    finish(x, sl->k, sl->dev, sl->got, sl->failed);
}

static void raise_peak(atomic_long *peak, long v)
{
    long cur = atomic_load(peak);
    while (v > cur && !atomic_compare_exchange_weak(peak, &cur, v))
        ;
}

/* This thread's share of the read phase: up to `inflight` files at once. */
static void read_phase(xfile *x)
{
    if (!x->a.queue) {
        size_t k;
        while (fr_threadpool_claim(x->pool, &k))
            if (to_read(x, k))
                read_sync(x, k);
        return;
    }
    /* Slots stay put while commands point at them; act[] lists the busy ones. */
    slot slots[64], *act[64], *idle[64];
    unsigned cap = x->inflight < 64 ? x->inflight : 64, active = 0, nidle = cap;
    for (unsigned i = 0; i < cap; i++)
        idle[i] = &slots[i];
    int exhausted = 0;
    /* Out of descriptors (RLIMIT_NOFILE: each file in flight holds its own
     * descriptor, and io_uring a ring's), the file waits in `pending` while
     * this thread keeps fewer files in flight; with none in flight it waits a
     * little, FR_RETRY_LIMIT times at most, before fr_read_whole has it. */
    size_t pending = SIZE_MAX;
    unsigned fd_waits = 0, idle_passes = 0, cmds = 0, peak_cmds = 0, peak_files = 0;
    for (;;) {
        unsigned started = active;
        while (active < cap && (pending != SIZE_MAX || !exhausted)) {
            size_t k = pending;
            pending = SIZE_MAX;
            if (k == SIZE_MAX) {
                if (!fr_threadpool_claim(x->pool, &k)) {
                    exhausted = 1;
                    break;
                }
                if (!to_read(x, k))
                    continue;
            }
            int err;
            struct xnvme_dev *dev = open_one(x, k, &err);
            slot *sl = idle[nidle - 1];
            sl->x = x;
            if (dev && (err = start_slot(sl, k, dev)) != 0) {
                xnvme_file_close(dev);
                dev = NULL;
                err = err < 0 ? -err : err;
            }
            if (!dev) {
                if (out_of_fds(err) && (active > 0 || fd_waits < FR_RETRY_LIMIT)) {
                    pending = k;
                    atomic_fetch_add(&x->fd_shrinks, 1);
                    if (active > 0) {
                        cap = active; /* fewer files at a time from now on */
                        break;
                    }
                    fd_waits++;
                    fr_pause_1ms(); /* others (a reader's workers) hold them all */
                    continue;
                }
                x->repair[k] = 1; /* fr_read_whole reads it or names the errno */
                continue;
            }
            fd_waits = 0;
            nidle--;
            sl->thread_cmds = &cmds;
            if (submit_chunks(sl, chunk_of(x)) != 0)
                sl->failed = 1;
            act[active++] = sl;
        }
        peak_cmds = cmds > peak_cmds ? cmds : peak_cmds;
        peak_files = active > peak_files ? active : peak_files;
        if (active == 0 && pending == SIZE_MAX) {
            raise_peak(&x->peak_cmds, peak_cmds);
            raise_peak(&x->peak_files, peak_files);
            return;
        }
        int moved = active != started;
        for (unsigned i = 0; i < active;) {
            slot *sl = act[i];
            errno = 0; /* emu reads inside poke: see the stale-errno note */
            int rc = xnvme_queue_poke(sl->q, 0);
            if (rc > 0)
                moved = 1;
            else if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
                sl->failed = 1;
            if (!sl->failed && sl->next_off < sl->want &&
                submit_chunks(sl, chunk_of(x)) != 0)
                sl->failed = 1;
            peak_cmds = cmds > peak_cmds ? cmds : peak_cmds;
            if (sl->failed || (sl->outstanding == 0 && sl->next_off >= sl->want)) {
                end_slot(sl);
                idle[nidle++] = sl;
                act[i] = act[--active];
                moved = 1;
                continue;
            }
            i++;
        }
        if (moved)
            idle_passes = 0;
        else
            fr_xnvme_idle_pause(&idle_passes);
    }
}

static void run_phase(void *arg, int ph)
{
    xfile *x = arg;
    if (ph == PHASE_READ) {
        read_phase(x);
        return;
    }
    size_t k;
    while (fr_threadpool_claim(x->pool, &k))
        size_one(x, k);
}

static void xf_close(void *state)
{
    xfile *x = state;
    if (!x)
        return;
    fr_threadpool_stop(x->pool);
    if (x->ranges)
        fr_engine_xnvme.close(x->ranges);
    free(x);
}

static int xf_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    xfile *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    x->cfg = *cfg;
    int rc = fr_xnvme_parse_args("xnvme-file", cfg->engine_args, 0, &x->a, err, err_len);
    if (rc == 0 && x->a.mem[0] && strcmp(x->a.mem, "posix") != 0) {
        fr_set_err(err, err_len, "xnvme-file: mem=%s is not supported (files are read with the "
                   "linux backend into host memory: mem=posix)", x->a.mem);
        rc = -EINVAL;
    }
    if (rc) {
        free(x);
        return rc;
    }
    if (!x->a.be[0])
        strcpy(x->a.be, "linux"); /* regular files; also keeps open()'s errno */
    if (!x->a.async[0])
        strcpy(x->a.async, "emu");
    rc = fr_xnvme_check_stack("xnvme-file", &x->a, 1, err, err_len);
    if (rc == 0)
        rc = fr_xnvme_try_file("xnvme-file", &x->a, err, err_len);
    if (rc) {
        free(x);
        return rc;
    }
    x->direct = x->a.direct >= 0 ? x->a.direct : cfg->o_direct;
    /* Every file read is a regular one (size_one): sync=psync, admin=file_as_ns. */
    fr_xnvme_apply_opts(&x->a, x->direct, NULL, S_IFREG, &x->opts);
    x->qcap = x->a.qdepth ? x->a.qdepth : DEFAULT_QDEPTH;
    if (x->qcap < 2)
        x->qcap = 2;

    unsigned n = cfg->threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
        if (n > MAX_THREADS)
            n = MAX_THREADS;
    }
    /* emu runs each read inside poke, on this thread: more files in flight
     * would only add bookkeeping. Real async engines share queue_depth. */
    if (x->a.inflight)
        x->inflight = x->a.inflight;
    else if (strcmp(x->a.async, "emu") == 0)
        x->inflight = 1;
    else
        x->inflight = (cfg->queue_depth + n - 1) / n;
    if (x->inflight < 1)
        x->inflight = 1;
    rc = fr_threadpool_start(&x->pool, n - 1, run_phase, x, "xnvme-file", err, err_len);
    if (rc) {
        free(x);
        return rc;
    }
    *state = x;
    return 0;
}

static int xf_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                         size_t n, fr_batch *batch)
{
    xfile *x = state;
    x->paths = paths;
    x->batch = batch;
    for (size_t first = 0; first < n; first += WINDOW) {
        x->first = first;
        x->count = n - first < WINDOW ? n - first : WINDOW;
        memset(x->repair, 0, sizeof(x->repair));
        /* With a hint for every file the layout needs no PHASE_SIZE: one
         * pass over the pool instead of two, each file stat()ed by to_read. */
        x->hinted = size_hints != NULL;
        for (size_t k = 0; x->hinted && k < x->count; k++)
            x->hinted = size_hints[first + k] >= 0;
        if (x->hinted)
            memcpy(x->sizes, size_hints + first, x->count * sizeof(*x->sizes));
        else
            fr_threadpool_run(x->pool, PHASE_SIZE, x->count);
        for (size_t k = 0; k < x->count; k++)
            x->slot_len[k] = x->sizes[k] < 0 ? 0 : want_of(x, k);
        fr_sample *saved = batch->samples;
        batch->samples = saved + first;
        int rc = fr_layout(batch, x->sizes, x->count, x->direct, x->cfg.direct_alignment);
        batch->samples = saved;
        if (rc != 0)
            return rc;
        fr_threadpool_run(x->pool, PHASE_READ, x->count);
        for (size_t k = 0; k < x->count; k++) {
            if (!x->repair[k])
                continue;
            atomic_fetch_add(&x->repairs, 1);
            fr_read_whole(batch, first + k, paths[first + k], x->slot_len[k]);
        }
    }
    return 0;
}

/* Ranges of one file or device: the xnvme engine's queue-based reader, with
 * this context's be/async/sync/admin/mem/direct/qdepth. */
static int xf_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                          fr_batch *batch)
{
    xfile *x = state;
    if (!x->ranges) {
        char args[256];
        int len = snprintf(args, sizeof(args), "be=%s,async=%s,direct=%d%s%s%s%s%s%s", x->a.be,
                           x->a.async, x->direct, x->a.sync[0] ? ",sync=" : "", x->a.sync,
                           x->a.admin[0] ? ",admin=" : "", x->a.admin,
                           x->a.mem[0] ? ",mem=" : "", x->a.mem);
        if (len < 0 || (size_t)len >= sizeof(args))
            return -EINVAL;
        if (x->a.qdepth)
            snprintf(args + len, sizeof(args) - (size_t)len, ",qdepth=%u", x->a.qdepth);
        fr_config cfg = x->cfg;
        cfg.engine_args = args;
        char err[FR_ERRLEN];
        int rc = fr_engine_xnvme.open(&cfg, &x->ranges, err, sizeof(err));
        if (rc) {
            x->ranges = NULL;
            return rc;
        }
    }
    return fr_engine_xnvme.read_ranges(x->ranges, path, ranges, n, batch);
}

static long xf_stat(const void *state, const char *key)
{
    const xfile *x = state;
    if (strcmp(key, "threads") == 0)
        return (long)fr_threadpool_size(x->pool);
    if (strcmp(key, "o_direct") == 0)
        return x->direct;
    if (strcmp(key, "queue_depth") == 0)
        return x->qcap;
    if (strcmp(key, "inflight") == 0)
        return x->a.queue ? x->inflight : 1;
    if (strcmp(key, "direct_fallbacks") == 0)
        return atomic_load(&((xfile *)state)->direct_fallbacks);
    if (strcmp(key, "repairs") == 0)
        return atomic_load(&((xfile *)state)->repairs);
    if (strcmp(key, "fd_shrinks") == 0)
        return atomic_load(&((xfile *)state)->fd_shrinks);
    if (strcmp(key, "peak_commands") == 0)
        return atomic_load(&((xfile *)state)->peak_cmds);
    if (strcmp(key, "peak_files") == 0)
        return atomic_load(&((xfile *)state)->peak_files);
    if (strcmp(key, "path_fallbacks") == 0)
        return atomic_load(&((xfile *)state)->path_fallbacks);
    if (strcmp(key, "xnvme_version") == 0)
        return xnvme_ver_major() * 10000L + xnvme_ver_minor() * 100L + xnvme_ver_patch();
    return -1;
}

const fr_engine fr_engine_xnvme_file = {
    .name = "xnvme-file",
    .probe = xf_probe,
    .open = xf_open,
    .close = xf_close,
    .read_files = xf_read_files,
    .uses_size_hints = 1,
    .stat = xf_stat,
    .read_ranges = xf_read_ranges,
};
