/* io_uring's own fr_read_file_ranges (engines/uring/file_ranges.c): 500
 * shards read in shuffled batches through each ring's LRU of direct
 * descriptors (max_open_files 16: evictions every batch), exact bytes, no
 * process descriptor per shard, the LRU within its cap and its files kept
 * across calls; per-sample errors (a missing shard, named by
 * fr_ctx_sample_error; a failed open or read injected by the fault plan,
 * failing only its file's samples; EAGAIN and ECANCELED read again, the
 * same bytes); a FIFO with a writer in a shard's place cancelled by the
 * stuck check, not waited on; and the psync side where register_files is
 * off (the fallback every kernel without direct opens takes). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NF 500
#define PER 3
#define LEN 100
#define HDR 8

static char *paths[NF];
static unsigned char data[NF][HDR + PER * LEN];

static fr_ctx *ctx_with(int register_files, unsigned max_open, const char *args)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    cfg.threads = 4;
    cfg.register_files = register_files;
    cfg.max_open_files = max_open;
    cfg.engine_args = args;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0) {
        fprintf(stderr, "io_uring: %s\n", err);
        fr_test_failures++;
        return NULL;
    }
    return ctx;
}

static fr_file_range job(size_t sample)
{
    return (fr_file_range){.file = (uint32_t)(sample / PER),
                           .offset = HDR + (sample % PER) * LEN,
                           .length = LEN};
}

static int exact(const fr_batch *b, size_t i, const fr_file_range *r)
{
    const fr_sample *s = &b->samples[i];
    return s->length == (int64_t)r->length &&
           memcmp(b->arena.base + s->offset, data[r->file] + r->offset, r->length) == 0;
}

/* Shuffled batches of 128 over every sample, 3 epochs; returns the number
 * of samples not exactly their bytes. */
static int shuffled_epochs(fr_ctx *ctx, fr_batch *b, int *fd_peak)
{
    enum { N = NF * PER, B = 128 };
    static size_t order[N];
    fr_file_range jobs[B];
    int wrong = 0, base = fr_test_open_fds();
    uint64_t seed = 1;
    for (int epoch = 0; epoch < 3; epoch++) {
        for (size_t i = 0; i < N; i++)
            order[i] = i;
        for (size_t i = N - 1; i > 0; i--) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t j = (size_t)((seed >> 33) % (i + 1));
            size_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (size_t s = 0; s < N; s += B) {
            size_t n = N - s < B ? N - s : B;
            for (size_t i = 0; i < n; i++)
                jobs[i] = job(order[s + i]);
            CHECK(fr_batch_prepare(b, n) == 0);
            CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NF, jobs, n, b) == 0);
            for (size_t i = 0; i < n; i++)
                wrong += !exact(b, i, &jobs[i]);
            int now = fr_test_open_fds() - base;
            if (now > *fd_peak)
                *fd_peak = now;
        }
    }
    return wrong;
}

static void check_many_shards(void)
{
    fr_ctx *ctx = ctx_with(1, 16, NULL);
    if (!ctx)
        return;
    if (fr_ctx_stat(ctx, "file_ranges_native") != 1) {
        fprintf(stderr, "skipping the rings' file ranges: this kernel has no direct opens "
                        "linked to reads (IORING_FEAT_LINKED_FILE, Linux 5.17)\n");
        fr_ctx_close(ctx);
        return;
    }
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    int peak = 0;
    CHECK(shuffled_epochs(ctx, b, &peak) == 0);
    /* Direct descriptors: the process's table holds the shards' directory
     * (O_PATH, during a call) at most, never a shard. */
    CHECK(peak <= 1);
    CHECK(fr_ctx_stat(ctx, "fd_cache_open") <= 16);
    CHECK(fr_ctx_stat(ctx, "fd_cache_slots") == 16);
    CHECK(fr_ctx_stat(ctx, "fd_cache_opens") >= NF);
    CHECK(fr_ctx_stat(ctx, "fd_cache_evictions") >= NF - 16);
    CHECK(fr_ctx_stat(ctx, "fd_cache_reads") >= NF * PER * 3 / 2);
    CHECK(fr_ctx_stat(ctx, "file_range_repairs") == 0);
    /* A shard's samples in one batch, in order: one read for the three. */
    long reads0 = fr_ctx_stat(ctx, "fd_cache_reads");
    fr_file_range jobs[PER * 4];
    for (size_t i = 0; i < PER * 4; i++)
        jobs[i] = job(i);
    CHECK(fr_batch_prepare(b, PER * 4) == 0);
    CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NF, jobs, PER * 4, b) == 0);
    for (size_t i = 0; i < PER * 4; i++)
        CHECK(exact(b, i, &jobs[i]));
    CHECK(fr_ctx_stat(ctx, "fd_cache_reads") - reads0 == 4);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);

    /* Files that fit stay open across calls: after the first calls no ring
     * opens any again (each ring holds at most every one of the 8). */
    ctx = ctx_with(1, 64, NULL);
    pool = fr_pool_new();
    b = fr_pool_get(pool);
    long rings = fr_ctx_stat(ctx, "rings");
    for (int call = 0; call < 20; call++) {
        fr_file_range few[8 * PER];
        for (size_t i = 0; i < 8 * PER; i++)
            few[i] = job((i * 7) % (8 * PER));
        CHECK(fr_batch_prepare(b, 8 * PER) == 0);
        CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NF, few, 8 * PER, b) == 0);
        for (size_t i = 0; i < 8 * PER; i++)
            CHECK(exact(b, i, &few[i]));
    }
    CHECK(fr_ctx_stat(ctx, "fd_cache_opens") <= 8 * rings);
    CHECK(fr_ctx_stat(ctx, "fd_cache_evictions") == 0);
    CHECK(fr_ctx_stat(ctx, "fd_cache_hits") >= 20 * 8 - 8 * rings); /* every other use */
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);

    /* 60 shards read shuffled, 32 slots a ring: each shard's runs go to
     * one ring (one run a shard: never taken by another), so each shard is
     * opened once, however many calls (any ring taking any run opened a
     * shard for a third of the samples). */
    ctx = ctx_with(1, 128, NULL);
    pool = fr_pool_new();
    b = fr_pool_get(pool);
    uint64_t seed = 5;
    for (int call = 0; call < 30; call++) {
        fr_file_range some[50];
        for (size_t i = 0; i < 50; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            some[i] = job((size_t)((seed >> 33) % (60 * PER)));
        }
        CHECK(fr_batch_prepare(b, 50) == 0);
        CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NF, some, 50, b) == 0);
        for (size_t i = 0; i < 50; i++)
            CHECK(exact(b, i, &some[i]));
    }
    CHECK(fr_ctx_stat(ctx, "fd_cache_opens") == 60);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
}

static void check_errors(void)
{
    fr_ctx *ctx = ctx_with(1, 16, NULL);
    if (!ctx)
        return;
    if (fr_ctx_stat(ctx, "file_ranges_native") != 1) {
        fr_ctx_close(ctx);
        return;
    }
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    const char *bad[3] = {paths[0], "/nonexistent/fastread-shard-x.tar", paths[2]};
    fr_file_range jobs[6] = {job(0), job(1), {.file = 1, .offset = 0, .length = 4},
                             {.file = 1, .offset = 50, .length = 4}, job(2 * PER), job(2)};
    CHECK(fr_batch_prepare(b, 6) == 0);
    CHECK(fr_read_file_ranges(ctx, bad, 3, jobs, 6, b) == 0);
    CHECK(exact(b, 0, &jobs[0]) && exact(b, 1, &jobs[1]) && exact(b, 5, &jobs[5]));
    CHECK(b->samples[2].length == -ENOENT && b->samples[3].length == -ENOENT);
    fr_file_range two = job(2 * PER);
    CHECK(exact(b, 4, &two));
    char msg[512];
    CHECK(fr_ctx_sample_error(ctx, 2, msg, sizeof(msg)) == 1);
    CHECK(strstr(msg, "fastread-shard-x.tar") && strstr(msg, "No such file"));
    CHECK(fr_ctx_sample_error(ctx, 0, msg, sizeof(msg)) == 0);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);

    /* Injected: a failed open fails its file's samples only (its linked
     * read's -ECANCELED takes the open's error); a failed read its run's;
     * EAGAIN and ECANCELED are read again. */
    static const struct {
        const char *args;
        int64_t want; /* for shard 7's samples; 0: their bytes */
    } cases[] = {
        {"fault_mode=eio,fault_op=open,fault_path=shard-0007,fault_count=-1", -EIO},
        {"fault_mode=eio,fault_op=read,fault_path=shard-0007,fault_count=-1", -EIO},
        {"fault_mode=eagain,fault_op=read,fault_path=shard-0007,fault_count=-1", 0},
        {"fault_mode=ecanceled,fault_op=read,fault_count=5", 0},
        {"fault_mode=eintr,fault_op=open,fault_path=shard-0007,fault_count=-1", 0},
        {"fault_mode=short,fault_op=read,fault_path=shard-0007,fault_count=-1", 0},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ctx = ctx_with(1, 16, cases[c].args);
        if (!ctx)
            continue;
        pool = fr_pool_new();
        b = fr_pool_get(pool);
        enum { N = 30 * PER };
        fr_file_range all[N];
        for (size_t i = 0; i < N; i++)
            all[i] = job((i * 11) % N);
        CHECK(fr_batch_prepare(b, N) == 0);
        CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NF, all, N, b) == 0);
        int ok = 1;
        for (size_t i = 0; i < N; i++) {
            if (all[i].file == 7 && cases[c].want)
                ok &= b->samples[i].length == cases[c].want;
            else
                ok &= exact(b, i, &all[i]);
        }
        if (!ok)
            fprintf(stderr, "fault case %s\n", cases[c].args);
        CHECK(ok);
        CHECK(fr_ctx_stat(ctx, "faults_injected") > 0);
        fr_batch_recycle(b);
        fr_pool_close(pool);
        fr_ctx_close(ctx);
    }
}

/* A FIFO with a writer (no data) where a shard was: its read would be
 * polled forever; the stuck check cancels it, -EINVAL, the rest read. */
static void check_fifo(void)
{
    fr_ctx *ctx = ctx_with(1, 16, NULL);
    if (!ctx)
        return;
    if (fr_ctx_stat(ctx, "file_ranges_native") != 1) {
        fr_ctx_close(ctx);
        return;
    }
    char fifo[512];
    snprintf(fifo, sizeof(fifo), "%s/shard-fifo", fr_test_dir());
    CHECK(mkfifo(fifo, 0600) == 0);
    int writer = open(fifo, O_RDWR | O_NONBLOCK); /* a writer that never writes */
    CHECK(writer >= 0);
    const char *tbl[2] = {paths[0], fifo};
    fr_file_range jobs[3] = {job(0), {.file = 1, .offset = 0, .length = 10}, job(1)};
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(fr_batch_prepare(b, 3) == 0);
    CHECK(fr_read_file_ranges(ctx, tbl, 2, jobs, 3, b) == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(exact(b, 0, &jobs[0]) && exact(b, 2, &jobs[2]));
    CHECK(b->samples[1].length == -EINVAL);
    CHECK(t1.tv_sec - t0.tv_sec < 10 * (long)fr_test_slowdown());
    if (writer >= 0)
        close(writer);
    unlink(fifo);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
}

/* register_files off: no direct descriptors, so the psync side reads
 * them (as on a kernel without direct opens): the same bytes. */
static void check_fallback(void)
{
    fr_ctx *ctx = ctx_with(0, 16, NULL);
    if (!ctx)
        return;
    CHECK(fr_ctx_stat(ctx, "file_ranges_native") == 0);
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    int peak = 0;
    CHECK(shuffled_epochs(ctx, b, &peak) == 0);
    CHECK(peak <= 16 + 1);                                /* psync's LRU of descriptors */
    CHECK(fr_ctx_stat(ctx, "fd_cache_opens") >= NF);      /* its psync side's */
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0) {
        fprintf(stderr, "skipping: io_uring: %s\n", why);
        return fr_test_finish("test_uring_file_ranges");
    }
    for (int i = 0; i < NF; i++) {
        char name[32];
        snprintf(name, sizeof(name), "shard-%04d.bin", i);
        paths[i] = fr_test_write(name, sizeof(data[i]), (unsigned)i + 1);
        FILE *f = fopen(paths[i], "rb");
        CHECK(f && fread(data[i], 1, sizeof(data[i]), f) == sizeof(data[i]));
        if (f)
            fclose(f);
    }
    check_many_shards();
    check_errors();
    check_fifo();
    check_fallback();
    for (int i = 0; i < NF; i++)
        free(paths[i]);
    return fr_test_finish("test_uring_file_ranges");
}
