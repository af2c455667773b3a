/*
 * Run-time compilation of the core's CUDA kernels (nvrtc.h).
 *
 * NVRTC is dlopen'ed like the driver: the toolkit's libnvrtc.so.13/.12,
 * or the `nvidia-cuda-nvrtc` wheel's (the Python layer passes its lib dir,
 * or $FASTREAD_NVRTC names a file or directory). A kernel is compiled to
 * a cubin for the device's exact compute capability and kept in the cache
 * directory under a name that hashes everything that shapes it (source,
 * options, architecture, NVRTC version): a changed source or NVRTC is a
 * new file, never a stale kernel. Files are written to a temporary name and
 * renamed, so processes compiling at once never read half a file.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base.h"
#include "gpu/nvrtc.h"

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

typedef struct nvrtc_api {
    nvrtcResult (*nvrtcVersion)(int *, int *);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                      const char *const *, const char *const *);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
    const char *(*nvrtcGetErrorString)(nvrtcResult);
} nvrtc_api;

/* NVRTC and its builtins are opened RTLD_NODELETE: our dlclose drops our
 * reference, but they stay loaded for the process, and the next store's
 * dlopen finds them so. NVRTC links libstdc++ statically, and every load of
 * it allocates that library's emergency exception pool (72,704 bytes) that
 * an unload never frees: under ASan on the H200, test_gather_gpu's 11 store
 * opens leaked 11 of them. */
#define NVRTC_DLOPEN_FLAGS (RTLD_NOW | RTLD_NODELETE)

static void *try_open(const char *path, char *tried, size_t tried_len)
{
    void *h = dlopen(path, NVRTC_DLOPEN_FLAGS | RTLD_LOCAL);
    if (!h) {
        size_t used = strlen(tried);
        snprintf(tried + used, tried_len - used, "%s%s", used ? "; " : "", path);
    }
    return h;
}

/* NVRTC loads libnvrtc-builtins by soname; outside the loader's search path
 * (a wheel's lib dir) it finds it only if it is already loaded, so load the
 * one beside it first. Its handle is kept with NVRTC's (closed after it). */
static void *preload_builtins(const char *dir)
{
    static const char *const names[] = {"libnvrtc-builtins.so.13.0", "libnvrtc-builtins.so.13",
                                        "libnvrtc-builtins.so.12.9", "libnvrtc-builtins.so.12.8",
                                        "libnvrtc-builtins.so.12.6", "libnvrtc-builtins.so.12.4",
                                        "libnvrtc-builtins.so.12", "libnvrtc-builtins.so", NULL};
    for (size_t i = 0; names[i]; i++) {
        char p[4096];
        int len = snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        if (len < 0 || (size_t)len >= sizeof(p) || access(p, F_OK) != 0)
            continue; /* a path too long for the buffer names no file */
        void *h = dlopen(p, NVRTC_DLOPEN_FLAGS | RTLD_GLOBAL);
        if (h)
            return h;
    }
    return NULL;
}

/* A file, or a directory holding libnvrtc.so*. *builtins: see preload_builtins. */
static void *open_named(const char *where, void **builtins, char *tried, size_t tried_len)
{
    struct stat st;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", where);
    int is_dir = stat(where, &st) == 0 && S_ISDIR(st.st_mode);
    if (!is_dir) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof(dir), ".");
    }
    if (!*builtins)
        *builtins = preload_builtins(dir);
    if (is_dir) {
        static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
        for (size_t i = 0; i < 3; i++) {
            char p[4096];
            snprintf(p, sizeof(p), "%s/%s", where, names[i]);
            if (access(p, F_OK) != 0)
                continue;
            void *h = try_open(p, tried, tried_len);
            if (h)
                return h;
        }
        size_t used = strlen(tried);
        snprintf(tried + used, tried_len - used, "%s%s/libnvrtc.so*", used ? "; " : "", where);
        return NULL;
    }
    return try_open(where, tried, tried_len);
}

static void *open_nvrtc(const char *path, void **builtins, char *tried, size_t tried_len)
{
    tried[0] = 0;
    void *h = NULL;
    if (path && path[0]) /* named: that one or none, never a surprise */
        return open_named(path, builtins, tried, tried_len);
    const char *env = getenv("FASTREAD_NVRTC");
    if (env && env[0] && (h = open_named(env, builtins, tried, tried_len)))
        return h;
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                        "/usr/local/cuda/lib64/libnvrtc.so", NULL};
    for (size_t i = 0; names[i]; i++)
        if ((h = try_open(names[i], tried, tried_len)))
            return h;
    return NULL;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* The cache directory, created if needed; 0 or -errno. */
static int cache_dir(const char *dir, char *out, size_t out_len)
{
    const char *env = getenv("FASTREAD_CACHE_DIR");
    if (dir && dir[0])
        snprintf(out, out_len, "%s", dir);
    else if (env && env[0])
        snprintf(out, out_len, "%s", env);
    else {
        const char *home = getenv("HOME");
        if (!home || !home[0])
            return -ENOENT;
        snprintf(out, out_len, "%s/.cache/fastread", home);
    }
    /* mkdir -p */
    char p[4096];
    snprintf(p, sizeof(p), "%s", out);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return -errno;
    return access(p, W_OK) == 0 ? 0 : -errno;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = 0;
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

/* Writes to a temporary file and renames it into place: readers see the
 * old file, no file, or the whole new one. Failure only costs the cache. */
static void write_atomic(const char *path, const void *data, size_t len)
{
    /* A name of its own (mkstemp): two threads of one process compiling the
     * same program must not truncate each other's file mid-rename. */
    char tmp[4200];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp))
        return;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return;
    (void)fchmod(fd, 0644); /* mkstemp makes it 0600; the cache is shared like the rest */
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    int ok = done == len && fsync(fd) == 0;
    if (close(fd) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

int fr_nvrtc_load_image(fr_gpu *gpu, const void *image, const char *function, void **module,
                        void **fn)
{
    int rc = fr_gpu_module_load(gpu, image, module);
    if (rc)
        return rc;
    rc = fr_gpu_module_function(gpu, *module, function, fn);
    if (rc) {
        fr_gpu_module_unload(gpu, *module);
        *module = NULL;
    }
    return rc;
}

int fr_nvrtc_device_cc(fr_gpu *gpu, int *cc, char *err, size_t err_len)
{
    int major = 0, minor = 0;
    int rc = fr_gpu_attribute(gpu, FR_CU_ATTR_CC_MAJOR, &major);
    if (rc == 0)
        rc = fr_gpu_attribute(gpu, FR_CU_ATTR_CC_MINOR, &minor);
    if (rc) {
        fr_gpu_last_error(gpu, err, err_len);
        return rc;
    }
    *cc = major * 10 + minor;
    return 0;
}

static int compile_loaded(fr_gpu *gpu, const fr_nvrtc_program *p, int cc, void *lib,
                          void **module, void **fn, char *how, size_t how_len, char *err,
                          size_t err_len)
{
    nvrtc_api n;
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"nvrtcVersion", (void **)&n.nvrtcVersion},
        {"nvrtcCreateProgram", (void **)&n.nvrtcCreateProgram},
        {"nvrtcCompileProgram", (void **)&n.nvrtcCompileProgram},
        {"nvrtcGetProgramLogSize", (void **)&n.nvrtcGetProgramLogSize},
        {"nvrtcGetProgramLog", (void **)&n.nvrtcGetProgramLog},
        {"nvrtcGetCUBINSize", (void **)&n.nvrtcGetCUBINSize},
        {"nvrtcGetCUBIN", (void **)&n.nvrtcGetCUBIN},
        {"nvrtcDestroyProgram", (void **)&n.nvrtcDestroyProgram},
        {"nvrtcGetErrorString", (void **)&n.nvrtcGetErrorString},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            fr_set_err(err, err_len, "NVRTC has no %s (older than CUDA 11.1?)", syms[i].name);
            return -ENOSYS;
        }
    }
    int major = 0, minor = 0;
    n.nvrtcVersion(&major, &minor);
    const char *src = p->source;
    char arch[48];
    snprintf(arch, sizeof(arch), "--gpu-architecture=sm_%d", cc);
    const char *opts[] = {arch, "--std=c++17", "-default-device"};
    const int nopts = 3;
    uint64_t h = 14695981039346656037ull;
    h = fnv1a(h, src, strlen(src));
    for (int i = 0; i < nopts; i++)
        h = fnv1a(h, opts[i], strlen(opts[i]) + 1);
    h = fnv1a(h, &major, sizeof(major));
    h = fnv1a(h, &minor, sizeof(minor));
    char dir[4096], path[4200] = "";
    int have_dir = cache_dir(p->cache_dir, dir, sizeof(dir)) == 0;
    if (have_dir) {
        snprintf(path, sizeof(path), "%s/%s-%016llx-sm%d.cubin", dir, p->cache_prefix,
                 (unsigned long long)h, cc);
        size_t len = 0;
        char *img = read_file(path, &len);
        if (img) {
            int rc = fr_nvrtc_load_image(gpu, img, p->function, module, fn);
            free(img);
            if (rc == 0) {
                snprintf(how, how_len, "cached cubin %s", path);
                return 0;
            }
            unlink(path); /* unusable (truncated, other driver): compile again */
        }
    }
    nvrtcProgram prog = NULL;
    nvrtcResult r = n.nvrtcCreateProgram(&prog, src, p->file_name, 0, NULL, NULL);
    if (r != 0) {
        fr_set_err(err, err_len, "nvrtcCreateProgram: %s", n.nvrtcGetErrorString(r));
        return -EIO;
    }
    r = n.nvrtcCompileProgram(prog, nopts, opts);
    int rc = 0;
    if (r != 0) {
        size_t log_len = 0;
        char log[1024] = "";
        if (n.nvrtcGetProgramLogSize(prog, &log_len) == 0 && log_len > 0) {
            char *full = malloc(log_len + 1);
            if (full && n.nvrtcGetProgramLog(prog, full) == 0) {
                full[log_len] = 0;
                snprintf(log, sizeof(log), "%s", full);
            }
            free(full);
        }
        fr_set_err(err, err_len, "NVRTC %d.%d could not compile %s for sm_%d: %s: %s", major,
                   minor, p->what, cc, n.nvrtcGetErrorString(r), log);
        rc = -EIO;
    }
    char *cubin = NULL;
    size_t cubin_len = 0;
    if (rc == 0 && (n.nvrtcGetCUBINSize(prog, &cubin_len) != 0 || cubin_len == 0 ||
                    !(cubin = malloc(cubin_len)) || n.nvrtcGetCUBIN(prog, cubin) != 0)) {
        fr_set_err(err, err_len, "NVRTC %d.%d gave no cubin for sm_%d", major, minor, cc);
        rc = -EIO;
    }
    n.nvrtcDestroyProgram(&prog);
    if (rc == 0) {
        if (have_dir)
            write_atomic(path, cubin, cubin_len);
        rc = fr_nvrtc_load_image(gpu, cubin, p->function, module, fn);
        if (rc)
            fr_gpu_last_error(gpu, err, err_len);
        else
            snprintf(how, how_len, "NVRTC %d.%d, sm_%d%s%s", major, minor, cc,
                     have_dir ? ", cached in " : "", have_dir ? dir : "");
    }
    free(cubin);
    return rc;
}

int fr_nvrtc_load(fr_gpu *gpu, const fr_nvrtc_program *p, int cc, void **module, void **fn,
                  char *how, size_t how_len, char *tried, size_t tried_len, char *err,
                  size_t err_len)
{
    *module = NULL;
    *fn = NULL;
    void *builtins = NULL;
    void *lib = open_nvrtc(p->nvrtc_path, &builtins, tried, tried_len);
    if (!lib) {
        if (builtins)
            dlclose(builtins);
        return -ENOENT;
    }
    int rc = compile_loaded(gpu, p, cc, lib, module, fn, how, how_len, err, err_len);
    dlclose(lib);
    if (builtins)
        dlclose(builtins);
    return rc;
}
