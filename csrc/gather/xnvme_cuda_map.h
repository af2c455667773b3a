/*
 * xnvme-cuda: how cache pages of a store become NVMe read commands.
 *
 * Pure arithmetic, shared by the host (geometry checks at open, tests) and
 * by device code (fastread_xnvme_cuda.cuh builds the commands on the GPU),
 * so both sides agree on every LBA by construction. No xNVMe, no CUDA
 * headers: it compiles as C11 and as CUDA C++ (functions are then
 * __host__ __device__).
 *
 * Page p of a store covers bytes [offset + p * page_bytes, + page_bytes) of
 * the namespace, the same grid as the other backends (row_bytes divides
 * page_bytes, so no row straddles two pages). GPU-issued NVMe reads move
 * whole logical blocks straight into the cache slot, so every page must
 * start on an LBA boundary: offset and page_bytes must be multiples of the
 * LBA size. A page is read as `cmds_per_page` commands of at most
 * `chunk_bytes` each (the controller's maximum transfer, MDTS); the last
 * page stops at the data's end rounded up to a block, never past the
 * namespace.
 */
#ifndef FASTREAD_XNVME_CUDA_MAP_H
#define FASTREAD_XNVME_CUDA_MAP_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FR_XC_HD __host__ __device__
#else
#define FR_XC_HD
#endif

/* NVMe PRP entries address 4 KiB memory pages (CC.MPS = 0, as xNVMe's
 * upcie backends set up the controller). */
#define FR_XC_MEM_PAGE 4096u
/* One command's blocks: NLB is a 16-bit, zero-based field. */
#define FR_XC_MAX_NLB 65536u
/* A fill kernel's block drives one queue, one command per thread. */
#define FR_XC_MAX_BLOCK 1024u
/* upcie builds one PRP list page per request (512 entries + PRP1). */
#define FR_XC_MAX_CMD_BYTES (513u * FR_XC_MEM_PAGE)

typedef struct fr_xc_geom {
    uint64_t offset;        /* byte offset of page 0 (row 0) in the namespace */
    uint64_t data_end;      /* offset + rows * row_bytes */
    uint64_t read_end;      /* data_end rounded up to a block: reads stop here */
    uint64_t pages;         /* pages holding the rows */
    uint32_t lba_bytes;     /* logical block size */
    uint32_t lba_shift;     /* log2(lba_bytes) */
    uint32_t page_bytes;    /* cache page */
    uint32_t chunk_bytes;   /* largest command: page_bytes, or less under MDTS */
    uint32_t cmds_per_page; /* page_bytes / chunk_bytes */
    uint32_t mem_pages_per_page; /* 4 KiB memory pages per cache page (PRP entries) */
} fr_xc_geom;

/* One read command: `nlb` blocks (1-based count) from `slba` into the slot
 * at byte `slot_off`. */
typedef struct fr_xc_cmd {
    uint64_t slba;
    uint32_t nlb;
    uint32_t slot_off;
} fr_xc_cmd;

/* The backend's words of the device view (fr_dev_store.fetch, 16 x 64
 * bits: gather_backend.h), filled by fill_view. Addresses are uint64_t so
 * host C and device C++ agree on the layout. */
typedef struct fr_xc_fetch {
    fr_xc_geom geom;
    uint64_t queues;      /* struct xnvme_cuda_queue *[nqueues] (device memory) */
    uint64_t locks;       /* uint32_t[nqueues]: 0 free, 1 held by a loader, 2 retired */
    uint64_t bounce;      /* nqueues pages in xNVMe's GPU heap: queue q reads into page q */
    uint64_t bounce_iova; /* uint64_t[nqueues * mem_pages_per_page]: bus address of each
                             4 KiB of the bounce pages (PRP entries) */
    uint64_t prp_iova;    /* uint64_t[nqueues]: bus address of queue q's PRP list (its
                             memory pages 1..n-1); 0 when pages are <= 8 KiB */
    uint64_t counters;    /* uint64_t[FR_XC_NCNT] (device memory) */
    uint32_t nqueues;
    uint32_t nsid;
} fr_xc_fetch;

enum {
    FR_XC_CNT_COMMANDS,    /* NVMe reads completed */
    FR_XC_CNT_BYTES,       /* bytes they read, for pages that arrived */
    FR_XC_CNT_NVME_ERRORS, /* completions with an error status */
    FR_XC_CNT_TIMEOUTS,    /* loaders that gave up with commands in flight */
    FR_XC_CNT_LAST_STATUS, /* 0x10000 | sct << 8 | sc of the last error status */
    FR_XC_NCNT
};

/* Command k (0 <= k < cmds_per_page) of page `page`. Returns 1 and fills
 * *c, or 0 when that part of the page lies past the data (nothing to read:
 * the tail of the last page). */
static inline FR_XC_HD int fr_xc_page_cmd(const fr_xc_geom *g, uint64_t page, uint32_t k,
                                          fr_xc_cmd *c)
{
    uint64_t start = g->offset + page * g->page_bytes + (uint64_t)k * g->chunk_bytes;
    if (page >= g->pages || k >= g->cmds_per_page || start >= g->read_end)
        return 0;
    uint64_t len = g->read_end - start;
    if (len > g->chunk_bytes)
        len = g->chunk_bytes;
    c->slba = start >> g->lba_shift;
    c->nlb = (uint32_t)(len >> g->lba_shift);
    c->slot_off = k * g->chunk_bytes;
    return 1;
}

#if !defined(__CUDA_ARCH__)
#include <stdio.h>

static inline int fr_xc_is_pow2_u64(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

/* Checks a store's layout against a namespace and fills *g. 0, or -EINVAL
 * (22) / -ERANGE (34) with a message naming `what` (the device) when the
 * layout cannot be read with whole-block GPU commands. mdts_bytes 0: no
 * limit reported. */
static inline int fr_xc_geom_init(fr_xc_geom *g, const char *what, uint64_t offset,
                                  uint64_t rows, uint64_t row_bytes, uint32_t page_bytes,
                                  uint32_t lba_bytes, uint64_t mdts_bytes, uint64_t dev_bytes,
                                  char *err, size_t err_len)
{
    /* errno values spelled out: this header stays free of <errno.h> so that
     * device code can include it. */
    const int einval = 22, erange = 34;
    if (!fr_xc_is_pow2_u64(lba_bytes) || lba_bytes < 512 || lba_bytes > FR_XC_MEM_PAGE * 16) {
        snprintf(err, err_len, "xnvme-cuda: %s reports a logical block of %u bytes (expected a "
                 "power of two, 512..65536)", what, lba_bytes);
        return -einval;
    }
    if (!fr_xc_is_pow2_u64(page_bytes) || page_bytes < FR_XC_MEM_PAGE || page_bytes > (1u << 20)) {
        snprintf(err, err_len, "xnvme-cuda: page_bytes %u is not a power of two in 4 KiB..1 MiB",
                 page_bytes);
        return -einval;
    }
    if (page_bytes < lba_bytes) {
        snprintf(err, err_len, "xnvme-cuda: page_bytes %u is smaller than the %u-byte logical "
                 "block of %s: a GPU read moves whole blocks into one cache page",
                 page_bytes, lba_bytes, what);
        return -einval;
    }
    if (row_bytes == 0 || page_bytes % row_bytes != 0) {
        snprintf(err, err_len, "xnvme-cuda: row_bytes %llu does not divide page_bytes %u",
                 (unsigned long long)row_bytes, page_bytes);
        return -einval;
    }
    if (offset % lba_bytes != 0) {
        snprintf(err, err_len, "xnvme-cuda: row 0 starts at byte %llu of %s, not on a %u-byte "
                 "logical block boundary: GPU-issued NVMe reads start at block boundaries "
                 "(store the array at a block-aligned offset, or use backend 'proxy')",
                 (unsigned long long)offset, what, lba_bytes);
        return -einval;
    }
    if (rows > (UINT64_MAX - offset) / row_bytes || offset + rows * row_bytes > dev_bytes) {
        snprintf(err, err_len, "xnvme-cuda: %llu rows of %llu bytes from byte %llu run past the "
                 "end of %s (%llu bytes)", (unsigned long long)rows,
                 (unsigned long long)row_bytes, (unsigned long long)offset, what,
                 (unsigned long long)dev_bytes);
        return -erange;
    }
    /* The largest command: the whole page unless MDTS (or the one PRP list
     * page upcie gives a request) is smaller; then the largest power of two
     * under that limit, so a page is a whole number of equal commands. */
    uint64_t limit = FR_XC_MAX_CMD_BYTES;
    if (mdts_bytes && mdts_bytes < limit)
        limit = mdts_bytes;
    if ((uint64_t)FR_XC_MAX_NLB * lba_bytes < limit)
        limit = (uint64_t)FR_XC_MAX_NLB * lba_bytes;
    uint64_t chunk = page_bytes;
    while (chunk > limit)
        chunk >>= 1;
    if (chunk < FR_XC_MEM_PAGE || chunk < lba_bytes) {
        snprintf(err, err_len, "xnvme-cuda: %s transfers at most %llu bytes per command, less "
                 "than one 4 KiB memory page or one logical block", what,
                 (unsigned long long)mdts_bytes);
        return -einval;
    }
    uint32_t shift = 0;
    while ((1u << shift) < lba_bytes)
        shift++;
    uint64_t data_end = offset + rows * row_bytes;
    uint64_t read_end = (data_end + lba_bytes - 1) & ~(uint64_t)(lba_bytes - 1);
    *g = (fr_xc_geom){
        .offset = offset,
        .data_end = data_end,
        .read_end = read_end,
        .pages = (rows * row_bytes + page_bytes - 1) / page_bytes,
        .lba_bytes = lba_bytes,
        .lba_shift = shift,
        .page_bytes = page_bytes,
        .chunk_bytes = (uint32_t)chunk,
        .cmds_per_page = (uint32_t)(page_bytes / chunk),
        .mem_pages_per_page = page_bytes / FR_XC_MEM_PAGE,
    };
    return 0;
}
#endif /* !__CUDA_ARCH__ */

#endif
