/* fr_store's device path ("proxy") against the mock CUDA driver, whose
 * cuLaunchKernel runs the gather on host threads through the device
 * header's own cache and ring code: rows byte for byte (int64 and int32 ids,
 * duplicates), misses, hits and evictions with a cache smaller than the
 * working set, the host tier (whole file and hot rows), out-of-range ids,
 * ids on another GPU or not on a GPU, a read error and the reset after it, a
 * timeout, close during a gather, concurrent gathers from several threads,
 * memory reported by part, and the open-time errors (no GPU, cache larger
 * than free memory, a row size the page size does not divide, no NVRTC and
 * no PTX, a kernel the driver refuses), with no driver object leaked. */
#include "gather_device_fixture.h"

static void test_gathers(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    fr_store *s;
    char err[FR_ERRLEN] = "";
    int rc = fr_store_open(&c, &s, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "open: %s\n", err);
        fr_test_failures++;
        return;
    }
    CHECK(strcmp(fr_store_backend(s), "proxy") == 0);
    CHECK(strstr(fr_store_kernel_source(s), strcmp(mode, "ptx") ? "cubin" : "PTX") != NULL ||
          strstr(fr_store_kernel_source(s), "NVRTC") != NULL);
    CHECK(fr_store_device_view(s) != 0);
    size_t bad = 0;
    int64_t *ids = random_ids(3000, 1);
    ids[1] = ids[0]; /* duplicates */
    ids[2] = 0;
    ids[3] = ROWS - 1;
    CHECK(gather_check(s, ids, 3000, 8, err, &bad) == 0);
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.gathers == 1 && st.rows == 3000);
    CHECK(st.cache_misses > 64);          /* the working set is larger than the cache */
    CHECK(st.evictions >= st.cache_misses - 64);
    CHECK(st.storage_reads == st.cache_misses); /* one read per page brought in */
    CHECK(st.bytes_read == st.storage_reads * PAGE);
    CHECK(st.host_tier_rows == 0);

    /* A small working set read twice: the second time from the cache. */
    int64_t hot[200];
    for (int i = 0; i < 200; i++)
        hot[i] = (i * 37) % (16 * 20); /* 20 pages */
    CHECK(gather_check(s, hot, 200, 4, err, &bad) == 0);
    fr_store_stats before;
    fr_store_stats_get(s, &before);
    CHECK(gather_check(s, hot, 200, 8, err, &bad) == 0);
    fr_store_stats_get(s, &st);
    CHECK(st.cache_misses == before.cache_misses);
    CHECK(st.cache_hits - before.cache_hits + st.coalesced - before.coalesced == 200);

    /* Out of range: the first bad position, the id named. */
    ids[10] = ROWS;
    ids[20] = -3;
    bad = 0;
    CHECK(gather_check(s, ids, 100, 8, err, &bad) == -ERANGE);
    CHECK(bad == 10);
    CHECK(strstr(err, "20000") != NULL && strstr(err, "position 10") != NULL);

    /* ids on another GPU; ids not in CUDA memory. */
    setenv("MOCK_CUDA_POINTER_DEVICE", "1", 1);
    CHECK(gather_check(s, hot, 10, 8, err, &bad) == -EINVAL);
    CHECK(strstr(err, "GPU 1") != NULL);
    unsetenv("MOCK_CUDA_POINTER_DEVICE");
    uint64_t d_out = dev_alloc(10 * ROW);
    CHECK(fr_store_gather_device(s, (uint64_t)(uintptr_t)hot, 8, 10, d_out, NULL, &bad, err,
                                 sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "not CUDA memory") != NULL);
    fr_gpu_free(gpu, d_out);

    fr_store_memory m;
    fr_store_memory_get(s, &m);
    CHECK(m.device_cache == 64 * PAGE);
    CHECK(m.device_meta >= (ROWS * ROW / PAGE) * 4);
    CHECK(m.staging == 16 * PAGE);
    CHECK(m.rings >= 16 * 32);
    CHECK(m.host_tier == 0);
    free(ids);
    fr_store_close(s);
}

/* The proxy's read paths, each checked row by row: pages the page cache
 * holds read straight into staging (the default), every page through the
 * engine (FASTREAD_PROXY_CACHED=0), and a cold dense batch that reads the
 * array ahead (FASTREAD_PROXY_DENSE=1, the file dropped from the cache). */
static void test_read_paths(const char *path)
{
    static const char *const name[3] = {NULL, "FASTREAD_PROXY_CACHED", "FASTREAD_PROXY_DENSE"};
    static const char *const value[3] = {NULL, "0", "1"};
    for (int k = 0; k < 3; k++) {
        if (name[k])
            setenv(name[k], value[k], 1);
        fr_store_config c;
        base_config(&c, path);
        fr_store *s;
        char err[FR_ERRLEN] = "";
        int rc = fr_store_open(&c, &s, err, sizeof(err));
        if (name[k])
            unsetenv(name[k]);
        if (rc) {
            fprintf(stderr, "open: %s\n", err);
            fr_test_failures++;
            return;
        }
        int fd = open(path, O_RDONLY);
        if (fd >= 0) { /* cold, where the kernel lets us */
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        size_t bad = 0;
        int64_t *ids = random_ids(2000, 40 + (unsigned)k);
        CHECK(gather_check(s, ids, 2000, 8, err, &bad) == 0);
        fr_store_stats st;
        fr_store_stats_get(s, &st);
        CHECK(st.storage_reads == st.cache_misses && st.cache_misses > 64);
        CHECK(st.bytes_read == st.storage_reads * PAGE);
        free(ids);
        fr_store_close(s);
    }
}

typedef struct par_arg {
    fr_store *s;
    unsigned seed;
    int rc;
} par_arg;

static void *par_gather(void *p)
{
    par_arg *a = p;
    int64_t *ids = random_ids(500, a->seed);
    char err[FR_ERRLEN];
    size_t bad;
    a->rc = 0;
    for (int k = 0; k < 3 && a->rc == 0; k++)
        a->rc = gather_check(a->s, ids, 500, 8, err, &bad);
    free(ids);
    return NULL;
}

static void test_concurrent(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    fr_store *s;
    char err[FR_ERRLEN];
    if (fr_store_open(&c, &s, err, sizeof(err)) != 0) {
        fprintf(stderr, "open: %s\n", err);
        fr_test_failures++;
        return;
    }
    pthread_t th[4];
    par_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].s = s;
        a[i].seed = (unsigned)i + 10;
        CHECK(pthread_create(&th[i], NULL, par_gather, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].rc == 0);
    }
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.gathers == 12 && st.rows == 6000);
    fr_store_close(s);
}

static void test_host_tier(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    c.host_bytes = UINT64_MAX; /* auto: the file fits */
    fr_store *s = NULL;
    char err[FR_ERRLEN];
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (!s)
        return;
    int64_t *ids = random_ids(1000, 3);
    size_t bad;
    CHECK(gather_check(s, ids, 1000, 8, err, &bad) == 0);
    fr_store_stats st;
    fr_store_stats_get(s, &st);
    CHECK(st.host_tier_rows == 1000 && st.storage_reads == 0 && st.cache_misses == 0);
    fr_store_memory m;
    fr_store_memory_get(s, &m);
    CHECK(m.host_tier == (uint64_t)ROWS * ROW);
    fr_store_close(s);

    /* Hot rows: a budget below the file, rows 0..99 hot. */
    int64_t hot_ids[100];
    for (int i = 0; i < 100; i++)
        hot_ids[i] = i;
    c.host_bytes = 100 * ROW;
    c.hot_ids = hot_ids;
    c.n_hot = 100;
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (!s) {
        free(ids);
        return;
    }
    int64_t mixed[64];
    for (int i = 0; i < 64; i++)
        mixed[i] = i % 2 ? i : 10000 + i; /* 32 hot, 32 not */
    CHECK(gather_check(s, mixed, 64, 8, err, &bad) == 0);
    fr_store_stats_get(s, &st);
    CHECK(st.host_tier_rows == 32);
    CHECK(st.cache_misses > 0);
    fr_store_memory_get(s, &m);
    CHECK(m.host_tier == 100 * ROW);
    fr_store_close(s);
    free(ids);
}

/* Gathers from a host tier in locality order (fastread_device.cuh): forced
 * on with buckets of 2560 rows (8 over the table), the rows still land in
 * input order, duplicates included, and bad ids are reported at their
 * input position. Auto leaves small tiers alone. */
static void test_locality_order(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    c.host_bytes = UINT64_MAX;
    char err[FR_ERRLEN];
    size_t bad = 0;
    setenv("FASTREAD_GATHER_ORDER", "sideways", 1);
    fr_store *s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) != 0);
    CHECK(strstr(err, "FASTREAD_GATHER_ORDER must be auto, on or off") != NULL);
    setenv("FASTREAD_GATHER_ORDER", "on", 1);
    setenv("FASTREAD_GATHER_ORDER_BUCKET_BYTES", "655360", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        int64_t *ids = random_ids(5000, 9);
        ids[17] = ids[4000];
        long o0 = live("orders");
        CHECK(gather_check(s, ids, 5000, 8, err, &bad) == 0);
        CHECK(gather_check(s, ids, 5000, 4, err, &bad) == 0);
        CHECK(live("orders") == o0 + 2);
        CHECK(gather_check(s, ids, 100, 8, err, &bad) == 0); /* too few to order */
        CHECK(live("orders") == o0 + 2);
        ids[4500] = ROWS + 7;
        ids[4321] = -1;
        CHECK(gather_check(s, ids, 5000, 8, err, &bad) == -ERANGE);
        CHECK(bad == 4321);
        fr_store_memory m;
        fr_store_memory_get(s, &m);
        CHECK(m.device_meta >= 5000 * 4); /* the order's scratch is counted */
        free(ids);
        fr_store_close(s);
    }
    /* Auto: a 5 MB tier is within the GPU's translation reach... */
    unsetenv("FASTREAD_GATHER_ORDER");
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        int64_t *ids = random_ids(5000, 10);
        long o0 = live("orders");
        CHECK(gather_check(s, ids, 5000, 8, err, &bad) == 0);
        CHECK(live("orders") == o0);
        fr_store_close(s);
        /* ...unless the bound says otherwise. */
        setenv("FASTREAD_GATHER_ORDER_MIN_BYTES", "1000", 1);
        s = NULL;
        CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
        if (s) {
            CHECK(gather_check(s, ids, 5000, 8, err, &bad) == 0);
            CHECK(live("orders") == o0 + 1);
            fr_store_close(s);
        }
        free(ids);
    }
    setenv("FASTREAD_GATHER_ORDER_MIN_BYTES", "-3", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) != 0);
    CHECK(strstr(err, "FASTREAD_GATHER_ORDER_MIN_BYTES") != NULL);
    unsetenv("FASTREAD_GATHER_ORDER_MIN_BYTES");
    /* Auto also orders gathers that load pages of an array larger than the
     * cache (so each page is read once), not row fetches, and not gathers
     * from an array the cache holds. */
    static const char *const fetch[3] = {"pages", "rows", "pages"};
    for (int k = 0; k < 3; k++) {
        base_config(&c, path);
        if (k == 2)
            c.cache_bytes = 2 * (uint64_t)ROWS * ROW; /* else 64 of the 1250 pages */
        setenv("FASTREAD_GATHER_FETCH", fetch[k], 1);
        s = NULL;
        CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
        if (!s)
            continue;
        int64_t *ids = random_ids(6000, 30 + (unsigned)k);
        long o0 = live("orders");
        CHECK(gather_check(s, ids, 6000, 8, err, &bad) == 0);
        CHECK(live("orders") == o0 + (k == 0));
        free(ids);
        fr_store_close(s);
    }
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
    unsetenv("FASTREAD_GATHER_ORDER_BUCKET_BYTES");
}

/* Mapped copies (gather_proxy.c): a gather over an array the page cache
 * holds is served by copies from a read-only mapping; not with
 * FASTREAD_PROXY_MAPPED=0, and not once the file is dropped from the page
 * cache (the residency sample sees it). Every row checked each time. */
static void test_mapped_copies(const char *path)
{
    for (int k = 0; k < 3; k++) {
        load_file(path); /* in the page cache */
        if (k == 1)
            setenv("FASTREAD_PROXY_MAPPED", "0", 1);
        fr_store_config c;
        base_config(&c, path);
        fr_store *s = NULL;
        char err[FR_ERRLEN] = "";
        CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
        unsetenv("FASTREAD_PROXY_MAPPED");
        if (!s)
            continue;
        if (k == 2 && !drop_from_page_cache(path)) {
            fprintf(stderr, "test_mapped_copies: cannot drop the file from the page cache here "
                            "(tmpfs?); the cold case is not tested\n");
            fr_store_close(s);
            continue;
        }
        size_t bad = 0;
        int64_t *ids = random_ids(3000, 70 + (unsigned)k);
        CHECK(gather_check(s, ids, 3000, 8, err, &bad) == 0);
        fr_store_stats st;
        fr_store_stats_get(s, &st);
        CHECK(st.storage_reads > 0);
        if (k == 0)
            CHECK(st.mapped_reads == st.storage_reads);
        else
            CHECK(st.mapped_reads == 0);
        free(ids);
        fr_store_close(s);
    }
    load_file(path);
    /* A file that shrinks inside a mapped session (kept open by
     * fr_store_device_serve): the copies stop at the next batch of requests
     * and the engine names the lost rows; no SIGBUS. Then restored. */
    char *own = fr_test_write("mapped-shrink.bin", 512 + ROWS * ROW, 11);
    load_file(own);
    fr_store_config c;
    base_config(&c, own);
    fr_store *s = NULL;
    char err[FR_ERRLEN] = "";
    size_t bad = 0;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(fr_store_device_serve(s, 1, err, sizeof(err)) == 0);
        int64_t head[3] = {1, 40, 3}, tail[3] = {ROWS - 1, ROWS - 40, 3};
        CHECK(gather_check(s, head, 3, 8, err, &bad) == 0);
        fr_store_stats st;
        fr_store_stats_get(s, &st);
        CHECK(st.mapped_reads > 0);
        CHECK(truncate(own, 512 + 1000 * ROW) == 0);
        int rc = gather_check(s, tail, 3, 8, err, &bad);
        CHECK(rc == -EIO || rc == -ENODATA);
        CHECK(strstr(err, own) != NULL);
        /* The session's end resets the ring after its failed gather. */
        (void)fr_store_device_serve(s, 0, err, sizeof(err));
        free(own);
        own = fr_test_write("mapped-shrink.bin", 512 + ROWS * ROW, 11);
        CHECK(gather_check(s, tail, 3, 8, err, &bad) == 0);
        fr_store_close(s);
    }
    free(own);
    load_file(path);
}

/* Row fetches: sparse batches over an array larger than the cache read
 * their rows on their own (auto), the cache left alone; "pages" forces page
 * loads, "rows" row reads, and a cache that holds the whole array keeps
 * pages (they will be hit later). */
static void test_row_fetches(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    char err[FR_ERRLEN];
    size_t bad = 0;
    fr_store_stats st;
    unsetenv("FASTREAD_GATHER_FETCH");
    fr_store *s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    int64_t *ids = random_ids(1000, 21);
    ids[5] = ids[6]; /* a duplicate */
    if (s) {
        CHECK(gather_check(s, ids, 1000, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == 1000 && st.cache_misses == 0 && st.evictions == 0);
        CHECK(st.storage_reads == 1000 && st.bytes_read == 1000 * ROW);
        fr_store_close(s);
    }
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(gather_check(s, ids, 1000, 4, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == 0 && st.cache_misses > 64);
        CHECK(st.bytes_read == st.cache_misses * PAGE);
        fr_store_close(s);
    }
    setenv("FASTREAD_GATHER_FETCH", "rows", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        int64_t dense[512]; /* 32 pages, 16 rows each: auto would load pages */
        for (int i = 0; i < 512; i++)
            dense[i] = (i * 7) % 512;
        CHECK(gather_check(s, dense, 512, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == 512 && st.cache_misses == 0);
        ids[77] = ROWS + 1;
        CHECK(gather_check(s, ids, 1000, 8, err, &bad) == -ERANGE);
        CHECK(bad == 77);
        ids[77] = 3;
        fr_store_close(s);
    }
    unsetenv("FASTREAD_GATHER_FETCH");
    c.cache_bytes = (uint64_t)(ROWS * ROW / PAGE + 1) * PAGE; /* the whole array fits */
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(gather_check(s, ids, 1000, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == 0 && st.cache_misses > 0);
        fr_store_close(s);
    }
    base_config(&c, path);
    /* Cold: with 2.4 rows wanted per page (3000 ids over 1250 pages: still
     * sparse, rows when warm) a cold array loads pages; under 2 per page it
     * fetches rows, cold or not. Where the page cache cannot drop the file
     * (tmpfs), only the warm half runs. */
    int64_t *some = random_ids(3000, 23);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(gather_check(s, some, 3000, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == 3000); /* warm */
        fr_store_close(s);
    }
    if (drop_from_page_cache(path)) {
        s = NULL;
        CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
        if (s) {
            CHECK(gather_check(s, some, 3000, 8, err, &bad) == 0);
            fr_store_stats_get(s, &st);
            CHECK(st.direct_rows == 0 && st.cache_misses > 64);
            CHECK(drop_from_page_cache(path));
            CHECK(gather_check(s, ids, 1000, 8, err, &bad) == 0);
            fr_store_stats_get(s, &st);
            CHECK(st.direct_rows > 900); /* rows of pages the first gather left cached hit */
            fr_store_close(s);
        }
    } else {
        fprintf(stderr, "test_gather_device: %s stays in the page cache: cold fetches not tested\n",
                path);
    }
    free(some);
    setenv("FASTREAD_GATHER_FETCH", "bytes", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) != 0);
    CHECK(strstr(err, "FASTREAD_GATHER_FETCH must be auto, pages or rows") != NULL);
    unsetenv("FASTREAD_GATHER_FETCH");
    free(ids);
}

typedef struct close_arg {
    fr_store *s;
    int rc;
    char err[FR_ERRLEN];
} close_arg;

static void *slow_gather(void *p)
{
    close_arg *a = p;
    int64_t *ids = random_ids(400, 5);
    size_t bad;
    a->rc = gather_check(a->s, ids, 400, 8, a->err, &bad);
    free(ids);
    return NULL;
}

static void test_faults(const char *dir)
{
    /* A file of its own: it is cut short and restored here. */
    char *path = fr_test_write("faults.bin", 512 + ROWS * ROW, 3);
    load_file(path);
    fr_store_config c;
    base_config(&c, path);
    fr_store *s = NULL;
    char err[FR_ERRLEN];
    size_t bad;
    int64_t tail[4] = {ROWS - 1, ROWS - 100, 5, 6};
    /* A read that fails on the host (the file shrank under the store), with
     * page loads and row fetches, through each thread's io_uring (where
     * built) and through preadv2 and the engine. */
    for (int k = 0; k < 4; k++) {
        setenv("FASTREAD_PROXY_URING", k & 1 ? "0" : "1", 1);
        setenv("FASTREAD_GATHER_FETCH", k & 2 ? "rows" : "pages", 1);
        s = NULL;
        CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
        if (!s)
            continue;
        CHECK(truncate(path, 512 + 1000 * ROW) == 0);
        int rc = gather_check(s, tail, 4, 8, err, &bad);
        CHECK(rc == -EIO || rc == -ENODATA);
        CHECK(strstr(err, path) != NULL);
        CHECK(strstr(err, k & 2 ? "row at byte" : "page") != NULL);
        /* Restored: the cache and ring were reset, the next gather works. */
        FILE *f = fopen(path, "r+b");
        CHECK(f && fseek(f, 0, SEEK_SET) == 0 && fwrite(file_bytes, 1, 512 + ROWS * ROW, f) ==
                                                     512 + ROWS * ROW);
        if (f)
            fclose(f);
        CHECK(gather_check(s, tail, 4, 8, err, &bad) == 0);
        fr_store_close(s);
    }
    unsetenv("FASTREAD_PROXY_URING");
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);

    /* A service that answers late: the device-side wait times out. */
    setenv("FASTREAD_PROXY_DELAY_US", "400000", 1);
    c.timeout_ms = 50;
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(gather_check(s, tail, 4, 8, err, &bad) == -ETIMEDOUT);
        CHECK(strstr(err, "50 ms") != NULL);
        CHECK(gather_check(s, tail, 4, 8, err, &bad) == -ETIMEDOUT); /* and again, cleanly */
        fr_store_close(s);
    }

    /* Close while a gather waits on the slow service: cancelled. */
    c.timeout_ms = 20000 * fr_test_slowdown();
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (!s) {
        unsetenv("FASTREAD_PROXY_DELAY_US");
        free(path);
        return;
    }
    close_arg a = {s, 1, ""};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, slow_gather, &a) == 0);
    usleep(100000);
    fr_store_close(s);
    pthread_join(t, NULL);
    CHECK(a.rc == -ECANCELED);

    /* fr_store_cancel: the gather waiting on the slow service ends well
     * before its 20 s timeout, new gathers are refused, and the store stays
     * allocated until fr_store_close. */
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        close_arg b = {s, 1, ""};
        CHECK(pthread_create(&t, NULL, slow_gather, &b) == 0);
        usleep(100000);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fr_store_cancel(s);
        pthread_join(t, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        CHECK(b.rc == -ECANCELED);
        CHECK(t1.tv_sec - t0.tv_sec < 10);
        CHECK(gather_check(s, tail, 4, 8, err, &bad) == -ECANCELED);
        CHECK(strstr(err, "closed") != NULL);
        fr_store_cancel(s); /* again: nothing more happens */
        fr_store_close(s);
    }
    unsetenv("FASTREAD_PROXY_DELAY_US");
    (void)dir;
    free(path);
}

/* A user's own "kernel" (host threads, as the mock's device memory is host
 * memory) reading rows through the store's device view. */
typedef struct user_arg {
    uint64_t view;
    const int64_t *ids;
    size_t n;
    int rc;
    size_t wrong;
} user_arg;

static void *user_kernel(void *p)
{
    user_arg *a = p;
    const fr_dev_store *v = (const fr_dev_store *)(uintptr_t)a->view;
    fr_dev_counts cnt;
    memset(&cnt, 0, sizeof(cnt));
    unsigned char row[ROW];
    a->rc = 0;
    a->wrong = 0;
    for (size_t i = 0; i < a->n && a->rc == 0; i++) {
        a->rc = fr_dev_read_row(v, a->ids[i], row, &cnt);
        if (a->rc == 0 && memcmp(row, file_bytes + 512 + (size_t)a->ids[i] * ROW, ROW) != 0)
            a->wrong++;
    }
    return NULL;
}

static void test_user_kernels(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    /* Long enough for the served reads under a slow build, short enough
     * for the read that must run out below. */
    c.timeout_ms = 300 * fr_test_slowdown();
    fr_store *s = NULL;
    char err[FR_ERRLEN];
    size_t bad;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (!s)
        return;
    int64_t *ids = random_ids(600, 21);
    /* Serving: the user's reads miss, the proxy serves them; a gather of
     * fastread's own runs inside the session. */
    CHECK(fr_store_device_serve(s, 1, err, sizeof(err)) == 0);
    user_arg a[2] = {{fr_store_device_view(s), ids, 300, 1, 0},
                     {fr_store_device_view(s), ids + 300, 300, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, user_kernel, &a[i]) == 0);
    CHECK(gather_check(s, ids, 600, 8, err, &bad) == 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].rc == 0 && a[i].wrong == 0);
    }
    CHECK(fr_store_device_serve(s, 0, err, sizeof(err)) == 0);
    CHECK(fr_store_device_serve(s, 0, err, sizeof(err)) == -EINVAL);

    /* Not serving: a user read that misses times out and leaves its ring
     * cell taken; the next session's end resets the ring, and gathers
     * work again. */
    int64_t cold[1] = {ROWS - 1 - 16 * 5}; /* a page no one read yet */
    user_arg u = {fr_store_device_view(s), cold, 1, 1, 0};
    user_kernel(&u);
    CHECK(u.rc == FR_DEV_ETIMEDOUT);
    CHECK(fr_store_device_serve(s, 1, err, sizeof(err)) == 0);
    CHECK(fr_store_device_serve(s, 0, err, sizeof(err)) == 0);
    int64_t *more = random_ids(2000, 22);
    int more_rc = gather_check(s, more, 2000, 8, err, &bad);
    CHECK(more_rc == 0);
    if (more_rc)
        fprintf(stderr, "gather after the reset: %s\n", err);
    free(more);
    free(ids);
    fr_store_close(s);

    /* The host backend has no device view. */
    base_config(&c, path);
    c.backend = "host";
    c.device_id = -1;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(fr_store_device_view(s) == 0);
        CHECK(fr_store_device_serve(s, 1, err, sizeof(err)) == -ENODEV);
        fr_store_close(s);
    }
}

/* Malformed ring requests (only a bug in a kernel could make one: users'
 * kernels reach the ring through fr_dev_read_row): row lists with an offset
 * past the array, a misaligned one, none or too many rows, and a page past
 * the array each fail with -EINVAL, and the session's end names the file;
 * nothing else breaks, and gathers work afterwards. */
static void test_malformed_requests(const char *path)
{
    fr_store_config c;
    base_config(&c, path);
    fr_store *s = NULL;
    char err[FR_ERRLEN] = "";
    size_t bad = 0;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (!s)
        return;
    const fr_dev_store *v = (const fr_dev_store *)(uintptr_t)fr_store_device_view(s);
    const fr_dev_ring *r = &v->fetch.ring;
    struct {
        uint64_t page, off0, off1;
        uint32_t len;
    } cases[] = {
        {ROW, ROW, (uint64_t)ROWS * ROW, FR_RING_ROWS | 2},  /* past the array */
        {ROW, ROW + 1, 0, FR_RING_ROWS | 2},                  /* misaligned */
        {ROW, 0, 0, FR_RING_ROWS | 0},                        /* no rows */
        {ROW, 0, 0, FR_RING_ROWS | (FR_RING_MAX_ROWS + 1)},   /* too many */
        {2 * ROW, 0, 0, FR_RING_ROWS | 1},                    /* not the row size */
        {1u << 30, 0, 0, PAGE},                               /* a page past the array */
    };
    CHECK(fr_store_device_serve(s, 1, err, sizeof(err)) == 0);
    fr_dev_counts cnt;
    memset(&cnt, 0, sizeof(cnt));
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        uint64_t t = fr_atom_add64(r->tail, 1);
        CHECK(fr_ring_claim(v, r, t, &cnt.c[FR_CNT_RING_FULL]) == 0);
        uint64_t *list = (uint64_t *)(uintptr_t)fr_ring_staging(r, t);
        list[0] = cases[k].off0;
        list[1] = cases[k].off1;
        fr_ring_publish(r, t, cases[k].page, cases[k].len);
        CHECK(fr_ring_wait(v, r, t) == -EINVAL);
        fr_ring_release(r, t);
    }
    CHECK(fr_store_device_serve(s, 0, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, path) != NULL && strstr(err, "a request for") != NULL);
    int64_t *ids = random_ids(500, 61);
    CHECK(gather_check(s, ids, 500, 8, err, &bad) == 0);
    free(ids);
    fr_store_close(s);
}

static void test_open_errors(const char *path)
{
    fr_store_config c;
    fr_store *s = NULL;
    char err[FR_ERRLEN];

    base_config(&c, path);
    c.row_bytes = 384; /* does not divide 4096 */
    c.rows = 1000;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "does not divide") != NULL);

    base_config(&c, path);
    c.page_bytes = 3000;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "page_bytes") != NULL);

    base_config(&c, path);
    setenv("MOCK_CUDA_FREE_MEM", "1000000", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -ENOMEM);
    CHECK(strstr(err, "does not fit") != NULL);
    unsetenv("MOCK_CUDA_FREE_MEM");

    base_config(&c, path);
    c.cache_bytes = 8 * PAGE;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "at least 64") != NULL);

    /* No NVRTC here; FASTREAD_KERNEL_SOURCE=nvrtc refuses the PTX fallback. */
    base_config(&c, path);
    c.nvrtc_path = "/nonexistent/nvrtc-dir";
    setenv("FASTREAD_KERNEL_SOURCE", "nvrtc", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -ENOENT);
    CHECK(strstr(err, "NVRTC not found") != NULL && strstr(err, "/nonexistent/nvrtc-dir") != NULL);
    setenv("FASTREAD_KERNEL_SOURCE", "ptx", 1);
    int rc = fr_store_open(&c, &s, err, sizeof(err));
#ifdef FASTREAD_TEST_HAVE_PTX
    CHECK(rc == 0);
    if (rc == 0)
        fr_store_close(s);
    setenv("MOCK_CUDA_MODULE_REFUSE", "1", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) < 0);
    CHECK(strstr(err, "PTX does not load") != NULL);
    unsetenv("MOCK_CUDA_MODULE_REFUSE");
#else
    CHECK(rc == -ENOENT);
    CHECK(strstr(err, "no PTX built in") != NULL);
#endif
    set_mode();

    base_config(&c, path);
    setenv("MOCK_CUDA_CC", "61", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == -ENOTSUP);
    CHECK(strstr(err, "6.1") != NULL);
    unsetenv("MOCK_CUDA_CC");

    /* No GPU: proxy refuses; auto falls back to the host and says why. */
    base_config(&c, path);
    setenv("MOCK_CUDA_DEVICES", "0", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) < 0);
    CHECK(strstr(err, "device_id 0") != NULL);
    c.backend = "auto";
    c.device_id = 0;
    rc = fr_store_open(&c, &s, err, sizeof(err));
    CHECK(rc < 0); /* device_id given and no GPU: the store cannot serve device gathers */
    unsetenv("MOCK_CUDA_DEVICES");

    /* auto with a GPU but no way to build the kernel: the host backend. */
    base_config(&c, path);
    c.backend = "auto";
    c.nvrtc_path = "/nonexistent";
    setenv("FASTREAD_KERNEL_SOURCE", "nvrtc", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        CHECK(strcmp(fr_store_backend(s), "host") == 0);
        CHECK(strstr(fr_store_backend_reason(s), "NVRTC") != NULL);
        /* The host backend still serves device pointers. */
        int64_t ids[3] = {1, 2, 3};
        size_t bad;
        CHECK(gather_check(s, ids, 3, 8, err, &bad) == 0);
        fr_store_close(s);
    }
    set_mode();
}

/* With FASTREAD_NVRTC naming an NVRTC (a file, or a wheel's lib dir): the
 * kernel is compiled once, then loaded from the cache directory; a cached
 * file the driver refuses is replaced by a fresh compile. Opt-in: NVRTC
 * keeps allocations LeakSanitizer reports after it is unloaded. */
static void test_nvrtc_cache(const char *path)
{
    const char *nvrtc = getenv("FASTREAD_NVRTC");
    if (!nvrtc || !nvrtc[0]) {
        fprintf(stderr, "test_gather_device: FASTREAD_NVRTC not set: NVRTC's cache not tested\n");
        return;
    }
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/kernels", fr_test_dir());
    fr_store_config c;
    base_config(&c, path);
    c.cache_dir = dir;
    c.nvrtc_path = nvrtc;
    setenv("FASTREAD_KERNEL_SOURCE", "nvrtc", 1);
    fr_store *s = NULL;
    char err[FR_ERRLEN];
    int rc = fr_store_open(&c, &s, err, sizeof(err));
    if (rc == -ENOENT && strstr(err, "NVRTC not found")) {
        fprintf(stderr, "test_gather_device: no NVRTC here, its cache is not tested (%s)\n", err);
        set_mode();
        return;
    }
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "nvrtc: %s\n", err);
        set_mode();
        return;
    }
    CHECK(strncmp(fr_store_kernel_source(s), "NVRTC", 5) == 0);
    fr_store_close(s);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    const char *src = fr_store_kernel_source(s);
    CHECK(strncmp(src, "cached cubin ", 13) == 0);
    char cubin[1100] = "";
    snprintf(cubin, sizeof(cubin), "%s", src + 13);
    int64_t ids[5] = {0, 1, 2, 19999, 7};
    size_t bad;
    CHECK(gather_check(s, ids, 5, 8, err, &bad) == 0);
    fr_store_close(s);
    FILE *f = fopen(cubin, "wb"); /* a damaged cache entry */
    CHECK(f && fputs("not a cubin", f) >= 0);
    if (f)
        fclose(f);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    CHECK(strncmp(fr_store_kernel_source(s), "NVRTC", 5) == 0);
    fr_store_close(s);
    set_mode();
}

int main(void)
{
    const char *name = "test_gather_device";
    char *path = NULL;
    long allocs0 = 0, pins0 = 0;
    int rc = fixture_begin(name, &path, &allocs0, &pins0);
    if (rc)
        return rc;
    const char *h = fr_store_device_header();
    CHECK(h && strstr(h, "fr_dev_gather_warp") && strstr(h, "FASTREAD_DEVICE_CUH"));
    /* Most tests here are about the cache: pages always, except where a test
     * says otherwise (test_row_fetches). */
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
    test_nvrtc_cache(path);
    test_open_errors(path);
    /* Neither PTX built in nor NVRTC here: only the refusals ran. */
    if (!fixture_has_kernel(name, path))
        return fixture_end(name, path, allocs0, pins0, 0);

    test_gathers(path);
    test_read_paths(path);
    test_mapped_copies(path);
    test_concurrent(path);
    test_host_tier(path);
    test_locality_order(path);
    test_row_fetches(path);
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
    test_user_kernels(path);
    test_malformed_requests(path);
    test_faults(fr_test_dir());
    load_file(path);
    return fixture_end(name, path, allocs0, pins0, 1);
}
