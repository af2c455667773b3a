/*
 * Where a gather of backend "auto" runs (issue 31, item 1): the device path
 * (HBM caches; row fetches or page loads through the proxy) or the host
 * path (backend "host": ids sorted, nearby rows merged into range reads,
 * one copy to the GPU). A pure function of what the store knows before the
 * gather, so the rule is tested on its own (csrc/tests/test_gather_device.c)
 * and said the same way in docs/gathers.md and stats()["route_rule"].
 *
 * Measured (2xH200 and H100 machines, virtio disks, 16M x 512 B rows = 8 GiB,
 * 1 GiB cache, page cache dropped): the host path read 1M ids at
 * 0.21-0.27M rows/s against 0.11M for page loads through the proxy, and
 * 100k ids at 0.10-0.12M against 0.08M for row fetches, so the host path
 * wins cold batches at both densities. Warm (the file in the page cache),
 * the device path's row fetches copy from a mapping at 42-47M rows/s, far
 * past the host path; an array the cache holds whole is loaded by pages,
 * which later gathers hit. Hence: the host path when the array is larger
 * than the HBM cache, is not all in the host tier, under half of a mincore
 * sample of its pages is in the page cache, and under half of a sample of
 * the batch's ids is in HBM (hot-row cache or page cache) or the host tier;
 * else the device path, where the fetch mode follows the batch's density
 * (gdev_choose_fetch in gather_device_policy.c).
 */
#ifndef FASTREAD_GATHER_ROUTE_H
#define FASTREAD_GATHER_ROUTE_H

#include <stdint.h>
#include <stdio.h>

typedef struct fr_route_facts {
    uint64_t data_bytes;  /* rows * row_bytes */
    uint64_t cache_bytes; /* the HBM caches (pages and hot rows) */
    int all_in_tier;      /* the host tier holds every row */
    int resident_asked;   /* pages sampled with mincore (0: unknown, counts as warm) */
    int resident_in;      /* of those, held by the page cache */
    int cached_asked;     /* ids of the batch sampled against HBM and the host tier (-1: not yet) */
    int cached_in;        /* of those, found there */
} fr_route_facts;

#define FR_ROUTE_RULE                                                                          \
    "backend 'auto' runs a gather on the host (the 'host' backend's sorted range reads, one " \
    "copy to the GPU) when the array is larger than the HBM cache, not all in the host "      \
    "tier, under half of a mincore sample of its pages is in the page cache (cold), and "     \
    "under half of a sample of the batch's ids is in HBM or the host tier; else on the "       \
    "device, where rows of absent pages are read on their own when the batch is sparse "      \
    "(under a quarter of a page's rows per touched page, and warm) and pages are loaded "     \
    "otherwise"

enum { FR_ROUTE_DEVICE = 0, FR_ROUTE_HOST = 1, FR_ROUTE_NEED_SAMPLE = 2 };

/* FR_ROUTE_DEVICE or FR_ROUTE_HOST, with why (one line); FR_ROUTE_NEED_SAMPLE
 * when only the batch's sample can decide (cached_asked < 0). */
static inline int fr_route_decide(const fr_route_facts *f, char *why, size_t why_len)
{
    if (f->data_bytes <= f->cache_bytes) {
        snprintf(why, why_len, "device: the array (%llu bytes) fits the HBM cache (%llu)",
                 (unsigned long long)f->data_bytes, (unsigned long long)f->cache_bytes);
        return FR_ROUTE_DEVICE;
    }
    if (f->all_in_tier) {
        snprintf(why, why_len, "device: every row is in the host tier");
        return FR_ROUTE_DEVICE;
    }
    if (f->resident_asked <= 0) {
        snprintf(why, why_len, "device: page-cache residency unknown (no mapping of the file)");
        return FR_ROUTE_DEVICE;
    }
    if (2 * f->resident_in >= f->resident_asked) {
        snprintf(why, why_len, "device: warm (%d of %d sampled pages in the page cache)",
                 f->resident_in, f->resident_asked);
        return FR_ROUTE_DEVICE;
    }
    if (f->cached_asked < 0)
        return FR_ROUTE_NEED_SAMPLE;
    if (f->cached_asked > 0 && 2 * f->cached_in >= f->cached_asked) {
        snprintf(why, why_len, "device: cold, but %d of %d sampled ids are in HBM or the host tier",
                 f->cached_in, f->cached_asked);
        return FR_ROUTE_DEVICE;
    }
    snprintf(why, why_len,
             "host: cold (%d of %d sampled pages in the page cache), array %llu bytes > HBM "
             "cache %llu, %d of %d sampled ids in HBM or the host tier",
             f->resident_in, f->resident_asked, (unsigned long long)f->data_bytes,
             (unsigned long long)f->cache_bytes, f->cached_in, f->cached_asked);
    return FR_ROUTE_HOST;
}

#endif
