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
static long live_allocs, live_pins, live_streams, live_handles, live_bufregs, ctx_refs;
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
                                              : -1;
    pthread_mutex_unlock(&lock);
    return v;
}

static int devices(void)
{
    const char *s = getenv("MOCK_CUDA_DEVICES");
    return s ? atoi(s) : 1;
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

EXPORT int cuMemHostRegister_v2(void *p, size_t len, unsigned flags)
{
    (void)flags;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (is_pinned(p, 1))
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    pin *x = malloc(sizeof(*x));
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0, len); /* the real driver faults every page in */
    x->p = p;
    x->len = len;
    pthread_mutex_lock(&lock);
    x->next = pins;
    pins = x;
    live_pins++;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuMemHostUnregister(void *p)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    for (pin **at = &pins; *at; at = &(*at)->next) {
        if ((*at)->p == p) {
            pin *x = *at;
            *at = x->next;
            free(x);
            live_pins--;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

EXPORT int cuMemAlloc_v2(unsigned long long *p, size_t n)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    const char *limit = getenv("MOCK_CUDA_MEM_LIMIT");
    if (limit && n > strtoull(limit, NULL, 10))
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *m = malloc(n);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (uintptr_t)m;
    pthread_mutex_lock(&lock);
    live_allocs++;
    pthread_mutex_unlock(&lock);
    return 0;
}

EXPORT int cuMemFree_v2(unsigned long long p)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    free((void *)(uintptr_t)p);
    pthread_mutex_lock(&lock);
    live_allocs--;
    pthread_mutex_unlock(&lock);
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

EXPORT int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n)
{
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s)
{
    (void)s;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    count_copy(src, n);
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

EXPORT int cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *s)
{
    (void)s;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    count_copy(dst, n);
    memcpy(dst, (void *)(uintptr_t)src, n);
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
