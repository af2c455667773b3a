/*
 * psync: a pool of native threads doing open / fstat / pread / close.
 *
 * The portable engine. A batch runs in windows of at most WINDOW files (so
 * open descriptors stay bounded) and each window in two phases: every file is
 * opened and sized, the arena is laid out once, then every file is read and
 * closed. The calling thread works alongside the pool.
 *
 * Ranges of many files (fr_read_file_ranges) go through a descriptor LRU
 * (fd_cache.h) in windows of at most its cap files: the window's misses are
 * opened by the pool (each closing first the descriptor evicted for it),
 * then each run of nearby ranges of one file is one preadv.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/engine_args.h"
#include "engines/engine.h"
#include "engines/io_common.h"
#include "core/threadpool.h"
#include "engines/fd_cache.h"
#include "engines/range_io.h"

#define WINDOW 256
#define MAX_THREADS 16
/* Runs of nearby ranges (FR_COALESCE_GAP, FR_COALESCE_IOV: range_io.h)
 * are one preadv, gaps into a discard buffer on the worker's stack. */
/* Misses in a window worth opening their directory for (see dir):
 * measured on the 2-core VM (6.18), open(2) of a path 7 components deep
 * took 2.2 us, openat(2) of its last component 1.8 us. */
#define DIR_MIN_MISSES 8

enum phase { PHASE_OPEN, PHASE_READ, PHASE_RANGES, PHASE_FILE_OPEN, PHASE_FILE_RANGES };

typedef struct psync {
    fr_config cfg;
    fr_threadpool *pool;
    /* Files opened at once: WINDOW, less once the process ran out of
     * descriptors (RLIMIT_NOFILE): a window that hits EMFILE is closed and
     * opened again at half the files it got. */
    size_t window;
    long window_shrinks;

    /* The phase being run. */
    const char *const *paths;
    fr_batch *batch;
    size_t first, count;
    int fds[WINDOW];
    int64_t sizes[WINDOW];
    unsigned char needs_repair[WINDOW];

    /* Range reads: the cached image and the batch's ranges. */
    fr_image_cache image;
    const char *image_path;
    const fr_range *ranges;

    /* Ranges of many files (fr_read_file_ranges): the descriptor LRU (made
     * on first use), the call's jobs sorted by (file, offset) and, for the
     * window of files in progress, each file's descriptor (or -errno). */
    fr_fd_cache fdc;
    int fdc_made;
    const char *const *fpaths;
    const fr_file_range *jobs;
    fr_range *job_ranges;     /* the jobs as fr_range, for the layout */
    uint32_t *sorted;         /* job numbers by (file, offset) */
    uint32_t *job_slot;       /* sorted position -> window slot */
    uint32_t *runs;           /* window's runs: sorted position of each one's first job */
    size_t nruns;
    size_t jobs_cap;
    uint32_t *win_files;      /* window slot -> file index */
    int *win_fds;             /* window slot -> descriptor or -errno */
    uint32_t *misses;         /* window slots to open */
    int *victims;             /* descriptors the LRU evicted for them: miss k closes victims[k] */
    uint32_t nvictims;
    /* The directory of the call's first shard, open (O_PATH) for the call
     * once a window has DIR_MIN_MISSES files to open: shards there are
     * opened relative to it (openat of the last component: no walk of the
     * whole path each; fr_shard_dir). Opened afresh each call, so a directory
     * replaced between batches is seen by the next one. */
    fr_shard_dir dir;
    int dir_tried;
    size_t win_cap;
    size_t nmisses;
    long file_range_windows;
    long file_range_reads;    /* preadv calls (a run each, plus retries) */
} psync;

static int psync_probe(char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    return 0;
}

static void open_one(psync *p, size_t k)
{
    const char *path = p->paths[p->first + k];
    /* O_NONBLOCK does nothing to regular-file reads, but lets a FIFO open at
     * once so fstat can refuse it instead of blocking for a writer. */
    int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (p->cfg.o_direct ? O_DIRECT : 0);
    int fd;
    fd = fr_open_retry(path, flags);
    if (fd < 0 && errno == EINVAL && p->cfg.o_direct) {
        /* This file system refuses O_DIRECT: read the file through the cache. */
        fd = fr_open_retry(path, flags & ~O_DIRECT);
    }
    p->fds[k] = -1;
    if (fd < 0) {
        p->sizes[k] = -errno;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        p->sizes[k] = -errno;
        close(fd);
        return;
    }
    if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
        /* Only regular files have a size to trust; a FIFO could block forever. */
        p->sizes[k] = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        close(fd);
        return;
    }
    p->fds[k] = fd;
    p->sizes[k] = st.st_size;
}

static void read_one(psync *p, size_t k)
{
    int fd = p->fds[k];
    if (fd < 0)
        return;
    if (p->sizes[k] < 0) { /* opened, then refused by the layout (fr_layout: -EFBIG) */
        close(fd);
        p->fds[k] = -1;
        return;
    }
    fr_sample *s = &p->batch->samples[p->first + k];
    size_t size = (size_t)p->sizes[k];
    size_t want = fr_request_len(size, p->cfg.o_direct, p->cfg.direct_alignment);
    ssize_t got = fr_pread_full(fd, p->batch->arena.base + s->offset, want, 0);
    close(fd);
    p->fds[k] = -1;
    if (got < 0 && got != -EINVAL) {
        s->length = got;
    } else if (got < 0 || (size_t)got != size) {
        /* Changed size, or O_DIRECT refused this tail: reread it plainly. */
        p->needs_repair[k] = 1;
    } else {
        s->length = got;
    }
}

/* One range of the image, on any thread: pread into its slot (whole aligned
 * blocks with O_DIRECT), falling back to the plain path when O_DIRECT is
 * refused or the read comes back short. */
static void range_one(psync *p, size_t k)
{
    fr_sample *s = &p->batch->samples[k];
    if (s->length < 0)
        return; /* a bad range */
    const fr_range *r = &p->ranges[k];
    if (r->length == 0)
        return;
    int direct = p->image.direct;
    size_t want = fr_range_request_len(r->length, direct, p->cfg.direct_alignment);
    ssize_t got = fr_pread_full(p->image.fd, p->batch->arena.base + s->offset, want,
                                (off_t)r->offset);
    if (got >= 0 && (uint64_t)got >= r->length)
        s->length = (int64_t)r->length;
    else if (got >= 0 || (got == -EINVAL && direct))
        fr_read_range_plain(p->batch, k, p->image_path, r);
    else
        s->length = got;
}

/* Miss k of the window: open its file with a range read's checks (a
 * regular file or block device, never a FIFO's wait: O_NONBLOCK). Unlike
 * fr_open_data, O_NONBLOCK is left on: it does nothing to reads of regular
 * files and block devices (open(2)), and clearing it cost two fcntl calls
 * a file, 2 of 5 system calls of a shuffled epoch's per-sample open. */
static void file_open_one(psync *p, size_t k)
{
    /* First the descriptor this open's room was taken from (so open ones
     * never pass the cap): closed here, in parallel, not one by one by the
     * calling thread while the pool waits. */
    if (k < p->nvictims)
        close(p->victims[k]);
    uint32_t slot = p->misses[k];
    const char *path = p->fpaths[p->win_files[slot]];
    int dir;
    const char *name = fr_shard_dir_name(&p->dir, path, &dir);
    int fd;
    do {
        fd = openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        p->win_fds[slot] = -errno;
        return;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = -errno;
    else if (S_ISDIR(st.st_mode))
        rc = -EISDIR;
    else if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
        rc = -EINVAL;
    if (rc) {
        close(fd);
        p->win_fds[slot] = rc;
        return;
    }
    p->win_fds[slot] = fd;
}

/* Sets the length of job j after its run's read delivered the run's bytes
 * up to file offset `upto`, then stopped at the file's end (got 0) or
 * failed (got -errno). */
static void settle_job(psync *p, uint32_t j, ssize_t got, uint64_t upto)
{
    fr_sample *s = &p->batch->samples[j];
    const fr_file_range *r = &p->jobs[j];
    if (r->length == 0)
        return;
    if (upto >= r->offset + r->length)
        s->length = (int64_t)r->length; /* in, whatever came after it */
    else if (got < 0)
        s->length = got;
    else
        s->length = -ENODATA; /* the file ends inside the range: a truncated shard */
}

/* Run k of the window: its jobs (sorted positions runs[k] .. runs[k+1]-1,
 * one file, increasing offsets, none overlapping the one before) read by
 * one preadv, short reads resumed, gaps into a stack buffer. */
static void file_range_one(psync *p, size_t k)
{
    size_t a = p->runs[k], b = p->runs[k + 1];
    int fd = p->win_fds[p->job_slot[a]];
    if (fd < 0) {
        for (size_t pos = a; pos < b; pos++)
            p->batch->samples[p->sorted[pos]].length = fd;
        return;
    }
    unsigned char gap[FR_COALESCE_GAP];
    struct iovec iov[FR_COALESCE_IOV];
    int niov = 0;
    uint64_t start = p->jobs[p->sorted[a]].offset, at = start;
    for (size_t pos = a; pos < b; pos++) {
        uint32_t j = p->sorted[pos];
        const fr_file_range *r = &p->jobs[j];
        if (r->offset > at)
            iov[niov++] = (struct iovec){gap, (size_t)(r->offset - at)};
        if (r->length)
            iov[niov++] = (struct iovec){p->batch->arena.base + p->batch->samples[j].offset,
                                         (size_t)r->length};
        at = r->offset + r->length;
    }
    /* Until the run is in or the file ends (0) or fails: a short read
     * resumes where it stopped, the vectors advanced past what came. */
    uint64_t done = start;
    ssize_t got = 0;
    struct iovec *v = iov;
    while (niov > 0) {
        do {
            got = preadv(fd, v, niov, (off_t)done);
        } while (got < 0 && errno == EINTR);
        __atomic_fetch_add(&p->file_range_reads, 1, __ATOMIC_RELAXED);
        if (got <= 0)
            break;
        done += (uint64_t)got;
        while (niov > 0 && (size_t)got >= v->iov_len) {
            got -= (ssize_t)v->iov_len;
            v++;
            niov--;
        }
        if (niov > 0) {
            v->iov_base = (char *)v->iov_base + got;
            v->iov_len -= (size_t)got;
        }
        got = 0;
    }
    ssize_t err = got < 0 ? -errno : 0;
    for (size_t pos = a; pos < b; pos++)
        settle_job(p, p->sorted[pos], err, done);
}

/* The window's runs (fr_file_runs): sorted positions [first, end). */
static void make_runs(psync *p, size_t first, size_t end)
{
    p->nruns = fr_file_runs(p->jobs, p->sorted, first, end, p->runs);
}

static void run_phase(void *arg, int ph)
{
    psync *p = arg;
    size_t k;
    while (fr_threadpool_claim(p->pool, &k)) {
        if (ph == PHASE_OPEN)
            open_one(p, k);
        else if (ph == PHASE_READ)
            read_one(p, k);
        else if (ph == PHASE_RANGES)
            range_one(p, k);
        else if (ph == PHASE_FILE_OPEN)
            file_open_one(p, k);
        else
            file_range_one(p, k);
    }
}

static void psync_close(void *state)
{
    psync *p = state;
    if (!p)
        return;
    fr_threadpool_stop(p->pool);
    fr_image_cache_close(&p->image);
    if (p->fdc_made)
        fr_fd_cache_free(&p->fdc);
    free(p->job_ranges);
    free(p->sorted);
    free(p->job_slot);
    free(p->runs);
    free(p->win_files);
    free(p->win_fds);
    free(p->misses);
    free(p->victims);
    free(p);
}

static int psync_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    /* psync takes no engine_args: a key meant for another engine (io_uring's
     * taskrun=, say) is refused by name, not silently ignored. */
    int rc = fr_args_parse("psync", cfg->engine_args, NULL, 0, err, err_len);
    if (rc)
        return rc;
    psync *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->cfg = *cfg;
    p->window = WINDOW;
    fr_shard_dir_init(&p->dir);
    fr_image_cache_init(&p->image);
    unsigned n = cfg->threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
        if (n > MAX_THREADS)
            n = MAX_THREADS;
    }
    /* The calling thread is one of the workers. */
    rc = fr_threadpool_start(&p->pool, n - 1, run_phase, p, "psync", err, err_len);
    if (rc) {
        free(p);
        return rc;
    }
    fr_threadpool_set_spin(p->pool, (long)cfg->spin_us * 1000);
    *state = p;
    return 0;
}

static int psync_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                            size_t n, fr_batch *batch)
{
    (void)size_hints; /* fstat on an open descriptor is as cheap as a hint */
    psync *p = state;
    p->paths = paths;
    p->batch = batch;
    unsigned fd_waits = 0;
    for (size_t first = 0; first < n; first += p->count) {
        p->first = first;
        p->count = n - first < p->window ? n - first : p->window;
        memset(p->needs_repair, 0, sizeof(p->needs_repair));
        fr_threadpool_run_claimed(p->pool, PHASE_OPEN, p->count);
        size_t opened = 0, out_of_fds = 0;
        for (size_t k = 0; k < p->count; k++) {
            opened += p->fds[k] >= 0;
            out_of_fds += p->sizes[k] == -EMFILE || p->sizes[k] == -ENFILE;
        }
        if (out_of_fds && (p->count > 1 || fd_waits < FR_RETRY_LIMIT)) {
            /* Out of descriptors: close the window, open fewer files at a
             * time. At one file, other threads (a reader's other workers)
             * may hold them all for a moment: wait a little, FR_RETRY_LIMIT
             * times at most, before EMFILE is the answer. */
            for (size_t k = 0; k < p->count; k++)
                if (p->fds[k] >= 0)
                    close(p->fds[k]);
            if (p->count == 1) {
                fd_waits++;
                fr_pause_1ms();
            }
            p->window = opened / 2 > 1 ? opened / 2 : 1;
            p->window_shrinks++;
            p->count = 0; /* the same files again */
            continue;
        }
        fd_waits = 0;
        /* fr_layout indexes samples from 0: shift the window's view. */
        fr_sample *saved = batch->samples;
        batch->samples = saved + first;
        int rc = fr_layout(batch, p->sizes, p->count, p->cfg.o_direct, p->cfg.direct_alignment);
        batch->samples = saved;
        if (rc != 0) {
            for (size_t k = 0; k < p->count; k++)
                if (p->fds[k] >= 0)
                    close(p->fds[k]);
            return rc;
        }
        fr_threadpool_run_claimed(p->pool, PHASE_READ, p->count);
        for (size_t k = 0; k < p->count; k++) {
            if (!p->needs_repair[k])
                continue;
            size_t size = (size_t)p->sizes[k];
            size_t slot = fr_request_len(size, p->cfg.o_direct, p->cfg.direct_alignment);
            fr_read_whole(batch, first + k, paths[first + k], slot);
        }
    }
    return 0;
}

static int psync_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                             fr_batch *batch)
{
    psync *p = state;
    int rc = fr_image_cache_get(&p->image, path, p->cfg.o_direct);
    if (rc < 0)
        return rc;
    int fd = p->image.fd;
    rc = fr_layout_ranges(batch, ranges, n, fd >= 0 && p->image.direct, p->cfg.direct_alignment);
    if (rc)
        return rc;
    if (fd < 0) { /* the image cannot be opened: every sample says why */
        for (size_t i = 0; i < n; i++)
            batch->samples[i].length = p->image.err;
        return 0;
    }
    p->image_path = path;
    p->ranges = ranges;
    p->batch = batch;
    p->first = 0;
    p->count = n;
    fr_threadpool_run_claimed(p->pool, PHASE_RANGES, p->count);
    return 0;
}

static int grow_file_scratch(psync *p, size_t n)
{
    if (n > p->jobs_cap) {
        size_t cap = n > 2 * p->jobs_cap ? n : 2 * p->jobs_cap;
        fr_range *r = realloc(p->job_ranges, cap * sizeof(*r));
        if (r)
            p->job_ranges = r;
        uint32_t *a = realloc(p->sorted, cap * sizeof(*a));
        if (a)
            p->sorted = a;
        uint32_t *b = realloc(p->job_slot, cap * sizeof(*b));
        if (b)
            p->job_slot = b;
        uint32_t *c = realloc(p->runs, (cap + 1) * sizeof(*c));
        if (c)
            p->runs = c;
        if (!r || !a || !b || !c)
            return -ENOMEM;
        p->jobs_cap = cap;
    }
    if (!p->fdc_made) {
        /* All or nothing: made with its window's arrays, or not at all (a
         * cache made without them, win_cap 0, had the next call's windows
         * take no file, for ever). */
        unsigned cap = p->cfg.max_open_files ? p->cfg.max_open_files : FR_MAX_OPEN_FILES;
        p->win_files = malloc(cap * sizeof(*p->win_files));
        p->win_fds = malloc(cap * sizeof(*p->win_fds));
        p->misses = malloc(cap * sizeof(*p->misses));
        p->victims = malloc(cap * sizeof(*p->victims));
        if (!p->win_files || !p->win_fds || !p->misses || !p->victims ||
            fr_fd_cache_init(&p->fdc, cap) != 0) {
            free(p->win_files);
            free(p->win_fds);
            free(p->misses);
            free(p->victims);
            p->win_files = NULL;
            p->win_fds = NULL;
            p->misses = NULL;
            p->victims = NULL;
            return -ENOMEM;
        }
        p->fdc_made = 1;
        p->win_cap = cap;
    }
    return 0;
}

/* The directory of `path` for this call's opens (see dir); none for a
 * path in the working or root directory, or when it cannot be opened. */
static void open_dir(psync *p, const char *path)
{
    p->dir_tried = 1;
    fr_shard_dir_open(&p->dir, path);
}

static void close_dir(psync *p)
{
    fr_shard_dir_close(&p->dir);
    p->dir_tried = 0;
}

static int psync_read_file_ranges(void *state, const char *const *paths, size_t npaths,
                                  const fr_file_range *jobs, size_t n, fr_batch *batch)
{
    psync *p = state;
    if (p->cfg.o_direct)
        return -ENOTSUP;
    if (n > UINT32_MAX)
        return -EINVAL;
    int rc = grow_file_scratch(p, n);
    if (rc)
        return rc;
    fr_fd_cache_use_table(&p->fdc, paths);
    size_t valid;
    if ((rc = fr_prepare_file_jobs(batch, jobs, n, npaths, p->job_ranges, p->cfg.direct_alignment,
                                   p->sorted, &valid)))
        return rc;
    p->fpaths = paths;
    p->jobs = jobs;
    p->batch = batch;
    /* Windows of at most win_cap distinct files, in sorted order. */
    size_t pos = 0;
    while (pos < valid) {
        size_t end = pos, nfiles = 0;
        p->nmisses = 0;
        while (end < valid) {
            uint32_t f = jobs[p->sorted[end]].file;
            if (end == pos || f != jobs[p->sorted[end - 1]].file) {
                if (nfiles == p->win_cap)
                    break;
                p->win_files[nfiles] = f;
                int fd = fr_fd_cache_get(&p->fdc, f); /* pinned for the window */
                p->win_fds[nfiles] = fd;
                if (fd < 0)
                    p->misses[p->nmisses++] = (uint32_t)nfiles;
                nfiles++;
            }
            p->job_slot[end] = (uint32_t)(nfiles - 1);
            end++;
        }
        if (p->nmisses >= DIR_MIN_MISSES && !p->dir_tried)
            open_dir(p, p->fpaths[p->win_files[p->misses[0]]]);
        if (p->nmisses) {
            /* Room first: the descriptors open never pass the LRU's cap. */
            if (fr_fd_cache_reserve_take(&p->fdc, (uint32_t)p->nmisses, p->victims,
                                         &p->nvictims) != 0) {
                for (uint32_t v = 0; v < p->nvictims; v++)
                    close(p->victims[v]);
                fr_fd_cache_unpin_all(&p->fdc);
                close_dir(p);
                return -EBUSY; /* cannot happen: the window is at most cap files */
            }
            fr_threadpool_run_claimed(p->pool, PHASE_FILE_OPEN, p->nmisses);
            for (size_t k = 0; k < p->nmisses; k++) {
                uint32_t slot = p->misses[k];
                int fd = p->win_fds[slot];
                if (fd >= 0 && fr_fd_cache_put(&p->fdc, p->win_files[slot], fd) != 0) {
                    close(fd); /* cannot happen: room was reserved */
                    p->win_fds[slot] = -EBUSY;
                }
            }
        }
        make_runs(p, pos, end);
        fr_threadpool_run_claimed(p->pool, PHASE_FILE_RANGES, p->nruns);
        fr_fd_cache_unpin_all(&p->fdc);
        p->file_range_windows++;
        pos = end;
    }
    close_dir(p);
    return 0;
}

static long psync_stat(const void *state, const char *key)
{
    const psync *p = state;
    if (strcmp(key, "threads") == 0)
        return (long)fr_threadpool_size(p->pool);
    if (strcmp(key, "o_direct") == 0)
        return p->cfg.o_direct;
    if (strcmp(key, "image_direct") == 0)
        return p->image.fd >= 0 ? p->image.direct : -1;
    if (strcmp(key, "window") == 0)
        return (long)p->window;
    if (strcmp(key, "window_shrinks") == 0)
        return p->window_shrinks;
    if (strcmp(key, "fd_cache_opens") == 0)
        return p->fdc_made ? p->fdc.opens : 0;
    if (strcmp(key, "fd_cache_hits") == 0)
        return p->fdc_made ? p->fdc.hits : 0;
    if (strcmp(key, "fd_cache_evictions") == 0)
        return p->fdc_made ? p->fdc.evictions : 0;
    if (strcmp(key, "fd_cache_open") == 0)
        return p->fdc_made ? (long)p->fdc.used : 0;
    if (strcmp(key, "file_range_windows") == 0)
        return p->file_range_windows;
    if (strcmp(key, "fd_cache_reads") == 0)
        return __atomic_load_n(&p->file_range_reads, __ATOMIC_RELAXED);
    return fr_threadpool_stat(p->pool, key);
}

const fr_engine fr_engine_psync = {
    .name = "psync",
    .probe = psync_probe,
    .open = psync_open,
    .close = psync_close,
    .read_files = psync_read_files,
    .stat = psync_stat,
    .read_ranges = psync_read_ranges,
    .read_file_ranges = psync_read_file_ranges,
};
