/*
 * A stand-in for the CUDA driver (libcuda.so.1) and cuFile (libcufile.so.0)
 * so the GPU plumbing runs, under ASan, on machines without a GPU. "Device
 * memory" is host memory from malloc, so a test can check bytes with memcmp
 * and ASan sees any overflow. The stand-in also checks what the real driver
 * would refuse (no current context, double pinning, unknown pointers) and
 * counts live objects, so tests can prove nothing leaks.
 *
 * Built twice from this file, as libcuda.so.1 and libcufile.so.0, for tests
 * only; never installed. Each copy has its own counters: ask libcuda for
 * driver objects and libcufile for cuFile handles and registrations.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "gather/device/fastread_device.cuh"

#define EXPORT __attribute__((visibility("default")))
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

typedef struct pin {
    void *p;
    size_t len;
    struct pin *next;
} pin;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pin *pins;
static pin *allocs; /* device allocations, for cuPointerGetAttribute */
static long live_allocs, live_pins, live_streams, live_handles, live_bufregs, ctx_refs;
static long live_hostallocs, live_modules, launches, orders, admits, agings;
static long register_attempts;
static long pageable_copies, pinned_copies;
static _Thread_local int ctx_depth;

EXPORT long mock_cuda_live(const char *what)
{
    pthread_mutex_lock(&lock);
    long v = !strcmp(what, "allocs")          ? live_allocs
             : !strcmp(what, "pins")          ? live_pins
             : !strcmp(what, "streams")       ? live_streams
             : !strcmp(what, "handles")       ? live_handles
             : !strcmp(what, "bufregs")       ? live_bufregs
             : !strcmp(what, "register_attempts") ? register_attempts
             : !strcmp(what, "contexts")      ? ctx_refs
             : !strcmp(what, "pageable_copies") ? pageable_copies
             : !strcmp(what, "pinned_copies") ? pinned_copies
             : !strcmp(what, "hostallocs")    ? live_hostallocs
             : !strcmp(what, "modules")       ? live_modules
             : !strcmp(what, "launches")      ? launches
             : !strcmp(what, "orders")        ? orders
             : !strcmp(what, "admits")        ? admits
             : !strcmp(what, "agings")        ? agings
                                              : -1;
    pthread_mutex_unlock(&lock);
    return v;
}

static int devices(void)
{
    const char *s = getenv("MOCK_CUDA_DEVICES");
    return s ? atoi(s) : 1;
}

/* NVRTC 13 loads the driver and asks for its private export tables; a
 * driver may refuse (CUDA_ERROR_NOT_SUPPORTED), and NVRTC then compiles
 * without them. Without this entry point NVRTC crashes under the mock. */
EXPORT int cuGetExportTable(const void **table, const void *uuid)
{
    (void)uuid;
    *table = NULL;
    return 801;
}

EXPORT int cuInit(unsigned f) { (void)f; return devices() ? 0 : 100; }
EXPORT int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
EXPORT int cuDeviceGetCount(int *c) { *c = devices(); return 0; }
EXPORT int cuDeviceGet(int *d, int o) { *d = o; return o < devices() ? 0 : 101; }

EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    *ctx = (void *)(intptr_t)(d + 1);
    pthread_mutex_lock(&lock);
    ctx_refs++;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuDevicePrimaryCtxRelease_v2(int d)
{
    (void)d;
    pthread_mutex_lock(&lock);
    ctx_refs--;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuCtxPushCurrent_v2(void *ctx) { (void)ctx; ctx_depth++; return 0; }

EXPORT int cuCtxPopCurrent_v2(void **ctx)
{
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_depth--;
    *ctx = NULL;
    return 0;
}

static int is_pinned(const void *p, size_t len)
{
    pthread_mutex_lock(&lock);
    int found = 0;
    for (pin *x = pins; x; x = x->next)
        if ((const char *)p >= (char *)x->p && (const char *)p + len <= (char *)x->p + x->len)
            found = 1;
    pthread_mutex_unlock(&lock);
    return found;
}

/* Tracked memory (pinned ranges, host allocations, device allocations):
 * one list each, a live count each, all under `lock`. */
static int track_add(pin **list, long *live, void *p, size_t len)
{
    pin *x = malloc(sizeof(*x));
    if (!x)
        return -1;
    x->p = p;
    x->len = len;
    pthread_mutex_lock(&lock);
    x->next = *list;
    *list = x;
    (*live)++;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* 1 if p was tracked on list (and is no longer), else 0. */
static int track_remove(pin **list, long *live, const void *p)
{
    pthread_mutex_lock(&lock);
    for (pin **at = list; *at; at = &(*at)->next) {
        if ((*at)->p == p) {
            pin *x = *at;
            *at = x->next;
            free(x);
            (*live)--;
            pthread_mutex_unlock(&lock);
            return 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuMemHostRegister_v2(void *p, size_t len, unsigned flags)
{
    (void)flags;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (is_pinned(p, 1))
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    memset(p, 0, len); /* the real driver faults every page in */
    return track_add(&pins, &live_pins, p, len) ? CUDA_ERROR_OUT_OF_MEMORY : 0;
}

EXPORT int cuMemHostUnregister(void *p)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    return track_remove(&pins, &live_pins, p) ? 0 : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

EXPORT int cuMemAlloc_v2(unsigned long long *p, size_t n)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    const char *limit = getenv("MOCK_CUDA_MEM_LIMIT");
    if (limit && n > strtoull(limit, NULL, 10))
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *m = malloc(n);
    if (!m || track_add(&allocs, &live_allocs, m, n)) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (uintptr_t)m;
    return 0;
}

EXPORT int cuMemFree_v2(unsigned long long p)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!track_remove(&allocs, &live_allocs, (void *)(uintptr_t)p))
        return CUDA_ERROR_INVALID_VALUE; /* as the driver: not ours to free */
    free((void *)(uintptr_t)p);
    return 0;
}

static void count_copy(const void *host, size_t n)
{
    int pinned = is_pinned(host, n);
    pthread_mutex_lock(&lock);
    if (pinned)
        pinned_copies++;
    else
        pageable_copies++;
    pthread_mutex_unlock(&lock);
}

/* A copy engine's transfer: aligned words land whole (a device thread
 * polling a flag reads the old value or the new one, never half of each),
 * and in order with what the stream did before. Emulated with atomic word
 * stores (release) and loads (acquire): with plain memcpy, the emulated
 * kernels' atomic reads of words the host copies in (epoch_now, ring
 * cells) were data races in ThreadSanitizer's eyes, and in C's. */
static void dma(void *dst, const void *src, size_t n)
{
    uintptr_t both = (uintptr_t)dst | (uintptr_t)src | n;
    if ((both & 7) == 0) {
        for (size_t i = 0; i < n / 8; i++)
            __atomic_store_n((uint64_t *)dst + i,
                             __atomic_load_n((const uint64_t *)src + i, __ATOMIC_ACQUIRE),
                             __ATOMIC_RELEASE);
    } else if ((both & 3) == 0) {
        for (size_t i = 0; i < n / 4; i++)
            __atomic_store_n((uint32_t *)dst + i,
                             __atomic_load_n((const uint32_t *)src + i, __ATOMIC_ACQUIRE),
                             __ATOMIC_RELEASE);
    } else {
        memcpy(dst, src, n);
    }
}

EXPORT int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    dma((void *)(uintptr_t)dst, src, n);
    return 0;
}

EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s)
{
    (void)s;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    count_copy(src, n);
    dma((void *)(uintptr_t)dst, src, n);
    return 0;
}

EXPORT int cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *s)
{
    (void)s;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    count_copy(dst, n);
    dma(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

EXPORT int cuStreamCreate(void **s, unsigned flags)
{
    (void)flags;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    *s = malloc(1);
    pthread_mutex_lock(&lock);
    live_streams++;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuStreamDestroy_v2(void *s)
{
    free(s);
    pthread_mutex_lock(&lock);
    live_streams--;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuStreamSynchronize(void *s) { (void)s; return ctx_depth ? 0 : CUDA_ERROR_INVALID_CONTEXT; }

EXPORT int cuGetErrorString(int r, const char **s)
{
    *s = r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory (mock)" : "mock CUDA error";
    return 0;
}

/* ---- the device path of row gathers (gather_device*.c) ---- */

static int fr_gather_rows_host(void **params, unsigned threads);
static int fr_order_count_host(void **params, unsigned threads);
static int fr_order_place_host(void **params, unsigned threads);
static int fr_rows_admit_host(void **params, unsigned threads);
static int fr_rows_age_host(void **params, unsigned threads);

EXPORT int cuMemHostAlloc(void **pp, size_t n, unsigned flags)
{
    (void)flags;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    void *m = NULL;
    if (posix_memalign(&m, 4096, n ? n : 1) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (track_add(&pins, &live_hostallocs, m, n)) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = m;
    return 0;
}

EXPORT int cuMemFreeHost(void *p)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!track_remove(&pins, &live_hostallocs, p))
        return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return 0;
}

/* Mapped host memory has the same address on the "device". */
EXPORT int cuMemHostGetDevicePointer_v2(unsigned long long *d, void *p, unsigned flags)
{
    (void)flags;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!is_pinned(p, 1))
        return CUDA_ERROR_INVALID_VALUE;
    *d = (uintptr_t)p;
    return 0;
}

/* A module is accepted if it looks like PTX or an ELF cubin;
 * MOCK_CUDA_MODULE_REFUSE makes it fail as a driver too old for the PTX. */
EXPORT int cuModuleLoadData(void **m, const void *image)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (getenv("MOCK_CUDA_MODULE_REFUSE"))
        return 222; /* CUDA_ERROR_UNSUPPORTED_PTX_VERSION */
    const char *s = image;
    if (!(memcmp(s, "\x7f" "ELF", 4) == 0 || strstr(s, ".version") != NULL))
        return 200; /* CUDA_ERROR_INVALID_IMAGE */
    *m = malloc(1);
    pthread_mutex_lock(&lock);
    live_modules++;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuModuleUnload(void *m)
{
    free(m);
    pthread_mutex_lock(&lock);
    live_modules--;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuModuleGetFunction(void **f, void *m, const char *name)
{
    (void)m;
    if (strcmp(name, "fr_gather_rows") == 0)
        *f = (void *)fr_gather_rows_host;
    else if (strcmp(name, "fr_order_count") == 0)
        *f = (void *)fr_order_count_host;
    else if (strcmp(name, "fr_order_place") == 0)
        *f = (void *)fr_order_place_host;
    else if (strcmp(name, "fr_rows_admit") == 0)
        *f = (void *)fr_rows_admit_host;
    else if (strcmp(name, "fr_rows_age") == 0)
        *f = (void *)fr_rows_age_host;
    else
        return 500; /* CUDA_ERROR_NOT_FOUND */
    return 0;
}

EXPORT int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)dev;
    const char *cc = getenv("MOCK_CUDA_CC"); /* e.g. "90" */
    int c = cc ? atoi(cc) : 90;
    switch (attr) {
    case 16: *v = 4; return 0;      /* multiprocessors */
    case 19: *v = 1; return 0;      /* can map host memory */
    case 75: *v = c / 10; return 0; /* compute capability */
    case 76: *v = c % 10; return 0;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

EXPORT int cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    const char *f = getenv("MOCK_CUDA_FREE_MEM");
    *free_b = f ? (size_t)strtoull(f, NULL, 10) : (size_t)16 << 30;
    *total = *free_b;
    return 0;
}

/* Device ordinal of a cuMemAlloc'ed address (MOCK_CUDA_POINTER_DEVICE
 * pretends it is on another GPU); unknown addresses are refused. */
EXPORT int cuPointerGetAttribute(void *data, int attr, unsigned long long ptr)
{
    if (attr != 9)
        return CUDA_ERROR_INVALID_VALUE;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (pin *x = allocs; x; x = x->next)
        if ((char *)(uintptr_t)ptr >= (char *)x->p && (char *)(uintptr_t)ptr < (char *)x->p + x->len)
            found = 1;
    pthread_mutex_unlock(&lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    const char *d = getenv("MOCK_CUDA_POINTER_DEVICE");
    *(int *)data = d ? atoi(d) : 0;
    return 0;
}

EXPORT int cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    memset((void *)(uintptr_t)p, v, n);
    return 0;
}

EXPORT int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    dma(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* Events: a host clock reading at record time (work is synchronous here).
 * MOCK_CUDA_EVENT_BUSY=N makes cuEventQuery answer "not ready" N times after
 * each record (until a cuEventSynchronize), as a copy still running would:
 * for tests that memory is not reused before its copy's event is done. */
typedef struct mock_event {
    struct timespec at; /* first: cuEventElapsedTime reads it */
    long busy_polls;
} mock_event;

EXPORT int cuEventCreate(void **ev, unsigned flags)
{
    (void)flags;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    *ev = calloc(1, sizeof(mock_event));
    return *ev ? 0 : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT int cuEventRecord(void *ev, void *s)
{
    (void)s;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    mock_event *e = ev;
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    const char *busy = getenv("MOCK_CUDA_EVENT_BUSY");
    e->busy_polls = busy ? atol(busy) : 0;
    return 0;
}
EXPORT int cuEventSynchronize(void *ev)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    ((mock_event *)ev)->busy_polls = 0;
    return 0;
}
EXPORT int cuEventQuery(void *ev)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    mock_event *e = ev;
    if (e->busy_polls > 0) {
        e->busy_polls--;
        return 600; /* CUDA_ERROR_NOT_READY */
    }
    return 0;
}
EXPORT int cuEventElapsedTime(float *ms, void *a, void *b)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    const struct timespec *x = a, *y = b;
    *ms = (float)((double)(y->tv_sec - x->tv_sec) * 1e3 + (double)(y->tv_nsec - x->tv_nsec) * 1e-6);
    return 0;
}
EXPORT int cuEventDestroy_v2(void *ev)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    free(ev);
    return 0;
}

/* cuLaunchKernel runs fr_gather_rows on host threads, one row at a time per
 * thread through the header's own cache and ring code (fr_dev_read_row):
 * the warp-level grouping is the only part of the kernel it leaves out. */
typedef struct emu {
    const fr_dev_store *s;
    const void *ids;
    int id_bytes;
    unsigned long long n;
    uint8_t *out;
    const unsigned *order;
    unsigned k, nthreads;
} emu;

static void emu_error(const fr_dev_store *s, int rc)
{
    int32_t zero = 0;
    __atomic_compare_exchange_n(&s->result->error, &zero, rc, 0, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
}

/* Fetched rows counted and listed for the hot-row cache, as the kernel's
 * fr_dev_fetch_rows_warp does once its cell is released (one row at a time:
 * no warp here groups lanes wanting one row). */
static void emu_list(const fr_dev_store *s, const uint64_t *ids, const uint64_t *pos, uint32_t n,
                     uint32_t epoch)
{
    if (!epoch || !s->rowc.tags)
        return;
    uint32_t from = __atomic_load_n(&s->result->rows_list_from, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n; i++)
        if (fr_rows_mark(&s->rowc, ids[i], fr_rows_note(&s->rowc, ids[i], 1), epoch, from))
            fr_rows_put(&s->rowc, __atomic_fetch_add(s->rowc.adm_n, 1, __ATOMIC_SEQ_CST), ids[i],
                        pos[i]);
}

static void *emu_thread(void *p)
{
    emu *e = p;
    const fr_dev_store *s = e->s;
    fr_dev_counts cnt;
    memset(&cnt, 0, sizeof(cnt));
    /* Row fetches go as row lists of up to 5 rows (as a warp's do, with a
     * count that exercises partial and full lists of the host's side). */
    uint64_t fids[5], fpos[5];
    uint8_t *fdst[5];
    uint32_t nf = 0, maxf = 5;
    if (fr_ring_rows_per_request(&s->fetch.ring, s->row_bytes) < maxf)
        maxf = fr_ring_rows_per_request(&s->fetch.ring, s->row_bytes);
    /* The kernel's pin epoch: pinned pages are read with no reference. */
    uint32_t epoch = s->cache.pins ? __atomic_load_n(&s->result->epoch, __ATOMIC_ACQUIRE) : 0;
    int fetch_rows = __atomic_load_n(&s->result->fetch_rows, __ATOMIC_ACQUIRE) != 0;
    for (unsigned long long i = e->k; i < e->n; i += e->nthreads) {
        if (fr_dev_aborted(s) || __atomic_load_n(&s->result->error, __ATOMIC_ACQUIRE))
            break;
        unsigned long long pos = e->order ? e->order[i] : i;
        int64_t id = fr_load_id(e->ids, e->id_bytes, pos);
        int rc;
        /* Hot rows, as the kernel looks them up: after the host tier, for
         * fastread's own gathers (epoch), plain loads, the reference bit. */
        if (epoch && s->rowc.tags && id >= 0 && (uint64_t)id < s->rows &&
            !(s->host_rows && (!s->host_slot || s->host_slot[id] >= 0))) {
            uint64_t tag;
            int64_t rs = fr_rows_find(&s->rowc, (uint64_t)id, &tag);
            if (rs >= 0) {
                memcpy(e->out + pos * s->row_bytes, s->rowc.data + (uint64_t)rs * s->row_bytes,
                       s->row_bytes);
                if (!(tag & FR_RTAG_REF))
                    fr_rows_hit_first(&s->rowc, rs, (uint64_t)id, tag);
                cnt.c[FR_CNT_ROW_HITS]++;
                continue;
            }
        }
        /* Row fetches as the kernel does them: rows of absent pages that the
         * host tier does not hold. */
        if (fetch_rows && id >= 0 && (uint64_t)id < s->rows &&
            !(s->host_rows && (!s->host_slot || s->host_slot[id] >= 0)) &&
            __atomic_load_n(&s->cache.page_table[(uint64_t)id / s->rows_per_page],
                            __ATOMIC_ACQUIRE) == 0)
        {
            fids[nf] = (uint64_t)id;
            fpos[nf] = pos;
            fdst[nf++] = e->out + pos * s->row_bytes;
            rc = 0;
            if (nf == maxf) {
                rc = fr_dev_fetch_rows(s, fids, nf, fdst, &cnt);
                if (rc == 0)
                    emu_list(s, fids, fpos, nf, epoch);
                nf = 0;
            }
        } else
            rc = fr_dev_read_row_e(s, id, e->out + pos * s->row_bytes, &cnt, epoch);
        if (rc == FR_DEV_ERANGE) {
            uint64_t cur = __atomic_load_n(&s->result->first_bad, __ATOMIC_SEQ_CST);
            while (pos < cur && !__atomic_compare_exchange_n(&s->result->first_bad, &cur, pos, 0,
                                                           __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                ;
        } else if (rc) {
            emu_error(s, rc);
        }
    }
    if (nf) {
        int rc = fr_dev_fetch_rows(s, fids, nf, fdst, &cnt);
        if (rc)
            emu_error(s, rc);
        else
            emu_list(s, fids, fpos, nf, epoch);
    }
    for (int c = 0; c < FR_NCOUNTERS; c++)
        __atomic_fetch_add(&s->result->counters[c], cnt.c[c], __ATOMIC_SEQ_CST);
    return NULL;
}

static int fr_gather_rows_host(void **params, unsigned threads)
{
    emu e[8];
    pthread_t th[8];
    unsigned t = threads < 8 ? threads : 8;
    if (t == 0)
        t = 1;
    for (unsigned k = 0; k < t; k++) {
        e[k].s = (const fr_dev_store *)(uintptr_t)*(uint64_t *)params[0];
        e[k].ids = (const void *)(uintptr_t)*(uint64_t *)params[1];
        e[k].id_bytes = *(int *)params[2];
        e[k].n = *(unsigned long long *)params[3];
        e[k].out = (uint8_t *)(uintptr_t)*(uint64_t *)params[4];
        e[k].order = (const unsigned *)(uintptr_t)*(uint64_t *)params[5];
        e[k].k = k;
        e[k].nthreads = t;
        if (pthread_create(&th[k], NULL, emu_thread, &e[k]) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (unsigned k = 0; k < t; k++)
        pthread_join(th[k], NULL);
    return 0;
}

/* The locality-order kernels, serially, through the header's bucket rule.
 * Both take (ids, id_bytes, n, rows, shift, nbuckets, counts, ...). */
typedef struct order_args {
    const void *ids;
    int id_bytes;
    unsigned long long n, rows;
    unsigned shift, nb;
} order_args;

static int order_args_of(void **params, order_args *a)
{
    a->ids = (const void *)(uintptr_t)*(uint64_t *)params[0];
    a->id_bytes = *(int *)params[1];
    a->n = *(unsigned long long *)params[2];
    a->rows = *(unsigned long long *)params[3];
    a->shift = *(unsigned *)params[4];
    a->nb = *(unsigned *)params[5];
    return a->nb == 0 || a->nb > FR_ORDER_MAX_BUCKETS ? CUDA_ERROR_INVALID_VALUE : 0;
}

static unsigned order_bucket_of(const order_args *a, unsigned long long i)
{
    return fr_order_bucket(fr_load_id(a->ids, a->id_bytes, i), a->rows, a->shift, a->nb);
}

static int fr_order_count_host(void **params, unsigned threads)
{
    (void)threads;
    order_args a;
    if (order_args_of(params, &a))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned *counts = (unsigned *)(uintptr_t)*(uint64_t *)params[6];
    for (unsigned long long i = 0; i < a.n; i++)
        counts[order_bucket_of(&a, i)]++;
    return 0;
}

static int fr_order_place_host(void **params, unsigned threads)
{
    (void)threads;
    order_args a;
    if (order_args_of(params, &a))
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned *counts = (const unsigned *)(uintptr_t)*(uint64_t *)params[6];
    unsigned *fill = (unsigned *)(uintptr_t)*(uint64_t *)params[7];
    unsigned *order = (unsigned *)(uintptr_t)*(uint64_t *)params[8];
    unsigned start[FR_ORDER_MAX_BUCKETS];
    unsigned acc = 0;
    for (unsigned b = 0; b < a.nb; b++) {
        start[b] = acc;
        acc += counts[b];
    }
    if (acc != a.n)
        return CUDA_ERROR_INVALID_VALUE; /* counts not from fr_order_count */
    /* Last id first: a test that forgets to use the order sees rows moved. */
    for (unsigned long long i = a.n; i-- > 0;) {
        unsigned b = order_bucket_of(&a, i);
        order[start[b] + fill[b]++] = (unsigned)i;
    }
    pthread_mutex_lock(&lock);
    orders++;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* fr_rows_age: every sketch counter halved, the doorkeeper emptied (view). */
static int fr_rows_age_host(void **params, unsigned threads)
{
    (void)threads;
    const fr_dev_store *s = (const fr_dev_store *)(uintptr_t)*(uint64_t *)params[0];
    const fr_dev_rows *r = &s->rowc;
    if (!r->tags)
        return 0;
    for (uint64_t i = 0; i < 2ull * ((uint64_t)r->width_mask + 1); i++)
        r->sketch[i] >>= 1;
    memset(r->door, 0, ((size_t)r->door_mask + 1) * 4);
    pthread_mutex_lock(&lock);
    agings++;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* fr_rows_admit on 4 host threads (as the GPU runs every candidate at
 * once, so that sets contended by several candidates are exercised),
 * through the header's policy: (view, out). */
typedef struct admit_arg {
    const fr_dev_store *s;
    const uint8_t *out;
    uint64_t n, k, nthreads, admitted, filled;
    uint32_t floor; /* fr_rows_pass_floor */
} admit_arg;

static void *admit_thread(void *p)
{
    admit_arg *a = p;
    const fr_dev_rows *r = &a->s->rowc;
    for (uint64_t i = a->k; i < a->n; i += a->nthreads) {
        int got = fr_rows_admit_one(r, a->s->row_bytes, r->adm[2 * i],
                                    a->out + r->adm[2 * i + 1] * a->s->row_bytes, a->floor);
        a->admitted += got != FR_ROWS_OUT;
        a->filled += got == FR_ROWS_FILLED;
    }
    return NULL;
}

static int fr_rows_admit_host(void **params, unsigned threads)
{
    (void)threads;
    const fr_dev_store *s = (const fr_dev_store *)(uintptr_t)*(uint64_t *)params[0];
    const uint8_t *out = (const uint8_t *)(uintptr_t)*(uint64_t *)params[1];
    const fr_dev_rows *r = &s->rowc;
    if (!r->tags)
        return 0;
    if (__atomic_load_n(&s->result->error, __ATOMIC_ACQUIRE) != 0)
        return 0;
    uint64_t n = __atomic_load_n(r->adm_n, __ATOMIC_ACQUIRE);
    uint32_t floor = fr_rows_pass_floor(r, n);
    if (n > r->adm_cap)
        n = r->adm_cap;
    enum { T = 4 };
    admit_arg a[T];
    pthread_t th[T];
    unsigned started = 0;
    for (unsigned k = 0; k < T; k++) {
        a[k] = (admit_arg){.s = s, .out = out, .n = n, .k = k, .nthreads = T, .floor = floor};
        if (pthread_create(&th[k], NULL, admit_thread, &a[k]) != 0)
            break;
        started++;
    }
    uint64_t mine = 0, filled = 0;
    for (unsigned k = 0; k < started; k++) {
        pthread_join(th[k], NULL);
        mine += a[k].admitted;
        filled += a[k].filled;
    }
    __atomic_fetch_add(&s->result->counters[FR_CNT_ADMITTED], mine, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&s->result->row_fills, filled, __ATOMIC_SEQ_CST);
    if (started < T)
        return CUDA_ERROR_OUT_OF_MEMORY; /* threads refused: the rows the others took are in */
    pthread_mutex_lock(&lock);
    admits++;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shmem, void *stream, void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shmem; (void)stream; (void)extra;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bx == 0 || gx == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (f == (void *)fr_order_count_host)
        return fr_order_count_host(params, gx * bx);
    if (f == (void *)fr_order_place_host)
        return fr_order_place_host(params, gx * bx);
    if (f == (void *)fr_rows_admit_host)
        return fr_rows_admit_host(params, gx * bx);
    if (f == (void *)fr_rows_age_host)
        return fr_rows_age_host(params, gx * bx);
    if (f != (void *)fr_gather_rows_host || bx % 32 != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    launches++;
    pthread_mutex_unlock(&lock);
    /* Up to 8 host threads stand for the grid's warps. */
    return fr_gather_rows_host(params, (gx * bx) / 32);
}

/* ---- cuFile ---- */
typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } CUfileDescr_t;

EXPORT CUfileError_t cuFileDriverOpen(void) { CUfileError_t e = {0, 0}; return e; }

EXPORT CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d)
{
    CUfileError_t e = {0, 0};
    pthread_mutex_lock(&lock);
    register_attempts++;
    pthread_mutex_unlock(&lock);
    /* The real library refuses descriptors with O_NONBLOCK. */
    int fl = d->handle.fd >= 0 ? fcntl(d->handle.fd, F_GETFL) : -1;
    if (d->type != 1 || fl < 0 || (fl & O_NONBLOCK)) {
        e.err = 5001;
        return e;
    }
    /* MOCK_CUFILE_REFUSE_FILES=substring: refuse files whose path holds it
     * ("/" refuses all), as cuFile refuses a file system it cannot place. */
    const char *refuse = getenv("MOCK_CUFILE_REFUSE_FILES");
    if (refuse) {
        char link[64], path[4096];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", d->handle.fd);
        ssize_t n = readlink(link, path, sizeof(path) - 1);
        path[n > 0 ? n : 0] = 0;
        if (strstr(path, refuse)) {
            e.err = 5030;
            return e;
        }
    }
    int *h = malloc(sizeof(int));
    *h = d->handle.fd;
    *fh = h;
    pthread_mutex_lock(&lock);
    live_handles++;
    pthread_mutex_unlock(&lock);
    return e;
}

EXPORT void cuFileHandleDeregister(void *fh)
{
    free(fh);
    pthread_mutex_lock(&lock);
    live_handles--;
    pthread_mutex_unlock(&lock);
}

EXPORT CUfileError_t cuFileBufRegister(const void *p, size_t len, int flags)
{
    (void)p; (void)len; (void)flags;
    CUfileError_t e = {0, 0};
    if (getenv("MOCK_CUFILE_REFUSE_BUFREG")) {
        e.err = 5008;
        return e;
    }
    pthread_mutex_lock(&lock);
    live_bufregs++;
    pthread_mutex_unlock(&lock);
    return e;
}

EXPORT CUfileError_t cuFileBufDeregister(const void *p)
{
    (void)p;
    CUfileError_t e = {0, 0};
    pthread_mutex_lock(&lock);
    live_bufregs--;
    pthread_mutex_unlock(&lock);
    return e;
}

EXPORT ssize_t cuFileRead(void *fh, void *base, size_t size, off_t off, off_t dev_off)
{
    /* No context check: this copy of the file is libcufile, whose
     * thread-local ctx_depth is not the driver's. */
    int fd = *(int *)fh;
    size_t done = 0;
    while (done < size) {
        ssize_t r = pread(fd, (char *)base + dev_off + done, size - done, off + (off_t)done);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}
