/* fr_store's host backend (gather.h, gather_host.c): rows in input order
 * for unsorted and duplicated ids, byte for byte against the file, through
 * every range engine, buffered and O_DIRECT (aligned and unaligned row
 * offsets), batches large enough to spread over several threads and chunks;
 * out-of-range ids (-ERANGE and the first bad position); files shorter than
 * the shape (refused at open, naming the path); coalescing counted in the
 * stats; memory reported; device ids/output through the mock CUDA driver;
 * close while a gather runs (cancelled or finished, never hung). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastread_gather.h"
#include "harness.h"

static unsigned char *file_bytes;
static size_t file_len;

static char *make_file(const char *name, size_t len, unsigned seed)
{
    char *path = fr_test_write(name, len, seed);
    FILE *f = fopen(path, "rb");
    free(file_bytes);
    file_bytes = malloc(len);
    CHECK(f && fread(file_bytes, 1, len, f) == len);
    if (f)
        fclose(f);
    file_len = len;
    return path;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* 1 if out holds rows ids[0..n) of the file in order. */
static int rows_match(const unsigned char *out, const int64_t *ids, size_t n, uint64_t offset,
                      uint64_t row_bytes)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(out + i * row_bytes, file_bytes + offset + (uint64_t)ids[i] * row_bytes,
                   row_bytes) != 0) {
            fprintf(stderr, "row %zu (id %lld) differs\n", i, (long long)ids[i]);
            return 0;
        }
    }
    return 1;
}

static fr_store *open_store(const char *path, uint64_t offset, uint64_t rows, uint64_t row_bytes,
                            const char *engine, int o_direct, unsigned threads)
{
    fr_store_config c;
    fr_store_config_init(&c);
    c.path = path;
    c.offset = offset;
    c.rows = rows;
    c.row_bytes = row_bytes;
    c.backend = "host";
    c.engine = engine;
    c.o_direct = o_direct;
    c.threads = threads;
    fr_store *s = NULL;
    char err[FR_ERRLEN] = "";
    int rc = fr_store_open(&c, &s, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "open %s engine=%s direct=%d: %s\n", path, engine, o_direct, err);
        fr_test_failures++;
    }
    return s;
}

static void check_gathers(const char *path, uint64_t offset, uint64_t rows, uint64_t row_bytes,
                          const char *engine, int o_direct, unsigned threads)
{
    fr_store *s = open_store(path, offset, rows, row_bytes, engine, o_direct, threads);
    if (!s)
        return;
    CHECK(strcmp(fr_store_backend(s), "host") == 0);
    static const size_t sizes[] = {1, 7, 64, 1000, 60000};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        int64_t *ids = malloc(n * sizeof(*ids));
        unsigned char *out = malloc(n * row_bytes);
        for (size_t i = 0; i < n; i++)
            ids[i] = (int64_t)(next_rand() % rows);
        if (n > 4) { /* a duplicate, the first and last rows */
            ids[1] = ids[0];
            ids[2] = 0;
            ids[3] = (int64_t)rows - 1;
        }
        char err[FR_ERRLEN] = "";
        int rc = fr_store_gather_host(s, ids, n, out, NULL, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "%s direct=%d n=%zu: %s\n", engine, o_direct, n, err);
            fr_test_failures++;
        } else {
            CHECK(rows_match(out, ids, n, offset, row_bytes));
        }
        free(ids);
        free(out);
    }
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.gathers == 5);
    CHECK(st.rows == 1 + 7 + 64 + 1000 + 60000);
    CHECK(st.storage_reads > 0 && st.storage_reads <= st.rows);
    CHECK(st.bytes_read >= st.storage_reads * row_bytes);
    CHECK(st.cache_hits == 0 && st.host_tier_rows == 0);
    fr_store_memory m;
    fr_store_memory_get(s, &m);
    CHECK(m.host_buffers >= 60000 * 16); /* the sort buffers at least */
    CHECK(m.device_cache == 0 && m.staging == 0 && m.rings == 0);
    fr_store_close(s);
}

/* Adjacent ids are one read; far-apart ids are separate reads. */
static void check_coalescing(const char *path, uint64_t rows)
{
    fr_store *s = open_store(path, 0, rows, 512, "psync", 0, 1);
    if (!s)
        return;
    int64_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = 99 - i; /* reversed: sorted on the host */
    unsigned char *out = malloc(100 * 512);
    char err[FR_ERRLEN];
    CHECK(fr_store_gather_host(s, ids, 100, out, NULL, err, sizeof(err)) == 0);
    CHECK(rows_match(out, ids, 100, 0, 512));
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.storage_reads == 1);
    CHECK(st.coalesced == 99);
    CHECK(st.bytes_read == 100 * 512);
    /* Two rows 1 MiB apart: too far to merge. */
    int64_t far[2] = {0, (int64_t)rows - 1};
    CHECK(fr_store_gather_host(s, far, 2, out, NULL, err, sizeof(err)) == 0);
    CHECK(rows_match(out, far, 2, 0, 512));
    fr_store_stats_get(s, &st);
    CHECK(st.storage_reads == 3);
    CHECK(st.coalesced == 99);
    free(out);
    fr_store_close(s);
}

static void check_errors(const char *path, uint64_t rows)
{
    fr_store *s = open_store(path, 0, rows, 512, "auto", -1, 2);
    if (!s)
        return;
    unsigned char out[4 * 512];
    char err[FR_ERRLEN] = "";
    size_t bad = 999;
    int64_t ids[4] = {1, 2, (int64_t)rows, -1};
    CHECK(fr_store_gather_host(s, ids, 4, out, &bad, err, sizeof(err)) == -ERANGE);
    CHECK(bad == 2);
    CHECK(strstr(err, "out of range") != NULL);
    int64_t neg[2] = {-5, 3};
    CHECK(fr_store_gather_host(s, neg, 2, out, &bad, err, sizeof(err)) == -ERANGE);
    CHECK(bad == 0);
    /* Zero ids: nothing to do. */
    CHECK(fr_store_gather_host(s, ids, 0, out, &bad, err, sizeof(err)) == 0);
    /* The host backend has no device: device gathers say so. */
    CHECK(fr_store_gather_device(s, 0, 8, 1, 0, NULL, &bad, err, sizeof(err)) == -ENODEV);
    CHECK(fr_store_gather_device(s, 0, 2, 1, 0, NULL, &bad, err, sizeof(err)) == -EINVAL);
    fr_store_close(s);

    fr_store_config c;
    fr_store_config_init(&c);
    c.path = path;
    c.rows = rows + 1; /* one row more than the file holds */
    c.row_bytes = 512;
    c.backend = "host";
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, path) != NULL && strstr(err, "shorter") != NULL);
    c.rows = rows;
    c.offset = 101; /* the file has 100 bytes to spare: the last row runs past the end */
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
    c.offset = 0;
    c.path = "/nonexistent/fastread-store";
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -ENOENT);
    CHECK(strstr(err, "/nonexistent/fastread-store") != NULL);
    c.path = path;
    c.backend = "bam?";
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "bam?") != NULL);
    c.backend = "host";
    c.engine = "no-such-engine";
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) < 0);
    CHECK(strstr(err, "no-such-engine") != NULL);
    c.engine = "auto";
    c.row_bytes = 0;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
}

typedef struct closer_arg {
    fr_store *s;
    int64_t *ids;
    size_t n;
    unsigned char *out;
    int rc;
    atomic_int done;
} closer_arg;

static void *gather_thread(void *p)
{
    closer_arg *a = p;
    char err[FR_ERRLEN];
    a->rc = fr_store_gather_host(a->s, a->ids, a->n, a->out, NULL, err, sizeof(err));
    atomic_store(&a->done, 1);
    return NULL;
}

/* Closing while a gather runs: the gather ends (cancelled, or done if it
 * was quicker), close waits for it, nothing leaks or hangs. */
static void check_close_during_gather(const char *path, uint64_t rows)
{
    fr_store *s = open_store(path, 0, rows, 512, "psync", 0, 2);
    if (!s)
        return;
    closer_arg a = {s, NULL, 400000, NULL, 1, 0};
    a.ids = malloc(a.n * sizeof(int64_t));
    a.out = malloc(a.n * 512);
    for (size_t i = 0; i < a.n; i++)
        a.ids[i] = (int64_t)((i * 7919) % rows) / 64 * 64; /* far apart: many reads */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, gather_thread, &a) == 0);
    /* Close only once the gather has entered the store (closing before it
     * starts would free the store under it: a caller's error); if it ended
     * before we saw it, close after it. */
    while (fr_store_calls_in_flight(s) == 0 && !atomic_load(&a.done))
        usleep(50);
    int joined = 0;
    if (atomic_load(&a.done)) {
        pthread_join(t, NULL);
        joined = 1;
    } else {
        usleep(2000); /* well inside the gather */
    }
    fr_store_close(s);
    if (!joined)
        pthread_join(t, NULL);
    CHECK(a.rc == 0 || a.rc == -ECANCELED);
    if (a.rc == 0)
        CHECK(rows_match(a.out, a.ids, a.n, 0, 512));
    free(a.ids);
    free(a.out);
}

int main(void)
{
    const uint64_t rows = 2048 * 4; /* of 512 bytes: 4 MiB */
    char *small = make_file("rows512.bin", rows * 512 + 100, 7);
    const char *const engines[] = {"io_uring", "psync"};
    for (size_t e = 0; e < 2; e++) {
        char why[FR_ERRLEN];
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0) {
            fprintf(stderr, "skipping %s: %s\n", engines[e], why);
            continue;
        }
        check_gathers(small, 0, rows, 512, engines[e], 0, 3);
        check_gathers(small, 100, rows, 512, engines[e], 1, 2);  /* unaligned rows, O_DIRECT */
        check_gathers(small, 0, rows, 512, engines[e], -1, 1);
    }
    check_coalescing(small, rows);
    check_errors(small, rows);
    check_close_during_gather(small, rows);
    free(small);

    /* 4 KiB rows at an aligned offset: o_direct=-1 reads them O_DIRECT. */
    char *big = make_file("rows4k.bin", 4096 + 1500 * 4096, 9);
    check_gathers(big, 4096, 1500, 4096, "auto", -1, 2);
    free(big);
    free(file_bytes);
    fr_test_cleanup();
    return fr_test_finish("test_gather_host");
}
