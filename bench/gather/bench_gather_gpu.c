/* Timings of fr_store's device path on a real GPU, for the record (never a
 * test): the table. A 100 MB file of 200k rows x 512 B (as in
 * test_gather_gpu), random ids, the median of several gathers each:
 *   hot    1M ids, every page in the HBM cache (1 GiB)
 *   host   1M ids from the page-locked host tier (the whole file)
 *   ring   100k ids through the rings, file in the page cache, GPU cache cold
 *          (a fresh store each time), 64 KiB and 4 KiB pages
 *   cold   as ring with the file dropped from the page cache
 *          (POSIX_FADV_DONTNEED), 100k and 1M ids
 * Each gather's first output is checked byte for byte against the file.
 * Usage: bench_gather_gpu FILE [scenario...] (default: all). With
 * FASTREAD_GATHER_TIMELINE=1 the library prints each gather's timeline. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastread_gather.h"
#include "gpu/gpu.h"

#define ROW 512u
#define ROWS 200000u
#define OFFSET 4096u

static fr_gpu *gpu;
static unsigned char *file_bytes;
static const char *path;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int64_t *random_ids(size_t n, unsigned seed)
{
    int64_t *ids = malloc(n * sizeof(int64_t));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = (int64_t)(x % ROWS);
    }
    return ids;
}

static void make_file(void)
{
    size_t len = OFFSET + (size_t)ROWS * ROW;
    file_bytes = malloc(len);
    FILE *f = fopen(path, "rb");
    if (f && fread(file_bytes, 1, len, f) == len) {
        fclose(f);
        return;
    }
    if (f)
        fclose(f);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        file_bytes[i] = (unsigned char)x;
    }
    f = fopen(path, "wb");
    if (!f || fwrite(file_bytes, 1, len, f) != len) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

static void drop_cache(void)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fdatasync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
        perror("dropping the file from the page cache");
    if (fd >= 0)
        close(fd);
}

static void cfg_init(fr_store_config *c, uint32_t page, uint64_t host)
{
    fr_store_config_init(c);
    c->path = path;
    c->offset = OFFSET;
    c->rows = ROWS;
    c->row_bytes = ROW;
    c->backend = "proxy";
    c->device_id = 0;
    c->page_bytes = page;
    c->cache_bytes = (uint64_t)1 << 30;
    c->host_bytes = host;
    c->timeout_ms = 60000;
}

static fr_store *open_store(const fr_store_config *c)
{
    fr_store *s = NULL;
    char err[FR_ERRLEN];
    if (fr_store_open(c, &s, err, sizeof(err)) != 0) {
        fprintf(stderr, "open: %s\n", err);
        exit(1);
    }
    return s;
}

typedef struct dev_ids {
    uint64_t ids, out;
    int64_t *h;
    size_t n;
} dev_ids;

static void ids_up(dev_ids *d, size_t n, unsigned seed)
{
    d->n = n;
    d->h = random_ids(n, seed);
    if (fr_gpu_alloc(gpu, n * 8, &d->ids) || fr_gpu_alloc(gpu, n * ROW, &d->out) ||
        fr_gpu_copy_to_device(gpu, d->ids, d->h, n * 8)) {
        fprintf(stderr, "device buffers failed\n");
        exit(1);
    }
}

static void ids_free(dev_ids *d)
{
    fr_gpu_free(gpu, d->ids);
    fr_gpu_free(gpu, d->out);
    free(d->h);
}

/* One gather, timed; checked against the file when `check`. */
static double run(fr_store *s, dev_ids *d, int check)
{
    char err[FR_ERRLEN];
    size_t bad = 0;
    double t0 = now_s();
    int rc = fr_store_gather_device(s, d->ids, 8, d->n, d->out, NULL, &bad, err, sizeof(err));
    double t = now_s() - t0;
    if (rc) {
        fprintf(stderr, "gather: %s\n", err);
        exit(1);
    }
    if (check) {
        unsigned char *o = malloc(d->n * ROW);
        size_t wrong = 0;
        if (fr_gpu_copy_from_device(gpu, o, d->out, d->n * ROW) != 0)
            wrong = d->n;
        for (size_t i = 0; i < d->n && !wrong; i++)
            if (memcmp(o + i * ROW, file_bytes + OFFSET + (size_t)d->h[i] * ROW, ROW) != 0)
                wrong++;
        free(o);
        if (wrong) {
            fprintf(stderr, "WRONG ROWS\n");
            exit(1);
        }
    }
    return t;
}

static void report(const char *what, size_t n, double *t, int k)
{
    qsort(t, (size_t)k, sizeof(double), cmp_d);
    double med = t[k / 2];
    printf("%-44s %8.3f ms  %9.2f M rows/s  (min %.3f ms, max %.3f ms, %d runs)\n", what,
           med * 1e3, (double)n / med * 1e-6, t[0] * 1e3, t[k - 1] * 1e3, k);
    fflush(stdout);
}

static void steady(const char *what, uint64_t host, size_t n, int reps)
{
    fr_store_config c;
    cfg_init(&c, 65536, host);
    fr_store *s = open_store(&c);
    dev_ids d;
    ids_up(&d, n, 7);
    run(s, &d, 1); /* fills the cache (hot) and checks */
    run(s, &d, 0);
    double t[32];
    for (int i = 0; i < reps; i++)
        t[i] = run(s, &d, 0);
    report(what, n, t, reps);
    ids_free(&d);
    fr_store_close(s);
}

/* A fresh store each time: the GPU cache starts empty. */
static void fresh(const char *what, uint32_t page, size_t n, int cold, int reps)
{
    double t[32];
    dev_ids d;
    ids_up(&d, n, 11);
    for (int i = 0; i < reps; i++) {
        fr_store_config c;
        cfg_init(&c, page, 0);
        fr_store *s = open_store(&c);
        if (cold)
            drop_cache();
        else if (i == 0) { /* warm the page cache */
            unsigned char *tmp = malloc((size_t)ROWS * ROW);
            int fd = open(path, O_RDONLY);
            if (fd >= 0) {
                if (pread(fd, tmp, (size_t)ROWS * ROW, OFFSET) < 0)
                    perror("warming");
                close(fd);
            }
            free(tmp);
        }
        t[i] = run(s, &d, i == 0);
        fr_store_close(s);
    }
    report(what, n, t, reps);
    ids_free(&d);
}

static int want(int argc, char **argv, const char *name)
{
    if (argc <= 2)
        return 1;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [hot|host|ring|cold]...\n", argv[0]);
        return 2;
    }
    path = argv[1];
    char why[FR_ERRLEN];
    if (fr_gpu_open(0, &gpu, why, sizeof(why)) != 0) {
        fprintf(stderr, "no GPU: %s\n", why);
        return 77;
    }
    make_file();
    if (want(argc, argv, "hot"))
        steady("hot in GPU cache, 1M ids", 0, 1000000, 9);
    if (want(argc, argv, "host"))
        steady("host tier (whole file pinned), 1M ids", UINT64_MAX, 1000000, 9);
    if (want(argc, argv, "ring")) {
        fresh("rings, page cache warm, 64K pages, 100k ids", 65536, 100000, 0, 5);
        fresh("rings, page cache warm, 4K pages, 100k ids", 4096, 100000, 0, 5);
    }
    if (want(argc, argv, "cold")) {
        fresh("cold (fadvise DONTNEED), 64K pages, 100k ids", 65536, 100000, 1, 3);
        fresh("cold (fadvise DONTNEED), 4K pages, 100k ids", 4096, 100000, 1, 3);
        fresh("cold (fadvise DONTNEED), 64K pages, 1M ids", 65536, 1000000, 1, 3);
    }
    fr_gpu_close(gpu);
    free(file_bytes);
    return 0;
}
