/*
 * fastread_device_warp.cuh: the warp-level gather (fr_dev_gather_warp, fr_dev_read_row)
 * and fastread's own gather kernel (FR_DEFINE_GATHER_KERNEL).
 * Part of fastread_device.cuh: include that, not this (it supplies the shim,
 * the layout and the helpers this part uses; the build embeds the parts,
 * inlined in this order, as the one header NVRTC compiles).
 */
#ifndef FASTREAD_DEVICE_WARP_CUH
#define FASTREAD_DEVICE_WARP_CUH
#ifndef FASTREAD_DEVICE_CUH
#error "include fastread_device.cuh, not fastread_device_warp.cuh"
#endif

/* ------------------------------------------------------------ warp level */
#ifdef FR_GPU

FR_DEV void fr_dev_record_error(const fr_dev_store *s, int rc)
{
    atomicCAS((int *)&s->result->error, 0, rc);
}

/* The warp copies the rows its lanes have ready: lane j's row (src_j, when
 * not NULL) to out + pos_j * row_bytes. The 32 rows are one run of W-byte
 * chunks (W = 16 where every address and the row size allow), and each
 * lane takes every 32nd chunk, U at a time: loads from U rows in flight per
 * lane before the first store, coalesced across the warp. Sources are
 * loaded with ld.cg: from L2, never from a line this SM's L1 may still hold
 * from a slot's previous page (or from the host tier, over PCIe). */
template <typename T, int U, bool CV>
FR_DEV void fr_warp_copy_chunks(fr_u8 *out, const fr_u8 *src, fr_u64 pos, fr_u64 rb,
                                unsigned lane)
{
    const unsigned full = 0xffffffffu;
    const fr_u32 cpr = (fr_u32)(rb / sizeof(T)); /* chunks per row */
    const fr_u32 total = 32u * cpr;
    const int pow2 = (cpr & (cpr - 1)) == 0;
    const fr_u32 shift = pow2 ? (fr_u32)__ffs(cpr) - 1 : 0;
    for (fr_u32 c0 = 0; c0 < total; c0 += 32u * U) {
        T v[U];
        T *d[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            fr_u32 c = c0 + (fr_u32)u * 32u + lane;
            fr_u32 j = c < total ? (pow2 ? c >> shift : c / cpr) : 31u;
            fr_u32 k = c < total ? c - j * cpr : 0u;
            const fr_u8 *sj = (const fr_u8 *)__shfl_sync(full, (unsigned long long)src, (int)j);
            fr_u64 pj = __shfl_sync(full, (unsigned long long)pos, (int)j);
            d[u] = 0;
            if (c < total && sj) {
                v[u] = CV ? __ldcv((const T *)sj + k) : __ldcg((const T *)sj + k);
                d[u] = (T *)(out + pj * rb) + k;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (d[u])
                *d[u] = v[u];
    }
}

/* CV: the sources are host memory the host rewrites (ring staging), loaded
 * with ld.cv so that no line cached from an earlier request is used. */
template <bool CV = false>
FR_DEV void fr_warp_copy_rows(fr_u8 *out, const fr_u8 *src, fr_u64 pos, fr_u64 rb, unsigned lane)
{
    const unsigned full = 0xffffffffu;
    /* Cache slots and host-tier rows start at multiples of the row size from
     * page-aligned bases, so the row size and `out` decide the width. */
    fr_u64 a = (fr_u64)out | rb;
    if (!__any_sync(full, src != 0))
        return;
    if ((a & 15) == 0 && rb / 16 <= 0xFFFFFFFFull / 32)
        fr_warp_copy_chunks<uint4, 4, CV>(out, src, pos, rb, lane);
    else if ((a & 3) == 0 && rb / 4 <= 0xFFFFFFFFull / 32)
        fr_warp_copy_chunks<unsigned int, 4, CV>(out, src, pos, rb, lane);
    else if (rb <= 0xFFFFFFFFull / 32)
        fr_warp_copy_chunks<unsigned char, 4, CV>(out, src, pos, rb, lane);
    else
        for (int j = 0; j < 32; j++) { /* rows over 128 MiB: one at a time */
            const fr_u8 *sj = (const fr_u8 *)__shfl_sync(full, (unsigned long long)src, j);
            fr_u64 pj = __shfl_sync(full, (unsigned long long)pos, j);
            if (sj)
                for (fr_u64 o = lane; o < rb; o += 32)
                    out[pj * rb + o] = CV ? (fr_u8)__ldcv((const unsigned char *)(sj + o))
                                          : (fr_u8)__ldcg((const unsigned char *)(sj + o));
        }
}

#if !defined(FR_FETCH_EXTERN)
/* Row fetches (all 32 lanes, converged): lane L's row (when `direct`) is
 * read from storage on its own, through the ring, and copied by the warp
 * from staging to out + pos * row_bytes; the cache is neither consulted
 * nor filled. Lanes wanting the same row share one slot; the warp's rows
 * go as row-list requests (FR_RING_ROWS) of up to
 * fr_ring_rows_per_request rows, usually one per warp: chunk leaders claim
 * the cells, every owner writes its row's offset into its chunk's staging,
 * the leaders publish and wait. The host chooses this per gather for
 * sparse batches over arrays larger than the cache, where a page read
 * brings a few useful rows and many bytes that will be evicted unread
 * (fr_dev_result.fetch_rows). */
FR_DEV void fr_dev_fetch_rows_warp(const fr_dev_store *s, fr_i64 id, int direct, fr_u64 pos,
                                   fr_u8 *out, fr_dev_counts *cnt, fr_u32 epoch)
{
    const unsigned full = 0xffffffffu;
    unsigned lane = threadIdx.x & 31;
    const fr_dev_ring *ring = &s->fetch.ring;
    const fr_u64 rb = s->row_bytes;
    const fr_u32 per = fr_ring_rows_per_request(ring, rb);
    unsigned group = __match_any_sync(full, direct ? (unsigned long long)id : ~0ull - lane);
    unsigned leader = __ffs(group) - 1;
    int own = direct && lane == leader && per > 0;
    unsigned owners = __ballot_sync(full, own);
    if (!owners) {
        if (direct && lane == leader)
            fr_dev_record_error(s, FR_DEV_EIO); /* rows larger than pages: never chosen */
        return;
    }
    fr_u32 nown = (fr_u32)__popc(owners);
    fr_u32 nreq = (nown + per - 1) / per;
    fr_u32 idx = own ? (fr_u32)__popc(owners & ((1u << lane) - 1)) : 0;
    fr_u32 chunk = idx / per, slot = idx % per;
    int lead = own && slot == 0;
    /* Consecutive tickets for the warp's requests, one atomic (the same
     * reason as for page loads: waits on full cells cannot form a cycle). */
    int first = __ffs(owners) - 1;
    unsigned long long base = 0;
    if (lane == (unsigned)first)
        base = fr_atom_add64(ring->tail, (fr_u64)nreq);
    base = __shfl_sync(full, base, first);
    fr_u64 ticket = base + chunk;
    int rc = lead ? fr_ring_claim(s, ring, ticket, &cnt->c[FR_CNT_RING_FULL]) : 0;
    unsigned leads = __ballot_sync(full, lead);
    int lead_lane = own ? (int)__fns(leads, 0, (int)chunk + 1) : (int)lane;
    int crc = __shfl_sync(full, rc, lead_lane);
    if (own && crc == 0)
        fr_store64((fr_u64 *)fr_ring_staging(ring, ticket) + slot, (fr_u64)id * rb);
    /* The offsets reach host memory before any leader's release store. */
    __threadfence_system();
    __syncwarp();
    int submitted = 0;
    if (lead && rc == 0) {
        fr_u32 count = nown - chunk * per < per ? nown - chunk * per : per;
        fr_ring_publish(ring, ticket, rb, FR_RING_ROWS | count);
        submitted = 1;
        rc = fr_ring_wait(s, ring, ticket);
    }
    crc = __shfl_sync(full, rc, lead_lane);
    /* Each lane copies from its group's owner's slot. */
    fr_u64 t = __shfl_sync(full, (unsigned long long)ticket, leader);
    fr_u32 sl = __shfl_sync(full, slot, leader);
    int r = __shfl_sync(full, crc, leader);
    const fr_u8 *src = direct && r == 0 ? fr_ring_staging(ring, t) + (fr_u64)sl * rb : 0;
    fr_warp_copy_rows<true>(out, src, pos, rb, lane);
    __syncwarp();
    if (own && crc == 0) {
        cnt->c[FR_CNT_DIRECT_ROWS] += __popc(group);
        cnt->c[FR_CNT_COALESCED] += __popc(group) - 1;
    }
    if (lead) {
        if (rc)
            fr_dev_record_error(s, rc);
        /* A timed-out or cancelled cell stays taken: the host resets the ring. */
        if (submitted && rc != FR_DEV_ETIMEDOUT && rc != FR_DEV_ECANCELED)
            fr_ring_release(ring, ticket);
    }
    /* Hot rows (see "Hot rows"), after the cell is free: each fetched row
     * counted once per warp with its lanes' number; one that reaches the
     * gather's rows_list_from is listed with the owner's output position
     * (where the warp just wrote it), one atomic per warp on the list's
     * counter. */
    if (epoch && s->rowc.tags) {
        fr_u32 from = fr_load32(&s->result->rows_list_from);
        int listed = own && crc == 0 &&
                     fr_rows_mark(&s->rowc, (fr_u64)id,
                                  fr_rows_note(&s->rowc, (fr_u64)id, (fr_u32)__popc(group)), epoch,
                                  from);
        unsigned lists = __ballot_sync(full, listed);
        if (lists) {
            int fl = __ffs(lists) - 1;
            unsigned long long lbase = 0;
            if (lane == (unsigned)fl)
                lbase = fr_atom_add64(s->rowc.adm_n, (fr_u64)__popc(lists));
            lbase = __shfl_sync(full, lbase, fl);
            if (listed)
                fr_rows_put(&s->rowc, lbase + (fr_u64)__popc(lists & ((1u << lane) - 1)),
                            (fr_u64)id, pos);
        }
    }
}
#endif

static __device__ __noinline__ void fr_dev_gather_warp_slow(const fr_dev_store *s, fr_i64 id, fr_u64 pos,
                                                     fr_u8 *out, fr_dev_counts *cnt,
                                                     fr_u32 epoch, const fr_u8 *src,
                                                     int pending, fr_u64 page, int fetch_rows);

/* Called by all 32 lanes of a warp, converged: lane L gathers row id
 * (when `active`) to out + pos * row_bytes, for fastread's gather of pin
 * epoch `epoch` (0: no pins; users' kernels, fr_dev_gather_warp). Ids out
 * of range are recorded in result->first_bad (their rows are not written);
 * errors in result->error.
 *
 * First, with no atomics: rows of the host tier, and pages pinned for this
 * gather (fr_cache_pinned). The rest go through the counted cache: lanes
 * wanting the same page are grouped (__match_any_sync) and only the group's
 * leader touches the cache; every row is copied by the whole warp.
 *
 * No lane waits while a lane of its warp holds a slot reference: a lookup
 * that finds its page LOADING (or no free victim) does not spin in place;
 * the warp copies the rows it has, releases their slots, and retries the
 * rest. So references are only ever held for one copy, slots cannot all
 * be pinned by waiting warps, and the grid needs no bound from the cache
 * size. Loaders wait for their read holding only the EXCL bit of their
 * own slot. */
FR_DEV void fr_dev_gather_warp_e(const fr_dev_store *s, fr_i64 id, int active, fr_u64 pos,
                                 fr_u8 *out, fr_dev_counts *cnt, fr_u32 epoch, int fetch_rows)
{
    const unsigned full = 0xffffffffu;
    unsigned lane = threadIdx.x & 31;
    const fr_u64 rb = s->row_bytes;
    int valid = active && id >= 0 && (fr_u64)id < s->rows;
    if (active && !valid)
        atomicMin((unsigned long long *)&s->result->first_bad, (unsigned long long)pos);
    const fr_u8 *src = 0;
    if (valid && s->host_rows) {
        fr_i64 hs = s->host_slot ? (fr_i64)s->host_slot[id] : id;
        if (hs >= 0) {
            src = s->host_rows + (fr_u64)hs * rb;
            cnt->c[FR_CNT_HOST_TIER]++;
        }
    }
    int pending = valid && !src;
    if (pending && epoch && s->rowc.tags) { /* hot rows (see "Hot rows") */
        fr_u64 tag;
        fr_i64 rs = fr_rows_find(&s->rowc, (fr_u64)id, &tag);
        if (rs >= 0) {
            src = s->rowc.data + (fr_u64)rs * rb;
            if (!(tag & FR_RTAG_REF)) /* the first hit since it went in or was swept */
                fr_rows_hit_first(&s->rowc, rs, (fr_u64)id, tag);
            cnt->c[FR_CNT_ROW_HITS]++;
            pending = 0;
        }
    }
    fr_u64 page = pending ? (fr_u64)id / s->rows_per_page : 0;
    if (pending && epoch) {
        fr_u32 sl;
        if (fr_cache_pinned(&s->cache, page, epoch, &sl)) {
            src = fr_dev_slot_data(&s->cache, sl) + ((fr_u64)id % s->rows_per_page) * rb;
            cnt->c[FR_CNT_HITS]++;
            pending = 0;
        }
    }
    if (!__any_sync(full, pending)) { /* the hot path: every row ready */
        fr_warp_copy_rows(out, src, pos, rb, lane);
        return;
    }
    fr_dev_gather_warp_slow(s, id, pos, out, cnt, epoch, src, pending, page, fetch_rows);
}

/* The rest of fr_dev_gather_warp_e: rows whose pages need the counted cache
 * (hits not pinned, waits, loads). Kept out of line so that its registers
 * (ring, staging copies) do not weigh on the hot path's occupancy. */
static __device__ __noinline__ void fr_dev_gather_warp_slow(const fr_dev_store *s, fr_i64 id, fr_u64 pos,
                                                     fr_u8 *out, fr_dev_counts *cnt,
                                                     fr_u32 epoch, const fr_u8 *src,
                                                     int pending, fr_u64 page, int fetch_rows)
{
    const unsigned full = 0xffffffffu;
    unsigned lane = threadIdx.x & 31;
    const fr_u64 rb = s->row_bytes;
    fr_dev_waiter w;
    int waiting = 0;
#if !defined(FR_FETCH_EXTERN)
    if (fetch_rows) {
        /* Rows whose pages are absent (not loading, not cached) come
         * straight from storage; the others take the cache path below. So
         * do pages that many lanes of this warp want (fetch_rows 1: the
         * host's choice from the batch size, refined here by what the warp
         * sees; 2: forced): a quarter of the page's rows, or 8 lanes. */
        int direct = pending && fr_load32(&s->cache.page_table[page]) == 0;
        unsigned same = __match_any_sync(full, pending ? (unsigned long long)page : ~0ull - lane);
        fr_u32 dense = s->rows_per_page < 32 ? s->rows_per_page : 32;
        if (fetch_rows == 1 && (fr_u32)__popc(same) * 4 >= dense)
            direct = 0;
        if (__any_sync(full, direct)) {
            fr_dev_fetch_rows_warp(s, id, direct, pos, out, cnt, epoch);
            pending = pending && !direct;
        }
    }
#else
    (void)fetch_rows;
#endif
    for (;;) {
        unsigned group =
            __match_any_sync(full, pending ? (unsigned long long)page : ~0ull - lane);
        unsigned leader = __ffs(group) - 1;
        fr_u32 slot = 0;
#if !defined(FR_FETCH_EXTERN)
        fr_u64 ticket = 0;
#endif
        /* 1: slot held; 2 (proxy): page in staging, the warp copies it in;
         * < 0: error; 0: try again */
        int res = 0;
        int own = 0;
        if (pending && lane == leader) {
            int r = fr_cache_lookup_e(&s->cache, page, &slot, &cnt->c[FR_CNT_EVICTIONS], epoch);
            if (r == FR_OWN) {
                own = 1;
            } else if (r == FR_HIT) {
                if (waiting)
                    cnt->c[FR_CNT_COALESCED]++; /* waited on another's load */
                else
                    cnt->c[FR_CNT_HITS] += __popc(group);
                res = 1;
            } else if (!waiting) {
                waiting = 1;
                fr_dev_wait_start(s, &w, 2048);
            } else {
                res = fr_dev_wait_step(s, &w);
            }
        }
#if defined(FR_FETCH_EXTERN)
        if (own) {
            int rc = fr_dev_fetch_page(s, page, fr_dev_slot_data(&s->cache, slot),
                                       fr_dev_page_len(s, page), cnt);
            if (rc) {
                fr_cache_abandon(&s->cache, page, slot);
                res = rc;
            } else {
                fr_cache_publish_e(&s->cache, page, slot, epoch);
                cnt->c[FR_CNT_MISSES]++;
                res = 1;
            }
        }
#else
        /* The warp's loaders take consecutive tickets with one atomic. Why
         * it matters: a loader whose cell is still held by the previous lap
         * waits, and its warp keeps its other cells until the round ends;
         * with each round's tickets within 32 of each other, every such
         * wait points ~ring_entries tickets back, so waits cannot form a
         * cycle (scattered tickets could, and did: a 4 KiB-page gather hung
         * until the timeout). */
        unsigned owners = __ballot_sync(full, own);
        if (owners) {
            const fr_dev_ring *ring = &s->fetch.ring;
            int first = __ffs(owners) - 1;
            unsigned long long base = 0;
            if (lane == (unsigned)first)
                base = fr_atom_add64(ring->tail, (fr_u64)__popc(owners));
            base = __shfl_sync(full, base, first);
            if (own) {
                ticket = base + (fr_u64)__popc(owners & ((1u << lane) - 1));
                int rc = fr_ring_submit_at(s, ring, page, fr_dev_page_len(s, page), ticket,
                                           &cnt->c[FR_CNT_RING_FULL]);
                if (rc == 0) {
                    rc = fr_ring_wait(s, ring, ticket);
                    if (rc != 0 && rc != FR_DEV_ETIMEDOUT && rc != FR_DEV_ECANCELED)
                        fr_ring_release(ring, ticket); /* the host said no: cell done */
                }
                if (rc) {
                    fr_cache_abandon(&s->cache, page, slot);
                    res = rc;
                } else {
                    res = 2;
                }
            }
        }
#endif
        if (pending && lane == leader) {
            if (res >= 1)
                cnt->c[FR_CNT_COALESCED] += __popc(group) - 1;
            if (res < 0)
                fr_dev_record_error(s, res);
        }
#if !defined(FR_FETCH_EXTERN)
        /* Pages the leaders brought into staging: the whole warp copies each
         * into its cache slot (16 bytes a lane, ld.cv: the host just wrote
         * it), then its leader frees the ring cell and publishes the page. */
        unsigned loaded = __ballot_sync(full, pending && lane == leader && res == 2);
        while (loaded) {
            int j = __ffs(loaded) - 1;
            loaded &= loaded - 1;
            fr_u64 tj = __shfl_sync(full, (unsigned long long)ticket, j);
            fr_u32 sj = __shfl_sync(full, slot, j);
            fr_u64 pj = __shfl_sync(full, (unsigned long long)page, j);
            fr_u32 len = fr_dev_page_len(s, pj);
            fr_u8 *dst = fr_dev_slot_data(&s->cache, sj);
            const fr_u8 *from = fr_ring_staging(&s->fetch.ring, tj);
            if (((len | (fr_u64)from) & 15) == 0) {
                for (fr_u64 o = (fr_u64)lane * 16; o < len; o += 4 * 512) {
                    uint4 v[4];
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        if (o + k * 512 < len)
                            v[k] = __ldcv((const uint4 *)(from + o + k * 512));
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        if (o + k * 512 < len)
                            *(uint4 *)(dst + o + k * 512) = v[k];
                }
            } else {
                for (fr_u64 o = lane; o < len; o += 32)
                    dst[o] = *(const volatile fr_u8 *)(from + o);
            }
            __syncwarp();
            if (lane == j) {
                fr_ring_release(&s->fetch.ring, tj);
                fr_cache_publish_e(&s->cache, pj, sj, epoch);
                cnt->c[FR_CNT_MISSES]++;
                res = 1;
            }
        }
#endif
        res = __shfl_sync(full, res, leader);
        slot = __shfl_sync(full, slot, leader);
        int held = pending && lane == leader && res == 1;
        if (pending && res != 0) {
            pending = 0;
            if (res == 1)
                src = fr_dev_slot_data(&s->cache, slot) + ((fr_u64)id % s->rows_per_page) * rb;
        }
        /* Every row ready in this round, copied by the whole warp. */
        fr_warp_copy_rows(out, src, pos, rb, lane);
        __syncwarp();
        if (held)
            fr_cache_release(&s->cache, slot);
        src = 0;
        if (!__any_sync(full, pending))
            break;
    }
}

/* The same for users' kernels (no pins: see "Pins"). */
FR_DEV void fr_dev_gather_warp(const fr_dev_store *s, fr_i64 id, int active, fr_u64 pos,
                               fr_u8 *out, fr_dev_counts *cnt)
{
    fr_dev_gather_warp_e(s, id, active, pos, out, cnt, 0, 0);
}

FR_DEV fr_u64 fr_warp_sum(fr_u64 v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Adds a warp's counters to the result: one atomic per counter per warp. */
FR_DEV void fr_dev_flush_counts(const fr_dev_store *s, const fr_dev_counts *cnt)
{
    for (int k = 0; k < FR_NCOUNTERS; k++) {
        fr_u64 v = fr_warp_sum(cnt->c[k]);
        if ((threadIdx.x & 31) == 0 && v)
            atomicAdd((unsigned long long *)&s->result->counters[k], (unsigned long long)v);
    }
}

#ifdef FR_DEFINE_GATHER_KERNEL
/* Locality order, pass 1: counts[b] += ids in bucket b (counts zeroed by
 * the host; nbuckets <= FR_ORDER_MAX_BUCKETS). Per-block histograms in
 * shared memory, one global atomic per bucket per block. */
extern "C" __global__ void __launch_bounds__(256)
fr_order_count(const void *ids, int id_bytes, unsigned long long n, unsigned long long rows,
               unsigned shift, unsigned nbuckets, unsigned *counts)
{
    __shared__ unsigned hist[FR_ORDER_MAX_BUCKETS];
    for (unsigned b = threadIdx.x; b < nbuckets; b += blockDim.x)
        hist[b] = 0;
    __syncthreads();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        atomicAdd(&hist[fr_order_bucket(fr_load_id(ids, id_bytes, i), rows, shift, nbuckets)], 1u);
    __syncthreads();
    for (unsigned b = threadIdx.x; b < nbuckets; b += blockDim.x)
        if (hist[b])
            atomicAdd(&counts[b], hist[b]);
}

/* TinyLFU's reset: every sketch counter halved and the doorkeeper
 * emptied, on the gather's stream before the pass (a launch of its own:
 * the pass's estimates then read one sketch, not one being halved under
 * them). */
extern "C" __global__ void __launch_bounds__(256) fr_rows_age(const fr_dev_store *s)
{
    const fr_dev_rows *r = &s->rowc;
    if (!r->tags)
        return;
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = tid; i < 2ull * ((fr_u64)r->width_mask + 1); i += nth)
        r->sketch[i] >>= 1;
    for (unsigned long long i = tid; i <= r->door_mask; i += nth)
        r->door[i] = 0;
}

/* The hot-row cache's pass after gather `s->result->epoch` (same stream:
 * no gather of ours runs): each listed candidate copied from the gather's
 * output `out` into the cache where the policy lets it in ("Hot rows").
 * Nothing is admitted after a failed gather (the host resets the cache). */
extern "C" __global__ void __launch_bounds__(256)
fr_rows_admit(const fr_dev_store *s, const fr_u8 *out)
{
    const fr_dev_rows *r = &s->rowc;
    if (!r->tags)
        return;
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    if (*(volatile fr_i32 *)&s->result->error != 0)
        return;
    fr_u64 n = *(volatile fr_u64 *)r->adm_n;
    fr_u32 floor = fr_rows_pass_floor(r, n);
    if (n > r->adm_cap)
        n = r->adm_cap;
    unsigned long long in = 0, filled = 0;
    for (unsigned long long i = tid; i < n; i += nth) {
        fr_u64 id = r->adm[2 * i], pos = r->adm[2 * i + 1];
        int got = fr_rows_admit_one(r, s->row_bytes, id, out + pos * s->row_bytes, floor);
        in += got != FR_ROWS_OUT;
        filled += got == FR_ROWS_FILLED;
    }
    if (in)
        atomicAdd((unsigned long long *)&s->result->counters[FR_CNT_ADMITTED], in);
    if (filled)
        atomicAdd((unsigned long long *)&s->result->row_fills, filled);
}

/* Pass 2: order[k] = the positions of ids, bucket by bucket. Each block
 * takes tiles of FR_ORDER_TILE ids: counts them per bucket, reserves that
 * many places in each bucket with one atomic on fill[b], then places them
 * (start of bucket b = the sum of counts below b, computed per block). */
#define FR_ORDER_TILE 4096u
extern "C" __global__ void __launch_bounds__(256)
fr_order_place(const void *ids, int id_bytes, unsigned long long n, unsigned long long rows,
               unsigned shift, unsigned nbuckets, const unsigned *counts, unsigned *fill,
               unsigned *order)
{
    __shared__ unsigned start[FR_ORDER_MAX_BUCKETS];
    __shared__ unsigned local[FR_ORDER_MAX_BUCKETS];
    __shared__ unsigned base[FR_ORDER_MAX_BUCKETS];
    if (threadIdx.x == 0) { /* nbuckets is small: a serial scan is cheap */
        unsigned acc = 0;
        for (unsigned b = 0; b < nbuckets; b++) {
            start[b] = acc;
            acc += counts[b];
        }
    }
    for (unsigned long long t0 = (unsigned long long)blockIdx.x * FR_ORDER_TILE; t0 < n;
         t0 += (unsigned long long)gridDim.x * FR_ORDER_TILE) {
        unsigned long long t1 = t0 + FR_ORDER_TILE < n ? t0 + FR_ORDER_TILE : n;
        for (unsigned b = threadIdx.x; b < nbuckets; b += blockDim.x)
            local[b] = 0;
        __syncthreads();
        for (unsigned long long i = t0 + threadIdx.x; i < t1; i += blockDim.x)
            atomicAdd(&local[fr_order_bucket(fr_load_id(ids, id_bytes, i), rows, shift, nbuckets)],
                      1u);
        __syncthreads();
        for (unsigned b = threadIdx.x; b < nbuckets; b += blockDim.x) {
            base[b] = local[b] ? start[b] + atomicAdd(&fill[b], local[b]) : 0;
            local[b] = 0;
        }
        __syncthreads();
        for (unsigned long long i = t0 + threadIdx.x; i < t1; i += blockDim.x) {
            fr_u32 b = fr_order_bucket(fr_load_id(ids, id_bytes, i), rows, shift, nbuckets);
            order[base[b] + atomicAdd(&local[b], 1u)] = (unsigned)i;
        }
        __syncthreads();
    }
}

/* fastread's own gather: rows ids[0..n) to out, grid-stride over warps
 * (blockDim.x a multiple of 32), in the order `order` gives (a permutation
 * of 0..n-1 from fr_order_place; NULL: 0..n-1). Stops early once the host
 * aborts or any lane failed (the host reports result->error). */
extern "C" __global__ void __launch_bounds__(256, 2)
fr_gather_rows(const fr_dev_store *s, const void *ids, int id_bytes,
                                          unsigned long long n, fr_u8 *out, const unsigned *order)
{
    unsigned lane = threadIdx.x & 31;
    unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned long long nwarps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    fr_dev_counts cnt;
    for (int k = 0; k < FR_NCOUNTERS; k++)
        cnt.c[k] = 0;
    fr_u32 epoch = s->cache.pins ? fr_load32(&s->result->epoch) : 0;
    int fetch_rows = (int)fr_load32(&s->result->fetch_rows);
    for (unsigned long long base = warp * 32; base < n; base += nwarps * 32) {
        /* Only the error word in device memory, not the abort flag in host
         * memory: thousands of warps reading one host word each round queue
         * over PCIe (about a microsecond each). Waits look at the abort flag
         * (fr_dev_wait_step) and turn it into an error that stops everyone;
         * a gather that never waits finishes soon anyway. */
        int stop = 0;
        if (lane == 0)
            stop = *(volatile fr_i32 *)&s->result->error != 0;
        if (__shfl_sync(0xffffffffu, stop, 0))
            break;
        unsigned long long pos = base + lane;
        int active = pos < n;
        fr_i64 id = 0;
        if (active) {
            if (order)
                pos = order[pos];
            id = fr_load_id(ids, id_bytes, pos);
        }
        fr_dev_gather_warp_e(s, id, active, pos, out, &cnt, epoch, fetch_rows);
    }
    fr_dev_flush_counts(s, &cnt);
}
#endif /* FR_DEFINE_GATHER_KERNEL */

#endif /* FR_GPU */

#endif /* FASTREAD_DEVICE_WARP_CUH */
