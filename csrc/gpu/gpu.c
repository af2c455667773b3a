/*
 * fr_gpu: one CUDA device through the driver API, and cuFile, both loaded
 * with dlopen when first asked for, so that the library builds and runs
 * without CUDA. Each fr_gpu holds its own library handles and function
 * pointers (dlopen reference-counts the libraries): no global state.
 *
 * The driver API rather than the runtime: libcuda.so.1 comes with every
 * driver, whatever toolkit (if any) is installed, and its primary context is
 * the one the runtime (CuPy, PyTorch, DALI) uses, so memory we allocate and
 * pin is theirs to use too.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base.h"
#include "gpu/gpu.h"

typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_NOT_READY 600

/* The driver entry points we use, by their exported (versioned) names. */
typedef struct cuda_api {
    fr_CUresult (*cuInit)(unsigned int);
    fr_CUresult (*cuDriverGetVersion)(int *);
    fr_CUresult (*cuDeviceGetCount)(int *);
    fr_CUresult (*cuDeviceGet)(CUdevice *, int);
    fr_CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    fr_CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
    fr_CUresult (*cuCtxPushCurrent_v2)(CUcontext);
    fr_CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
    fr_CUresult (*cuMemHostRegister_v2)(void *, size_t, unsigned int);
    fr_CUresult (*cuMemHostUnregister)(void *);
    fr_CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    fr_CUresult (*cuMemFree_v2)(CUdeviceptr);
    fr_CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t);
    fr_CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void *, size_t, fr_CUstream);
    fr_CUresult (*cuMemcpyDtoHAsync_v2)(void *, CUdeviceptr, size_t, fr_CUstream);
    fr_CUresult (*cuStreamCreate)(fr_CUstream *, unsigned int);
    fr_CUresult (*cuStreamDestroy_v2)(fr_CUstream);
    fr_CUresult (*cuStreamSynchronize)(fr_CUstream);
    fr_CUresult (*cuGetErrorString)(fr_CUresult, const char **);
} cuda_api;

/* What row gathers' device path adds (gather_device.c). Loaded at open like
 * the rest, but optional: a driver without one of them still runs the
 * readers, and the device path says which entry point is missing. */
typedef struct cuda_gather_api {
    fr_CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
    fr_CUresult (*cuMemFreeHost)(void *);
    fr_CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr *, void *, unsigned int);
    fr_CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    fr_CUresult (*cuModuleUnload)(CUmodule);
    fr_CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    fr_CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, fr_CUstream, void **, void **);
    fr_CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    fr_CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
    fr_CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
    fr_CUresult (*cuMemsetD8_v2)(CUdeviceptr, unsigned char, size_t);
    fr_CUresult (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t);
} cuda_gather_api;

/* Events, for the gather's timeline (FASTREAD_GATHER_TIMELINE): optional, a
 * driver without them only loses the kernel's own time. */
typedef struct CUevent_st *CUevent;
typedef struct cuda_event_api {
    fr_CUresult (*cuEventCreate)(CUevent *, unsigned int);
    fr_CUresult (*cuEventRecord)(CUevent, fr_CUstream);
    fr_CUresult (*cuEventSynchronize)(CUevent);
    fr_CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    fr_CUresult (*cuEventDestroy_v2)(CUevent);
    fr_CUresult (*cuEventQuery)(CUevent);
} cuda_event_api;

typedef struct cufile_api {
    fr_CUfileError (*cuFileDriverOpen)(void);
    fr_CUfileError (*cuFileHandleRegister)(fr_CUfileHandle *, fr_CUfileDescr *);
    void (*cuFileHandleDeregister)(fr_CUfileHandle);
    fr_CUfileError (*cuFileBufRegister)(const void *, size_t, int);
    fr_CUfileError (*cuFileBufDeregister)(const void *);
    ssize_t (*cuFileRead)(fr_CUfileHandle, void *, size_t, off_t, off_t);
} cufile_api;

#define SYM(api, name) {#name, (void **)&(api).name}
typedef struct sym {
    const char *name;
    void **slot;
} sym;

struct fr_gpu {
    pthread_mutex_t lock;
    /* Held while libcufile is loaded (fr_gpu_cufile): one loader at a time,
     * the others wait for its outcome. Not `lock`: loading takes it to
     * record a driver error (record_error). */
    pthread_mutex_t cufile_lock;
    unsigned refs;
    int device;
    CUdevice dev;
    CUcontext ctx;
    void *libcuda;
    cuda_api cu;
    cuda_gather_api cg;
    cuda_event_api ev;
    int ev_rc; /* 0: ev loaded */
    int cg_rc; /* 0: cg loaded; else -ENOSYS, why in cg_why */
    char cg_why[FR_ERRLEN];
    char last_error[FR_ERRLEN];

    int cufile_rc; /* 1: not tried yet; 0: usable; < 0: -errno, why in cufile_why */
    char cufile_why[FR_ERRLEN];
    const char *cufile_mode;
    void *libcufile;
    cufile_api cf;
};

static int load_syms(void *lib, const sym *syms, size_t n, const char *libname, char *err,
                     size_t err_len)
{
    for (size_t i = 0; i < n; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            fr_set_err(err, err_len, "%s has no %s (too old?)", libname, syms[i].name);
            return -ENOSYS;
        }
    }
    return 0;
}

static void *open_first(const char *const *names, char *tried, size_t tried_len)
{
    tried[0] = 0;
    for (size_t i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        if (!tried[0])
            snprintf(tried, tried_len, "%s", dlerror());
    }
    return NULL;
}

static const char *cu_errstr(const fr_gpu *g, fr_CUresult r)
{
    const char *s = NULL;
    if (g->cu.cuGetErrorString && g->cu.cuGetErrorString(r, &s) == 0 && s)
        return s;
    return "unknown CUDA error";
}

/* Keeps the message for fr_gpu_last_error; any thread may call it. */
__attribute__((format(printf, 2, 3))) static void record_error(fr_gpu *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g->lock);
    vsnprintf(g->last_error, sizeof(g->last_error), fmt, ap);
    pthread_mutex_unlock(&g->lock);
    va_end(ap);
}

/* Records a failed CUDA call; returns the errno it maps to. */
static int cu_fail(fr_gpu *g, fr_CUresult r, const char *what)
{
    record_error(g, "%s on GPU %d: %s (CUDA error %d)", what, g->device, cu_errstr(g, r), r);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

static void gpu_free(fr_gpu *g)
{
    if (g->ctx)
        g->cu.cuDevicePrimaryCtxRelease_v2(g->dev);
    /* libcufile stays loaded: its driver stays open for the process (another
     * user, such as DALI's GDS reader, may share it), and unloading it under
     * its own threads is not safe. */
    if (g->libcuda)
        dlclose(g->libcuda);
    pthread_mutex_destroy(&g->cufile_lock);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

static int gpu_load(int device, fr_gpu **out, char *err, size_t err_len)
{
    *out = NULL;
    if (device < 0) {
        fr_set_err(err, err_len, "device_id must be >= 0, got %d", device);
        return -EINVAL;
    }
    fr_gpu *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    if (pthread_mutex_init(&g->lock, NULL) != 0) {
        free(g);
        return -ENOMEM;
    }
    if (pthread_mutex_init(&g->cufile_lock, NULL) != 0) {
        pthread_mutex_destroy(&g->lock);
        free(g);
        return -ENOMEM;
    }
    g->refs = 1;
    g->device = device;
    g->cufile_rc = 1;
    char tried[FR_ERRLEN];
    static const char *const names[] = {"libcuda.so.1", "libcuda.so", NULL};
    g->libcuda = open_first(names, tried, sizeof(tried));
    if (!g->libcuda) {
        fr_set_err(err, err_len, "no CUDA driver: %s", tried);
        gpu_free(g);
        return -ENOENT;
    }
    const sym syms[] = {
        SYM(g->cu, cuInit), SYM(g->cu, cuDriverGetVersion), SYM(g->cu, cuDeviceGetCount),
        SYM(g->cu, cuDeviceGet), SYM(g->cu, cuDevicePrimaryCtxRetain),
        SYM(g->cu, cuDevicePrimaryCtxRelease_v2), SYM(g->cu, cuCtxPushCurrent_v2),
        SYM(g->cu, cuCtxPopCurrent_v2), SYM(g->cu, cuMemHostRegister_v2),
        SYM(g->cu, cuMemHostUnregister), SYM(g->cu, cuMemAlloc_v2), SYM(g->cu, cuMemFree_v2),
        SYM(g->cu, cuMemcpyHtoD_v2), SYM(g->cu, cuMemcpyHtoDAsync_v2),
        SYM(g->cu, cuMemcpyDtoHAsync_v2), SYM(g->cu, cuStreamCreate),
        SYM(g->cu, cuStreamDestroy_v2), SYM(g->cu, cuStreamSynchronize),
        SYM(g->cu, cuGetErrorString),
    };
    int rc = load_syms(g->libcuda, syms, sizeof(syms) / sizeof(syms[0]), "libcuda", err, err_len);
    if (rc) {
        gpu_free(g);
        return rc;
    }
    const sym gsyms[] = {
        SYM(g->cg, cuMemHostAlloc), SYM(g->cg, cuMemFreeHost),
        SYM(g->cg, cuMemHostGetDevicePointer_v2), SYM(g->cg, cuModuleLoadData),
        SYM(g->cg, cuModuleUnload), SYM(g->cg, cuModuleGetFunction), SYM(g->cg, cuLaunchKernel),
        SYM(g->cg, cuDeviceGetAttribute), SYM(g->cg, cuMemGetInfo_v2),
        SYM(g->cg, cuPointerGetAttribute), SYM(g->cg, cuMemsetD8_v2),
        SYM(g->cg, cuMemcpyDtoH_v2),
    };
    g->cg_rc = load_syms(g->libcuda, gsyms, sizeof(gsyms) / sizeof(gsyms[0]), "libcuda",
                         g->cg_why, sizeof(g->cg_why));
    const sym esyms[] = {
        SYM(g->ev, cuEventCreate), SYM(g->ev, cuEventRecord), SYM(g->ev, cuEventSynchronize),
        SYM(g->ev, cuEventElapsedTime), SYM(g->ev, cuEventDestroy_v2), SYM(g->ev, cuEventQuery),
    };
    char ewhy[FR_ERRLEN];
    g->ev_rc = load_syms(g->libcuda, esyms, sizeof(esyms) / sizeof(esyms[0]), "libcuda", ewhy,
                         sizeof(ewhy));
    fr_CUresult r = g->cu.cuInit(0);
    int count = 0;
    if (r == 0)
        r = g->cu.cuDeviceGetCount(&count);
    if (r != 0) {
        fr_set_err(err, err_len, "CUDA driver unusable: %s (CUDA error %d)", cu_errstr(g, r), r);
        gpu_free(g);
        return r == CUDA_ERROR_NO_DEVICE ? -ENODEV : -EIO;
    }
    if (device >= count) {
        fr_set_err(err, err_len, "no CUDA device %d (this machine has %d)", device, count);
        gpu_free(g);
        return -ENODEV;
    }
    *out = g;
    return 0;
}

int fr_gpu_probe(int device, char *why, size_t why_len)
{
    fr_gpu *g;
    int rc = gpu_load(device, &g, why, why_len);
    if (rc == 0)
        gpu_free(g);
    return rc;
}

int fr_gpu_open(int device, fr_gpu **out, char *err, size_t err_len)
{
    fr_gpu *g;
    int rc = gpu_load(device, &g, err, err_len);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuDeviceGet(&g->dev, device);
    if (r == 0)
        r = g->cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev);
    if (r != 0) {
        fr_set_err(err, err_len, "cannot use CUDA device %d: %s (CUDA error %d)", device,
                   cu_errstr(g, r), r);
        g->ctx = NULL;
        gpu_free(g);
        return -EIO;
    }
    *out = g;
    return 0;
}

void fr_gpu_retain(fr_gpu *g)
{
    pthread_mutex_lock(&g->lock);
    g->refs++;
    pthread_mutex_unlock(&g->lock);
}

void fr_gpu_close(fr_gpu *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->lock);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->lock);
    if (last)
        gpu_free(g);
}

int fr_gpu_device_id(const fr_gpu *g) { return g->device; }

void fr_gpu_last_error(fr_gpu *g, char *out, size_t len)
{
    pthread_mutex_lock(&g->lock);
    snprintf(out, len, "%s", g->last_error);
    pthread_mutex_unlock(&g->lock);
}

/* Every device call runs in the primary context, pushed for its duration. */
static int push(fr_gpu *g)
{
    fr_CUresult r = g->cu.cuCtxPushCurrent_v2(g->ctx);
    return r ? cu_fail(g, r, "cuCtxPushCurrent") : 0;
}

static void pop(fr_gpu *g)
{
    CUcontext c;
    (void)g->cu.cuCtxPopCurrent_v2(&c);
}

int fr_gpu_host_register(fr_gpu *g, void *p, size_t len)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuMemHostRegister_v2(p, len, CU_MEMHOSTREGISTER_PORTABLE);
    pop(g);
    return r ? cu_fail(g, r, "cuMemHostRegister (pinning a host arena)") : 0;
}

void fr_gpu_host_unregister(fr_gpu *g, void *p)
{
    if (push(g))
        return;
    fr_CUresult r = g->cu.cuMemHostUnregister(p);
    pop(g);
    if (r)
        (void)cu_fail(g, r, "cuMemHostUnregister");
}

static void cufile_buf_deregister(fr_gpu *g, fr_device_buffer *buf)
{
    if (buf->cufile_registered == 1) {
        (void)g->cf.cuFileBufDeregister((const void *)(uintptr_t)buf->ptr);
        buf->cufile_registered = 0;
    }
}

void fr_gpu_device_free(fr_gpu *g, fr_device_buffer *buf)
{
    if (!buf->ptr)
        return;
    g = buf->owner; /* the gpu it was allocated on */
    if (push(g) == 0) {
        cufile_buf_deregister(g, buf);
        fr_CUresult r = g->cu.cuMemFree_v2((CUdeviceptr)buf->ptr);
        pop(g);
        if (r)
            (void)cu_fail(g, r, "cuMemFree");
    }
    buf->ptr = 0;
    buf->capacity = 0;
    buf->owner = NULL;
    fr_gpu_close(g);
}

int fr_gpu_device_reserve(fr_gpu *g, fr_device_buffer *buf, size_t bytes, int cufile)
{
    if (buf->ptr && buf->owner != g)
        fr_gpu_device_free(buf->owner, buf); /* another device's (or fr_gpu's) memory */
    int register_it = cufile && g->cufile_rc == 0 && buf->cufile_registered == 0;
    if (buf->ptr && bytes <= buf->capacity && !register_it)
        return 0;
    size_t want = buf->capacity;
    if (!buf->ptr || bytes > buf->capacity) {
        want = buf->capacity + buf->capacity / 2;
        if (want < bytes)
            want = bytes;
        want = fr_round_up(want ? want : 1, (size_t)2 << 20);
        fr_gpu_device_free(g, buf);
        register_it = cufile && g->cufile_rc == 0;
    }
    int rc = push(g);
    if (rc)
        return rc;
    if (!buf->ptr) {
        CUdeviceptr p = 0;
        fr_CUresult r = g->cu.cuMemAlloc_v2(&p, want);
        if (r) {
            pop(g);
            return cu_fail(g, r, "cuMemAlloc (a batch's device buffer)");
        }
        buf->ptr = p;
        buf->capacity = want;
        buf->cufile_registered = 0;
        buf->owner = g;
        fr_gpu_retain(g);
    }
    if (register_it) {
        /* Tried once per allocation: in compatibility mode registration may
         * be refused, and cuFile then reads through its own buffers. */
        fr_CUfileError e = g->cf.cuFileBufRegister((const void *)(uintptr_t)buf->ptr,
                                                   buf->capacity, 0);
        buf->cufile_registered = e.err == 0 ? 1 : -1;
    }
    pop(g);
    return 0;
}

int fr_gpu_stream_create(fr_gpu *g, fr_CUstream *out)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuStreamCreate(out, CU_STREAM_NON_BLOCKING);
    pop(g);
    return r ? cu_fail(g, r, "cuStreamCreate") : 0;
}

void fr_gpu_stream_destroy(fr_gpu *g, fr_CUstream stream)
{
    if (!stream || push(g))
        return;
    (void)g->cu.cuStreamDestroy_v2(stream);
    pop(g);
}

int fr_gpu_upload(fr_gpu *g, fr_CUstream stream, fr_batch *b)
{
    int rc = fr_gpu_device_reserve(g, &b->device, b->arena.used, 0);
    if (rc || b->arena.used == 0)
        return rc;
    if ((rc = push(g)))
        return rc;
    fr_CUresult r = g->cu.cuMemcpyHtoDAsync_v2((CUdeviceptr)b->device.ptr, b->arena.base,
                                               b->arena.used, stream);
    if (r == 0)
        r = g->cu.cuStreamSynchronize(stream);
    pop(g);
    return r ? cu_fail(g, r, "copying a batch to the GPU") : 0;
}

int fr_gpu_download(fr_gpu *g, fr_CUstream stream, fr_batch *b)
{
    if (b->arena.used == 0)
        return 0;
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuMemcpyDtoHAsync_v2(b->arena.base, (CUdeviceptr)b->device.ptr,
                                               b->arena.used, stream);
    if (r == 0)
        r = g->cu.cuStreamSynchronize(stream);
    pop(g);
    return r ? cu_fail(g, r, "copying a batch from the GPU") : 0;
}

int fr_gpu_copy_to_device(fr_gpu *g, uint64_t dst, const void *src, size_t len)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuMemcpyHtoD_v2((CUdeviceptr)dst, src, len);
    pop(g);
    return r ? cu_fail(g, r, "copying a sample to the GPU") : 0;
}

int fr_gpu_copy_dtoh_wait(fr_gpu *g, void *dst, uint64_t src, size_t len, fr_CUstream stream)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)src, len, stream);
    if (r == 0)
        r = g->cu.cuStreamSynchronize(stream);
    pop(g);
    return r ? cu_fail(g, r, "copying from the GPU") : 0;
}

int fr_gpu_copy_htod_wait(fr_gpu *g, uint64_t dst, const void *src, size_t len,
                          fr_CUstream stream)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuMemcpyHtoDAsync_v2((CUdeviceptr)dst, src, len, stream);
    if (r == 0)
        r = g->cu.cuStreamSynchronize(stream);
    pop(g);
    return r ? cu_fail(g, r, "copying to the GPU") : 0;
}

int fr_gpu_copy_htod_async(fr_gpu *g, uint64_t dst, const void *src, size_t len,
                           fr_CUstream stream)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuMemcpyHtoDAsync_v2((CUdeviceptr)dst, src, len, stream);
    pop(g);
    return r ? cu_fail(g, r, "copying to the GPU") : 0;
}

/* ------------------------------------------------------- row gathers' API */

int fr_gpu_gather_api(fr_gpu *g, char *why, size_t why_len)
{
    if (g->cg_rc)
        fr_set_err(why, why_len, "%s", g->cg_why);
    return g->cg_rc;
}

int fr_gpu_mapped_alloc(fr_gpu *g, size_t len, void **host, uint64_t *dev)
{
    int rc = push(g);
    if (rc)
        return rc;
    void *p = NULL;
    CUdeviceptr d = 0;
    fr_CUresult r = g->cg.cuMemHostAlloc(&p, len, CU_MEMHOSTALLOC_PORTABLE |
                                                     CU_MEMHOSTALLOC_DEVICEMAP);
    if (r) {
        pop(g);
        return cu_fail(g, r, "cuMemHostAlloc (page-locked, mapped host memory)");
    }
    r = g->cg.cuMemHostGetDevicePointer_v2(&d, p, 0);
    if (r) {
        (void)g->cg.cuMemFreeHost(p);
        pop(g);
        return cu_fail(g, r, "cuMemHostGetDevicePointer");
    }
    pop(g);
    *host = p;
    *dev = (uint64_t)d;
    return 0;
}

void fr_gpu_mapped_free(fr_gpu *g, void *host)
{
    if (!host || push(g))
        return;
    fr_CUresult r = g->cg.cuMemFreeHost(host);
    pop(g);
    if (r)
        (void)cu_fail(g, r, "cuMemFreeHost");
}

int fr_gpu_alloc(fr_gpu *g, size_t len, uint64_t *dptr)
{
    int rc = push(g);
    if (rc)
        return rc;
    CUdeviceptr p = 0;
    fr_CUresult r = g->cu.cuMemAlloc_v2(&p, len ? len : 1);
    pop(g);
    if (r)
        return cu_fail(g, r, "cuMemAlloc");
    *dptr = (uint64_t)p;
    return 0;
}

void fr_gpu_free(fr_gpu *g, uint64_t dptr)
{
    if (!dptr || push(g))
        return;
    fr_CUresult r = g->cu.cuMemFree_v2((CUdeviceptr)dptr);
    pop(g);
    if (r)
        (void)cu_fail(g, r, "cuMemFree");
}

int fr_gpu_memset8(fr_gpu *g, uint64_t dptr, unsigned char v, size_t len)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cg.cuMemsetD8_v2((CUdeviceptr)dptr, v, len);
    pop(g);
    return r ? cu_fail(g, r, "cuMemsetD8") : 0;
}

int fr_gpu_copy_from_device(fr_gpu *g, void *dst, uint64_t src, size_t len)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cg.cuMemcpyDtoH_v2(dst, (CUdeviceptr)src, len);
    pop(g);
    return r ? cu_fail(g, r, "copying from the GPU") : 0;
}

int fr_gpu_mem_info(fr_gpu *g, size_t *free_bytes, size_t *total)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cg.cuMemGetInfo_v2(free_bytes, total);
    pop(g);
    return r ? cu_fail(g, r, "cuMemGetInfo") : 0;
}

int fr_gpu_attribute(fr_gpu *g, int attr, int *out)
{
    fr_CUresult r = g->cg.cuDeviceGetAttribute(out, attr, g->dev);
    return r ? cu_fail(g, r, "cuDeviceGetAttribute") : 0;
}

int fr_gpu_pointer_device(fr_gpu *g, uint64_t ptr, int *ordinal)
{
    int rc = push(g);
    if (rc)
        return rc;
    int dev = -1;
    fr_CUresult r = g->cg.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                (CUdeviceptr)ptr);
    pop(g);
    if (r) {
        record_error(g, "address 0x%llx is not memory CUDA knows (CUDA error %d)",
                     (unsigned long long)ptr, r);
        return -EINVAL;
    }
    *ordinal = dev;
    return 0;
}

int fr_gpu_module_load(fr_gpu *g, const void *image, void **module)
{
    int rc = push(g);
    if (rc)
        return rc;
    CUmodule m = NULL;
    fr_CUresult r = g->cg.cuModuleLoadData(&m, image);
    pop(g);
    if (r)
        return cu_fail(g, r, "cuModuleLoadData (loading a kernel)");
    *module = m;
    return 0;
}

void fr_gpu_module_unload(fr_gpu *g, void *module)
{
    if (!module || push(g))
        return;
    (void)g->cg.cuModuleUnload((CUmodule)module);
    pop(g);
}

int fr_gpu_module_function(fr_gpu *g, void *module, const char *name, void **fn)
{
    CUfunction f = NULL;
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cg.cuModuleGetFunction(&f, (CUmodule)module, name);
    pop(g);
    if (r)
        return cu_fail(g, r, "cuModuleGetFunction");
    *fn = f;
    return 0;
}

int fr_gpu_launch(fr_gpu *g, void *fn, unsigned grid, unsigned block, fr_CUstream stream,
                  void **params)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cg.cuLaunchKernel((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, stream,
                                         params, NULL);
    pop(g);
    return r ? cu_fail(g, r, "cuLaunchKernel") : 0;
}

int fr_gpu_stream_wait(fr_gpu *g, fr_CUstream stream)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->cu.cuStreamSynchronize(stream);
    pop(g);
    return r ? cu_fail(g, r, "cuStreamSynchronize (waiting for a kernel)") : 0;
}

int fr_gpu_event_create(fr_gpu *g, void **ev)
{
    *ev = NULL;
    if (g->ev_rc)
        return -ENOSYS;
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->ev.cuEventCreate((CUevent *)ev, 0); /* timing on: CU_EVENT_DEFAULT */
    pop(g);
    return r ? cu_fail(g, r, "cuEventCreate") : 0;
}

void fr_gpu_event_destroy(fr_gpu *g, void *ev)
{
    if (!ev || push(g))
        return;
    fr_CUresult r = g->ev.cuEventDestroy_v2((CUevent)ev);
    pop(g);
    if (r)
        (void)cu_fail(g, r, "cuEventDestroy");
}

int fr_gpu_event_record(fr_gpu *g, void *ev, fr_CUstream stream)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->ev.cuEventRecord((CUevent)ev, stream);
    pop(g);
    return r ? cu_fail(g, r, "cuEventRecord") : 0;
}

int fr_gpu_event_elapsed_ms(fr_gpu *g, void *start, void *end, float *ms)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->ev.cuEventSynchronize((CUevent)end);
    if (r == 0)
        r = g->ev.cuEventElapsedTime(ms, (CUevent)start, (CUevent)end);
    pop(g);
    return r ? cu_fail(g, r, "cuEventElapsedTime") : 0;
}

int fr_gpu_event_query(fr_gpu *g, void *ev)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->ev.cuEventQuery((CUevent)ev);
    pop(g);
    if (r == CUDA_ERROR_NOT_READY)
        return -EAGAIN;
    return r ? cu_fail(g, r, "cuEventQuery") : 0;
}

int fr_gpu_event_wait(fr_gpu *g, void *ev)
{
    int rc = push(g);
    if (rc)
        return rc;
    fr_CUresult r = g->ev.cuEventSynchronize((CUevent)ev);
    pop(g);
    return r ? cu_fail(g, r, "cuEventSynchronize") : 0;
}

/* ------------------------------------------------------------------ cuFile */

/* GPUDirect Storage proper needs the nvidia-fs kernel module; without it
 * cuFile runs in compatibility mode (POSIX reads into its own pinned bounce
 * buffers, then copies to the GPU). */
static const char *cufile_mode_here(void)
{
    return access("/sys/module/nvidia_fs", F_OK) == 0 ? "gds" : "compat";
}

static int cufile_load(fr_gpu *g)
{
    static const char *const names[] = {"libcufile.so.0", "libcufile.so",
                                        "/usr/local/cuda/lib64/libcufile.so.0", NULL};
    char tried[FR_ERRLEN];
    g->libcufile = open_first(names, tried, sizeof(tried));
    if (!g->libcufile) {
        fr_set_err(g->cufile_why, sizeof(g->cufile_why),
                   "libcufile not found (install nvidia-cufile or the CUDA toolkit's GDS "
                   "package): %s", tried);
        return -ENOENT;
    }
    const sym syms[] = {
        SYM(g->cf, cuFileDriverOpen), SYM(g->cf, cuFileHandleRegister),
        SYM(g->cf, cuFileHandleDeregister), SYM(g->cf, cuFileBufRegister),
        SYM(g->cf, cuFileBufDeregister), SYM(g->cf, cuFileRead),
    };
    int rc = load_syms(g->libcufile, syms, sizeof(syms) / sizeof(syms[0]), "libcufile",
                       g->cufile_why, sizeof(g->cufile_why));
    if (rc)
        return rc;
    if ((rc = push(g))) {
        fr_gpu_last_error(g, g->cufile_why, sizeof(g->cufile_why));
        return rc;
    }
    fr_CUfileError e = g->cf.cuFileDriverOpen();
    pop(g);
    if (e.err != 0) {
        fr_set_err(g->cufile_why, sizeof(g->cufile_why),
                   "cuFileDriverOpen failed (cuFile error %d, CUDA error %d)", e.err, e.cu_err);
        return -EIO;
    }
    g->cufile_mode = cufile_mode_here();
    return 0;
}

int fr_gpu_cufile(fr_gpu *g, const char **mode, char *why, size_t why_len)
{
    /* One loader at a time (cufile_lock): two workers opening their cufile
     * contexts at once both loaded it, writing g->cf's function pointers,
     * g->libcufile and cufile_why while the other wrote or read them (a
     * data race ThreadSanitizer reported in test_gpu). */
    pthread_mutex_lock(&g->cufile_lock);
    pthread_mutex_lock(&g->lock);
    if (g->cufile_rc == 1) {
        pthread_mutex_unlock(&g->lock);
        /* Loading takes a while and calls back into the driver: not under
         * `lock`. */
        int rc = cufile_load(g);
        pthread_mutex_lock(&g->lock);
        g->cufile_rc = rc;
    }
    pthread_mutex_unlock(&g->cufile_lock);
    int rc = g->cufile_rc;
    if (rc)
        fr_set_err(why, why_len, "%s", g->cufile_why);
    else if (mode)
        *mode = g->cufile_mode;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

int fr_gpu_cufile_register(fr_gpu *g, int fd, fr_CUfileHandle *out)
{
    fr_CUfileDescr d;
    memset(&d, 0, sizeof(d));
    d.type = 1; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD */
    d.handle.fd = fd;
    fr_CUfileError e = g->cf.cuFileHandleRegister(out, &d);
    if (e.err != 0) {
        record_error(g,
                 "cuFileHandleRegister failed (cuFile error %d, CUDA error %d; cufile.log says "
                 "why; where GDS cannot identify the file system, as on VMs without udev "
                 "data, CUFILE_FORCE_COMPAT_MODE=true selects cuFile's compatibility mode)",
                 e.err, e.cu_err);
        return -EIO;
    }
    return 0;
}

void fr_gpu_cufile_deregister(fr_gpu *g, fr_CUfileHandle handle)
{
    g->cf.cuFileHandleDeregister(handle);
}

ssize_t fr_gpu_cufile_read(fr_gpu *g, fr_CUfileHandle handle, const fr_device_buffer *buf,
                           size_t dev_offset, size_t len, off_t file_offset)
{
    int rc = push(g);
    if (rc)
        return rc;
    void *base = (void *)(uintptr_t)buf->ptr;
    ssize_t r;
    do {
        errno = 0;
        /* A registered buffer is named by its base plus an offset, as cuFile
         * requires; an unregistered one may be addressed directly. */
        if (buf->cufile_registered == 1)
            r = g->cf.cuFileRead(handle, base, len, file_offset, (off_t)dev_offset);
        else
            r = g->cf.cuFileRead(handle, (char *)base + dev_offset, len, file_offset, 0);
    } while (r == -1 && errno == EINTR);
    pop(g);
    if (r == -1)
        return errno ? -errno : -EIO;
    if (r < 0) {
        record_error(g, "cuFileRead failed (cuFile error %zd)", -r);
        return -EIO;
    }
    return r;
}
