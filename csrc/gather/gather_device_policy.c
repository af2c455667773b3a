/*
 * How each gather of the device path runs (gather_device_internal.h):
 * rows of absent pages read on their own or their pages loaded
 * (gdev_choose_fetch), the ids put in locality order first or not
 * (gdev_order_ids), and, for backend "auto", whether the gather runs on the
 * device at all (fr_gdev_route, with the rule in gather_route.h). The
 * choices read a residency sample of the array (mincore on a mapping that
 * is never touched) and the settings from the environment.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gather/gather_device_internal.h"
#include "gather/gather_route.h"

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

int gdev_env_choice(const char *name, const char *const *names, int n, int *out, char *err,
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
    int rc = gdev_env_choice("FASTREAD_GATHER_ORDER", modes, 3, &mode, err, err_len);
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
        return gdev_gpu_err(d, rc, "the locality-order kernels", err, err_len);
    return 0;
}

/* $FASTREAD_GATHER_FETCH: auto (default; see gdev_choose_fetch), pages, rows. */
static int open_fetch(fr_gdev *d, const fr_gather_backend *be, char *err, size_t err_len)
{
    static const char *const modes[] = {"auto", "pages", "rows"};
    d->can_fetch_rows = be->fetch_define && strcmp(be->fetch_define, "FR_FETCH_PROXY") == 0;
    int rc = gdev_env_choice("FASTREAD_GATHER_FETCH", modes, 3, &d->fetch_mode, err, err_len);
    if (rc)
        return rc;
    /* For the residency sample (gdev_choose_fetch, and backend "auto"'s route:
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

int gdev_policy_open(fr_gdev *d, const fr_gather_backend *be, char *err, size_t err_len)
{
    int rc = open_order(d, err, err_len);
    return rc ? rc : open_fetch(d, be, err, err_len);
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
int gdev_choose_fetch(fr_gdev *d, size_t n)
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

int gdev_order_ids(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, uint32_t fetch_rows,
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
            int fetch = gdev_choose_fetch(d, n);
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
        int in = gdev_rows_holds(d, id);
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
