/*
 * xnvme-cuda host half: see gather_xnvme_cuda.h.
 *
 * Linked against the system's libxnvme (found by pkg-config, with
 * libxnvme_cuda.h: cmake/xnvme_cuda.cmake). fastread itself still never
 * links CUDA: the few driver calls made here (context switch, small
 * allocations and copies) go through a table dlsym'ed per backend instance,
 * as gpu.c does. A libxnvme built with CUDA links libcuda itself, though, so
 * with such an xNVMe the CUDA driver is a load-time dependency of fastread.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base.h"
#include "gather/gather_xnvme_cuda.h"

#ifdef FASTREAD_HAVE_XNVME_CUDA
#include <dlfcn.h>
#include <libxnvme.h>
#include <stdatomic.h>

#include "gather/gather_backend.h"
#include "gpu/gpu.h"
#endif

static int parse_u32(const char *v, size_t n, unsigned long max, unsigned long *out)
{
    if (n == 0 || n > 10)
        return -1;
    unsigned long x = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)v[i]))
            return -1;
        x = x * 10 + (unsigned long)(v[i] - '0');
    }
    if (x > max)
        return -1;
    *out = x;
    return 0;
}


int fr_xc_parse_args(const char *s, fr_xc_args *a, char *err, size_t err_len)
{
    memset(a, 0, sizeof(*a));
    while (s && *s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        if (len == 0) {
            s = end ? end + 1 : s + len;
            continue;
        }
        if (!eq) {
            fr_set_err(err, err_len, "xnvme-cuda: engine_args entry '%.*s' is not key=value",
                   (int)len, s);
            return -EINVAL;
        }
        size_t klen = (size_t)(eq - s), vlen = len - klen - 1;
        const char *v = eq + 1;
        unsigned long x = 0;
        int bad;
        if (klen == 4 && memcmp(s, "nsid", 4) == 0) {
            bad = parse_u32(v, vlen, 0xFFFFFFFEul, &x) || x == 0;
            a->nsid = (uint32_t)x;
        } else if (klen == 6 && memcmp(s, "queues", 6) == 0) {
            bad = parse_u32(v, vlen, 1024, &x) || x == 0;
            a->queues = (unsigned)x;
        } else {
            bad = 0; /* the host engine's key (the store shares one engine_args) */
        }
        if (bad) {
            fr_set_err(err, err_len, "xnvme-cuda: bad value for '%.*s': '%.*s' (nsid >= 1, queues "
                   "1..1024)", (int)klen, s, (int)vlen, v);
            return -EINVAL;
        }
        s = end ? end + 1 : s + len;
    }
    return 0;
}

/* ------------------------------------------------------- URI -> controller */

/* Reads a sysfs attribute into buf (trailing newline cut). 0 or -errno. */
static int read_attr(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    size_t n = fread(buf, 1, len - 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return -EIO;
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = 0;
    return 0;
}

/* Basename of the symlink at path, or "" if it is not one. */
static void link_name(const char *path, char *out, size_t len)
{
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    out[0] = 0;
    if (n <= 0)
        return;
    target[n] = 0;
    const char *b = strrchr(target, '/');
    const char *name = b ? b + 1 : target;
    size_t k = strlen(name);
    if (k >= len)
        k = len - 1; /* cut: compared with short driver names only */
    memcpy(out, name, k);
    out[k] = 0;
}

/* "[dddd:]bb:dd.f" (hex) -> "dddd:bb:dd.f". */
static int parse_pci(const char *s, char *out, size_t len)
{
    unsigned dom = 0, bus, devn, fn;
    int used = 0;
    if (sscanf(s, "%4x:%2x:%2x.%1x%n", &dom, &bus, &devn, &fn, &used) == 4 && s[used] == 0 &&
        used == 12)
        ;
    else if (dom = 0, used = 0,
             sscanf(s, "%2x:%2x.%1x%n", &bus, &devn, &fn, &used) == 3 && s[used] == 0 && used == 7)
        ;
    else
        return -1;
    if (devn > 0x1f || fn > 7)
        return -1;
    snprintf(out, len, "%04x:%02x:%02x.%x", dom, bus, devn, fn);
    return 0;
}

int fr_xc_resolve(const char *sysfs, const char *uri, char *pci, size_t pci_len, uint32_t *nsid,
                  char *err, size_t err_len)
{
    char path[PATH_MAX], buf[64];
    if (!sysfs)
        sysfs = "/sys";
    if (!uri || !*uri) {
        fr_set_err(err, err_len, "xnvme-cuda: no device given (a PCI address such as 0000:01:00.0 "
               "of an NVMe controller bound to uio_pci_generic)");
        return -EINVAL;
    }
    if (strncmp(uri, "/dev/", 5) == 0) {
        /* A namespace the kernel exposes: its controller belongs to the
         * kernel's nvme driver, and upcie-cuda must own the controller. Say
         * which PCI function to rebind instead of failing inside xNVMe. */
        unsigned ctrl = 0, ns = 0;
        int used = 0;
        const char *b = uri + 5;
        if (!((sscanf(b, "nvme%un%u%n", &ctrl, &ns, &used) == 2 ||
               sscanf(b, "ng%un%u%n", &ctrl, &ns, &used) == 2) && b[used] == 0)) {
            fr_set_err(err, err_len, "xnvme-cuda: '%s' is not an NVMe namespace (/dev/nvmeXnY) nor "
                   "a PCI address: the upcie-cuda backend drives an NVMe controller by its "
                   "PCI address", uri);
            return -EINVAL;
        }
        *nsid = ns;
        struct stat st;
        if (stat(uri, &st) != 0) {
            fr_set_err(err, err_len, "xnvme-cuda: %s: no such NVMe namespace on this machine "
                   "(upcie-cuda needs an NVMe controller with P2P to the GPU, bound to "
                   "uio_pci_generic, given by its PCI address)", uri);
            return -ENODEV;
        }
        char addr[64];
        snprintf(path, sizeof(path), "%s/class/nvme/nvme%u/device", sysfs, ctrl);
        link_name(path, addr, sizeof(addr));
        if (parse_pci(addr, pci, pci_len) != 0) {
            fr_set_err(err, err_len, "xnvme-cuda: %s belongs to controller nvme%u, which is not a "
                   "PCIe function (NVMe over fabrics?): upcie-cuda drives local PCIe "
                   "controllers only", uri, ctrl);
            return -ENODEV;
        }
        fr_set_err(err, err_len, "xnvme-cuda: %s is served by the kernel's nvme driver (controller "
               "nvme%u, PCI %s); the upcie-cuda backend drives the controller from user space: "
               "unbind it, bind %s to uio_pci_generic (xNVMe's xnvme-driver does this) and open "
               "\"%s\" with nsid=%u", uri, ctrl, pci, pci, pci, ns);
        return -ENODEV;
    }
    if (parse_pci(uri, pci, pci_len) != 0) {
        fr_set_err(err, err_len, "xnvme-cuda: '%s' is neither a PCI address (0000:01:00.0) nor an "
               "NVMe namespace path (/dev/nvme0n1)", uri);
        return -EINVAL;
    }
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s", sysfs, pci);
    struct stat st;
    if (stat(path, &st) != 0) {
        fr_set_err(err, err_len, "xnvme-cuda: no PCI device %s on this machine: the upcie-cuda "
               "backend needs an NVMe controller there, bound to uio_pci_generic, with P2P DMA "
               "to the GPU", pci);
        return -ENODEV;
    }
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/class", sysfs, pci);
    unsigned long cls = 0;
    if (read_attr(path, buf, sizeof(buf)) != 0 || sscanf(buf, "%lx", &cls) != 1) {
        fr_set_err(err, err_len, "xnvme-cuda: cannot read the class of PCI device %s (%s)", pci,
               path);
        return -ENODEV;
    }
    if ((cls >> 8) != 0x0108) {
        fr_set_err(err, err_len, "xnvme-cuda: PCI device %s is not an NVMe controller (class "
               "0x%06lx, NVMe is 0x0108xx): nothing for the upcie-cuda backend to drive", pci,
               cls);
        return -ENODEV;
    }
    char drv[64];
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/driver", sysfs, pci);
    link_name(path, drv, sizeof(drv));
    if (strcmp(drv, "uio_pci_generic") != 0) {
        fr_set_err(err, err_len, "xnvme-cuda: NVMe controller %s is %s%s; the upcie-cuda backend "
               "needs it bound to uio_pci_generic (vfio-pci is not supported for its P2P DMA)",
               pci, drv[0] ? "bound to " : "bound to no driver", drv);
        return -ENODEV;
    }
    return 0;
}

#ifndef FASTREAD_HAVE_XNVME_CUDA

/* ---------------------------------------------- built without xNVMe CUDA */

int fr_xc_probe(char *why, size_t why_len)
{
    fr_set_err(why, why_len,
           "xnvme-cuda: fastread was built without xNVMe's GPU queues (libxnvme_cuda.h was not "
           "found through pkg-config's xnvme include directories at build time, or "
           "FASTREAD_XNVME_CUDA=OFF); build xNVMe main with -Dwith-cuda=enabled and reinstall "
           "fastread");
    return -ENOTSUP;
}

int fr_xc_open_at(const struct fr_backend_env *env, const char *sysfs, void **state, char *err,
                  size_t err_len)
{
    (void)env, (void)sysfs;
    *state = NULL;
    return fr_xc_probe(err, err_len);
}

const char *fr_xc_device_source(void) { return NULL; }
void *fr_xc_context(void *state) { (void)state; return NULL; }

#else /* FASTREAD_HAVE_XNVME_CUDA */

#ifndef FASTREAD_XNVME_BUILD_VERSION
#define FASTREAD_XNVME_BUILD_VERSION "unknown"
#endif

/* Made at build time by cmake/xnvme_cuda_source.cmake. */
extern const char fr_xc_device_source_text[];

const char *fr_xc_device_source(void) { return fr_xc_device_source_text; }

/* ---- the CUDA driver calls used here (cuda.h's stable C ABI) ---- */
typedef int CUres;
typedef void *CUctx;
typedef struct xc_cuda {
    void *lib;
    CUres (*cuInit)(unsigned);
    CUres (*cuGetErrorString)(CUres, const char **);
    CUres (*cuCtxGetCurrent)(CUctx *);
    CUres (*cuCtxPushCurrent)(CUctx);
    CUres (*cuCtxPopCurrent)(CUctx *);
    CUres (*cuPointerGetAttribute)(void *, int, uint64_t);
    CUres (*cuMemAlloc)(uint64_t *, size_t);
    CUres (*cuMemFree)(uint64_t);
    CUres (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
    CUres (*cuMemcpyDtoH)(void *, uint64_t, size_t);
    CUres (*cuMemsetD8)(uint64_t, unsigned char, size_t);
} xc_cuda;
#define CU_POINTER_ATTRIBUTE_CONTEXT 1

#define DEFAULT_QUEUES 32u

typedef struct xc {
    char pci[16];
    uint32_t nsid;
    char what[64]; /* "<pci> nsid <n>": names the device in every message */
    struct xnvme_dev *dev;
    xc_cuda cu;
    CUctx ctx;              /* xNVMe's context: heap, queues, our tables */
    int ctx_pushed;
    fr_xc_fetch f;          /* what fill_view hands the device */
    unsigned nq, qdepth;
    struct xnvme_cuda_queue **queues; /* host array of device pointers */
    void *bounce;           /* xnvme_buf_alloc'ed: nq * page_bytes */
    void *prp_raw;          /* xnvme_buf_alloc'ed PRP lists (+ alignment slack) */
    uint64_t d_queues, d_locks, d_iova, d_prp, d_counters;
    uint64_t seen[FR_XC_NCNT]; /* device counters already reported */
    atomic_int cancelled;
} xc;

static const char *cu_str(const xc *x, CUres r)
{
    const char *s = NULL;
    if (x->cu.cuGetErrorString && x->cu.cuGetErrorString(r, &s) == 0 && s)
        return s;
    return "unknown CUDA error";
}

static int load_cuda(xc_cuda *cu, const char *what, char *err, size_t err_len)
{
    cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu->lib) {
        fr_set_err(err, err_len, "xnvme-cuda: no GPU for %s: the CUDA driver (libcuda.so.1) cannot "
               "be loaded: %s", what, dlerror());
        return -ENODEV;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
#define S(field, name) {name, (void **)&cu->field}
        S(cuInit, "cuInit"), S(cuGetErrorString, "cuGetErrorString"),
        S(cuCtxGetCurrent, "cuCtxGetCurrent"), S(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
        S(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
        S(cuPointerGetAttribute, "cuPointerGetAttribute"), S(cuMemAlloc, "cuMemAlloc_v2"),
        S(cuMemFree, "cuMemFree_v2"), S(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
        S(cuMemcpyDtoH, "cuMemcpyDtoH_v2"), S(cuMemsetD8, "cuMemsetD8_v2"),
#undef S
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].slot = dlsym(cu->lib, syms[i].name);
        if (!*syms[i].slot) {
            fr_set_err(err, err_len, "xnvme-cuda: no usable GPU for %s: the CUDA driver has no %s "
                   "(too old, or a stub?)", what, syms[i].name);
            return -ENOSYS;
        }
    }
    return 0;
}

/* The loaded libxnvme must have been built with CUDA: the header is
 * installed either way, but queue creation then returns -ENOSYS. Its
 * backend list says so before any device is touched. */
static int have_upcie_cuda(void)
{
    for (int i = 0;; i++) {
        const struct xnvme_be_attr *a = xnvme_be_attr_get(i);
        if (!a)
            return 0;
        if (a->name && strcmp(a->name, "upcie-cuda") == 0)
            return 1;
    }
}

int fr_xc_probe(char *why, size_t why_len)
{
    int major = xnvme_ver_major(), minor = xnvme_ver_minor(), patch = xnvme_ver_patch();
    char built[16];
    snprintf(built, sizeof(built), "%d.%d.", major, minor);
    if (strncmp(FASTREAD_XNVME_BUILD_VERSION, built, strlen(built)) != 0) {
        fr_set_err(why, why_len, "xnvme-cuda: built against xNVMe %s but libxnvme %d.%d.%d is "
               "loaded (reinstall fastread against this xNVMe)", FASTREAD_XNVME_BUILD_VERSION,
               major, minor, patch);
        return -ENOTSUP;
    }
    if (!have_upcie_cuda()) {
        fr_set_err(why, why_len, "xnvme-cuda: the loaded libxnvme %d.%d.%d has no upcie-cuda "
               "backend (built without CUDA: rebuild xNVMe with -Dwith-cuda=enabled)", major,
               minor, patch);
        return -ENOTSUP;
    }
    fr_set_err(why, why_len, "xNVMe %d.%d.%d with upcie-cuda (built against %s)", major, minor,
           patch, FASTREAD_XNVME_BUILD_VERSION);
    return 0;
}

static void pop_ctx(xc *x)
{
    if (x->ctx_pushed) {
        CUctx c;
        CUres r = x->cu.cuCtxPopCurrent(&c);
        (void)r; /* fails only without a current context: nothing to restore then */
        x->ctx_pushed = 0;
    }
}

static int push_ctx(xc *x, char *err, size_t err_len)
{
    CUres r = x->cu.cuCtxPushCurrent(x->ctx);
    if (r) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: cuCtxPushCurrent (xNVMe's CUDA context): %s",
               x->what, cu_str(x, r));
        return -EIO;
    }
    x->ctx_pushed = 1;
    return 0;
}

static void destroy_queues(xc *x)
{
    /* Deleting a queue pair at the controller ends its commands: nothing
     * lands in a bounce page after this. */
    for (unsigned i = 0; x->queues && i < x->nq; i++)
        if (x->queues[i]) {
            xnvme_cuda_queue_destroy(x->dev, x->queues[i]);
            x->queues[i] = NULL;
        }
}

/* Creates the queues (context pushed) and publishes their table and free
 * locks to the device. */
static int create_queues(xc *x, char *err, size_t err_len)
{
    for (unsigned i = 0; i < x->nq; i++) {
        int rc = xnvme_cuda_queue_create(x->dev, (uint16_t)x->qdepth, &x->queues[i]);
        if (rc) {
            x->queues[i] = NULL;
            /* Its sign is not reliable (a negated CUresult and a positive
             * errno both occur): report the raw value. */
            fr_set_err(err, err_len, "xnvme-cuda: %s: xnvme_cuda_queue_create (queue %u of %u, depth "
                   "%u) failed with %d%s", x->what, i + 1, x->nq, x->qdepth, rc,
                   rc == -ENOSYS ? " (libxnvme built without CUDA)"
                                 : i ? " (the controller grants fewer I/O queues? set "
                                       "engine_args queues=N)" : "");
            return rc == -ENOSYS ? -ENOTSUP : -EIO;
        }
    }
    CUres r = x->cu.cuMemcpyHtoD(x->d_queues, x->queues, x->nq * sizeof(*x->queues));
    if (r == 0)
        r = x->cu.cuMemsetD8(x->d_locks, 0, x->nq * sizeof(uint32_t));
    if (r) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: publishing the queue table: %s", x->what,
               cu_str(x, r));
        return -EIO;
    }
    return 0;
}

static void xc_close(void *state)
{
    xc *x = state;
    if (!x)
        return;
    int pushed = x->ctx && x->cu.lib && push_ctx(x, NULL, 0) == 0;
    destroy_queues(x);
    free(x->queues);
    if (pushed) {
        uint64_t bufs[] = {x->d_queues, x->d_locks, x->d_iova, x->d_prp, x->d_counters};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            if (bufs[i])
                (void)x->cu.cuMemFree(bufs[i]); /* nothing to do about a failing free */
    }
    if (x->dev) {
        if (x->prp_raw)
            xnvme_buf_free(x->dev, x->prp_raw);
        if (x->bounce)
            xnvme_buf_free(x->dev, x->bounce);
        xnvme_dev_close(x->dev);
    }
    pop_ctx(x);
    if (x->cu.lib)
        dlclose(x->cu.lib);
    free(x);
}

/* Why xnvme_dev_open refused, from what upcie-cuda's open path returns. */
static void explain_open(const xc *x, int e, size_t heap, int gpu, char *err, size_t err_len)
{
    const char *why;
    switch (e) {
    case ENODEV:
        why = "the CUDA driver or GPU could not be initialised (cuInit/cuDeviceGet)";
        break;
    case ENOTSUP:
        why = "the controller is not bound to uio_pci_generic";
        break;
    case ENOMEM:
        why = "the GPU heap or host hugepages could not be set up (BAR1 smaller than the heap? "
              "hugepages reserved? the dma-buf import needs xNVMe's udmabuf-import kernel patch)";
        break;
    case ENOENT:
    case ENXIO:
        why = "no such device";
        break;
    case EACCES:
    case EPERM:
        why = "permission denied (PCI config space, BARs and hugepages need root)";
        break;
    default:
        why = strerror(e);
        break;
    }
    fr_set_err(err, err_len, "xnvme-cuda: xNVMe's upcie-cuda backend could not open %s (GPU %d, "
           "%zu MiB GPU heap): %s (errno %d)", x->what, gpu, heap >> 20, why, e);
}

static uint64_t round_up64(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int iova_of(xc *x, void *p, uint64_t *out, char *err, size_t err_len)
{
    int rc = xnvme_buf_vtophys(x->dev, p, out);
    if (rc) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: xnvme_buf_vtophys failed (%d)", x->what, rc);
        return rc < 0 ? rc : -EIO;
    }
    return 0;
}

static int dev_alloc(xc *x, uint64_t *d, const void *src, size_t len, const char *what,
                     char *err, size_t err_len)
{
    CUres r = x->cu.cuMemAlloc(d, len);
    if (r) {
        *d = 0;
        fr_set_err(err, err_len, "xnvme-cuda: %s: cuMemAlloc (%s, %zu bytes): %s", x->what, what, len,
               cu_str(x, r));
        return -ENOMEM;
    }
    r = src ? x->cu.cuMemcpyHtoD(*d, src, len) : x->cu.cuMemsetD8(*d, 0, len);
    if (r) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: initialising %s: %s", x->what, what, cu_str(x, r));
        return -EIO;
    }
    return 0;
}

/* Bounce pages, their bus addresses and PRP lists (context pushed). */
static int setup_bounce(xc *x, char *err, size_t err_len)
{
    const fr_xc_geom *g = &x->f.geom;
    size_t mpp = g->mem_pages_per_page, n = (size_t)x->nq * mpp;
    x->bounce = xnvme_buf_alloc(x->dev, (size_t)x->nq * g->page_bytes);
    if (!x->bounce) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: xnvme_buf_alloc of %u bounce pages of %u bytes in "
               "xNVMe's GPU heap failed", x->what, x->nq, g->page_bytes);
        return -ENOMEM;
    }
    /* PRP entries after the first must be 4 KiB aligned: so must the pages. */
    if ((uintptr_t)x->bounce % FR_XC_MEM_PAGE) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: xNVMe's GPU heap returned %p, not 4 KiB aligned",
               x->what, x->bounce);
        return -EINVAL;
    }
    uint64_t *iova = malloc(n * sizeof(*iova));
    uint64_t *prp = calloc(x->nq, sizeof(*prp));
    uint64_t *lists = NULL;
    int rc = iova && prp ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = iova_of(x, (char *)x->bounce + i * FR_XC_MEM_PAGE, &iova[i], err, err_len);
        if (rc == 0 && iova[i] % FR_XC_MEM_PAGE) {
            fr_set_err(err, err_len, "xnvme-cuda: %s: bounce memory page %zu has bus address 0x%llx, "
                   "not 4 KiB aligned", x->what, i, (unsigned long long)iova[i]);
            rc = -EINVAL;
        }
    }
    /* Pages over two memory pages need a PRP list for PRP2: queue q's holds
     * the bus addresses of its memory pages 1..mpp-1, at a power-of-two
     * stride so that no list crosses a 4 KiB boundary (a PRP list may not,
     * unless chained). */
    if (rc == 0 && mpp > 2) {
        size_t stride = 8;
        while (stride < (mpp - 1) * 8)
            stride <<= 1;
        size_t bytes = (size_t)x->nq * stride + FR_XC_MEM_PAGE;
        x->prp_raw = xnvme_buf_alloc(x->dev, bytes);
        lists = calloc(1, bytes);
        if (!x->prp_raw || !lists) {
            fr_set_err(err, err_len, "xnvme-cuda: %s: no memory for PRP lists (%zu bytes)", x->what,
                   bytes);
            rc = -ENOMEM;
        } else {
            uintptr_t base = ((uintptr_t)x->prp_raw + FR_XC_MEM_PAGE - 1) & ~(uintptr_t)4095;
            size_t skip = base - (uintptr_t)x->prp_raw;
            for (unsigned q = 0; rc == 0 && q < x->nq; q++) {
                uint64_t *l = (uint64_t *)((char *)lists + skip + q * stride);
                for (size_t j = 1; j < mpp; j++)
                    l[j - 1] = iova[q * mpp + j];
                /* Translation is per memory page: the list's page, plus its
                 * offset inside it. */
                uintptr_t va = base + q * stride;
                uint64_t pg = 0;
                rc = iova_of(x, (void *)(va & ~(uintptr_t)4095), &pg, err, err_len);
                prp[q] = pg + (va & 4095);
            }
            CUres r = rc ? 0 : x->cu.cuMemcpyHtoD((uint64_t)(uintptr_t)x->prp_raw, lists, bytes);
            if (r) {
                fr_set_err(err, err_len, "xnvme-cuda: %s: writing the PRP lists: %s", x->what,
                       cu_str(x, r));
                rc = -EIO;
            }
        }
    }
    if (rc == 0)
        rc = dev_alloc(x, &x->d_iova, iova, n * sizeof(*iova), "bounce bus addresses", err,
                       err_len);
    if (rc == 0)
        rc = dev_alloc(x, &x->d_prp, prp, x->nq * sizeof(*prp), "PRP list addresses", err,
                       err_len);
    if (rc == -ENOMEM && err && !err[0])
        fr_set_err(err, err_len, "xnvme-cuda: %s: out of host memory", x->what);
    free(iova);
    free(prp);
    free(lists);
    return rc;
}

int fr_xc_open_at(const fr_backend_env *env, const char *sysfs, void **state, char *err,
                  size_t err_len)
{
    *state = NULL;
    if (err && err_len)
        err[0] = 0;
    int rc = fr_xc_probe(err, err_len);
    if (rc)
        return rc;
    if (err && err_len)
        err[0] = 0;
    fr_xc_args a;
    rc = fr_xc_parse_args(env->engine_args, &a, err, err_len);
    if (rc)
        return rc;
    xc *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    uint32_t ns_from_path = 0;
    rc = fr_xc_resolve(sysfs, env->path, x->pci, sizeof(x->pci), &ns_from_path, err, err_len);
    if (rc) {
        free(x);
        return rc;
    }
    x->nsid = a.nsid ? a.nsid : (ns_from_path ? ns_from_path : 1);
    snprintf(x->what, sizeof(x->what), "%s nsid %u", x->pci, x->nsid);
    x->nq = a.queues ? a.queues : DEFAULT_QUEUES;
    int gpu = env->gpu ? fr_gpu_device_id(env->gpu) : 0;
    rc = load_cuda(&x->cu, x->what, err, err_len);
    CUres r = rc ? 0 : x->cu.cuInit(0);
    if (rc == 0 && r) {
        fr_set_err(err, err_len, "xnvme-cuda: no usable GPU for %s: cuInit failed: %s (CUDA error "
               "%d)", x->what, cu_str(x, r), r);
        rc = -ENODEV;
    }
    if (rc) {
        xc_close(x);
        return rc;
    }
    /* xNVMe's heap holds the bounce pages, the PRP lists and the queues (at
     * least one 64 KiB unit each for SQ and CQ); the first upcie-cuda open
     * of the process sizes it, so a later store may find it too small. */
    uint64_t heap = (uint64_t)x->nq * (env->page_bytes + 4096ull + 2 * (256ull << 10)) +
                    (64ull << 20);
    heap = round_up64(heap, 2ull << 20);
    CUctx before = NULL;
    r = x->cu.cuCtxGetCurrent(&before);
    (void)r; /* no current context is fine */
    struct xnvme_opts o = xnvme_opts_default();
    o.be = "upcie-cuda";
    o.nsid = x->nsid;
    o.gpu_id = (uint32_t)gpu;
    o.device_heap_size = (size_t)heap;
    errno = 0;
    x->dev = xnvme_dev_open(x->pci, &o);
    if (!x->dev) {
        int e = errno < 0 ? -errno : errno;
        explain_open(x, e ? e : EIO, (size_t)heap, gpu, err, err_len);
        xc_close(x);
        return -(e && e != ENOENT && e != ENXIO ? e : ENODEV);
    }
    const struct xnvme_geo *geo = xnvme_dev_get_geo(x->dev);
    rc = fr_xc_geom_init(&x->f.geom, x->what, env->offset, env->rows, env->row_bytes,
                         env->page_bytes, geo->lba_nbytes, geo->mdts_nbytes, geo->tbytes, err,
                         err_len);
    if (rc) {
        xc_close(x);
        return rc;
    }
    /* One page's commands at a time per queue; NVMe needs a depth >= 2. */
    x->qdepth = x->f.geom.cmds_per_page < 2 ? 2 : x->f.geom.cmds_per_page;

    /* xNVMe made its own context current if this was the process's first
     * upcie-cuda open: find it from memory it owns, give the calling thread
     * its context back and switch explicitly from here on. */
    void *probe_buf = xnvme_buf_alloc(x->dev, FR_XC_MEM_PAGE);
    CUctx owner = NULL;
    r = probe_buf ? x->cu.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT,
                                                (uint64_t)(uintptr_t)probe_buf)
                  : 1;
    if (probe_buf)
        xnvme_buf_free(x->dev, probe_buf);
    if (r || !owner) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: cannot tell which CUDA context owns xNVMe's GPU "
               "heap (%s)", x->what, r ? cu_str(x, r) : "no context");
        xc_close(x);
        return -EIO;
    }
    x->ctx = owner;
    CUctx now = NULL;
    if (x->cu.cuCtxGetCurrent(&now) == 0 && now == owner && before != owner) {
        CUctx c;
        (void)x->cu.cuCtxPopCurrent(&c);
    }
    rc = push_ctx(x, err, err_len);
    if (rc == 0)
        rc = setup_bounce(x, err, err_len);
    x->queues = rc ? NULL : calloc(x->nq, sizeof(*x->queues));
    if (rc == 0 && !x->queues)
        rc = -ENOMEM;
    if (rc == 0)
        rc = dev_alloc(x, &x->d_queues, NULL, x->nq * sizeof(*x->queues), "queue table", err,
                       err_len);
    if (rc == 0)
        rc = dev_alloc(x, &x->d_locks, NULL, x->nq * sizeof(uint32_t), "queue locks", err,
                       err_len);
    if (rc == 0)
        rc = dev_alloc(x, &x->d_counters, NULL, FR_XC_NCNT * sizeof(uint64_t), "counters", err,
                       err_len);
    if (rc == 0)
        rc = create_queues(x, err, err_len);
    pop_ctx(x);
    if (rc) {
        xc_close(x);
        return rc;
    }
    x->f.queues = x->d_queues;
    x->f.locks = x->d_locks;
    x->f.bounce = (uint64_t)(uintptr_t)x->bounce;
    x->f.bounce_iova = x->d_iova;
    x->f.prp_iova = x->d_prp;
    x->f.counters = x->d_counters;
    x->f.nqueues = x->nq;
    x->f.nsid = x->nsid;
    *state = x;
    return 0;
}

static int xc_probe(const fr_backend_env *env, char *why, size_t why_len)
{
    int rc = fr_xc_probe(why, why_len);
    if (rc || !env || !env->path)
        return rc;
    char pci[16];
    uint32_t nsid = 0;
    return fr_xc_resolve(NULL, env->path, pci, sizeof(pci), &nsid, why, why_len);
}

static int xc_open(const fr_backend_env *env, void **state, char *err, size_t err_len)
{
    return fr_xc_open_at(env, NULL, state, err, err_len);
}

static void xc_fill_view(void *state, fr_dev_fetch *view)
{
    const xc *x = state;
    _Static_assert(sizeof(fr_xc_fetch) <= sizeof(view->words), "fr_xc_fetch outgrew fr_dev_fetch");
    memset(view, 0, sizeof(*view));
    memcpy(view->words, &x->f, sizeof(x->f));
}

static int xc_begin(void *state, char *err, size_t err_len)
{
    xc *x = state;
    if (atomic_load(&x->cancelled)) {
        fr_set_err(err, err_len, "xnvme-cuda: %s: the store is closing", x->what);
        return -ECANCELED;
    }
    return 0;
}

/* The kernel is done. After a failure a loader may have left commands in
 * flight on a retired queue: delete and recreate every queue (the
 * controller ends their commands), so that the next gather starts clean. */
static int xc_end(void *state, int failed, char *err, size_t err_len)
{
    xc *x = state;
    if (!failed)
        return 0;
    int rc = push_ctx(x, err, err_len);
    if (rc)
        return rc;
    destroy_queues(x);
    rc = create_queues(x, err, err_len);
    pop_ctx(x);
    return rc;
}

static void xc_cancel(void *state)
{
    xc *x = state;
    atomic_store(&x->cancelled, 1); /* the device sees the store's abort flag itself */
}

static void xc_counters(void *state, fr_store_stats *add)
{
    xc *x = state;
    uint64_t c[FR_XC_NCNT];
    if (push_ctx(x, NULL, 0) != 0)
        return;
    CUres r = x->cu.cuMemcpyDtoH(c, x->d_counters, sizeof(c));
    pop_ctx(x);
    if (r)
        return; /* counters are best effort: a failed gather reports its own error */
    add->storage_reads += c[FR_XC_CNT_COMMANDS] - x->seen[FR_XC_CNT_COMMANDS];
    add->bytes_read += c[FR_XC_CNT_BYTES] - x->seen[FR_XC_CNT_BYTES];
    memcpy(x->seen, c, sizeof(c));
}

static void xc_memory(void *state, fr_store_memory *add)
{
    xc *x = state;
    /* SQ + CQ per queue (64 + 16 bytes an entry, in 64 KiB heap units). */
    add->rings += (uint64_t)x->nq * 2 * (64u << 10);
    add->staging += (uint64_t)x->nq * x->f.geom.page_bytes;
    add->device_meta += (uint64_t)x->nq * (x->f.geom.mem_pages_per_page * 8 + 8 + 8 + 4) +
                         FR_XC_NCNT * 8;
}

void *fr_xc_context(void *state) { return state ? ((xc *)state)->ctx : NULL; }

const fr_gather_backend fr_gather_backend_xnvme_cuda = {
    .name = "xnvme-cuda",
    .fetch_define = "FR_FETCH_EXTERN",
    .device_source = fr_xc_device_source,
    .probe = xc_probe,
    .open = xc_open,
    .map_cache = NULL, /* xNVMe gives bus addresses for its own heap only: pages bounce */
    .fill_view = xc_fill_view,
    .begin = xc_begin,
    .end = xc_end,
    .cancel = xc_cancel,
    .counters = xc_counters,
    .memory = xc_memory,
    .close = xc_close,
};

#endif /* FASTREAD_HAVE_XNVME_CUDA */
