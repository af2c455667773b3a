/*
 * The device path's page-locked host tier (gather_device_internal.h): host
 * memory mapped for the GPU, read over PCIe by the kernel before the HBM
 * cache is asked. The whole array when it fits host_bytes (read at open in
 * large sequential reads), else the config's hot rows (first come first
 * served up to the budget) with a 4-byte row -> slot map in device memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gather/gather_device_internal.h"

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

uint64_t gdev_avail_ram(void)
{
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

/* The host tier: the whole array when it fits the budget, else hot rows. */
int gdev_tier_open(fr_gdev *d, const fr_store_config *cfg, fr_gdev_fill_fn fill, void *fill_arg,
                   char *err, size_t err_len)
{
    uint64_t data = d->rows * d->row_bytes;
    uint64_t budget = cfg->host_bytes;
    if (budget == UINT64_MAX) /* auto: at most half the memory free now */
        budget = gdev_avail_ram() / 2;
    if (budget == 0)
        return 0;
    if (data <= budget) {
        d->tier_bytes = data;
        int rc = fr_gpu_mapped_alloc(d->gpu, data, &d->tier_h, &d->tier_d);
        if (rc)
            return gdev_gpu_err(d, rc, "page-locking the host tier", err, err_len);
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
        rc = gdev_gpu_err(d, rc, "setting up the hot-row host tier", err, err_len);
    else
        rc = fill(fill_arg, ids, n, d->tier_h, err, err_len);
    free(slot_of);
    free(ids);
    return rc;
}
