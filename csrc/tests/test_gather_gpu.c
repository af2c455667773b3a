/* fr_store's device path on a real GPU (exit 77, skipped, without one): the
 * compiled kernel (NVRTC where found, and the embedded PTX) gathering rows
 * of a generated file, checked byte for byte: misses and evictions with a
 * cache smaller than the working set, hits, many warps missing on one page
 * at once (one read), int32 ids, the host tier (whole file and hot rows),
 * out-of-range ids, a read error and the reset after it, a timeout, close
 * during a gather, concurrent gathers from several threads. Prints (never
 * asserts) rows/s for the host backend and the device path, for the record.
 * Set FR_GPU_TEST_LOG to a directory to keep a log there as well. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastread_gather.h"
#include "gpu/gpu.h"
#include "harness.h"

#define ROW 512u
#define ROWS 200000u
#define PAGE 65536u
#define RPP (PAGE / ROW)
#define OFFSET 4096u

static unsigned char *file_bytes;
static fr_gpu *gpu;
static FILE *log_file;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (log_file) {
        va_start(ap, fmt);
        vfprintf(log_file, fmt, ap);
        va_end(ap);
        fflush(log_file);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void load_file(const char *path, size_t n)
{
    FILE *f = fopen(path, "rb");
    free(file_bytes);
    file_bytes = malloc(n);
    CHECK(f && fread(file_bytes, 1, n, f) == n);
    if (f)
        fclose(f);
}

static void config(fr_store_config *c, const char *path)
{
    fr_store_config_init(c);
    c->path = path;
    c->offset = OFFSET;
    c->rows = ROWS;
    c->row_bytes = ROW;
    c->backend = "proxy";
    c->device_id = 0;
    c->page_bytes = PAGE;
    c->cache_bytes = (uint64_t)256 * PAGE; /* 16 MiB of a 100 MB array */
    c->timeout_ms = 20000;
    c->cache_dir = fr_test_dir();
}

static int64_t *random_ids(size_t n, unsigned seed, uint64_t range)
{
    int64_t *ids = malloc(n * sizeof(int64_t));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = (int64_t)(x % range);
    }
    return ids;
}

/* Gathers on the device and compares every row; returns the gather's rc. */
static int gather(fr_store *s, const int64_t *ids, size_t n, int id_bytes, size_t *bad, char *err,
                  double *secs)
{
    uint64_t d_ids = 0, d_out = 0;
    CHECK(fr_gpu_alloc(gpu, n * 8, &d_ids) == 0);
    CHECK(fr_gpu_alloc(gpu, n * ROW, &d_out) == 0);
    if (id_bytes == 4) {
        int32_t *v = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            v[i] = (int32_t)ids[i];
        CHECK(fr_gpu_copy_to_device(gpu, d_ids, v, n * 4) == 0);
        free(v);
    } else {
        CHECK(fr_gpu_copy_to_device(gpu, d_ids, ids, n * 8) == 0);
    }
    double t0 = now_s();
    int rc = fr_store_gather_device(s, d_ids, id_bytes, n, d_out, NULL, bad, err, FR_ERRLEN);
    if (secs)
        *secs = now_s() - t0;
    if (rc == 0) {
        unsigned char *out = malloc(n * ROW);
        CHECK(fr_gpu_copy_from_device(gpu, out, d_out, n * ROW) == 0);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(out + i * ROW, file_bytes + OFFSET + (size_t)ids[i] * ROW, ROW) != 0) {
                if (!wrong)
                    say("row %zu (id %lld) differs\n", i, (long long)ids[i]);
                wrong++;
            }
        if (wrong) {
            say("%zu of %zu rows differ\n", wrong, n);
            fr_test_failures++;
        }
        free(out);
    }
    fr_gpu_free(gpu, d_ids);
    fr_gpu_free(gpu, d_out);
    return rc;
}

static void print_stats(const char *what, fr_store *s)
{
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    say("  %s: gathers %llu rows %llu hits %llu misses %llu coalesced %llu host_tier %llu reads "
        "%llu bytes %llu evictions %llu\n",
        what, (unsigned long long)st.gathers, (unsigned long long)st.rows,
        (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses,
        (unsigned long long)st.coalesced, (unsigned long long)st.host_tier_rows,
        (unsigned long long)st.storage_reads, (unsigned long long)st.bytes_read,
        (unsigned long long)st.evictions);
}

static fr_store *open_or_fail(fr_store_config *c, const char *what)
{
    fr_store *s = NULL;
    char err[FR_ERRLEN] = "";
    if (fr_store_open(c, &s, err, sizeof(err)) != 0) {
        say("FAIL open (%s): %s\n", what, err);
        fr_test_failures++;
        return NULL;
    }
    say("%s: backend %s, kernel: %s\n", what, fr_store_backend(s), fr_store_kernel_source(s));
    return s;
}

static void test_core(const char *path, const char *kernel_source)
{
    setenv("FASTREAD_KERNEL_SOURCE", kernel_source, 1);
    fr_store_config c;
    config(&c, path);
    char what[64];
    snprintf(what, sizeof(what), "core (%s)", kernel_source);
    fr_store *s = open_or_fail(&c, what);
    unsetenv("FASTREAD_KERNEL_SOURCE");
    if (!s)
        return;
    char err[FR_ERRLEN] = "";
    size_t bad = 0;
    double t;
    /* Many warps missing on one page at once: one read serves them all. */
    int64_t *one = random_ids(8192, 2, RPP);
    for (size_t i = 0; i < 8192; i++)
        one[i] += 5 * RPP;
    int rc = gather(s, one, 8192, 8, &bad, err, &t);
    if (rc)
        say("FAIL one-page gather: %s\n", err);
    CHECK(rc == 0);
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.cache_misses == 1 && st.storage_reads == 1);
    CHECK(st.coalesced + st.cache_hits >= 8192 - 1);
    print_stats("one page, 8192 ids", s);
    free(one);

    /* A working set 6x the cache: misses, evictions; int64 then int32. */
    int64_t *ids = random_ids(100000, 3, ROWS);
    ids[1] = ids[0];
    ids[2] = 0;
    ids[3] = ROWS - 1;
    rc = gather(s, ids, 100000, 8, &bad, err, &t);
    if (rc)
        say("FAIL 100k gather: %s\n", err);
    CHECK(rc == 0);
    say("  100k random ids (cold cache, warm file): %.3f s, %.2f M rows/s\n", t, 0.1 / t);
    rc = gather(s, ids, 100000, 4, &bad, err, &t);
    CHECK(rc == 0);
    fr_store_stats_get(s, &st);
    CHECK(st.evictions > 0 && st.cache_misses > 256);
    print_stats("after 2 x 100k", s);

    /* Hot: ids within 128 pages (fits the 256-page cache), twice. */
    int64_t *hot = random_ids(1000000, 4, 128 * RPP);
    rc = gather(s, hot, 1000000, 8, &bad, err, &t);
    CHECK(rc == 0);
    fr_store_stats before;
    fr_store_stats_get(s, &before);
    rc = gather(s, hot, 1000000, 8, &bad, err, &t);
    CHECK(rc == 0);
    fr_store_stats_get(s, &st);
    CHECK(st.cache_misses == before.cache_misses);
    say("  1M ids hot in the GPU cache: %.4f s, %.1f M rows/s\n", t, 1.0 / t);

    /* Out of range. */
    ids[77] = ROWS;
    ids[99] = -1;
    rc = gather(s, ids, 1000, 8, &bad, err, NULL);
    CHECK(rc == -ERANGE && bad == 77);
    say("  out of range: rc %d bad %zu: %s\n", rc, bad, err);
    ids[77] = 1;
    ids[99] = 2;

    fr_store_memory m;
    fr_store_memory_get(s, &m);
    say("  memory: cache %llu meta %llu host_tier %llu rings %llu staging %llu host %llu\n",
        (unsigned long long)m.device_cache, (unsigned long long)m.device_meta,
        (unsigned long long)m.host_tier, (unsigned long long)m.rings,
        (unsigned long long)m.staging, (unsigned long long)m.host_buffers);
    CHECK(m.device_cache == (uint64_t)256 * PAGE);
    free(ids);
    free(hot);
    fr_store_close(s);
}

static void test_tiers(const char *path)
{
    fr_store_config c;
    config(&c, path);
    c.host_bytes = UINT64_MAX;
    fr_store *s = open_or_fail(&c, "host tier (whole file)");
    if (!s)
        return;
    char err[FR_ERRLEN];
    size_t bad;
    double t;
    int64_t *ids = random_ids(1000000, 6, ROWS);
    CHECK(gather(s, ids, 1000000, 8, &bad, err, &t) == 0);
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.host_tier_rows == 1000000 && st.storage_reads == 0);
    say("  1M ids from the host tier: %.4f s, %.1f M rows/s\n", t, 1.0 / t);
    fr_store_close(s);

    /* The same through the locality order (the counting-sort kernels), with
     * ~100 buckets of 1 MiB: rows still land at their input positions. */
    setenv("FASTREAD_GATHER_ORDER", "on", 1);
    setenv("FASTREAD_GATHER_ORDER_BUCKET_BYTES", "1048576", 1);
    s = open_or_fail(&c, "host tier (whole file, locality order)");
    if (s) {
        CHECK(gather(s, ids, 1000000, 8, &bad, err, &t) == 0);
        say("  1M ids from the host tier in locality order: %.4f s, %.1f M rows/s\n", t, 1.0 / t);
        CHECK(gather(s, ids, 1000000, 4, &bad, err, &t) == 0);
        ids[123457] = -5;
        ids[700001] = ROWS;
        CHECK(gather(s, ids, 1000000, 8, &bad, err, NULL) == -ERANGE);
        CHECK(bad == 123457);
        ids[123457] = 1;
        ids[700001] = 2;
        fr_store_close(s);
    }
    unsetenv("FASTREAD_GATHER_ORDER");
    unsetenv("FASTREAD_GATHER_ORDER_BUCKET_BYTES");

    int64_t hot_ids[1000];
    for (int i = 0; i < 1000; i++)
        hot_ids[i] = i * 7;
    c.host_bytes = 1000 * ROW;
    c.hot_ids = hot_ids;
    c.n_hot = 1000;
    s = open_or_fail(&c, "host tier (hot rows)");
    if (!s) {
        free(ids);
        return;
    }
    int64_t mixed[2048];
    for (int i = 0; i < 2048; i++)
        mixed[i] = i % 2 ? hot_ids[i % 1000] : ids[i];
    CHECK(gather(s, mixed, 2048, 8, &bad, err, NULL) == 0);
    fr_store_stats_get(s, &st);
    CHECK(st.host_tier_rows >= 1024);
    print_stats("hot rows", s);
    fr_store_close(s);
    free(ids);
}

/* Row fetches on the GPU (fr_dev_fetch_rows_warp): a sparse batch over an
 * array 6x the cache reads its rows on their own (auto), every row checked;
 * the same ids by page loads, timed beside it for the record. */
static void test_row_fetches(const char *path)
{
    fr_store_config c;
    config(&c, path);
    char err[FR_ERRLEN];
    size_t bad;
    double t_rows = 0, t_pages = 0;
    fr_store_stats st;
    int64_t *ids = random_ids(20000, 31, ROWS); /* ~13 per page of 128 rows: sparse */
    ids[9] = ids[10];
    unsetenv("FASTREAD_GATHER_FETCH");
    fr_store *s = open_or_fail(&c, "row fetches (auto)");
    if (s) {
        CHECK(gather(s, ids, 20000, 8, &bad, err, &t_rows) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == 20000 && st.cache_misses == 0);
        CHECK(st.coalesced >= 1); /* the duplicate, if its lanes met in one warp */
        CHECK(gather(s, ids, 20000, 4, &bad, err, NULL) == 0);
        fr_store_close(s);
    }
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
    s = open_or_fail(&c, "the same ids by page loads");
    if (s) {
        CHECK(gather(s, ids, 20000, 8, &bad, err, &t_pages) == 0);
        fr_store_close(s);
    }
    say("  20k sparse ids: row fetches %.4f s (%.2f M rows/s), page loads %.4f s (%.2f M rows/s)\n",
        t_rows, t_rows > 0 ? 0.02 / t_rows : 0, t_pages, t_pages > 0 ? 0.02 / t_pages : 0);
    free(ids);
}

static void test_host_backend(const char *path)
{
    fr_store_config c;
    config(&c, path);
    c.backend = "host";
    fr_store *s = open_or_fail(&c, "host backend");
    if (!s)
        return;
    char err[FR_ERRLEN];
    size_t bad;
    double t;
    int64_t *ids = random_ids(1000000, 7, ROWS);
    CHECK(gather(s, ids, 1000000, 8, &bad, err, &t) == 0);
    say("  1M ids, host backend to the GPU: %.4f s, %.1f M rows/s\n", t, 1.0 / t);
    fr_store_close(s);
    free(ids);
}

/* For the record (printed, never asserted): the whole array fits the
 * cache; cold then hot, with 4 KiB and 64 KiB pages. */
static void test_perf(const char *path)
{
    static const uint32_t pages[] = {4096, 65536};
    for (int p = 0; p < 2; p++) {
        fr_store_config c;
        config(&c, path);
        c.page_bytes = pages[p];
        c.cache_bytes = (uint64_t)1 << 30;
        char what[64];
        snprintf(what, sizeof(what), "perf, %u-byte pages, 1 GiB cache", pages[p]);
        fr_store *s = open_or_fail(&c, what);
        if (!s)
            return;
        char err[FR_ERRLEN];
        size_t bad;
        double t;
        int64_t *ids = random_ids(100000, 40 + p, ROWS);
        CHECK(gather(s, ids, 100000, 8, &bad, err, &t) == 0);
        say("  100k ids, cold cache (file in the page cache): %.4f s, %.2f M rows/s\n", t,
            0.1 / t);
        free(ids);
        ids = random_ids(1000000, 50 + p, ROWS);
        CHECK(gather(s, ids, 1000000, 8, &bad, err, &t) == 0);
        say("  1M ids, partly cached: %.4f s, %.2f M rows/s\n", t, 1.0 / t);
        CHECK(gather(s, ids, 1000000, 8, &bad, err, &t) == 0);
        say("  1M ids, hot: %.4f s, %.1f M rows/s\n", t, 1.0 / t);
        CHECK(gather(s, ids, 1000000, 4, &bad, err, &t) == 0);
        say("  1M int32 ids, hot: %.4f s, %.1f M rows/s\n", t, 1.0 / t);
        print_stats(what, s);
        free(ids);
        fr_store_close(s);
    }
}

typedef struct targ {
    fr_store *s;
    unsigned seed;
    int rc;
    char err[FR_ERRLEN];
} targ;

static void *thread_gather(void *p)
{
    targ *a = p;
    int64_t *ids = random_ids(20000, a->seed, ROWS);
    size_t bad;
    a->rc = 0;
    for (int k = 0; k < 3 && a->rc == 0; k++)
        a->rc = gather(a->s, ids, 20000, 8, &bad, a->err, NULL);
    free(ids);
    return NULL;
}

static void test_faults(const char *path)
{
    fr_store_config c;
    config(&c, path);
    char err[FR_ERRLEN];
    size_t bad;
    /* Concurrent gathers from four threads. */
    fr_store *s = open_or_fail(&c, "concurrent");
    if (s) {
        pthread_t th[4];
        targ a[4];
        for (int i = 0; i < 4; i++) {
            a[i].s = s;
            a[i].seed = 20u + (unsigned)i;
            CHECK(pthread_create(&th[i], NULL, thread_gather, &a[i]) == 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            if (a[i].rc)
                say("FAIL concurrent gather %d: %s\n", i, a[i].err);
            CHECK(a[i].rc == 0);
        }
        print_stats("4 threads x 3 x 20k", s);
        /* A read error: the file shrank under the store; then restored. */
        CHECK(truncate(path, OFFSET + 1000 * ROW) == 0);
        int64_t tail[3] = {ROWS - 1, ROWS - 3000, 1};
        int rc = gather(s, tail, 3, 8, &bad, err, NULL);
        say("  file cut short: rc %d: %s\n", rc, err);
        CHECK(rc == -EIO || rc == -ENODATA);
        FILE *f = fopen(path, "r+b");
        CHECK(f && fwrite(file_bytes, 1, OFFSET + (size_t)ROWS * ROW, f) ==
                       OFFSET + (size_t)ROWS * ROW);
        if (f)
            fclose(f);
        rc = gather(s, tail, 3, 8, &bad, err, NULL);
        if (rc)
            say("FAIL after restore: %s\n", err);
        CHECK(rc == 0);
        fr_store_close(s);
    }

    /* A service answering late: the device-side waits time out. */
    setenv("FASTREAD_PROXY_DELAY_US", "500000", 1);
    c.timeout_ms = 100;
    s = open_or_fail(&c, "timeout");
    if (s) {
        int64_t ids[64];
        for (int i = 0; i < 64; i++)
            ids[i] = i * 3001 % ROWS;
        double t0 = now_s();
        int rc = gather(s, ids, 64, 8, &bad, err, NULL);
        say("  timeout: rc %d after %.3f s: %s\n", rc, now_s() - t0, err);
        CHECK(rc == -ETIMEDOUT);
        rc = gather(s, ids, 64, 8, &bad, err, NULL);
        CHECK(rc == -ETIMEDOUT);
        fr_store_close(s);
    }
    /* Close while a kernel waits on the slow service: cancelled, no hang. */
    c.timeout_ms = 60000;
    s = open_or_fail(&c, "close during gather");
    if (s) {
        targ a = {s, 30, 1, ""};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, thread_gather, &a) == 0);
        usleep(300000);
        double t0 = now_s();
        fr_store_close(s);
        pthread_join(th, NULL);
        say("  close during gather: rc %d, close took %.3f s: %s\n", a.rc, now_s() - t0, a.err);
        CHECK(a.rc == -ECANCELED);
    }
    unsetenv("FASTREAD_PROXY_DELAY_US");
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_gpu_probe(0, why, sizeof(why)) != 0) {
        fprintf(stderr, "test_gather_gpu: skipped, no GPU: %s\n", why);
        return 77;
    }
    const char *logdir = getenv("FR_GPU_TEST_LOG");
    if (logdir) {
        char p[1024];
        snprintf(p, sizeof(p), "%s/test_gather_gpu.log", logdir);
        log_file = fopen(p, "w");
    }
    if (fr_gpu_open(0, &gpu, why, sizeof(why)) != 0) {
        say("FAIL: %s\n", why);
        return 1;
    }
    size_t len = OFFSET + (size_t)ROWS * ROW;
    char *path = fr_test_write("gpu_rows.bin", len, 5);
    load_file(path, len);
    /* The cache tests expect page loads; test_row_fetches sets its own. */
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
    test_core(path, "ptx");
    test_core(path, "auto");
    test_tiers(path);
    test_row_fetches(path);
    test_host_backend(path);
    test_perf(path);
    test_faults(path);
    fr_gpu_close(gpu);
    free(path);
    free(file_bytes);
    fr_test_cleanup();
    int rc = fr_test_finish("test_gather_gpu");
    say("test_gather_gpu: %s\n", rc ? "FAILED" : "ok");
    if (log_file)
        fclose(log_file);
    return rc;
}
