/* What the gather device tests share (test_gather_device.c,
 * test_gather_policy.c): the mock driver's counters, a table of ROWS rows
 * of ROW bytes after a 512-byte header, a store config over it, and a
 * gather that checks every row against the file. One test executable
 * includes it once. */
#ifndef FASTREAD_GATHER_DEVICE_FIXTURE_H
#define FASTREAD_GATHER_DEVICE_FIXTURE_H
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gather/device/fastread_device.cuh"
#include "gather/gather_route.h"
#include "fastread_gather.h"
#include "gpu/gpu.h"
#include "harness.h"

#define ROW 256u
#define ROWS 20000u
#define PAGE 4096u

static unsigned char *file_bytes __attribute__((unused));
static long (*live)(const char *) __attribute__((unused));
static fr_gpu *gpu __attribute__((unused));
/* Where the kernel comes from in most tests: the embedded PTX when the
 * build has it (deterministic and quick), else NVRTC if it is here. */
static const char *mode __attribute__((unused));

static inline void set_mode(void) { setenv("FASTREAD_KERNEL_SOURCE", mode, 1); }

static inline void load_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    free(file_bytes);
    file_bytes = malloc((size_t)n);
    CHECK(fread(file_bytes, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
}

static inline void base_config(fr_store_config *c, const char *path)
{
    fr_store_config_init(c);
    c->path = path;
    c->offset = 512;
    c->rows = ROWS;
    c->row_bytes = ROW;
    c->backend = "proxy";
    c->device_id = 0;
    c->page_bytes = PAGE;
    c->cache_bytes = 64 * PAGE; /* 64 pages of 1250: evictions */
    c->ring_entries = 16;
    c->threads = 2;
    c->timeout_ms = 5000 * fr_test_slowdown();
    c->cache_dir = fr_test_dir();
}

static inline uint64_t dev_alloc(size_t n)
{
    uint64_t p = 0;
    CHECK(fr_gpu_alloc(gpu, n, &p) == 0);
    return p;
}

/* Gathers ids (int64) through the device path and checks every row. */
static inline int gather_check(fr_store *s, const int64_t *ids, size_t n, int id_bytes, char *err,
                        size_t *bad)
{
    uint64_t d_ids = dev_alloc(n * 8), d_out = dev_alloc(n * ROW);
    if (id_bytes == 4) {
        int32_t *small = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            small[i] = (int32_t)ids[i];
        fr_gpu_copy_to_device(gpu, d_ids, small, n * 4);
        free(small);
    } else {
        fr_gpu_copy_to_device(gpu, d_ids, ids, n * 8);
    }
    int rc = fr_store_gather_device(s, d_ids, id_bytes, n, d_out, NULL, bad, err, FR_ERRLEN);
    if (rc == 0) {
        unsigned char *out = malloc(n * ROW);
        fr_gpu_copy_from_device(gpu, out, d_out, n * ROW);
        for (size_t i = 0; i < n; i++) {
            if (memcmp(out + i * ROW, file_bytes + 512 + (size_t)ids[i] * ROW, ROW) != 0) {
                fprintf(stderr, "row %zu (id %lld) differs\n", i, (long long)ids[i]);
                fr_test_failures++;
                break;
            }
        }
        free(out);
    }
    fr_gpu_free(gpu, d_ids);
    fr_gpu_free(gpu, d_out);
    return rc;
}

static inline int64_t *random_ids(size_t n, unsigned seed)
{
    int64_t *ids = malloc(n * sizeof(int64_t));
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        ids[i] = x % ROWS;
    }
    return ids;
}

/* Drops the file from the page cache (written back first); 1 when mincore
 * then finds its pages gone, 0 where that cannot be (tmpfs). */
static inline int drop_from_page_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    off_t len = lseek(fd, 0, SEEK_END);
    (void)fdatasync(fd);
    int dropped = 0;
    if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 && len > 0) {
        void *m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) {
            size_t pages = ((size_t)len + 4095) / 4096, in = 0;
            unsigned char *vec = malloc(pages);
            if (vec && mincore(m, (size_t)len, vec) == 0)
                for (size_t i = 0; i < pages; i++)
                    in += vec[i] & 1;
            dropped = vec && in * 10 < pages;
            free(vec);
            munmap(m, (size_t)len);
        }
    }
    close(fd);
    return dropped;
}

/* The start of a test: the mock driver found (else exit status 77), GPU 0
 * opened, the table written and loaded, the kernel's source chosen (the
 * embedded PTX when the build has it, else NVRTC). 0, or the status main
 * returns. *allocs0 and *pins0: the driver's counts to end with. */
static inline int fixture_begin(const char *name, char **path, long *allocs0, long *pins0)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    live = lib ? (long (*)(const char *))dlsym(lib, "mock_cuda_live") : NULL;
    if (!live) {
        fprintf(stderr, "%s: needs the mock CUDA driver (LD_LIBRARY_PATH)\n", name);
        return 77;
    }
    char err[FR_ERRLEN];
    if (fr_gpu_open(0, &gpu, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    *allocs0 = live("allocs");
    *pins0 = live("pins");
    *path = fr_test_write("rows.bin", 512 + ROWS * ROW, 11);
    load_file(*path);
#ifdef FASTREAD_TEST_HAVE_PTX
    mode = "ptx";
#else
    mode = "nvrtc";
#endif
    set_mode();
    return 0;
}

/* Whether a store opens here (a kernel from PTX or NVRTC); if not, says so
 * and checks that the error names the missing piece. */
static inline int fixture_has_kernel(const char *name, const char *path)
{
    char err[FR_ERRLEN];
    fr_store_config c;
    base_config(&c, path);
    fr_store *probe = NULL;
    if (fr_store_open(&c, &probe, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: no kernel here (%s); gathers not tested\n", name, err);
        CHECK(strstr(err, "no PTX built in") != NULL || strstr(err, "NVRTC not found") != NULL);
        return 0;
    }
    fr_store_close(probe);
    return 1;
}

/* The end of a test: with `gathered`, no driver object left behind and
 * kernels launched; then everything closed. main's status (77 when
 * nothing could be gathered and nothing failed). */
static inline int fixture_end(const char *name, char *path, long allocs0, long pins0,
                              int gathered)
{
    if (gathered) {
        CHECK(live("allocs") == allocs0);
        CHECK(live("pins") == pins0);
        CHECK(live("hostallocs") == 0);
        CHECK(live("modules") == 0);
        CHECK(live("launches") > 0);
    }
    fr_gpu_close(gpu);
    free(path);
    free(file_bytes);
    fr_test_cleanup();
    int rc = fr_test_finish(name);
    return rc || gathered ? rc : 77;
}

#endif
