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
    char *grew = fr_test_write("grew.bin", 70000, 1);
    char *shrank = fr_test_write("shrank.bin", 5000, 2);
    char *same = fr_test_write("same.bin", 4096, 3);
    char *gone = fr_test_write("gone.bin", 10, 4);
    char *dir = fr_test_write("dir.bin", 10, 5);
    char *fifo = fr_test_write("fifo.bin", 10, 6);
    const char *paths[] = {grew, shrank, same, gone, dir, fifo};
    int64_t hints[] = {100, 900000, 4096, 10, 10, 10};
    CHECK(fr_test_unmake_files(gone, dir, fifo) == 0);

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
        CHECK(fr_batch_prepare(b, 6) == 0);
        CHECK(fr_read_files(ctx, paths, hints, 6, b) == 0);
        CHECK(fr_test_same(b, 0, grew));
        CHECK(fr_test_same(b, 1, shrank));
        CHECK(fr_test_same(b, 2, same));
        CHECK(b->samples[3].length == -ENOENT);
        CHECK(b->samples[4].length == -EISDIR);
        CHECK(b->samples[5].length == -EINVAL);
        fr_batch_recycle(b);
        fr_ctx_close(ctx);
        fr_pool_close(pool);
    }
    rmdir(dir);
    unlink(fifo);
    free(fifo);
    free(grew);
    free(shrank);
    free(same);
    free(gone);
    free(dir);
}

int main(void)
{
    check_engine("psync");
    check_engine("io_uring");
    return fr_test_finish("test_size_hints");
}
