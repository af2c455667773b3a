/*
 * xnvme-cuda, device half (gather_backend.h, FR_FETCH_EXTERN): a cache miss
 * becomes NVMe reads that the GPU thread builds, submits and reaps itself on
 * one of xNVMe's GPU-resident queues (libxnvme_cuda.h, upcie-cuda backend).
 *
 * Compiled after fastread_device.cuh and after xNVMe's libxnvme_util.h,
 * libxnvme_spec.h and libxnvme_cuda.h. NVRTC cannot include libxnvme.h
 * (glibc headers), but those three need nothing but stdint types and
 * EAGAIN: the build concatenates them, as installed on the build machine,
 * with xnvme_cuda_map.h and this file, #include lines removed, into the
 * text gather_xnvme_cuda.c's device_source() returns (never committed: it
 * is made from the system's xNVMe every build). nvcc users include the
 * headers instead (see tests/test_gather_xnvme_cuda.c).
 *
 * Why a lock per queue. xNVMe's device functions keep the queue's tail and
 * head in the queue itself with plain (non-atomic) updates, made for one
 * thread block per queue moving in lock-step (xnvme_cuda_cmd_io). Here a
 * loader is one thread of any lane, divergent, with many loaders at once;
 * so a loader takes a queue for itself (a CAS on the queue's lock word),
 * writes its page's commands (enqueue_at_i at offsets 0..n-1, CID = offset),
 * rings the doorbell once (sq_update), reaps its n completions (reap_at_i,
 * in 1 ms slices so that the store's deadline and abort flag are honoured),
 * moves the head (cq_update) and lets the queue go. Parallelism is the
 * number of queues (each NVMe I/O queue pair the controller grants is
 * one), depth per queue is the commands of one page.
 *
 * Why a bounce page per queue. The controller DMAs to bus addresses, and
 * xNVMe's public API gives those (xnvme_buf_vtophys) only for its own GPU
 * heap, not for the store's cache. So queue q reads into its page in
 * xNVMe's heap (bus addresses and PRP list written once at open) and the
 * loader copies it to the cache slot (HBM to HBM, with loads that bypass
 * L1: the bytes were written by DMA after this thread last read the page).
 *
 * A loader that gives up (deadline, abort) with commands in flight marks
 * the queue retired (lock word 2) so nothing else uses it: a late
 * completion may still land in that queue's bounce page, never in a cache
 * slot. The host's end() recreates the queues after a failed gather.
 */
#ifndef FASTREAD_XNVME_CUDA_CUH
#define FASTREAD_XNVME_CUDA_CUH

#include "../xnvme_cuda_map.h"

/* The layouts the controller sees, whatever the source of the headers. */
static_assert(sizeof(struct xnvme_spec_cmd) == 64, "NVMe command is 64 bytes");
static_assert(sizeof(struct xnvme_spec_cpl) == 16, "NVMe completion is 16 bytes");
static_assert(sizeof(fr_xc_fetch) <= 16 * sizeof(uint64_t), "fr_xc_fetch outgrew fr_dev_fetch");

#define FR_XC_LOCK_FREE 0u
#define FR_XC_LOCK_HELD 1u
#define FR_XC_LOCK_RETIRED 2u

/* s->fetch, as this backend fills it. */
FR_DEV const fr_xc_fetch *fr_xc_fetch_of(const fr_dev_store *s)
{
    return (const fr_xc_fetch *)&s->fetch;
}

/* The NVMe Read for command *c of a page, into queue q's bounce page. PRP1:
 * the first 4 KiB memory page the command covers; PRP2: the second, or,
 * beyond two, a pointer into the queue's PRP list at that second page. */
FR_DEV void fr_xc_build_read(const fr_xc_fetch *f, uint32_t q, const fr_xc_cmd *c, uint16_t cid,
                             struct xnvme_spec_cmd *cmd)
{
    const fr_xc_geom *g = &f->geom;
    const uint64_t *iova = (const uint64_t *)f->bounce_iova + (uint64_t)q * g->mem_pages_per_page;
    uint32_t bytes = c->nlb << g->lba_shift;
    uint32_t j0 = c->slot_off / FR_XC_MEM_PAGE;
    uint32_t m = (bytes + FR_XC_MEM_PAGE - 1) / FR_XC_MEM_PAGE;
    uint32_t *w = (uint32_t *)cmd;
    for (unsigned i = 0; i < sizeof(*cmd) / sizeof(uint32_t); i++)
        w[i] = 0;
    cmd->common.opcode = XNVME_SPEC_NVM_OPC_READ;
    cmd->common.cid = cid;
    cmd->common.nsid = f->nsid;
    cmd->common.dptr.prp.prp1 = iova[j0];
    if (m == 2)
        cmd->common.dptr.prp.prp2 = iova[j0 + 1];
    else if (m > 2)
        cmd->common.dptr.prp.prp2 = ((const uint64_t *)f->prp_iova)[q] + (uint64_t)j0 * 8u;
    cmd->nvm.slba = c->slba;
    cmd->nvm.nlb = (uint16_t)(c->nlb - 1); /* zero-based */
}

/* Takes a free queue, starting from one picked by the page so that loaders
 * spread over the queues. Its index, or a negative FR_DEV_E* code. */
FR_DEV int64_t fr_xc_take_queue(const fr_dev_store *s, const fr_xc_fetch *f, uint64_t page,
                                uint64_t deadline_ns)
{
    uint32_t *locks = (uint32_t *)f->locks;
    uint32_t start = (uint32_t)((page * 0x9E3779B97F4A7C15ull) >> 32) % f->nqueues;
    for (;;) {
        for (uint32_t i = 0; i < f->nqueues; i++) {
            uint32_t q = (start + i) % f->nqueues;
            if (fr_load32(&locks[q]) == FR_XC_LOCK_FREE &&
                fr_atom_cas32(&locks[q], FR_XC_LOCK_FREE, FR_XC_LOCK_HELD) == FR_XC_LOCK_FREE) {
                fr_fence(); /* the previous holder's queue updates are visible */
                return q;
            }
        }
        int rc = fr_dev_wait_check(s, deadline_ns);
        if (rc)
            return rc;
    }
}

FR_DEV void fr_xc_give_queue(const fr_xc_fetch *f, uint32_t q, uint32_t state)
{
    fr_fence(); /* our head/tail updates before the next holder reads them */
    fr_store32(&((uint32_t *)f->locks)[q], state);
}

/* Copies the bounce page to the slot, reading around L1 (ld.global.cv):
 * the controller wrote those bytes behind the caches' back. */
FR_DEV void fr_xc_copy_in(uint8_t *dst, const uint8_t *src, uint32_t len)
{
    if ((((uint64_t)dst | (uint64_t)src | len) & 15) == 0) {
        for (uint32_t i = 0; i < len / 16; i++)
            ((uint4 *)dst)[i] = __ldcv((const uint4 *)src + i);
        return;
    }
    for (uint32_t i = 0; i < len; i++)
        dst[i] = *(const volatile uint8_t *)&src[i];
}

FR_DEV int fr_backend_fetch_page(const fr_dev_store *s, uint64_t page, uint8_t *dst, uint32_t len,
                                 uint64_t deadline_ns)
{
    const fr_xc_fetch *f = fr_xc_fetch_of(s);
    const fr_xc_geom *g = &f->geom;
    uint64_t *counters = (uint64_t *)f->counters;
    if (page >= g->pages || len > g->page_bytes)
        return FR_DEV_ERANGE;
    int64_t q = fr_xc_take_queue(s, f, page, deadline_ns);
    if (q < 0)
        return (int)q;
    /* Work on a private copy of the queue's state, read around L1 (another
     * SM may have moved head and tail since this one last looked), and
     * write head, tail and phase back before letting the queue go. */
    struct xnvme_cuda_queue *gq = ((struct xnvme_cuda_queue *const *)f->queues)[q];
    struct xnvme_cuda_queue local;
    for (unsigned i = 0; i < sizeof(local) / sizeof(uint32_t); i++)
        ((uint32_t *)&local)[i] = ((const volatile uint32_t *)gq)[i];
    struct xnvme_cuda_queue *qp = &local;
    uint16_t n = 0;
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < g->cmds_per_page; k++) {
        fr_xc_cmd c;
        struct xnvme_spec_cmd cmd;
        if (!fr_xc_page_cmd(g, page, k, &c))
            break; /* the rest of the last page lies past the data */
        fr_xc_build_read(f, (uint32_t)q, &c, n, &cmd);
        xnvme_cuda_enqueue_at_i(qp, &cmd, n);
        bytes += (uint64_t)c.nlb << g->lba_shift;
        n++;
    }
    if (n == 0) {
        fr_xc_give_queue(f, (uint32_t)q, FR_XC_LOCK_FREE);
        return FR_DEV_ERANGE;
    }
    xnvme_cuda_sq_update(qp, n);
    int err = 0;
    for (uint16_t i = 0; i < n; i++) {
        struct xnvme_spec_cpl cpl;
        while (xnvme_cuda_reap_at_i(qp, 1, &cpl, i) != 0) {
            int rc = fr_dev_wait_check(s, deadline_ns);
            if (rc) {
                /* Commands are in flight: nobody may use this queue again
                 * until the host recreates it (end() after the failure). */
                fr_atom_add64(&counters[FR_XC_CNT_TIMEOUTS], 1);
                fr_xc_give_queue(f, (uint32_t)q, FR_XC_LOCK_RETIRED);
                return rc;
            }
        }
        if (cpl.cid >= n) {
            fr_atom_add64(&counters[FR_XC_CNT_NVME_ERRORS], 1);
            fr_xc_give_queue(f, (uint32_t)q, FR_XC_LOCK_RETIRED); /* not ours: queue lost */
            return FR_DEV_EIO;
        }
        if (cpl.status.sc || cpl.status.sct) {
            fr_atom_add64(&counters[FR_XC_CNT_NVME_ERRORS], 1);
            fr_store32((uint32_t *)&counters[FR_XC_CNT_LAST_STATUS],
                       (uint32_t)((cpl.status.sct << 8) | cpl.status.sc) | 0x10000u);
            err = FR_DEV_EIO;
        }
    }
    xnvme_cuda_cq_update(qp, n);
    *(volatile uint16_t *)&gq->tail = local.tail;
    *(volatile uint16_t *)&gq->head = local.head;
    *(volatile uint8_t *)&gq->phase = local.phase;
    if (err == 0)
        fr_xc_copy_in(dst, (const uint8_t *)f->bounce + (uint64_t)q * g->page_bytes, len);
    fr_xc_give_queue(f, (uint32_t)q, FR_XC_LOCK_FREE);
    fr_atom_add64(&counters[FR_XC_CNT_COMMANDS], n);
    if (err == 0)
        fr_atom_add64(&counters[FR_XC_CNT_BYTES], bytes);
    return err;
}

#endif
