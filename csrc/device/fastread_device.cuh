/*
 * fastread_device.cuh: GPU-initiated reads of a storage-backed row array
 * (fastread's fr_store, gather.h) from CUDA kernels.
 *
 * A small header of inline functions in the style of BaM's bam::array and
 * xNVMe's libxnvme_cuda.h. A kernel gets a `const fr_dev_store *` (from
 * fr_store_device_view, or FeatureStore.device_view in Python) and reads
 * rows with
 *     fr_dev_gather_warp(s, id, active, pos, out, &counts)   all 32 lanes
 *     fr_dev_read_row(s, id, dst)                             one thread
 * Rows come from, in this order: the page-locked host tier (mapped host
 * memory read over PCIe), the software page cache in HBM, storage (a page
 * read requested through the store's backend, by default the submission
 * ring below, served by fastread's host threads).
 *
 * The cache. The array is cut into pages of page_bytes (a power of two,
 * 4 KiB..1 MiB; row_bytes divides it, so no row straddles two pages). A page
 * table holds, per page of the array, 0 (absent), FR_PT_LOADING (one thread
 * is reading it) or slot+1. Per slot: the tag (the page it holds), a
 * reference count whose top bit (FR_REF_EXCL) is the exclusive right to
 * (re)load or evict the slot, and a clock bit.
 *   - Hit: read the page table, take a reference, re-check the tag (the
 *     slot may have been reassigned between the two reads: then drop the
 *     reference and retry).
 *   - Miss: CAS the page table entry 0 -> LOADING (exactly one loader per
 *     page; every other thread wanting the page waits on LOADING: one read,
 *     many waiters), pick a victim slot (CAS refs 0 -> EXCL: no reader holds
 *     it), unmap its old page, fetch, publish (refs EXCL -> 1, then the page
 *     table entry -> slot+1).
 *   - Replacement is CLOCK (second chance): a hit costs one plain store of
 *     the slot's clock bit, eviction sweeps a shared hand with one atomic per
 *     step. LRU would need a globally ordered list updated by every hit,
 *     i.e. contended atomics on the hottest data from hundreds of thousands
 *     of threads; CLOCK approximates LRU (recently used pages survive one
 *     sweep) and keeps hits read-mostly, which is what the 500M rows/s hot
 *     path needs.
 *   - Within a warp, lanes wanting the same page are grouped with
 *     __match_any_sync; only the group's leader touches the cache, and the
 *     rows are copied by the whole warp with 16-byte loads.
 *   - Deadlock freedom needs a free victim for every loader: a warp holds at
 *     most 32 slots at once (one page per lane, released before its next
 *     rows), so the host launches at most nslots / 64 warps.
 *
 * The submission ring (backend "proxy"): cells in page-locked host memory
 * mapped into the device, each with a 64-bit sequence word
 * seq = 4 * lap + state (state 0 free for that lap, 1 submitted, 3 done).
 * A GPU thread takes a ticket t (atomicAdd on a device counter); its cell is
 * t mod entries and its lap t / entries. It waits until seq == 4*lap (the
 * previous lap's owner released the cell: back-pressure when the ring is
 * full), writes the request, publishes seq = 4*lap+1 (st.release.sys), and
 * polls for 4*lap+3; the host thread that owns the cell's shard reads the
 * page into the cell's staging page, writes the status and publishes
 * 4*lap+3; the GPU thread copies staging -> cache slot and frees the cell
 * (seq = 4*(lap+1)). 64-bit tickets and sequences never wrap in practice.
 *
 * Every wait has a timeout (timeout_ns, measured with %globaltimer) and
 * checks an abort flag the host sets (in mapped host memory): a failed read
 * or a closing store ends the kernel with an error, never a hang.
 *
 * Portability: the cache and ring algorithms are written once against a
 * small shim (atomics, fences, clock, pause) and compile both as CUDA
 * (nvcc, NVRTC, CuPy RawModule) and as plain C11 on the host, where
 * fastread's tests run them with pthreads playing GPU threads. Build it
 * into NVRTC or CuPy with: #include "fastread_device.cuh" (sm_70 or newer).
 */
#ifndef FASTREAD_DEVICE_CUH
#define FASTREAD_DEVICE_CUH

/* ------------------------------------------------------------------ shim */
#if defined(__CUDACC_RTC__)
/* NVRTC has no C library headers. */
typedef unsigned char uint8_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#define FR_GPU 1
#elif defined(__CUDACC__)
#include <stdint.h>
#define FR_GPU 1
#else
#include <stdint.h>
#include <string.h>
#include <threads.h>
#include <time.h>
#endif

#ifdef FR_GPU
#define FR_DEV static __device__ __forceinline__
#else
#define FR_DEV static inline
#endif

/* Negative errno values, as Linux numbers them (the host reports them). */
#define FR_DEV_EIO (-5)
#define FR_DEV_ENOMEM (-12)
#define FR_DEV_ERANGE (-34)
#define FR_DEV_ETIMEDOUT (-110)
#define FR_DEV_ECANCELED (-125)

#define FR_PT_LOADING 0xFFFFFFFFu
#define FR_REF_EXCL 0x80000000u
#define FR_TAG_NONE 0xFFFFFFFFFFFFFFFFull

#ifdef FR_GPU
FR_DEV uint32_t fr_atom_add32(uint32_t *p, uint32_t v) { return atomicAdd((unsigned int *)p, v); }
FR_DEV uint32_t fr_atom_cas32(uint32_t *p, uint32_t e, uint32_t d)
{
    return atomicCAS((unsigned int *)p, e, d);
}
FR_DEV uint64_t fr_atom_add64(uint64_t *p, uint64_t v)
{
    return atomicAdd((unsigned long long *)p, (unsigned long long)v);
}
FR_DEV uint32_t fr_load32(const uint32_t *p) { return *(const volatile uint32_t *)p; }
FR_DEV void fr_store32(uint32_t *p, uint32_t v) { *(volatile uint32_t *)p = v; }
FR_DEV uint64_t fr_load64(const uint64_t *p) { return *(const volatile uint64_t *)p; }
FR_DEV void fr_store64(uint64_t *p, uint64_t v) { *(volatile uint64_t *)p = v; }
/* Orders this thread's accesses to device memory before/after (the cache). */
FR_DEV void fr_fence(void) { __threadfence(); }
/* System scope: words the host reads or writes (ring cells, staging). */
FR_DEV uint64_t fr_sys_load_acq64(const uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
FR_DEV void fr_sys_store_rel64(uint64_t *p, uint64_t v)
{
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
FR_DEV uint64_t fr_dev_now_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
FR_DEV void fr_pause(void) { __nanosleep(128); }
#else
FR_DEV uint32_t fr_atom_add32(uint32_t *p, uint32_t v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
FR_DEV uint32_t fr_atom_cas32(uint32_t *p, uint32_t e, uint32_t d)
{
    __atomic_compare_exchange_n(p, &e, d, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return e; /* the old value, as CUDA's atomicCAS returns it */
}
FR_DEV uint64_t fr_atom_add64(uint64_t *p, uint64_t v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
FR_DEV uint32_t fr_load32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
FR_DEV void fr_store32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
FR_DEV uint64_t fr_load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
FR_DEV void fr_store64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
FR_DEV void fr_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
FR_DEV uint64_t fr_sys_load_acq64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
FR_DEV void fr_sys_store_rel64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
FR_DEV uint64_t fr_dev_now_ns(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
FR_DEV void fr_pause(void) { thrd_yield(); }
#endif

/* Byte copy with 16-byte accesses where both ends and the length allow. */
FR_DEV void fr_copy_bytes(uint8_t *dst, const uint8_t *src, uint64_t len)
{
#ifdef FR_GPU
    if ((((uint64_t)dst | (uint64_t)src | len) & 15) == 0) {
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        uint64_t n = len / 16;
#pragma unroll 4
        for (uint64_t i = 0; i < n; i++)
            d[i] = s[i];
        return;
    }
    for (uint64_t i = 0; i < len; i++)
        dst[i] = src[i];
#else
    memcpy(dst, src, (size_t)len);
#endif
}

/* ------------------------------------------------------------ the layout */
/* Shared by the host (which builds it) and the device (which reads it):
 * plain C structs of fixed-size fields, the same on both sides. */

typedef struct fr_dev_ring_cell {
    uint64_t seq;    /* 4 * lap + state: 0 free, 1 submitted, 3 done */
    uint64_t page;   /* request: page of the array */
    uint32_t len;    /* request: bytes of the page (the last may be short) */
    int32_t status;  /* completion: 0 or -errno */
    uint64_t pad;
} fr_dev_ring_cell;

typedef struct fr_dev_ring {
    fr_dev_ring_cell *cells; /* page-locked host memory, mapped */
    uint8_t *staging;        /* entries * page_bytes, page-locked, mapped */
    uint64_t *tail;          /* tickets taken (device memory) */
    uint32_t log2_entries;
    uint32_t page_bytes;
} fr_dev_ring;

/* The backend's words of the view (gather_backend.h). */
typedef union fr_dev_fetch {
    fr_dev_ring ring;
    uint64_t words[16];
} fr_dev_fetch;

typedef struct fr_dev_cache {
    uint32_t *page_table; /* per page: 0, FR_PT_LOADING or slot + 1 */
    uint64_t *tags;       /* per slot: the page it holds, FR_TAG_NONE */
    uint32_t *refs;       /* per slot: holders | FR_REF_EXCL */
    uint32_t *clock_bits; /* per slot: used since the hand last passed */
    uint32_t *hand;       /* the clock hand (a counter; mod nslots) */
    uint8_t *data;        /* nslots * page_bytes */
    uint64_t npages;
    uint32_t nslots;
    uint32_t page_bytes;
} fr_dev_cache;

enum {
    FR_CNT_HITS,        /* rows served from the HBM cache */
    FR_CNT_MISSES,      /* pages loaded into the cache */
    FR_CNT_COALESCED,   /* lookups merged: same page in a warp, or waits on a LOADING page */
    FR_CNT_HOST_TIER,   /* rows read from the page-locked host tier */
    FR_CNT_EVICTIONS,   /* pages replaced */
    FR_CNT_RING_FULL,   /* submissions that waited for a free ring cell */
    FR_NCOUNTERS = 8
};

/* Written by the kernel (device memory), read back by the host. */
typedef struct fr_dev_result {
    uint64_t first_bad;  /* position of the first id out of range; ~0: none */
    int32_t error;       /* first error (negative errno); 0: none */
    uint32_t pad;
    uint64_t counters[FR_NCOUNTERS];
} fr_dev_result;

typedef struct fr_dev_counts {
    uint64_t c[FR_NCOUNTERS];
} fr_dev_counts;

typedef struct fr_dev_store {
    uint64_t rows, row_bytes;
    uint64_t offset;          /* byte offset of row 0 in the file */
    uint64_t data_bytes;      /* rows * row_bytes */
    uint32_t rows_per_page;   /* page_bytes / row_bytes */
    uint32_t pad0;
    uint64_t timeout_ns;      /* every device-side wait gives up after this */
    fr_dev_cache cache;
    const uint8_t *host_rows; /* host tier (mapped): all rows, or hot rows by slot */
    const int32_t *host_slot; /* per row: its slot in host_rows, -1 absent; NULL: all rows */
    uint32_t *abort;          /* mapped host memory: nonzero, the host cancels */
    fr_dev_result *result;
    fr_dev_fetch fetch;
} fr_dev_store;

/* --------------------------------------------------------------- helpers */

FR_DEV int fr_dev_aborted(const fr_dev_store *s) { return fr_load32(s->abort) != 0; }

FR_DEV uint32_t fr_dev_page_len(const fr_dev_store *s, uint64_t page)
{
    uint64_t start = page * s->cache.page_bytes;
    uint64_t left = s->data_bytes - start;
    return left < s->cache.page_bytes ? (uint32_t)left : s->cache.page_bytes;
}

FR_DEV uint8_t *fr_dev_slot_data(const fr_dev_cache *c, uint32_t slot)
{
    return c->data + (uint64_t)slot * c->page_bytes;
}

/* 0 while waiting may go on; else why to stop. */
FR_DEV int fr_dev_wait_check(const fr_dev_store *s, uint64_t deadline)
{
    if (fr_dev_aborted(s))
        return FR_DEV_ECANCELED;
    if (fr_dev_now_ns() >= deadline)
        return FR_DEV_ETIMEDOUT;
    fr_pause();
    return 0;
}

/* ------------------------------------------------------------------ ring */

/* Takes a ticket and submits a read of `page` (len bytes). Waits (up to the
 * timeout) while the ring is full; *full_waits counts that. 0 or -errno;
 * *ticket names the request for fr_ring_wait / fr_ring_release. */
FR_DEV int fr_ring_submit(const fr_dev_store *s, const fr_dev_ring *r, uint64_t page,
                          uint32_t len, uint64_t *ticket, uint64_t *full_waits)
{
    uint64_t t = fr_atom_add64(r->tail, 1);
    fr_dev_ring_cell *c = &r->cells[t & ((1ull << r->log2_entries) - 1)];
    uint64_t lap = t >> r->log2_entries;
    *ticket = t;
    if (fr_sys_load_acq64(&c->seq) != 4 * lap) {
        (*full_waits)++;
        uint64_t deadline = fr_dev_now_ns() + s->timeout_ns;
        while (fr_sys_load_acq64(&c->seq) != 4 * lap) {
            int rc = fr_dev_wait_check(s, deadline);
            if (rc)
                return rc;
        }
    }
    c->page = page;
    c->len = len;
    fr_sys_store_rel64(&c->seq, 4 * lap + 1);
    return 0;
}

/* Waits for request `ticket`: its status (0 or -errno from the host), or a
 * timeout / cancel. The cell stays ours until fr_ring_release. */
FR_DEV int fr_ring_wait(const fr_dev_store *s, const fr_dev_ring *r, uint64_t ticket)
{
    fr_dev_ring_cell *c = &r->cells[ticket & ((1ull << r->log2_entries) - 1)];
    uint64_t done = 4 * (ticket >> r->log2_entries) + 3;
    if (fr_sys_load_acq64(&c->seq) != done) {
        uint64_t deadline = fr_dev_now_ns() + s->timeout_ns;
        while (fr_sys_load_acq64(&c->seq) != done) {
            int rc = fr_dev_wait_check(s, deadline);
            if (rc)
                return rc;
        }
    }
    return *(volatile int32_t *)&c->status;
}

FR_DEV const uint8_t *fr_ring_staging(const fr_dev_ring *r, uint64_t ticket)
{
    return r->staging + (ticket & ((1ull << r->log2_entries) - 1)) * (uint64_t)r->page_bytes;
}

/* Frees the request's cell for the next lap. */
FR_DEV void fr_ring_release(const fr_dev_ring *r, uint64_t ticket)
{
    fr_dev_ring_cell *c = &r->cells[ticket & ((1ull << r->log2_entries) - 1)];
    fr_sys_store_rel64(&c->seq, 4 * ((ticket >> r->log2_entries) + 1));
}

/* ------------------------------------------------------ backend fetches */

#if defined(FR_FETCH_EXTERN)
/* The backend's device half (gather_backend.h), compiled in after this
 * header. */
FR_DEV int fr_backend_fetch_page(const fr_dev_store *s, uint64_t page, uint8_t *dst, uint32_t len,
                                 uint64_t deadline_ns);
#endif

/* Brings `len` bytes of page `page` into dst (one thread). */
FR_DEV int fr_dev_fetch_page(const fr_dev_store *s, uint64_t page, uint8_t *dst, uint32_t len,
                             fr_dev_counts *cnt)
{
#if defined(FR_FETCH_EXTERN)
    (void)cnt;
    return fr_backend_fetch_page(s, page, dst, len, fr_dev_now_ns() + s->timeout_ns);
#else
    const fr_dev_ring *r = &s->fetch.ring;
    uint64_t t;
    int rc = fr_ring_submit(s, r, page, len, &t, &cnt->c[FR_CNT_RING_FULL]);
    if (rc)
        return rc;
    rc = fr_ring_wait(s, r, t);
    if (rc == FR_DEV_ETIMEDOUT || rc == FR_DEV_ECANCELED)
        return rc; /* the cell stays taken: the host resets the ring */
    if (rc == 0)
        fr_copy_bytes(dst, fr_ring_staging(r, t), len);
    fr_ring_release(r, t);
    return rc;
#endif
}

/* ----------------------------------------------------------------- cache */

enum { FR_HIT = 0, FR_OWN = 1, FR_BUSY = 2 };

/* Clock sweep for a slot no one holds: EXCL taken on it, or -1 after two
 * full turns found none (every slot held or loading: the caller retries). */
FR_DEV int64_t fr_cache_victim(const fr_dev_cache *c)
{
    uint64_t steps = 2ull * c->nslots + 32;
    for (uint64_t k = 0; k < steps; k++) {
        uint32_t h = fr_atom_add32(c->hand, 1) % c->nslots;
        if (fr_load32(&c->clock_bits[h])) {
            fr_store32(&c->clock_bits[h], 0); /* second chance */
            continue;
        }
        if (fr_load32(&c->refs[h]) == 0 && fr_atom_cas32(&c->refs[h], 0, FR_REF_EXCL) == 0) {
            fr_fence();
            return h;
        }
    }
    return -1;
}

/* One look at page `page`: FR_HIT (a reference taken on *slot), FR_OWN
 * (this thread loads it into *slot: EXCL held, page table LOADING), or
 * FR_BUSY (another thread is loading it or the slot moved: retry). */
FR_DEV int fr_cache_lookup(const fr_dev_cache *c, uint64_t page, uint32_t *slot,
                           uint64_t *evictions)
{
    uint32_t e = fr_load32(&c->page_table[page]);
    if (e == FR_PT_LOADING)
        return FR_BUSY;
    if (e != 0) {
        uint32_t sl = e - 1;
        uint32_t r = fr_atom_add32(&c->refs[sl], 1);
        if (!(r & FR_REF_EXCL)) {
            fr_fence();
            if (fr_load64(&c->tags[sl]) == page) {
                if (!fr_load32(&c->clock_bits[sl]))
                    fr_store32(&c->clock_bits[sl], 1);
                *slot = sl;
                return FR_HIT;
            }
        }
        fr_atom_add32(&c->refs[sl], (uint32_t)-1);
        return FR_BUSY;
    }
    if (fr_atom_cas32(&c->page_table[page], 0, FR_PT_LOADING) != 0)
        return FR_BUSY;
    int64_t v = fr_cache_victim(c);
    if (v < 0) {
        fr_store32(&c->page_table[page], 0);
        return FR_BUSY;
    }
    uint32_t sl = (uint32_t)v;
    uint64_t old = fr_load64(&c->tags[sl]);
    if (old != FR_TAG_NONE) {
        fr_store32(&c->page_table[old], 0); /* only the EXCL holder changes it */
        (*evictions)++;
    }
    fr_store64(&c->tags[sl], page);
    fr_fence();
    *slot = sl;
    return FR_OWN;
}

/* The loader's page is in its slot: readers may have it (the loader keeps
 * one reference). */
FR_DEV void fr_cache_publish(const fr_dev_cache *c, uint64_t page, uint32_t slot)
{
    fr_fence();
    fr_store32(&c->clock_bits[slot], 1);
    fr_atom_add32(&c->refs[slot], 1u - FR_REF_EXCL);
    fr_fence();
    fr_store32(&c->page_table[page], slot + 1);
}

/* The load failed: the slot goes back empty and the page absent. */
FR_DEV void fr_cache_abandon(const fr_dev_cache *c, uint64_t page, uint32_t slot)
{
    fr_store64(&c->tags[slot], FR_TAG_NONE);
    fr_fence();
    fr_store32(&c->page_table[page], 0);
    fr_atom_add32(&c->refs[slot], (uint32_t)0 - FR_REF_EXCL);
}

FR_DEV void fr_cache_release(const fr_dev_cache *c, uint32_t slot)
{
    fr_fence();
    fr_atom_add32(&c->refs[slot], (uint32_t)-1);
}

enum { FR_GOT_HIT = 0, FR_GOT_MISS = 1, FR_GOT_WAITED = 2 };

/* Page `page` in the cache, loading it if needed (one thread). >= 0
 * (FR_GOT_*: a reference held on *slot; release it with fr_cache_release)
 * or a negative errno. */
FR_DEV int fr_cache_acquire(const fr_dev_store *s, uint64_t page, uint32_t *slot,
                            fr_dev_counts *cnt)
{
    uint64_t deadline = 0;
    int waited = 0;
    for (;;) {
        int r = fr_cache_lookup(&s->cache, page, slot, &cnt->c[FR_CNT_EVICTIONS]);
        if (r == FR_HIT)
            return waited ? FR_GOT_WAITED : FR_GOT_HIT;
        if (r == FR_OWN) {
            int rc = fr_dev_fetch_page(s, page, fr_dev_slot_data(&s->cache, *slot),
                                       fr_dev_page_len(s, page), cnt);
            if (rc) {
                fr_cache_abandon(&s->cache, page, *slot);
                return rc;
            }
            fr_cache_publish(&s->cache, page, *slot);
            cnt->c[FR_CNT_MISSES]++;
            return FR_GOT_MISS;
        }
        if (!waited) {
            waited = 1;
            deadline = fr_dev_now_ns() + s->timeout_ns;
        }
        int rc = fr_dev_wait_check(s, deadline);
        if (rc)
            return rc;
    }
}

/* Where row `id` is readable: host tier or (acquired) cache page. Returns
 * 0 with *src set, or -errno; *held is set to the slot+1 to release (0:
 * nothing held). One thread. */
FR_DEV int fr_dev_row_src(const fr_dev_store *s, uint64_t id, const uint8_t **src, uint32_t *held,
                          fr_dev_counts *cnt)
{
    *held = 0;
    if (s->host_rows) {
        int64_t hs = s->host_slot ? (int64_t)s->host_slot[id] : (int64_t)id;
        if (hs >= 0) {
            *src = s->host_rows + (uint64_t)hs * s->row_bytes;
            cnt->c[FR_CNT_HOST_TIER]++;
            return 0;
        }
    }
    uint64_t page = id / s->rows_per_page;
    uint32_t slot;
    int rc = fr_cache_acquire(s, page, &slot, cnt);
    if (rc < 0)
        return rc;
    if (rc == FR_GOT_HIT)
        cnt->c[FR_CNT_HITS]++;
    else if (rc == FR_GOT_WAITED)
        cnt->c[FR_CNT_COALESCED]++;
    *held = slot + 1;
    *src = fr_dev_slot_data(&s->cache, slot) + (id % s->rows_per_page) * s->row_bytes;
    return 0;
}

/* Row `id` to dst (one thread): 0, or -errno (FR_DEV_ERANGE for a bad id). */
FR_DEV int fr_dev_read_row(const fr_dev_store *s, int64_t id, void *dst, fr_dev_counts *cnt)
{
    if (id < 0 || (uint64_t)id >= s->rows)
        return FR_DEV_ERANGE;
    const uint8_t *src;
    uint32_t held;
    int rc = fr_dev_row_src(s, (uint64_t)id, &src, &held, cnt);
    if (rc)
        return rc;
    fr_copy_bytes((uint8_t *)dst, src, s->row_bytes);
    if (held)
        fr_cache_release(&s->cache, held - 1);
    return 0;
}

/* ------------------------------------------------------------ warp level */
#ifdef FR_GPU

FR_DEV void fr_dev_record_error(const fr_dev_store *s, int rc)
{
    atomicCAS((int *)&s->result->error, 0, rc);
}

/* All 32 lanes copy one row, 16 bytes a lane per step where aligned. */
FR_DEV void fr_warp_copy(uint8_t *dst, const uint8_t *src, uint64_t len, unsigned lane)
{
    if ((((uint64_t)dst | (uint64_t)src | len) & 15) == 0) {
        for (uint64_t o = (uint64_t)lane * 16; o < len; o += 32 * 16)
            *(uint4 *)(dst + o) = *(const uint4 *)(src + o);
    } else if ((((uint64_t)dst | (uint64_t)src | len) & 3) == 0) {
        for (uint64_t o = (uint64_t)lane * 4; o < len; o += 32 * 4)
            *(uint32_t *)(dst + o) = *(const uint32_t *)(src + o);
    } else {
        for (uint64_t o = lane; o < len; o += 32)
            dst[o] = src[o];
    }
}

/* Called by all 32 lanes of a warp, converged: lane L gathers row id
 * (when `active`) to out + pos * row_bytes. Lanes wanting the same page
 * share one cache lookup (__match_any_sync); every row is copied by the
 * whole warp. Ids out of range are recorded in result->first_bad (their
 * rows are not written); errors in result->error. */
FR_DEV void fr_dev_gather_warp(const fr_dev_store *s, int64_t id, int active, uint64_t pos,
                               uint8_t *out, fr_dev_counts *cnt)
{
    const unsigned full = 0xffffffffu;
    unsigned lane = threadIdx.x & 31;
    int valid = active && id >= 0 && (uint64_t)id < s->rows;
    if (active && !valid)
        atomicMin((unsigned long long *)&s->result->first_bad, (unsigned long long)pos);
    const uint8_t *src = 0;
    if (valid && s->host_rows) {
        int64_t hs = s->host_slot ? (int64_t)s->host_slot[id] : id;
        if (hs >= 0) {
            src = s->host_rows + (uint64_t)hs * s->row_bytes;
            cnt->c[FR_CNT_HOST_TIER]++;
        }
    }
    int need = valid && !src;
    uint64_t page = need ? (uint64_t)id / s->rows_per_page : ~0ull - lane;
    unsigned group = __match_any_sync(full, (unsigned long long)page);
    unsigned leader = __ffs(group) - 1;
    uint32_t slot = 0;
    int rc = 0;
    if (need && lane == leader) {
        rc = fr_cache_acquire(s, page, &slot, cnt);
        if (rc == FR_GOT_HIT)
            cnt->c[FR_CNT_HITS] += __popc(group);
        else if (rc == FR_GOT_WAITED)
            cnt->c[FR_CNT_COALESCED]++;
        if (rc >= 0)
            cnt->c[FR_CNT_COALESCED] += __popc(group) - 1;
        else
            fr_dev_record_error(s, rc);
    }
    rc = __shfl_sync(full, rc, leader);
    slot = __shfl_sync(full, slot, leader);
    if (need && rc >= 0)
        src = fr_dev_slot_data(&s->cache, slot) + ((uint64_t)id % s->rows_per_page) * s->row_bytes;
    for (int j = 0; j < 32; j++) {
        const uint8_t *sj = (const uint8_t *)__shfl_sync(full, (unsigned long long)src, j);
        unsigned long long pj = __shfl_sync(full, (unsigned long long)pos, j);
        if (sj)
            fr_warp_copy(out + pj * s->row_bytes, sj, s->row_bytes, lane);
    }
    __syncwarp();
    if (need && lane == leader && rc >= 0)
        fr_cache_release(&s->cache, slot);
}

FR_DEV uint64_t fr_warp_sum(uint64_t v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Adds a warp's counters to the result: one atomic per counter per warp. */
FR_DEV void fr_dev_flush_counts(const fr_dev_store *s, const fr_dev_counts *cnt)
{
    for (int k = 0; k < FR_NCOUNTERS; k++) {
        uint64_t v = fr_warp_sum(cnt->c[k]);
        if ((threadIdx.x & 31) == 0 && v)
            atomicAdd((unsigned long long *)&s->result->counters[k], (unsigned long long)v);
    }
}

#ifdef FR_DEFINE_GATHER_KERNEL
/* fastread's own gather: rows ids[0..n) to out, grid-stride over warps
 * (blockDim.x a multiple of 32). Stops early once the host aborts or any
 * lane failed (the host reports result->error). */
extern "C" __global__ void fr_gather_rows(const fr_dev_store *s, const void *ids, int id_bytes,
                                          unsigned long long n, uint8_t *out)
{
    unsigned lane = threadIdx.x & 31;
    unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned long long nwarps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    fr_dev_counts cnt;
    for (int k = 0; k < FR_NCOUNTERS; k++)
        cnt.c[k] = 0;
    for (unsigned long long base = warp * 32; base < n; base += nwarps * 32) {
        int stop = 0;
        if (lane == 0)
            stop = fr_dev_aborted(s) || *(volatile int32_t *)&s->result->error != 0;
        if (__shfl_sync(0xffffffffu, stop, 0))
            break;
        unsigned long long pos = base + lane;
        int active = pos < n;
        int64_t id = 0;
        if (active)
            id = id_bytes == 4 ? (int64_t)((const int32_t *)ids)[pos] : ((const int64_t *)ids)[pos];
        fr_dev_gather_warp(s, id, active, pos, out, &cnt);
    }
    fr_dev_flush_counts(s, &cnt);
}
#endif /* FR_DEFINE_GATHER_KERNEL */

#endif /* FR_GPU */

/* -------------------------------------------------- host side of the ring */
#ifndef FR_GPU
/* For the proxy's service threads (and tests): `r` holds host addresses. */

static inline fr_dev_ring_cell *fr_ring_host_cell(const fr_dev_ring *r, uint64_t pos)
{
    return &r->cells[pos & ((1ull << r->log2_entries) - 1)];
}

/* 1 if request `pos` (a ticket) has been submitted and not yet served. */
static inline int fr_ring_host_submitted(const fr_dev_ring *r, uint64_t pos)
{
    return __atomic_load_n(&fr_ring_host_cell(r, pos)->seq, __ATOMIC_ACQUIRE) ==
           4 * (pos >> r->log2_entries) + 1;
}

static inline uint8_t *fr_ring_host_staging(const fr_dev_ring *r, uint64_t pos)
{
    return r->staging + (pos & ((1ull << r->log2_entries) - 1)) * (uint64_t)r->page_bytes;
}

/* Posts the completion of request `pos` (its staging page already written). */
static inline void fr_ring_host_complete(const fr_dev_ring *r, uint64_t pos, int32_t status)
{
    fr_dev_ring_cell *c = fr_ring_host_cell(r, pos);
    c->status = status;
    __atomic_store_n(&c->seq, 4 * (pos >> r->log2_entries) + 3, __ATOMIC_RELEASE);
}

/* Every cell free for lap 0 (after a failed gather; no thread may be using
 * the ring; the device's ticket counter is reset by the caller). */
static inline void fr_ring_host_reset(const fr_dev_ring *r)
{
    uint64_t n = 1ull << r->log2_entries;
    for (uint64_t i = 0; i < n; i++) {
        r->cells[i].status = 0;
        __atomic_store_n(&r->cells[i].seq, 0, __ATOMIC_RELEASE);
    }
}
#endif /* !FR_GPU */

#endif /* FASTREAD_DEVICE_CUH */
