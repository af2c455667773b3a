/*
 * The device path's HBM page cache (gather_device_internal.h): the arrays
 * fastread_device.cuh's cache works on, allocated at open and bounded by
 * the config (cache pages: nslots * page_bytes; page table: 4 bytes per
 * page of the array; per slot: tag 8, refs 4, clock bit 4, pin 8), their
 * reset after a failed gather, and the pin epochs (fastread_device.cuh,
 * "Pins").
 */
#include <stddef.h>
#include <string.h>

#include "gather/gather_device_internal.h"

int gdev_cache_alloc(fr_gdev *d)
{
    uint64_t slots = d->nslots;
    int rc;
    if ((rc = fr_gpu_alloc(d->gpu, d->cache_bytes, &d->data_d)) ||
        (rc = fr_gpu_alloc(d->gpu, d->npages * 4, &d->pt_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 8, &d->tags_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 4, &d->refs_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 4, &d->clock_d)) ||
        (rc = fr_gpu_alloc(d->gpu, 4, &d->hand_d)) ||
        (rc = fr_gpu_alloc(d->gpu, slots * 8, &d->pins_d)))
        return rc;
    return 0;
}

/* Page table empty, every slot free: the state at open and after a failure. */
int gdev_cache_reset(fr_gdev *d)
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
    return rc;
}

/* The pin epoch for the next gather. Epochs only grow; before the 32-bit
 * word would wrap, every pin is cleared (no gather of ours runs now, and
 * users' kernels never rely on pins) and counting starts again. */
int gdev_next_epoch(fr_gdev *d, uint32_t *epoch)
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
int gdev_unpin_all(fr_gdev *d)
{
    uint32_t e;
    int rc = gdev_next_epoch(d, &e);
    if (rc == 0)
        rc = fr_gpu_copy_to_device(d->gpu, d->result_d + offsetof(fr_dev_result, epoch), &e,
                                   sizeof(e));
    return rc;
}

/* The cache's part of the view the kernel reads: device addresses. */
void gdev_cache_view(const fr_gdev *d, fr_dev_store *v)
{
    v->cache.page_table = (uint32_t *)(uintptr_t)d->pt_d;
    v->cache.tags = (uint64_t *)(uintptr_t)d->tags_d;
    v->cache.refs = (uint32_t *)(uintptr_t)d->refs_d;
    v->cache.clock_bits = (uint32_t *)(uintptr_t)d->clock_d;
    v->cache.hand = (uint32_t *)(uintptr_t)d->hand_d;
    v->cache.data = (uint8_t *)(uintptr_t)d->data_d;
    v->cache.npages = d->npages;
    v->cache.nslots = d->nslots;
    v->cache.page_bytes = d->page_bytes;
    /* Pins keep page numbers in 32 bits (fastread_device.cuh, "Pins"). */
    if (d->npages <= 0xFFFFFFFFull)
        v->cache.pins = (uint64_t *)(uintptr_t)d->pins_d;
    v->cache.epoch_now =
        (const uint32_t *)(uintptr_t)(d->result_d + offsetof(fr_dev_result, epoch));
    v->cache.pinned =
        (uint64_t *)(uintptr_t)(d->result_d + offsetof(fr_dev_result, counters[FR_CNT_PINNED]));
    v->cache.pin_limit = d->nslots / 2;
}
