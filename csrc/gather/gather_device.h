/*
 * The device path of fr_store (gather.h): the HBM page cache, the
 * page-locked host tier, the hot-row cache, the gather kernel and its
 * launch, with a backend (gather_backend.h) serving the cache's misses
 * (its sources: gather_device_internal.h). Internal to gather.c, which
 * serialises gathers (one at a time per store); fr_gdev_cancel may be
 * called from any thread at any time.
 */
#ifndef FASTREAD_GATHER_DEVICE_H
#define FASTREAD_GATHER_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "fastread_gather.h"
#include "gather/gather_backend.h"

typedef struct fr_gdev fr_gdev;

/* Fills `out` with rows ids[0..n) (host memory) for the hot-row host tier. */
typedef int (*fr_gdev_fill_fn)(void *arg, const int64_t *ids, size_t n, void *out, char *err,
                               size_t err_len);

/* cfg: the store's (validated) config; env: what the backend gets. */
int fr_gdev_open(const fr_store_config *cfg, const fr_backend_env *env,
                 const fr_gather_backend *backend, fr_gdev_fill_fn fill, void *fill_arg,
                 fr_gdev **out, char *err, size_t err_len);
void fr_gdev_close(fr_gdev *d);
/* One gather; adds what it did to *delta (even on failure). */
int fr_gdev_gather(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, uint64_t out, void *stream,
                   size_t *bad_index, fr_store_stats *delta, char *err, size_t err_len);
/* Any thread: makes a gather in flight end with -ECANCELED, now and for good. */
void fr_gdev_cancel(fr_gdev *d);
void fr_gdev_memory(fr_gdev *d, fr_store_memory *add);
/* Whether ids and out are device memory of the store's GPU: 0, or -EINVAL
 * with a message naming which is not (asked before a gather is routed, so
 * the host path never copies from or writes to a wrong pointer). */
int fr_gdev_check_pointers(fr_gdev *d, uint64_t ids, uint64_t out, char *err, size_t err_len);
/* Backend "auto": 1 when this gather should run on the host path, 0 on the
 * device; why in one line (gather_route.h). Waits for `stream` when it has
 * to look at the ids. */
int fr_gdev_route(fr_gdev *d, uint64_t ids, int id_bytes, size_t n, void *stream, char *why,
                  size_t why_len);
/* Users' kernels: on opens a serving session (the backend serves misses),
 * off closes one; sessions nest with gathers. Closing the last one resets
 * the backend's rings (a user kernel's wait may have given up) and, if a
 * gather failed meanwhile, the cache. */
int fr_gdev_serve(fr_gdev *d, int on, char *err, size_t err_len);
uint64_t fr_gdev_view(const fr_gdev *d);
const char *fr_gdev_kernel_source(const fr_gdev *d); /* where the kernel came from */

#endif
