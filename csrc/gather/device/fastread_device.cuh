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
 *
 * Files: this one (the shim, the layout, the helpers) includes
 * fastread_device_ring.cuh (the ring, the backend fetches, the ring's host
 * side), fastread_device_cache.cuh (the cache, pins, hot rows) and
 * fastread_device_warp.cuh (the warp-level gather and fastread's kernel);
 * the library embeds all four inlined as one text (fr_store_device_header).
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

/* The rest, one concept a file (the build inlines them in this order into the
 * header it embeds for NVRTC: cmake/embed.cmake, PARTS). */
#include "fastread_device_ring.cuh"
#include "fastread_device_cache.cuh"
#include "fastread_device_warp.cuh"

#endif /* FASTREAD_DEVICE_CUH */
