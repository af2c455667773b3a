/*
 * cufile: GPUDirect Storage. Files (or ranges of a packed image) are read
 * with cuFileRead straight into the batch's device buffer; the host arena
 * only lends its layout (offsets), and its pages are never touched unless
 * the caller wants host output (then ctx.c copies the batch down once).
 *
 * cuFile has no queue to keep full: many reads are in flight because a pool
 * of native threads (cfg.threads) each issue cuFileRead, which is
 * thread-safe. cuFile's batch API is not used: it needs nvidia-fs (no
 * compatibility mode) and is not faster for whole small files.
 *
 * Registering a file with cuFile costs an open, a registration and, at the
 * end, a deregistration and a close, so handles are cached across batches
 * and epochs: a bounded LRU keyed by path. Each use re-checks the path with
 * stat(), so a file replaced under the same name (new inode) is reopened,
 * never read stale; stat also gives the size to read. Entries used by the
 * batch being read are never evicted; when the cache is full of them, the
 * extra handles live for one batch only.
 *
 * Device buffers are registered once per allocation (cuFileBufRegister);
 * in compatibility mode (no nvidia-fs: cuFile reads through its own pinned
 * host buffers) the registration may be refused and reads work unregistered.
 *
 * Where cuFile refuses a file (cuFileHandleRegister fails: GDS cannot place
 * the file system, as on VMs without udev data), the engine falls back like
 * KvikIO's compatibility mode, unless compat=off: that file system's files
 * are read with pread into the batch's page-locked arena by the same
 * threads, and ctx.c uploads the batch in one copy. A batch mixing both
 * kinds comes down once and its host samples are read again (rare: two file
 * systems in one batch).
 *
 * Like the other engines every read asks for one byte more than the size,
 * so a file that changed is noticed. The rare sample whose read fails that
 * check is settled on the host: the batch is copied down, the sample re-read
 * with fr_read_whole, and the batch handed on as host data (ctx.c uploads it
 * again for device output).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/engine_args.h"
#include "engines/engine.h"
#include "engines/io_common.h"
#include "gpu/gpu.h"
#include "engines/range_io.h"
#include "core/threadpool.h"

#define MAX_THREADS 64
#define DEFAULT_HANDLES 4096
#define MAX_REFUSED_DEVS 16

/* Per-sample marks of a batch being read. */
enum { MARK_REPAIR = 1, MARK_ON_HOST = 2, MARK_ON_DEVICE = 4 };

enum phase { PHASE_OPEN, PHASE_READ, PHASE_RANGES };

typedef struct fh_entry {
    char *path;
    size_t hash;
    int fd;
    fr_CUfileHandle fh;
    dev_t dev;
    ino_t ino;
    int direct;
    int host;                    /* cuFile refused it: read with pread */
    uint64_t batch;              /* last batch that used it: not evictable then */
    int transient;               /* not in the cache: closed after the batch */
    struct fh_entry *hnext;      /* hash chain */
    struct fh_entry *prev, *next; /* LRU list, most recent first */
} fh_entry;

typedef struct cufile {
    fr_config cfg;
    fr_gpu *gpu;
    fr_threadpool *pool;

    pthread_mutex_t lock; /* the handle cache */
    fh_entry **buckets;
    size_t nbuckets, count, capacity;
    fh_entry *lru_head, *lru_tail;
    fh_entry *transients;
    uint64_t batch_no;
    int compat;                  /* 1: fall back to the host where cuFile refuses */
    dev_t refused[MAX_REFUSED_DEVS]; /* file systems cuFile refused, with the lock */
    size_t nrefused;
    atomic_long host_files;      /* files opened for the host path */

    /* The phase being run. */
    const char *const *paths;
    fr_batch *batch;
    fh_entry **entries;
    int64_t *sizes;
    unsigned char *marks;        /* MARK_* per sample */
    size_t cap;

    /* Range reads: one image, registered once. */
    fr_image_cache image;
    fr_CUfileHandle image_fh;
    int image_registered;
    int image_host;              /* cuFile refused the image: pread it */
    const fr_range *ranges;
} cufile;

static int cufile_probe(char *why, size_t why_len)
{
    fr_gpu *gpu;
    int rc = fr_gpu_open(0, &gpu, why, why_len);
    if (rc)
        return rc;
    const char *mode = NULL;
    rc = fr_gpu_cufile(gpu, &mode, why, why_len);
    if (rc == 0)
        fr_set_err(why, why_len, "%s",
                   strcmp(mode, "gds") == 0
                       ? "GPUDirect Storage (nvidia-fs loaded)"
                       : "compatibility mode: nvidia-fs is not loaded, cuFile reads through "
                         "host bounce buffers");
    fr_gpu_close(gpu);
    return rc;
}

static size_t hash_path(const char *s)
{
    size_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void lru_unlink(cufile *c, fh_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->lru_head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(cufile *c, fh_entry *e)
{
    e->prev = NULL;
    e->next = c->lru_head;
    if (c->lru_head)
        c->lru_head->prev = e;
    c->lru_head = e;
    if (!c->lru_tail)
        c->lru_tail = e;
}

static void hash_remove(cufile *c, fh_entry *e)
{
    fh_entry **at = &c->buckets[e->hash % c->nbuckets];
    while (*at && *at != e)
        at = &(*at)->hnext;
    if (*at)
        *at = e->hnext;
    lru_unlink(c, e);
    c->count--;
}

static void entry_close(cufile *c, fh_entry *e)
{
    if (!e->host)
        fr_gpu_cufile_deregister(c->gpu, e->fh);
    close(e->fd);
    free(e->path);
    free(e);
}

/* A cached handle for path if it still names the same file; with the lock. */
static fh_entry *cache_find(cufile *c, const char *path, size_t h)
{
    for (fh_entry *e = c->buckets[h % c->nbuckets]; e; e = e->hnext)
        if (e->hash == h && strcmp(e->path, path) == 0)
            return e;
    return NULL;
}

/* A cuFile handle for fd, or (compat) *host = 1 when cuFile refuses the file.
 * A refusal is remembered per file system, so the others on it are not
 * offered to cuFile again (each refusal costs a registration attempt). */
static int register_or_fall_back(cufile *c, int fd, dev_t dev, fr_CUfileHandle *fh, int *host)
{
    int refused = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nrefused && !refused; i++)
        refused = c->refused[i] == dev;
    pthread_mutex_unlock(&c->lock);
    int rc = refused ? -EIO : fr_gpu_cufile_register(c->gpu, fd, fh);
    if (rc == 0 || !c->compat)
        return rc;
    if (!refused) {
        pthread_mutex_lock(&c->lock);
        if (c->nrefused < MAX_REFUSED_DEVS)
            c->refused[c->nrefused++] = dev;
        pthread_mutex_unlock(&c->lock);
    }
    *host = 1;
    atomic_fetch_add(&c->host_files, 1);
    return 0;
}

/* Opens and registers path; the entry is not in the cache yet. */
static int entry_open(cufile *c, const char *path, size_t h, const struct stat *want,
                      fh_entry **out)
{
    int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
    int direct = c->cfg.o_direct;
    int fd;
    do {
        fd = open(path, flags | (direct ? O_DIRECT : 0));
    } while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno == EINVAL && direct) {
        direct = 0; /* this file system refuses O_DIRECT */
        do {
            fd = open(path, flags);
        } while (fd < 0 && errno == EINTR);
    }
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    if (!S_ISREG(st.st_mode) || st.st_ino != want->st_ino || st.st_dev != want->st_dev) {
        close(fd);
        return S_ISDIR(st.st_mode) ? -EISDIR : !S_ISREG(st.st_mode) ? -EINVAL : -EAGAIN;
    }
    /* O_NONBLOCK only kept a FIFO from blocking the open; cuFileHandleRegister
     * refuses descriptors that carry it. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    fh_entry *e = calloc(1, sizeof(*e));
    char *copy = strdup(path);
    if (!e || !copy) {
        free(e);
        free(copy);
        close(fd);
        return -ENOMEM;
    }
    int rc = register_or_fall_back(c, fd, st.st_dev, &e->fh, &e->host);
    if (rc) {
        free(e);
        free(copy);
        close(fd);
        return rc;
    }
    e->path = copy;
    e->hash = h;
    e->fd = fd;
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->direct = direct;
    *out = e;
    return 0;
}

/* Phase 1 for sample k: its size and a registered handle. */
static void open_one(cufile *c, size_t k)
{
    const char *path = c->paths[k];
    c->entries[k] = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        c->sizes[k] = -errno;
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        c->sizes[k] = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        return;
    }
    size_t h = hash_path(path);
    fh_entry *stale = NULL;
    pthread_mutex_lock(&c->lock);
    fh_entry *e = cache_find(c, path, h);
    if (e && (e->ino != st.st_ino || e->dev != st.st_dev)) {
        if (e->batch == c->batch_no) {
            e = NULL; /* replaced mid-batch and still in use: a one-batch handle */
        } else {
            hash_remove(c, e);
            stale = e;
            e = NULL;
        }
    }
    if (e) {
        e->batch = c->batch_no;
        lru_unlink(c, e);
        lru_push_front(c, e);
    }
    pthread_mutex_unlock(&c->lock);
    if (stale)
        entry_close(c, stale);
    if (!e) {
        int rc = entry_open(c, path, h, &st, &e);
        if (rc == -EAGAIN) /* replaced between stat and open: size it again */
            rc = stat(path, &st) == 0 ? entry_open(c, path, h, &st, &e) : -errno;
        if (rc) {
            c->sizes[k] = rc == -EAGAIN ? -ESTALE : rc;
            return;
        }
        fh_entry *victim = NULL;
        pthread_mutex_lock(&c->lock);
        fh_entry *dup = cache_find(c, path, h);
        if (dup && dup->ino == e->ino && dup->dev == e->dev) {
            /* Another thread cached it meanwhile (the path is in the batch
             * twice): use theirs. */
            victim = e;
            e = dup;
            e->batch = c->batch_no;
        } else {
            if (!dup && c->count >= c->capacity) {
                fh_entry *t = c->lru_tail;
                while (t && t->batch == c->batch_no)
                    t = t->prev;
                if (t) {
                    hash_remove(c, t);
                    victim = t;
                }
            }
            e->batch = c->batch_no;
            if (!dup && c->count < c->capacity) {
                fh_entry **b = &c->buckets[h % c->nbuckets];
                e->hnext = *b;
                *b = e;
                lru_push_front(c, e);
                c->count++;
            } else {
                e->transient = 1;
                e->hnext = c->transients;
                c->transients = e;
            }
        }
        pthread_mutex_unlock(&c->lock);
        if (victim)
            entry_close(c, victim);
    }
    c->entries[k] = e;
    c->sizes[k] = st.st_size;
}

/* cuFileRead until `want` bytes or end of file; bytes read or -errno. */
static ssize_t read_full(cufile *c, fr_CUfileHandle fh, const fr_device_buffer *buf,
                         size_t dev_off, size_t want, off_t file_off)
{
    size_t done = 0;
    while (done < want) {
        size_t chunk = want - done < FR_MAX_REQUEST ? want - done : FR_MAX_REQUEST;
        ssize_t r = fr_gpu_cufile_read(c->gpu, fh, buf, dev_off + done, chunk,
                                       file_off + (off_t)done);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

/* Reads one sample where its file allows: into the device buffer through
 * cuFile, or into the host arena with pread. */
static ssize_t read_sample(cufile *c, size_t k, int host, int fd, fr_CUfileHandle fh,
                           size_t want, off_t file_off)
{
    fr_batch *b = c->batch;
    size_t off = b->samples[k].offset;
    c->marks[k] = host ? MARK_ON_HOST : MARK_ON_DEVICE;
    if (host)
        return fr_pread_full(fd, b->arena.base + off, want, file_off);
    return read_full(c, fh, &b->device, off, want, file_off);
}

static void read_one(cufile *c, size_t k)
{
    fh_entry *e = c->entries[k];
    if (!e || c->sizes[k] < 0) /* not opened, or refused by the layout (fr_layout) */
        return;
    fr_sample *s = &c->batch->samples[k];
    size_t size = (size_t)c->sizes[k];
    size_t want = fr_request_len(size, e->direct, c->cfg.direct_alignment);
    ssize_t got = read_sample(c, k, e->host, e->fd, e->fh, want, 0);
    if (got >= 0 && (size_t)got == size)
        s->length = got;
    else if (got >= 0 || got == -EINVAL)
        c->marks[k] |= MARK_REPAIR; /* changed size, or an O_DIRECT tail refused */
    else
        s->length = got;
}

static void range_one(cufile *c, size_t k)
{
    fr_sample *s = &c->batch->samples[k];
    const fr_range *r = &c->ranges[k];
    if (s->length < 0 || r->length == 0)
        return;
    size_t want = fr_range_request_len(r->length, c->image.direct, c->cfg.direct_alignment);
    ssize_t got = read_sample(c, k, c->image_host, c->image.fd, c->image_fh, want,
                              (off_t)r->offset);
    if (got >= 0 && (uint64_t)got >= r->length)
        s->length = (int64_t)r->length;
    else if (got >= 0 || got == -EINVAL)
        c->marks[k] |= MARK_REPAIR;
    else
        s->length = got;
}

static void run_phase(void *arg, int ph)
{
    cufile *c = arg;
    size_t k;
    while (fr_threadpool_claim(c->pool, &k)) {
        if (ph == PHASE_OPEN)
            open_one(c, k);
        else if (ph == PHASE_READ)
            read_one(c, k);
        else
            range_one(c, k);
    }
}

static int grow_scratch(cufile *c, size_t n)
{
    if (n <= c->cap)
        return 0;
    fh_entry **e = realloc(c->entries, n * sizeof(*e));
    if (!e)
        return -ENOMEM;
    c->entries = e;
    int64_t *s = realloc(c->sizes, n * sizeof(*s));
    if (!s)
        return -ENOMEM;
    c->sizes = s;
    unsigned char *r = realloc(c->marks, n);
    if (!r)
        return -ENOMEM;
    c->marks = r;
    c->cap = n;
    return 0;
}

static void close_transients(cufile *c)
{
    fh_entry *e = c->transients;
    c->transients = NULL;
    while (e) {
        fh_entry *next = e->hnext;
        entry_close(c, e);
        e = next;
    }
}

/* The device buffer for the laid-out batch, registered with cuFile. */
static int reserve_device(cufile *c, fr_batch *batch)
{
    int rc = fr_gpu_device_reserve(c->gpu, &batch->device, batch->arena.used, 1);
    if (rc == 0)
        batch->where = FR_ON_DEVICE;
    return rc;
}

/* Puts the whole batch in one place. Samples read on the host (cuFile
 * refused their file) and on the device: all-host batches are host data
 * (ctx.c uploads them in one copy for device output); a mixed batch comes
 * down once, which overwrites the arena, so its host samples are read again.
 * Then the samples marked for repair are settled on the host: each is read
 * plainly into the arena. */
static int settle_batch(cufile *c, fr_batch *batch, int ranges)
{
    size_t n = batch->count, host = 0, device = 0, repair = 0;
    for (size_t i = 0; i < n; i++) {
        host += (c->marks[i] & MARK_ON_HOST) != 0;
        device += (c->marks[i] & MARK_ON_DEVICE) != 0;
    }
    if (host && device) {
        for (size_t i = 0; i < n; i++)
            if (c->marks[i] & MARK_ON_HOST)
                c->marks[i] |= MARK_REPAIR;
    }
    for (size_t i = 0; i < n; i++)
        repair += (c->marks[i] & MARK_REPAIR) != 0;
    if (!device && !host)
        return 0;
    if (device && (host || repair)) {
        fr_CUstream stream;
        int rc = fr_gpu_stream_create(c->gpu, &stream);
        if (rc == 0) {
            rc = fr_gpu_download(c->gpu, stream, batch);
            fr_gpu_stream_destroy(c->gpu, stream);
        }
        if (rc)
            return rc;
    }
    if (host || repair)
        batch->where = FR_ON_HOST;
    for (size_t i = 0; i < n; i++) {
        if (!(c->marks[i] & MARK_REPAIR))
            continue;
        if (ranges) {
            fr_read_range_plain(batch, i, c->image.path, &c->ranges[i]);
        } else {
            size_t slot = fr_request_len((size_t)c->sizes[i], c->entries[i]->direct,
                                         c->cfg.direct_alignment);
            fr_read_whole(batch, i, c->paths[i], slot);
        }
    }
    return 0;
}

static int cufile_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                             size_t n, fr_batch *batch)
{
    (void)size_hints; /* stat() both sizes the file and checks the cached handle */
    cufile *c = state;
    int rc = grow_scratch(c, n);
    if (rc)
        return rc;
    c->batch_no++;
    c->paths = paths;
    c->batch = batch;
    fr_threadpool_run(c->pool, PHASE_OPEN, n);
    rc = fr_layout(batch, c->sizes, n, c->cfg.o_direct, c->cfg.direct_alignment);
    if (rc == 0)
        rc = reserve_device(c, batch);
    if (rc == 0) {
        memset(c->marks, 0, n);
        fr_threadpool_run(c->pool, PHASE_READ, n);
        rc = settle_batch(c, batch, 0);
    }
    close_transients(c);
    return rc;
}

static int cufile_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                              fr_batch *batch)
{
    cufile *c = state;
    int rc = grow_scratch(c, n);
    if (rc)
        return rc;
    int changed = fr_image_cache_get(&c->image, path, c->cfg.o_direct);
    if (changed < 0)
        return changed;
    if (changed && c->image_registered) {
        fr_gpu_cufile_deregister(c->gpu, c->image_fh);
        c->image_registered = 0;
    }
    if (changed)
        c->image_host = 0;
    if (c->image.fd >= 0 && !c->image_registered && !c->image_host) {
        struct stat st;
        if (fstat(c->image.fd, &st) != 0)
            return -errno;
        if ((rc = register_or_fall_back(c, c->image.fd, st.st_dev, &c->image_fh,
                                        &c->image_host)))
            return rc;
        c->image_registered = !c->image_host;
    }
    int fd = c->image.fd;
    rc = fr_layout_ranges(batch, ranges, n, fd >= 0 && c->image.direct, c->cfg.direct_alignment);
    if (rc)
        return rc;
    if (fd < 0) {
        for (size_t i = 0; i < n; i++)
            batch->samples[i].length = c->image.err;
        return 0;
    }
    if ((rc = reserve_device(c, batch)))
        return rc;
    c->ranges = ranges;
    c->batch = batch;
    memset(c->marks, 0, n);
    fr_threadpool_run(c->pool, PHASE_RANGES, n);
    return settle_batch(c, batch, 1);
}

static void cufile_close(void *state)
{
    cufile *c = state;
    if (!c)
        return;
    fr_threadpool_stop(c->pool);
    close_transients(c);
    fh_entry *e = c->lru_head;
    while (e) {
        fh_entry *next = e->next;
        entry_close(c, e);
        e = next;
    }
    if (c->image_registered)
        fr_gpu_cufile_deregister(c->gpu, c->image_fh);
    fr_image_cache_close(&c->image);
    fr_gpu_close(c->gpu);
    pthread_mutex_destroy(&c->lock);
    free(c->buckets);
    free(c->entries);
    free(c->sizes);
    free(c->marks);
    free(c);
}

/* engine_args: handles=N, the most cached file handles; compat=auto|off,
 * whether files cuFile refuses are read on the host (auto) or fail (off). */
static int parse_args(const char *s, size_t *handles, int *compat, char *err, size_t err_len)
{
    long long h = (long long)*handles;
    int off = *compat ? 0 : 1;
    const fr_arg_spec specs[] = {
        {.key = "handles", .kind = FR_ARG_INT, .out = &h, .min = 1, .max = 1 << 24},
        {.key = "compat", .kind = FR_ARG_CHOICE, .out = &off, .choices = "auto|off"},
    };
    int rc = fr_args_parse("cufile", s, specs, sizeof(specs) / sizeof(specs[0]), err, err_len);
    if (rc)
        return rc;
    *handles = (size_t)h;
    *compat = off == 0;
    return 0;
}

static int cufile_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    if (cfg->device_id < 0 || !cfg->gpu) {
        fr_set_err(err, err_len, "the cufile engine reads into GPU memory: it needs a device_id");
        return -EINVAL;
    }
    /* By default 1/64 of the descriptor limit: a reader has up to 8 worker
     * contexts, each with its own cache, and the process (DALI, PyTorch,
     * other readers) needs descriptors too. 1/8 each exhausted a 1024 limit
     * with 8 workers. */
    size_t handles = DEFAULT_HANDLES;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 64 < handles)
        handles = rl.rlim_cur / 64 ? rl.rlim_cur / 64 : 1;
    int compat = 1;
    int rc = parse_args(cfg->engine_args, &handles, &compat, err, err_len);
    if (rc)
        return rc;
    const char *mode;
    if ((rc = fr_gpu_cufile(cfg->gpu, &mode, err, err_len)))
        return rc;
    cufile *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->cfg = *cfg;
    c->compat = compat;
    c->capacity = handles;
    c->nbuckets = handles < 64 ? 64 : handles;
    c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
    if (!c->buckets || pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c->buckets);
        free(c);
        return -ENOMEM;
    }
    fr_image_cache_init(&c->image);
    fr_gpu_retain(cfg->gpu);
    c->gpu = cfg->gpu;
    unsigned n = cfg->threads ? cfg->threads : 8;
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    rc = fr_threadpool_start(&c->pool, n - 1, run_phase, c, "cufile", err, err_len);
    if (rc) {
        fr_gpu_close(c->gpu);
        pthread_mutex_destroy(&c->lock);
        free(c->buckets);
        free(c);
        return rc;
    }
    *state = c;
    return 0;
}

static long cufile_stat(const void *state, const char *key)
{
    const cufile *c = state;
    if (strcmp(key, "threads") == 0)
        return (long)fr_threadpool_size(c->pool);
    if (strcmp(key, "o_direct") == 0)
        return c->cfg.o_direct;
    if (strcmp(key, "cached_handles") == 0)
        return (long)c->count;
    if (strcmp(key, "handle_capacity") == 0)
        return (long)c->capacity;
    if (strcmp(key, "host_files") == 0) /* files cuFile refused, read on the host */
        return atomic_load(&((cufile *)state)->host_files) + (c->image_host ? 1 : 0);
    return -1;
}

const fr_engine fr_engine_cufile = {
    .name = "cufile",
    .probe = cufile_probe,
    .open = cufile_open,
    .close = cufile_close,
    .read_files = cufile_read_files,
    .stat = cufile_stat,
    .read_ranges = cufile_read_ranges,
};
