/*
 * xnvme-cuda host side: see gather_xnvme_cuda.h.
 *
 * Linked against the system's libxnvme (found by pkg-config, with
 * libxnvme_cuda.h: cmake/xnvme_cuda.cmake). fastread itself still never
 * links CUDA: the few driver calls made here (context switch, small
 * allocations, module load, launch) go through a table dlsym'ed per
 * instance, as gpu.c does. A libxnvme built with CUDA does link libcuda
 * itself, so on such a system it is loaded anyway.
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

#include "gather_xnvme_cuda.h"

#ifdef FASTREAD_HAVE_XNVME_CUDA
#include <dlfcn.h>
#include <libxnvme.h>
#endif

#define DEFAULT_QUEUES 8u
#define DEFAULT_QDEPTH 256u
#define DEFAULT_TIMEOUT_MS 10000u

/* Own formatting, not base.h's fr_set_err: the tests link this file with
 * nothing else of the core where xNVMe is absent. */
__attribute__((format(printf, 3, 4))) static void xc_err(char *err, size_t err_len,
                                                         const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

void fr_xc_config_init(fr_xc_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->page_bytes = 64u << 10;
    cfg->cache_bytes = 1ull << 30;
}

/* ------------------------------------------------------------- engine_args */

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

int fr_xc_parse_args(const char *s, fr_xc_config *cfg, char *err, size_t err_len)
{
    while (s && *s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        if (len == 0) {
            s = end ? end + 1 : s + len;
            continue;
        }
        if (!eq) {
            xc_err(err, err_len, "xnvme-cuda: engine_args entry '%.*s' is not key=value",
                   (int)len, s);
            return -EINVAL;
        }
        size_t klen = (size_t)(eq - s), vlen = len - klen - 1;
        const char *v = eq + 1;
        unsigned long x = 0;
        int bad;
#define KEY(k) (klen == sizeof(k) - 1 && memcmp(s, k, klen) == 0)
        if (KEY("nsid")) {
            bad = parse_u32(v, vlen, 0xFFFFFFFEul, &x) || x == 0;
            cfg->nsid = (uint32_t)x;
        } else if (KEY("queues")) {
            bad = parse_u32(v, vlen, 1024, &x) || x == 0;
            cfg->queues = (unsigned)x;
        } else if (KEY("qdepth")) {
            bad = parse_u32(v, vlen, 1024, &x) || x < 32 || (x & (x - 1)) != 0;
            cfg->queue_depth = (unsigned)x;
        } else if (KEY("gpu")) {
            bad = parse_u32(v, vlen, 1024, &x);
            cfg->gpu_id = (int)x;
        } else {
            xc_err(err, err_len, "xnvme-cuda: unknown engine_args key '%.*s' (valid: nsid, "
                   "queues, qdepth, gpu)", (int)klen, s);
            return -EINVAL;
        }
#undef KEY
        if (bad) {
            xc_err(err, err_len, "xnvme-cuda: bad value for '%.*s': '%.*s' (nsid >= 1, queues "
                   "1..1024, qdepth a power of two in 32..1024, gpu >= 0)", (int)klen, s,
                   (int)vlen, v);
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
    snprintf(out, len, "%s", b ? b + 1 : target);
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
        xc_err(err, err_len, "xnvme-cuda: no device given (a PCI address such as 0000:01:00.0 "
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
            xc_err(err, err_len, "xnvme-cuda: '%s' is not an NVMe namespace (/dev/nvmeXnY) nor "
                   "a PCI address: the upcie-cuda backend drives an NVMe controller by its "
                   "PCI address", uri);
            return -EINVAL;
        }
        *nsid = ns;
        struct stat st;
        if (stat(uri, &st) != 0) {
            xc_err(err, err_len, "xnvme-cuda: %s: no such NVMe namespace on this machine "
                   "(upcie-cuda needs an NVMe controller with P2P to the GPU, bound to "
                   "uio_pci_generic, given by its PCI address)", uri);
            return -ENODEV;
        }
        char addr[64];
        snprintf(path, sizeof(path), "%s/class/nvme/nvme%u/device", sysfs, ctrl);
        link_name(path, addr, sizeof(addr));
        if (parse_pci(addr, pci, pci_len) != 0) {
            xc_err(err, err_len, "xnvme-cuda: %s belongs to controller nvme%u, which is not a "
                   "PCIe function (NVMe over fabrics?): upcie-cuda drives local PCIe "
                   "controllers only", uri, ctrl);
            return -ENODEV;
        }
        xc_err(err, err_len, "xnvme-cuda: %s is served by the kernel's nvme driver (controller "
               "nvme%u, PCI %s); the upcie-cuda backend drives the controller from user space: "
               "unbind it, bind %s to uio_pci_generic (xNVMe's xnvme-driver does this) and open "
               "\"%s\" with nsid=%u", uri, ctrl, pci, pci, pci, ns);
        return -ENODEV;
    }
    if (parse_pci(uri, pci, pci_len) != 0) {
        xc_err(err, err_len, "xnvme-cuda: '%s' is neither a PCI address (0000:01:00.0) nor an "
               "NVMe namespace path (/dev/nvme0n1)", uri);
        return -EINVAL;
    }
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s", sysfs, pci);
    struct stat st;
    if (stat(path, &st) != 0) {
        xc_err(err, err_len, "xnvme-cuda: no PCI device %s on this machine: the upcie-cuda "
               "backend needs an NVMe controller there, bound to uio_pci_generic, with P2P DMA "
               "to the GPU", pci);
        return -ENODEV;
    }
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/class", sysfs, pci);
    unsigned long cls = 0;
    if (read_attr(path, buf, sizeof(buf)) != 0 || sscanf(buf, "%lx", &cls) != 1) {
        xc_err(err, err_len, "xnvme-cuda: cannot read the class of PCI device %s (%s)", pci,
               path);
        return -ENODEV;
    }
    if ((cls >> 8) != 0x0108) {
        xc_err(err, err_len, "xnvme-cuda: PCI device %s is not an NVMe controller (class "
               "0x%06lx, NVMe is 0x0108xx): nothing for the upcie-cuda backend to drive", pci,
               cls);
        return -ENODEV;
    }
    char drv[64];
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/driver", sysfs, pci);
    link_name(path, drv, sizeof(drv));
    if (strcmp(drv, "uio_pci_generic") != 0) {
        xc_err(err, err_len, "xnvme-cuda: NVMe controller %s is %s%s; the upcie-cuda backend "
               "needs it bound to uio_pci_generic (vfio-pci is not supported for its P2P DMA)",
               pci, drv[0] ? "bound to " : "bound to no driver", drv);
        return -ENODEV;
    }
    return 0;
}

#ifndef FASTREAD_HAVE_XNVME_CUDA

/* ---------------------------------------------- built without xNVMe CUDA */

static const char NOT_BUILT[] =
    "xnvme-cuda: fastread was built without xNVMe's GPU queues (libxnvme_cuda.h was not "
    "found through pkg-config's xnvme include directories at build time, or "
    "FASTREAD_XNVME_CUDA=OFF); build xNVMe main with -Dwith-cuda=enabled and reinstall fastread";

int fr_xc_probe(char *why, size_t why_len)
{
    xc_err(why, why_len, "%s", NOT_BUILT);
    return -ENOTSUP;
}

int fr_xc_open(const fr_xc_config *cfg, fr_xc **out, char *err, size_t err_len)
{
    (void)cfg;
    *out = NULL;
    xc_err(err, err_len, "%s", NOT_BUILT);
    return -ENOTSUP;
}

void fr_xc_close(fr_xc *x) { (void)x; }
const fr_xc_geom *fr_xc_geometry(const fr_xc *x) { (void)x; return NULL; }
uint32_t fr_xc_slots(const fr_xc *x) { (void)x; return 0; }
uint64_t fr_xc_slot_base(const fr_xc *x) { (void)x; return 0; }
void *fr_xc_context(const fr_xc *x) { (void)x; return NULL; }
uint64_t fr_xc_view_address(const fr_xc *x) { (void)x; return 0; }

int fr_xc_fill(fr_xc *x, uint64_t d_pages, uint64_t d_slots, uint32_t n, char *err,
               size_t err_len)
{
    (void)x, (void)d_pages, (void)d_slots, (void)n;
    xc_err(err, err_len, "%s", NOT_BUILT);
    return -ENOTSUP;
}

void fr_xc_stats_get(const fr_xc *x, fr_xc_stats *out)
{
    (void)x;
    memset(out, 0, sizeof(*out));
}

#else /* FASTREAD_HAVE_XNVME_CUDA */

#ifndef FASTREAD_XNVME_BUILD_VERSION
#define FASTREAD_XNVME_BUILD_VERSION "unknown"
#endif

/* The fill kernel, compiled by nvcc at build time (xnvme_cuda_kernels.cu). */
#ifdef FASTREAD_XNVME_CUDA_FATBIN
extern const unsigned char fr_xc_fatbin[];
extern const size_t fr_xc_fatbin_len;
#endif

/* ---- the CUDA driver calls used here (cuda.h's stable C ABI) ---- */
typedef int CUres;
typedef void *CUctx;
typedef void *CUmod;
typedef void *CUfn;
typedef struct xc_cuda {
    void *lib;
    CUres (*cuInit)(unsigned);
    CUres (*cuGetErrorString)(CUres, const char **);
    CUres (*cuCtxGetCurrent)(CUctx *);
    CUres (*cuCtxPushCurrent)(CUctx);
    CUres (*cuCtxPopCurrent)(CUctx *);
    CUres (*cuCtxSynchronize)(void);
    CUres (*cuPointerGetAttribute)(void *, int, uint64_t);
    CUres (*cuMemAlloc)(uint64_t *, size_t);
    CUres (*cuMemFree)(uint64_t);
    CUres (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
    CUres (*cuMemcpyDtoH)(void *, uint64_t, size_t);
    CUres (*cuMemsetD8)(uint64_t, unsigned char, size_t);
    CUres (*cuModuleLoadData)(CUmod *, const void *);
    CUres (*cuModuleUnload)(CUmod);
    CUres (*cuModuleGetFunction)(CUfn *, CUmod, const char *);
    CUres (*cuLaunchKernel)(CUfn, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, void *, void **, void **);
} xc_cuda;
#define CU_POINTER_ATTRIBUTE_CONTEXT 1

struct fr_xc {
    char pci[16];
    uint32_t nsid;
    char what[64]; /* "<pci> nsid <n>": names the device in every message */
    struct xnvme_dev *dev;
    fr_xc_geom geom;
    xc_cuda cu;
    CUctx ctx;          /* xNVMe's context: slots, queues, our module */
    int ctx_pushed;
    void *slots;        /* xnvme_buf_alloc'ed: nslots * page_bytes */
    void *prp_raw;      /* xnvme_buf_alloc'ed PRP lists (+ alignment slack) */
    uint32_t nslots;
    unsigned nq, qdepth;
    struct xnvme_cuda_queue **queues; /* host array of device pointers */
    uint64_t d_queues, d_slot_iova, d_prp_iova, d_view, d_status;
    CUmod mod;
    CUfn fill;
    uint32_t timeout_ms;
    int lost;           /* a fill timed out: the queues' state is unknown */
    fr_xc_stats stats;
};

static const char *cu_str(const fr_xc *x, CUres r)
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
        xc_err(err, err_len, "xnvme-cuda: no GPU for %s: the CUDA driver (libcuda.so.1) cannot "
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
        S(cuCtxPopCurrent, "cuCtxPopCurrent_v2"), S(cuCtxSynchronize, "cuCtxSynchronize"),
        S(cuPointerGetAttribute, "cuPointerGetAttribute"), S(cuMemAlloc, "cuMemAlloc_v2"),
        S(cuMemFree, "cuMemFree_v2"), S(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
        S(cuMemcpyDtoH, "cuMemcpyDtoH_v2"), S(cuMemsetD8, "cuMemsetD8_v2"),
        S(cuModuleLoadData, "cuModuleLoadData"), S(cuModuleUnload, "cuModuleUnload"),
        S(cuModuleGetFunction, "cuModuleGetFunction"), S(cuLaunchKernel, "cuLaunchKernel"),
#undef S
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].slot = dlsym(cu->lib, syms[i].name);
        if (!*syms[i].slot) {
            xc_err(err, err_len, "xnvme-cuda: no usable GPU for %s: the CUDA driver has no %s "
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
        xc_err(why, why_len, "xnvme-cuda: built against xNVMe %s but libxnvme %d.%d.%d is "
               "loaded (reinstall fastread against this xNVMe)", FASTREAD_XNVME_BUILD_VERSION,
               major, minor, patch);
        return -ENOTSUP;
    }
    if (!have_upcie_cuda()) {
        xc_err(why, why_len, "xnvme-cuda: the loaded libxnvme %d.%d.%d has no upcie-cuda "
               "backend (built without CUDA: rebuild xNVMe with -Dwith-cuda=enabled)", major,
               minor, patch);
        return -ENOTSUP;
    }
#ifndef FASTREAD_XNVME_CUDA_FATBIN
    xc_err(why, why_len, "xnvme-cuda: fastread was built without nvcc, so its fill kernel "
           "(which includes libxnvme_cuda.h, beyond NVRTC) was not compiled");
    return -ENOTSUP;
#else
    xc_err(why, why_len, "xNVMe %d.%d.%d with upcie-cuda (built against %s)", major, minor,
           patch, FASTREAD_XNVME_BUILD_VERSION);
    return 0;
#endif
}

static void pop_ctx(fr_xc *x)
{
    if (x->ctx_pushed) {
        CUctx c;
        CUres r = x->cu.cuCtxPopCurrent(&c);
        (void)r; /* only fails without a current context: nothing to restore then */
        x->ctx_pushed = 0;
    }
}

static int push_ctx(fr_xc *x, char *err, size_t err_len)
{
    CUres r = x->cu.cuCtxPushCurrent(x->ctx);
    if (r) {
        xc_err(err, err_len, "xnvme-cuda: %s: cuCtxPushCurrent (xNVMe's CUDA context): %s",
               x->what, cu_str(x, r));
        return -EIO;
    }
    x->ctx_pushed = 1;
    return 0;
}

void fr_xc_close(fr_xc *x)
{
    if (!x)
        return;
    int pushed = x->ctx && x->cu.lib && x->cu.cuCtxPushCurrent(x->ctx) == 0;
    if (pushed) {
        if (x->mod)
            (void)x->cu.cuModuleUnload(x->mod);
        uint64_t bufs[] = {x->d_queues, x->d_slot_iova, x->d_prp_iova, x->d_view, x->d_status};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            if (bufs[i])
                (void)x->cu.cuMemFree(bufs[i]); /* nothing to do about a failing free */
    }
    /* After a timeout a command may still complete into a slot: the queues
     * are deleted (the controller stops using them) before the slots go. */
    for (unsigned i = 0; x->queues && i < x->nq; i++)
        if (x->queues[i])
            xnvme_cuda_queue_destroy(x->dev, x->queues[i]);
    free(x->queues);
    if (x->dev) {
        if (x->prp_raw)
            xnvme_buf_free(x->dev, x->prp_raw);
        if (x->slots)
            xnvme_buf_free(x->dev, x->slots);
        xnvme_dev_close(x->dev);
    }
    if (pushed) {
        CUctx c;
        (void)x->cu.cuCtxPopCurrent(&c);
    }
    if (x->cu.lib)
        dlclose(x->cu.lib);
    free(x);
}

/* Why xnvme_dev_open refused, from what upcie-cuda's open path returns. */
static void explain_open(const fr_xc *x, int e, size_t heap, int gpu, char *err, size_t err_len)
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
    xc_err(err, err_len, "xnvme-cuda: xNVMe's upcie-cuda backend could not open %s (GPU %d, "
           "%zu MiB GPU heap): %s (errno %d)", x->what, gpu, heap >> 20, why, e);
}

static uint64_t round_up64(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Bus address of host-visible VA p inside an xnvme_buf_alloc'ed buffer. */
static int iova_of(fr_xc *x, void *p, uint64_t *out, char *err, size_t err_len)
{
    int rc = xnvme_buf_vtophys(x->dev, p, out);
    if (rc) {
        xc_err(err, err_len, "xnvme-cuda: %s: xnvme_buf_vtophys failed (%d)", x->what, rc);
        return rc < 0 ? rc : -EIO;
    }
    return 0;
}

static int dev_alloc_copy(fr_xc *x, uint64_t *d, const void *src, size_t len, const char *what,
                          char *err, size_t err_len)
{
    CUres r = x->cu.cuMemAlloc(d, len);
    if (r) {
        *d = 0;
        xc_err(err, err_len, "xnvme-cuda: %s: cuMemAlloc (%s, %zu bytes): %s", x->what, what, len,
               cu_str(x, r));
        return -ENOMEM;
    }
    if (src && (r = x->cu.cuMemcpyHtoD(*d, src, len))) {
        xc_err(err, err_len, "xnvme-cuda: %s: cuMemcpyHtoD (%s): %s", x->what, what,
               cu_str(x, r));
        return -EIO;
    }
    return 0;
}

/* Slots, their bus addresses and PRP lists (geometry known). */
static int setup_slots(fr_xc *x, char *err, size_t err_len)
{
    const fr_xc_geom *g = &x->geom;
    size_t slot_bytes = (size_t)x->nslots * g->page_bytes;
    x->slots = xnvme_buf_alloc(x->dev, slot_bytes);
    if (!x->slots) {
        xc_err(err, err_len, "xnvme-cuda: %s: xnvme_buf_alloc of %zu MiB of cache slots in "
               "xNVMe's GPU heap failed", x->what, slot_bytes >> 20);
        return -ENOMEM;
    }
    /* PRP entries after the first must be 4 KiB aligned: so must the slots. */
    if ((uintptr_t)x->slots % FR_XC_MEM_PAGE) {
        xc_err(err, err_len, "xnvme-cuda: %s: xNVMe's GPU heap returned slots at %p, not 4 KiB "
               "aligned", x->what, x->slots);
        return -EINVAL;
    }
    size_t mpp = g->mem_pages_per_page, n = (size_t)x->nslots * mpp;
    uint64_t *iova = malloc(n * sizeof(*iova));
    uint64_t *prp_iova = calloc(x->nslots, sizeof(*prp_iova));
    uint64_t *lists = NULL;
    int rc = iova && prp_iova ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = iova_of(x, (char *)x->slots + i * FR_XC_MEM_PAGE, &iova[i], err, err_len);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (iova[i] % FR_XC_MEM_PAGE) {
            xc_err(err, err_len, "xnvme-cuda: %s: slot memory page %zu has bus address 0x%llx, "
                   "not 4 KiB aligned", x->what, i, (unsigned long long)iova[i]);
            rc = -EINVAL;
        }
    /* Pages over two memory pages need a PRP list for PRP2. A slot's list
     * holds the bus addresses of its memory pages 1..mpp-1, at a power-of-
     * two stride so that no list crosses a 4 KiB boundary (a PRP list may
     * not, unless chained). */
    uint32_t stride = 0;
    if (rc == 0 && mpp > 2) {
        stride = 8;
        while (stride < (mpp - 1) * 8)
            stride <<= 1;
        size_t list_bytes = (size_t)x->nslots * stride;
        x->prp_raw = xnvme_buf_alloc(x->dev, list_bytes + FR_XC_MEM_PAGE);
        lists = calloc(1, list_bytes + FR_XC_MEM_PAGE);
        if (!x->prp_raw || !lists) {
            xc_err(err, err_len, "xnvme-cuda: %s: no memory for PRP lists (%zu bytes)", x->what,
                   list_bytes);
            rc = -ENOMEM;
        } else {
            uintptr_t base = ((uintptr_t)x->prp_raw + FR_XC_MEM_PAGE - 1) & ~(uintptr_t)4095;
            size_t skip = base - (uintptr_t)x->prp_raw;
            for (uint32_t s = 0; rc == 0 && s < x->nslots; s++) {
                uint64_t *l = (uint64_t *)((char *)lists + skip + (size_t)s * stride);
                for (size_t j = 1; j < mpp; j++)
                    l[j - 1] = iova[(size_t)s * mpp + j];
                /* The list's own bus address: its 4 KiB page's, plus the
                 * offset inside it (translation is per memory page). */
                uintptr_t va = base + (size_t)s * stride;
                uint64_t pg;
                rc = iova_of(x, (void *)(va & ~(uintptr_t)4095), &pg, err, err_len);
                prp_iova[s] = pg + (va & 4095);
            }
            CUres r = rc ? 0 : x->cu.cuMemcpyHtoD((uint64_t)(uintptr_t)x->prp_raw, lists,
                                                   list_bytes + FR_XC_MEM_PAGE);
            if (r) {
                xc_err(err, err_len, "xnvme-cuda: %s: cuMemcpyHtoD (PRP lists): %s", x->what,
                       cu_str(x, r));
                rc = -EIO;
            }
        }
    }
    if (rc == 0)
        rc = dev_alloc_copy(x, &x->d_slot_iova, iova, n * sizeof(*iova), "slot bus addresses",
                            err, err_len);
    if (rc == 0)
        rc = dev_alloc_copy(x, &x->d_prp_iova, prp_iova, x->nslots * sizeof(*prp_iova),
                            "PRP list addresses", err, err_len);
    free(iova);
    free(prp_iova);
    free(lists);
    if (rc == -ENOMEM && err && !err[0])
        xc_err(err, err_len, "xnvme-cuda: %s: out of host memory", x->what);
    return rc;
}

static int setup_queues(fr_xc *x, uint32_t timeout_ms, char *err, size_t err_len)
{
    x->queues = calloc(x->nq, sizeof(*x->queues));
    if (!x->queues)
        return -ENOMEM;
    for (unsigned i = 0; i < x->nq; i++) {
        int rc = xnvme_cuda_queue_create(x->dev, (uint16_t)x->qdepth, &x->queues[i]);
        if (rc) {
            x->queues[i] = NULL;
            /* Its sign is not reliable (a negated CUresult or a positive
             * errno both occur): report the raw value. */
            xc_err(err, err_len, "xnvme-cuda: %s: xnvme_cuda_queue_create (queue %u of %u, depth "
                   "%u) failed with %d%s", x->what, i + 1, x->nq, x->qdepth, rc,
                   rc == -ENOSYS ? " (libxnvme built without CUDA)" : "");
            return rc == -ENOSYS ? -ENOTSUP : (rc < 0 ? (rc > -4096 ? rc : -EIO) : -rc);
        }
    }
    int rc = dev_alloc_copy(x, &x->d_queues, x->queues, x->nq * sizeof(*x->queues),
                            "queue table", err, err_len);
    if (rc)
        return rc;
    uint32_t stride = 0;
    if (x->geom.mem_pages_per_page > 2)
        for (stride = 8; stride < (x->geom.mem_pages_per_page - 1) * 8; stride <<= 1)
            ;
    fr_xc_view v = {
        .geom = x->geom,
        .queues = x->d_queues,
        .slot_base = (uint64_t)(uintptr_t)x->slots,
        .slot_iova = x->d_slot_iova,
        .prp_iova = x->d_prp_iova,
        .nslots = x->nslots,
        .nqueues = x->nq,
        .qdepth = x->qdepth,
        .nsid = x->nsid,
        .timeout_ms = timeout_ms,
        .prp_stride = stride,
    };
    rc = dev_alloc_copy(x, &x->d_view, &v, sizeof(v), "device view", err, err_len);
    if (rc == 0)
        rc = dev_alloc_copy(x, &x->d_status, NULL, sizeof(fr_xc_fill_status), "fill status",
                            err, err_len);
    return rc;
}

int fr_xc_open(const fr_xc_config *cfg, fr_xc **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err && err_len)
        err[0] = 0;
    int rc = fr_xc_probe(err, err_len);
    if (rc)
        return rc;
    if (err && err_len)
        err[0] = 0;
    fr_xc *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    uint32_t ns_from_path = 0;
    rc = fr_xc_resolve(cfg->sysfs, cfg->uri, x->pci, sizeof(x->pci), &ns_from_path, err,
                       err_len);
    if (rc) {
        free(x);
        return rc;
    }
    x->nsid = cfg->nsid ? cfg->nsid : (ns_from_path ? ns_from_path : 1);
    snprintf(x->what, sizeof(x->what), "%s nsid %u", x->pci, x->nsid);
    x->nq = cfg->queues ? cfg->queues : DEFAULT_QUEUES;
    x->qdepth = cfg->queue_depth ? cfg->queue_depth : DEFAULT_QDEPTH;
    if (x->qdepth < 32 || x->qdepth > 1024 || (x->qdepth & (x->qdepth - 1))) {
        xc_err(err, err_len, "xnvme-cuda: queue depth %u is not a power of two in 32..1024 (one "
               "thread block drives one queue)", x->qdepth);
        free(x);
        return -EINVAL;
    }
    uint32_t timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
    x->timeout_ms = timeout_ms;
    if (cfg->page_bytes == 0 || cfg->cache_bytes < cfg->page_bytes) {
        xc_err(err, err_len, "xnvme-cuda: cache_bytes %llu holds no page of %u bytes",
               (unsigned long long)cfg->cache_bytes, cfg->page_bytes);
        free(x);
        return -EINVAL;
    }
    rc = load_cuda(&x->cu, x->what, err, err_len);
    CUres r = rc ? 0 : x->cu.cuInit(0);
    if (rc == 0 && r) {
        xc_err(err, err_len, "xnvme-cuda: no usable GPU for %s: cuInit failed: %s (CUDA error "
               "%d)", x->what, cu_str(x, r), r);
        rc = -ENODEV;
    }
    if (rc) {
        fr_xc_close(x);
        return rc;
    }
    /* xNVMe's heap holds the slots, the PRP lists and the queues (one 64 KiB
     * unit at least each for SQ and CQ); it is sized on the first
     * upcie-cuda open of the process, so a later store may find it full. */
    uint64_t nslots = cfg->cache_bytes / cfg->page_bytes;
    if (nslots > UINT32_MAX)
        nslots = UINT32_MAX;
    uint64_t heap = nslots * cfg->page_bytes + nslots * 4096ull +
                    (uint64_t)x->nq * 2 * round_up64((uint64_t)(x->qdepth + 1) * 64, 64 << 10) +
                    (64ull << 20);
    heap = round_up64(heap, 2ull << 20);

    CUctx before = NULL;
    r = x->cu.cuCtxGetCurrent(&before);
    (void)r; /* no current context is fine */
    struct xnvme_opts o = xnvme_opts_default();
    o.be = "upcie-cuda";
    o.nsid = x->nsid;
    o.gpu_id = (uint32_t)cfg->gpu_id;
    o.device_heap_size = (size_t)heap;
    errno = 0;
    x->dev = xnvme_dev_open(x->pci, &o);
    if (!x->dev) {
        int e = errno < 0 ? -errno : errno;
        explain_open(x, e ? e : EIO, (size_t)heap, cfg->gpu_id, err, err_len);
        fr_xc_close(x);
        return -(e ? (e == ENOENT || e == ENXIO ? ENODEV : e) : EIO);
    }
    const struct xnvme_geo *geo = xnvme_dev_get_geo(x->dev);
    rc = fr_xc_geom_init(&x->geom, x->what, cfg->offset, cfg->rows, cfg->row_bytes,
                         cfg->page_bytes, geo->lba_nbytes, geo->mdts_nbytes, geo->tbytes, err,
                         err_len);
    if (rc) {
        fr_xc_close(x);
        return rc;
    }
    x->nslots = (uint32_t)(nslots < x->geom.pages ? nslots : (x->geom.pages ? x->geom.pages : 1));

    /* xNVMe made its own context current if this was the process's first
     * upcie-cuda open: find it from memory it owns, then give the caller's
     * thread its context back and switch explicitly from here on. */
    x->slots = xnvme_buf_alloc(x->dev, FR_XC_MEM_PAGE);
    CUctx owner = NULL;
    r = x->slots ? x->cu.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT,
                                               (uint64_t)(uintptr_t)x->slots)
                 : 1;
    if (x->slots)
        xnvme_buf_free(x->dev, x->slots);
    x->slots = NULL;
    if (r || !owner) {
        xc_err(err, err_len, "xnvme-cuda: %s: cannot tell which CUDA context owns xNVMe's GPU "
               "heap (%s)", x->what, r ? cu_str(x, r) : "no context");
        fr_xc_close(x);
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
        rc = setup_slots(x, err, err_len);
    if (rc == 0)
        rc = setup_queues(x, timeout_ms, err, err_len);
#ifdef FASTREAD_XNVME_CUDA_FATBIN
    if (rc == 0 && (r = x->cu.cuModuleLoadData(&x->mod, fr_xc_fatbin))) {
        x->mod = NULL;
        xc_err(err, err_len, "xnvme-cuda: %s: loading the fill kernel (%zu-byte fatbin) failed: "
               "%s (no code for this GPU's architecture?)", x->what, fr_xc_fatbin_len,
               cu_str(x, r));
        rc = -ENOTSUP;
    }
    if (rc == 0 && (r = x->cu.cuModuleGetFunction(&x->fill, x->mod, "fr_xc_fill_pages"))) {
        xc_err(err, err_len, "xnvme-cuda: fill kernel not found in the module: %s", cu_str(x, r));
        rc = -EIO;
    }
#endif
    pop_ctx(x);
    if (rc) {
        fr_xc_close(x);
        return rc;
    }
    *out = x;
    return 0;
}

const fr_xc_geom *fr_xc_geometry(const fr_xc *x) { return &x->geom; }
uint32_t fr_xc_slots(const fr_xc *x) { return x->nslots; }
uint64_t fr_xc_slot_base(const fr_xc *x) { return (uint64_t)(uintptr_t)x->slots; }
void *fr_xc_context(const fr_xc *x) { return x->ctx; }
uint64_t fr_xc_view_address(const fr_xc *x) { return x->d_view; }

int fr_xc_fill(fr_xc *x, uint64_t d_pages, uint64_t d_slots, uint32_t n, char *err,
               size_t err_len)
{
    if (x->lost) {
        xc_err(err, err_len, "xnvme-cuda: %s: the GPU queues were retired after a timeout (a "
               "late completion could still land in a slot): close and reopen the store",
               x->what);
        return -EIO;
    }
    if (n == 0)
        return 0;
    int rc = push_ctx(x, err, err_len);
    if (rc)
        return rc;
    fr_xc_fill_status st;
    uint64_t total = (uint64_t)n * x->geom.cmds_per_page;
    unsigned block = x->qdepth < FR_XC_MAX_BLOCK ? x->qdepth : FR_XC_MAX_BLOCK;
    uint64_t grid = (total + block - 1) / block;
    if (grid > x->nq)
        grid = x->nq;
    void *args[] = {&x->d_view, &d_pages, &d_slots, &n, &x->d_status};
    CUres r = x->cu.cuMemsetD8(x->d_status, 0, sizeof(st));
    const char *step = "cuMemsetD8 (fill status)";
    if (r == 0) {
        step = "cuLaunchKernel (fill)";
        r = x->cu.cuLaunchKernel(x->fill, (unsigned)grid, 1, 1, block, 1, 1, 0, NULL, args, NULL);
    }
    if (r == 0) {
        step = "the fill kernel";
        r = x->cu.cuCtxSynchronize();
    }
    if (r == 0) {
        step = "cuMemcpyDtoH (fill status)";
        r = x->cu.cuMemcpyDtoH(&st, x->d_status, sizeof(st));
    }
    pop_ctx(x);
    if (r) {
        /* A fault in the kernel leaves the context unusable, and commands
         * may be in flight: retire the queues. */
        x->lost = 1;
        xc_err(err, err_len, "xnvme-cuda: %s: %s failed: %s", x->what, step, cu_str(x, r));
        return -EIO;
    }
    x->stats.fills++;
    x->stats.pages += n;
    x->stats.commands += st.commands;
    x->stats.bytes_read += st.bytes;
    x->stats.failed_commands += st.failed;
    switch (st.code) {
    case FR_XC_OK:
        return 0;
    case FR_XC_ETIMEDOUT:
        x->lost = 1;
        xc_err(err, err_len, "xnvme-cuda: %s: no completion within %u ms for a read of page "
               "list entry %u (%u commands failed); the GPU queues are retired", x->what,
               x->timeout_ms, st.index, st.failed);
        return -ETIMEDOUT;
    case FR_XC_ENVME:
        xc_err(err, err_len, "xnvme-cuda: %s: NVMe read of page list entry %u failed with "
               "status type %u code 0x%02x (%u commands failed)", x->what, st.index,
               st.nvme_status >> 8, st.nvme_status & 0xff, st.failed);
        return -EIO;
    case FR_XC_EBADREQ:
        xc_err(err, err_len, "xnvme-cuda: %s: page list entry %u names a page beyond the store "
               "(%llu pages) or a slot beyond the cache (%u slots)", x->what, st.index,
               (unsigned long long)x->geom.pages, x->nslots);
        return -EINVAL;
    default:
        xc_err(err, err_len, "xnvme-cuda: %s: fill reported unknown status %d", x->what,
               st.code);
        return -EIO;
    }
}

void fr_xc_stats_get(const fr_xc *x, fr_xc_stats *out) { *out = x->stats; }

#endif /* FASTREAD_HAVE_XNVME_CUDA */
