/*
 * The interface between fr_store's device path (gather_device.c) and a
 * GPU-initiated storage backend: "proxy" (gather_proxy.c), "xnvme-cuda"
 * (gather_xnvme_cuda.c), and where a BaM/libnvm backend would slot in.
 *
 * How a device gather runs. The gather_device*.c sources own everything
 * common to the backends: the HBM page cache (page table, slot tags, reference counts,
 * clock bits, pages), the page-locked host tier, the control block (abort
 * flag, first error, first bad id, per-warp-aggregated counters), the
 * kernel (compiled with NVRTC or loaded from embedded PTX) and its launch.
 * The kernel is fastread_device.cuh's fr_gather_rows: every row is looked up
 * in the host tier and the page cache; on a miss ONE thread per page (the
 * loader: other warps and lanes wanting the page wait on its LOADING state)
 * calls
 *
 *     __device__ int fr_dev_fetch_page(const fr_dev_store *s, uint64_t page,
 *                                      uint8_t *dst, uint32_t len,
 *                                      uint64_t deadline_ns);
 *
 * which must put bytes [s->offset + page * s->page_bytes, + len) of the file
 * into dst (len <= page_bytes; dst is the cache slot, device memory, 16-byte
 * aligned) and return 0, or a negative FR_DEV_E* code. That function is the
 * backend's device half. Which one the kernel gets is chosen when the kernel
 * is compiled, by the backend's `fetch_define` (passed as -D<fetch_define>):
 *
 *   FR_FETCH_PROXY   built into fastread_device.cuh: the submission ring in
 *                    page-locked host memory mapped into the device; the
 *                    proxy's host service threads read the page into the
 *                    cell's staging page and post the completion; the
 *                    loader copies staging -> dst.
 *   FR_FETCH_EXTERN  the backend's own device code, device_source(), is
 *                    compiled in after fastread_device.cuh and defines
 *                        FR_DEV int fr_backend_fetch_page(
 *                            const fr_dev_store *s, uint64_t page,
 *                            uint8_t *dst, uint32_t len, uint64_t deadline_ns);
 *                    e.g. xnvme-cuda: the page's LBAs from s->offset and the
 *                    namespace's block size, xnvme_cuda_cmd_io /
 *                    xnvme_cuda_enqueue_at_i on a queue chosen by warp,
 *                    xnvme_cuda_reap_at_i with the deadline; BaM/libnvm:
 *                    nvm_cmd_* into an SQ in device memory, doorbell write,
 *                    CQ polling.
 *
 * What the device half must honour (the cache's waiters depend on it):
 *   - return within the deadline (fr_dev_now_ns() >= deadline_ns:
 *     FR_DEV_ETIMEDOUT) and as soon as fr_dev_aborted(s) (FR_DEV_ECANCELED):
 *     a wait that never ends hangs the kernel and every waiter behind it;
 *   - write nothing outside dst[0, len);
 *   - be callable by up to (resident threads) loaders at once, from any
 *     lane, with divergent lanes (no __syncwarp / full-mask shuffles inside);
 *   - keep its device-visible state in s->fetch (fr_dev_fetch: up to 16
 *     words, filled by fill_view below) or memory those words point to.
 *
 * What the host half (the ops below) must provide. All ops are called with
 * the store's gather lock held, except cancel (any thread, any time) and
 * memory (under the same lock, from fr_store_memory_get).
 *   probe      can it run here (device, libraries, queues)? -errno and why,
 *              checked for backend "auto" and before open.
 *   open       set up (queues, rings, service threads) for env; err names
 *              what failed (the path, the device, the library).
 *   map_cache  optional: the cache pages the kernel writes into (device
 *              memory), for backends whose devices DMA into them directly
 *              (xnvme-cuda, BaM: register/map for peer-to-peer DMA).
 *   fill_view  the backend's words of the device view (s->fetch).
 *   begin      a gather is about to launch (wake service threads).
 *   end        the kernel has finished (or was aborted: `failed` != 0). The
 *              backend must quiesce (nothing of it may touch the device view
 *              or dst memory after end returns) and, after a failure, reset
 *              its queues/rings so the next gather starts clean.
 *              begin/end pairs may nest: fr_store_device_serve keeps a
 *              session open for users' own kernels while fastread's gathers
 *              run inside it. Serve while any session is open; quiesce and
 *              reset (if any session failed) when the last one ends.
 *   cancel     asynchronous: the store is closing; stop serving and let
 *              waiters fail fast (the device sees the abort flag too).
 *   counters   add what the host side counted (storage_reads, bytes_read).
 *   memory     add the memory it holds (rings, staging, queues).
 *   close      free everything (after end; no kernel is running).
 */
#ifndef FASTREAD_GATHER_BACKEND_H
#define FASTREAD_GATHER_BACKEND_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gather/device/fastread_device.cuh"
#include "fastread.h"
#include "fastread_gather.h"

/* What the store hands a backend at open (borrowed until close). */
typedef struct fr_backend_env {
    const char *path;          /* the file or block device */
    uint64_t offset;           /* byte offset of row 0 */
    uint64_t rows, row_bytes;
    uint64_t file_size;        /* checked >= offset + rows * row_bytes */
    uint32_t page_bytes;       /* cache page: power of two, 4 KiB..1 MiB */
    uint64_t pages;            /* pages of the array (the last may be short) */
    unsigned ring_entries;     /* power of two */
    uint32_t timeout_ms;
    const char *engine;        /* host engine ("auto" resolved) */
    const char *engine_args;
    int o_direct;              /* -1, 0, 1 as in fr_store_config */
    unsigned queue_depth, threads;
    struct fr_gpu *gpu;        /* the store's device (primary context) */
    const atomic_int *cancel;  /* nonzero once the store is closing */
} fr_backend_env;

typedef struct fr_gather_backend {
    const char *name;          /* "proxy", "xnvme-cuda", ... */
    const char *fetch_define;  /* "FR_FETCH_PROXY" or "FR_FETCH_EXTERN" */
    const char *(*device_source)(void); /* FR_FETCH_EXTERN: device code; else NULL */
    int (*probe)(const fr_backend_env *env, char *why, size_t why_len);
    int (*open)(const fr_backend_env *env, void **state, char *err, size_t err_len);
    int (*map_cache)(void *state, uint64_t dptr, size_t bytes, char *err, size_t err_len);
    void (*fill_view)(void *state, fr_dev_fetch *view);
    int (*begin)(void *state, char *err, size_t err_len);
    int (*end)(void *state, int failed, char *err, size_t err_len);
    void (*cancel)(void *state);
    void (*counters)(void *state, fr_store_stats *add);
    void (*memory)(void *state, fr_store_memory *add);
    void (*close)(void *state);
} fr_gather_backend;

extern const fr_gather_backend fr_gather_backend_proxy;
#ifdef FASTREAD_HAVE_XNVME_CUDA
extern const fr_gather_backend fr_gather_backend_xnvme_cuda;
#endif

#endif
