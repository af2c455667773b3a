/*
 * What the device path's sources share (gather.c sees only gather_device.h):
 * the store's device state, struct fr_gdev, and what each part offers the
 * others. Each source has one job:
 *   gather_device.c         open and close, one gather (the control block,
 *                           the kernel launch, the read-back), serving
 *                           sessions, memory
 *   gather_device_cache.c   the HBM page cache: its arrays (page table, slot
 *                           tags, refs, clock bits, pins), reset, pin epochs
 *   gather_device_tier.c    the page-locked host tier
 *   gather_device_rows.c    the hot-row cache: sizing, arrays, the admission
 *                           pass after each gather, the sketch's aging
 *   gather_device_policy.c  how each gather runs: pages or row fetches, the
 *                           locality order, backend auto's route
 * Who calls whom (no cycles: tests/test_layering.py): gather_device.c calls
 * the four others; gather_device_policy.c asks gather_device_rows.c whether
 * it holds a row; the rest call none of them.
 *
 * Thread-safety: as gather_device.h (gathers serialised by gather.c; only
 * `cancelled` and the abort flag are touched from other threads).
 */
#ifndef FASTREAD_GATHER_DEVICE_INTERNAL_H
#define FASTREAD_GATHER_DEVICE_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "gather/device/fastread_device.cuh"
#include "gather/gather_device.h"
#include "gpu/gpu.h"

struct fr_gdev {
    fr_gpu *gpu;
    const fr_gather_backend *be;
    void *bstate;
    char path[1024];
    uint64_t rows, row_bytes, offset;
    uint32_t page_bytes, timeout_ms;
    uint64_t npages;
    uint32_t nslots;
    unsigned sm_count;

    uint64_t data_d, pt_d, tags_d, refs_d, clock_d, hand_d, result_d, view_d, host_slot_d, pins_d;
    uint32_t epoch; /* the last pin epoch handed out (fastread_device.cuh, "Pins") */
    uint64_t meta_bytes, cache_bytes;
    void *abort_h;
    uint64_t abort_d;
    void *tier_h;
    uint64_t tier_d, tier_bytes;

    void *module, *fn;
    /* Locality order (fastread_device.cuh, "locality order"): the two
     * counting-sort kernels, when to use them, and their scratch (2 *
     * FR_ORDER_MAX_BUCKETS counters, then the order; grown to the largest
     * gather, gathers being serialised by the store). */
    void *fn_count, *fn_place;
    int order_mode; /* 0 off, 1 auto (host tier over order_min_bytes), 2 always */
    uint64_t order_min_bytes, order_bucket_bytes, order_d, order_cap;
    /* Row fetches (fastread_device.cuh, fr_dev_fetch_rows_warp): 0 auto,
     * 1 pages always, 2 rows whenever the page is absent. Proxy only. */
    int fetch_mode, can_fetch_rows;
    /* The array mapped read-only, never touched: mincore() on a sample of
     * its pages tells a cold array from a warm one (gdev_choose_fetch). */
    void *res_map;
    size_t res_len;
    uint64_t res_seed;
    /* Hot rows (fastread_device.cuh, "Hot rows"; row_slots 0: none): the
     * arrays, the pass run after each gather (and the aging before it), the
     * view's part (hashing for the route's sample), the counts since the
     * sketch was last halved, and the ways filled since the last reset. */
    uint32_t row_slots, seen_words;
    uint64_t rtags_d, rdata_d, sketch_d, seen_d, adm_d, door_d, row_cache_bytes;
    void *fn_admit, *fn_age;
    fr_dev_rows rows_view;
    uint64_t row_notes, row_filled;
    int age_pending;
    char kernel_source[512];
    atomic_int cancelled;
    /* $FASTREAD_GATHER_TIMELINE=1: each gather prints where its time went
     * (host clock around each step, the kernel's own time from events). */
    int timeline;
    void *ev_start, *ev_end;
    unsigned serving;        /* open fr_gdev_serve sessions (gather lock held) */
    int cache_reset_pending; /* a gather failed while users' kernels may run */
};

/* rc, with "store <path>: <what>: <the driver's last error>" in err. */
static inline int gdev_gpu_err(fr_gdev *d, int rc, const char *what, char *err, size_t err_len)
{
    char why[FR_ERRLEN];
    fr_gpu_last_error(d->gpu, why, sizeof(why));
    fr_set_err(err, err_len, "store %s: %s: %s", d->path, what, why);
    return rc;
}

/* gather_device_cache.c: the HBM page cache (d->nslots and d->npages set). */
int gdev_cache_alloc(fr_gdev *d);
int gdev_cache_reset(fr_gdev *d); /* page table empty, every slot free */
/* The pin epoch for the next gather; gdev_unpin_all moves the running
 * epoch past every pin (users' kernels may then evict what was pinned). */
int gdev_next_epoch(fr_gdev *d, uint32_t *epoch);
int gdev_unpin_all(fr_gdev *d);
void gdev_cache_view(const fr_gdev *d, fr_dev_store *v);

/* gather_device_tier.c */
uint64_t gdev_avail_ram(void);
int gdev_tier_open(fr_gdev *d, const fr_store_config *cfg, fr_gdev_fill_fn fill, void *fill_arg,
                   char *err, size_t err_len);

/* gather_device_rows.c: the hot-row cache (d->row_slots 0: none). */
/* Sets row_slots (0: none), row_cache_bytes, seen_words; `off`:
 * FASTREAD_GATHER_ADMIT=off. */
void gdev_rows_plan(fr_gdev *d, const fr_store_config *cfg, const fr_gather_backend *be, int off);
uint64_t gdev_rows_meta_bytes(const fr_gdev *d);
int gdev_rows_alloc(fr_gdev *d);
int gdev_rows_reset(fr_gdev *d);
int gdev_rows_open_kernel(fr_gdev *d, char *err, size_t err_len);
void gdev_rows_view(fr_gdev *d, fr_dev_store *v);
/* The gather's rows_list_from (fastread_device.cuh, "Hot rows"). */
uint32_t gdev_rows_list_from(const fr_gdev *d);
/* The pass after gather into `out`, on the same stream (0 or a driver error). */
int gdev_rows_launch_pass(fr_gdev *d, uint64_t out, void *stream);
/* What a gather that read back `res` tells the policy (aging). */
void gdev_rows_account(fr_gdev *d, const fr_dev_result *res);
/* 1 when row id is in the hot-row cache now (a few small copies). */
int gdev_rows_holds(fr_gdev *d, uint64_t id);

/* gather_device_policy.c */
/* The value of environment variable `name` as an index into names[0..n)
 * (unset or empty: 0); an error naming the variable and its choices. */
int gdev_env_choice(const char *name, const char *const *names, int n, int *out, char *err,
                    size_t err_len);
int gdev_policy_open(fr_gdev *d, const fr_gather_backend *be, char *err, size_t err_len);
int gdev_choose_fetch(fr_gdev *d, size_t n);
/* Orders the ids by bucket of the table into d->order_d: 1 when ordered
 * (*order: the permutation), 0 when this gather goes in id order, -errno. */
int gdev_order_ids(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, uint32_t fetch_rows,
                   void *stream, uint64_t *order);

#endif
