/*
 * Where a gather of backend "auto" runs (issue 31, item 1): the device
 * path (the HBM caches, row fetches or page loads through the proxy) or
 * the host path (backend "host": ids sorted, nearby rows merged into range
 * reads, one copy to the GPU). A pure function of what the store knows
 * before the gather, so that the rule is tested on its own
 * (csrc/tests/test_gather_cache.c) and said the same way in docs/gathers.md
 * and in stats()["route"].
 *
 * Measured on the 2xH200 machine, 16M x 512 B rows (8 GiB), 1 GiB cache:
 * with the page cache dropped, the host path read 0.214M rows/s for 1M ids
 * (page loads through the proxy: 0.112M; memmap 0.142M) and 0.097M for
 * 100k ids (row fetches: 0.084M; memmap 0.016M). Warm, the device path's
 * row fetches copy from the page cache at 42-47M rows/s, far past the host
 * path. So: the host path where the array is larger than the HBM cache, is
 * not all in the host tier, the page cache holds little of it (a mincore
 * sample) and the HBM caches hold little of this batch (a sample of its
 * ids); else the device path.
 */
#ifndef FASTREAD_GATHER_ROUTE_H
#define FASTREAD_GATHER_ROUTE_H

#include <stdint.h>
#include <stdio.h>

typedef struct fr_route_facts {
    uint64_t data_bytes;  /* rows * row_bytes */
    uint64_t cache_bytes; /* the HBM caches (pages and rows) */
    int all_in_tier;      /* the host tier holds every row */
    int resident_asked;   /* pages sampled with mincore (0: unknown, counts as warm) */
    int resident_in;      /* of those, held by the page cache */
    int cached_asked;     /* ids of this batch sampled against the HBM caches (-1: not yet) */
    int cached_in;        /* of those, in the row cache, the page cache or the host tier */
} fr_route_facts;

#define FR_ROUTE_RULE                                                                        \
    "backend 'auto' gathers on the host (backend 'host' path) when the array is larger "  \
    "than the HBM cache, not all in the host tier, under half of a mincore sample of its " \
    "pages is in the page cache (cold), and under half of a sample of the batch's ids "     \
    "are in the HBM caches; else on the device"

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
        snprintf(why, why_len,
                 "device: cold, but %d of %d sampled ids are in the HBM caches",
                 f->cached_in, f->cached_asked);
        return FR_ROUTE_DEVICE;
    }
    snprintf(why, why_len,
             "host: cold (%d of %d sampled pages in the page cache), array %llu bytes > HBM "
             "cache %llu, %d of %d sampled ids in HBM",
             f->resident_in, f->resident_asked, (unsigned long long)f->data_bytes,
             (unsigned long long)f->cache_bytes, f->cached_in, f->cached_asked);
    return FR_ROUTE_HOST;
}

#endif
