/* io_uring's test-only fault injection (engine_args fault_*=): completions
 * made to fail with EIO, EINTR, EAGAIN or ECANCELED, come back short or
 * late, and submits made to fail (EINTR, EAGAIN, EBUSY: retried; EIO: the
 * batch fails, nothing hangs or leaks, the next batch is exact), on each
 * of the engine's paths (sizing first, size hints with staged or linked
 * opens, ranges of an image). A hard error fails only its own sample; EINTR,
 * EAGAIN and short reads are retried and give exact bytes; the next batch on
 * the same context is exact. "faults_injected" proves each fault was made. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "harness.h"

#define NFILES 6
static const size_t sizes[NFILES] = {100, 70000, 5000, 1, 0, 300000};
static const char *names[NFILES] = {"a.bin", "victim.bin", "c.bin", "d.bin", "e.bin", "f.bin"};
static char *paths[NFILES];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static fr_ctx *open_ctx(const char *args, int o_direct)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    cfg.threads = 2;
    cfg.o_direct = o_direct;
    cfg.engine_args = args;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "fr_ctx_open(%s): %s\n", args, err);
        fr_test_failures++;
        return NULL;
    }
    return ctx;
}

/* Reads the files once; checks every sample but the victim is exact and the
 * victim is exact (want_err 0) or fails with want_err. */
static void read_and_check(fr_ctx *ctx, fr_pool *pool, int hinted, int64_t want_err,
                           const char *what)
{
    int64_t hints[NFILES];
    for (size_t i = 0; i < NFILES; i++)
        hints[i] = (int64_t)sizes[i];
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, NFILES) == 0);
    CHECK(fr_read_files(ctx, (const char *const *)paths, hinted ? hints : NULL, NFILES, b) == 0);
    for (size_t i = 0; i < NFILES; i++) {
        int ok = i == 1 && want_err ? b->samples[i].length == want_err : fr_test_same(b, i, paths[i]);
        if (!ok) {
            fprintf(stderr, "%s: sample %zu: length %lld\n", what, i,
                    (long long)b->samples[i].length);
            fr_test_failures++;
        }
    }
    fr_batch_recycle(b);
}

static const char *const ways[] = {"", "open=linked,"};

static void check_files(const char *mode, const char *op, int count, int64_t want_err,
                        long min_faults)
{
    for (int hinted = 0; hinted < 2; hinted++) {
        for (int w = 0; w < (hinted ? 2 : 1); w++) {
            for (int direct = 0; direct < 2; direct++) {
                char args[256], what[320];
                snprintf(args, sizeof(args),
                         "%sfault_mode=%s,fault_op=%s,fault_count=%d,fault_path=victim,"
                         "fault_stall_ms=100",
                         ways[w], mode, op, count);
                snprintf(what, sizeof(what), "%s hinted=%d o_direct=%d", args, hinted, direct);
                fr_ctx *ctx = open_ctx(args, direct);
                if (!ctx)
                    continue;
                fr_pool *pool = fr_pool_new();
                double t0 = now_ms();
                read_and_check(ctx, pool, hinted, want_err, what);
                double took = now_ms() - t0;
                long faults = fr_ctx_stat(ctx, "faults_injected");
                if (faults < min_faults || (count > 0 && faults > count)) {
                    fprintf(stderr, "%s: %ld faults injected\n", what, faults);
                    fr_test_failures++;
                }
                if (strcmp(mode, "stall") == 0 && took < 100 * 0.9) {
                    fprintf(stderr, "%s: a stalled completion took only %.1f ms\n", what, took);
                    fr_test_failures++;
                }
                /* The faults are spent (count > 0) or the repair path
                 * carries the victim: the next batch is exact either way,
                 * unless every completion fails hard. */
                if (count > 0)
                    read_and_check(ctx, pool, hinted, 0, what);
                fr_ctx_close(ctx);
                fr_pool_close(pool);
            }
        }
    }
}

static void check_ranges(void)
{
    char *image = fr_test_write("victim.img", 1 << 20, 99);
    fr_range ranges[8];
    for (size_t i = 0; i < 8; i++)
        ranges[i] = (fr_range){.offset = i * 131072, .length = 100000};
    const char *modes[] = {"eio", "eintr", "eagain", "short", "stall", "ecanceled"};
    for (size_t m = 0; m < 6; m++) {
        char args[128];
        snprintf(args, sizeof(args), "fault_mode=%s,fault_count=1,fault_path=victim.img,fault_stall_ms=20",
                 modes[m]);
        fr_ctx *ctx = open_ctx(args, 0);
        if (!ctx)
            continue;
        fr_pool *pool = fr_pool_new();
        for (int round = 0; round < 2; round++) {
            fr_batch *b = fr_pool_get(pool);
            CHECK(fr_batch_prepare(b, 8) == 0);
            CHECK(fr_read_ranges(ctx, image, ranges, 8, b) == 0);
            FILE *f = fopen(image, "rb");
            unsigned char *want = malloc(100000);
            size_t failed = 0;
            for (size_t i = 0; i < 8; i++) {
                if (b->samples[i].length == -EIO && m == 0 && round == 0) {
                    failed++;
                    continue;
                }
                CHECK(f && fseek(f, (long)ranges[i].offset, SEEK_SET) == 0 &&
                      fread(want, 1, 100000, f) == 100000);
                if (b->samples[i].length != 100000 ||
                    memcmp(b->arena.base + b->samples[i].offset, want, 100000) != 0) {
                    fprintf(stderr, "ranges %s round %d: range %zu wrong (length %lld)\n", args,
                            round, i, (long long)b->samples[i].length);
                    fr_test_failures++;
                }
            }
            CHECK(failed == (m == 0 && round == 0 ? 1u : 0u));
            free(want);
            if (f)
                fclose(f);
            fr_batch_recycle(b);
        }
        CHECK(fr_ctx_stat(ctx, "faults_injected") == 1);
        fr_ctx_close(ctx);
        fr_pool_close(pool);
    }
    free(image);
}

/* Open descriptors of this process (to see that a broken submit leaks none). */
static int open_fds(void)
{
    int n = 0;
    char p[64];
    for (int fd = 0; fd < 4096; fd++) {
        snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
        struct stat st;
        n += stat(p, &st) == 0;
    }
    return n;
}

/* A ring's submit (io_uring_enter) made to fail `count` times with `mode`
 * without submitting: EINTR, EAGAIN and EBUSY are waited out (exact bytes);
 * EIO breaks the ring's phase: the batch fails with -EIO, nothing hangs or
 * leaks, and the next batch on the same context is exact. Each way of
 * reading (sizing first, hinted staged and linked opens, ranges). */
static void check_submit(const char *mode, int count, int want_rc)
{
    int64_t hints[NFILES];
    for (size_t i = 0; i < NFILES; i++)
        hints[i] = (int64_t)sizes[i];
    for (int hinted = 0; hinted < 2; hinted++) {
        for (int w = 0; w < (hinted ? 2 : 1); w++) {
            for (int unsized = 0; unsized < (hinted ? 1 : 3); unsized++) {
                static const char *const how[] = {"", "unsized=windows,", "unsized=fds,"};
                char args[256], what[320];
                snprintf(args, sizeof(args), "%s%sfault_mode=%s,fault_op=submit,fault_count=%d",
                         ways[w], how[unsized], mode, count);
                snprintf(what, sizeof(what), "%s hinted=%d", args, hinted);
                int fds_before = open_fds();
                fr_ctx *ctx = open_ctx(args, 0);
                if (!ctx)
                    continue;
                fr_pool *pool = fr_pool_new();
                fr_batch *b = fr_pool_get(pool);
                CHECK(fr_batch_prepare(b, NFILES) == 0);
                int rc = fr_read_files(ctx, (const char *const *)paths, hinted ? hints : NULL,
                                       NFILES, b);
                if (rc != want_rc) {
                    fprintf(stderr, "%s: fr_read_files gave %d, want %d\n", what, rc, want_rc);
                    fr_test_failures++;
                }
                for (size_t i = 0; rc == 0 && i < NFILES; i++)
                    if (!fr_test_same(b, i, paths[i])) {
                        fprintf(stderr, "%s: sample %zu: length %lld\n", what, i,
                                (long long)b->samples[i].length);
                        fr_test_failures++;
                    }
                fr_batch_recycle(b);
                long faults = fr_ctx_stat(ctx, "faults_injected");
                if (faults < 1 || faults > count) {
                    fprintf(stderr, "%s: %ld faults injected\n", what, faults);
                    fr_test_failures++;
                }
                /* The plan is spent: the same context reads exactly again,
                 * with the requests of the broken submit gone. */
                read_and_check(ctx, pool, hinted, 0, what);
                read_and_check(ctx, pool, hinted, 0, what);
                fr_ctx_close(ctx);
                fr_pool_close(pool);
                int fds_after = open_fds();
                if (fds_after != fds_before) {
                    fprintf(stderr, "%s: %d descriptors open before, %d after\n", what,
                            fds_before, fds_after);
                    fr_test_failures++;
                }
            }
        }
    }
}

/* Ranges of an image whose ring's submit fails (see check_submit). */
static void check_submit_ranges(const char *mode, int want_rc)
{
    char *image = fr_test_write("submit.img", 1 << 20, 98);
    fr_range ranges[8];
    for (size_t i = 0; i < 8; i++)
        ranges[i] = (fr_range){.offset = i * 131072, .length = 100000};
    char args[128];
    snprintf(args, sizeof(args), "fault_mode=%s,fault_op=submit,fault_count=1", mode);
    fr_ctx *ctx = open_ctx(args, 0);
    if (ctx) {
        fr_pool *pool = fr_pool_new();
        for (int round = 0; round < 2; round++) {
            fr_batch *b = fr_pool_get(pool);
            CHECK(fr_batch_prepare(b, 8) == 0);
            int rc = fr_read_ranges(ctx, image, ranges, 8, b);
            if (rc != (round == 0 ? want_rc : 0)) {
                fprintf(stderr, "ranges %s round %d: rc %d\n", args, round, rc);
                fr_test_failures++;
            }
            for (size_t i = 0; rc == 0 && i < 8; i++)
                CHECK(b->samples[i].length == 100000);
            fr_batch_recycle(b);
        }
        CHECK(fr_ctx_stat(ctx, "faults_injected") == 1);
        fr_ctx_close(ctx);
        fr_pool_close(pool);
    }
    free(image);
}

static void check_bad_args(void)
{
    const char *bad[] = {"fault_mode=boom", "fault_op=read", "fault_mode=eio,fault_count=-2",
                         "fault_mode=eio,fault_count=x", "fault_mode=eio,fault_stall_ms=-1",
                         "fault_mode=eio,fault_op=write", "fault_mode=ebusy,fault_op=read",
                         "fault_mode=short,fault_op=submit", "fault_mode=ecanceled,fault_op=submit",
                         "fault_mode=eagain,fault_op=submit,fault_count=-1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fr_config cfg;
        fr_config_init(&cfg);
        cfg.engine = "io_uring";
        cfg.engine_args = bad[i];
        fr_ctx *ctx = NULL;
        char err[FR_ERRLEN] = "";
        int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
        if (rc != -EINVAL || !strstr(err, "fault_")) {
            fprintf(stderr, "engine_args %s: rc %d, err '%s'\n", bad[i], rc, err);
            fr_test_failures++;
        }
        if (rc == 0)
            fr_ctx_close(ctx);
    }
    /* Off by default: nothing is injected. */
    fr_ctx *ctx = open_ctx("", 0);
    if (ctx) {
        CHECK(fr_ctx_stat(ctx, "faults_injected") == 0);
        fr_ctx_close(ctx);
    }
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0) {
        printf("test_uring_faults: skipped: %s\n", why);
        return 77;
    }
    for (size_t i = 0; i < NFILES; i++)
        paths[i] = fr_test_write(names[i], sizes[i], (unsigned)i + 1);

    check_bad_args();
    /* Hard errors fail the victim alone, naming its errno. */
    check_files("eio", "read", 1, -EIO, 1);
    check_files("eio", "open", 1, -EIO, 1);
    /* Retried: exact bytes. */
    check_files("eintr", "read", 3, 0, 1);
    check_files("eagain", "read", 3, 0, 1);
    check_files("eintr", "open", 3, 0, 1);
    check_files("eagain", "open", 3, 0, 1);
    check_files("short", "read", 3, 0, 1);
    check_files("stall", "read", 1, 0, 1);
    check_files("stall", "open", 1, 0, 1);
    /* Every completion of the victim fails: the repair path still reads it. */
    check_files("eintr", "read", -1, 0, 1);
    check_files("short", "read", -1, 0, 1);
    /* A completion cancelled (ECANCELED) that the engine did not cancel
     * itself: read again on the sure path, exact bytes. */
    check_files("ecanceled", "read", 1, 0, 1);
    check_files("ecanceled", "open", 1, 0, 1);
    check_files("ecanceled", "read", -1, 0, 1);
    check_ranges();
    /* Submits that fail. */
    check_submit("eintr", 3, 0);
    check_submit("eagain", 3, 0);
    check_submit("ebusy", 3, 0);
    check_submit("eio", 1, -EIO);
    check_submit_ranges("eagain", 0);
    check_submit_ranges("eio", -EIO);

    for (size_t i = 0; i < NFILES; i++)
        free(paths[i]);
    return fr_test_finish("test_uring_faults");
}
