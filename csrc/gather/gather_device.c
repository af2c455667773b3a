/*
 * The device path of fr_store (gather_device.h).
 *
 * Memory, all allocated at open and bounded by the config (reported by
 * fr_store_memory_get): the cache pages (nslots * page_bytes, nslots =
 * cache_bytes / page_bytes, at most the array's page count) and their
 * metadata (page table: 4 bytes per page of the array; per slot: tag 8,
 * refs 4, clock bit 4), the hot-row cache where row fetches can happen (a
 * quarter of cache_bytes, taken from the pages, plus 52 bytes a slot:
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
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "gather/gather_device.h"
#include "gather/gather_kernel.h"
#include "gather/gather_route.h"
#include "gpu/gpu.h"

/* Device memory kept free beyond the cache, for the caller's own work and
 * the CUDA context's needs. */
#define DEVICE_HEADROOM ((uint64_t)256 << 20)

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
     * its pages tells a cold array from a warm one (choose_fetch). */
    void *res_map;
    size_t res_len;
    uint64_t res_seed;
    /* Hot rows (fastread_device.cuh, "Hot rows"; row_slots 0: none): the
     * arrays, the pass run after each gather, the view's part (hashing for
     * the route's sample), and the counts since the sketch was last halved. */
    uint32_t row_slots, seen_words;
    uint64_t rtags_d, rdata_d, sketch_d, seen_d, adm_d, row_cache_bytes;
    void *fn_admit;
    fr_dev_rows rows_view;
    uint64_t row_notes;
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

static int gpu_err(fr_gdev *d, int rc, const char *what, char *err, size_t err_len)
{
    char why[FR_ERRLEN];
    fr_gpu_last_error(d->gpu, why, sizeof(why));
    fr_set_err(err, err_len, "store %s: %s: %s", d->path, what, why);
    return rc;
}

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
                       &d->sketch_d, &d->seen_d,    &d->adm_d};
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

static int env_bytes(const char *name, uint64_t *out, char *err, size_t err_len)
{
    const char *v = getenv(name);
    if (!v || !v[0])
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || !end || *end || v[0] == '-' || x == 0) {
        fr_set_err(err, err_len, "%s must be a positive byte count, got '%s'", name, v);
        return -EINVAL;
    }
    *out = x;
    return 0;
}

/* The value of environment variable `name` as an index into names[0..n)
 * (unset or empty: 0); an error naming the variable and its choices. */
static int env_choice(const char *name, const char *const *names, int n, int *out, char *err,
                      size_t err_len)
{
    const char *v = getenv(name);
    *out = 0;
    if (!v || !v[0])
        return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = i;
            return 0;
        }
    char list[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                 i == 0 ? "" : i == n - 1 ? " or " : ", ", names[i]);
    fr_set_err(err, err_len, "%s must be %s, got '%s'", name, list, v);
    return -EINVAL;
}

/* $FASTREAD_GATHER_ORDER: auto (default: order the ids of gathers from a
 * host tier larger than the GPU's translation reach, 1 GiB by the probe,
 * $FASTREAD_GATHER_ORDER_MIN_BYTES moving that bound, and of gathers that
 * load pages of an array larger than the cache: order_auto), on (every gather of
 * 4096 ids or more), off. $FASTREAD_GATHER_ORDER_BUCKET_BYTES: the bucket
 * size (64 MiB). */
static int open_order(fr_gdev *d, char *err, size_t err_len)
{
    static const char *const modes[] = {"auto", "on", "off"};
    int mode;
    int rc = env_choice("FASTREAD_GATHER_ORDER", modes, 3, &mode, err, err_len);
    if (rc)
        return rc;
    d->order_mode = mode == 0 ? 1 : mode == 1 ? 2 : 0;
    d->order_min_bytes = 1ull << 30;
    d->order_bucket_bytes = 64ull << 20;
    rc = env_bytes("FASTREAD_GATHER_ORDER_MIN_BYTES", &d->order_min_bytes, err, err_len);
    if (rc == 0)
        rc = env_bytes("FASTREAD_GATHER_ORDER_BUCKET_BYTES", &d->order_bucket_bytes, err, err_len);
    if (d->order_bucket_bytes > (1ull << 40))
        d->order_bucket_bytes = 1ull << 40;
    if (rc || d->order_mode == 0)
        return rc;
    rc = fr_gpu_module_function(d->gpu, d->module, "fr_order_count", &d->fn_count);
    if (rc == 0)
        rc = fr_gpu_module_function(d->gpu, d->module, "fr_order_place", &d->fn_place);
    if (rc)
        return gpu_err(d, rc, "the locality-order kernels", err, err_len);
    return 0;
}

/* $FASTREAD_GATHER_FETCH: auto (default; see choose_fetch), pages, rows. */
static int open_fetch(fr_gdev *d, const fr_gather_backend *be, char *err, size_t err_len)
{
    static const char *const modes[] = {"auto", "pages", "rows"};
    d->can_fetch_rows = be->fetch_define && strcmp(be->fetch_define, "FR_FETCH_PROXY") == 0;
    int rc = env_choice("FASTREAD_GATHER_FETCH", modes, 3, &d->fetch_mode, err, err_len);
    if (rc)
        return rc;
    /* For the residency sample (choose_fetch, and backend "auto"'s route:
     * fr_gdev_route); without it (a mapping refused) arrays count as warm,
     * which only costs the cold cases their best path. */
    int fd = fr_open_data(d->path, 0, 1, NULL); /* a FIFO swapped in: no wait */
    if (fd >= 0) {
        uint64_t lo = d->offset & ~(uint64_t)4095;
        d->res_len = (size_t)(d->offset + d->rows * d->row_bytes - lo);
        void *m = mmap(NULL, d->res_len, PROT_READ, MAP_SHARED, fd, (off_t)lo);
        d->res_map = m == MAP_FAILED ? NULL : m;
        close(fd);
    }
    d->res_seed = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)d;
    return 0;
}

/* The share of 64 pages of the array, drawn at random, that the page cache
 * holds (1 when unknown). */
static double resident_share(fr_gdev *d)
{
    unsigned asked, in = fr_resident_sample(d->res_map, d->res_len, 64, &d->res_seed, &asked);
    return asked ? (double)in / asked : 1.0;
}

/* Whether this gather reads rows of absent pages on their own instead of
 * loading their pages (1; the kernel still loads pages that 8 lanes of a
 * warp want; 2: always; 0: never). Loading a page pays off when its other rows are used
 * while it is cached: by this batch (a dense batch) or by later ones (the
 * whole array fits the cache, so nothing loaded is ever evicted). Else a
 * page read moves page_bytes to use a few rows: 1M random ids over a 16M x
 * 512 B array in 64 KiB pages touch every page (8 GiB read for 512 MB of
 * rows). Auto: rows when the array is larger than the cache, is not all in
 * the host tier, and the batch is sparse: max(1, n / pages), about the rows
 * it wants per touched page, is under a quarter of the rows per page. */
static int choose_fetch(fr_gdev *d, size_t n)
{
    if (!d->can_fetch_rows || d->fetch_mode == 1)
        return 0;
    if (d->fetch_mode == 2)
        return 2;
    if (d->tier_bytes && !d->host_slot_d)
        return 0; /* every row is in the host tier */
    if (d->rows * d->row_bytes <= d->cache_bytes)
        return 0;
    uint64_t rpp = d->page_bytes / d->row_bytes;
    double per_page = (double)n / (double)d->npages;
    if (per_page < 1.0)
        per_page = 1.0;
    if (per_page * 4.0 >= (double)rpp)
        return 0;
    /* Cold arrays: a device serves a page read in about the time of a row
     * read, so pages win once a batch wants 2 rows per touched page
     * (H100 machine, virtio disk, 16M x 512 B in 64 KiB pages, cold: 1M
     * ids 0.19M rows/s by pages against 0.08M by rows; 100k ids, under one
     * row per page, 0.02M against 0.07M). */
    if (per_page >= 2.0 && resident_share(d) < 0.5)
        return 0;
    return 1;
}

/* Orders the ids by bucket of the table into d->order_d + the counters:
 * 1 when ordered, 0 when this gather goes in id order, -errno on failure. */
/* Whether auto orders this gather's ids: a host tier over order_min_bytes
 * (address translation, above), or page loads (fetch_rows 0) from an array
 * larger than the cache. There, ids in input order touch every page of the
 * array all through the batch, so a page loaded for one warp is evicted
 * before the warps wanting its other rows come, and is read again (cold
 * 1M ids over 16M x 512 B rows, 1 GiB cache, H100 machine: 0.12M rows/s
 * against 0.19M with an 8 GiB cache); ordered, a page's rows are in flight
 * together and it is read once. */
static int order_auto(const fr_gdev *d, uint32_t fetch_rows)
{
    if (d->tier_bytes > d->order_min_bytes)
        return 1;
    int all_in_tier = d->tier_bytes && !d->host_slot_d;
    return fetch_rows == 0 && !all_in_tier && d->rows * d->row_bytes > d->cache_bytes;
}

static int order_ids(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, uint32_t fetch_rows,
                     void *stream, uint64_t *order)
{
    *order = 0;
    if (d->order_mode == 0 || n < 4096 || n > 0xFFFFFFFFull ||
        (d->order_mode == 1 && !order_auto(d, fetch_rows)))
        return 0;
    /* Buckets of about 64 MiB of rows (16-128 MiB measured alike), at most
     * FR_ORDER_MAX_BUCKETS of them. */
    unsigned shift = 0;
    while (shift < 40 && (d->row_bytes << shift) < d->order_bucket_bytes)
        shift++;
    while (((d->rows - 1) >> shift) + 1 > FR_ORDER_MAX_BUCKETS)
        shift++;
    unsigned nbuckets = (unsigned)(((d->rows - 1) >> shift) + 1);
    size_t counters = 2 * (size_t)FR_ORDER_MAX_BUCKETS * 4;
    size_t need = counters + n * 4;
    int rc;
    if (need > d->order_cap) {
        fr_gpu_free(d->gpu, d->order_d);
        d->order_d = 0;
        d->order_cap = 0;
        if ((rc = fr_gpu_alloc(d->gpu, need, &d->order_d)))
            return rc;
        d->order_cap = need;
    }
    static const uint32_t zeros[2 * FR_ORDER_MAX_BUCKETS];
    if ((rc = fr_gpu_copy_to_device(d->gpu, d->order_d, zeros, counters)))
        return rc;
    uint64_t counts = d->order_d, fill = d->order_d + counters / 2;
    *order = d->order_d + counters;
    unsigned long long nn = n, rows = d->rows;
    unsigned block = 256;
    uint64_t blocks = (n + block - 1) / block;
    uint64_t cap = (uint64_t)d->sm_count * 8;
    unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    void *count_params[] = {&ids, &id_bytes, &nn, &rows, &shift, &nbuckets, &counts};
    if ((rc = fr_gpu_launch(d->gpu, d->fn_count, grid, block, (fr_CUstream)stream, count_params)))
        return rc;
    uint64_t tiles = (n + 4095) / 4096;
    grid = (unsigned)(tiles < cap ? tiles : cap);
    void *place_params[] = {&ids, &id_bytes, &nn, &rows, &shift, &nbuckets, &counts, &fill, order};
    if ((rc = fr_gpu_launch(d->gpu, d->fn_place, grid, block, (fr_CUstream)stream, place_params)))
        return rc;
    return 1;
}

/* Page table empty, every slot free: the state at open and after a failure. */
static int reset_cache(fr_gdev *d)
{
    int rc = fr_gpu_memset8(d->gpu, d->pt_d, 0, d->npages * 4);
    if (rc == 0)
        rc = fr_gpu_memset8(d->gpu, d->tags_d, 0xFF, (size_t)d->nslots * 8);
    if (rc == 0)
        rc = fr_gpu_memset8(d->gpu, d->refs_d, 0, (size_t)d->nslots * 4);
    if (rc == 0)
        rc = fr_gpu_memset8(d->gpu, d->clock_d, 0, (size_t)d->nslots * 4);
    if (rc == 0)
        rc = fr_gpu_memset8(d->gpu, d->hand_d, 0, 4);
    if (rc == 0)
        rc = fr_gpu_memset8(d->gpu, d->pins_d, 0, (size_t)d->nslots * 8);
    if (rc == 0 && d->row_slots) /* a failed pass may have left slots BUSY */
        rc = fr_gpu_memset8(d->gpu, d->rtags_d, 0, (size_t)d->row_slots * 8);
    return rc;
}

/* The pin epoch for the next gather. Epochs only grow; before the 32-bit
 * word would wrap, every pin is cleared (no gather of ours runs now, and
 * users' kernels never rely on pins) and counting starts again. */
static int next_epoch(fr_gdev *d, uint32_t *epoch)
{
    if (d->epoch >= 0xFFFFFF00u) {
        int rc = fr_gpu_memset8(d->gpu, d->pins_d, 0, (size_t)d->nslots * 8);
        if (rc)
            return rc;
        d->epoch = 0;
    }
    *epoch = ++d->epoch;
    return 0;
}

/* Moves epoch_now past every pin, so users' kernels (a serving session)
 * may evict what the last gather pinned. */
static int unpin_all(fr_gdev *d)
{
    uint32_t e;
    int rc = next_epoch(d, &e);
    if (rc == 0)
        rc = fr_gpu_copy_to_device(d->gpu, d->result_d + offsetof(fr_dev_result, epoch), &e,
                                   sizeof(e));
    return rc;
}

/* The whole array into the host tier: large sequential reads. */
static int read_whole(fr_gdev *d, const fr_store_config *cfg, char *err, size_t err_len)
{
    int fd = fr_open_data(cfg->path, 0, 1, NULL); /* a FIFO swapped in: refused, no wait */
    if (fd < 0) {
        fr_set_err(err, err_len, "store %s: host tier: %s", cfg->path, strerror(-fd));
        return fd;
    }
    uint8_t *dst = d->tier_h;
    uint64_t done = 0, want = d->rows * d->row_bytes;
    while (done < want) {
        size_t chunk = want - done > ((uint64_t)64 << 20) ? (size_t)64 << 20 : (size_t)(want - done);
        ssize_t r = pread(fd, dst + done, chunk, (off_t)(cfg->offset + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            fr_set_err(err, err_len, "store %s: filling the host tier at byte %llu: %s",
                       cfg->path, (unsigned long long)(cfg->offset + done),
                       r < 0 ? strerror(e) : "the file ended early");
            return -e;
        }
        done += (uint64_t)r;
    }
    close(fd);
    return 0;
}

static uint64_t avail_ram(void)
{
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

/* The host tier: the whole array when it fits the budget, else hot rows. */
static int open_tier(fr_gdev *d, const fr_store_config *cfg, fr_gdev_fill_fn fill, void *fill_arg,
                     char *err, size_t err_len)
{
    uint64_t data = d->rows * d->row_bytes;
    uint64_t budget = cfg->host_bytes;
    if (budget == UINT64_MAX) /* auto: at most half the memory free now */
        budget = avail_ram() / 2;
    if (budget == 0)
        return 0;
    if (data <= budget) {
        d->tier_bytes = data;
        int rc = fr_gpu_mapped_alloc(d->gpu, data, &d->tier_h, &d->tier_d);
        if (rc)
            return gpu_err(d, rc, "page-locking the host tier", err, err_len);
        return read_whole(d, cfg, err, err_len);
    }
    if (!cfg->hot_ids || cfg->n_hot == 0)
        return 0;
    /* Hot rows, first come first served, up to the budget; duplicates once. */
    uint64_t cap = budget / d->row_bytes;
    if (cap > cfg->n_hot)
        cap = cfg->n_hot;
    if (cap > INT32_MAX)
        cap = INT32_MAX;
    int32_t *slot_of = malloc(d->rows * sizeof(int32_t));
    int64_t *ids = malloc(cap * sizeof(int64_t));
    if (!slot_of || !ids) {
        free(slot_of);
        free(ids);
        return -ENOMEM;
    }
    memset(slot_of, 0xFF, d->rows * sizeof(int32_t));
    uint64_t n = 0;
    for (size_t i = 0; i < cfg->n_hot && n < cap; i++) {
        int64_t id = cfg->hot_ids[i];
        if (id < 0 || (uint64_t)id >= d->rows) {
            fr_set_err(err, err_len, "store %s: hot_ids[%zu] = %lld is out of range [0, %llu)",
                       d->path, i, (long long)id, (unsigned long long)d->rows);
            free(slot_of);
            free(ids);
            return -ERANGE;
        }
        if (slot_of[id] >= 0)
            continue;
        slot_of[id] = (int32_t)n;
        ids[n++] = id;
    }
    d->tier_bytes = n * d->row_bytes;
    int rc = fr_gpu_mapped_alloc(d->gpu, d->tier_bytes, &d->tier_h, &d->tier_d);
    if (rc == 0)
        rc = fr_gpu_alloc(d->gpu, d->rows * sizeof(int32_t), &d->host_slot_d);
    if (rc == 0)
        rc = fr_gpu_copy_to_device(d->gpu, d->host_slot_d, slot_of, d->rows * sizeof(int32_t));
    if (rc)
        rc = gpu_err(d, rc, "setting up the hot-row host tier", err, err_len);
    else
        rc = fill(fill_arg, ids, n, d->tier_h, err, err_len);
    free(slot_of);
    free(ids);
    return rc;
}

/* The hot-row cache's slots (fastread_device.cuh, "Hot rows"), 0 for none.
 * $FASTREAD_GATHER_ADMIT: auto (default) or off. Auto: where row fetches
 * can happen (the proxy backend, FASTREAD_GATHER_FETCH not "pages", an
 * array larger than the cache and not all in the host tier, 2 rows a page
 * or more, pins on: the pass runs for fastread's own gathers only), a
 * quarter of cache_bytes in a power-of-two number of rows, when that
 * leaves the page cache 64 pages. */
/* Device bytes a hot-row slot costs besides its row: a tag (8), eight
 * sketch counters (32), half a candidate (8), a seen word (4). */
#define ROW_SLOT_META 52u

static int plan_row_cache(fr_gdev *d, const fr_store_config *cfg, const fr_gather_backend *be,
                          uint32_t *slots_out, char *err, size_t err_len)
{
    static const char *const modes[] = {"auto", "off"};
    int mode;
    *slots_out = 0;
    int rc = env_choice("FASTREAD_GATHER_ADMIT", modes, 2, &mode, err, err_len);
    if (rc || mode == 1)
        return rc;
    const char *fetch = getenv("FASTREAD_GATHER_FETCH");
    uint64_t data = d->rows * d->row_bytes;
    uint64_t budget = cfg->host_bytes == UINT64_MAX ? avail_ram() / 2 : cfg->host_bytes;
    if (!be->fetch_define || strcmp(be->fetch_define, "FR_FETCH_PROXY") != 0 ||
        (fetch && strcmp(fetch, "pages") == 0) || data <= cfg->cache_bytes ||
        (budget && data <= budget) || d->page_bytes / d->row_bytes < 2 ||
        d->npages > 0xFFFFFFFFull)
        return 0;
    /* A quarter of cache_bytes for the rows, and their metadata (52 bytes a
     * slot: see meta_bytes in fr_gdev_open) at most as much again: rows
     * smaller than that get fewer slots (16-byte rows with slots for a
     * quarter of 4 GiB would have added 3.3 GiB of metadata). */
    uint64_t per_slot = d->row_bytes > ROW_SLOT_META ? d->row_bytes : ROW_SLOT_META;
    uint64_t want = cfg->cache_bytes / 4 / per_slot, slots = 1;
    while (slots * 2 <= want && slots < (1ull << 30))
        slots *= 2;
    if (slots < 64 || (cfg->cache_bytes - slots * d->row_bytes) / d->page_bytes < 64)
        return 0;
    *slots_out = (uint32_t)slots;
    return 0;
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
        rc = gpu_err(d, rc, "device attributes", err, err_len);
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

    if ((rc = plan_row_cache(d, cfg, be, &d->row_slots, err, err_len))) {
        fr_gdev_close(d);
        return rc;
    }
    d->row_cache_bytes = (uint64_t)d->row_slots * d->row_bytes;
    /* One seen word a slot: few rows of one gather collide there, and one
     * that does is listed twice (the pass skips the second). */
    d->seen_words = d->row_slots > 64 ? d->row_slots : 64;
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
    d->meta_bytes = d->npages * 4 + slots * 24 + 4 + sizeof(fr_dev_result) + sizeof(fr_dev_store);
    /* Hot rows: per slot a tag (8), eight sketch counters (32: two rows of
     * four, so a miss stream as long as the cache seldom reads as repeats),
     * half a candidate (16 / 2), a seen word (4). */
    if (d->row_slots)
        d->meta_bytes += (uint64_t)d->row_slots * (ROW_SLOT_META - 4) + (uint64_t)d->seen_words * 4;
    size_t free_b = 0, total_b = 0;
    if ((rc = fr_gpu_mem_info(d->gpu, &free_b, &total_b))) {
        rc = gpu_err(d, rc, "cuMemGetInfo", err, err_len);
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
    if ((rc = fr_gpu_alloc(d->gpu, d->cache_bytes, &d->data_d)) ||
        (rc = fr_gpu_alloc(d->gpu, d->npages * 4, &d->pt_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 8, &d->tags_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 4, &d->refs_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 4, &d->clock_d)) ||
        (rc = fr_gpu_alloc(d->gpu, 4, &d->hand_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 8, &d->pins_d)) ||
        (rc = fr_gpu_alloc(d->gpu, sizeof(fr_dev_result), &d->result_d)) ||
        (rc = fr_gpu_alloc(d->gpu, sizeof(fr_dev_store), &d->view_d)) ||
        (d->row_slots &&
         ((rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 8, &d->rtags_d)) ||
          (rc = fr_gpu_alloc(d->gpu, d->row_cache_bytes, &d->rdata_d)) ||
          (rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 32, &d->sketch_d)) ||
          (rc = fr_gpu_alloc(d->gpu, (size_t)d->seen_words * 4, &d->seen_d)) ||
          (rc = fr_gpu_alloc(d->gpu, (size_t)d->row_slots * 8, &d->adm_d)) ||
          (rc = fr_gpu_memset8(d->gpu, d->sketch_d, 0, (size_t)d->row_slots * 32)) ||
          (rc = fr_gpu_memset8(d->gpu, d->seen_d, 0, (size_t)d->seen_words * 4)))) ||
        (rc = reset_cache(d))) {
        rc = gpu_err(d, rc, "allocating the device cache", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    if ((rc = fr_gpu_mapped_alloc(d->gpu, 4096, &d->abort_h, &d->abort_d))) {
        rc = gpu_err(d, rc, "the abort flag (mapped host memory)", err, err_len);
        fr_gdev_close(d);
        return rc;
    }
    memset(d->abort_h, 0, 4096);
    if ((rc = open_tier(d, cfg, fill, fill_arg, err, err_len))) {
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
    if ((rc = open_order(d, err, err_len)) || (rc = open_fetch(d, be, err, err_len))) {
        fr_gdev_close(d);
        return rc;
    }
    if (d->row_slots &&
        (rc = fr_gpu_module_function(d->gpu, d->module, "fr_rows_admit", &d->fn_admit))) {
        rc = gpu_err(d, rc, "the hot-row cache's kernel", err, err_len);
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
    v.cache.page_table = (uint32_t *)(uintptr_t)d->pt_d;
    v.cache.tags = (uint64_t *)(uintptr_t)d->tags_d;
    v.cache.refs = (uint32_t *)(uintptr_t)d->refs_d;
    v.cache.clock_bits = (uint32_t *)(uintptr_t)d->clock_d;
    v.cache.hand = (uint32_t *)(uintptr_t)d->hand_d;
    v.cache.data = (uint8_t *)(uintptr_t)d->data_d;
    v.cache.npages = d->npages;
    v.cache.nslots = d->nslots;
    v.cache.page_bytes = pb;
    /* Pins keep page numbers in 32 bits (fastread_device.cuh, "Pins"). */
    if (d->npages <= 0xFFFFFFFFull)
        v.cache.pins = (uint64_t *)(uintptr_t)d->pins_d;
    v.cache.epoch_now = (const uint32_t *)(uintptr_t)(d->result_d + offsetof(fr_dev_result, epoch));
    v.cache.pinned =
        (uint64_t *)(uintptr_t)(d->result_d + offsetof(fr_dev_result, counters[FR_CNT_PINNED]));
    v.cache.pin_limit = d->nslots / 2;
    v.host_rows = (const uint8_t *)(uintptr_t)d->tier_d;
    v.host_slot = (const int32_t *)(uintptr_t)d->host_slot_d;
    v.abort = (uint32_t *)(uintptr_t)d->abort_d;
    v.result = (fr_dev_result *)(uintptr_t)d->result_d;
    if (d->row_slots) {
        v.rowc.tags = (uint64_t *)(uintptr_t)d->rtags_d;
        v.rowc.data = (uint8_t *)(uintptr_t)d->rdata_d;
        v.rowc.sketch = (uint32_t *)(uintptr_t)d->sketch_d;
        v.rowc.seen = (uint32_t *)(uintptr_t)d->seen_d;
        v.rowc.adm = (uint64_t *)(uintptr_t)d->adm_d;
        v.rowc.adm_n = (uint64_t *)(uintptr_t)(d->result_d + offsetof(fr_dev_result, adm_n));
        v.rowc.adm_cap = d->row_slots / 2;
        v.rowc.slot_mask = d->row_slots - 1;
        v.rowc.width_mask = 4 * d->row_slots - 1;
        v.rowc.seen_mask = d->seen_words - 1;
        v.rowc.threshold = 2;
        d->rows_view = v.rowc;
    }
    be->fill_view(d->bstate, &v.fetch);
    if ((rc = fr_gpu_copy_to_device(d->gpu, d->view_d, &v, sizeof(v)))) {
        rc = gpu_err(d, rc, "copying the device view", err, err_len);
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
    res.fetch_rows = (uint32_t)choose_fetch(d, n);
    if ((rc = next_epoch(d, &res.epoch)))
        return gpu_err(d, rc, "clearing the cache's pins", err, err_len);
    if (d->timeline)
        t[1] = mono_us();
    if ((rc = fr_gpu_copy_to_device(d->gpu, d->result_d, &res, sizeof(res))))
        return gpu_err(d, rc, "resetting the result block", err, err_len);
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
    int launch_rc = order_ids(d, ids, id_bytes, n, res.fetch_rows, stream, &order);
    int ordered = launch_rc == 1;
    if (launch_rc > 0)
        launch_rc = 0;
    void *params[] = {&view, &ids, &id_bytes, &nn, &out, &order};
    if (launch_rc == 0)
        launch_rc = fr_gpu_launch(d->gpu, d->fn, grid, block, (fr_CUstream)stream, params);
    /* Hot rows: the admission pass on the same stream, so nothing of ours
     * reads the row cache while it changes (fastread_device.cuh, "Hot rows"). */
    if (launch_rc == 0 && d->row_slots) {
        unsigned age = (unsigned)d->age_pending;
        void *admit_params[] = {&view, &out, &age};
        launch_rc = fr_gpu_launch(d->gpu, d->fn_admit, d->sm_count * 4, 256, (fr_CUstream)stream,
                                  admit_params);
        if (launch_rc == 0)
            d->age_pending = 0;
    }
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
        int urc = unpin_all(d); /* users' kernels may evict what this gather pinned */
        if (urc && !launch_rc) {
            fr_gpu_last_error(d->gpu, launch_err, sizeof(launch_err));
            launch_rc = urc;
        }
    }
    if (failed && d->serving) {
        d->cache_reset_pending = 1; /* users' kernels may be using the cache */
    } else if (failed) {
        int rrc = reset_cache(d);
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
        /* TinyLFU's reset: the sketch halved after 10 x slots counts. */
        d->row_notes += res.counters[FR_CNT_DIRECT_ROWS];
        if (d->row_slots && d->row_notes >= 10ull * d->row_slots) {
            d->age_pending = 1;
            d->row_notes = 0;
        }
    }
    if (launch_rc) {
        fr_set_err(err, err_len, "store %s: the gather kernel failed: %s", d->path, launch_err);
        return launch_rc;
    }
    if (read_rc)
        return gpu_err(d, read_rc, "reading the gather's result", err, err_len);
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

/* Whether this gather of backend "auto" goes to the host path (1) or stays
 * on the device (0); why, in one line (gather_route.h). */
int fr_gdev_route(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, void *stream, char *why,
                  size_t why_len)
{
    fr_route_facts f;
    memset(&f, 0, sizeof(f));
    f.data_bytes = d->rows * d->row_bytes;
    f.cache_bytes = d->cache_bytes + d->row_cache_bytes;
    f.all_in_tier = d->tier_bytes && !d->host_slot_d;
    f.cached_asked = -1;
    /* Cheap facts first: no page sample where they decide. */
    if (f.data_bytes > f.cache_bytes && !f.all_in_tier) {
        unsigned asked = 0;
        f.resident_in = (int)fr_resident_sample(d->res_map, d->res_len, 16, &d->res_seed, &asked);
        f.resident_asked = (int)asked;
    }
    int r = fr_route_decide(&f, why, why_len);
    if (r != FR_ROUTE_NEED_SAMPLE) {
        if (r == FR_ROUTE_DEVICE) {
            int fetch = choose_fetch(d, n);
            size_t used = strlen(why);
            snprintf(why + used, why_len - used, "; %s",
                     fetch == 0 ? "absent pages loaded whole"
                                : "rows of absent pages read on their own (sparse batch)");
        }
        return r == FR_ROUTE_HOST;
    }
    /* Cold: are this batch's rows in HBM anyway? 32 of its ids, spread over
     * the batch, each against the hot-row cache, the page table and the
     * hot-row host tier: about a hundred small copies, under a millisecond
     * against a cold gather's tens or hundreds. The first waits for the
     * caller's stream (the ids may come from its kernels). A failed copy
     * counts as not cached. */
    int64_t sample[32];
    size_t k = n < 32 ? n : 32;
    f.cached_asked = 0;
    for (size_t i = 0; i < k; i++) {
        uint64_t at = ids + (uint64_t)(i * (n / k)) * (uint64_t)id_bytes;
        int32_t v32 = 0;
        void *dst = id_bytes == 4 ? (void *)&v32 : (void *)&sample[i];
        int crc = i == 0 ? fr_gpu_copy_dtoh_wait(d->gpu, dst, at, (size_t)id_bytes,
                                                 (fr_CUstream)stream)
                         : fr_gpu_copy_from_device(d->gpu, dst, at, (size_t)id_bytes);
        if (crc) {
            k = i;
            break;
        }
        if (id_bytes == 4)
            sample[i] = v32;
    }
    for (size_t i = 0; i < k; i++) {
        if (sample[i] < 0 || (uint64_t)sample[i] >= d->rows)
            continue; /* the gather reports it */
        uint64_t id = (uint64_t)sample[i];
        f.cached_asked++;
        int in = 0;
        if (d->row_slots) {
            uint64_t tags[FR_ROWS_WAYS];
            uint32_t set = fr_rows_set(&d->rows_view, id);
            if (fr_gpu_copy_from_device(d->gpu, tags, d->rtags_d + (uint64_t)set * 8,
                                        sizeof(tags)) == 0)
                for (unsigned w = 0; w < FR_ROWS_WAYS; w++)
                    in |= (tags[w] & ~FR_RTAG_REF) == id + 1;
        }
        if (!in) {
            uint32_t e = 0;
            uint64_t page = id / (d->page_bytes / d->row_bytes);
            if (fr_gpu_copy_from_device(d->gpu, &e, d->pt_d + page * 4, 4) == 0)
                in = e != 0 && e != FR_PT_LOADING;
        }
        if (!in && d->host_slot_d) {
            int32_t hs = -1;
            if (fr_gpu_copy_from_device(d->gpu, &hs, d->host_slot_d + id * 4, 4) == 0)
                in = hs >= 0;
        }
        f.cached_in += in;
    }
    return fr_route_decide(&f, why, why_len) == FR_ROUTE_HOST;
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
        int rc = unpin_all(d);
        if (rc)
            return gpu_err(d, rc, "moving the cache's pin epoch", err, err_len);
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
        int crc = reset_cache(d);
        if (crc && !rc)
            rc = gpu_err(d, crc, "resetting the cache", err, err_len);
    }
    if (rc && berr[0])
        fr_set_err(err, err_len, "store %s: backend %s: %s", d->path, d->be->name, berr);
    return rc;
}

uint64_t fr_gdev_view(const fr_gdev *d) { return d->view_d; }
const char *fr_gdev_kernel_source(const fr_gdev *d) { return d->kernel_source; }
