/*
 * fr_store (gather.h): opens the backends and serialises gathers.
 *
 * Locking: `state_lock` guards `users`, `closing` and the stats; each call
 * into the store counts itself in `users` while it runs, so fr_store_close
 * can cancel what runs and wait for every caller to leave before freeing.
 * `gather_lock` serialises gathers (one at a time per store): the backends
 * keep their scratch (sort buffers, rings, staging pages, the device
 * control block) in the store, and one gather already spreads over every
 * host thread or GPU SM, so a second one in parallel would gain nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base.h"
#include "fastread.h"
#include "fastread_gather.h"
#include "gather/gather_device.h"
#include "gather/gather_host.h"
#include "gather/gather_kernel.h"
#include "gather/gather_route.h"
#include "gpu/gpu.h"

struct fr_store {
    fr_store_config cfg; /* strings point into the copies below */
    char *path, *engine, *engine_args, *cache_dir;
    const char *backend;

    fr_host_gather *host;
    fr_gpu *gpu;  /* device_id >= 0 */
    fr_gdev *dev; /* the device path (proxy, xnvme-cuda) */
    char reason[FR_ERRLEN];
    char *nvrtc_path;
    const int64_t *open_hot_ids; /* cfg->hot_ids, during fr_store_open only */

    pthread_mutex_t state_lock;
    pthread_cond_t idle_cv;
    unsigned users;
    atomic_int closing;
    fr_store_stats stats;
    char route[FR_ERRLEN]; /* backend "auto": where the last device-id gather ran, why */
    int auto_route;        /* backend "auto" was asked for: each gather picks its path */

    pthread_mutex_t gather_lock;
    /* Host backend with device ids/output: page-locked bounce buffers. */
    void *h_ids, *h_out;
    size_t h_ids_cap, h_out_cap;
    /* $FASTREAD_GATHER_TIMELINE=1 (read at open): host-path gathers of
     * device ids print where their time went, as device gathers do
     * (gather_device.c); route_us: the last route decision's. */
    int timeline;
    double route_us;
};

static double mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

void fr_store_config_init(fr_store_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->backend = "auto";
    cfg->engine = "auto";
    cfg->engine_args = "";
    cfg->o_direct = -1;
    cfg->device_id = -1;
    cfg->cache_bytes = (uint64_t)1 << 30;
    cfg->page_bytes = 64u << 10;
    cfg->host_bytes = 0;
    cfg->ring_entries = 0;
    cfg->timeout_ms = 10000;
}

static char *dup_or_null(const char *s, int *failed)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *failed = 1;
    return d;
}

static void pinned_free(fr_store *s, void **p, size_t *cap)
{
    if (*p) {
        fr_gpu_host_unregister(s->gpu, *p);
        free(*p);
    }
    *p = NULL;
    *cap = 0;
}

static void store_free(fr_store *s)
{
    fr_gdev_close(s->dev);
    fr_host_gather_close(s->host);
    if (s->gpu) {
        pinned_free(s, &s->h_ids, &s->h_ids_cap);
        pinned_free(s, &s->h_out, &s->h_out_cap);
        fr_gpu_close(s->gpu);
    }
    pthread_mutex_destroy(&s->gather_lock);
    pthread_cond_destroy(&s->idle_cv);
    pthread_mutex_destroy(&s->state_lock);
    free(s->path);
    free(s->engine);
    free(s->engine_args);
    free(s->cache_dir);
    free(s->nvrtc_path);
    free(s);
}

static int check_config(const fr_store_config *c, char *err, size_t err_len)
{
    if (!c->path || !c->path[0]) {
        fr_set_err(err, err_len, "a store needs a path");
        return -EINVAL;
    }
    const char *b = c->backend ? c->backend : "auto";
    if (strcmp(b, "auto") && strcmp(b, "host") && strcmp(b, "proxy") && strcmp(b, "xnvme-cuda")) {
        fr_set_err(err, err_len, "unknown backend '%s' (auto, host, proxy, xnvme-cuda)", b);
        return -EINVAL;
    }
    if (c->o_direct < -1 || c->o_direct > 1) {
        fr_set_err(err, err_len, "o_direct must be -1, 0 or 1, got %d", c->o_direct);
        return -EINVAL;
    }
    return 0;
}

/* Hot rows for the host tier, read by the host backend. */
static int fill_hot(void *arg, const int64_t *ids, size_t n, void *out, char *err, size_t err_len)
{
    fr_store *s = arg;
    fr_host_gather_counts c = {0, 0, 0};
    return fr_host_gather_run(s->host, ids, n, out, NULL, &c, err, err_len);
}

static int open_device_path(fr_store *s, const char *backend, char *err, size_t err_len)
{
    const fr_gather_backend *be = NULL;
    if (strcmp(backend, "proxy") == 0)
        be = &fr_gather_backend_proxy;
#ifdef FASTREAD_HAVE_XNVME_CUDA
    else if (strcmp(backend, "xnvme-cuda") == 0)
        be = &fr_gather_backend_xnvme_cuda;
#endif
    if (!be) {
        fr_set_err(err, err_len,
                   "store %s: backend '%s' is not built in (needs xNVMe with libxnvme_cuda.h)",
                   s->path, backend);
        return -ENOTSUP;
    }
    const fr_store_config *c = &s->cfg;
    uint64_t data = c->rows * c->row_bytes, size = 0;
    int rc = fr_host_file_size(s->path, &size, err, err_len);
    if (rc)
        return rc;
    unsigned ring = c->ring_entries;
    if (ring == 0) {
        ring = 4096;
        while (ring > 64 && (uint64_t)ring * c->page_bytes > ((uint64_t)256 << 20))
            ring /= 2;
    }
    fr_backend_env env = {
        .path = s->path, .offset = c->offset, .rows = c->rows, .row_bytes = c->row_bytes,
        .file_size = size, .page_bytes = c->page_bytes,
        .pages = c->page_bytes ? (data + c->page_bytes - 1) / c->page_bytes : 0,
        .ring_entries = ring, .timeout_ms = c->timeout_ms,
        .engine = fr_host_gather_engine(s->host), .engine_args = s->engine_args,
        .o_direct = c->o_direct, .queue_depth = c->queue_depth, .threads = c->threads,
        .gpu = s->gpu, .cancel = &s->closing,
    };
    /* hot_ids are borrowed for the duration of open only. */
    fr_store_config dc = *c;
    dc.hot_ids = s->open_hot_ids;
    return fr_gdev_open(&dc, &env, be, fill_hot, s, &s->dev, err, err_len);
}

int fr_store_open(const fr_store_config *cfg, fr_store **out, char *err, size_t err_len)
{
    *out = NULL;
    int rc = check_config(cfg, err, err_len);
    if (rc)
        return rc;
    fr_store *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    int failed = 0;
    s->cfg = *cfg;
    s->cfg.path = s->path = dup_or_null(cfg->path, &failed);
    s->cfg.engine = s->engine = dup_or_null(cfg->engine ? cfg->engine : "auto", &failed);
    s->cfg.engine_args = s->engine_args = dup_or_null(cfg->engine_args ? cfg->engine_args : "",
                                                      &failed);
    s->cfg.cache_dir = s->cache_dir = dup_or_null(cfg->cache_dir, &failed);
    s->cfg.nvrtc_path = s->nvrtc_path = dup_or_null(cfg->nvrtc_path, &failed);
    s->cfg.hot_ids = NULL; /* borrowed only for the duration of open */
    s->open_hot_ids = cfg->hot_ids;
    pthread_mutex_init(&s->state_lock, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_mutex_init(&s->gather_lock, NULL);
    if (failed) {
        store_free(s);
        return -ENOMEM;
    }
    fr_host_gather_config hc = {
        .path = s->path, .offset = cfg->offset, .rows = cfg->rows, .row_bytes = cfg->row_bytes,
        .engine = s->engine, .engine_args = s->engine_args, .o_direct = cfg->o_direct,
        .queue_depth = cfg->queue_depth, .threads = cfg->threads, .cancel = &s->closing,
    };
    rc = fr_host_gather_open(&hc, &s->host, err, err_len);
    if (rc) {
        store_free(s);
        return rc;
    }
    const char *b = cfg->backend ? cfg->backend : "auto";
    s->cfg.backend = NULL; /* the caller's string: not kept */
    s->auto_route = strcmp(b, "auto") == 0;
    const char *tl = getenv("FASTREAD_GATHER_TIMELINE");
    s->timeline = tl && tl[0] && strcmp(tl, "0") != 0;
    if (cfg->device_id >= 0) {
        rc = fr_gpu_open(cfg->device_id, &s->gpu, err, err_len);
        if (rc) {
            char why[FR_ERRLEN];
            snprintf(why, sizeof(why), "%s", err ? err : "");
            fr_set_err(err, err_len, "store %s: device_id %d: %s", s->path, cfg->device_id, why);
            store_free(s);
            return rc;
        }
    }
    int device_path = strcmp(b, "proxy") == 0 || strcmp(b, "xnvme-cuda") == 0;
    if (device_path && cfg->device_id < 0) {
        fr_set_err(err, err_len, "store %s: backend '%s' needs a device_id (a CUDA device number)",
                   s->path, b);
        store_free(s);
        return -EINVAL;
    }
    s->backend = "host";
    if (device_path || (strcmp(b, "auto") == 0 && cfg->device_id >= 0)) {
        const char *want = device_path ? b : "proxy";
        char why[FR_ERRLEN] = "";
        rc = open_device_path(s, want, why, sizeof(why));
        if (rc && device_path) {
            fr_set_err(err, err_len, "%s", why);
            store_free(s);
            return rc;
        }
        if (rc)
            snprintf(s->reason, sizeof(s->reason), "%s", why);
        else
            s->backend = want;
    }
    *out = s;
    return 0;
}

/* Counts the caller in, unless the store is closing. */
static int enter(fr_store *s, char *err, size_t err_len)
{
    pthread_mutex_lock(&s->state_lock);
    if (atomic_load(&s->closing)) {
        pthread_mutex_unlock(&s->state_lock);
        fr_set_err(err, err_len, "store %s is closed", s->path);
        return -ECANCELED;
    }
    s->users++;
    pthread_mutex_unlock(&s->state_lock);
    return 0;
}

static void leave(fr_store *s)
{
    pthread_mutex_lock(&s->state_lock);
    if (--s->users == 0)
        pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->state_lock);
}

void fr_store_cancel(fr_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->state_lock);
    atomic_store(&s->closing, 1);
    if (s->dev)
        fr_gdev_cancel(s->dev); /* a kernel in flight sees the abort flag */
    pthread_mutex_unlock(&s->state_lock);
}

void fr_store_close(fr_store *s)
{
    if (!s)
        return;
    fr_store_cancel(s);
    pthread_mutex_lock(&s->state_lock);
    while (s->users > 0)
        pthread_cond_wait(&s->idle_cv, &s->state_lock);
    pthread_mutex_unlock(&s->state_lock);
    store_free(s);
}

const char *fr_store_backend(const fr_store *s) { return s->backend; }
const char *fr_store_backend_reason(const fr_store *s) { return s->reason; }
const char *fr_store_kernel_source(const fr_store *s)
{
    return s->dev ? fr_gdev_kernel_source(s->dev) : "";
}
const char *fr_store_device_header(void) { return fr_kernel_device_header(); }

static void add_host_counts(fr_store *s, size_t n, const fr_host_gather_counts *c, int rc)
{
    pthread_mutex_lock(&s->state_lock);
    s->stats.gathers++;
    if (rc == 0)
        s->stats.rows += n;
    s->stats.storage_reads += c->reads;
    s->stats.bytes_read += c->bytes;
    s->stats.coalesced += c->coalesced;
    pthread_mutex_unlock(&s->state_lock);
}

/* The gather itself after the cancel check; gather_lock held. */
static int host_gather_locked(fr_store *s, const void *ids, int id_bytes, size_t n, void *out,
                              size_t *bad_index, char *err, size_t err_len)
{
    if (atomic_load(&s->closing)) {
        fr_set_err(err, err_len, "gather from %s cancelled: the store is closing", s->path);
        return -ECANCELED;
    }
    fr_host_gather_counts c = {0, 0, 0};
    int rc = id_bytes == 4 ? fr_host_gather_run32(s->host, ids, n, out, bad_index, &c, err, err_len)
                           : fr_host_gather_run(s->host, ids, n, out, bad_index, &c, err, err_len);
    add_host_counts(s, n, &c, rc);
    return rc;
}

int fr_store_gather_host(fr_store *s, const int64_t *ids, size_t n, void *out, size_t *bad_index,
                         char *err, size_t err_len)
{
    int rc = enter(s, err, err_len);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->gather_lock);
    rc = host_gather_locked(s, ids, 8, n, out, bad_index, err, err_len);
    pthread_mutex_unlock(&s->gather_lock);
    leave(s);
    return rc;
}

/* Grows a page-locked host buffer (contents not kept): to the size asked
 * the first time (page-locking costs about its size: a cold gather of 1M
 * rows of 512 B on a store just opened pins 512 MiB, not 640), with a
 * quarter to spare when it grows. */
static int pinned_reserve(fr_store *s, void **p, size_t *cap, size_t want)
{
    if (*cap >= want)
        return 0;
    size_t spare = *cap ? want / 4 : 0;
    pinned_free(s, p, cap);
    size_t c = fr_round_up(want + spare, (size_t)2 << 20);
    void *m = NULL;
    if (posix_memalign(&m, 4096, c) != 0)
        return -ENOMEM;
    int rc = fr_gpu_host_register(s->gpu, m, c);
    if (rc) {
        free(m);
        return rc;
    }
    *p = m;
    *cap = c;
    return 0;
}

/* Host backend with device ids and output: ids down, gather on the host
 * into a page-locked buffer, one copy up. */
static int host_gather_device(fr_store *s, uint64_t ids, int id_bytes, size_t n, uint64_t out,
                              void *stream, size_t *bad_index, char *err, size_t err_len)
{
    size_t out_bytes = n * (size_t)s->cfg.row_bytes;
    double t[5] = {0};
    t[0] = s->timeline ? mono_us() : 0;
    int rc = pinned_reserve(s, &s->h_ids, &s->h_ids_cap, n * (size_t)id_bytes);
    if (rc == 0)
        rc = pinned_reserve(s, &s->h_out, &s->h_out_cap, out_bytes);
    t[1] = s->timeline ? mono_us() : 0;
    if (rc == 0)
        rc = fr_gpu_copy_dtoh_wait(s->gpu, s->h_ids, ids, n * (size_t)id_bytes, stream);
    if (rc) {
        fr_gpu_last_error(s->gpu, err, err_len);
        return rc;
    }
    t[2] = s->timeline ? mono_us() : 0;
    rc = host_gather_locked(s, s->h_ids, id_bytes, n, s->h_out, bad_index, err, err_len);
    if (rc)
        return rc;
    t[3] = s->timeline ? mono_us() : 0;
    rc = fr_gpu_copy_htod_wait(s->gpu, out, s->h_out, out_bytes, stream);
    if (rc)
        fr_gpu_last_error(s->gpu, err, err_len);
    if (s->timeline && rc == 0) {
        t[4] = mono_us();
        double prep = 0, reads = 0;
        fr_host_gather_last_times(s->host, &prep, &reads);
        fr_store_stats st;
        fr_store_stats_get(s, &st);
        fprintf(stderr,
                "fastread gather timeline (host path): n %zu | route %.1f us, pin %.1f, "
                "ids down %.1f, sort and plan %.1f, reads and scatter %.1f (%s, %s), copy up "
                "%.1f | total %.1f us; store so far: %llu reads, %llu bytes\n",
                n, s->route_us, t[1] - t[0], t[2] - t[1], prep, reads,
                fr_host_gather_engine(s->host), fr_host_gather_direct(s->host) ? "O_DIRECT" : "buffered",
                t[4] - t[3], s->route_us + t[4] - t[0], (unsigned long long)st.storage_reads,
                (unsigned long long)st.bytes_read);
    }
    return rc;
}

int fr_store_gather_device(fr_store *s, uint64_t ids, int id_bytes, size_t n, uint64_t out,
                           void *stream, size_t *bad_index, char *err, size_t err_len)
{
    if (id_bytes != 4 && id_bytes != 8) {
        fr_set_err(err, err_len, "ids must be int32 or int64 (id_bytes 4 or 8), got %d", id_bytes);
        return -EINVAL;
    }
    if (!s->gpu) {
        fr_set_err(err, err_len, "store %s was opened without a device (device_id < 0)", s->path);
        return -ENODEV;
    }
    int rc = enter(s, err, err_len);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->gather_lock);
    /* Backend "auto" picks a path per gather (gather_route.h); an explicit
     * backend runs as given. */
    int to_host = 0;
    if (n > 0 && s->dev && s->auto_route) {
        /* Checked first: the host path copies from ids and writes out. */
        rc = fr_gdev_check_pointers(s->dev, ids, out, err, err_len);
        if (rc) {
            pthread_mutex_unlock(&s->gather_lock);
            leave(s);
            return rc;
        }
        char why[FR_ERRLEN];
        double r0 = s->timeline ? mono_us() : 0;
        to_host = fr_gdev_route(s->dev, ids, id_bytes, n, stream, why, sizeof(why));
        s->route_us = s->timeline ? mono_us() - r0 : 0;
        pthread_mutex_lock(&s->state_lock);
        snprintf(s->route, sizeof(s->route), "%s", why);
        s->stats.host_routed += (uint64_t)to_host;
        pthread_mutex_unlock(&s->state_lock);
    }
    if (n == 0) {
        rc = 0;
    } else if (s->dev && !to_host) {
        fr_store_stats d;
        memset(&d, 0, sizeof(d));
        rc = fr_gdev_gather(s->dev, ids, id_bytes, n, out, stream, bad_index, &d, err, err_len);
        pthread_mutex_lock(&s->state_lock);
        s->stats.gathers++;
        if (rc == 0)
            s->stats.rows += n;
        s->stats.cache_hits += d.cache_hits;
        s->stats.cache_misses += d.cache_misses;
        s->stats.coalesced += d.coalesced;
        s->stats.host_tier_rows += d.host_tier_rows;
        s->stats.direct_rows += d.direct_rows;
        s->stats.storage_reads += d.storage_reads;
        s->stats.mapped_reads += d.mapped_reads;
        s->stats.bytes_read += d.bytes_read;
        s->stats.evictions += d.evictions;
        s->stats.row_hits += d.row_hits;
        s->stats.admitted += d.admitted;
        pthread_mutex_unlock(&s->state_lock);
    } else {
        rc = host_gather_device(s, ids, id_bytes, n, out, stream, bad_index, err, err_len);
    }
    pthread_mutex_unlock(&s->gather_lock);
    leave(s);
    return rc;
}

void fr_store_stats_get(fr_store *s, fr_store_stats *out)
{
    pthread_mutex_lock(&s->state_lock);
    *out = s->stats;
    pthread_mutex_unlock(&s->state_lock);
}

void fr_store_route_get(fr_store *s, char *buf, size_t len)
{
    if (!len)
        return;
    pthread_mutex_lock(&s->state_lock);
    snprintf(buf, len, "%s", s->route);
    pthread_mutex_unlock(&s->state_lock);
}

const char *fr_store_route_rule(void) { return FR_ROUTE_RULE; }

unsigned fr_store_calls_in_flight(fr_store *s)
{
    pthread_mutex_lock(&s->state_lock);
    unsigned users = s->users;
    pthread_mutex_unlock(&s->state_lock);
    return users;
}

void fr_store_memory_get(fr_store *s, fr_store_memory *out)
{
    memset(out, 0, sizeof(*out));
    /* Under gather_lock: the buffers it reports grow during a gather. */
    pthread_mutex_lock(&s->gather_lock);
    out->host_buffers = fr_host_gather_bytes(s->host) + s->h_ids_cap + s->h_out_cap;
    if (s->dev)
        fr_gdev_memory(s->dev, out);
    pthread_mutex_unlock(&s->gather_lock);
}

uint64_t fr_store_device_view(fr_store *s) { return s->dev ? fr_gdev_view(s->dev) : 0; }

int fr_store_device_serve(fr_store *s, int on, char *err, size_t err_len)
{
    if (!s->dev) {
        fr_set_err(err, err_len, "store %s has no device path (backend %s)", s->path, s->backend);
        return -ENODEV;
    }
    int rc = enter(s, err, err_len);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->gather_lock);
    rc = fr_gdev_serve(s->dev, on, err, err_len);
    pthread_mutex_unlock(&s->gather_lock);
    leave(s);
    return rc;
}
