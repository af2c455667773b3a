/* fr_read_files through the object cache (ctx.c's cached_read) without a
 * server, under the sanitizers: entries stored with fr_ocache_publish are
 * read by an s3 context whose endpoint refuses every connection, so every
 * sample that comes back whole came from the cache. A list mixing hits,
 * an object that is not cached, duplicates and a damaged entry: the hits
 * have their bytes in list order, the others fail with the engine's error
 * and its message (the URL) under their own index, the damaged entry is
 * counted and not served; the counters follow. A context of another
 * endpoint, or of other credentials, is served none of these entries. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/object_cache.h"
#include "engines/s3/s3_config.h"

#define ARGS "endpoint=http://127.0.0.1:1,region=us-east-1,unsigned=1,retries=0," \
             "connect_timeout_ms=200,deadline_ms=2000"
/* The same objects' URLs at another endpoint, or with credentials. */
#define OTHER_ENDPOINT "endpoint=http://127.0.0.1:2,region=us-east-1,unsigned=1,retries=0," \
                       "connect_timeout_ms=200,deadline_ms=2000"
#define SIGNED "endpoint=http://127.0.0.1:1,region=us-east-1,retries=0,access_key_id=AK," \
               "secret_access_key=SK,connect_timeout_ms=200,deadline_ms=2000"

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 3;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
}

static fr_ctx *open_cached(const char *dir, const char *args)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "s3";
    cfg.engine_args = args;
    cfg.cache_dir = dir;
    char err[FR_ERRLEN];
    fr_ctx *ctx = NULL;
    int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
    if (rc)
        fprintf(stderr, "open: %s\n", err);
    return ctx;
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("s3", why, sizeof(why)) != 0) {
        printf("test_s3_cache: skipped (%s)\n", why);
        return 77;
    }
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/cache", fr_test_dir());
    enum { N = 6, MAXLEN = 300000 };
    static const size_t sizes[N] = {0, 1, 4096, 70000, MAXLEN, 12345};
    char urls[N][64];
    unsigned char *blobs[N];
    /* Stored as the engine with ARGS stores them: in its scope. */
    static fr_s3_config scfg;
    char scope[1024];
    CHECK(fr_s3_config_resolve(ARGS, NULL, NULL, &scfg, why, sizeof(why)) == 0);
    fr_s3_cache_scope(&scfg, scope, sizeof(scope));
    CHECK(strstr(scope, "http://127.0.0.1:1") != NULL);
    fr_ocache *oc;
    CHECK(fr_ocache_open(dir, 0, scope, &oc, why, sizeof(why)) == 0);
    for (int i = 0; i < N; i++) {
        snprintf(urls[i], sizeof(urls[i]), "s3://bucket/obj/%d.bin", i);
        blobs[i] = malloc(sizes[i] + 1);
        fill(blobs[i], sizes[i], (unsigned)i);
        /* Object 5 is never cached: it can only come from the network. */
        if (i != 5)
            CHECK(fr_ocache_publish(oc, urls[i], blobs[i], sizes[i], NULL) == 0);
    }
    /* Object 4's bytes damaged on disk, its size kept. */
    char data[2048];
    fr_ocache_data_path(oc, urls[4], data);
    FILE *f = fopen(data, "r+b");
    CHECK(f && fputc(blobs[4][0] ^ 0xFF, f) != EOF);
    if (f)
        fclose(f);
    fr_ocache_close(oc);

    /* Other scopes: not one hit (every read fails: nothing listens). */
    const char *others[] = {OTHER_ENDPOINT, SIGNED};
    for (int k = 0; k < 2; k++) {
        fr_ctx *other = open_cached(dir, others[k]);
        fr_pool *op = fr_pool_new();
        fr_batch *ob = op ? fr_pool_get(op) : NULL;
        CHECK(other && ob);
        if (other && ob) {
            const char *one[] = {urls[1], urls[2]};
            CHECK(fr_batch_prepare(ob, 2) == 0);
            CHECK(fr_read_files(other, one, NULL, 2, ob) == 0);
            CHECK(ob->samples[0].length < 0 && ob->samples[1].length < 0);
            CHECK(fr_ctx_stat(other, "cache_hits") == 0);
        }
        if (ob)
            fr_batch_recycle(ob);
        fr_pool_close(op);
        fr_ctx_close(other);
    }

    fr_ctx *ctx = open_cached(dir, ARGS);
    CHECK(ctx != NULL);
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    /* 5 (miss), 0..3 (hits), 4 (damaged), 2 again (a duplicate hit). */
    const int order[] = {5, 0, 1, 2, 3, 4, 2};
    enum { M = sizeof(order) / sizeof(order[0]) };
    const char *list[M];
    for (int j = 0; j < M; j++)
        list[j] = urls[order[j]];
    for (int pass = 0; ctx && b && pass < 2; pass++) {
        CHECK(fr_batch_prepare(b, M) == 0);
        CHECK(fr_read_files(ctx, list, NULL, M, b) == 0);
        CHECK(b->count == M);
        for (int j = 0; j < M; j++) {
            int i = order[j];
            fr_sample s = b->samples[j];
            if (i == 5 || i == 4) {
                CHECK(s.length < 0);
                char msg[FR_ERRLEN];
                CHECK(fr_ctx_sample_error(ctx, (size_t)j, msg, sizeof(msg)) == 1 &&
                      strstr(msg, urls[i]) != NULL);
                continue;
            }
            CHECK(s.length == (int64_t)sizes[i]);
            CHECK(s.length == (int64_t)sizes[i] &&
                  memcmp(b->arena.base + s.offset, blobs[i], sizes[i]) == 0);
            char msg[FR_ERRLEN];
            CHECK(fr_ctx_sample_error(ctx, (size_t)j, msg, sizeof(msg)) == 0);
        }
    }
    if (ctx) {
        /* Two passes: 5 hits each; 4 damaged each time (the network could
         * not replace it); 2 misses each (4 and 5), nothing stored. */
        CHECK(fr_ctx_stat(ctx, "cache_hits") == 10);
        CHECK(fr_ctx_stat(ctx, "cache_damaged") == 2);
        CHECK(fr_ctx_stat(ctx, "cache_misses") == 4);
        CHECK(fr_ctx_stat(ctx, "cache_bytes_written") == 0);
        CHECK(fr_ctx_stat(ctx, "cache_evictions") == 0);
        CHECK(fr_ctx_stat(ctx, "cache_usage") > 0);
    }
    /* A file engine ignores cache_dir; "" is no cache. */
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "psync";
    cfg.cache_dir = dir;
    fr_ctx *plain = NULL;
    CHECK(fr_ctx_open(&cfg, &plain, why, sizeof(why)) == 0);
    if (plain)
        CHECK(fr_ctx_stat(plain, "cache_hits") == -1);
    fr_ctx_close(plain);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
    for (int i = 0; i < N; i++)
        free(blobs[i]);
    return fr_test_finish("test_s3_cache");
}
