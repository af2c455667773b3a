/* One fr_read_files call spread over a context's rings or threads keeps the
 * contract of a sequential one: every sample's bytes in input order, errors
 * per sample, the repair path for wrong size hints, lists longer than an
 * engine's window; io_uring setup flags the kernel refuses fall back; a
 * context may be used by a different thread at each call (one at a time);
 * and a fork()ed child is refused the parent's context rather than hung. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* io_uring's setup flags (linux/io_uring.h), so the test builds without liburing. */
#define SETUP_SINGLE_ISSUER (1L << 12)
#define SETUP_DEFER_TASKRUN (1L << 13)

#define NDISTINCT 24
#define NLIST 600 /* more than the engines' windows of 256 */

typedef struct fixture {
    char *files[NDISTINCT];
    char *missing;
    char *dir;
    const char *paths[NLIST];
    int64_t expect_err[NLIST]; /* 0: bytes of paths[i]; < 0: this -errno */
} fixture;

static void fixture_make(fixture *f)
{
    /* Sizes around every edge the engines care about: empty, sub-page,
     * page +- 1, an O_DIRECT block +- 1, larger than a registered chunk. */
    static const size_t sizes[] = {0,     1,     511,   512,    4095,   4096,  4097,  8191,
                                   12288, 65536, 92160, 100000, 131073, 7,     300,   2048,
                                   1,     9999,  4096,  65535,  1 << 20, 33,   77777, 4095};
    char name[64];
    for (int k = 0; k < NDISTINCT; k++) {
        snprintf(name, sizeof(name), "par-%02d.bin", k);
        f->files[k] = fr_test_write(name, sizes[k], 100u + (unsigned)k);
    }
    f->missing = fr_test_write("par-missing.bin", 1, 1);
    unlink(f->missing);
    f->dir = fr_test_write("par-dir", 1, 1);
    unlink(f->dir);
    CHECK(mkdir(f->dir, 0755) == 0);
    /* A scrambled order, so input order is not file order. */
    for (size_t i = 0; i < NLIST; i++) {
        if (i % 97 == 13) {
            f->paths[i] = f->missing;
            f->expect_err[i] = -ENOENT;
        } else if (i % 101 == 50) {
            f->paths[i] = f->dir;
            f->expect_err[i] = -EISDIR;
        } else {
            f->paths[i] = f->files[(i * 7 + i / 5) % NDISTINCT];
            f->expect_err[i] = 0;
        }
    }
}

static void fixture_free(fixture *f)
{
    for (int k = 0; k < NDISTINCT; k++)
        free(f->files[k]);
    rmdir(f->dir);
    free(f->missing);
    free(f->dir);
}

/* Checks every sample of a batch read from f->paths[0..n). */
static int check_batch(const fixture *f, const fr_batch *b, size_t n, const char *what)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        int ok = f->expect_err[i] ? b->samples[i].length == f->expect_err[i]
                                  : fr_test_same(b, i, f->paths[i]);
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "%s: sample %zu (%s): length %lld, want %s\n", what, i,
                        f->paths[i], (long long)b->samples[i].length,
                        f->expect_err[i] ? strerror((int)-f->expect_err[i]) : "its bytes");
            bad++;
        }
    }
    return bad;
}

/* Three calls on one context: no hints, the hints it learned, then hints
 * that are wrong for a third of the files (too small, too large, unknown). */
static void check_config(const fixture *f, const fr_config *cfg, size_t n)
{
    char what[160];
    snprintf(what, sizeof(what), "%s '%s' threads=%u depth=%u o_direct=%d fixed_files=%d n=%zu",
             cfg->engine, cfg->engine_args, cfg->threads, cfg->queue_depth, cfg->o_direct,
             cfg->register_files, n);
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    int rc = fr_ctx_open(cfg, &ctx, err, sizeof(err));
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, err);
        return;
    }
    fr_pool *pool = fr_pool_new();
    int64_t *hints = malloc(n * sizeof(*hints));
    for (int round = 0; round < 3; round++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, n) == 0);
        CHECK(fr_read_files(ctx, f->paths, round ? hints : NULL, n, b) == 0);
        CHECK(b->count == n);
        int bad = check_batch(f, b, n, what);
        if (bad)
            fprintf(stderr, "%s round %d: %d bad samples\n", what, round, bad);
        CHECK(bad == 0);
        for (size_t i = 0; i < n; i++) {
            hints[i] = b->samples[i].length;
            if (round == 1 && hints[i] >= 0 && i % 3 == 0)
                hints[i] = (i % 2) ? hints[i] / 2 : hints[i] * 3 + 5;
            if (round == 1 && i % 3 == 1 && i % 2)
                hints[i] = -1;
        }
        fr_batch_recycle(b);
    }
    free(hints);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

static void check_engines(const fixture *f)
{
    static const char *const engines[] = {"io_uring", "psync"};
    static const unsigned threads[] = {1, 3, 4};
    static const unsigned depths[] = {1, 5, 64};
    static const size_t lengths[] = {1, 64, NLIST};
    char why[FR_ERRLEN];
    for (int e = 0; e < 2; e++) {
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0)
            continue;
        for (int t = 0; t < 3; t++)
            for (int d = 0; d < 3; d++)
                for (int mode = 0; mode < 4; mode++) {
                    fr_config cfg;
                    fr_config_init(&cfg);
                    cfg.engine = engines[e];
                    cfg.threads = threads[t];
                    cfg.queue_depth = depths[d];
                    cfg.o_direct = mode & 1;
                    cfg.register_files = (mode >> 1) & 1;
                    if (e == 1 && (d > 0 || mode > 1))
                        continue; /* psync ignores depth and direct descriptors */
                    /* io_uring's two ways to read files of known size. */
                    for (int v = 0; v < (e == 0 ? 2 : 1); v++) {
                        cfg.engine_args = v ? "open=linked" : "";
                        for (int l = 0; l < 3; l++)
                            check_config(f, &cfg, lengths[l]);
                    }
                }
    }
}

/* A ring the kernel refuses comes up with fewer flags; unknown engine_args
 * are refused by name. */
static void check_setup_fallback(const fixture *f)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0)
        return;
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    cfg.threads = 2;
    /* Bit 31 is no IORING_SETUP_* flag: every kernel refuses it with EINVAL. */
    const char *args[] = {"setup_extra=0x80000000", "taskrun=plain", "taskrun=coop",
                          "taskrun=single", "taskrun=defer", "", "taskrun=defer,setup_extra=0"};
    for (size_t a = 0; a < sizeof(args) / sizeof(args[0]); a++) {
        cfg.engine_args = args[a];
        fr_ctx *ctx = NULL;
        char err[FR_ERRLEN] = "";
        int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
        CHECK(rc == 0);
        if (rc) {
            fprintf(stderr, "engine_args '%s': %s\n", args[a], err);
            continue;
        }
        long flags = fr_ctx_stat(ctx, "setup_flags");
        CHECK(flags >= 0);
        CHECK((flags & 0x80000000L) == 0);
        if (strcmp(args[a], "taskrun=plain") == 0)
            CHECK(flags == 0);
        if (strcmp(args[a], "taskrun=coop") == 0)
            CHECK((flags & (SETUP_SINGLE_ISSUER | SETUP_DEFER_TASKRUN)) == 0);
        if (flags & SETUP_DEFER_TASKRUN)
            CHECK(flags & SETUP_SINGLE_ISSUER);
        CHECK(fr_ctx_stat(ctx, "threads") == 2);
        fr_pool *pool = fr_pool_new();
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, 64) == 0);
        CHECK(fr_read_files(ctx, f->paths, NULL, 64, b) == 0);
        CHECK(check_batch(f, b, 64, args[a]) == 0);
        fr_batch_recycle(b);
        fr_ctx_close(ctx);
        fr_pool_close(pool);
    }
    const char *wrong[] = {"taskrun=sometimes", "nosuch=1", "setup_extra=x", "open=later"};
    for (size_t a = 0; a < sizeof(wrong) / sizeof(wrong[0]); a++) {
        cfg.engine_args = wrong[a];
        fr_ctx *ctx = NULL;
        char err[FR_ERRLEN] = "";
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL);
        CHECK(ctx == NULL);
        CHECK(strstr(err, "io_uring") != NULL);
        /* ... and the key refused */
        char key[32];
        snprintf(key, sizeof(key), "%.*s", (int)strcspn(wrong[a], "="), wrong[a]);
        CHECK(strstr(err, key) != NULL);
    }
}

/* One context, used by a different thread at each call. */
typedef struct hop {
    const fixture *f;
    fr_ctx *ctx;
    fr_pool *pool;
    int bad;
} hop;

static void *hop_main(void *arg)
{
    hop *h = arg;
    for (int round = 0; round < 2; round++) {
        fr_batch *b = fr_pool_get(h->pool);
        if (fr_batch_prepare(b, NLIST) != 0 ||
            fr_read_files(h->ctx, h->f->paths, NULL, NLIST, b) != 0)
            h->bad++;
        else
            h->bad += check_batch(h->f, b, NLIST, "thread hop");
        fr_batch_recycle(b);
    }
    return NULL;
}

static void check_thread_hops(const fixture *f)
{
    static const char *const engines[] = {"io_uring", "psync"};
    char why[FR_ERRLEN];
    for (int e = 0; e < 2; e++) {
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0)
            continue;
        fr_config cfg;
        fr_config_init(&cfg);
        cfg.engine = engines[e];
        cfg.threads = 3;
        char err[FR_ERRLEN];
        hop h = {.f = f, .pool = fr_pool_new()};
        CHECK(fr_ctx_open(&cfg, &h.ctx, err, sizeof(err)) == 0);
        for (int t = 0; t < 3; t++) {
            pthread_t th;
            CHECK(pthread_create(&th, NULL, hop_main, &h) == 0);
            CHECK(pthread_join(th, NULL) == 0);
        }
        hop_main(&h); /* and the thread that opened it */
        CHECK(h.bad == 0);
        fr_ctx_close(h.ctx);
        fr_pool_close(h.pool);
    }
}

/* A fork()ed child gets ECHILD from its parent's context instead of waiting
 * forever for helper threads that only exist in the parent, and may close
 * it; the parent's context is unharmed. */
static void check_fork(const fixture *f)
{
    static const char *const engines[] = {"io_uring", "psync"};
    char why[FR_ERRLEN];
    for (int e = 0; e < 2; e++) {
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0)
            continue;
        fr_config cfg;
        fr_config_init(&cfg);
        cfg.engine = engines[e];
        cfg.threads = 2;
        fr_ctx *ctx = NULL;
        char err[FR_ERRLEN];
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
        fr_pool *pool = fr_pool_new();
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, 64) == 0);
        CHECK(fr_read_files(ctx, f->paths, NULL, 64, b) == 0);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            alarm(30); /* a hang fails the test instead of stalling it */
            int ok = fr_read_files(ctx, f->paths, NULL, 64, b) == -ECHILD;
            fr_range r = {0, 1};
            ok = ok && fr_read_ranges(ctx, f->paths[0], &r, 1, b) == -ECHILD;
            fr_ctx_close(ctx);
            _exit(ok ? 0 : 1);
        }
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK(fr_read_files(ctx, f->paths, NULL, 64, b) == 0);
        CHECK(check_batch(f, b, 64, "after fork") == 0);
        fr_batch_recycle(b);
        fr_ctx_close(ctx);
        fr_pool_close(pool);
    }
}

int main(void)
{
    fixture f;
    fixture_make(&f);
    check_engines(&f);
    check_setup_fallback(&f);
    check_thread_hops(&f);
    check_fork(&f);
    fixture_free(&f);
    return fr_test_finish("test_parallel");
}
