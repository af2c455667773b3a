#define _GNU_SOURCE
/* Size hints are only hints: a file that grew, shrank, vanished or became a
 * directory since its size was recorded reads as it is now; so does a file
 * of exactly 1 GiB (the largest single read) that grew. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static void check_engine(const char *engine)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe(engine, why, sizeof(why)) != 0)
        return;
    char *paths[CH_COUNT];
    fr_test_write_changing("", 70000, 5000, paths);
    int64_t hints[CH_COUNT] = {100, 900000, 4096, 10, 10, 10};
    CHECK(fr_test_unmake_files(paths[CH_GONE], paths[CH_DIR], paths[CH_FIFO]) == 0);

    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    for (int direct = 0; direct < 2; direct++) {
        cfg.o_direct = direct;
        fr_ctx *ctx;
        char err[FR_ERRLEN];
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
        fr_pool *pool = fr_pool_new();
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, CH_COUNT) == 0);
        CHECK(fr_read_files(ctx, (const char *const *)paths, hints, CH_COUNT, b) == 0);
        CHECK(fr_test_read_as_now(b, paths));
        fr_batch_recycle(b);
        fr_ctx_close(ctx);
        fr_pool_close(pool);
    }
    rmdir(paths[CH_DIR]);
    unlink(paths[CH_FIFO]);
    for (int i = 0; i < CH_COUNT; i++)
        free(paths[i]);
}

/* A file hinted at exactly FR_MAX_REQUEST (1 GiB) bytes that grew by 8: a
 * read capped at the hint returned exactly the hint, and the sample came
 * back cut short with no error. Sparse, so nothing is written to disk. */
static void check_capped_growth(const char *engine)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe(engine, why, sizeof(why)) != 0)
        return;
    char path[1100];
    snprintf(path, sizeof(path), "%s/gib-grew", fr_test_dir());
    const int64_t gib = (int64_t)1 << 30;
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(ftruncate(fd, (off_t)(gib + 8)) == 0);
    CHECK(pwrite(fd, "grown!!!", 8, (off_t)gib) == 8);
    CHECK(close(fd) == 0);
    fr_ctx *ctx = fr_test_ctx(engine);
    if (!ctx) {
        unlink(path);
        return;
    }
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 1) == 0);
    const char *paths[1] = {path};
    int64_t hint = gib;
    CHECK(fr_read_files(ctx, paths, &hint, 1, b) == 0);
    CHECK(b->samples[0].length == gib + 8);
    if (b->samples[0].length == gib + 8)
        CHECK(memcmp(b->arena.base + b->samples[0].offset + gib, "grown!!!", 8) == 0);
    fr_batch_recycle(b);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
    unlink(path);
}

int main(void)
{
    check_engine("psync");
    check_engine("io_uring");
    check_capped_growth("psync");
    check_capped_growth("io_uring");
    return fr_test_finish("test_size_hints");
}
