/*
 * fr_store: a storage-backed array of fixed-size rows, gathered by id.
 *
 * The public C API of fastread's row gathers (GNN node features, embedding
 * tables). A store is one file or block device holding `rows` rows of
 * `row_bytes` bytes each, starting at `offset`. A gather takes a list of row
 * ids (duplicated and unsorted ids are fine) and writes the rows, in input
 * order, to host or device memory.
 *
 * Backends (fr_store_config.backend):
 *   "host"       ids sorted on the host, adjacent rows coalesced into range
 *                reads through an engine (engine.h), rows scattered to the
 *                output in input order; one host-to-device copy for device
 *                output. Runs everywhere; the baseline and the fallback.
 *   "proxy"      GPU-initiated: a CUDA kernel looks every row up in a
 *                software page cache in device memory; misses become read
 *                requests in a submission ring in page-locked host memory
 *                mapped into the device; native host service threads serve
 *                them with an engine and post completions; the kernel
 *                copies the page into the cache and the row to the output.
 *                Kernels are compiled at run time with NVRTC (dlopen'ed).
 *   "xnvme-cuda" GPU-initiated, with xNVMe's GPU-resident NVMe queues
 *                (libxnvme_cuda.h, upcie-cuda backend) instead of the host
 *                proxy; built where the system's xNVMe provides them.
 *   "auto"       proxy where a GPU and NVRTC are present, else host.
 * A BaM/libnvm backend would slot in beside xnvme-cuda: it replaces the
 * ring + proxy with NVMe queue pairs in device memory (see gather_backend.h).
 *
 * Tiers, checked in this order by the device path: the HBM page cache; a
 * page-locked host tier read by GPU threads over PCIe (the whole file when
 * it fits in host_bytes, else the rows listed in hot_ids); storage.
 *
 * Thread safety: every fr_store_* call is thread-safe. Gathers on one store
 * run one at a time (a second caller waits), so concurrent callers from
 * several threads or streams get correct rows. fr_store_close may be called
 * while a gather runs on another thread: that gather is cancelled and
 * returns -ECANCELED. A call that has not yet entered the store when it is
 * freed reads freed memory, as with any handle: a caller that closes from
 * another thread first makes sure the calls it races with have entered
 * (fr_store_calls_in_flight) or will not start. Nothing is global: two
 * stores share no state.
 */
#ifndef FASTREAD_GATHER_H
#define FASTREAD_GATHER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_store fr_store;

typedef struct fr_store_config {
    const char *path;     /* file or block device */
    uint64_t offset;      /* byte offset of row 0 (e.g. a .npy header) */
    uint64_t rows;        /* rows in the array */
    uint64_t row_bytes;   /* bytes per row (> 0) */

    const char *backend;  /* "auto", "host", "proxy", "xnvme-cuda" */
    /* Host-side reads (the host backend, and the proxy's service threads). */
    const char *engine;      /* "auto", "io_uring", "psync", ... (fr_engine_names) */
    const char *engine_args; /* engine-specific "key=value,..." */
    int o_direct;            /* -1: where offsets are aligned; 0: never; 1: always */
    unsigned queue_depth;    /* reads in flight per host thread (0: default) */
    unsigned threads;        /* host threads serving reads (0: default) */

    /* Device path. device_id < 0: host only (CUDA is never loaded). */
    int device_id;
    uint64_t cache_bytes;    /* HBM page cache (0: default) */
    uint32_t page_bytes;     /* cache page: a power of two, 4 KiB..1 MiB; row_bytes divides it */
    uint64_t host_bytes;     /* page-locked host tier budget; 0: none; UINT64_MAX: auto (half
                                the memory free at open): the whole array when it fits,
                                else the hot_ids rows that fit */
    const int64_t *hot_ids;  /* rows for the host tier when the file does not fit (borrowed) */
    size_t n_hot;
    unsigned ring_entries;   /* submission ring size, a power of two (0: default) */
    uint32_t timeout_ms;     /* device-side waits give up after this (0: default) */
    const char *cache_dir;   /* compiled kernels; NULL: $FASTREAD_CACHE_DIR or ~/.cache/fastread */
    /* Added after the first version (additive): */
    const char *nvrtc_path;  /* libnvrtc file or directory (e.g. the nvidia-cuda-nvrtc wheel's
                                lib dir), and only that one; NULL: $FASTREAD_NVRTC, then
                                libnvrtc.so.13/.12/.so */
} fr_store_config;

/* Defaults: backend "auto", engine "auto", o_direct -1, host only
 * (device_id -1), 1 GiB cache of 64 KiB pages, no host tier, 4096 ring
 * entries (ring_entries 0: 4096, fewer where staging would pass 256 MiB:
 * entries * page_bytes), 10 s timeout. */
void fr_store_config_init(fr_store_config *cfg);

/* Environment: FASTREAD_NVRTC (libnvrtc file or directory), FASTREAD_CACHE_DIR
 * (compiled kernels), FASTREAD_KERNEL_SOURCE=auto|nvrtc|ptx (where the
 * gather kernel comes from: NVRTC else the PTX built in, or only one),
 * FASTREAD_PROXY_DELAY_US (fault injection: the proxy answers late; tests),
 * FASTREAD_PROXY_CACHED=0 (the proxy reads every page through its engine
 * instead of cached pages straight into staging), FASTREAD_PROXY_DENSE=1
 * (a cold batch that misses on 1/16 of the pages reads the whole array
 * ahead), FASTREAD_GATHER_TIMELINE=1 (each device gather prints its
 * timeline to stderr: host steps and the kernel's time).
 *
 * Opens a store. Fails with -errno and a message naming the thing for: a
 * file shorter than offset + rows * row_bytes, a page size that is not a
 * power of two in range or that row_bytes does not divide, a device path
 * asked for without a GPU, NVRTC missing, a cache that does not fit in
 * device memory, an unknown backend or engine. */
int fr_store_open(const fr_store_config *cfg, fr_store **out, char *err, size_t err_len);
/* Cancels a gather in flight (it returns -ECANCELED), waits for it to leave,
 * and frees everything. */
void fr_store_close(fr_store *store);
/* Refuses new gathers and cancels the device gathers in flight (they return
 * -ECANCELED soon, whatever their timeout), leaving the store allocated for
 * the callers still inside it; fr_store_close does this first. For
 * bindings that count their own callers and free the store once they have
 * left. Thread-safe; idempotent. */
void fr_store_cancel(fr_store *store);

/* The backend that runs ("host", "proxy", "xnvme-cuda"). */
const char *fr_store_backend(const fr_store *store);
/* Why backend "auto" fell back to "host" with a device_id given ("" when it
 * did not), and where the gather kernel came from ("" without a device
 * path): e.g. "NVRTC 13.0, sm_90, cached in ~/.cache/fastread". */
const char *fr_store_backend_reason(const fr_store *store);
const char *fr_store_kernel_source(const fr_store *store);

/* Rows ids[0..n) to host memory out (n * row_bytes bytes), in input order,
 * through the host backend (always available). 0, or -errno with a message:
 * -ERANGE for an id out of range (*bad_index: its position in ids), -EIO
 * and the path for a read that failed. */
int fr_store_gather_host(fr_store *store, const int64_t *ids, size_t n, void *out,
                         size_t *bad_index, char *err, size_t err_len);

/* Rows to device memory: ids is a device pointer to n ids of id_bytes (4 or
 * 8) each, out a device pointer to n * row_bytes bytes, stream a CUstream
 * (NULL: the legacy default stream). The work is ordered after what is
 * already queued on `stream`; the call returns once it is done (the host
 * must see the result to report errors). With backend "host" the ids are
 * copied down, gathered on the host and copied up. Errors as for
 * fr_store_gather_host, plus -ETIMEDOUT when a device-side wait ran out. */
int fr_store_gather_device(fr_store *store, uint64_t ids, int id_bytes, size_t n, uint64_t out,
                           void *stream, size_t *bad_index, char *err, size_t err_len);

/* Where the rows of all gathers so far came from. */
typedef struct fr_store_stats {
    uint64_t gathers;        /* gather calls */
    uint64_t rows;           /* rows returned */
    uint64_t cache_hits;     /* rows served from the HBM cache */
    uint64_t cache_misses;   /* pages a gather had to bring into the cache */
    uint64_t coalesced;      /* requests merged into another (same page in a warp, or
                                concurrent misses to one page; adjacent rows on the host) */
    uint64_t host_tier_rows; /* rows read by the GPU from the page-locked host tier */
    uint64_t direct_rows;    /* rows read from storage on their own, past the cache
                                (row fetches of sparse batches; $FASTREAD_GATHER_FETCH) */
    uint64_t storage_reads;  /* reads sent to storage (pages or rows) */
    uint64_t mapped_reads;   /* of those, served by copies from a read-only mapping
                                of a file the page cache held (proxy; gather_proxy.c) */
    uint64_t bytes_read;     /* bytes read from storage */
    uint64_t evictions;      /* cache pages replaced */
    /* Added after the first version (additive, at the end): */
    uint64_t row_hits;       /* rows served from the hot-row cache (HBM, by row) */
    uint64_t admitted;       /* rows let into the hot-row cache by its admission policy */
    uint64_t host_routed;    /* gathers of backend "auto" run on the host path */
} fr_store_stats;
void fr_store_stats_get(fr_store *store, fr_store_stats *out);

/* Backend "auto": where the last gather with device ids ran and why (one
 * line; "" before the first), and the rule it follows (a constant). */
void fr_store_route_get(fr_store *store, char *buf, size_t len);
const char *fr_store_route_rule(void);

/* Calls running inside the store now (gathers, device serves). */
unsigned fr_store_calls_in_flight(fr_store *store);

/* Memory held, by part (bytes). */
typedef struct fr_store_memory {
    uint64_t device_cache;   /* HBM cache: pages and hot rows */
    uint64_t device_meta;    /* page table, slot tags and counters, hot-row tags and sketch */
    uint64_t host_tier;      /* page-locked host tier */
    uint64_t rings;          /* submission/completion rings (page-locked, mapped) */
    uint64_t staging;        /* page-locked staging pages the host reads into */
    uint64_t host_buffers;   /* host backend buffers (range reads, sorted ids) */
} fr_store_memory;
void fr_store_memory_get(fr_store *store, fr_store_memory *out);

/* For users' own kernels: the device address of the store's device view
 * (a `const fr_dev_store *` for fastread_device.cuh), 0 without a device
 * path. Valid until fr_store_close. Users' kernels must not run while
 * fr_store_close does. */
uint64_t fr_store_device_view(fr_store *store);

/* Users' kernels that may miss the cache need the backend's host side
 * serving: fr_store_device_serve(store, 1) before launching them, (store, 0)
 * after they finished (sessions nest with fastread's own gathers, which
 * work meanwhile). Closing the last session resets the rings (a user
 * kernel's wait may have timed out). 0, -ENODEV without a device path,
 * -EINVAL for an off without an on, -ECANCELED once the store is closing.
 * Added after the first version (additive). */
int fr_store_device_serve(fr_store *store, int on, char *err, size_t err_len);

/* Source of the device header (fastread_device.cuh) compiled into the
 * library, for NVRTC or CuPy RawModule users without the installed file. */
const char *fr_store_device_header(void);

#ifdef __cplusplus
}
#endif

#endif /* FASTREAD_GATHER_H */
