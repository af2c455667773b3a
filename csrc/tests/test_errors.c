/* Per-sample errors: a missing file, a directory, and a FIFO fail alone with
 * their own errno while the good samples around them read correctly. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

static void check_engine(const char *engine, int register_files)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe(engine, why, sizeof(why)) != 0)
        return;
    char *good = fr_test_write("good.bin", 5000, 7);
    char missing[1024], dir[1024], fifo[1024];
    snprintf(missing, sizeof(missing), "%s/no-such-file", fr_test_dir());
    snprintf(dir, sizeof(dir), "%s/a-directory", fr_test_dir());
    snprintf(fifo, sizeof(fifo), "%s/a-fifo", fr_test_dir());
    mkdir(dir, 0755);
    mkfifo(fifo, 0644);
    const char *paths[] = {good, missing, good, dir, fifo, good};
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.register_files = register_files;
    fr_ctx *ctx;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 6) == 0);
    CHECK(fr_read_files(ctx, paths, NULL, 6, b) == 0);
    CHECK(fr_test_same(b, 0, good));
    CHECK(b->samples[1].length == -ENOENT);
    CHECK(fr_test_same(b, 2, good));
    CHECK(b->samples[3].length == -EISDIR);
    CHECK(b->samples[4].length == -EINVAL);
    CHECK(fr_test_same(b, 5, good));
    /* A batch in which every sample fails returns at once. */
    const char *all_bad[] = {missing, dir, missing};
    CHECK(fr_batch_prepare(b, 3) == 0);
    CHECK(fr_read_files(ctx, all_bad, NULL, 3, b) == 0);
    CHECK(b->samples[0].length == -ENOENT && b->samples[1].length == -EISDIR);
    fr_batch_recycle(b);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
    free(good);
}

int main(void)
{
    check_engine("psync", 1);
    check_engine("io_uring", 1);
    check_engine("io_uring", 0);

    /* Bad configurations are refused with a message, not a crash. */
    fr_config cfg;
    fr_config_init(&cfg);
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    cfg.engine = "no-such-engine";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -ENOENT && strstr(err, "no-such-engine"));
    /* psync: the option checks are the engine's neighbours, and psync is
     * built everywhere (io_uring, the default, is not without liburing). */
    fr_config_init(&cfg);
    cfg.engine = "psync";
    cfg.direct_alignment = 1000;
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "direct_alignment"));
    fr_config_init(&cfg);
    cfg.engine = "psync";
    cfg.queue_depth = 0;
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "queue_depth"));
    return fr_test_finish("test_errors");
}
