/* Out of descriptors (RLIMIT_NOFILE): the file engines open fewer files at a
 * time and read every file exactly, instead of failing them with EMFILE. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

#define NFILES 300

static void check_engine(const char *engine, char **paths)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe(engine, why, sizeof(why)) != 0)
        return;
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.threads = 2;
    fr_ctx *ctx;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    fr_pool *pool = fr_pool_new();
    for (int round = 0; round < 2; round++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, NFILES) == 0);
        CHECK(fr_read_files(ctx, (const char *const *)paths, NULL, NFILES, b) == 0);
        int bad = 0;
        for (size_t i = 0; i < NFILES; i++)
            bad += !fr_test_same(b, i, paths[i]);
        CHECK(bad == 0);
        if (bad)
            fprintf(stderr, "%s: %d of %d files wrong (first error %lld)\n", engine, bad, NFILES,
                    (long long)b->samples[0].length);
        fr_batch_recycle(b);
    }
    CHECK(fr_ctx_stat(ctx, "window") < 256 && fr_ctx_stat(ctx, "window") >= 1);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

int main(void)
{
    char *paths[NFILES];
    for (int i = 0; i < NFILES; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%03d.bin", i);
        paths[i] = fr_test_write(name, (size_t)(i * 7 % 5000), (unsigned)i);
    }
    struct rlimit rl = {64, 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("setrlimit");
        return 77;
    }
    check_engine("psync", paths);
    check_engine("io_uring", paths);
    for (int i = 0; i < NFILES; i++)
        free(paths[i]);
    return fr_test_finish("test_fd_limit");
}
