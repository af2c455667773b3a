/*
 * The GPU side of the core, for buffers.c, ctx.c and the cufile engine.
 *
 * The CUDA driver API and cuFile are declared here, not included: their
 * types and entry points are a stable C ABI (cuda.h, cufile.h), and
 * declaring the few we use keeps CUDA out of the build. Both libraries are
 * dlopen'ed by fr_gpu_open / fr_gpu_cufile.
 */
#ifndef FASTREAD_GPU_H
#define FASTREAD_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fastread.h"

/* ---- CUDA driver API (cuda.h) ---- */
typedef int fr_CUresult; /* CUDA_SUCCESS == 0 */
typedef struct fr_CUstream_st *fr_CUstream;

/* ---- cuFile (cufile.h) ---- */
typedef struct fr_CUfileError {
    int err;    /* CUfileOpError; CU_FILE_SUCCESS == 0 */
    int cu_err; /* CUresult */
} fr_CUfileError;

typedef struct fr_CUfileDescr {
    int type; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD == 1 */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} fr_CUfileDescr;

typedef void *fr_CUfileHandle;

/* Every device call below pushes the device's primary context for its own
 * duration, so any thread may call them. Failures return -errno (-ENOMEM for
 * out of device memory, -EIO otherwise) and record the CUDA error for
 * fr_gpu_last_error. */

int fr_gpu_host_register(fr_gpu *gpu, void *p, size_t len);
void fr_gpu_host_unregister(fr_gpu *gpu, void *p);

/* Grows buf to at least `bytes` (contents not kept); with cufile set the
 * buffer is also registered with cuFileBufRegister (a failure to register is
 * not an error: cuFile reads unregistered memory through its own buffers). */
int fr_gpu_device_reserve(fr_gpu *gpu, fr_device_buffer *buf, size_t bytes, int cufile);
void fr_gpu_device_free(fr_gpu *gpu, fr_device_buffer *buf);

/* A stream for one thread's copies. */
int fr_gpu_stream_create(fr_gpu *gpu, fr_CUstream *out);
void fr_gpu_stream_destroy(fr_gpu *gpu, fr_CUstream stream);

/* Copies batch bytes [0, arena.used) host->device (upload) or device->host
 * (download) on `stream` and waits for the copy. */
int fr_gpu_upload(fr_gpu *gpu, fr_CUstream stream, fr_batch *batch);
int fr_gpu_download(fr_gpu *gpu, fr_CUstream stream, fr_batch *batch);
/* Copies len bytes of host memory to device address dst, synchronously. */
int fr_gpu_copy_to_device(fr_gpu *gpu, uint64_t dst, const void *src, size_t len);

/* Copies on `stream` (NULL: the legacy default stream) and waits for them,
 * so the copy is ordered after the work already queued there. */
int fr_gpu_copy_dtoh_wait(fr_gpu *gpu, void *dst, uint64_t src, size_t len, fr_CUstream stream);
int fr_gpu_copy_htod_wait(fr_gpu *gpu, uint64_t dst, const void *src, size_t len,
                          fr_CUstream stream);

/* Queues the copy on `stream` and returns: `src` must stay unchanged until
 * the copy is done (an event recorded after it says when). */
int fr_gpu_copy_htod_async(fr_gpu *gpu, uint64_t dst, const void *src, size_t len,
                           fr_CUstream stream);

/* ---- Row gathers' device path (gather_device.c, gather_proxy.c) ---- */
/* 0 when the driver has every entry point below, else -ENOSYS and which. */
int fr_gpu_gather_api(fr_gpu *gpu, char *why, size_t why_len);
/* Page-locked host memory mapped into the device: host and device address. */
int fr_gpu_mapped_alloc(fr_gpu *gpu, size_t len, void **host, uint64_t *dev);
void fr_gpu_mapped_free(fr_gpu *gpu, void *host);
int fr_gpu_alloc(fr_gpu *gpu, size_t len, uint64_t *dptr);
void fr_gpu_free(fr_gpu *gpu, uint64_t dptr);
int fr_gpu_memset8(fr_gpu *gpu, uint64_t dptr, unsigned char v, size_t len); /* synchronous */
int fr_gpu_copy_from_device(fr_gpu *gpu, void *dst, uint64_t src, size_t len); /* synchronous */
int fr_gpu_mem_info(fr_gpu *gpu, size_t *free_bytes, size_t *total);
/* cuDeviceGetAttribute numbers (cuda.h's CUdevice_attribute). */
enum {
    FR_CU_ATTR_SM_COUNT = 16,
    FR_CU_ATTR_CAN_MAP_HOST_MEMORY = 19,
    FR_CU_ATTR_CC_MAJOR = 75,
    FR_CU_ATTR_CC_MINOR = 76,
};
int fr_gpu_attribute(fr_gpu *gpu, int attr, int *out);
/* The device a device pointer belongs to; -EINVAL when CUDA does not know it. */
int fr_gpu_pointer_device(fr_gpu *gpu, uint64_t ptr, int *ordinal);
int fr_gpu_module_load(fr_gpu *gpu, const void *image, void **module); /* PTX or cubin */
void fr_gpu_module_unload(fr_gpu *gpu, void *module);
int fr_gpu_module_function(fr_gpu *gpu, void *module, const char *name, void **fn);
/* 1-D launch of fn on stream; params as cuLaunchKernel's kernelParams. */
int fr_gpu_launch(fr_gpu *gpu, void *fn, unsigned grid, unsigned block, fr_CUstream stream,
                  void **params);
int fr_gpu_stream_wait(fr_gpu *gpu, fr_CUstream stream);
/* Events (the gather's timeline, the DALI operator's upload ring); -ENOSYS where the
 * driver has none. */
int fr_gpu_event_create(fr_gpu *gpu, void **ev);
void fr_gpu_event_destroy(fr_gpu *gpu, void *ev);
int fr_gpu_event_record(fr_gpu *gpu, void *ev, fr_CUstream stream);
/* 0 when the work before the event's record is done, -EAGAIN while not. */
int fr_gpu_event_query(fr_gpu *gpu, void *ev);
int fr_gpu_event_wait(fr_gpu *gpu, void *ev); /* until the event's work is done */
/* Waits for `end`, then the milliseconds between the two. */
int fr_gpu_event_elapsed_ms(fr_gpu *gpu, void *start, void *end, float *ms);

/* cuFile, after fr_gpu_cufile succeeded. */
int fr_gpu_cufile_register(fr_gpu *gpu, int fd, fr_CUfileHandle *out);
void fr_gpu_cufile_deregister(fr_gpu *gpu, fr_CUfileHandle handle);
/* cuFileRead into buf->ptr + dev_offset: bytes read, or -errno. */
ssize_t fr_gpu_cufile_read(fr_gpu *gpu, fr_CUfileHandle handle, const fr_device_buffer *buf,
                           size_t dev_offset, size_t len, off_t file_offset);

int fr_gpu_device_id(const fr_gpu *gpu);

#endif
