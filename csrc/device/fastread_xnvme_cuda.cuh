/*
 * xnvme-cuda, device side: cache pages read from NVMe by GPU threads through
 * xNVMe's GPU-resident queues (libxnvme_cuda.h, upcie-cuda backend).
 *
 * Needs nvcc: libxnvme_cuda.h only defines struct xnvme_cuda_queue and its
 * device functions under __CUDACC__, and it comes through libxnvme.h, which
 * includes glibc headers (<stdio.h>, <sys/stat.h>, ...) that NVRTC cannot
 * compile. So this is precompiled at build time (cmake/xnvme_cuda.cmake ->
 * xnvme_cuda_kernels.cu -> an embedded fatbin), never given to NVRTC.
 *
 * One thread block drives one queue: the block's threads each write one
 * command into the submission queue at their position (enqueue_at_i),
 * thread 0 rings the doorbell once for the batch (sq_update), every thread
 * reaps one completion (reap_at_i, with the store's timeout), thread 0
 * moves the completion head (cq_update). This is the sequence of
 * xnvme_cuda_cmd_io, done with its building blocks for two reasons: the
 * timeout is the store's (cmd_io always uses the controller's CAP.TO), and
 * completions may arrive out of order, so a status is matched to its command
 * by the completion's CID rather than by its position in the queue.
 */
#ifndef FASTREAD_XNVME_CUDA_CUH
#define FASTREAD_XNVME_CUDA_CUH

#include <libxnvme.h>

#include "../xnvme_cuda_map.h"

/* Builds the NVMe Read for command *c of a page going to cache slot `slot`:
 * PRP1 is the slot's first 4 KiB memory page the command covers; PRP2 the
 * second, or (more than two pages) a pointer into the slot's PRP list at
 * the entry of that second page. The lists were written at open, once: a
 * slot's bus addresses never change. */
static __device__ inline void fr_xc_build_read(const fr_xc_view *v, const fr_xc_cmd *c,
                                               uint32_t slot, struct xnvme_spec_cmd *cmd)
{
    const fr_xc_geom *g = &v->geom;
    const uint64_t *iova = (const uint64_t *)v->slot_iova + (uint64_t)slot * g->mem_pages_per_page;
    uint32_t bytes = c->nlb << g->lba_shift;
    uint32_t j0 = c->slot_off / FR_XC_MEM_PAGE;
    uint32_t m = (bytes + FR_XC_MEM_PAGE - 1) / FR_XC_MEM_PAGE;
    uint32_t *w = (uint32_t *)cmd;
    for (unsigned i = 0; i < sizeof(*cmd) / sizeof(uint32_t); i++)
        w[i] = 0;
    cmd->common.opcode = XNVME_SPEC_NVM_OPC_READ;
    cmd->common.nsid = v->nsid;
    cmd->common.dptr.prp.prp1 = iova[j0];
    if (m == 2)
        cmd->common.dptr.prp.prp2 = iova[j0 + 1];
    else if (m > 2)
        cmd->common.dptr.prp.prp2 = ((const uint64_t *)v->prp_iova)[slot] + (uint64_t)j0 * 8u;
    cmd->nvm.slba = c->slba;
    cmd->nvm.nlb = (uint16_t)(c->nlb - 1); /* zero-based */
}

/* Shared state of one round. */
typedef struct fr_xc_round {
    unsigned n;                      /* commands in this round */
    int timed_out;
    int status[FR_XC_MAX_BLOCK];     /* by CID: 0, (sct << 8 | sc) + 1, or -1 (no completion) */
} fr_xc_round;

/* One round on queue q, called by every thread of the block (it has
 * __syncthreads inside). A thread with have != 0 submits *cmd; the result
 * for it comes back: 0, an NVMe status ((sct << 8) | sc) + 1, or -1 when
 * no completion came within timeout_ms. After a timeout the queue's state
 * is unknown (a late completion could still DMA into its slot): the caller
 * must stop using the queue: *lost is then set, in every thread. */
static __device__ inline int fr_xc_round_io(struct xnvme_cuda_queue *q, struct xnvme_spec_cmd *cmd,
                                            int have, uint32_t timeout_ms, fr_xc_round *r,
                                            int *lost)
{
    unsigned tid = threadIdx.x;
    if (tid == 0) {
        r->n = 0;
        r->timed_out = 0;
    }
    __syncthreads();
    /* Positions in the submission queue are handed out densely: any order
     * will do, the CID says which command a completion belongs to. */
    unsigned pos = 0;
    if (have) {
        pos = atomicAdd(&r->n, 1u);
        r->status[pos] = -1;
        cmd->common.cid = (uint16_t)pos;
        xnvme_cuda_enqueue_at_i(q, cmd, (uint16_t)pos);
    }
    __syncthreads();
    unsigned n = r->n;
    if (tid == 0 && n)
        xnvme_cuda_sq_update(q, (uint16_t)n);
    if (tid < n) {
        struct xnvme_spec_cpl cpl;
        int e = xnvme_cuda_reap_at_i(q, (int)timeout_ms, &cpl, (uint16_t)tid);
        if (e)
            r->timed_out = 1;
        else if (cpl.cid < n)
            r->status[cpl.cid] = cpl.status.sc || cpl.status.sct
                                     ? (int)((cpl.status.sct << 8) | cpl.status.sc) + 1
                                     : 0;
        else
            r->timed_out = 1; /* a CID we never issued: treat the queue as lost */
    }
    __syncthreads();
    /* Only a fully reaped round frees its completion entries. */
    if (tid == 0 && n && !r->timed_out)
        xnvme_cuda_cq_update(q, (uint16_t)n);
    int res = have ? r->status[pos] : 0;
    *lost = r->timed_out;
    __syncthreads(); /* r is reused by the next round: read it all before */
    return res;
}

static __device__ inline void fr_xc_report(fr_xc_fill_status *st, int32_t code, uint32_t index,
                                           uint32_t nvme_status)
{
    atomicAdd(&st->failed, 1u);
    if (atomicCAS(&st->code, 0, code) == 0) {
        st->index = index;
        st->nvme_status = nvme_status;
    }
}

/* Reads pages[0..n) into cache slots slots[0..n), every command of every
 * page; block b uses queue b. Launch with gridDim.x <= nqueues and
 * blockDim.x == min(qdepth, FR_XC_MAX_BLOCK). The caller zeroes *st. */
static __device__ inline void fr_xc_fill_pages_dev(const fr_xc_view *v, const uint64_t *pages,
                                                   const uint32_t *slots, uint32_t n,
                                                   fr_xc_fill_status *st)
{
    __shared__ fr_xc_round r;
    const fr_xc_geom *g = &v->geom;
    struct xnvme_cuda_queue *q = ((struct xnvme_cuda_queue *const *)v->queues)[blockIdx.x];
    uint64_t total = (uint64_t)n * g->cmds_per_page;
    uint64_t per = (total + gridDim.x - 1) / gridDim.x;
    uint64_t begin = per * blockIdx.x, end = begin + per < total ? begin + per : total;
    for (uint64_t base = begin; base < end; base += blockDim.x) {
        uint64_t idx = base + threadIdx.x;
        int have = 0;
        uint32_t i = 0, bytes = 0;
        struct xnvme_spec_cmd cmd;
        if (idx < end) {
            i = (uint32_t)(idx / g->cmds_per_page);
            uint32_t k = (uint32_t)(idx % g->cmds_per_page);
            uint64_t page = pages[i];
            uint32_t slot = slots[i];
            fr_xc_cmd c;
            /* A bad index would make the controller DMA outside the cache. */
            if (page >= g->pages || slot >= v->nslots) {
                if (k == 0)
                    fr_xc_report(st, FR_XC_EBADREQ, i, 0);
            } else if (fr_xc_page_cmd(g, page, k, &c)) {
                fr_xc_build_read(v, &c, slot, &cmd);
                bytes = c.nlb << g->lba_shift;
                have = 1;
            }
        }
        int lost = 0;
        int res = fr_xc_round_io(q, &cmd, have, v->timeout_ms, &r, &lost);
        if (have && res == 0) {
            atomicAdd((unsigned long long *)&st->commands, 1ull);
            atomicAdd((unsigned long long *)&st->bytes, (unsigned long long)bytes);
        } else if (have)
            fr_xc_report(st, res < 0 ? FR_XC_ETIMEDOUT : FR_XC_ENVME, i,
                         res < 0 ? 0u : (uint32_t)(res - 1));
        if (lost)
            return; /* every thread of the block saw the same flag: the queue is lost */
    }
}

#endif
