/* engine="auto" (fr_config.auto_engine): the rule itself, the timed trials
 * between the engines for large cached files, and a context that sends
 * batches of cached large files to the rule's pick (psync here: as on
 * FR_AUTO_MIN_CPUS CPUs), or after a trial to the faster engine, and
 * everything else to io_uring, with the same bytes either way. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/auto_trial.h"
#include "harness.h"

#define NFILES 12

static void check_rule(void)
{
    /* Small files, cold files, O_DIRECT, few CPUs: io_uring. */
    CHECK(fr_auto_rule(4096, 1, 16, 0) == FR_AUTO_URING);
    CHECK(fr_auto_rule(FR_AUTO_MIN_SIZE - 1, 1, 64, 0) == FR_AUTO_URING);
    CHECK(fr_auto_rule(1 << 20, 0, 16, 0) == FR_AUTO_URING);
    CHECK(fr_auto_rule(1 << 20, -1, 16, 0) == FR_AUTO_URING);
    CHECK(fr_auto_rule(1 << 20, 1, 16, 1) == FR_AUTO_URING);
    CHECK(fr_auto_rule(1 << 20, 1, FR_AUTO_MIN_CPUS - 1, 0) == FR_AUTO_URING);
    /* Cached large files on a machine with cores to copy in parallel: psync. */
    CHECK(fr_auto_rule(FR_AUTO_MIN_SIZE, 1, FR_AUTO_MIN_CPUS, 0) == FR_AUTO_PSYNC);
    CHECK(fr_auto_rule(1 << 20, 1, 16, 0) == FR_AUTO_PSYNC);
}

/* `count` picks of the trials, each recorded as a batch of 1 MB read at
 * ns_per_byte[engine]; checks each pick is `want`. */
static void run_trial_batches(fr_auto_trial *t, unsigned count, int want, const double ns_per_byte[2])
{
    for (unsigned i = 0; i < count; i++) {
        int e = fr_auto_trial_pick(t);
        CHECK(e == want);
        fr_auto_trial_record(t, e, 1000000, (long)(ns_per_byte[e] * 1e6));
    }
}

/* The trials alone, on made-up timings. */
static void check_trials(void)
{
    fr_auto_trial t;
    memset(&t, 0, sizeof(t));
    fr_auto_trial_reset(&t, FR_AUTO_PSYNC);
    double io_uring_faster[2] = {[FR_AUTO_URING] = 0.5, [FR_AUTO_PSYNC] = 1.0};
    /* The rule's pick first; then a trial of the other engine, which it
     * keeps for its lead of 2x. */
    run_trial_batches(&t, FR_AUTO_TRIAL_FIRST, FR_AUTO_PSYNC, io_uring_faster);
    CHECK(t.trials == 0);
    run_trial_batches(&t, FR_AUTO_TRIAL_BATCHES, FR_AUTO_URING, io_uring_faster);
    CHECK(t.trials == 1 && t.switches == 1 && t.keep == FR_AUTO_URING);
    /* Kept until the next trial, then psync is tried; faster, but by less
     * than the margin: io_uring stays. */
    double close[2] = {[FR_AUTO_URING] = 1.0, [FR_AUTO_PSYNC] = 1.0 - FR_AUTO_TRIAL_MARGIN * 0.8};
    run_trial_batches(&t, FR_AUTO_TRIAL_EVERY, FR_AUTO_URING, close);
    run_trial_batches(&t, FR_AUTO_TRIAL_BATCHES, FR_AUTO_PSYNC, close);
    CHECK(t.trials == 2 && t.switches == 1 && t.keep == FR_AUTO_URING);

    /* A trial's first batch (its pool waking up) and failed batches (no
     * bytes) are not timed: a slow first batch does not decide. */
    fr_auto_trial_reset(&t, FR_AUTO_PSYNC);
    CHECK(t.trials == 2); /* counters stay */
    /* After a reset (another data set) the first trial comes early again. */
    run_trial_batches(&t, FR_AUTO_TRIAL_FIRST, FR_AUTO_PSYNC, io_uring_faster);
    CHECK(t.trials == 2);
    int e = fr_auto_trial_pick(&t);
    CHECK(e == FR_AUTO_URING);
    CHECK(t.trials == 3);
    fr_auto_trial_record(&t, e, 1000000, 50L * 1000000); /* 50 ns a byte, untimed */
    e = fr_auto_trial_pick(&t);
    CHECK(e == FR_AUTO_URING);
    fr_auto_trial_record(&t, e, 0, 1000); /* failed: untimed */
    for (unsigned i = 2; i < FR_AUTO_TRIAL_BATCHES; i++) {
        e = fr_auto_trial_pick(&t);
        CHECK(e == FR_AUTO_URING);
        fr_auto_trial_record(&t, e, 1000000, 500000); /* 0.5 ns a byte */
    }
    CHECK(t.left == 0 && t.keep == FR_AUTO_URING && t.switches == 2);

    /* One slow batch of the kept engine (its arena faulting in) does not
     * make a slower engine win: medians, not means. */
    fr_auto_trial_reset(&t, FR_AUTO_PSYNC);
    double psync_faster[2] = {[FR_AUTO_URING] = 1.2, [FR_AUTO_PSYNC] = 1.0};
    for (unsigned i = 0; i < FR_AUTO_TRIAL_FIRST; i++) {
        e = fr_auto_trial_pick(&t);
        CHECK(e == FR_AUTO_PSYNC);
        long ns = i == FR_AUTO_TRIAL_FIRST - 2 ? 3000000 : 1000000; /* 3.0 ns a byte once */
        fr_auto_trial_record(&t, e, 1000000, ns);
    }
    run_trial_batches(&t, FR_AUTO_TRIAL_BATCHES, FR_AUTO_URING, psync_faster);
    CHECK(t.keep == FR_AUTO_PSYNC && t.switches == 2);

    /* No timing of the kept engine (every batch failed): no switch. */
    fr_auto_trial_reset(&t, FR_AUTO_PSYNC);
    for (unsigned i = 0; i < FR_AUTO_TRIAL_FIRST; i++)
        fr_auto_trial_record(&t, fr_auto_trial_pick(&t), 0, 1000);
    run_trial_batches(&t, FR_AUTO_TRIAL_BATCHES, FR_AUTO_URING, io_uring_faster);
    CHECK(t.keep == FR_AUTO_PSYNC);
}

/* 1 if every page of path is cached (mincore over a mapping of it). */
static int all_cached(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    int all = 0;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) {
            size_t pages = ((size_t)st.st_size + 4095) / 4096;
            unsigned char *vec = malloc(pages);
            if (vec && mincore(m, (size_t)st.st_size, vec) == 0) {
                all = 1;
                for (size_t i = 0; i < pages; i++)
                    all &= vec[i] & 1;
            }
            free(vec);
            munmap(m, (size_t)st.st_size);
        }
    }
    if (fd >= 0)
        close(fd);
    return all;
}

/* Drops the files' pages from the page cache (written back first); 1 if no
 * page of the first file is left cached. */
static int evict(char **paths, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY);
        if (fd < 0)
            return 0;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    int fd = open(paths[0], O_RDONLY);
    struct stat st;
    int none = 0;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) {
            size_t pages = ((size_t)st.st_size + 4095) / 4096;
            unsigned char *vec = malloc(pages);
            if (vec && mincore(m, (size_t)st.st_size, vec) == 0) {
                none = 1;
                for (size_t i = 0; i < pages; i++)
                    none &= !(vec[i] & 1);
            }
            free(vec);
            munmap(m, (size_t)st.st_size);
        }
        close(fd);
    }
    return none;
}

/* An io_uring context with auto on, as on a machine of FR_AUTO_MIN_CPUS
 * CPUs; NULL (a failed check) if it cannot open. */
static fr_ctx *open_auto(void)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    cfg.threads = 2;
    cfg.auto_engine = FR_AUTO_AS_MANY_CPUS;
    fr_ctx *ctx;
    char err[FR_ERRLEN];
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0) {
        fprintf(stderr, "open: %s\n", err);
        CHECK(0);
        return NULL;
    }
    return ctx;
}

/* Reads the files with a fresh auto context; checks bytes; returns the
 * batches psync read (of `calls`, with and without size hints). */
static long read_auto(char **paths, size_t n, int calls, int hints)
{
    fr_ctx *ctx = open_auto();
    if (!ctx)
        return -1;
    CHECK(fr_ctx_stat(ctx, "auto_engine") == 1);
    int64_t sizes[NFILES];
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        CHECK(stat(paths[i], &st) == 0);
        sizes[i] = st.st_size;
    }
    fr_pool *pool = fr_pool_new();
    for (int c = 0; c < calls; c++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, n) == 0);
        CHECK(fr_read_files(ctx, (const char *const *)paths, hints ? sizes : NULL, n, b) == 0);
        for (size_t i = 0; i < n; i++)
            CHECK(fr_test_same(b, i, paths[i]));
        fr_batch_recycle(b);
    }
    long psync = fr_ctx_stat(ctx, "auto_psync_batches");
    CHECK(psync + fr_ctx_stat(ctx, "auto_uring_batches") == calls);
    if (psync == 0 || psync == calls)
        CHECK(fr_ctx_stat(ctx, "auto_last") == (psync ? FR_AUTO_PSYNC : FR_AUTO_URING));
    fr_ctx_close(ctx);
    fr_pool_close(pool);
    return psync;
}

/* One call of `ctx` on the files; checks bytes; returns the engine it picked. */
static long read_once(fr_ctx *ctx, fr_pool *pool, char **paths, size_t n)
{
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, n) == 0);
    CHECK(fr_read_files(ctx, (const char *const *)paths, NULL, n, b) == 0);
    for (size_t i = 0; i < n; i++)
        CHECK(fr_test_same(b, i, paths[i]));
    fr_batch_recycle(b);
    return fr_ctx_stat(ctx, "auto_last");
}

/* Reads the files through plainly, so that they are cached (an earlier
 * check may have evicted them). */
static void cache(char **paths, size_t n)
{
    char buf[1 << 16];
    for (size_t i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY);
        CHECK(fd >= 0);
        while (fd >= 0 && read(fd, buf, sizeof(buf)) > 0) {
        }
        if (fd >= 0)
            close(fd);
    }
}

/* One context over large files: psync while they are cached; evicted
 * between two calls (a data set that left the page cache between epochs),
 * the very next call goes to io_uring (residency is sampled every batch);
 * that read cached them again, so the one after is psync's. */
static void check_eviction_between_calls(char **paths, size_t n)
{
    fr_ctx *ctx = open_auto();
    if (!ctx)
        return;
    fr_pool *pool = fr_pool_new();
    cache(paths, n);
    CHECK(read_once(ctx, pool, paths, n) == FR_AUTO_PSYNC);
    CHECK(read_once(ctx, pool, paths, n) == FR_AUTO_PSYNC);
    if (evict(paths, n)) {
        CHECK(read_once(ctx, pool, paths, n) == FR_AUTO_URING);
        CHECK(read_once(ctx, pool, paths, n) == FR_AUTO_PSYNC);
    } else {
        printf("page cache eviction had no effect here: eviction between calls skipped\n");
    }
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

/* `count` calls of `ctx` on the files, each checked to pick `want`. */
static void read_times(fr_ctx *ctx, fr_pool *pool, char **paths, size_t n, unsigned count,
                       long want)
{
    for (unsigned i = 0; i < count; i++)
        CHECK(read_once(ctx, pool, paths, n) == want);
}

/* A context over cached large files runs its first trial after
 * FR_AUTO_TRIAL_FIRST batches: the next FR_AUTO_TRIAL_BATCHES go to
 * io_uring, the one after to whichever engine read faster; the same bytes
 * throughout. */
static void check_trial_in_context(char **paths, size_t n)
{
    fr_ctx *ctx = open_auto();
    if (!ctx)
        return;
    fr_pool *pool = fr_pool_new();
    cache(paths, n);
    read_times(ctx, pool, paths, n, FR_AUTO_TRIAL_FIRST, FR_AUTO_PSYNC);
    CHECK(fr_ctx_stat(ctx, "auto_trials") == 0);
    read_times(ctx, pool, paths, n, FR_AUTO_TRIAL_BATCHES, FR_AUTO_URING);
    CHECK(fr_ctx_stat(ctx, "auto_trials") == 1);
    long switches = fr_ctx_stat(ctx, "auto_switches");
    CHECK(switches == 0 || switches == 1);
    CHECK(read_once(ctx, pool, paths, n) == (switches ? FR_AUTO_URING : FR_AUTO_PSYNC));
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

/* Two lists in a row 2x longer than the band's are timed afresh: the first
 * trial comes FR_AUTO_TRIAL_FIRST batches after the change, not
 * FR_AUTO_TRIAL_EVERY after the last trial, and the rule's pick leads until
 * then. One such list (an epoch's odd last one) changes nothing. */
static void check_trials_restart_for_another_list_length(char **paths, size_t n)
{
    fr_ctx *ctx = open_auto();
    if (!ctx)
        return;
    fr_pool *pool = fr_pool_new();
    cache(paths, n);
    size_t few = n / 4;
    read_times(ctx, pool, paths, few, FR_AUTO_TRIAL_FIRST - 1, FR_AUTO_PSYNC);
    CHECK(read_once(ctx, pool, paths, n) == FR_AUTO_PSYNC); /* one long list */
    read_times(ctx, pool, paths, few, FR_AUTO_TRIAL_BATCHES, FR_AUTO_URING); /* on time */
    CHECK(fr_ctx_stat(ctx, "auto_trials") == 1);
    read_once(ctx, pool, paths, n); /* the kept engine, whichever it is */
    read_times(ctx, pool, paths, n, FR_AUTO_TRIAL_FIRST, FR_AUTO_PSYNC);
    CHECK(read_once(ctx, pool, paths, n) == FR_AUTO_URING);
    CHECK(fr_ctx_stat(ctx, "auto_trials") == 2);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

/* engine "auto" is resolved by the core alone (fr_engine_auto): io_uring
 * with the per-batch choice where io_uring runs, else psync; contexts and
 * readers say which engine they read with. */
static void check_engine_auto(char **paths, size_t n)
{
    int probe = 1;
    char why[FR_ERRLEN] = "x";
    const char *name = fr_engine_auto(&probe, why, sizeof(why));
    char why2[FR_ERRLEN];
    int uring = fr_engine_probe("io_uring", why2, sizeof(why2)) == 0;
    CHECK(strcmp(name, uring ? "io_uring" : "psync") == 0);
    CHECK(uring ? probe == 0 && why[0] == 0 : probe < 0 && why[0] != 0);
    CHECK(strcmp(fr_engine_auto(NULL, NULL, 0), name) == 0);

    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "auto";
    cfg.threads = 2;
    fr_ctx *ctx;
    char err[FR_ERRLEN] = "";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    CHECK(strcmp(fr_ctx_engine(ctx), name) == 0);
    CHECK(fr_ctx_stat(ctx, "auto_engine") == uring);
    CHECK(fr_ctx_stat(ctx, "auto_fallback") == -probe);
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, n) == 0);
    CHECK(fr_read_files(ctx, (const char *const *)paths, NULL, n, b) == 0);
    for (size_t i = 0; i < n; i++)
        CHECK(fr_test_same(b, i, paths[i]));
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
    /* O_DIRECT: the engine auto picks, without the per-batch choice. */
    cfg.o_direct = 1;
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    CHECK(strcmp(fr_ctx_engine(ctx), name) == 0 && fr_ctx_stat(ctx, "auto_engine") == 0);
    fr_ctx_close(ctx);
    cfg.o_direct = 0;
    /* A reader's contexts resolve it the same way. */
    fr_reader *rd;
    CHECK(fr_reader_open(&cfg, (const char *const *)paths, n, 2, 2, &rd, err, sizeof(err)) == 0);
    CHECK(strcmp(fr_reader_engine(rd), name) == 0);
    CHECK(fr_reader_auto_fallback(rd) == -probe);
    fr_reader_close(rd);
    /* An explicit engine is opened as named. */
    cfg.engine = "psync";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    CHECK(strcmp(fr_ctx_engine(ctx), "psync") == 0 && fr_ctx_stat(ctx, "auto_fallback") == 0);
    fr_ctx_close(ctx);

    /* No descriptor left for a ring (RLIMIT_NOFILE at the descriptors open
     * now): io_uring cannot start, auto reads with psync and says why. In
     * a child, whose limit goes with it. */
    if (!uring)
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int top = dup(0); /* the lowest free descriptor: every one below is open */
        struct rlimit rl;
        if (top < 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(77);
        close(top);
        rl.rlim_cur = (rlim_t)top;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(77);
        cfg.engine = "auto";
        int ok = fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0;
        ok = ok && strcmp(fr_ctx_engine(ctx), "psync") == 0;
        ok = ok && fr_ctx_stat(ctx, "auto_fallback") == EMFILE;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        printf("setrlimit(RLIMIT_NOFILE) refused: the fallback case skipped\n");
    else
        CHECK(WEXITSTATUS(status) == 0);
}

int main(void)
{
    check_rule();
    check_trials();
    char *large[NFILES], *small[NFILES];
    char name[64];
    for (unsigned i = 0; i < NFILES; i++) {
        snprintf(name, sizeof(name), "large%u.bin", i);
        large[i] = fr_test_write(name, FR_AUTO_MIN_SIZE + 10000 + i * 4099, i + 1);
        snprintf(name, sizeof(name), "small%u.bin", i);
        small[i] = fr_test_write(name, 3000 + i, i + 100);
    }
    check_engine_auto(small, NFILES);
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0) {
        printf("io_uring unavailable (%s): only the rule and the choice are tested\n", why);
        return fr_test_finish("test_auto");
    }
    /* Small files: io_uring, cached or not, with or without hints. */
    CHECK(read_auto(small, NFILES, 3, 0) == 0);
    CHECK(read_auto(small, NFILES, 3, 1) == 0);
    /* Large cached files (just written): psync. */
    CHECK(all_cached(large[0]));
    CHECK(read_auto(large, NFILES, 3, 0) == 3);
    CHECK(read_auto(large, NFILES, 3, 1) == 3);
    /* Large files out of the cache: io_uring (where eviction works here). */
    if (evict(large, NFILES))
        CHECK(read_auto(large, 1, 1, 0) == 0);
    else
        printf("page cache eviction had no effect here: cold case skipped\n");
    check_eviction_between_calls(large, NFILES);
    check_trial_in_context(large, NFILES);
    check_trials_restart_for_another_list_length(large, NFILES);
    /* O_DIRECT and explicit engines are never switched. */
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    cfg.auto_engine = 1;
    cfg.o_direct = 1;
    fr_ctx *ctx;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    CHECK(fr_ctx_stat(ctx, "auto_engine") == 0);
    fr_ctx_close(ctx);
    cfg.o_direct = 0;
    cfg.engine = "psync";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    CHECK(fr_ctx_stat(ctx, "auto_engine") == 0);
    fr_ctx_close(ctx);
    for (unsigned i = 0; i < NFILES; i++) {
        free(large[i]);
        free(small[i]);
    }
    return fr_test_finish("test_auto");
}
