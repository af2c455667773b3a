#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fr_test_failures = 0;

const size_t fr_test_sizes[] = {0, 1, 511, 512, 513, 4095, 4096, 4097, 100000, (2u << 20) + 333};
const size_t fr_test_nsizes = sizeof(fr_test_sizes) / sizeof(fr_test_sizes[0]);

static char test_dir[512];

const char *fr_test_dir(void)
{
    if (test_dir[0])
        return test_dir;
    const char *base = getenv("TMPDIR");
    snprintf(test_dir, sizeof(test_dir), "%s/fastread-ctest-XXXXXX", base ? base : "/var/tmp");
    if (!mkdtemp(test_dir)) {
        perror("mkdtemp");
        exit(2);
    }
    return test_dir;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void fr_test_cleanup(void)
{
    if (test_dir[0])
        nftw(test_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *fr_test_write(const char *name, size_t size, unsigned seed)
{
    char *path = malloc(1024);
    snprintf(path, 1024, "%s/%s", fr_test_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        fputc((int)(x & 0xFF), f);
    }
    fclose(f);
    return path;
}

int fr_test_same(const fr_batch *batch, size_t i, const char *path)
{
    const fr_sample *s = &batch->samples[i];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    int same = s->length == size;
    if (same && size > 0) {
        unsigned char *buf = malloc((size_t)size);
        same = fread(buf, 1, (size_t)size, f) == (size_t)size &&
               memcmp(buf, batch->arena.base + s->offset, (size_t)size) == 0;
        free(buf);
    }
    fclose(f);
    return same;
}

fr_ctx *fr_test_ctx(const char *engine)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0) {
        fprintf(stderr, "opening a %s context: %s\n", engine, err);
        fr_test_failures++;
        return NULL;
    }
    return ctx;
}

int fr_test_engine_roundtrip(const fr_config *cfg, int repeat)
{
    char name[64];
    size_t n = fr_test_nsizes * (size_t)repeat;
    char **paths = calloc(n, sizeof(char *));
    for (size_t i = 0; i < fr_test_nsizes; i++) {
        snprintf(name, sizeof(name), "size-%zu.bin", fr_test_sizes[i]);
        paths[i] = fr_test_write(name, fr_test_sizes[i], (unsigned)i);
    }
    for (size_t i = fr_test_nsizes; i < n; i++)
        paths[i] = paths[i % fr_test_nsizes];

    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    int rc = fr_ctx_open(cfg, &ctx, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "fr_ctx_open(%s): %s\n", cfg->engine, err);
        return 1;
    }
    fr_pool *pool = fr_pool_new();
    int bad = 0;
    int64_t *hints = malloc(n * sizeof(int64_t));
    for (int round = 0; round < 3; round++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, n) == 0);
        /* Round 0 sizes the files itself; later rounds pass the sizes it saw. */
        CHECK(fr_read_files(ctx, (const char *const *)paths, round ? hints : NULL, n, b) == 0);
        for (size_t i = 0; i < n; i++)
            hints[i] = b->samples[i].length;
        for (size_t i = 0; i < n; i++) {
            if (!fr_test_same(b, i, paths[i])) {
                fprintf(stderr, "%s o_direct=%d: sample %zu (%s) differs, length %lld\n",
                        cfg->engine, cfg->o_direct, i, paths[i], (long long)b->samples[i].length);
                bad++;
            }
            if (cfg->o_direct && b->samples[i].offset % cfg->direct_alignment != 0)
                bad++;
        }
        fr_batch_recycle(b);
    }
    free(hints);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
    for (size_t i = 0; i < fr_test_nsizes; i++)
        free(paths[i]);
    free(paths);
    return bad;
}

void fr_test_write_changing(const char *prefix, size_t grew, size_t shrank,
                            char *paths[CH_COUNT])
{
    static const char *const names[CH_COUNT] = {"grew", "shrank", "same",
                                                "gone", "dir", "fifo"};
    const size_t sizes[CH_COUNT] = {grew, shrank, 4096, 10, 10, 10};
    for (int i = 0; i < CH_COUNT; i++) {
        char name[64];
        snprintf(name, sizeof(name), "%s%s.bin", prefix, names[i]);
        paths[i] = fr_test_write(name, sizes[i], (unsigned)i + 1);
    }
}

int fr_test_read_as_now(const fr_batch *batch, char *const paths[CH_COUNT])
{
    return fr_test_same(batch, CH_GREW, paths[CH_GREW]) &&
           fr_test_same(batch, CH_SHRANK, paths[CH_SHRANK]) &&
           fr_test_same(batch, CH_SAME, paths[CH_SAME]) &&
           batch->samples[CH_GONE].length == -ENOENT &&
           batch->samples[CH_DIR].length == -EISDIR && batch->samples[CH_FIFO].length == -EINVAL;
}

int fr_test_unmake_files(const char *gone, const char *dir, const char *fifo)
{
    int rc = 0;
    rc |= unlink(gone);
    rc |= unlink(dir);
    rc |= mkdir(dir, 0755);
    rc |= unlink(fifo);
    rc |= mkfifo(fifo, 0644);
    return rc ? -1 : 0;
}

static unsigned env_factor(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end || n < 1 || n > 1000) {
        fprintf(stderr, "%s=%s: expected an integer in 1..1000; using %u\n", name, v, dflt);
        return dflt;
    }
    return (unsigned)n;
}

int fr_test_is_permutation(const int64_t *p, size_t n)
{
    unsigned char *seen = calloc(n ? n : 1, 1);
    int ok = seen != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        ok = p[i] >= 0 && (size_t)p[i] < n && !seen[p[i]];
        if (ok)
            seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

unsigned fr_test_slowdown(void)
{
#if defined(__SANITIZE_THREAD__)
    return env_factor("FASTREAD_TEST_SLOWDOWN", 20);
#else
    return env_factor("FASTREAD_TEST_SLOWDOWN", 1);
#endif
}

const char *fr_test_xnvme_unrunnable(const char *engine_args)
{
#if defined(__SANITIZE_THREAD__)
    /* glibc's POSIX AIO (xNVMe's async=posix) starts its helper threads from
     * inside libc (handle_fildes_io calls pthread_create directly), out of
     * sight of TSan's interceptors; the first allocation on such a thread
     * crashes TSan (SIGSEGV in its allocator: test_xnvme_file with xNVMe
     * 0.7.5). Not a race of ours: the ASan and optimised builds run it. */
    if (engine_args && strstr(engine_args, "async=posix"))
        return "ThreadSanitizer cannot run glibc's POSIX AIO (async=posix): its helper "
               "threads start inside libc, unseen by TSan, which crashes in them; the "
               "ASan+UBSan and optimised builds run it";
#else
    (void)engine_args;
#endif
    return NULL;
}

int fr_test_finish(const char *name)
{
    fr_test_cleanup();
    if (fr_test_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, fr_test_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

int fr_test_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own descriptor */
}
