/* Remembered sizes (size_memo.c and fr_config.remember_sizes).
 * The memo alone: a path is found after it is stored, with the size stored;
 * a failed sample forgets its path; a full memo updates the paths it has
 * and adds none; it grows past its first table. Through fr_read_files: a
 * second read of a list takes every size from the memo (stat
 * "remembered_calls") on the engines that use size hints (io_uring,
 * xnvme-file; the others never consult it), and files that grew, shrank,
 * vanished or became a directory or a FIFO since still read as they are
 * now, on every engine; remember_sizes = 0 remembers nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "core/size_memo.h"

static void check_memo_alone(void)
{
    enum { N = 3000 };
    static char names[N][32];
    const char *paths[N];
    fr_sample samples[N];
    uint64_t hashes[N];
    int64_t sizes[N];
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "/data/train/%06zu.jpg", i);
        paths[i] = names[i];
        samples[i].offset = 0;
        samples[i].length = (int64_t)(i * 7);
    }
    fr_size_memo *m = fr_size_memo_new(N);
    CHECK(m != NULL);
    if (!m)
        return;
    CHECK(fr_size_memo_lookup(m, paths, N, hashes, sizes) == 0);
    for (size_t i = 0; i < N; i++)
        CHECK(sizes[i] == -1 && hashes[i] == fr_size_memo_hash(paths[i]));
    fr_size_memo_store(m, hashes, samples, sizes, N);
    CHECK(fr_size_memo_count(m) == N);
    CHECK(fr_size_memo_lookup(m, paths, N, hashes, sizes) == N);
    int all = 1;
    for (size_t i = 0; i < N; i++)
        all &= sizes[i] == (int64_t)(i * 7);
    CHECK(all);
    /* Changed and failed samples: updated, forgotten. */
    samples[5].length = 123456;
    samples[6].length = -ENOENT;
    fr_size_memo_store(m, hashes, samples, sizes, N);
    CHECK(fr_size_memo_lookup(m, paths, N, hashes, sizes) == N - 1);
    CHECK(sizes[5] == 123456 && sizes[6] == -1);
    /* A path differing in its last byte only is another path. */
    const char *other[] = {"/data/train/000001.jpf"};
    CHECK(fr_size_memo_lookup(m, other, 1, hashes, sizes) == 0);
    fr_size_memo_free(m);

    /* Full: known paths are updated, new ones not added. */
    m = fr_size_memo_new(10);
    CHECK(m != NULL);
    if (!m)
        return;
    CHECK(fr_size_memo_lookup(m, paths, 20, hashes, sizes) == 0);
    fr_size_memo_store(m, hashes, samples, sizes, 20);
    CHECK(fr_size_memo_count(m) == 10);
    CHECK(fr_size_memo_lookup(m, paths, 20, hashes, sizes) == 10);
    samples[0].length = 99;
    fr_size_memo_store(m, hashes, samples, sizes, 20);
    CHECK(fr_size_memo_lookup(m, paths, 1, hashes, sizes) == 1 && sizes[0] == 99);
    CHECK(fr_size_memo_count(m) == 10);
    fr_size_memo_free(m);

    /* More paths than its first table holds (1 << 30 allowed): it grows. */
    m = fr_size_memo_new((size_t)1 << 30);
    CHECK(m != NULL);
    if (!m)
        return;
    CHECK(fr_size_memo_lookup(m, paths, N, hashes, sizes) == 0);
    fr_size_memo_store(m, hashes, samples, sizes, N);
    CHECK(fr_size_memo_lookup(m, paths, N, hashes, sizes) == N - 1); /* 6 failed */
    fr_size_memo_free(m);
}

static void check_reads(const char *engine)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe(engine, why, sizeof(why)) != 0)
        return;
    char *files[CH_COUNT];
    fr_test_write_changing("m_", 5000, 70000, files);
    const char *const *paths = (const char *const *)files;
    enum { N = CH_COUNT };
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    fr_ctx *ctx = NULL;
    fr_pool *pool = fr_pool_new();
    char err[FR_ERRLEN];
    CHECK(pool && fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    if (!ctx || !pool)
        return;
    fr_batch *b = fr_pool_get(pool);
    for (int round = 0; round < 2; round++) {
        CHECK(fr_batch_prepare(b, N) == 0);
        CHECK(fr_read_files(ctx, paths, NULL, N, b) == 0);
        for (size_t i = 0; i < N; i++)
            CHECK(fr_test_same(b, i, paths[i]));
    }
    /* Only engines that use size hints consult the memo. */
    int remembers = strcmp(engine, "io_uring") == 0 || strcmp(engine, "xnvme-file") == 0;
    CHECK(fr_ctx_stat(ctx, "remembered_paths") == (remembers ? N : 0));
    CHECK(fr_ctx_stat(ctx, "remembered_calls") == remembers);
    /* Changed since: every remembered size is now wrong or the path is
     * no regular file. */
    free(fr_test_write("m_grew.bin", 90000, 11));
    free(fr_test_write("m_shrank.bin", 3, 12));
    CHECK(fr_test_unmake_files(files[CH_GONE], files[CH_DIR], files[CH_FIFO]) == 0);
    CHECK(fr_batch_prepare(b, N) == 0);
    CHECK(fr_read_files(ctx, paths, NULL, N, b) == 0);
    CHECK(fr_ctx_stat(ctx, "remembered_calls") == 2 * remembers);
    CHECK(fr_test_read_as_now(b, files));
    CHECK(b->samples[CH_GREW].length == 90000 && b->samples[CH_SHRANK].length == 3);
    /* The failures are forgotten, the new sizes remembered. */
    CHECK(fr_batch_prepare(b, 3) == 0);
    CHECK(fr_read_files(ctx, paths, NULL, 3, b) == 0);
    CHECK(fr_ctx_stat(ctx, "remembered_calls") == 3 * remembers);
    CHECK(b->samples[0].length == 90000 && b->samples[1].length == 3);
    fr_batch_recycle(b);
    fr_ctx_close(ctx);
    unlink(files[CH_FIFO]);
    rmdir(files[CH_DIR]);

    /* remember_sizes = 0: nothing remembered. */
    cfg.remember_sizes = 0;
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    b = fr_pool_get(pool);
    for (int round = 0; round < 2; round++) {
        CHECK(fr_batch_prepare(b, 3) == 0);
        CHECK(fr_read_files(ctx, paths, NULL, 3, b) == 0);
    }
    CHECK(fr_ctx_stat(ctx, "remembered_paths") == 0);
    CHECK(fr_ctx_stat(ctx, "remembered_calls") == 0);
    fr_batch_recycle(b);
    fr_ctx_close(ctx);

    /* Large files (a mean over FR_REMEMBER_MAX_MEAN): never remembered. */
    cfg.remember_sizes = FR_REMEMBER_SIZES;
    char *big[2] = {fr_test_write("m_big0.bin", FR_REMEMBER_MAX_MEAN + 4096, 7),
                    fr_test_write("m_big1.bin", FR_REMEMBER_MAX_MEAN + 1, 8)};
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    b = fr_pool_get(pool);
    for (int round = 0; round < 3; round++) {
        CHECK(fr_batch_prepare(b, 2) == 0);
        CHECK(fr_read_files(ctx, (const char *const *)big, NULL, 2, b) == 0);
        CHECK(fr_test_same(b, 0, big[0]) && fr_test_same(b, 1, big[1]));
    }
    /* The first call, before any mean was known, may have stored them. */
    CHECK(fr_ctx_stat(ctx, "remembered_calls") == 0);
    fr_batch_recycle(b);
    fr_ctx_close(ctx);
    free(big[0]);
    free(big[1]);
    fr_pool_close(pool);
    for (size_t i = 0; i < N; i++)
        free(files[i]);
}

int main(void)
{
    check_memo_alone();
    const char *const *names = fr_engine_names();
    for (size_t i = 0; names[i]; i++)
        /* Engines that read local files on the host (s3 reads URLs, cql
         * rows by key). */
        if (strcmp(names[i], "cufile") != 0 && strcmp(names[i], "xnvme") != 0 &&
            strcmp(names[i], "s3") != 0 && strcmp(names[i], "cql") != 0)
            check_reads(names[i]);
    fr_test_cleanup();
    return fr_test_finish("test_size_memo");
}
