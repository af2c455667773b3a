/* io_uring, sizes unknown, batch not dense (ring_direct, or ring_pipelined
 * with ordinary descriptors): files read as they are sized into room
 * reserved from the last call's mean size. Checks
 * exact bytes when that guess is wrong both ways (files much larger than the
 * last call's, so most are read after the phase; much smaller), with failed
 * samples mixed in, across windows, with O_DIRECT, with no reserved room at
 * all (first call) and in a dense batch (the two-phase path), and that the
 * room is learned so a steady batch defers nothing. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base.h"
#include "harness.h"

#define NFILES 300 /* more than one window (256) */

static char *paths[NFILES];
static char *small_paths[NFILES];
#define NLARGE 8
static char *large_paths[NLARGE]; /* over PIPELINE_MAX_SLOT (512 KiB) */

static fr_ctx *open_uring_files(int o_direct, const char *engine_args, int register_files)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    cfg.register_files = register_files;
    cfg.threads = 2;
    cfg.queue_depth = 8; /* fewer than a window: rings refill as files finish */
    cfg.o_direct = o_direct;
    cfg.engine_args = engine_args;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0) {
        fprintf(stderr, "io_uring: %s\n", err);
        return NULL;
    }
    return ctx;
}

static fr_ctx *open_uring(int o_direct, const char *engine_args)
{
    return open_uring_files(o_direct, engine_args, 1);
}

/* Reads `n` paths into a fresh batch (dense or not) and checks every sample:
 * exact bytes, or `want_err` for the paths that do not exist. */
static void read_and_check(fr_ctx *ctx, fr_pool *pool, char **list, size_t n, int dense,
                           const char *what)
{
    fr_batch *b = fr_pool_get(pool);
    b->dense = dense;
    CHECK(fr_batch_prepare(b, n) == 0);
    CHECK(fr_read_files(ctx, (const char *const *)list, NULL, n, b) == 0);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (access(list[i], F_OK) != 0) {
            bad += b->samples[i].length != -ENOENT;
            continue;
        }
        bad += !fr_test_same(b, i, list[i]);
    }
    /* No two samples overlap (slots are taken concurrently by the rings). */
    for (size_t i = 0; i + 1 < n && !dense; i++) {
        const fr_sample *s = &b->samples[i];
        if (s->length <= 0)
            continue;
        for (size_t j = i + 1; j < n; j++) {
            const fr_sample *t = &b->samples[j];
            if (t->length > 0 && s->offset < t->offset + (uint64_t)t->length &&
                t->offset < s->offset + (uint64_t)s->length)
                bad++;
        }
    }
    if (bad)
        fprintf(stderr, "%s: %d samples wrong\n", what, bad);
    CHECK(bad == 0);
    fr_batch_recycle(b);
}

/* direct: 1 for the default where the rings have direct descriptors
 * (ring_direct), 0 for ordinary ones (unsized=fds, or no registered files:
 * ring_pipelined); every window must have gone that way. */
static void check(int o_direct, const char *engine_args, int register_files, int direct)
{
    fr_ctx *ctx = open_uring_files(o_direct, engine_args, register_files);
    if (!ctx) {
        fr_test_failures++;
        return;
    }
    fr_pool *pool = fr_pool_new();
    /* First call: no estimate, every file read after the phase. */
    read_and_check(ctx, pool, small_paths, NFILES, 0, "small, first call");
    long deferred0 = fr_ctx_stat(ctx, "deferred_files");
    CHECK(deferred0 > 0);
    CHECK(fr_ctx_stat(ctx, "est_slot") > 0);
    /* Same sizes again: the room suffices, nothing is deferred (the batch
     * from the pool keeps its arena; a fresh one gets the estimate). */
    read_and_check(ctx, pool, small_paths, NFILES, 0, "small, again");
    CHECK(fr_ctx_stat(ctx, "deferred_files") == deferred0);
    CHECK(fr_ctx_stat(ctx, "pipelined_windows") >= 4);
    /* Much larger files than the estimate: most are read after the phase;
     * then smaller again. Fresh batches, so the arena is only what the
     * estimate reserved. */
    fr_pool *fresh = fr_pool_new();
    read_and_check(ctx, fresh, paths, NFILES, 0, "large after small");
    CHECK(fr_ctx_stat(ctx, "deferred_files") > deferred0);
    fr_pool_close(fresh);
    fresh = fr_pool_new();
    read_and_check(ctx, fresh, small_paths, NFILES, 0, "small after large");
    fr_pool_close(fresh);
    /* Dense batches keep the two-phase path (input order, back to back). */
    long windows = fr_ctx_stat(ctx, "pipelined_windows");
    read_and_check(ctx, pool, paths, NFILES, 1, "dense");
    CHECK(fr_ctx_stat(ctx, "pipelined_windows") == windows);
    CHECK(fr_ctx_stat(ctx, "direct_windows") == (direct ? windows : 0));
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

/* Files larger than PIPELINE_MAX_SLOT on average keep the two-phase path; a
 * call of small files after them finds out and the next one pipelines. */
static void check_large(void)
{
    fr_ctx *ctx = open_uring(0, NULL);
    if (!ctx) {
        fr_test_failures++;
        return;
    }
    fr_pool *pool = fr_pool_new();
    read_and_check(ctx, pool, large_paths, NLARGE, 0, "large, first call");
    long windows = fr_ctx_stat(ctx, "pipelined_windows");
    CHECK(fr_ctx_stat(ctx, "est_slot") > (512 << 10));
    read_and_check(ctx, pool, large_paths, NLARGE, 0, "large, again");
    CHECK(fr_ctx_stat(ctx, "pipelined_windows") == windows);
    read_and_check(ctx, pool, small_paths, NFILES, 0, "small after large");
    CHECK(fr_ctx_stat(ctx, "pipelined_windows") == windows);
    CHECK(fr_ctx_stat(ctx, "est_slot") < (512 << 10));
    read_and_check(ctx, pool, small_paths, NFILES, 0, "small, pipelined again");
    CHECK(fr_ctx_stat(ctx, "pipelined_windows") > windows);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

/* engine_args unsized=windows: the two-phase path for every batch (for A/B
 * measurements), same bytes. */
static void check_windows(void)
{
    fr_ctx *ctx = open_uring(0, "unsized=windows");
    if (!ctx) {
        fr_test_failures++;
        return;
    }
    fr_pool *pool = fr_pool_new();
    read_and_check(ctx, pool, paths, NFILES, 0, "unsized=windows");
    read_and_check(ctx, pool, small_paths, NFILES, 0, "unsized=windows, small");
    CHECK(fr_ctx_stat(ctx, "pipelined_windows") == 0);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0) {
        fprintf(stderr, "skipped: %s\n", why);
        return 77;
    }
    for (int i = 0; i < NFILES; i++) {
        char name[32];
        /* Sizes 0..~200 KB, one in 17 missing. */
        snprintf(name, sizeof(name), "big%03d.bin", i);
        paths[i] = fr_test_write(name, (size_t)(i * 7919 % 200000), (unsigned)i);
        snprintf(name, sizeof(name), "small%03d.bin", i);
        small_paths[i] = fr_test_write(name, (size_t)(i * 13 % 3000), (unsigned)i + 1000);
        if (i % 17 == 5) {
            CHECK(unlink(paths[i]) == 0);
            CHECK(unlink(small_paths[i]) == 0);
        }
    }
    for (int i = 0; i < NLARGE; i++) {
        char name[32];
        snprintf(name, sizeof(name), "large%d.bin", i);
        large_paths[i] = fr_test_write(name, (size_t)(600 << 10) + (size_t)i * 4099, (unsigned)i + 7);
    }
    check(0, "unsized=direct", 1, 1);
    check(1, "unsized=direct", 1, 1);
    check(0, "unsized=fds", 1, 0);
    check(1, "unsized=fds", 1, 0);
    check(0, "unsized=direct", 0, 0); /* no direct descriptors to use */
    check(0, NULL, 1, fr_usable_cpus() >= 4); /* the default: DIRECT_MIN_CPUS */
    check_large();
    check_windows();
    for (int i = 0; i < NLARGE; i++)
        free(large_paths[i]);
    for (int i = 0; i < NFILES; i++) {
        free(paths[i]);
        free(small_paths[i]);
    }
    return fr_test_finish("test_uring_pipelined");
}
