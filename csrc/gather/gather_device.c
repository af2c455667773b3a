/*
 * The device path of fr_store (gather_device.h): open and close, one gather,
 * serving sessions (the parts it calls: gather_device_internal.h).
 *
 * Memory, all allocated at open and bounded by the config (reported by
 * fr_store_memory_get): the cache pages (nslots * page_bytes, nslots =
 * cache_bytes / page_bytes, at most the array's page count) and their
 * metadata (page table: 4 bytes per page of the array; per slot: tag 8,
 * refs 4, clock bit 4), the hot-row cache where row fetches can happen (a
 * quarter of cache_bytes, taken from the pages, plus 56 bytes a slot:
 * fastread_device.cuh, "Hot rows"), the result block and the device view; the host tier
 * (page-locked, mapped: the whole array, or hot rows plus a 4-byte row->slot
 * map in device memory); the backend's rings and staging; one page-locked
 * page for the abort flag.
 *
 * A gather: ids and out checked to be memory of this device, the result
 * block reset, the backend woken, the kernel launched on the caller's stream
 * and waited for, the backend quiesced, the result read back. A failed
 * gather (timeout, abort, read error) may leave pages LOADING and ring
 * cells taken; the whole cache is then reset (page table, tags, refs, clock
 * bits), as is the backend, before the next gather.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "gather/gather_device_internal.h"
#include "gather/gather_kernel.h"

/* Device memory kept free beyond the cache, for the caller's own work and
 * the CUDA context's needs. */
#define DEVICE_HEADROOM ((uint64_t)256 << 20)

void fr_gdev_close(fr_gdev *d)
{
    if (!d)
        return;
    if (d->bstate)
        d->be->close(d->bstate);
    fr_gpu_module_unload(d->gpu, d->module);
    fr_gpu_event_destroy(d->gpu, d->ev_start);
    fr_gpu_event_destroy(d->gpu, d->ev_end);
    uint64_t *dev[] = {&d->data_d,   &d->pt_d,      &d->tags_d,   &d->refs_d,
                       &d->clock_d,  &d->hand_d,    &d->result_d, &d->view_d,
                       &d->host_slot_d, &d->pins_d, &d->rtags_d,  &d->rdata_d,
                       &d->sketch_d, &d->seen_d,    &d->adm_d,    &d->door_d};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        fr_gpu_free(d->gpu, *dev[i]);
    fr_gpu_free(d->gpu, d->order_d);
    if (d->res_map)
        munmap(d->res_map, d->res_len);
    fr_gpu_mapped_free(d->gpu, d->abort_h);
    fr_gpu_mapped_free(d->gpu, d->tier_h);
    fr_gpu_close(d->gpu);
    free(d);
}

/* Both HBM caches empty: the state at open and after a failure. */
static int reset_caches(fr_gdev *d)
{
    int rc = gdev_cache_reset(d);
    return rc ? rc : gdev_rows_reset(d);
}

int fr_gdev_open(const fr_store_config *cfg, const fr_backend_env *env,
                 const fr_gather_backend *be, fr_gdev_fill_fn fill, void *fill_arg, fr_gdev **out,
                 char *err, size_t err_len)
{
    *out = NULL;
    uint32_t pb = cfg->page_bytes;
    if (pb < 4096 || pb > (1u << 20) || (pb & (pb - 1)) != 0) {
        fr_set_err(err, err_len, "page_bytes must be a power of two from 4096 to 1048576, got %u",
                   pb);
        return -EINVAL;
    }
    if (pb % cfg->row_bytes != 0) {
        fr_set_err(err, err_len,
                   "row_bytes %llu does not divide page_bytes %u: a row would straddle two "
                   "cache pages (choose a page size that is a multiple of the row size)",
                   (unsigned long long)cfg->row_bytes, pb);
        return -EINVAL;
    }
    if (cfg->timeout_ms == 0) {
        fr_set_err(err, err_len, "timeout_ms must be > 0");
        return -EINVAL;
    }
    fr_gdev *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->gpu = env->gpu;
    fr_gpu_retain(d->gpu);
    d->be = be;
    snprintf(d->path, sizeof(d->path), "%s", cfg->path);
    d->rows = cfg->rows;
    d->row_bytes = cfg->row_bytes;
    d->offset = cfg->offset;
    d->page_bytes = pb;
    d->timeout_ms = cfg->timeout_ms;
    d->npages = env->pages;
    char why[FR_ERRLEN];
    int rc = fr_gpu_gather_api(d->gpu, why, sizeof(why));
    if (rc) {
        fr_set_err(err, err_len, "store %s: the CUDA driver lacks the device path: %s", d->path,
                   why);
        fr_gdev_close(d);
        return rc;
    }
    int can_map = 0, sms = 0;
    if ((rc = fr_gpu_attribute(d->gpu, FR_CU_ATTR_CAN_MAP_HOST_MEMORY, &can_map)) ||
        (rc = fr_gpu_attribute(d->gpu, FR_CU_ATTR_SM_COUNT, &sms))) {
        rc = gdev_gpu_err(d, rc, "device attributes", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    if (!can_map) {
        fr_set_err(err, err_len, "GPU %d cannot map host memory: the device path needs it",
                   fr_gpu_device_id(d->gpu));
        fr_gdev_close(d);
        return -ENOTSUP;
    }
    d->sm_count = sms > 0 ? (unsigned)sms : 1;

    static const char *const admit_modes[] = {"auto", "off"};
    int admit_off;
    if ((rc = gdev_env_choice("FASTREAD_GATHER_ADMIT", admit_modes, 2, &admit_off, err,
                              err_len))) {
        fr_gdev_close(d);
        return rc;
    }
    gdev_rows_plan(d, cfg, be, admit_off);
    /* The cache: no more slots than pages, at least 64 (two per lane of a
     * warp) unless the array has fewer pages. */
    uint64_t slots = (cfg->cache_bytes - d->row_cache_bytes) / pb;
    if (slots > d->npages)
        slots = d->npages;
    if (slots < 64 && slots < d->npages) {
        fr_set_err(err, err_len,
                   "cache_bytes %llu holds %llu pages of %u bytes; the device cache needs at "
                   "least 64 (%llu bytes)",
                   (unsigned long long)cfg->cache_bytes, (unsigned long long)slots, pb,
                   (unsigned long long)64 * pb);
        fr_gdev_close(d);
        return -EINVAL;
    }
    if (slots > 0x7FFFFFFFull)
        slots = 0x7FFFFFFFull;
    d->nslots = (uint32_t)slots;
    d->cache_bytes = slots * pb;
    d->meta_bytes = d->npages * 4 + slots * 24 + 4 + sizeof(fr_dev_result) + sizeof(fr_dev_store) +
                    gdev_rows_meta_bytes(d);
    size_t free_b = 0, total_b = 0;
    if ((rc = fr_gpu_mem_info(d->gpu, &free_b, &total_b))) {
        rc = gdev_gpu_err(d, rc, "cuMemGetInfo", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    if (d->cache_bytes + d->row_cache_bytes + d->meta_bytes + DEVICE_HEADROOM > free_b) {
        fr_set_err(err, err_len,
                   "store %s: a cache of %llu bytes (+%llu of metadata) does not fit in GPU %d's "
                   "%llu free bytes (keeping %llu free): lower cache_bytes",
                   d->path, (unsigned long long)d->cache_bytes, (unsigned long long)d->meta_bytes,
                   fr_gpu_device_id(d->gpu), (unsigned long long)free_b,
                   (unsigned long long)DEVICE_HEADROOM);
        fr_gdev_close(d);
        return -ENOMEM;
    }
    /* The control block (result, counters, first error) and the view. */
    if ((rc = gdev_cache_alloc(d)) ||
        (rc = fr_gpu_alloc(d->gpu, sizeof(fr_dev_result), &d->result_d)) ||
        (rc = fr_gpu_alloc(d->gpu, sizeof(fr_dev_store), &d->view_d)) ||
        (rc = gdev_rows_alloc(d)) || (rc = reset_caches(d))) {
        rc = gdev_gpu_err(d, rc, "allocating the device cache", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    if ((rc = fr_gpu_mapped_alloc(d->gpu, 4096, &d->abort_h, &d->abort_d))) {
        rc = gdev_gpu_err(d, rc, "the abort flag (mapped host memory)", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    memset(d->abort_h, 0, 4096);
    if ((rc = gdev_tier_open(d, cfg, fill, fill_arg, err, err_len))) {
        fr_gdev_close(d);
        return rc;
    }
    if ((rc = be->probe(env, why, sizeof(why)))) {
        fr_set_err(err, err_len, "store %s: backend %s cannot run here: %s", d->path, be->name,
                   why);
        fr_gdev_close(d);
        return rc;
    }
    if ((rc = be->open(env, &d->bstate, err, err_len))) {
        d->bstate = NULL;
        fr_gdev_close(d);
        return rc;
    }
    if (be->map_cache && (rc = be->map_cache(d->bstate, d->data_d, d->cache_bytes, err, err_len))) {
        fr_gdev_close(d);
        return rc;
    }
    fr_kernel_request kr = {be->fetch_define, be->device_source ? be->device_source() : NULL,
                            cfg->cache_dir, cfg->nvrtc_path};
    if ((rc = fr_kernel_load(d->gpu, &kr, &d->module, &d->fn, d->kernel_source,
                             sizeof(d->kernel_source), why, sizeof(why)))) {
        fr_set_err(err, err_len, "store %s: backend %s: %s", d->path, be->name, why);
        fr_gdev_close(d);
        return rc;
    }
    if ((rc = gdev_policy_open(d, be, err, err_len)) ||
        (rc = gdev_rows_open_kernel(d, err, err_len))) {
        fr_gdev_close(d);
        return rc;
    }
    /* The view the kernel reads: device addresses throughout. */
    fr_dev_store v;
    memset(&v, 0, sizeof(v));
    v.rows = d->rows;
    v.row_bytes = d->row_bytes;
    v.offset = cfg->offset;
    v.data_bytes = d->rows * d->row_bytes;
    v.rows_per_page = (uint32_t)(pb / d->row_bytes);
    v.timeout_ns = (uint64_t)cfg->timeout_ms * 1000000ull;
    gdev_cache_view(d, &v);
    v.host_rows = (const uint8_t *)(uintptr_t)d->tier_d;
    v.host_slot = (const int32_t *)(uintptr_t)d->host_slot_d;
    v.abort = (uint32_t *)(uintptr_t)d->abort_d;
    v.result = (fr_dev_result *)(uintptr_t)d->result_d;
    gdev_rows_view(d, &v);
    be->fill_view(d->bstate, &v.fetch);
    if ((rc = fr_gpu_copy_to_device(d->gpu, d->view_d, &v, sizeof(v)))) {
        rc = gdev_gpu_err(d, rc, "copying the device view", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    const char *tl = getenv("FASTREAD_GATHER_TIMELINE");
    if (tl && tl[0] && strcmp(tl, "0") != 0) {
        d->timeline = 1;
        /* Without events (old driver) the timeline still has the host steps. */
        if (fr_gpu_event_create(d->gpu, &d->ev_start) || fr_gpu_event_create(d->gpu, &d->ev_end)) {
            fr_gpu_event_destroy(d->gpu, d->ev_start);
            fr_gpu_event_destroy(d->gpu, d->ev_end);
            d->ev_start = d->ev_end = NULL;
        }
    }
    *out = d;
    return 0;
}
static double mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

void fr_gdev_cancel(fr_gdev *d)
{
    atomic_store(&d->cancelled, 1);
    __atomic_store_n((uint32_t *)d->abort_h, 1, __ATOMIC_SEQ_CST);
    d->be->cancel(d->bstate);
}

/* ids and out must be memory of this device (or mapped for it). */
static int check_pointer(fr_gdev *d, uint64_t p, const char *what, char *err, size_t err_len)
{
    int dev = -1;
    int rc = fr_gpu_pointer_device(d->gpu, p, &dev);
    if (rc) {
        fr_set_err(err, err_len, "%s at 0x%llx is not CUDA memory (pass a device pointer)", what,
                   (unsigned long long)p);
        return -EINVAL;
    }
    if (dev != fr_gpu_device_id(d->gpu)) {
        fr_set_err(err, err_len, "%s are on GPU %d but store %s serves GPU %d", what, dev,
                   d->path, fr_gpu_device_id(d->gpu));
        return -EINVAL;
    }
    return 0;
}

int fr_gdev_check_pointers(fr_gdev *d, uint64_t ids, uint64_t out, char *err, size_t err_len)
{
    int rc = check_pointer(d, ids, "ids", err, err_len);
    return rc ? rc : check_pointer(d, out, "the output rows", err, err_len);
}

int fr_gdev_gather(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, uint64_t out, void *stream,
                   size_t *bad_index, fr_store_stats *delta, char *err, size_t err_len)
{
    if (n == 0)
        return 0;
    double t[8] = {0};
    if (d->timeline)
        t[0] = mono_us();
    int rc = fr_gdev_check_pointers(d, ids, out, err, err_len);
    if (rc)
        return rc;
    if (atomic_load(&d->cancelled)) {
        fr_set_err(err, err_len, "gather from %s cancelled: the store is closing", d->path);
        return -ECANCELED;
    }
    fr_dev_result res;
    memset(&res, 0, sizeof(res));
    res.first_bad = ~0ull;
    res.fetch_rows = (uint32_t)gdev_choose_fetch(d, n);
    res.rows_list_from = gdev_rows_list_from(d);
    if ((rc = gdev_next_epoch(d, &res.epoch)))
        return gdev_gpu_err(d, rc, "clearing the cache's pins", err, err_len);
    if (d->timeline)
        t[1] = mono_us();
    if ((rc = fr_gpu_copy_to_device(d->gpu, d->result_d, &res, sizeof(res))))
        return gdev_gpu_err(d, rc, "resetting the result block", err, err_len);
    if (d->timeline)
        t[2] = mono_us();
    char berr[FR_ERRLEN] = "";
    if ((rc = d->be->begin(d->bstate, berr, sizeof(berr)))) {
        fr_set_err(err, err_len, "store %s: backend %s: %s", d->path, d->be->name, berr);
        return rc;
    }
    if (d->timeline)
        t[3] = mono_us();
    /* Warps: one per 32 ids, at most 64 per SM (full occupancy). The cache
     * size sets no bound: no warp waits while holding slots, and a loader
     * that finds no victim gives its claim back (fr_dev_gather_warp). */
    uint64_t warps = (n + 31) / 32;
    uint64_t cap = (uint64_t)d->sm_count * 64;
    if (warps > cap)
        warps = cap;
    unsigned block = warps * 32 < 256 ? (unsigned)(warps * 32) : 256;
    unsigned grid = (unsigned)((warps * 32 + block - 1) / block);
    uint64_t view = d->view_d;
    unsigned long long nn = n;
    uint64_t order = 0;
    int timed = d->timeline && d->ev_start &&
                fr_gpu_event_record(d->gpu, d->ev_start, (fr_CUstream)stream) == 0;
    int launch_rc = gdev_order_ids(d, ids, id_bytes, n, res.fetch_rows, stream, &order);
    int ordered = launch_rc == 1;
    if (launch_rc > 0)
        launch_rc = 0;
    void *params[] = {&view, &ids, &id_bytes, &nn, &out, &order};
    if (launch_rc == 0)
        launch_rc = fr_gpu_launch(d->gpu, d->fn, grid, block, (fr_CUstream)stream, params);
    /* Hot rows: the admission pass on the same stream, so nothing of ours
     * reads the row cache while it changes (fastread_device.cuh, "Hot rows"). */
    if (launch_rc == 0)
        launch_rc = gdev_rows_launch_pass(d, out, stream);
    if (timed && launch_rc == 0)
        timed = fr_gpu_event_record(d->gpu, d->ev_end, (fr_CUstream)stream) == 0;
    if (d->timeline)
        t[4] = mono_us();
    if (launch_rc == 0)
        launch_rc = fr_gpu_stream_wait(d->gpu, (fr_CUstream)stream);
    if (d->timeline)
        t[5] = mono_us();
    char launch_err[FR_ERRLEN] = "";
    if (launch_rc)
        fr_gpu_last_error(d->gpu, launch_err, sizeof(launch_err));
    int read_rc = launch_rc ? -EIO : fr_gpu_copy_from_device(d->gpu, &res, d->result_d, sizeof(res));
    int failed = launch_rc || read_rc || res.error != 0;
    berr[0] = 0;
    if (d->timeline)
        t[6] = mono_us();
    int end_rc = d->be->end(d->bstate, failed, berr, sizeof(berr));
    if (d->timeline) {
        t[7] = mono_us();
        float kms = -1.0f;
        if (timed && launch_rc == 0 && fr_gpu_event_elapsed_ms(d->gpu, d->ev_start, d->ev_end, &kms))
            kms = -1.0f;
        fprintf(stderr,
                "fastread gather timeline: n %zu grid %ux%u%s%s | checks %.1f us, result reset %.1f, "
                "begin %.1f, launch %.1f, wait %.1f (kernel %.1f by events), read-back %.1f, "
                "end %.1f | total %.1f us\n",
                n, grid, block, ordered ? " ordered" : "", res.fetch_rows ? " row-fetches" : "",
                t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3], t[5] - t[4],
                (double)kms * 1e3, t[6] - t[5], t[7] - t[6], t[7] - t[0]);
    }
    if (d->serving) {
        int urc = gdev_unpin_all(d); /* users' kernels may evict what this gather pinned */
        if (urc && !launch_rc) {
            fr_gpu_last_error(d->gpu, launch_err, sizeof(launch_err));
            launch_rc = urc;
        }
    }
    if (failed && d->serving) {
        d->cache_reset_pending = 1; /* users' kernels may be using the cache */
    } else if (failed) {
        int rrc = reset_caches(d);
        if (rrc && !launch_rc) {
            fr_gpu_last_error(d->gpu, launch_err, sizeof(launch_err));
            launch_rc = rrc;
        }
    }
    d->be->counters(d->bstate, delta);
    if (!launch_rc && !read_rc) {
        delta->cache_hits += res.counters[FR_CNT_HITS];
        delta->cache_misses += res.counters[FR_CNT_MISSES];
        delta->coalesced += res.counters[FR_CNT_COALESCED];
        delta->host_tier_rows += res.counters[FR_CNT_HOST_TIER];
        delta->direct_rows += res.counters[FR_CNT_DIRECT_ROWS];
        delta->evictions += res.counters[FR_CNT_EVICTIONS];
        delta->row_hits += res.counters[FR_CNT_ROW_HITS];
        delta->admitted += res.counters[FR_CNT_ADMITTED];
        gdev_rows_account(d, &res);
    }
    if (launch_rc) {
        fr_set_err(err, err_len, "store %s: the gather kernel failed: %s", d->path, launch_err);
        return launch_rc;
    }
    if (read_rc)
        return gdev_gpu_err(d, read_rc, "reading the gather's result", err, err_len);
    if (res.error) {
        if (res.error == FR_DEV_ECANCELED)
            fr_set_err(err, err_len, "gather from %s cancelled: the store is closing", d->path);
        else if (res.error == FR_DEV_ETIMEDOUT)
            fr_set_err(err, err_len,
                       "gather from %s: a device-side wait ran out after %u ms (timeout_ms)%s%s",
                       d->path, d->timeout_ms, berr[0] ? "; backend: " : "", berr);
        else if (berr[0])
            fr_set_err(err, err_len, "%s", berr);
        else
            fr_set_err(err, err_len, "gather from %s: %s", d->path, strerror(-res.error));
        return res.error;
    }
    if (end_rc) {
        fr_set_err(err, err_len, "%s", berr);
        return end_rc;
    }
    if (res.first_bad != ~0ull) {
        if (bad_index)
            *bad_index = (size_t)res.first_bad;
        int64_t id = 0;
        if (id_bytes == 4) {
            int32_t v = 0;
            fr_gpu_copy_from_device(d->gpu, &v, ids + res.first_bad * 4, 4);
            id = v;
        } else {
            fr_gpu_copy_from_device(d->gpu, &id, ids + res.first_bad * 8, 8);
        }
        fr_set_err(err, err_len, "row id %lld at position %llu is out of range [0, %llu) of %s",
                   (long long)id, (unsigned long long)res.first_bad, (unsigned long long)d->rows,
                   d->path);
        return -ERANGE;
    }
    return 0;
}

void fr_gdev_memory(fr_gdev *d, fr_store_memory *add)
{
    add->device_cache += d->cache_bytes + d->row_cache_bytes;
    add->device_meta += d->meta_bytes + (d->host_slot_d ? d->rows * 4 : 0) + d->order_cap;
    add->host_tier += d->tier_bytes;
    add->rings += 4096; /* the abort flag's page */
    d->be->memory(d->bstate, add);
}

int fr_gdev_serve(fr_gdev *d, int on, char *err, size_t err_len)
{
    char berr[FR_ERRLEN] = "";
    if (on) {
        if (atomic_load(&d->cancelled)) {
            fr_set_err(err, err_len, "store %s is closing", d->path);
            return -ECANCELED;
        }
        __atomic_store_n((uint32_t *)d->abort_h, 0, __ATOMIC_SEQ_CST);
        int rc = gdev_unpin_all(d);
        if (rc)
            return gdev_gpu_err(d, rc, "moving the cache's pin epoch", err, err_len);
        rc = d->be->begin(d->bstate, berr, sizeof(berr));
        if (rc) {
            fr_set_err(err, err_len, "store %s: backend %s: %s", d->path, d->be->name, berr);
            return rc;
        }
        d->serving++;
        return 0;
    }
    if (d->serving == 0) {
        fr_set_err(err, err_len, "store %s: no serving session is open", d->path);
        return -EINVAL;
    }
    d->serving--;
    /* failed = 1 when the last session ends: users' kernels report their
     * failures to no one, so the rings are reset in any case (cheap). */
    int rc = d->be->end(d->bstate, d->serving == 0, berr, sizeof(berr));
    if (d->serving == 0 && d->cache_reset_pending) {
        d->cache_reset_pending = 0;
        int crc = reset_caches(d);
        if (crc && !rc)
            rc = gdev_gpu_err(d, crc, "resetting the cache", err, err_len);
    }
    if (rc && berr[0])
        fr_set_err(err, err_len, "store %s: backend %s: %s", d->path, d->be->name, berr);
    return rc;
}

uint64_t fr_gdev_view(const fr_gdev *d) { return d->view_d; }
const char *fr_gdev_kernel_source(const fr_gdev *d) { return d->kernel_source; }
