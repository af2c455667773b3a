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
 *     reference and retry). fastread's own gather pins the slots it hits
 *     for its epoch, and reads pinned slots with plain loads (see "Pins").
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
 *   - Deadlock freedom: a loader that finds no victim (every slot held or
 *     loading) gives its LOADING claim back and retries; and no warp waits
 *     while holding slot references (fr_dev_gather_warp copies what it has,
 *     releases, then retries the rest), so held slots are always released.
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
 * checks an abort flag the host sets (in mapped host memory; one thread of
 * the grid reads it every 20 us and mirrors it in device memory, see
 * fr_dev_abort_poll): a failed read or a closing store ends the kernel with
 * an error, never a hang.
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
/* NVRTC has no C library headers; fastread's own names avoid clashing with
 * a <cuda/std/cstdint> the including kernel may have. */
typedef unsigned char fr_u8;
typedef unsigned int fr_u32;
typedef int fr_i32;
typedef unsigned long long fr_u64;
typedef long long fr_i64;
#define FR_GPU 1
#else
#include <stdint.h>
typedef uint8_t fr_u8;
typedef uint32_t fr_u32;
typedef int32_t fr_i32;
typedef uint64_t fr_u64;
typedef int64_t fr_i64;
#if defined(__CUDACC__)
#define FR_GPU 1
#else
#include <string.h>
#include <threads.h>
#include <time.h>
#endif
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
/* A ring request whose len has FR_RING_ROWS set is a list of row fetches:
 * (len & 0xFFFF) rows, at most FR_RING_MAX_ROWS, of c->page bytes each; the
 * cell's staging starts with their byte offsets in the array (u64 each),
 * which the host replaces by the rows, back to back. One request carries a
 * warp's rows: one cell to poll on each side instead of one per row (the
 * per-row protocol stopped at ~8M rows/s on the H100 machine). Any other
 * request is page c->page of the array, len bytes. */
#define FR_RING_ROWS 0x80000000u
#define FR_RING_MAX_ROWS 32u

#ifdef FR_GPU
FR_DEV fr_u32 fr_atom_add32(fr_u32 *p, fr_u32 v) { return atomicAdd((unsigned int *)p, v); }
FR_DEV fr_u32 fr_atom_cas32(fr_u32 *p, fr_u32 e, fr_u32 d)
{
    return atomicCAS((unsigned int *)p, e, d);
}
FR_DEV fr_u64 fr_atom_add64(fr_u64 *p, fr_u64 v)
{
    return atomicAdd((unsigned long long *)p, (unsigned long long)v);
}
FR_DEV fr_u64 fr_atom_cas64(fr_u64 *p, fr_u64 e, fr_u64 d)
{
    return atomicCAS((unsigned long long *)p, (unsigned long long)e, (unsigned long long)d);
}
FR_DEV fr_u32 fr_atom_xchg32(fr_u32 *p, fr_u32 v) { return atomicExch((unsigned int *)p, v); }
FR_DEV fr_u32 fr_atom_or32(fr_u32 *p, fr_u32 v) { return atomicOr((unsigned int *)p, v); }
FR_DEV fr_u32 fr_load32(const fr_u32 *p) { return *(const volatile fr_u32 *)p; }
FR_DEV void fr_store32(fr_u32 *p, fr_u32 v) { *(volatile fr_u32 *)p = v; }
FR_DEV fr_u64 fr_load64(const fr_u64 *p) { return *(const volatile fr_u64 *)p; }
FR_DEV void fr_store64(fr_u64 *p, fr_u64 v) { *(volatile fr_u64 *)p = v; }
/* Orders this thread's accesses to device memory before/after (the cache). */
FR_DEV void fr_fence(void) { __threadfence(); }
/* System scope: words the host reads or writes (ring cells, staging). */
FR_DEV fr_u64 fr_sys_load_acq64(const fr_u64 *p)
{
    fr_u64 v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
FR_DEV void fr_sys_store_rel64(fr_u64 *p, fr_u64 v)
{
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
FR_DEV fr_u64 fr_dev_now_ns(void)
{
    fr_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
FR_DEV void fr_pause(void) { __nanosleep(128); }
FR_DEV void fr_pause_ns(fr_u32 ns) { __nanosleep(ns); }
/* Device scope acquire: the loads after it (a pinned slot's row) see what
 * was written before the matching release (the page's publish). */
FR_DEV fr_u64 fr_load_acq64(const fr_u64 *p)
{
    fr_u64 v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
#else
FR_DEV fr_u32 fr_atom_add32(fr_u32 *p, fr_u32 v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
FR_DEV fr_u32 fr_atom_cas32(fr_u32 *p, fr_u32 e, fr_u32 d)
{
    __atomic_compare_exchange_n(p, &e, d, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return e; /* the old value, as CUDA's atomicCAS returns it */
}
FR_DEV fr_u64 fr_atom_add64(fr_u64 *p, fr_u64 v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
FR_DEV fr_u64 fr_atom_cas64(fr_u64 *p, fr_u64 e, fr_u64 d)
{
    __atomic_compare_exchange_n(p, &e, d, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return e; /* the old value, as CUDA's atomicCAS returns it */
}
FR_DEV fr_u32 fr_atom_xchg32(fr_u32 *p, fr_u32 v)
{
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
FR_DEV fr_u32 fr_atom_or32(fr_u32 *p, fr_u32 v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
FR_DEV fr_u32 fr_load32(const fr_u32 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
FR_DEV void fr_store32(fr_u32 *p, fr_u32 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
FR_DEV fr_u64 fr_load64(const fr_u64 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
FR_DEV void fr_store64(fr_u64 *p, fr_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
FR_DEV void fr_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
FR_DEV fr_u64 fr_sys_load_acq64(const fr_u64 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
FR_DEV void fr_sys_store_rel64(fr_u64 *p, fr_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
FR_DEV fr_u64 fr_dev_now_ns(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (fr_u64)ts.tv_sec * 1000000000ull + (fr_u64)ts.tv_nsec;
}
FR_DEV void fr_pause(void) { thrd_yield(); }
FR_DEV void fr_pause_ns(fr_u32 ns) { (void)ns; thrd_yield(); }
FR_DEV fr_u64 fr_load_acq64(const fr_u64 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
#endif

/* Byte copy with 16-byte accesses where both ends and the length allow, by
 * one thread. Used for staging -> cache slot: the source is host memory the
 * host just rewrote, so it is loaded with ld.cv (no cached copy is used). */
FR_DEV void fr_copy_bytes(fr_u8 *dst, const fr_u8 *src, fr_u64 len)
{
#ifdef FR_GPU
    if ((((fr_u64)dst | (fr_u64)src | len) & 15) == 0) {
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        fr_u64 n = len / 16;
#pragma unroll 4
        for (fr_u64 i = 0; i < n; i++)
            d[i] = __ldcv(s + i);
        return;
    }
    for (fr_u64 i = 0; i < len; i++)
        dst[i] = *(const volatile fr_u8 *)(src + i);
#else
    memcpy(dst, src, (size_t)len);
#endif
}

/* ------------------------------------------------------------ the layout */
/* Shared by the host (which builds it) and the device (which reads it):
 * plain C structs of fixed-size fields, the same on both sides. */

typedef struct fr_dev_ring_cell {
    fr_u64 seq;    /* 4 * lap + state: 0 free, 1 submitted, 3 done */
    fr_u64 page;   /* request: page of the array */
    fr_u32 len;    /* request: bytes of the page (the last may be short) */
    fr_i32 status;  /* completion: 0 or -errno */
    fr_u64 pad;
} fr_dev_ring_cell;

typedef struct fr_dev_ring {
    fr_dev_ring_cell *cells; /* page-locked host memory, mapped */
    fr_u8 *staging;        /* entries * page_bytes, page-locked, mapped */
    fr_u64 *tail;          /* tickets taken (device memory) */
    fr_u32 log2_entries;
    fr_u32 page_bytes;
} fr_dev_ring;

/* The backend's words of the view (gather_backend.h). */
typedef union fr_dev_fetch {
    fr_dev_ring ring;
    fr_u64 words[16];
} fr_dev_fetch;

typedef struct fr_dev_cache {
    fr_u32 *page_table; /* per page: 0, FR_PT_LOADING or slot + 1 */
    fr_u64 *tags;       /* per slot: the page it holds, FR_TAG_NONE */
    fr_u32 *refs;       /* per slot: holders | FR_REF_EXCL */
    fr_u32 *clock_bits; /* per slot: used since the hand last passed */
    fr_u32 *hand;       /* the clock hand (a counter; mod nslots) */
    fr_u8 *data;        /* nslots * page_bytes */
    fr_u64 npages;
    fr_u32 nslots;
    fr_u32 page_bytes;
    /* Gather pins (NULL: none). Per slot, epoch << 32 | page: fastread's
     * gather of that epoch may read the slot with no reference count (see
     * "Pins" above), so no eviction may take it while that gather runs. */
    fr_u64 *pins;
    const fr_u32 *epoch_now; /* the epoch of the gather running (result->epoch) */
    fr_u64 *pinned;          /* slots pinned by this gather (result->counters[FR_CNT_PINNED]) */
    fr_u64 pin_limit;        /* at most this many (nslots / 2: evictions stay possible) */
} fr_dev_cache;

enum {
    FR_CNT_HITS,        /* rows served from the HBM cache */
    FR_CNT_MISSES,      /* pages loaded into the cache */
    FR_CNT_COALESCED,   /* lookups merged: same page in a warp, or waits on a LOADING page */
    FR_CNT_HOST_TIER,   /* rows read from the page-locked host tier */
    FR_CNT_EVICTIONS,   /* pages replaced */
    FR_CNT_RING_FULL,   /* submissions that waited for a free ring cell */
    FR_CNT_PINNED,      /* slots pinned by this gather (kept in the result only) */
    FR_CNT_DIRECT_ROWS, /* rows read from storage straight to the output (row fetches) */
    FR_CNT_ROW_HITS,    /* rows served from the hot-row cache (fr_dev_rows) */
    FR_CNT_ADMITTED,    /* rows let into it (fr_rows_admit; never counted by the gather) */
    FR_NCOUNTERS = 10
};

/* Written by the kernel (device memory), read back by the host. */
typedef struct fr_dev_result {
    fr_u64 first_bad;  /* position of the first id out of range; ~0: none */
    fr_i32 error;       /* first error (negative errno); 0: none */
    fr_u32 epoch;       /* the running gather's pin epoch (set by the host; 0: no pins) */
    fr_u64 counters[FR_NCOUNTERS];
    /* The abort flag's mirror in device memory (fr_dev_abort_poll). */
    fr_u64 abort_checked_ns; /* when a thread last read the host's flag */
    fr_u32 aborted;          /* the host's flag was seen set */
    /* Set by the host per gather: rows of pages absent from the cache are
     * read on their own, unless many lanes of a warp want the page (1), or
     * always (2). 0: pages are loaded. See fr_dev_fetch_rows_warp. */
    fr_u32 fetch_rows;
    /* Set by the host per gather: a fetched row is listed for the hot-row
     * cache once its estimate reaches this (1 while the cache has room,
     * else fr_dev_rows.threshold; 0 counts as the threshold). */
    fr_u32 rows_list_from;
    /* Hot-row candidates listed by this gather (fr_dev_rows.adm_n points
     * here, so the host's reset of the result block empties the list). */
    fr_u64 adm_n;
    fr_u64 row_fills; /* rows the pass put into empty ways (fr_rows_admit) */
} fr_dev_result;

typedef struct fr_dev_counts {
    fr_u64 c[FR_NCOUNTERS];
} fr_dev_counts;

/* The hot-row cache and its admission (see "Hot rows" below). */
typedef struct fr_dev_rows {
    fr_u64 *tags;      /* per slot: row id + 1 (| FR_RTAG_REF once hit); 0 empty */
    fr_u8 *data;       /* slots * row_bytes */
    fr_u32 *sketch;    /* count-min sketch: 2 rows of width_mask + 1 counters */
    fr_u32 *seen;      /* seen_mask + 1 words: the epoch of the gather that last listed a row */
    fr_u64 *adm;       /* candidates: (id, output position) pairs, adm_cap of them */
    fr_u64 *adm_n;     /* pairs claimed by the running gather (fr_dev_result.adm_n) */
    fr_u64 adm_cap;
    fr_u32 slot_mask;  /* slots - 1 (a power of two, >= FR_ROWS_WAYS) */
    fr_u32 width_mask; /* counters per sketch row - 1 (a power of two) */
    fr_u32 seen_mask;
    fr_u32 threshold;  /* a row estimated this often may replace another ("Hot rows") */
    fr_u32 *door;      /* the doorkeeper: door_mask + 1 words of bits, one a row seen */
    fr_u32 door_mask;
} fr_dev_rows;

typedef struct fr_dev_store {
    fr_u64 rows, row_bytes;
    fr_u64 offset;          /* byte offset of row 0 in the file */
    fr_u64 data_bytes;      /* rows * row_bytes */
    fr_u32 rows_per_page;   /* page_bytes / row_bytes */
    fr_u32 pad0;
    fr_u64 timeout_ns;      /* every device-side wait gives up after this */
    fr_dev_cache cache;
    const fr_u8 *host_rows; /* host tier (mapped): all rows, or hot rows by slot */
    const fr_i32 *host_slot; /* per row: its slot in host_rows, -1 absent; NULL: all rows */
    fr_u32 *abort;          /* mapped host memory: nonzero, the host cancels */
    fr_dev_result *result;
    fr_dev_fetch fetch;
    fr_dev_rows rowc; /* hot rows kept by row ("Hot rows"; tags NULL: none) */
} fr_dev_store;

/* --------------------------------------------------------------- helpers */

FR_DEV int fr_dev_aborted(const fr_dev_store *s) { return fr_load32(s->abort) != 0; }

FR_DEV fr_u32 fr_dev_page_len(const fr_dev_store *s, fr_u64 page)
{
    fr_u64 start = page * s->cache.page_bytes;
    fr_u64 left = s->data_bytes - start;
    return left < s->cache.page_bytes ? (fr_u32)left : s->cache.page_bytes;
}

FR_DEV fr_u8 *fr_dev_slot_data(const fr_dev_cache *c, fr_u32 slot)
{
    return c->data + (fr_u64)slot * c->page_bytes;
}

#define FR_ABORT_CHECK_NS 20000ull

/* 1 once the host has asked the gather to stop (seen within ~20 us). */
FR_DEV int fr_dev_abort_poll(const fr_dev_store *s, fr_u64 now)
{
#ifdef FR_GPU
    fr_dev_result *r = s->result;
    if (fr_load32(&r->aborted))
        return 1;
    fr_u64 last = fr_load64(&r->abort_checked_ns);
    if (now - last < FR_ABORT_CHECK_NS)
        return 0;
    if (atomicCAS((unsigned long long *)&r->abort_checked_ns, (unsigned long long)last,
                  (unsigned long long)now) != (unsigned long long)last)
        return 0; /* another thread reads the host's flag now */
    if (!fr_dev_aborted(s))
        return 0;
    fr_store32(&r->aborted, 1);
    return 1;
#else
    (void)now;
    return fr_dev_aborted(s); /* host threads: an ordinary cached word */
#endif
}
/* 0 while waiting may go on; else why to stop. (Backends' waits; the
 * cache's own use fr_dev_waiter below.) */
FR_DEV int fr_dev_wait_check(const fr_dev_store *s, fr_u64 deadline)
{
    fr_u64 now = fr_dev_now_ns();
    if (fr_dev_abort_poll(s, now))
        return FR_DEV_ECANCELED;
    if (now >= deadline)
        return FR_DEV_ETIMEDOUT;
    fr_pause();
    return 0;
}

/* Waits that poll. Mapped host memory is read over PCIe, and GPU reads of
 * one host word queue behind each other (measured on an H100: ~1 us each;
 * a gather whose warps each read the abort flag once per 32 rows took
 * 34 ms per 1M rows whatever the rows' source). So the abort flag is read
 * by one thread of the whole grid at most every FR_ABORT_CHECK_NS (a CAS on
 * a timestamp in device memory elects it) and mirrored into device memory;
 * every other waiter reads the mirror. Waiters back off exponentially
 * between polls (from 32 ns to cap_ns), leaving the memory system to the
 * threads doing work. */

typedef struct fr_dev_waiter {
    fr_u64 deadline, next_abort;
    fr_u32 sleep_ns, cap_ns;
} fr_dev_waiter;

FR_DEV void fr_dev_wait_start(const fr_dev_store *s, fr_dev_waiter *w, fr_u32 cap_ns)
{
    fr_u64 now = fr_dev_now_ns();
    w->deadline = now + s->timeout_ns;
    w->next_abort = now + FR_ABORT_CHECK_NS;
    w->sleep_ns = 32;
    w->cap_ns = cap_ns;
}

/* 0 while waiting may go on (after a pause); else why to stop. */
FR_DEV int fr_dev_wait_step(const fr_dev_store *s, fr_dev_waiter *w)
{
    fr_u64 now = fr_dev_now_ns();
    if (now >= w->deadline)
        return FR_DEV_ETIMEDOUT;
    if (now >= w->next_abort) {
        if (fr_dev_abort_poll(s, now))
            return FR_DEV_ECANCELED;
        w->next_abort = now + FR_ABORT_CHECK_NS;
    }
    fr_pause_ns(w->sleep_ns);
    if (w->sleep_ns < w->cap_ns)
        w->sleep_ns *= 2;
    return 0;
}

/* ------------------------------------------------------------------ ring */

/* Takes a ticket and submits a read of `page` (len bytes). Waits (up to the
 * timeout) while the ring is full; *full_waits counts that. 0 or -errno;
 * *ticket names the request for fr_ring_wait / fr_ring_release. */
FR_DEV int fr_ring_claim(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 t,
                         fr_u64 *full_waits)
{
    fr_dev_ring_cell *c = &r->cells[t & ((1ull << r->log2_entries) - 1)];
    fr_u64 lap = t >> r->log2_entries;
    if (fr_sys_load_acq64(&c->seq) != 4 * lap) {
        (*full_waits)++;
        fr_dev_waiter w;
        fr_dev_wait_start(s, &w, 8192);
        while (fr_sys_load_acq64(&c->seq) != 4 * lap) {
            int rc = fr_dev_wait_step(s, &w);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Submits the request of claimed ticket t (its staging already written,
 * for row lists). */
FR_DEV void fr_ring_publish(const fr_dev_ring *r, fr_u64 t, fr_u64 page, fr_u32 len)
{
    fr_dev_ring_cell *c = &r->cells[t & ((1ull << r->log2_entries) - 1)];
    c->page = page;
    c->len = len;
    fr_sys_store_rel64(&c->seq, 4 * (t >> r->log2_entries) + 1);
}

FR_DEV int fr_ring_submit_at(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 page,
                             fr_u32 len, fr_u64 t, fr_u64 *full_waits)
{
    int rc = fr_ring_claim(s, r, t, full_waits);
    if (rc == 0)
        fr_ring_publish(r, t, page, len);
    return rc;
}

FR_DEV int fr_ring_submit(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 page,
                          fr_u32 len, fr_u64 *ticket, fr_u64 *full_waits)
{
    *ticket = fr_atom_add64(r->tail, 1);
    return fr_ring_submit_at(s, r, page, len, *ticket, full_waits);
}

/* Waits for request `ticket`: its status (0 or -errno from the host), or a
 * timeout / cancel. The cell stays ours until fr_ring_release. */
FR_DEV int fr_ring_wait(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 ticket)
{
    fr_dev_ring_cell *c = &r->cells[ticket & ((1ull << r->log2_entries) - 1)];
    fr_u64 done = 4 * (ticket >> r->log2_entries) + 3;
    if (fr_sys_load_acq64(&c->seq) != done) {
        /* A page read by the host takes tens of microseconds: polls every
         * few microseconds at most. */
        fr_dev_waiter w;
        fr_dev_wait_start(s, &w, 8192);
        while (fr_sys_load_acq64(&c->seq) != done) {
            int rc = fr_dev_wait_step(s, &w);
            if (rc)
                return rc;
        }
    }
    return *(volatile fr_i32 *)&c->status;
}

FR_DEV const fr_u8 *fr_ring_staging(const fr_dev_ring *r, fr_u64 ticket)
{
    return r->staging + (ticket & ((1ull << r->log2_entries) - 1)) * (fr_u64)r->page_bytes;
}

/* Rows one row-list request carries: as many as its staging holds, at most
 * FR_RING_MAX_ROWS (0 when a row is larger than a page: no row fetches). */
FR_DEV fr_u32 fr_ring_rows_per_request(const fr_dev_ring *r, fr_u64 row_bytes)
{
    fr_u64 k = row_bytes ? r->page_bytes / row_bytes : 0;
    return k < FR_RING_MAX_ROWS ? (fr_u32)k : FR_RING_MAX_ROWS;
}

/* Frees the request's cell for the next lap. */
FR_DEV void fr_ring_release(const fr_dev_ring *r, fr_u64 ticket)
{
    fr_dev_ring_cell *c = &r->cells[ticket & ((1ull << r->log2_entries) - 1)];
    fr_sys_store_rel64(&c->seq, 4 * ((ticket >> r->log2_entries) + 1));
}

/* ------------------------------------------------------ backend fetches */

#if defined(FR_FETCH_EXTERN)
/* The backend's device half (gather_backend.h), compiled in after this
 * header. */
FR_DEV int fr_backend_fetch_page(const fr_dev_store *s, fr_u64 page, fr_u8 *dst, fr_u32 len,
                                 fr_u64 deadline_ns);
#endif

/* Brings `len` bytes of page `page` into dst (one thread). */
FR_DEV int fr_dev_fetch_page(const fr_dev_store *s, fr_u64 page, fr_u8 *dst, fr_u32 len,
                             fr_dev_counts *cnt)
{
#if defined(FR_FETCH_EXTERN)
    (void)cnt;
    return fr_backend_fetch_page(s, page, dst, len, fr_dev_now_ns() + s->timeout_ns);
#else
    const fr_dev_ring *r = &s->fetch.ring;
    fr_u64 t;
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

/* Rows ids[0..n) read on their own (row fetches) into dsts[i], by one
 * thread, as one row-list request (n <= fr_ring_rows_per_request): the
 * host-emulated kernel's counterpart of fr_dev_fetch_rows_warp. */
FR_DEV int fr_dev_fetch_rows(const fr_dev_store *s, const fr_u64 *ids, fr_u32 n,
                             fr_u8 *const *dsts, fr_dev_counts *cnt)
{
#if defined(FR_FETCH_EXTERN)
    (void)s;
    (void)ids;
    (void)n;
    (void)dsts;
    (void)cnt;
    return FR_DEV_EIO; /* row fetches go through the ring only */
#else
    const fr_dev_ring *r = &s->fetch.ring;
    const fr_u64 rb = s->row_bytes;
    if (n == 0 || n > fr_ring_rows_per_request(r, rb))
        return FR_DEV_EIO;
    fr_u64 t = fr_atom_add64(r->tail, 1);
    int rc = fr_ring_claim(s, r, t, &cnt->c[FR_CNT_RING_FULL]);
    if (rc)
        return rc;
    fr_u64 *list = (fr_u64 *)fr_ring_staging(r, t);
    for (fr_u32 i = 0; i < n; i++)
        fr_store64(&list[i], ids[i] * rb);
    fr_ring_publish(r, t, rb, FR_RING_ROWS | n);
    rc = fr_ring_wait(s, r, t);
    if (rc == FR_DEV_ETIMEDOUT || rc == FR_DEV_ECANCELED)
        return rc; /* the cell stays taken: the host resets the ring */
    if (rc == 0) {
        for (fr_u32 i = 0; i < n; i++)
            fr_copy_bytes(dsts[i], fr_ring_staging(r, t) + i * rb, rb);
        cnt->c[FR_CNT_DIRECT_ROWS] += n;
    }
    fr_ring_release(r, t);
    return rc;
#endif
}

/* ----------------------------------------------------------------- cache */

enum { FR_HIT = 0, FR_OWN = 1, FR_BUSY = 2 };

/* ------------------------------------------------------------------ pins
 * A hit through the reference count costs two atomics and two fences on
 * the slot; in a hot gather every row is a hit, thousands of warps hit the
 * same few hundred slots, and those costs set the speed. Pins let
 * fastread's own gather read most hits with plain loads instead:
 *   - The host gives each gather an epoch E (result->epoch, and the word
 *     epoch_now that every evictor reads). A thread that has a slot safely
 *     (a reference on a hit, or EXCL as its loader) may pin it for E:
 *     pins[slot] = E << 32 | page, stored before the fence that precedes
 *     dropping the reference (or publishing the page).
 *   - An evictor, once it holds EXCL (refs was 0) and after its fence,
 *     skips a slot whose pin epoch is >= epoch_now. The pin store happened
 *     before the reference was dropped, and the evictor's CAS saw that drop,
 *     so the evictor sees the pin. A stale epoch_now is only ever older
 *     (smaller), which skips more, never less.
 *   - So a slot pinned for E holds the same page until gather E ends: a
 *     reader of gather E that finds pins[pt[page] - 1] == E << 32 | page
 *     (an acquire load: the row's loads come after it) may copy the row with
 *     no atomics and no fences. Any other answer takes the counted path.
 *   - At most pin_limit slots (half the cache) are pinned per gather, so a
 *     gather whose pages do not fit still finds victims. Between gathers
 *     the host moves epoch_now past E while users' kernels may run
 *     (fr_store_device_serve), so their misses can evict what E pinned.
 *   - Page numbers are kept in 32 bits: the host turns pins off for arrays
 *     of 2^32 pages or more. */

FR_DEV fr_u64 fr_pin_word(fr_u32 epoch, fr_u64 page)
{
    return ((fr_u64)epoch << 32) | (page & 0xFFFFFFFFull);
}

/* Pins `slot` (holding `page`, held by the caller) for gather `epoch`. */
FR_DEV void fr_cache_pin(const fr_dev_cache *c, fr_u32 slot, fr_u64 page, fr_u32 epoch)
{
    if (!epoch || !c->pins)
        return;
    fr_u64 want = fr_pin_word(epoch, page);
    if (fr_load64(&c->pins[slot]) == want)
        return;
    if (fr_load64(c->pinned) >= c->pin_limit || fr_atom_add64(c->pinned, 1) >= c->pin_limit)
        return;
    fr_store64(&c->pins[slot], want);
}

/* 1 and *slot when `page` sits in a slot pinned for gather `epoch`: read it
 * with no reference (see above). */
FR_DEV int fr_cache_pinned(const fr_dev_cache *c, fr_u64 page, fr_u32 epoch, fr_u32 *slot)
{
    fr_u32 e = fr_load32(&c->page_table[page]);
    if (e == 0 || e == FR_PT_LOADING)
        return 0;
    if (fr_load_acq64(&c->pins[e - 1]) != fr_pin_word(epoch, page))
        return 0;
    *slot = e - 1;
    return 1;
}

/* For an evictor holding EXCL on `slot`, after its fence. */
FR_DEV int fr_cache_pinned_now(const fr_dev_cache *c, fr_u32 slot)
{
    if (!c->pins)
        return 0;
    fr_u32 pe = (fr_u32)(fr_load64(&c->pins[slot]) >> 32);
    return pe != 0 && pe >= fr_load32(c->epoch_now);
}

/* Clock sweep for a slot no one holds: EXCL taken on it, or -1 after a
 * bounded number of steps found none (every slot looked at was held,
 * loading or recently used: the caller gives its claim back and retries).
 * The bound keeps thousands of loaders from hammering the hand when the
 * cache is small; the hand is shared, so the sweep still goes round. */
FR_DEV fr_i64 fr_cache_victim(const fr_dev_cache *c)
{
    fr_u64 steps = 2ull * c->nslots + 32;
    if (steps > 512)
        steps = 512;
    for (fr_u64 k = 0; k < steps; k++) {
        fr_u32 h = fr_atom_add32(c->hand, 1) % c->nslots;
        if (fr_load32(&c->clock_bits[h])) {
            fr_store32(&c->clock_bits[h], 0); /* second chance */
            continue;
        }
        if (fr_load32(&c->refs[h]) == 0 && fr_atom_cas32(&c->refs[h], 0, FR_REF_EXCL) == 0) {
            fr_fence();
            if (fr_cache_pinned_now(c, h)) { /* the running gather reads it unreferenced */
                fr_atom_add32(&c->refs[h], (fr_u32)0 - FR_REF_EXCL);
                continue;
            }
            return h;
        }
    }
    return -1;
}

/* One look at page `page`: FR_HIT (a reference taken on *slot), FR_OWN
 * (this thread loads it into *slot: EXCL held, page table LOADING), or
 * FR_BUSY (another thread is loading it or the slot moved: retry). */
FR_DEV int fr_cache_lookup_e(const fr_dev_cache *c, fr_u64 page, fr_u32 *slot,
                             fr_u64 *evictions, fr_u32 epoch)
{
    fr_u32 e = fr_load32(&c->page_table[page]);
    if (e == FR_PT_LOADING)
        return FR_BUSY;
    if (e != 0) {
        fr_u32 sl = e - 1;
        fr_u32 r = fr_atom_add32(&c->refs[sl], 1);
        if (!(r & FR_REF_EXCL)) {
            fr_fence();
            if (fr_load64(&c->tags[sl]) == page) {
                if (!fr_load32(&c->clock_bits[sl]))
                    fr_store32(&c->clock_bits[sl], 1);
                fr_cache_pin(c, sl, page, epoch); /* before the release's fence */
                *slot = sl;
                return FR_HIT;
            }
        }
        fr_atom_add32(&c->refs[sl], (fr_u32)-1);
        return FR_BUSY;
    }
    if (fr_atom_cas32(&c->page_table[page], 0, FR_PT_LOADING) != 0)
        return FR_BUSY;
    fr_i64 v = fr_cache_victim(c);
    if (v < 0) {
        fr_store32(&c->page_table[page], 0);
        return FR_BUSY;
    }
    fr_u32 sl = (fr_u32)v;
    fr_u64 old = fr_load64(&c->tags[sl]);
    if (old != FR_TAG_NONE) {
        fr_store32(&c->page_table[old], 0); /* only the EXCL holder changes it */
        (*evictions)++;
    }
    fr_store64(&c->tags[sl], page);
    fr_fence();
    *slot = sl;
    return FR_OWN;
}

FR_DEV int fr_cache_lookup(const fr_dev_cache *c, fr_u64 page, fr_u32 *slot, fr_u64 *evictions)
{
    return fr_cache_lookup_e(c, page, slot, evictions, 0);
}

/* The loader's page is in its slot: readers may have it (the loader keeps
 * one reference). */
FR_DEV void fr_cache_publish_e(const fr_dev_cache *c, fr_u64 page, fr_u32 slot, fr_u32 epoch)
{
    fr_fence(); /* the page's bytes before the pin and the page table entry */
    fr_cache_pin(c, slot, page, epoch);
    fr_store32(&c->clock_bits[slot], 1);
    fr_atom_add32(&c->refs[slot], 1u - FR_REF_EXCL);
    fr_fence();
    fr_store32(&c->page_table[page], slot + 1);
}

FR_DEV void fr_cache_publish(const fr_dev_cache *c, fr_u64 page, fr_u32 slot)
{
    fr_cache_publish_e(c, page, slot, 0);
}

/* The load failed: the slot goes back empty and the page absent. */
FR_DEV void fr_cache_abandon(const fr_dev_cache *c, fr_u64 page, fr_u32 slot)
{
    fr_store64(&c->tags[slot], FR_TAG_NONE);
    fr_fence();
    fr_store32(&c->page_table[page], 0);
    fr_atom_add32(&c->refs[slot], (fr_u32)0 - FR_REF_EXCL);
}

FR_DEV void fr_cache_release(const fr_dev_cache *c, fr_u32 slot)
{
    fr_fence();
    fr_atom_add32(&c->refs[slot], (fr_u32)-1);
}

enum { FR_GOT_HIT = 0, FR_GOT_MISS = 1, FR_GOT_WAITED = 2, FR_GOT_PINNED = 3 };

/* Page `page` in the cache, loading it if needed (one thread), for gather
 * `epoch` (0: none). >= 0 (FR_GOT_PINNED: the slot is pinned for epoch, no
 * reference held; other FR_GOT_*: a reference held on *slot, release it with
 * fr_cache_release) or a negative errno. */
FR_DEV int fr_cache_acquire_e(const fr_dev_store *s, fr_u64 page, fr_u32 *slot,
                              fr_dev_counts *cnt, fr_u32 epoch)
{
    if (epoch && s->cache.pins && fr_cache_pinned(&s->cache, page, epoch, slot))
        return FR_GOT_PINNED;
    fr_dev_waiter w;
    int waited = 0;
    for (;;) {
        int r = fr_cache_lookup_e(&s->cache, page, slot, &cnt->c[FR_CNT_EVICTIONS], epoch);
        if (r == FR_HIT)
            return waited ? FR_GOT_WAITED : FR_GOT_HIT;
        if (r == FR_OWN) {
            int rc = fr_dev_fetch_page(s, page, fr_dev_slot_data(&s->cache, *slot),
                                       fr_dev_page_len(s, page), cnt);
            if (rc) {
                fr_cache_abandon(&s->cache, page, *slot);
                return rc;
            }
            fr_cache_publish_e(&s->cache, page, *slot, epoch);
            cnt->c[FR_CNT_MISSES]++;
            return FR_GOT_MISS;
        }
        if (!waited) {
            waited = 1;
            fr_dev_wait_start(s, &w, 2048);
        }
        int rc = fr_dev_wait_step(s, &w);
        if (rc)
            return rc;
    }
}

FR_DEV int fr_cache_acquire(const fr_dev_store *s, fr_u64 page, fr_u32 *slot,
                            fr_dev_counts *cnt)
{
    return fr_cache_acquire_e(s, page, slot, cnt, 0);
}

/* Where row `id` is readable: host tier or (acquired) cache page. Returns
 * 0 with *src set, or -errno; *held is set to the slot+1 to release (0:
 * nothing held). One thread. */
FR_DEV int fr_dev_row_src(const fr_dev_store *s, fr_u64 id, const fr_u8 **src, fr_u32 *held,
                          fr_dev_counts *cnt, fr_u32 epoch)
{
    *held = 0;
    if (s->host_rows) {
        fr_i64 hs = s->host_slot ? (fr_i64)s->host_slot[id] : (fr_i64)id;
        if (hs >= 0) {
            *src = s->host_rows + (fr_u64)hs * s->row_bytes;
            cnt->c[FR_CNT_HOST_TIER]++;
            return 0;
        }
    }
    fr_u64 page = id / s->rows_per_page;
    fr_u32 slot = 0; /* set by acquire whenever rc >= 0 */
    int rc = fr_cache_acquire_e(s, page, &slot, cnt, epoch);
    if (rc < 0)
        return rc;
    if (rc == FR_GOT_HIT || rc == FR_GOT_PINNED)
        cnt->c[FR_CNT_HITS]++;
    else if (rc == FR_GOT_WAITED)
        cnt->c[FR_CNT_COALESCED]++;
    *held = rc == FR_GOT_PINNED ? 0 : slot + 1;
    *src = fr_dev_slot_data(&s->cache, slot) + (id % s->rows_per_page) * s->row_bytes;
    return 0;
}

/* Row `id` to dst (one thread) for gather `epoch` (0: users' kernels, which
 * never pin): 0, or -errno (FR_DEV_ERANGE for a bad id). */
FR_DEV int fr_dev_read_row_e(const fr_dev_store *s, fr_i64 id, void *dst, fr_dev_counts *cnt,
                             fr_u32 epoch)
{
    if (id < 0 || (fr_u64)id >= s->rows)
        return FR_DEV_ERANGE;
    const fr_u8 *src;
    fr_u32 held;
    int rc = fr_dev_row_src(s, (fr_u64)id, &src, &held, cnt, epoch);
    if (rc)
        return rc;
    fr_copy_bytes((fr_u8 *)dst, src, s->row_bytes);
    if (held)
        fr_cache_release(&s->cache, held - 1);
    return 0;
}

/* Row `id` to dst (one thread): 0, or -errno (FR_DEV_ERANGE for a bad id). */
FR_DEV int fr_dev_read_row(const fr_dev_store *s, fr_i64 id, void *dst, fr_dev_counts *cnt)
{
    return fr_dev_read_row_e(s, id, dst, cnt, 0);
}

/* ------------------------------------------------------------ hot rows
 * Sparse batches over an array larger than the page cache read their rows
 * on their own (row fetches, fr_dev_fetch_rows_warp) and leave the page
 * cache alone: a 64 KiB page brought for one row would evict pages other
 * rows need. Rows asked for again (power-law ids: neighbour sampling,
 * embedding lookups) were then read from storage every time, and their
 * pages cannot simply be cached instead: the hot rows of a power law over a
 * shuffled table are one or two per page (1M zipf(1.2) ids over 16M rows
 * touch 82k 64 KiB pages; a 1 GiB cache holds 16k). So rows are kept by
 * row, in 8-way sets, with TinyLFU's admission:
 *   - Frequency: a count-min sketch (2 rows of 32-bit counters, 4 per slot
 *     each) behind a doorkeeper (one bit a row, 32 per slot): a row's first
 *     request since the last reset sets its bit, the rest count in the
 *     sketch, so rows seen once do not fill the counters until everything
 *     reads as a repeat. The estimate is the bit plus the smaller counter.
 *     Counted: the rows row fetches bring (a warp's lanes wanting one row
 *     once, with their number), and a cached row's first hit since it went
 *     in or since a sweep cleared its reference bit (fr_rows_hit_first): a
 *     row that keeps being asked for gains frequency while cached, and a
 *     gather whose rows are all referenced costs no atomics. The host
 *     halves every counter and empties the doorkeeper after 10 x slots
 *     fetched rows (TinyLFU's reset: fr_rows_age, a launch of its own
 *     before the pass, so no estimate reads a half-halved sketch).
 *   - Candidates: a fetched row whose estimate reaches the gather's
 *     rows_list_from (fr_dev_result) is listed with its output position,
 *     about once per gather (`seen`: epoch and row hash per word; a
 *     collision lists a row twice, never holds it back), at most adm_cap
 *     (slots / 2) a gather (once the list is full nothing more is marked or
 *     claimed). rows_list_from is 1 while the cache has room
 *     (fr_rows_list_from: under 7/8 of the slots filled), then `threshold`
 *     (2: asked for before). Listing happens after the warp's ring cell is
 *     released; once the cache is full a row seen once costs one atomic on
 *     its doorkeeper word and nothing else.
 *   - Admission: after the gather, fr_rows_admit (on the same stream: no
 *     gather of ours reads these arrays meanwhile) copies each candidate
 *     from the output into its set: a free way; else, for a row estimated
 *     `threshold` times or more, a way not hit since the last sweep (second
 *     chance: a candidate that finds every way of a full set referenced
 *     clears their bits) holding the least frequent row, replaced only by a
 *     row estimated more frequent (TinyLFU: a row seen twice never pushes
 *     out a hotter one). A row seen once only ever takes a free way, so a
 *     one-off scan evicts nothing by itself, and only from a gather whose
 *     list did not overflow (fr_rows_pass_floor: a batch with more distinct
 *     rows than adm_cap, uniform ids, copies in only rows counted before).
 *     Measured with the emulation of csrc/tests/test_gather_rows.c at the
 *     benchmark's scale (1M zipf(1.2) ids over 16M rows, 512k slots;
 *     `test_gather_rows full`), against the policy of 548de3b (threshold 2
 *     for every candidate, 4 ways, no doorkeeper, hits not counted): the
 *     first repeat found 89.0% of its rows cached (rows asked once in the
 *     first gather were listed only on the repeat) against 100.0% now; the
 *     second sent 583 of its 31,250 warps to storage (rows whose 4-way set
 *     was full) against 20; after a one-off scan of 4 x slots rows, 3,060
 *     warps against 24 (the scan's rows, their counters filled by the scan
 *     itself, had pushed out rows of the hot set).
 *   - Lookup: fastread's gathers look there after the host tier, with plain
 *     loads (two 32-byte sectors: the set's 8 tags); a hit on a row whose
 *     reference bit is clear sets it (a store) and counts once. Users'
 *     kernels (epoch 0) never read it: they may run while fr_rows_admit does.
 * Memory: a quarter of cache_bytes for the rows (taken from the page
 * cache), plus per slot 8 (tag) + 32 (sketch) + 8 (half a candidate) + 4
 * (seen) + 4 (doorkeeper) bytes. Only where row fetches can happen (backend
 * proxy, an array larger than the cache, not all in the host tier);
 * FASTREAD_GATHER_ADMIT=off turns it off. */
#define FR_ROWS_WAYS 8u
#define FR_RTAG_REF 0x8000000000000000ull  /* hit since the last admission pass */
#define FR_RTAG_BUSY 0x7FFFFFFFFFFFFFFFull /* fr_rows_admit is filling the slot */
#define FR_ROWS_COUNT_MAX 255u             /* counters saturate (TinyLFU's small counters) */

FR_DEV fr_u64 fr_mix64(fr_u64 x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The first of row id's FR_ROWS_WAYS slots. */
FR_DEV fr_u32 fr_rows_set(const fr_dev_rows *r, fr_u64 id)
{
    return (fr_u32)fr_mix64(id) & r->slot_mask & ~(FR_ROWS_WAYS - 1);
}

/* The slot holding row id, or -1 (plain loads: tags change only between
 * fastread's gathers). *tag: what the slot's tag word holds. */
FR_DEV fr_i64 fr_rows_find(const fr_dev_rows *r, fr_u64 id, fr_u64 *tag)
{
    fr_u32 w = fr_rows_set(r, id);
#ifdef FR_GPU
    /* The set's 64 bytes in four 16-byte loads (sets start at multiples of
     * 64 bytes of a cuMemAlloc'ed array). */
    const ulonglong2 *t2 = (const ulonglong2 *)(r->tags + w);
    fr_i64 at = -1;
#pragma unroll
    for (fr_u32 k = 0; k < FR_ROWS_WAYS / 2; k++) {
        ulonglong2 p = t2[k];
        if ((p.x & ~FR_RTAG_REF) == id + 1) {
            *tag = p.x;
            at = (fr_i64)(w + 2 * k);
        }
        if ((p.y & ~FR_RTAG_REF) == id + 1) {
            *tag = p.y;
            at = (fr_i64)(w + 2 * k + 1);
        }
    }
    return at;
#else
    for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++) {
        fr_u64 t = fr_load64(&r->tags[w + k]);
        if ((t & ~FR_RTAG_REF) == id + 1) {
            *tag = t;
            return (fr_i64)(w + k);
        }
    }
    return -1;
#endif
}

FR_DEV void fr_rows_counters(const fr_dev_rows *r, fr_u64 id, fr_u32 **c0, fr_u32 **c1)
{
    fr_u64 h = fr_mix64(id ^ 0x9E3779B97F4A7C15ull);
    *c0 = &r->sketch[h & r->width_mask];
    *c1 = &r->sketch[(fr_u64)r->width_mask + 1 + ((h >> 32) & r->width_mask)];
}

/* Row id's doorkeeper bit: *w's bit `*bit`. */
FR_DEV void fr_rows_door(const fr_dev_rows *r, fr_u64 id, fr_u32 **w, fr_u32 *bit)
{
    fr_u64 h = fr_mix64(id ^ 0x2545F4914F6CDD1Dull);
    *w = &r->door[(h >> 5) & r->door_mask];
    *bit = 1u << (h & 31);
}

/* Row id's estimated count: its doorkeeper bit plus the smaller of its two
 * counters. */
FR_DEV fr_u32 fr_rows_estimate(const fr_dev_rows *r, fr_u64 id)
{
    fr_u32 *c0, *c1, *w, bit;
    fr_rows_counters(r, id, &c0, &c1);
    fr_rows_door(r, id, &w, &bit);
    fr_u32 a = fr_load32(c0), b = fr_load32(c1);
    return (a < b ? a : b) + ((fr_load32(w) & bit) != 0);
}

FR_DEV fr_u32 fr_rows_bump(fr_u32 *c, fr_u32 k)
{
    fr_u32 v = fr_load32(c);
    if (v >= FR_ROWS_COUNT_MAX || k == 0)
        return v; /* saturated (or nothing to add): no atomic */
    return fr_atom_add32(c, k) + k;
}

/* Counts k requests of row id; its estimate after them. The first request
 * since the last reset only sets the doorkeeper bit (TinyLFU's doorkeeper:
 * rows seen once stay out of the sketch, so a stream of them does not fill
 * its counters until every row reads as a repeat); the rest count in the
 * sketch. */
FR_DEV fr_u32 fr_rows_note(const fr_dev_rows *r, fr_u64 id, fr_u32 k)
{
    fr_u32 *c0, *c1, *w, bit;
    fr_rows_counters(r, id, &c0, &c1);
    fr_rows_door(r, id, &w, &bit);
    int seen = (fr_load32(w) & bit) != 0 || (fr_atom_or32(w, bit) & bit) != 0;
    fr_u32 add = seen ? k : k - 1;
    fr_u32 a = fr_rows_bump(c0, add), b = fr_rows_bump(c1, add);
    return (a < b ? a : b) + 1;
}

/* 1 when the caller lists row id in gather `epoch`: its estimate `est`
 * reached `from` (the gather's rows_list_from; 0: the threshold) and, as
 * far as `seen` knows, no one listed it in this gather yet. A seen word
 * holds the low 16 bits of the epoch and 16 bits of the row's hash: a row
 * whose word another row took is listed again (a duplicate the pass
 * skips), never held back. */
FR_DEV int fr_rows_mark(const fr_dev_rows *r, fr_u64 id, fr_u32 est, fr_u32 epoch, fr_u32 from)
{
    if (est < (from ? from : r->threshold) || !epoch)
        return 0;
    /* The list is full (fr_rows_put drops what comes after): no seen word
     * exchanged, no claim on the counter. A uniform 1M batch lists at first
     * sight until here (adm_cap), not its 1M rows. */
    if (fr_load64(r->adm_n) >= r->adm_cap)
        return 0;
    fr_u64 h = fr_mix64(id ^ 0xD1B54A32D192ED03ull);
    fr_u32 *w = &r->seen[h & r->seen_mask];
    fr_u32 v = (epoch << 16) | (fr_u32)(h >> 48);
    return fr_load32(w) != v && fr_atom_xchg32(w, v) != v;
}

/* Candidate i (claimed from adm_n): row id at output position pos;
 * past adm_cap, dropped. */
FR_DEV void fr_rows_put(const fr_dev_rows *r, fr_u64 i, fr_u64 id, fr_u64 pos)
{
    if (i >= r->adm_cap)
        return;
    fr_store64(&r->adm[2 * i], id);
    fr_store64(&r->adm[2 * i + 1], pos);
}

/* The host's side of the policy, here so that the emulation in
 * csrc/tests/test_gather_rows.c runs the rules gather_device_rows.c does.
 * A gather lists rows at first sight while the passes have filled under
 * 7/8 of the slots (`filled`; with 8-way sets the last free ways are spread
 * over sets most of whose rows are in), then from the threshold on. */
FR_DEV fr_u32 fr_rows_list_from(const fr_dev_rows *r, fr_u64 filled)
{
    fr_u64 slots = (fr_u64)r->slot_mask + 1;
    return filled < slots - slots / 8 ? 1u : r->threshold;
}

/* The least estimate the pass admits, from the candidates the gather
 * listed (`listed`: the list's counter, which counts past adm_cap). A list
 * that overflowed came from a batch with more distinct rows than half the
 * slots: no working set that fits, so rows seen once (listed at first
 * sight) are copied in only while a batch's distinct rows fit the list,
 * and from an overflowing one only rows counted before go in (the
 * threshold). On the GPU (nvidia-h200, 16M x 512 B rows, 1 GiB cache, a
 * fresh store each gather) a warm uniform 1M gather listed every row and
 * copied 259,654 of them into the cache, never to be asked again: 20.7M
 * rows/s against 32-51M before first-sight listing. A power-law batch's
 * distinct rows fit (1M zipf(1.2) ids: ~133k of 256k), so it is still
 * resident after one gather. */
FR_DEV fr_u32 fr_rows_pass_floor(const fr_dev_rows *r, fr_u64 listed)
{
    return listed >= r->adm_cap ? r->threshold : 0u;
}

/* TinyLFU's reset is due (fr_rows_age) after 10 x slots counted rows. */
FR_DEV int fr_rows_age_due(const fr_dev_rows *r, fr_u64 noted)
{
    return noted >= 10 * ((fr_u64)r->slot_mask + 1);
}

/* A hit on slot rs (row id) whose reference bit is clear: the bit set
 * (tags are read only by fastread's gathers: a plain store) and the hit
 * counted once in the sketch, so a row that keeps being asked for gains
 * frequency while cached, and a newcomer that merely looks frequent to a
 * crowded sketch does not push it out. Out of line on the GPU: the hot
 * path's registers stay as they were. */
#ifdef FR_GPU
static __device__ __noinline__
#else
static inline
#endif
void fr_rows_hit_first(const fr_dev_rows *r, fr_i64 rs, fr_u64 id, fr_u64 tag)
{
#ifdef FR_GPU
    r->tags[rs] = tag | FR_RTAG_REF;
#else
    fr_store64(&r->tags[rs], tag | FR_RTAG_REF); /* host threads play warps */
#endif
    (void)fr_rows_note(r, id, 1);
}

/* What fr_rows_admit_one did. */
enum { FR_ROWS_OUT = 0, FR_ROWS_FILLED = 1, FR_ROWS_REPLACED = 2 };

/* Admits row id, its bytes at src, if the policy lets it in (one thread,
 * while no gather of ours runs; other threads of the pass admit other rows
 * at the same time): FR_ROWS_FILLED (into a free way), FR_ROWS_REPLACED or
 * FR_ROWS_OUT.
 * A set with a way another thread is filling (BUSY) is looked at again
 * until that thread is done, which it always is soon (it copies one row
 * and waits for nothing): the pass runs every candidate at once, and with
 * a first gather's ~130k candidates over 65k sets most share a set with
 * another. Giving up there (a first version) left a third of the
 * candidates for later gathers; so did a second one that gave up after 64
 * looks, BUSY ones included, where one row's copy outlasts them. Those
 * waits are bounded by time only (FR_ROWS_BUSY_NS, a guard, never reached
 * by a pass that works); losing a CAS (another thread took the way) counts
 * as a try. Waiting on BUSY rather than taking another free way keeps a
 * row listed twice from going in twice (a version that did that: 1,814
 * admitted of 1,500 rows). */
#define FR_ROWS_ADMIT_TRIES 64
#define FR_ROWS_BUSY_NS 10000000ull
FR_DEV int fr_rows_admit_one(const fr_dev_rows *r, fr_u64 row_bytes, fr_u64 id, const fr_u8 *src,
                             fr_u32 floor)
{
    fr_u32 w = fr_rows_set(r, id);
    fr_u32 est = fr_rows_estimate(r, id); /* the sketch holds still during the pass */
    if (est < floor)
        return FR_ROWS_OUT; /* fr_rows_pass_floor: no tag read, no copy */
    fr_u64 busy_since = 0;
    for (int lost = 0; lost < FR_ROWS_ADMIT_TRIES;) {
        fr_u64 t[FR_ROWS_WAYS];
        fr_u32 v = FR_ROWS_WAYS;
        int busy = 0;
        for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++) {
            t[k] = fr_load64(&r->tags[w + k]);
            if ((t[k] & ~FR_RTAG_REF) == id + 1)
                return FR_ROWS_OUT; /* already in */
            busy |= t[k] == FR_RTAG_BUSY;
            if (t[k] == 0 && v == FR_ROWS_WAYS)
                v = k;
        }
        if (busy) {
            /* A way is being filled, maybe with this very row (listed twice):
             * taking another free way could keep it twice. Look again. */
            fr_u64 now = fr_dev_now_ns();
            if (!busy_since)
                busy_since = now;
            else if (now - busy_since > FR_ROWS_BUSY_NS)
                return FR_ROWS_OUT;
            fr_pause();
            continue;
        }
        if (v == FR_ROWS_WAYS) { /* full */
            if (est < r->threshold)
                return FR_ROWS_OUT; /* seen once: free ways only (scans evict nothing) */
            /* The least frequent way not hit lately. */
            fr_u32 least = 0xFFFFFFFFu;
            for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++) {
                if (t[k] & FR_RTAG_REF)
                    continue;
                fr_u32 e = fr_rows_estimate(r, t[k] - 1);
                if (e < least) {
                    least = e;
                    v = k;
                }
            }
            if (v == FR_ROWS_WAYS) { /* every way hit since the last pass: second chance */
                for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++)
                    fr_atom_cas64(&r->tags[w + k], t[k], t[k] & ~FR_RTAG_REF);
                return FR_ROWS_OUT;
            }
            if (est <= least)
                return FR_ROWS_OUT; /* TinyLFU: only a more frequent row replaces one */
        }
        if (fr_atom_cas64(&r->tags[w + v], t[v], FR_RTAG_BUSY) != t[v]) {
            lost++; /* another thread took the way first: look again */
            continue;
        }
        fr_copy_bytes(r->data + (fr_u64)(w + v) * row_bytes, src, row_bytes);
        fr_fence();
        fr_store64(&r->tags[w + v], id + 1);
        return t[v] == 0 ? FR_ROWS_FILLED : FR_ROWS_REPLACED;
    }
    return FR_ROWS_OUT; /* a set this contended waits for the next pass */
}

/* ------------------------------------------------------- locality order
 * GPU threads reading page-locked host memory over PCIe go through an
 * address translation whose reach is about 1 GiB (measured on an H100 with
 * bench/gather/probe_hosttier.cu: random 512-byte rows run at PCIe line rate,
 * 98M rows/s, from tables up to 1 GiB, then fall to 54M at 2 GiB and 32M at
 * 8 GiB, however the memory was allocated, huge pages included). The same
 * 8 GiB gather with its ids grouped into buckets of 16-128 MiB of the table
 * runs at 92-97M rows/s. So gathers from a large host tier first order the
 * ids by bucket (a counting sort: fr_order_count, then fr_order_place) and
 * then read rows in that order, each written to its own position. Order
 * within a bucket does not matter, so the sort is neither stable nor exact.
 * Ids out of range go to bucket 0; the gather reports them. */
#define FR_ORDER_MAX_BUCKETS 1024u

FR_DEV fr_u32 fr_order_bucket(fr_i64 id, fr_u64 rows, fr_u32 shift, fr_u32 nbuckets)
{
    fr_u64 b = (id < 0 || (fr_u64)id >= rows) ? 0 : (fr_u64)id >> shift;
    return b < nbuckets ? (fr_u32)b : nbuckets - 1;
}

FR_DEV fr_i64 fr_load_id(const void *ids, int id_bytes, fr_u64 i)
{
    return id_bytes == 4 ? (fr_i64)((const fr_i32 *)ids)[i] : ((const fr_i64 *)ids)[i];
}

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

/* -------------------------------------------------- host side of the ring */
#ifndef FR_GPU
/* For the proxy's service threads (and tests): `r` holds host addresses. */

static inline fr_dev_ring_cell *fr_ring_host_cell(const fr_dev_ring *r, fr_u64 pos)
{
    return &r->cells[pos & ((1ull << r->log2_entries) - 1)];
}

/* 1 if request `pos` (a ticket) has been submitted and not yet served. */
static inline int fr_ring_host_submitted(const fr_dev_ring *r, fr_u64 pos)
{
    return __atomic_load_n(&fr_ring_host_cell(r, pos)->seq, __ATOMIC_ACQUIRE) ==
           4 * (pos >> r->log2_entries) + 1;
}

static inline fr_u8 *fr_ring_host_staging(const fr_dev_ring *r, fr_u64 pos)
{
    return r->staging + (pos & ((1ull << r->log2_entries) - 1)) * (fr_u64)r->page_bytes;
}

/* Posts the completion of request `pos` (its staging page already written). */
static inline void fr_ring_host_complete(const fr_dev_ring *r, fr_u64 pos, fr_i32 status)
{
    fr_dev_ring_cell *c = fr_ring_host_cell(r, pos);
    c->status = status;
    __atomic_store_n(&c->seq, 4 * (pos >> r->log2_entries) + 3, __ATOMIC_RELEASE);
}

/* Every cell free for lap 0 (after a failed gather; no thread may be using
 * the ring; the device's ticket counter is reset by the caller). */
static inline void fr_ring_host_reset(const fr_dev_ring *r)
{
    fr_u64 n = 1ull << r->log2_entries;
    for (fr_u64 i = 0; i < n; i++) {
        r->cells[i].status = 0;
        __atomic_store_n(&r->cells[i].seq, 0, __ATOMIC_RELEASE);
    }
}
#endif /* !FR_GPU */

#endif /* FASTREAD_DEVICE_CUH */
