/*
 * xnvme: byte ranges of one device or image file through xNVMe's queues.
 *
 * The context opens the device once (xnvme_dev_open with the be/async/mem/
 * direct options of engine_args) and keeps it, with one xnvme_queue of
 * `qdepth` commands, until a call names another path (or a regular file
 * behind the same path changed). One call reads every range of a batch:
 * each range becomes whole logical blocks read with xnvme_nvm_read (LBA
 * addressing, so regular files, block devices and NVMe character devices
 * all work), split at the device's maximum transfer size, straight into the
 * arena (or through xnvme_buf_alloc'd bounce buffers when the memory backend
 * is not plain host memory). A sample points at its first byte inside the
 * blocks read, so offsets and lengths need no alignment; its length is the
 * range clamped to the device's end.
 *
 * Also here: the engine_args parser, the stack checks and the probe both
 * xNVMe engines share (declared again in engine_xnvme_file.c). Tested
 * against xNVMe 0.7.5 (with and without libaio) and xNVMe main (d835467),
 * which still calls itself 0.7.5 but picks stacks differently: see
 * fr_xnvme_apply_opts and fr_xnvme_probe.
 *
 * Thread-safety: a context is used by one thread at a time (engine.h); the
 * shared helpers keep no state (the library's libconf is looked up anew).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <libxnvme.h>
#include <linux/nvme_ioctl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/engine_args.h"
#include "engines/engine.h"
#include "engines/io_common.h"
#include "engines/xnvme/xnvme_path.h"

#ifndef FASTREAD_XNVME_BUILD_VERSION
#define FASTREAD_XNVME_BUILD_VERSION "unknown"
#endif

/* ------------------------------------------------ shared with xnvme-file */

typedef struct fr_xnvme_args {
    char be[24], async[24], sync[24], admin[24], mem[24];
    int direct;       /* -1: follow cfg->o_direct */
    unsigned qdepth;  /* queue capacity (power of two); 0: engine default */
    int bounce;       /* -1: when the memory backend needs it */
    int queue;        /* xnvme-file: 0 = synchronous xnvme_file_pread, no queue */
    unsigned inflight; /* xnvme-file: files in flight per thread (0: from queue_depth) */
    unsigned nsid;    /* xnvme: namespace (0: the device's) */
} fr_xnvme_args;

int fr_xnvme_parse_args(const char *engine, const char *s, int ranges, fr_xnvme_args *a,
                        char *err, size_t err_len);
int fr_xnvme_check_stack(const char *engine, const fr_xnvme_args *a, int files_only, char *err,
                         size_t err_len);
int fr_xnvme_file_stack_error(const fr_xnvme_args *a);
int fr_xnvme_try_file(const char *engine, const fr_xnvme_args *a, char *err, size_t err_len);
void fr_xnvme_apply_opts(const fr_xnvme_args *a, int direct, const char *path, mode_t type,
                         struct xnvme_opts *o);
int fr_xnvme_probe(const char *engine, char *why, size_t why_len);

/* xNVMe's async engines by name: a choice's index is its place in ASYNC_NAMES. */
#define ASYNC_CHOICES "io_uring|io_uring_cmd|libaio|thrpool|posix|emu|nil"
static const char *const ASYNC_NAMES[] = {"io_uring", "io_uring_cmd", "libaio", "thrpool",
                                          "posix", "emu", "nil"};

/* engine_args of both xNVMe engines (`ranges`: xnvme, else xnvme-file),
 * parsed by core/engine_args.c: be, async, sync, admin, mem (names; async
 * one of xNVMe's), direct=0|1, qdepth (a power of two in 1..2048); xnvme
 * also bounce=0|1 and nsid, xnvme-file queue=0|1 and inflight (1..4096). */
int fr_xnvme_parse_args(const char *engine, const char *s, int ranges, fr_xnvme_args *a,
                        char *err, size_t err_len)
{
    memset(a, 0, sizeof(*a));
    long long direct = -1, bounce = -1, queue = 1, qdepth = 0, inflight = 0, nsid = 0;
    int async = -1;
    fr_arg_spec specs[9] = {
        {.key = "be", .kind = FR_ARG_STR, .out = a->be, .min = 1, .max = sizeof(a->be)},
        {.key = "async", .kind = FR_ARG_CHOICE, .out = &async, .choices = ASYNC_CHOICES},
        {.key = "sync", .kind = FR_ARG_STR, .out = a->sync, .min = 1, .max = sizeof(a->sync)},
        {.key = "admin", .kind = FR_ARG_STR, .out = a->admin, .min = 1, .max = sizeof(a->admin)},
        {.key = "mem", .kind = FR_ARG_STR, .out = a->mem, .min = 1, .max = sizeof(a->mem)},
        {.key = "direct", .kind = FR_ARG_INT, .out = &direct, .min = 0, .max = 1},
        {.key = "qdepth", .kind = FR_ARG_INT, .out = &qdepth, .min = 1, .max = 2048},
    };
    size_t n = 7;
    if (ranges) {
        specs[n++] = (fr_arg_spec){.key = "bounce", .kind = FR_ARG_INT, .out = &bounce, .max = 1};
        specs[n++] = (fr_arg_spec){.key = "nsid", .kind = FR_ARG_INT, .out = &nsid,
                                   .max = 0xFFFFFFFFLL};
    } else {
        specs[n++] = (fr_arg_spec){.key = "queue", .kind = FR_ARG_INT, .out = &queue, .max = 1};
        specs[n++] = (fr_arg_spec){.key = "inflight", .kind = FR_ARG_INT, .out = &inflight,
                                   .min = 1, .max = 4096};
    }
    int rc = fr_args_parse(engine, s, specs, n, err, err_len);
    if (rc)
        return rc;
    /* xnvme_queue_init wants a power of two. */
    if (qdepth & (qdepth - 1)) {
        fr_set_err(err, err_len, "%s: engine_args qdepth=%lld is not a power of two in 1..2048",
                   engine, qdepth);
        return -EINVAL;
    }
    if (async >= 0)
        snprintf(a->async, sizeof(a->async), "%s", ASYNC_NAMES[async]);
    a->direct = (int)direct;
    a->qdepth = (unsigned)qdepth;
    a->bounce = (int)bounce;
    a->queue = (int)queue;
    a->inflight = (unsigned)inflight;
    a->nsid = (unsigned)nsid;
    return 0;
}

/* The loaded libxnvme's build configuration, lines such as
 * "conf: XNVME_BE_LINUX_LIBAIO_ENABLED". xNVMe 0.7.5 exports them as the
 * array `xnvme_libconf`, its development line (main, which still calls
 * itself 0.7.5) through `xnvme_libconf_get()`. Both are looked up by name in
 * the library already loaded (RTLD_NOLOAD), so fastread links no symbol one
 * of them lacks. *api_main: 1 for xnvme_libconf_get, 0 for the array, -1 when
 * neither is found (then NULL is returned). */
struct fr_libconf_main {
    const char **entries; /* struct xnvme_libconf of main */
};

static const char *const *lib_conf(int *api_main)
{
    *api_main = -1;
    int (*ver)(void) = xnvme_ver_major;
    void *addr;
    memcpy(&addr, &ver, sizeof(addr)); /* a function's address, as dladdr wants it */
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname)
        return NULL;
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return NULL; /* linked statically: no library to ask */
    const char *const *entries = NULL;
    void *sym = dlsym(h, "xnvme_libconf_get");
    if (sym) {
        const struct fr_libconf_main *(*get)(void);
        memcpy(&get, &sym, sizeof(get));
        const struct fr_libconf_main *conf = get();
        entries = conf ? (const char *const *)conf->entries : NULL;
        *api_main = 1;
    } else if ((sym = dlsym(h, "xnvme_libconf")) != NULL) {
        entries = sym;
        *api_main = 0;
    }
    /* Drops only the reference RTLD_NOLOAD took: the library stays loaded
     * (fastread links it), and so do the entries. */
    dlclose(h);
    return entries;
}

/* 1 if the loaded libxnvme was built with `conf` (e.g. "XNVME_BE_LINUX_
 * LIBAIO_ENABLED"), 0 if not, -1 if its configuration cannot be read. */
static int lib_has(const char *conf)
{
    int api_main;
    const char *const *entries = lib_conf(&api_main);
    if (!entries)
        return -1;
    for (size_t i = 0; entries[i]; i++)
        if (strncmp(entries[i], "conf: ", 6) == 0 && strcmp(entries[i] + 6, conf) == 0)
            return 1;
    return 0;
}

/* The async interfaces of xNVMe's linux backend, and the build switch each
 * needs. nil is not here: it completes commands without doing any I/O. */
static const struct {
    const char *name, *conf, *needs;
} ASYNC_CONF[] = {
    {"emu", "XNVME_BE_CBI_ASYNC_EMU_ENABLED", "its cbi_async_emu option"},
    {"io_uring", "XNVME_BE_LINUX_LIBURING_ENABLED", "liburing"},
    {"io_uring_cmd", "XNVME_BE_LINUX_LIBURING_ENABLED", "liburing"},
    {"libaio", "XNVME_BE_LINUX_LIBAIO_ENABLED", "libaio (libaio.h)"},
    {"posix", "XNVME_BE_CBI_ASYNC_POSIX_ENABLED", "its cbi_async_posix option"},
    {"thrpool", "XNVME_BE_CBI_ASYNC_THRPOOL_ENABLED", "its cbi_async_thrpool option"},
};

/* Whether regular files can take the stack in `a`: xNVMe reads them only
 * with sync=psync and the file_as_ns admin shim. The nvme and block
 * interfaces issue ioctls meant for devices (xNVMe main then divides by the
 * zero block size of a file: SIGFPE), and io_uring_cmd is NVMe passthrough.
 * 0, or -ENOTSUP with the reason in err. */
static int file_stack_ok(const char *engine, const fr_xnvme_args *a, char *err, size_t err_len)
{
    const char *key = NULL, *val = NULL;
    if (a->sync[0] && strcmp(a->sync, "psync") != 0)
        key = "sync", val = a->sync;
    else if (a->admin[0] && strcmp(a->admin, "file_as_ns") != 0)
        key = "admin", val = a->admin;
    else if (strcmp(a->async, "io_uring_cmd") == 0)
        key = "async", val = a->async;
    if (!key)
        return 0;
    fr_set_err(err, err_len,
               "%s: %s=%s cannot read regular files (it is for NVMe and block devices; xNVMe "
               "reads files with sync=psync, admin=file_as_ns and async emu, io_uring, libaio, "
               "posix or thrpool)", engine, key, val);
    return -ENOTSUP;
}

int fr_xnvme_file_stack_error(const fr_xnvme_args *a)
{
    char why[8];
    return file_stack_ok("", a, why, sizeof(why));
}

int fr_xnvme_check_stack(const char *engine, const fr_xnvme_args *a, int files_only, char *err,
                         size_t err_len)
{
    if (strcmp(a->async, "nil") == 0) {
        fr_set_err(err, err_len, "%s: async=nil completes every command without reading "
                   "anything: nothing would be read", engine);
        return -EINVAL;
    }
    if (files_only) {
        int rc = file_stack_ok(engine, a, err, err_len);
        if (rc)
            return rc;
    }
    for (size_t i = 0; a->async[0] && i < sizeof(ASYNC_CONF) / sizeof(ASYNC_CONF[0]); i++) {
        if (strcmp(a->async, ASYNC_CONF[i].name) != 0 || lib_has(ASYNC_CONF[i].conf) != 0)
            continue;
        char have[128] = "";
        for (size_t j = 0; j < sizeof(ASYNC_CONF) / sizeof(ASYNC_CONF[0]); j++) {
            if (lib_has(ASYNC_CONF[j].conf) != 1 || strstr(have, ASYNC_CONF[j].name))
                continue;
            size_t used = strlen(have);
            snprintf(have + used, sizeof(have) - used, "%s%s", used ? ", " : "",
                     ASYNC_CONF[j].name);
        }
        fr_set_err(err, err_len, "%s: async=%s is not in the loaded libxnvme (it was built "
                   "without %s); it has: %s", engine, a->async, ASYNC_CONF[i].needs,
                   have[0] ? have : "none of them");
        return -ENOTSUP;
    }
    return 0;
}

/* 1 if the block device at `path` is an NVMe namespace (answers NVMe's
 * namespace-id ioctl, as xNVMe asks it). */
static int is_nvme_namespace(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int nsid = ioctl(fd, NVME_IOCTL_ID);
    close(fd);
    return nsid > 0;
}

void fr_xnvme_apply_opts(const fr_xnvme_args *a, int direct, const char *path, mode_t type,
                         struct xnvme_opts *o)
{
    *o = xnvme_opts_default();
    o->rdonly = 1; /* read-only: the default is rdwr */
    o->rdwr = 0;
    o->wronly = 0;
    o->create = 0;
    o->truncate = 0;
    o->direct = direct ? 1 : 0;
    o->be = a->be[0] ? a->be : NULL;
    o->async = a->async[0] ? a->async : NULL;
    o->sync = a->sync[0] ? a->sync : NULL;
    o->admin = a->admin[0] ? a->admin : NULL;
    o->mem = a->mem[0] ? a->mem : NULL;
    if (a->nsid)
        o->nsid = a->nsid;
    /* The sync interface that fits what `path` is. xNVMe 0.7.5 picks it
     * itself, but its main line does not once any of async, sync or admin is
     * given: it takes the first stack with that async, whose sync interface
     * sends NVMe ioctls, and a regular file's reads then die of SIGFPE (its
     * block size is 0) or fail. sync=psync selects main's file stacks (the
     * file_as_ns admin shim with them). admin is left to xNVMe: 0.7.5 sets the
     * shim itself and refuses it by name (it is no mixin there). */
    if (S_ISREG(type)) {
        o->sync = o->sync ? o->sync : "psync";
        if (o->admin && strcmp(o->admin, "file_as_ns") == 0)
            o->admin = NULL; /* what both choose; 0.7.5 cannot be told */
    } else if (S_ISBLK(type) && !o->sync) {
        o->sync = is_nvme_namespace(path) ? "nvme" : "block";
    }
}

/* Whether xNVMe opens a 4 KiB memfd (a regular file, through /proc/self/fd)
 * with the options of `a`, as for a file. 1, 0, or -1 when no such trial
 * can be made (no memfd or /proc). */
static int opens_a_file(const fr_xnvme_args *a, int *err_out)
{
    int fd = memfd_create("fastread-xnvme-trial", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    char name[48];
    snprintf(name, sizeof(name), "/proc/self/fd/%d", fd);
    struct stat st;
    int made = ftruncate(fd, 4096) == 0 && stat(name, &st) == 0 && S_ISREG(st.st_mode);
    int ok = -1;
    if (made) {
        struct xnvme_opts o;
        fr_xnvme_apply_opts(a, 0, name, S_IFREG, &o);
        errno = 0;
        struct xnvme_dev *dev = xnvme_dev_open(name, &o);
        *err_out = errno < 0 ? -errno : errno;
        ok = dev != NULL;
        if (dev)
            xnvme_dev_close(dev);
    }
    close(fd);
    return ok;
}

/* Not every async interface has a stack for regular files (xNVMe main reads
 * files with emu, thrpool, io_uring and libaio only; posix there is for NVMe
 * devices), and xNVMe refuses one with a bare ENXIO per file: ask it once,
 * on a memfd, which it is. 0 (also when no trial can be made), or -ENOTSUP
 * with the reason and the async interfaces that do read files. */
int fr_xnvme_try_file(const char *engine, const fr_xnvme_args *a, char *err, size_t err_len)
{
    int e = 0;
    if (opens_a_file(a, &e) != 0)
        return 0;
    char have[128] = "";
    for (size_t j = 0; j < sizeof(ASYNC_CONF) / sizeof(ASYNC_CONF[0]); j++) {
        fr_xnvme_args t = *a;
        int e2 = 0;
        snprintf(t.async, sizeof(t.async), "%s", ASYNC_CONF[j].name);
        if (strcmp(t.async, "io_uring_cmd") == 0 || opens_a_file(&t, &e2) != 1)
            continue;
        size_t used = strlen(have);
        snprintf(have + used, sizeof(have) - used, "%s%s", used ? ", " : "", t.async);
    }
    fr_set_err(err, err_len, "%s: the loaded libxnvme cannot open regular files with "
               "async=%s (xnvme_dev_open: %s); async interfaces it reads files with: %s", engine,
               a->async[0] ? a->async : "(default)", e ? strerror(e) : "failed",
               have[0] ? have : "none");
    return -ENOTSUP;
}

int fr_xnvme_probe(const char *engine, char *why, size_t why_len)
{
    int major = xnvme_ver_major(), minor = xnvme_ver_minor(), patch = xnvme_ver_patch();
    char built[16];
    snprintf(built, sizeof(built), "%d.%d.", major, minor);
    /* struct xnvme_opts and friends change between minor versions: the
     * library loaded must be the one the engines were compiled against. */
    if (strncmp(FASTREAD_XNVME_BUILD_VERSION, built, strlen(built)) != 0) {
        fr_set_err(why, why_len,
                   "%s: built against xNVMe %s but libxnvme %d.%d.%d is loaded (reinstall "
                   "fastread against this xNVMe)", engine, FASTREAD_XNVME_BUILD_VERSION, major,
                   minor, patch);
        return -ENOTSUP;
    }
    /* xNVMe's main line still says 0.7.5, with a larger struct xnvme_opts
     * (returned by value from xnvme_opts_default): tell the two apart by the
     * libconf interface each has. */
    int api_main;
    const char *const *conf = lib_conf(&api_main);
    (void)conf;
#ifdef FASTREAD_XNVME_API_MAIN
    if (api_main >= 0 && api_main != FASTREAD_XNVME_API_MAIN) {
        const char *lines[] = {"xNVMe's 0.7.5 release", "xNVMe's development line (main)"};
        fr_set_err(why, why_len,
                   "%s: built against the headers of %s but the loaded libxnvme is %s "
                   "(both say %d.%d.%d; their structs differ): reinstall fastread against this "
                   "libxnvme", engine, lines[FASTREAD_XNVME_API_MAIN], lines[api_main], major,
                   minor, patch);
        return -ENOTSUP;
    }
#endif
    /* On success the text is the library's version (fastread info shows it). */
    fr_set_err(why, why_len, "xNVMe %d.%d.%d%s (built against %s)", major, minor, patch,
               api_main == 1 ? " (main)" : "", FASTREAD_XNVME_BUILD_VERSION);
    return 0;
}

/* ------------------------------------------------------------- the engine */

#define DEFAULT_QDEPTH 64

typedef struct cmd_rec {
    struct xr *x;
    size_t sample;
    uint64_t slba;
    uint32_t nlb;      /* blocks in this command */
    uint64_t dst;      /* arena offset of the command's first block */
    void *bounce;      /* staging buffer, or NULL */
    int next_free;
} cmd_rec;

typedef struct xr {
    fr_config cfg;
    fr_xnvme_args a;
    int direct;
    /* The open device and what identifies it. */
    char *path;
    int is_file;
    struct stat st;
    struct xnvme_dev *dev;
    /* A path xNVMe cannot take is opened through an alias (xnvme_path.h):
     * the descriptor behind "/proc/self/fd/N", held while the device is. */
    int alias_fd, has_alias;
    struct xnvme_queue *q;
    int file_rc;    /* fr_xnvme_try_file: 0 if regular files can be opened */
    uint32_t nsid;
    uint64_t tbytes;
    size_t lba;     /* logical block bytes */
    size_t align;   /* read granularity: lba, or the O_DIRECT alignment */
    size_t chunk;   /* largest command in bytes */
    int bounce;
    unsigned cap;
    cmd_rec *recs;
    int free_head;
    /* The call in progress. */
    fr_batch *batch;
    int *errs;
    size_t errs_cap;
    long resubmits, reopens, eff_direct;
} xr;

static int xr_probe(char *why, size_t why_len) { return fr_xnvme_probe("xnvme", why, why_len); }

static void close_dev(xr *x)
{
    if (x->recs && x->dev)
        for (unsigned i = 0; i < x->cap; i++)
            if (x->recs[i].bounce)
                xnvme_buf_free(x->dev, x->recs[i].bounce);
    free(x->recs);
    x->recs = NULL;
    if (x->q) {
        int rc = xnvme_queue_term(x->q);
        (void)rc; /* nothing is in flight here; a failing term leaves nothing to undo */
        x->q = NULL;
    }
    if (x->dev)
        xnvme_dev_close(x->dev);
    x->dev = NULL;
    if (x->has_alias)
        close(x->alias_fd);
    x->has_alias = 0;
    free(x->path);
    x->path = NULL;
}

static void xr_close(void *state)
{
    xr *x = state;
    if (!x)
        return;
    close_dev(x);
    free(x->errs);
    free(x);
}

static int xr_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    xr *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    x->cfg = *cfg;
    int rc = fr_xnvme_parse_args("xnvme", cfg->engine_args, 1, &x->a, err, err_len);
    if (rc == 0)
        rc = fr_xnvme_check_stack("xnvme", &x->a, 0, err, err_len);
    if (rc == 0) { /* devices may still be read: a refusal is per file (ensure_dev) */
        char why[FR_ERRLEN];
        x->file_rc = fr_xnvme_file_stack_error(&x->a) ? -ENOTSUP
                                                       : fr_xnvme_try_file("xnvme", &x->a, why,
                                                                           sizeof(why));
    }
    if (rc) {
        free(x);
        return rc;
    }
    x->direct = x->a.direct >= 0 ? x->a.direct : cfg->o_direct;
    x->cap = x->a.qdepth ? x->a.qdepth : DEFAULT_QDEPTH;
    *state = x;
    return 0;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Opens `path` unless it is what is open already. 0 or -errno. */
static int ensure_dev(xr *x, const char *path)
{
    struct stat st;
    int have_st = stat(path, &st) == 0;
    if (x->dev && strcmp(x->path, path) == 0 && (!x->is_file || (have_st && same_file(&st, &x->st))))
        return 0;
    if (x->dev)
        x->reopens++;
    close_dev(x);
    if (have_st && S_ISDIR(st.st_mode))
        return -EISDIR;
    if (have_st && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode) && !S_ISCHR(st.st_mode))
        return -EINVAL; /* a FIFO would block open() */
    if (have_st && S_ISREG(st.st_mode) && x->file_rc)
        return x->file_rc; /* a stack for devices only (fr_xnvme_try_file) */
    if (!have_st && errno != ENOENT)
        return -errno; /* EACCES on a parent, ENAMETOOLONG, ... */
    /* xNVMe refuses paths of 384+ bytes (and reads '?' as URI options)
     * with a bare EINVAL: open those through an alias. */
    char alias[FR_XNVME_PATH_MAX + 1];
    const char *name = path;
    int alias_fd = -1;
    if (have_st && !fr_xnvme_path_ok(path, FR_XNVME_PATH_MAX)) {
        int rc = fr_xnvme_path_alias(path, FR_XNVME_PATH_MAX, alias, sizeof(alias), &alias_fd);
        if (rc)
            return rc; /* -ENAMETOOLONG: no alias reaches it (no /proc) */
        name = alias;
    }
    /* A character device must be an NVMe namespace (/dev/ngXnY): xNVMe 0.7.5
     * opens others, /dev/zero among them, as devices of 0 bytes, and every
     * range would come back empty instead of failing. */
    if (have_st && S_ISCHR(st.st_mode) && !is_nvme_namespace(name)) {
        if (alias_fd >= 0)
            close(alias_fd);
        return -ENODEV;
    }
    struct xnvme_opts o;
    fr_xnvme_apply_opts(&x->a, x->direct, name, have_st ? st.st_mode : 0, &o);
    errno = 0;
    struct xnvme_dev *dev = xnvme_dev_open(name, &o);
    if (!dev) {
        int saved = errno;
        if (alias_fd >= 0)
            close(alias_fd);
        errno = saved;
        /* Without be=linux, later backends overwrite errno (ENOENT reads as
         * EINVAL), and a bad option name can leave it negative. */
        int e = errno < 0 ? -errno : errno;
        if (!have_st)
            return -ENOENT; /* not a path: an SPDK/vfio address xNVMe refused */
        return -(e > 0 && e < 4096 ? e : EIO);
    }
    const struct xnvme_geo *geo = xnvme_dev_get_geo(dev);
    x->dev = dev;
    x->alias_fd = alias_fd;
    x->has_alias = alias_fd >= 0;
    x->path = strdup(path);
    if (!x->path) {
        close_dev(x);
        return -ENOMEM;
    }
    x->is_file = have_st && S_ISREG(st.st_mode);
    if (have_st)
        x->st = st;
    x->nsid = xnvme_dev_get_nsid(dev);
    x->tbytes = geo->tbytes;
    x->lba = geo->lba_nbytes ? geo->lba_nbytes : 512;
    x->eff_direct = xnvme_dev_get_opts(dev)->direct;
    x->align = x->lba;
    if (x->eff_direct && x->cfg.direct_alignment > x->align)
        x->align = x->cfg.direct_alignment;
    size_t chunk = geo->mdts_nbytes ? geo->mdts_nbytes : ((size_t)128 << 10);
    if (chunk > (size_t)65536 * x->lba)
        chunk = (size_t)65536 * x->lba; /* nlb is 16 bits, 0-based */
    chunk -= chunk % x->align;
    x->chunk = chunk ? chunk : x->align;
    const char *mem = xnvme_dev_get_opts(dev)->mem;
    x->bounce = x->a.bounce >= 0 ? x->a.bounce : (mem && strcmp(mem, "posix") != 0);

    int rc = xnvme_queue_init(dev, (uint16_t)x->cap, 0, &x->q);
    if (rc) {
        x->q = NULL;
        close_dev(x);
        return rc < 0 ? rc : -EIO;
    }
    x->recs = calloc(x->cap, sizeof(cmd_rec));
    if (!x->recs) {
        close_dev(x);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < x->cap; i++) {
        x->recs[i].x = x;
        x->recs[i].next_free = (int)i + 1 < (int)x->cap ? (int)i + 1 : -1;
        if (x->bounce) {
            x->recs[i].bounce = xnvme_buf_alloc(dev, x->chunk);
            if (!x->recs[i].bounce) {
                close_dev(x);
                return -ENOMEM;
            }
        }
    }
    x->free_head = 0;
    return 0;
}

/* After a poll of a thread's queues that moved nothing (no completion, no
 * file started or finished; xnvme-file's and xnvme's loops alike): every
 * xNVMe poke returns at once, and the completions of thrpool (xNVMe's
 * worker threads), posix (glibc's aio threads) and a cold io_uring or
 * libaio read come from other threads or the kernel. Poking on without a
 * pause took the CPU they needed: on 2 cores, xnvme-file with thrpool and
 * one file in flight read 222 files/s at 2.4 ms of CPU a file. The first
 * idle polls only spin (a cached read completes within microseconds), the
 * next yield the CPU, then the thread sleeps, from 2 us doubling to 128 us,
 * until something moves. */
void fr_xnvme_idle_pause(unsigned *passes)
{
    unsigned n = *passes;
    if (n < 64)
        (*passes)++;
    if (n < 8)
        return;
    if (n < 24) {
        sched_yield();
        return;
    }
    unsigned shift = n - 24 < 6 ? n - 24 : 6;
    struct timespec ts = {0, (long)(2000u << shift)};
    nanosleep(&ts, NULL); /* EINTR: just poke again */
}

/* Synchronous retry of one command: tells a real error from a short read
 * that a pool thread's stale errno turned into one (see the notes on psync). */
static int read_sync(xr *x, cmd_rec *r, void *dst)
{
    struct xnvme_cmd_ctx ctx = xnvme_cmd_ctx_from_dev(x->dev);
    errno = 0;
    int rc = xnvme_nvm_read(&ctx, x->nsid, r->slba, (uint16_t)(r->nlb - 1), dst, NULL);
    if (rc == 0 && xnvme_cmd_ctx_cpl_status(&ctx))
        rc = -(ctx.cpl.status.sc ? ctx.cpl.status.sc : EIO);
    return rc;
}

static void on_done(struct xnvme_cmd_ctx *ctx, void *arg)
{
    cmd_rec *r = arg;
    xr *x = r->x;
    uint8_t *dst = x->batch->arena.base + r->dst;
    size_t len = (size_t)r->nlb * x->lba;
    int e = 0;
    if (xnvme_cmd_ctx_cpl_status(ctx)) {
        x->resubmits++;
        e = read_sync(x, r, r->bounce ? r->bounce : dst);
    }
    if (e == 0 && r->bounce)
        memcpy(dst, r->bounce, len);
    if (e && !x->errs[r->sample])
        x->errs[r->sample] = -e;
    int rc = xnvme_queue_put_cmd_ctx(ctx->async.queue, ctx);
    (void)rc; /* only fails for a ctx that is not the queue's */
    r->next_free = x->free_head;
    x->free_head = (int)(r - x->recs);
}

/* One poll of the queue, pausing (fr_xnvme_idle_pause) when it completed
 * nothing: 0, or the poll's negative errno. */
static int poke_once(xr *x, unsigned *idle)
{
    errno = 0; /* emu reads inside poke: see the stale-errno note */
    int rc = xnvme_queue_poke(x->q, 0);
    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
        return rc;
    if (rc > 0)
        *idle = 0;
    else
        fr_xnvme_idle_pause(idle);
    return 0;
}

/* Submits one command, reaping completions while the queue is full. */
static int submit(xr *x, size_t sample, uint64_t slba, uint32_t nlb, uint64_t dst)
{
    unsigned idle = 0;
    while (x->free_head < 0) {
        int rc = poke_once(x, &idle);
        if (rc)
            return rc;
    }
    cmd_rec *r = &x->recs[x->free_head];
    x->free_head = r->next_free;
    *r = (cmd_rec){.x = x, .sample = sample, .slba = slba, .nlb = nlb, .dst = dst,
                   .bounce = r->bounce, .next_free = -1};
    for (;;) {
        struct xnvme_cmd_ctx *ctx = xnvme_queue_get_cmd_ctx(x->q);
        if (!ctx)
            return -ENOMEM;
        memset(&ctx->cpl, 0, sizeof(ctx->cpl)); /* pooled ctxs keep the last status */
        xnvme_cmd_ctx_set_cb(ctx, on_done, r);
        void *buf = r->bounce ? r->bounce : x->batch->arena.base + dst;
        int rc = xnvme_nvm_read(ctx, x->nsid, slba, (uint16_t)(nlb - 1), buf, NULL);
        if (rc == 0)
            return 0;
        int prc = xnvme_queue_put_cmd_ctx(x->q, ctx);
        (void)prc;
        if (rc != -EBUSY && rc != -EAGAIN)
            return rc;
        if ((rc = poke_once(x, &idle)))
            return rc;
    }
}

/* xnvme_queue_drain, pausing between polls that complete nothing (see
 * fr_xnvme_idle_pause). 0 or a negative errno. */
static int drain(xr *x)
{
    unsigned idle = 0;
    while (xnvme_queue_get_outstanding(x->q)) {
        int rc = poke_once(x, &idle);
        if (rc)
            return rc;
    }
    return 0;
}

static int xr_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                          fr_batch *batch)
{
    xr *x = state;
    if (n > x->errs_cap) {
        int *e = realloc(x->errs, n * sizeof(*e));
        if (!e)
            return -ENOMEM;
        x->errs = e;
        x->errs_cap = n;
    }
    memset(x->errs, 0, n * sizeof(*x->errs));
    int rc = ensure_dev(x, path);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            batch->samples[i] = (fr_sample){.offset = 0, .length = rc};
        return 0;
    }
    /* Lay out whole blocks; a sample starts where its range does inside them. */
    size_t A = x->align > FR_SAMPLE_ALIGN ? x->align : FR_SAMPLE_ALIGN;
    size_t off = fr_round_up(batch->arena.used, A);
    for (size_t i = 0; i < n; i++) {
        uint64_t o = ranges[i].offset, len = ranges[i].length;
        uint64_t true_len = o >= x->tbytes ? 0 : (len < x->tbytes - o ? len : x->tbytes - o);
        uint64_t a0 = o - o % x->align;
        uint64_t a1 = true_len ? fr_round_up((size_t)(o + true_len), x->align) : a0;
        batch->samples[i].offset = off + (o - a0);
        batch->samples[i].length = (int64_t)true_len;
        off += fr_round_up((size_t)(a1 - a0), A);
    }
    rc = fr_arena_reserve(&batch->arena, off);
    if (rc)
        return rc;
    batch->arena.used = off;
    x->batch = batch;

    for (size_t i = 0; i < n && rc == 0; i++) {
        int64_t len = batch->samples[i].length;
        if (len == 0)
            continue;
        uint64_t o = ranges[i].offset;
        uint64_t a0 = o - o % x->align;
        uint64_t a1 = fr_round_up((size_t)(o + (uint64_t)len), x->align);
        uint64_t base = batch->samples[i].offset - (o - a0);
        for (uint64_t p = a0; p < a1 && rc == 0; p += x->chunk) {
            uint64_t clen = a1 - p < x->chunk ? a1 - p : x->chunk;
            rc = submit(x, i, p / x->lba, (uint32_t)(clen / x->lba), base + (p - a0));
        }
        errno = 0;
        int prc = xnvme_queue_poke(x->q, 0);
        if (prc < 0 && prc != -EAGAIN && prc != -EBUSY && rc == 0)
            rc = prc;
    }
    /* Whatever happened, nothing may land in the arena after we return. */
    int drc = drain(x);
    x->batch = NULL;
    if (rc == 0 && drc < 0)
        rc = drc;
    if (rc) {
        close_dev(x); /* the queue's state is unknown: start afresh next call */
        return rc;
    }
    for (size_t i = 0; i < n; i++)
        if (x->errs[i])
            batch->samples[i].length = x->errs[i];
    return 0;
}

static int xr_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                         size_t n, fr_batch *batch)
{
    (void)state;
    (void)paths;
    (void)size_hints;
    (void)n;
    (void)batch;
    return -ENOTSUP; /* ranges of one device only: use xnvme-file for files */
}

static long xr_stat(const void *state, const char *key)
{
    const xr *x = state;
    if (strcmp(key, "queue_depth") == 0)
        return x->cap;
    if (strcmp(key, "o_direct") == 0)
        return x->dev ? x->eff_direct : x->direct;
    if (strcmp(key, "bounce") == 0)
        return x->bounce;
    if (strcmp(key, "max_transfer") == 0)
        return (long)x->chunk;
    if (strcmp(key, "block_size") == 0)
        return (long)x->lba;
    if (strcmp(key, "resubmits") == 0)
        return x->resubmits;
    if (strcmp(key, "reopens") == 0)
        return x->reopens;
    if (strcmp(key, "file_stack") == 0) /* 0 if regular files can be read, else -errno */
        return x->file_rc;
    if (strcmp(key, "xnvme_version") == 0)
        return xnvme_ver_major() * 10000L + xnvme_ver_minor() * 100L + xnvme_ver_patch();
    return -1;
}

const fr_engine fr_engine_xnvme = {
    .name = "xnvme",
    .probe = xr_probe,
    .open = xr_open,
    .close = xr_close,
    .read_files = xr_read_files,
    .stat = xr_stat,
    .read_ranges = xr_read_ranges,
};
