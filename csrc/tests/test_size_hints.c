/* Size hints are only hints: a file that grew, shrank, vanished or became a
 * directory since its size was recorded reads as it is now. */
#include <errno.h>
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

int main(void)
{
    check_engine("psync");
    check_engine("io_uring");
    return fr_test_finish("test_size_hints");
}
