/* fr_store's per-gather policies against the mock CUDA driver (see
 * test_gather_device.c for the mock): the hot-row cache's admission
 * (fastread_device.cuh, "Hot rows") and backend auto's route between the
 * device and host paths (gather/gather_route.h), every row checked, with no
 * driver object leaked. */
#include "gather_device_fixture.h"

/* Hot rows (fastread_device.cuh, "Hot rows"): sparse batches over an array
 * larger than the cache fetch rows on their own; rows fetched a second time
 * are admitted into the hot-row cache after that gather and hit from then
 * on, every row checked. A stream of rows fetched once admits next to
 * nothing; FASTREAD_GATHER_ADMIT=off (and "pages") keeps the cache off. */
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
        /* 96 pages and 512 rows, tags, sketch, candidates, seen words. */
        CHECK(m.device_cache == 96 * PAGE + 512 * ROW);
        enum { HOT = 200 };
        int64_t hot[HOT];
        for (int i = 0; i < HOT; i++)
            hot[i] = (int64_t)((i * 97 + 13) % ROWS); /* distinct rows, distinct pages */
        long admits0 = live("admits");
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == HOT && st.admitted <= 10 && st.row_hits == 0);
        CHECK(live("admits") == admits0 + 1); /* one pass after each gather */
        uint64_t first = st.admitted;
        CHECK(gather_check(s, hot, HOT, 4, err, &bad) == 0); /* the same rows, int32 ids */
        fr_store_stats_get(s, &st);
        /* Seen twice: listed, then admitted after the gather (a few may
         * find their 4-way set full); each row once. */
        uint64_t in = st.admitted - first;
        CHECK(in >= HOT * 8 / 10 && in + first <= HOT);
        CHECK(st.row_hits == 0 && st.direct_rows == 2 * HOT);
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        /* Every row resident is hit. Fewer may be resident than admitted: a
         * candidate whose sketch estimate a collision raised may replace
         * one admitted before it in the same pass, so "admitted" counts
         * both while the set holds one (which of them depends on the order
         * the pass's threads run). */
        uint64_t hits3 = st.row_hits, adm3 = st.admitted;
        CHECK(hits3 >= HOT * 8 / 10 && hits3 <= first + in);
        CHECK(st.direct_rows + st.row_hits == 3 * HOT);
        CHECK(st.evictions == 0 && st.cache_misses == 0);
        /* Once more: the resident rows hit again (a replacement swaps rows,
         * never empties a way), the rest at most admitted. */
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        uint64_t hits4 = st.row_hits - hits3;
        CHECK(hits4 >= hits3 && hits4 <= HOT);
        CHECK(st.admitted - adm3 <= HOT - hits4);
        /* An id out of range is reported (the hot row beside it served
         * from the cache), and the cache serves the set as before. */
        int64_t badids[2] = {hot[0], ROWS + 5};
        CHECK(gather_check(s, badids, 2, 8, err, &bad) == -ERANGE && bad == 1);
        fr_store_stats_get(s, &st);
        uint64_t hits5 = st.row_hits;
        CHECK(gather_check(s, hot, HOT, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits5 >= hits4);
        fr_store_close(s);
    }
    /* Each of 300 rows 4 times a batch, on a fresh store, the pass on 4
     * threads: rows listed more than once (repeats in other threads, seen
     * words shared) still go in once; the third gather is all hits. */
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
        /* At most a few over DISTINCT: replacements in a full set (see
         * above); rows going in twice (fr_rows_admit_one's second version)
         * gave a fifth more. */
        CHECK(st.admitted >= DISTINCT * 9 / 10 && st.admitted <= DISTINCT + DISTINCT / 20);
        uint64_t hits = st.row_hits;
        CHECK(gather_check(s, rep, DISTINCT * EACH, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.row_hits - hits >= (uint64_t)DISTINCT * EACH * 9 / 10);
        fr_store_close(s);
    }
    /* Rows fetched once each, on a fresh store: few read as repeats. */
    s = NULL;
    CHECK(fr_store_open(&c, &s, err, sizeof(err)) == 0);
    if (s) {
        enum { ONCE = 400 };
        int64_t once[ONCE];
        for (int i = 0; i < ONCE; i++)
            once[i] = (int64_t)((i * 47 + 5) % ROWS);
        CHECK(gather_check(s, once, ONCE, 8, err, &bad) == 0);
        fr_store_stats_get(s, &st);
        CHECK(st.direct_rows == ONCE && st.admitted <= ONCE / 20);
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
