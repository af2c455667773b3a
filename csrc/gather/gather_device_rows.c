/*
 * The device path's hot-row cache (gather_device_internal.h; the policy
 * itself is fastread_device.cuh's "Hot rows"): its size, its device arrays
 * (tags, rows, count-min sketch, seen words, candidate list), the
 * admission pass launched after each of fastread's gathers on the same
 * stream, and the sketch's aging (TinyLFU's reset).
 */
#include <stdlib.h>
#include <string.h>

#include "gather/gather_device_internal.h"

/* Device bytes a hot-row slot costs besides its row: a tag (8), eight
 * sketch counters (32), half a candidate (8), a seen word (4), a
 * doorkeeper word (4: 32 bits). */
#define ROW_SLOT_META 56u

/* The hot-row cache's slots (fastread_device.cuh, "Hot rows"), 0 for none.
 * FASTREAD_GATHER_ADMIT (auto or off: `off`, parsed by the caller). Auto:
 * where row fetches can happen (the proxy backend, FASTREAD_GATHER_FETCH
 * not "pages", an array larger than the cache and not all in the host tier,
 * 2 rows a page or more, pins on: the pass runs for fastread's own gathers
 * only), a quarter of cache_bytes in a power-of-two number of rows, when
 * that leaves the page cache 64 pages. */
void gdev_rows_plan(fr_gdev *d, const fr_store_config *cfg, const fr_gather_backend *be, int off)
{
    d->row_slots = 0;
    const char *fetch = getenv("FASTREAD_GATHER_FETCH");
    uint64_t data = d->rows * d->row_bytes;
    uint64_t budget = cfg->host_bytes == UINT64_MAX ? gdev_avail_ram() / 2 : cfg->host_bytes;
    if (!off && be->fetch_define && strcmp(be->fetch_define, "FR_FETCH_PROXY") == 0 &&
        !(fetch && strcmp(fetch, "pages") == 0) && data > cfg->cache_bytes &&
        !(budget && data <= budget) && d->page_bytes / d->row_bytes >= 2 &&
        d->npages <= 0xFFFFFFFFull) {
        /* A quarter of cache_bytes for the rows, and their metadata (56
         * bytes a slot: gdev_rows_meta_bytes) at most as much again: rows
         * smaller than that get fewer slots (16-byte rows with slots for a
         * quarter of 4 GiB would have added 3.3 GiB of metadata). */
        uint64_t per_slot = d->row_bytes > ROW_SLOT_META ? d->row_bytes : ROW_SLOT_META;
        uint64_t want = cfg->cache_bytes / 4 / per_slot, slots = 1;
        while (slots * 2 <= want && slots < (1ull << 30))
            slots *= 2;
        if (slots >= 64 && (cfg->cache_bytes - slots * d->row_bytes) / d->page_bytes >= 64)
            d->row_slots = (uint32_t)slots;
    }
    d->row_cache_bytes = (uint64_t)d->row_slots * d->row_bytes;
    /* One seen word a slot: few rows of one gather collide there, and one
     * that does is listed twice (the pass skips the second). */
    d->seen_words = d->row_slots > 64 ? d->row_slots : 64;
}

/* Per slot a tag (8), eight sketch counters (32: two rows of four),
 * half a candidate (16 / 2), a doorkeeper word (4: 32 bits, so with up to
 * 10 x slots rows counted between resets a row seen once finds its bit
 * taken by another under a third of the time); and the seen words (4
 * each). */
uint64_t gdev_rows_meta_bytes(const fr_gdev *d)
{
    if (!d->row_slots)
        return 0;
    return (uint64_t)d->row_slots * (ROW_SLOT_META - 4) + (uint64_t)d->seen_words * 4;
}

int gdev_rows_alloc(fr_gdev *d)
{
    if (!d->row_slots)
        return 0;
    int rc;
    if ((rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 8, &d->rtags_d)) ||
        (rc = fr_gpu_alloc(d->gpu, d->row_cache_bytes, &d->rdata_d)) ||
        (rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 32, &d->sketch_d)) ||
        (rc = fr_gpu_alloc(d->gpu, (size_t)d->seen_words * 4, &d->seen_d)) ||
        (rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 8, &d->adm_d)) ||
        (rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 4, &d->door_d)) ||
        (rc = fr_gpu_memset8(d->gpu, d->sketch_d, 0, (size_t)d->row_slots * 32)) ||
        (rc = fr_gpu_memset8(d->gpu, d->door_d, 0, (size_t)d->row_slots * 4)) ||
        (rc = fr_gpu_memset8(d->gpu, d->seen_d, 0, (size_t)d->seen_words * 4)))
        return rc;
    return 0;
}

/* Every slot empty (a failed pass may have left slots BUSY). */
int gdev_rows_reset(fr_gdev *d)
{
    d->row_filled = 0;
    if (!d->row_slots)
        return 0;
    return fr_gpu_memset8(d->gpu, d->rtags_d, 0, (size_t)d->row_slots * 8);
}

int gdev_rows_open_kernel(fr_gdev *d, char *err, size_t err_len)
{
    if (!d->row_slots)
        return 0;
    int rc = fr_gpu_module_function(d->gpu, d->module, "fr_rows_admit", &d->fn_admit);
    if (rc == 0)
        rc = fr_gpu_module_function(d->gpu, d->module, "fr_rows_age", &d->fn_age);
    if (rc)
        return gdev_gpu_err(d, rc, "the hot-row cache's kernels", err, err_len);
    return 0;
}

/* The cache's part of the view the kernel reads (device addresses), kept
 * for the route's sample too. */
void gdev_rows_view(fr_gdev *d, fr_dev_store *v)
{
    if (!d->row_slots)
        return;
    v->rowc.tags = (uint64_t *)(uintptr_t)d->rtags_d;
    v->rowc.data = (uint8_t *)(uintptr_t)d->rdata_d;
    v->rowc.sketch = (uint32_t *)(uintptr_t)d->sketch_d;
    v->rowc.seen = (uint32_t *)(uintptr_t)d->seen_d;
    v->rowc.adm = (uint64_t *)(uintptr_t)d->adm_d;
    v->rowc.adm_n = (uint64_t *)(uintptr_t)(d->result_d + offsetof(fr_dev_result, adm_n));
    v->rowc.adm_cap = d->row_slots / 2;
    v->rowc.slot_mask = d->row_slots - 1;
    v->rowc.width_mask = 4 * d->row_slots - 1;
    v->rowc.seen_mask = d->seen_words - 1;
    v->rowc.threshold = 2;
    v->rowc.door = (uint32_t *)(uintptr_t)d->door_d;
    v->rowc.door_mask = d->row_slots - 1;
    d->rows_view = v->rowc;
}

/* Listing at first sight fills room, which evicts nothing, and a row asked
 * again is then served from HBM from the next gather on, where listing at
 * the threshold only had it wait one more; past 7/8 full, rows seen once
 * are no longer listed, and every candidate goes through TinyLFU's
 * comparison (fastread_device.cuh, fr_rows_list_from). */
uint32_t gdev_rows_list_from(const fr_gdev *d)
{
    return d->row_slots ? fr_rows_list_from(&d->rows_view, d->row_filled) : 0;
}

/* The admission pass on the gather's stream, so nothing of ours reads the
 * row cache while it changes (fastread_device.cuh, "Hot rows"), after the
 * sketch's halving when one is due. */
int gdev_rows_launch_pass(fr_gdev *d, uint64_t out, void *stream)
{
    if (!d->row_slots)
        return 0;
    uint64_t view = d->view_d;
    int rc = 0;
    if (d->age_pending) {
        void *age_params[] = {&view};
        rc = fr_gpu_launch(d->gpu, d->fn_age, d->sm_count * 4, 256, (fr_CUstream)stream,
                           age_params);
        if (rc)
            return rc;
        d->age_pending = 0;
    }
    void *admit_params[] = {&view, &out};
    return fr_gpu_launch(d->gpu, d->fn_admit, d->sm_count * 4, 256, (fr_CUstream)stream,
                         admit_params);
}

/* TinyLFU's reset: the sketch halved after 10 x slots counts; and the
 * ways the pass filled (gdev_rows_list_from). */
void gdev_rows_account(fr_gdev *d, const fr_dev_result *res)
{
    d->row_filled += res->row_fills;
    d->row_notes += res->counters[FR_CNT_DIRECT_ROWS];
    if (d->row_slots && fr_rows_age_due(&d->rows_view, d->row_notes)) {
        d->age_pending = 1;
        d->row_notes = 0;
    }
}

/* The ways of row id's set, compared with it (a failed copy: not held). */
int gdev_rows_holds(fr_gdev *d, uint64_t id)
{
    if (!d->row_slots)
        return 0;
    uint64_t tags[FR_ROWS_WAYS];
    uint32_t set = fr_rows_set(&d->rows_view, id);
    if (fr_gpu_copy_from_device(d->gpu, tags, d->rtags_d + (uint64_t)set * 8, sizeof(tags)) != 0)
        return 0;
    int in = 0;
    for (unsigned w = 0; w < FR_ROWS_WAYS; w++)
        in |= (tags[w] & ~FR_RTAG_REF) == id + 1;
    return in;
}
