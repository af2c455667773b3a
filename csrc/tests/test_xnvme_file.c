/* xnvme-file reads every edge size byte-exactly with each async engine the
 * loaded libxnvme reads files with, buffered and O_DIRECT, queued and
 * synchronous, one or many threads; refuses the others at open, naming the
 * engine and the async interface; refuses stacks for devices (sync=nvme,
 * io_uring_cmd, nil) by name; and reports missing files, directories and
 * FIFOs per sample. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

static void errors(void)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "xnvme-file";
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    if (!ctx)
        return;
    char missing[512], fifo[512];
    snprintf(missing, sizeof(missing), "%s/missing.bin", fr_test_dir());
    snprintf(fifo, sizeof(fifo), "%s/fifo.bin", fr_test_dir());
    CHECK(mkfifo(fifo, 0600) == 0);
    char *good = fr_test_write("good.bin", 5000, 7);
    const char *paths[] = {good, missing, fr_test_dir(), fifo, good};
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 5) == 0);
    CHECK(fr_read_files(ctx, paths, NULL, 5, b) == 0);
    CHECK(fr_test_same(b, 0, good));
    CHECK(b->samples[1].length == -ENOENT);
    CHECK(b->samples[2].length == -EISDIR);
    CHECK(b->samples[3].length == -EINVAL);
    CHECK(fr_test_same(b, 4, good));
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
    free(good);

    /* Bad engine_args are refused with the key named. */
    cfg.engine_args = "async=warp";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "warp"));
    cfg.engine_args = "colour=blue";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "colour"));
    cfg.engine_args = "qdepth=3";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "qdepth"));

    /* Stacks that cannot read regular files are refused by name at open,
     * not left to xNVMe (ioctls on a file: SIGFPE on xNVMe main). */
    const char *for_devices[] = {"sync=nvme", "sync=block", "admin=nvme", "async=io_uring_cmd"};
    for (size_t i = 0; i < sizeof(for_devices) / sizeof(for_devices[0]); i++) {
        cfg.engine_args = for_devices[i];
        int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
        if (rc != -ENOTSUP || !strstr(err, "xnvme-file") || !strstr(err, for_devices[i]) ||
            !strstr(err, "regular files"))
            fprintf(stderr, "%s: rc %d, '%s'\n", for_devices[i], rc, err);
        CHECK(rc == -ENOTSUP && strstr(err, "xnvme-file") && strstr(err, for_devices[i]) &&
              strstr(err, "regular files"));
    }
    cfg.engine_args = "async=nil";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "async=nil"));
    /* What both xNVMe lines pick for files themselves is taken. */
    cfg.engine_args = "sync=psync,admin=file_as_ns";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    fr_ctx_close(ctx);
}

/* Opens xnvme-file with `args`: 1 if it opened (closed again), 0 if it was
 * refused as the loaded libxnvme cannot read files with that async
 * interface, with the engine, the interface and the reason in the message. */
static int usable(const char *args, const char *xasync)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "xnvme-file";
    cfg.engine_args = args;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
    if (rc == 0) {
        fr_ctx_close(ctx);
        return 1;
    }
    char want[40];
    snprintf(want, sizeof(want), "async=%s", xasync);
    fprintf(stderr, "not run: %s (%s)\n", args, err);
    CHECK(rc == -ENOTSUP && strstr(err, "xnvme-file") && strstr(err, want));
    return 0;
}

/* The xNVMe path itself reads the files: nothing falls back to fr_read_whole. */
static void no_repairs(const char *args, int direct)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "xnvme-file";
    cfg.engine_args = args;
    cfg.o_direct = direct;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    if (!ctx)
        return;
    char *paths[16];
    char name[64];
    for (size_t i = 0; i < fr_test_nsizes; i++) {
        snprintf(name, sizeof(name), "size-%zu.bin", fr_test_sizes[i]);
        paths[i] = fr_test_write(name, fr_test_sizes[i], (unsigned)i);
    }
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, fr_test_nsizes) == 0);
    CHECK(fr_read_files(ctx, (const char *const *)paths, NULL, fr_test_nsizes, b) == 0);
    for (size_t i = 0; i < fr_test_nsizes; i++) {
        CHECK(fr_test_same(b, i, paths[i]));
        free(paths[i]);
    }
    long repairs = fr_ctx_stat(ctx, "repairs");
    if (repairs != 0)
        fprintf(stderr, "engine_args=%s o_direct=%d: %ld repairs\n", args, direct, repairs);
    CHECK(repairs == 0);
    CHECK(fr_ctx_stat(ctx, "o_direct") == direct);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("xnvme-file", why, sizeof(why)) != 0) {
        fprintf(stderr, "skip: %s\n", why);
        return 77;
    }
    printf("%s\n", why);
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "xnvme-file";
    const char *args[] = {"async=emu", "async=io_uring", "async=posix", "async=thrpool",
                          "async=libaio", "queue=0", "async=io_uring,inflight=1,qdepth=2"};
    const char *xasync[] = {"emu", "io_uring", "posix", "thrpool", "libaio", "emu", "io_uring"};
    for (size_t a = 0; a < sizeof(args) / sizeof(args[0]); a++) {
        const char *unrunnable = fr_test_xnvme_unrunnable(args[a]);
        if (unrunnable) {
            fprintf(stderr, "not run: %s (%s)\n", args[a], unrunnable);
            continue;
        }
        int have = usable(args[a], xasync[a]);
        /* emu and thrpool read files in every xNVMe build */
        CHECK(have || (strcmp(xasync[a], "emu") != 0 && strcmp(xasync[a], "thrpool") != 0));
        if (!have)
            continue;
        cfg.engine_args = args[a];
        unsigned threads[] = {1, 3};
        for (int t = 0; t < 2; t++) {
            cfg.threads = threads[t];
            for (int direct = 0; direct < 2; direct++) {
                cfg.o_direct = direct;
                /* libaio's queue teardown takes ~30 ms a file: keep it short */
                int repeat = strstr(args[a], "libaio") ? 1 : 30;
                int bad = fr_test_engine_roundtrip(&cfg, repeat);
                if (bad)
                    fprintf(stderr, "engine_args=%s threads=%u o_direct=%d: %d bad\n", args[a],
                            threads[t], direct, bad);
                CHECK(bad == 0);
            }
        }
        no_repairs(args[a], 0);
        no_repairs(args[a], 1);
    }
    errors();
    return fr_test_finish("test_xnvme_file");
}
