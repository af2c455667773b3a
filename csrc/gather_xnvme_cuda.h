/*
 * xnvme-cuda: the GPU-initiated backend of fr_store (gather.h) over
 * upstream xNVMe's GPU-resident NVMe queues (libxnvme_cuda.h, upcie-cuda
 * backend).
 *
 * Host side: opens the NVMe controller by PCI address with xNVMe's
 * upcie-cuda backend, checks the store's layout against the namespace
 * (pages on logical block boundaries), allocates the cache slots where the
 * controller can DMA to them (xNVMe's P2P GPU heap), records each slot's
 * bus addresses and PRP lists once, creates the GPU queues and loads the
 * fill kernel (precompiled by nvcc, see fastread_xnvme_cuda.cuh). Device
 * side: fr_xc_fill reads a list of (page, slot) misses straight into the
 * slots, GPU threads building and submitting the NVMe commands themselves.
 *
 * The gather core owns the page table (which page is in which slot); this
 * backend owns the slots and the queues.
 *
 * Where fastread was built without xNVMe's GPU queues, every call refuses
 * with -ENOTSUP and the reason; the URI resolution and the geometry checks
 * (xnvme_cuda_map.h) work everywhere.
 *
 * CUDA contexts: xNVMe's upcie-cuda creates its own CUDA context
 * (cuCtxCreate, not the device's primary context) and allocates its heap,
 * hence the slots and the queues, in it. Kernels that touch the slots must
 * run in fr_xc_context(); fr_xc_fill does so itself and restores the
 * caller's context.
 */
#ifndef FASTREAD_GATHER_XNVME_CUDA_H
#define FASTREAD_GATHER_XNVME_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "xnvme_cuda_map.h"

typedef struct fr_xc fr_xc;

typedef struct fr_xc_config {
    const char *uri;       /* PCI address ("0000:01:00.0", "01:00.0") of a controller bound
                              to uio_pci_generic; /dev/nvmeXnY is resolved to its controller
                              and refused with what to do (the kernel driver owns it) */
    uint32_t nsid;         /* namespace; 0: 1 */
    int gpu_id;            /* CUDA ordinal (xNVMe's opts.gpu_id) */
    uint64_t offset;       /* byte offset of row 0 in the namespace */
    uint64_t rows;
    uint64_t row_bytes;
    uint32_t page_bytes;   /* cache page (power of two, 4 KiB..1 MiB) */
    uint64_t cache_bytes;  /* cache slots: cache_bytes / page_bytes of them */
    unsigned queues;       /* GPU queues, one per thread block of a fill (0: 8) */
    unsigned queue_depth;  /* commands in flight per queue, 32..1024 (0: 256) */
    uint32_t timeout_ms;   /* a completion not seen by then fails the fill (0: 10 s) */
    const char *sysfs;     /* NULL: "/sys"; tests point it at a tree of their own */
} fr_xc_config;

void fr_xc_config_init(fr_xc_config *cfg);

/* engine_args-style "key=value,..." for the fields a store config does not
 * carry: nsid, queues, qdepth, gpu. */
int fr_xc_parse_args(const char *args, fr_xc_config *cfg, char *err, size_t err_len);

/* 0 if this build has xnvme-cuda and the loaded libxnvme has the
 * upcie-cuda backend; else -ENOTSUP and why. */
int fr_xc_probe(char *why, size_t why_len);

/* Turns cfg->uri into the controller's PCI address (pci, >= 13 bytes) and
 * checks in sysfs that it is an NVMe controller that upcie-cuda can drive.
 * 0, or -errno (-ENODEV: no such usable device; -EINVAL: not a URI this
 * backend understands) with a message naming the device and the backend.
 * *nsid is set from a /dev/nvmeXnY path. */
int fr_xc_resolve(const char *sysfs, const char *uri, char *pci, size_t pci_len, uint32_t *nsid,
                  char *err, size_t err_len);

int fr_xc_open(const fr_xc_config *cfg, fr_xc **out, char *err, size_t err_len);
void fr_xc_close(fr_xc *x);

const fr_xc_geom *fr_xc_geometry(const fr_xc *x);
uint32_t fr_xc_slots(const fr_xc *x);
/* Device address of slot 0 (slot s at + s * page_bytes), in fr_xc_context. */
uint64_t fr_xc_slot_base(const fr_xc *x);
/* The CUcontext (as void *) that owns the slots and the queues. */
void *fr_xc_context(const fr_xc *x);
/* Device address of the fr_xc_view (for kernels linked with the device part). */
uint64_t fr_xc_view_address(const fr_xc *x);

/* Reads pages d_pages[0..n) into slots d_slots[0..n) (device arrays of
 * uint64_t and uint32_t, readable in fr_xc_context) and waits. 0, or:
 * -ETIMEDOUT (a completion did not come within timeout_ms: the queues are
 * then retired and every later fill refuses with -EIO until reopened),
 * -EIO (an NVMe error status, or a CUDA failure), -EINVAL (a page or slot
 * out of range), each with a message naming the device. */
int fr_xc_fill(fr_xc *x, uint64_t d_pages, uint64_t d_slots, uint32_t n, char *err,
               size_t err_len);

typedef struct fr_xc_stats {
    uint64_t fills, pages, commands, bytes_read, failed_commands;
} fr_xc_stats;
void fr_xc_stats_get(const fr_xc *x, fr_xc_stats *out);

#endif
