/* xnvme: ranges of an image file (unaligned, empty, past the end, larger
 * than the max transfer) come back byte-exact, with each async engine the
 * loaded libxnvme reads files with, buffered and O_DIRECT, through bounce
 * buffers too; an async interface not built in (io_uring and io_uring_cmd
 * without liburing, libaio without libaio) is refused at open naming the
 * missing stack, and the test runs what remains; one with no stack for
 * files (and sync=nvme, io_uring_cmd) fails each sample of a file with
 * ENOTSUP; a changed image is reopened; a missing one fails every
 * sample with ENOENT. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static uint8_t *slurp(const char *path, size_t size)
{
    uint8_t *d = malloc(size ? size : 1);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(d, 1, size, f) == size);
    if (f)
        fclose(f);
    return d;
}

static int check_ranges(fr_ctx *ctx, const char *path, const uint8_t *data, size_t size,
                        const fr_range *r, size_t n)
{
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    int bad = 0;
    CHECK(fr_batch_prepare(b, n) == 0);
    int rc = fr_read_ranges(ctx, path, r, n, b);
    CHECK(rc == 0);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint64_t want = r[i].offset >= size ? 0
                        : (r[i].length < size - r[i].offset ? r[i].length : size - r[i].offset);
        if (b->samples[i].length != (int64_t)want ||
            (want && memcmp(b->arena.base + b->samples[i].offset, data + r[i].offset, want))) {
            fprintf(stderr, "range %zu (%llu+%llu): length %lld, want %llu\n", i,
                    (unsigned long long)r[i].offset, (unsigned long long)r[i].length,
                    (long long)b->samples[i].length, (unsigned long long)want);
            bad++;
        }
    }
    fr_batch_recycle(b);
    fr_pool_close(pool);
    return bad;
}

/* Every sample of `path` fails with ENOTSUP, nothing else goes wrong. */
static int refused_per_sample(fr_ctx *ctx, const char *path, const fr_range *r)
{
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    int ok = fr_batch_prepare(b, 3) == 0 && fr_read_ranges(ctx, path, r, 3, b) == 0;
    for (size_t i = 0; ok && i < 3; i++)
        ok = b->samples[i].length == -ENOTSUP;
    fr_batch_recycle(b);
    fr_pool_close(pool);
    return ok;
}

/* Whether fr_ctx_open's refusal of `args` (rc, err) is the engine's own
 * check finding the async interface of `args` missing from the loaded
 * libxnvme, naming the stack it was built without: io_uring and
 * io_uring_cmd need liburing, libaio libaio. emu, posix and thrpool are
 * xNVMe's own and never missing. Prints what is not run, and why. */
static int missing_stack(int rc, const char *err, const char *args)
{
    static const struct {
        const char *async, *stack;
    } NEEDS[] = {{"async=io_uring_cmd", "liburing"},
                 {"async=io_uring", "liburing"},
                 {"async=libaio", "libaio"}};
    fprintf(stderr, "not run: %s (%s)\n", args, err);
    for (size_t i = 0; i < sizeof(NEEDS) / sizeof(NEEDS[0]); i++) {
        const char *at = strstr(args, NEEDS[i].async);
        size_t n = strlen(NEEDS[i].async);
        if (!at || (at[n] && at[n] != ','))
            continue;
        char want[96];
        snprintf(want, sizeof(want), "xnvme: %s is not in the loaded libxnvme (it was built "
                 "without %s", NEEDS[i].async, NEEDS[i].stack);
        return rc == -ENOTSUP && strstr(err, want) != NULL;
    }
    return 0;
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("xnvme", why, sizeof(why)) != 0) {
        fprintf(stderr, "skip: %s\n", why);
        return 77;
    }
    size_t size = (5u << 20) + 777; /* > mdts (1 MiB) several times */
    char *p = fr_test_write("image.bin", size, 3);
    char path[512];
    snprintf(path, sizeof(path), "%s", p);
    free(p);
    uint8_t *data = slurp(path, size);
    fr_range r[200];
    size_t n = 0;
    unsigned seed = 1;
    r[n++] = (fr_range){0, size};              /* the whole image */
    r[n++] = (fr_range){0, 0};                 /* empty */
    r[n++] = (fr_range){size - 10, 100};       /* clamped at the end */
    r[n++] = (fr_range){size, 10};             /* past the end */
    r[n++] = (fr_range){size + 5000, 10};
    r[n++] = (fr_range){4096, 4096};
    r[n++] = (fr_range){1, 1};
    r[n++] = (fr_range){(3u << 20) - 7, (2u << 20) + 11};
    while (n < 200) {
        seed = seed * 1103515245u + 12345u;
        uint64_t o = seed % size;
        seed = seed * 1103515245u + 12345u;
        r[n++] = (fr_range){o, seed % 300000};
    }
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "xnvme";
    const char *args[] = {"async=emu", "async=io_uring", "async=libaio", "async=posix",
                          "async=thrpool", "async=io_uring,qdepth=2", "bounce=1,qdepth=4",
                          "be=linux,async=io_uring,qdepth=1024"};
    for (size_t a = 0; a < sizeof(args) / sizeof(args[0]); a++) {
        const char *unrunnable = fr_test_xnvme_unrunnable(args[a]);
        if (unrunnable) {
            fprintf(stderr, "not run: %s (%s)\n", args[a], unrunnable);
            continue;
        }
        for (int direct = 0; direct < 2; direct++) {
            cfg.engine_args = args[a];
            cfg.o_direct = direct;
            fr_ctx *ctx = NULL;
            char err[FR_ERRLEN];
            int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
            if (rc) {
                CHECK(missing_stack(rc, err, args[a]));
                continue;
            }
            if (fr_ctx_stat(ctx, "file_stack") != 0) {
                /* no stack for files with this async (posix on xNVMe main) */
                fprintf(stderr, "not run: %s (no stack for regular files)\n", args[a]);
                CHECK(strstr(args[a], "posix") != NULL);
                CHECK(refused_per_sample(ctx, path, r));
                fr_ctx_close(ctx);
                continue;
            }
            for (int round = 0; round < 2; round++) {
                int bad = check_ranges(ctx, path, data, size, r, n);
                if (bad)
                    fprintf(stderr, "engine_args=%s o_direct=%d: %d bad\n", args[a], direct, bad);
                CHECK(bad == 0);
            }
            CHECK(fr_ctx_stat(ctx, "o_direct") == direct);
            if (!strstr(args[a], "thrpool")) /* its pool threads' errno is not ours to clear */
                CHECK(fr_ctx_stat(ctx, "resubmits") == 0);
            fr_ctx_close(ctx);
        }
    }

    /* The image changes (new size): the cached device is reopened. */
    cfg.engine_args = "";
    cfg.o_direct = 0;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    fr_range whole = {0, 1u << 30};
    CHECK(check_ranges(ctx, path, data, size, &whole, 1) == 0);
    free(data);
    size = 70000;
    p = fr_test_write("image.bin", size, 9);
    free(p);
    data = slurp(path, size);
    CHECK(check_ranges(ctx, path, data, size, &whole, 1) == 0);
    CHECK(fr_ctx_stat(ctx, "reopens") == 1);

    /* Missing image: every sample fails with ENOENT. read_files: ENOTSUP. */
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/nope.img", fr_test_dir());
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 2) == 0);
    CHECK(fr_read_ranges(ctx, missing, r, 2, b) == 0);
    CHECK(b->samples[0].length == -ENOENT && b->samples[1].length == -ENOENT);
    CHECK(fr_read_ranges(ctx, fr_test_dir(), r, 1, b) == 0 && b->samples[0].length == -EISDIR);
    /* A character device that is no NVMe namespace: refused, not 0 bytes long. */
    CHECK(fr_read_ranges(ctx, "/dev/zero", r, 1, b) == 0 && b->samples[0].length == -ENODEV);
    const char *paths[] = {path};
    CHECK(fr_read_files(ctx, paths, NULL, 1, b) == -ENOTSUP);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);

    /* Stacks for devices: a regular file's samples fail with ENOTSUP (no
     * NVMe ioctls on a file), devices could still be read; io_uring_cmd is
     * refused at open where the libxnvme has no liburing. nil: refused. */
    const char *for_devices[] = {"sync=nvme", "sync=block", "async=io_uring_cmd"};
    for (size_t i = 0; i < sizeof(for_devices) / sizeof(for_devices[0]); i++) {
        cfg.engine_args = for_devices[i];
        int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
        if (rc) {
            CHECK(missing_stack(rc, err, for_devices[i]));
            continue;
        }
        CHECK(refused_per_sample(ctx, path, r));
        fr_ctx_close(ctx);
        ctx = NULL;
    }
    cfg.engine_args = "async=nil";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "async=nil"));

    cfg.engine_args = "inflight=3";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "inflight"));
    free(data);
    return fr_test_finish("test_xnvme_ranges");
}
