/*
 * xnvme-cuda: fr_store's GPU-initiated backend (gather_backend.h) over
 * upstream xNVMe's GPU-resident NVMe queues (libxnvme_cuda.h, upcie-cuda).
 *
 * Host half (gather_xnvme_cuda.c, the fr_gather_backend ops): opens the NVMe
 * controller by PCI address with xNVMe's upcie-cuda backend, checks the
 * store's layout against the namespace (pages on logical-block
 * boundaries), allocates one bounce page per queue in xNVMe's P2P GPU heap
 * with its bus addresses and PRP list written once, creates the GPU queues
 * and fills the backend's words of the device view. Device half
 * (device/fastread_xnvme_cuda.cuh, FR_FETCH_EXTERN): a loader thread takes
 * a queue, builds and submits its page's NVMe reads, reaps them within the
 * store's deadline and copies the page into the cache slot.
 *
 * Where fastread was built without xNVMe's GPU queues the backend is absent
 * (gather_backend.h declares it only with FASTREAD_HAVE_XNVME_CUDA) and
 * fr_xc_probe says why; the URI and layout checks work everywhere.
 *
 * CUDA contexts: xNVMe's upcie-cuda creates its own CUDA context
 * (cuCtxCreate, not the device's primary context) and allocates its heap
 * and queues in it; so does this backend for its tables. A kernel that
 * uses the view must run in fr_xc_context(state) (see the report / docs:
 * the gather core launches in the primary context today).
 */
#ifndef FASTREAD_GATHER_XNVME_CUDA_H
#define FASTREAD_GATHER_XNVME_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gather/xnvme_cuda_map.h"

struct fr_backend_env;

/* engine_args of backend xnvme-cuda ("key=value,..."): nsid (namespace,
 * default 1, or N of /dev/nvmeXnN), queues (GPU queue pairs, default 32:
 * loaders reading at once). Other keys belong to the store's host engine
 * (one engine_args string serves both) and are left alone. */
typedef struct fr_xc_args {
    uint32_t nsid;
    unsigned queues;
} fr_xc_args;
int fr_xc_parse_args(const char *args, fr_xc_args *a, char *err, size_t err_len);

/* 0 if this build has xnvme-cuda and the loaded libxnvme has the
 * upcie-cuda backend; else -ENOTSUP and why. */
int fr_xc_probe(char *why, size_t why_len);

/* Turns a URI into the controller's PCI address (pci: >= 13 bytes) and
 * checks in sysfs (NULL: "/sys") that it is an NVMe controller upcie-cuda
 * can drive. 0, or -ENODEV (no such usable device) / -EINVAL (not a URI
 * this backend understands) with a message naming the device and the
 * backend. *nsid is set from a /dev/nvmeXnY path. */
int fr_xc_resolve(const char *sysfs, const char *uri, char *pci, size_t pci_len, uint32_t *nsid,
                  char *err, size_t err_len);

/* The backend's open with sysfs looked up under `sysfs` (tests). */
int fr_xc_open_at(const struct fr_backend_env *env, const char *sysfs, void **state, char *err,
                  size_t err_len);

/* The device half as NVRTC compiles it after fastread_device.cuh (with
 * -DFR_FETCH_EXTERN), made at build time from the system's xNVMe headers;
 * NULL where the backend is not built. */
const char *fr_xc_device_source(void);

/* The CUcontext (as void *) owning the queues and the view's tables. */
void *fr_xc_context(void *state);

#endif
