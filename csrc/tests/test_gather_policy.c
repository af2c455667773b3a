/* fr_store's per-gather policies against the mock CUDA driver (see
 * test_gather_device.c for the mock): the hot-row cache's admission
 * (fastread_device.cuh, "Hot rows") and backend auto's route between the
 * device and host paths (gather/gather_route.h), every row checked, with no
 * driver object leaked. */
#include "gather_device_fixture.h"

/* Hot rows (fastread_device.cuh, "Hot rows"): sparse batches over an array
 * larger than the cache fetch rows on their own; while the hot-row cache
 * has room they go in at first sight, after that gather, and hit from then
 * on, every row checked. Rows listed several times go in once. Once the
 * cache is full, a one-off scan evicts none of the rows being hit, and a
 * set asked for twice takes the scan's place; the sketch is halved (a
 * launch of its own) after 10 x slots fetched rows.
 * FASTREAD_GATHER_ADMIT=off (and "pages") keeps the cache off. */
static void test_hot_rows(const char *path)
{
    load_file(path); /* warm: sparse batches fetch rows */
    unsetenv("FASTREAD_GATHER_FETCH");
    fr_store_config c;
    base_config(&c, path);
    c.cache_bytes = 128 * PAGE; /* a quarter: 128 rows of 256 B -> 512 slots, 96 pages left */
    char err[FR_ERRLEN] = "";
    size_t bad = 0;
    fr_store_stats st;
    fr_store *s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        fr_store_memory m;
        fr_store_memory_get(s, &m);
        /* 96 pages and 512 rows, tags, sketch, doorkeeper, candidates, seen words. */
        CHECK(m.device_cache == 96 * PAGE + 512 * ROW);
        enum { HOT = 200 };
        int64_t hot[HOT];
        for (int i = 0; i < HOT; i++)
            hot[i] = (int64_t)((i * 97 + 13) % ROWS); /* distinct rows, distinct pages */
        long admits0 = live("admits");
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        /* Seen once, into free ways after the gather (a few may find their
         * 8-way set full); each row once. */
        CHECK(st.direct_rows == HOT && st.row_hits == 0);
        CHECK(st.admitted >= HOT * 95 / 100 && st.admitted <= HOT);
        CHECK(live("admits") == admits0 + 1); /* one pass after each gather */
        uint64_t in = st.admitted;
        CHECK(gather_check(s, hot, HOT, 4, err, &bad) == 0); /* the same rows, int32 ids */
        fr_store_stats_get(s, &st);
        /* Every row in is hit; the rest are fetched (and listed again). */
        CHECK(st.row_hits == in && st.direct_rows == 2 * HOT - in);
        CHECK(st.admitted <= HOT);
        uint64_t hits2 = st.row_hits;
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits2 >= in);
        CHECK(st.direct_rows + st.row_hits == 3 * HOT);
        CHECK(st.evictions == 0 && st.cache_misses == 0);
        /* An id out of range is reported (the hot row beside it served
         * from the cache), and the cache serves the set as before. */
        uint64_t hits3 = st.row_hits - hits2;
        int64_t badids[2] = {hot[0], ROWS + 5};
        CHECK(gather_check(s, badids, 2, 8, err, &bad) == -ERANGE && bad == 1);
        fr_store_stats_get(s, &st);
        uint64_t hits5 = st.row_hits;
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits5 >= hits3);
        fr_store_close(s);
    }
    /* Each of 300 rows 4 times a batch, on a fresh store, the pass on 4
     * threads: rows listed more than once (repeats in other threads, seen
     * words shared) still go in once. A gather lists at most slots / 2 =
     * 256 candidates: the second gather hits those, the third all. */
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        enum { DISTINCT = 300, EACH = 4 };
        int64_t rep[DISTINCT * EACH];
        for (int i = 0; i < DISTINCT * EACH; i++)
            rep[i] = (int64_t)(((i * 7) % DISTINCT) * 61 + 3); /* shuffled repeats */
        for (int k = 0; k < 2; k++)
            CHECK(gather_check(s, rep, DISTINCT * EACH, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        /* At most a few over DISTINCT: replacements in a full set (a
         * candidate whose estimate a collision raised); rows going in
         * twice (fr_rows_admit_one's second version) gave a fifth more. */
        CHECK(st.admitted >= DISTINCT * 9 / 10 && st.admitted <= DISTINCT + DISTINCT / 20);
        CHECK(st.row_hits >= 256 * EACH * 9 / 10);
        uint64_t hits = st.row_hits;
        CHECK(gather_check(s, rep, DISTINCT * EACH, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits >= (uint64_t)DISTINCT * EACH * 9 / 10);
        fr_store_close(s);
    }
    /* TinyLFU's point, on a fresh store: a hot set (150 rows of the first
     * half, gathered twice: in and hit), then a one-off scan of 6,000 rows
     * of the second half (12 x the slots, seen once each, in batches of 200:
     * under the 256 a gather lists, so their rows go in at first sight;
     * larger batches of rows seen once copy nothing in, test_gather_rows'
     * uniform cases, fr_rows_pass_floor): the scan fills
     * the room left and evicts none of the hot set, which hits as before.
     * The scan's rows pass 10 x slots fetched: the sketch is halved once,
     * by its own launch. Then a new set of the first half: seen once, it
     * waits (the cache is full); seen twice, it takes the scan's place. */
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        enum { H = 150, SCAN = 200, SCANS = 30, H2 = 100 };
        int64_t h[H], h2[H2], scan[SCAN];
        for (int i = 0; i < H; i++)
            h[i] = (int64_t)((i * 61 + 7) % (ROWS / 2));
        for (int i = 0; i < H2; i++)
            h2[i] = (int64_t)(i * 61 + 40); /* none of h */
        for (int k = 0; k < 2; k++)
            CHECK(gather_check(s, h, H, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        uint64_t h_hits = st.row_hits, adm_before = st.admitted; /* the second gather's */
        CHECK(h_hits >= H * 95 / 100);
        long agings0 = live("agings");
        for (int k = 0; k < SCANS; k++) {
            for (int i = 0; i < SCAN; i++)
                scan[i] = (int64_t)(ROWS / 2 + (k * SCAN + i) * 7 % (ROWS / 2));
            CHECK(gather_check(s, scan, SCAN, 8, err, &bad) == 0);
        }
        fr_store_stats_get(s, &st);
        /* The scan's rows took the room (at least 7/8 of the 512 slots). */
        CHECK(st.admitted - adm_before >= 512 * 7 / 8 - H);
        uint64_t hits0 = st.row_hits;
        CHECK(gather_check(s, h, H, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits0 >= h_hits); /* every row of h still in */
        CHECK(live("agings") == agings0 + 1);
        uint64_t adm1 = st.admitted;
        CHECK(gather_check(s, h2, H2, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.admitted - adm1 <= H2 / 10); /* seen once: a full cache waits */
        uint64_t adm2 = st.admitted;
        CHECK(gather_check(s, h2, H2, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.admitted - adm2 >= H2 * 8 / 10); /* seen twice: in, over scan rows */
        hits0 = st.row_hits;
        CHECK(gather_check(s, h2, H2, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits0 >= H2 * 8 / 10);
        hits0 = st.row_hits;
        CHECK(gather_check(s, h, H, 8, err, &bad) == 0); /* and h is still in */
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits0 >= h_hits);
        fr_store_close(s);
    }
    /* Off: no hot-row cache, the whole budget to pages. */
    setenv("FASTREAD_GATHER_ADMIT", "off", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        fr_store_memory m;
        fr_store_memory_get(s, &m);
        CHECK(m.device_cache == 128 * PAGE);
        int64_t ids[3] = {1, 2000, 1};
        for (int k = 0; k < 3; k++)
            CHECK(gather_check(s, ids, 3, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.admitted == 0 && st.row_hits == 0);
        fr_store_close(s);
    }
    setenv("FASTREAD_GATHER_ADMIT", "always", 1);
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) != 0);
    CHECK(strstr(err, "FASTREAD_GATHER_ADMIT must be auto or off") != NULL);
    unsetenv("FASTREAD_GATHER_ADMIT");
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
}

/* Backend "auto" picks a path per gather (gather_route.h): the rule on its
 * own, then through a store: warm -> device, cold -> host (rows right),
 * cold but the batch's rows in HBM -> device; an explicit backend never
 * moves. */
static void test_route(const char *path)
{
    char why[FR_ERRLEN];
    fr_route_facts f = {.data_bytes = 100, .cache_bytes = 200, .cached_asked = -1};
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_DEVICE && strstr(why, "fits"));
    f.cache_bytes = 50;
    f.all_in_tier = 1;
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_DEVICE && strstr(why, "host tier"));
    f.all_in_tier = 0;
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_DEVICE && strstr(why, "unknown"));
    f.resident_asked = 16;
    f.resident_in = 8;
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_DEVICE && strstr(why, "warm"));
    f.resident_in = 7;
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_NEED_SAMPLE);
    f.cached_asked = 32;
    f.cached_in = 16;
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_DEVICE && strstr(why, "cold, but"));
    f.cached_in = 15;
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_HOST && strncmp(why, "host: cold", 10) == 0);
    f.cached_asked = 0; /* every sampled id out of range: the host path reports it */
    CHECK(fr_route_decide(&f, why, sizeof(why)) == FR_ROUTE_HOST);
    CHECK(strstr(fr_store_route_rule(), "backend 'auto'") != NULL);

    load_file(path);
    unsetenv("FASTREAD_GATHER_FETCH");
    fr_store_config c;
    base_config(&c, path);
    c.backend = "auto";
    c.cache_bytes = 128 * PAGE; /* the array (5 MB) is larger */
    char err[FR_ERRLEN] = "";
    size_t bad = 0;
    fr_store_stats st;
    fr_store *s = NULL;
    /* preadv2, not copies from a mapping: pages this process maps cannot
     * be dropped, and the test drops the file with the store open. */
    setenv("FASTREAD_PROXY_MAPPED", "0", 1);
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    int64_t *ids = random_ids(3000, 41);
    if (s) {
        CHECK(strcmp(fr_store_backend(s), "proxy") == 0);
        char route[FR_ERRLEN];
        fr_store_route_get(s, route, sizeof(route));
        CHECK(route[0] == 0);
        CHECK(gather_check(s, ids, 3000, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        fr_store_route_get(s, route, sizeof(route));
        CHECK(st.host_routed == 0 && st.direct_rows == 3000);
        CHECK(strncmp(route, "device: warm", 12) == 0 && strstr(route, "on their own"));
        if (drop_from_page_cache(path)) {
            CHECK(gather_check(s, ids, 3000, 8, err, &bad) == 0);
            fr_store_stats_get(s, &st);
            fr_store_route_get(s, route, sizeof(route));
            CHECK(st.host_routed == 1 && st.gathers == 2 && st.rows == 6000);
            CHECK(st.direct_rows == 3000 && st.cache_misses == 0); /* no device work */
            CHECK(strncmp(route, "host: cold", 10) == 0);
            /* Out of range on the host path: the same error as the device's. */
            ids[9] = ROWS;
            CHECK(drop_from_page_cache(path));
            CHECK(gather_check(s, ids, 3000, 8, err, &bad) == -ERANGE && bad == 9);
            ids[9] = 9;
            /* Host memory as ids, cold: refused before any route is taken
             * (the host path would have copied from it). */
            CHECK(drop_from_page_cache(path));
            uint64_t d_out = dev_alloc(3000 * ROW);
            fr_store_stats_get(s, &st);
            uint64_t routed0 = st.host_routed;
            CHECK(fr_store_gather_device(s, (uint64_t)(uintptr_t)ids, 8, 3000, d_out, NULL, &bad,
                                         err, sizeof(err)) == -EINVAL);
            CHECK(strstr(err, "ids at 0x") && strstr(err, "pass a device pointer"));
            fr_store_stats_get(s, &st);
            CHECK(st.host_routed == routed0);
            fr_gpu_free(gpu, d_out);
            /* Rows the hot-row cache holds stay on the device though cold. */
            load_file(path);
            int64_t hot[64];
            for (int i = 0; i < 64; i++)
                hot[i] = (int64_t)(i * 301 + 2);
            for (int k = 0; k < 3; k++)
                CHECK(gather_check(s, hot, 64, 8, err, &bad) == 0);
            CHECK(drop_from_page_cache(path));
            fr_store_stats_get(s, &st);
            uint64_t routed = st.host_routed, hits = st.row_hits;
            CHECK(gather_check(s, hot, 64, 8, err, &bad) == 0);
            fr_store_stats_get(s, &st);
            fr_store_route_get(s, route, sizeof(route));
            CHECK(st.host_routed == routed && st.row_hits - hits >= 48);
            CHECK(strncmp(route, "device: cold, but", 17) == 0);
            /* FASTREAD_GATHER_TIMELINE=1 (read at open): a host-path gather
             * says where its time went, one line on stderr. */
            setenv("FASTREAD_GATHER_TIMELINE", "1", 1);
            fr_store *t = NULL;
            CHECK(fr_store_open(&c, &t, err, sizeof(err)) == 0);
            unsetenv("FASTREAD_GATHER_TIMELINE");
            char log[4096] = "";
            if (t && drop_from_page_cache(path)) {
                char tmpl[] = "/tmp/fastread-timeline-XXXXXX";
                int fd = mkstemp(tmpl), saved = dup(2);
                CHECK(fd >= 0 && saved >= 0);
                fflush(stderr);
                dup2(fd, 2);
                CHECK(gather_check(t, ids, 3000, 8, err, &bad) == 0);
                fflush(stderr);
                dup2(saved, 2);
                close(saved);
                ssize_t got = pread(fd, log, sizeof(log) - 1, 0);
                log[got > 0 ? got : 0] = 0;
                close(fd);
                unlink(tmpl);
                CHECK(strstr(log, "fastread gather timeline (host path): n 3000 | route ") != NULL);
                CHECK(strstr(log, "reads and scatter") && strstr(log, "copy up"));
            }
            fr_store_close(t);
        } else {
            fprintf(stderr, "test_route: %s stays in the page cache: the cold route not tested\n",
                    path);
        }
        fr_store_close(s);
    }
    /* An explicit backend runs as given, cold or not. */
    c.backend = "proxy";
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        (void)drop_from_page_cache(path);
        CHECK(gather_check(s, ids, 3000, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        char route[FR_ERRLEN];
        fr_store_route_get(s, route, sizeof(route));
        CHECK(st.host_routed == 0 && route[0] == 0);
        fr_store_close(s);
    }
    unsetenv("FASTREAD_PROXY_MAPPED");
    free(ids);
    load_file(path);
    setenv("FASTREAD_GATHER_FETCH", "pages", 1);
}

int main(void)
{
    const char *name = "test_gather_policy";
    char *path = NULL;
    long allocs0 = 0, pins0 = 0;
    int rc = fixture_begin(name, &path, &allocs0, &pins0);
    if (rc)
        return rc;
    if (!fixture_has_kernel(name, path))
        return fixture_end(name, path, allocs0, pins0, 0);
    test_hot_rows(path);
    test_route(path);
    return fixture_end(name, path, allocs0, pins0, 1);
}
