/* GPU delivery against the mock driver (csrc/tests/mock): device output
 * from every host engine, pinned arenas, the cufile engine for files and
 * ranges with host and device output, its handle cache (reuse, a file
 * replaced under its name, eviction), per-sample errors, the host fallback
 * where cuFile refuses a file system, and that closing
 * everything frees every device buffer, pin, stream, handle and context. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define NFILES 40

static long (*live_cuda)(const char *);
static long (*live_cufile)(const char *);

/* Live objects of a kind, from the mock that owns them. */
static long live(const char *what)
{
    if (!strcmp(what, "handles") || !strcmp(what, "bufregs") || !strcmp(what, "register_attempts"))
        return live_cufile ? live_cufile(what) : -1;
    return live_cuda(what);
}

/* 1 if device sample i holds exactly the bytes of `path` (mock device
 * memory is host memory). */
static int same_on_device(const fr_batch *b, size_t i, const char *path)
{
    if (!(b->where & FR_ON_DEVICE) || !b->device.ptr)
        return 0;
    fr_batch view = *b;
    view.arena.base = (uint8_t *)(uintptr_t)b->device.ptr;
    return fr_test_same(&view, i, path);
}

/* A config reading with `engine` onto GPU 0, delivering on the device or
 * (device_output 0) on the host. */
static fr_config gpu_config(const char *engine, int device_output)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.device_id = 0;
    cfg.device_output = device_output;
    return cfg;
}

static void read_all(const fr_config *cfg, char **paths, int device_output, int rounds)
{
    fr_reader *rd;
    char err[FR_ERRLEN] = "";
    int rc = fr_reader_open(cfg, (const char *const *)paths, NFILES, 2, 2, &rd, err, sizeof(err));
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "%s: %s\n", cfg->engine, err);
        return;
    }
    for (int round = 0; round < rounds; round++) {
        for (int k = 0; k < NFILES / 8; k++) {
            int64_t idx[8];
            for (int j = 0; j < 8; j++)
                idx[j] = (k * 8 + j + round * 3) % NFILES;
            CHECK(fr_reader_submit(rd, idx, 8) == 0);
        }
        for (int k = 0; k < NFILES / 8; k++) {
            fr_batch *b;
            CHECK(fr_reader_next(rd, &b) == 0);
            CHECK(b->status == 0);
            for (size_t j = 0; j < b->count; j++) {
                const char *p = paths[b->indices[j]];
                CHECK(fr_test_same(b, j, p) || !(b->where & FR_ON_HOST));
                if (device_output)
                    CHECK(same_on_device(b, j, p));
                else
                    CHECK(b->where & FR_ON_HOST);
            }
            fr_batch_recycle(b);
        }
    }
    fr_reader_close(rd);
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_gpu_probe(0, why, sizeof(why)) != 0) {
        printf("skip: no CUDA driver, not even the mock: %s\n", why);
        return 77;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW); /* held: live() stays callable */
    live_cuda = lib ? (long (*)(const char *))dlsym(lib, "mock_cuda_live") : NULL;
    void *cflib = dlopen("libcufile.so.0", RTLD_NOW);
    live_cufile = cflib ? (long (*)(const char *))dlsym(cflib, "mock_cuda_live") : NULL;
    if (!live_cuda || !live_cufile) {
        /* A real driver: device pointers cannot be compared from here. */
        printf("skip: this test needs the mock driver (LD_LIBRARY_PATH=build/mockcuda)\n");
        return 77;
    }
    CHECK(fr_gpu_probe(7, why, sizeof(why)) == -ENODEV && strstr(why, "no CUDA device 7"));
    CHECK(fr_engine_probe("cufile", why, sizeof(why)) == 0 && strstr(why, "compat"));

    char *paths[NFILES];
    char name[64];
    for (int i = 0; i < NFILES; i++) {
        snprintf(name, sizeof(name), "g%02d.bin", i);
        size_t size = i < (int)fr_test_nsizes ? fr_test_sizes[i] : (size_t)(i * 4099);
        paths[i] = fr_test_write(name, size, (unsigned)i + 7);
    }

    /* Host engines with device output: uploads from pinned arenas only. */
    const char *host_engines[] = {"psync", "io_uring"};
    for (int e = 0; e < 2; e++) {
        if (fr_engine_probe(host_engines[e], why, sizeof(why)) != 0)
            continue;
        fr_config cfg = gpu_config(host_engines[e], 1);
        cfg.pin_memory = 1;
        long pageable = live("pageable_copies");
        read_all(&cfg, paths, 1, 3);
        CHECK(live("pageable_copies") == pageable);
        CHECK(live("pinned_copies") > 0);
        /* O_DIRECT layout too */
        cfg.o_direct = 1;
        read_all(&cfg, paths, 1, 1);
    }

    /* Config errors name what is missing. */
    {
        fr_config cfg;
        fr_config_init(&cfg);
        cfg.engine = "psync";
        cfg.device_output = 1;
        fr_ctx *ctx;
        char err[FR_ERRLEN];
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "device_id"));
        cfg.engine = "cufile";
        cfg.device_output = 0;
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "device_id"));
        cfg.device_id = 0;
        cfg.engine_args = "handles=zero";
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "handles"));
    }

    /* cufile, device and host output, buffered and O_DIRECT. */
    for (int variant = 0; variant < 4; variant++) {
        fr_config cfg = gpu_config("cufile", variant & 1);
        cfg.o_direct = variant >> 1;
        if (variant == 3)
            setenv("MOCK_CUFILE_REFUSE_BUFREG", "1", 1); /* compat mode may refuse */
        read_all(&cfg, paths, variant & 1, 2);
        unsetenv("MOCK_CUFILE_REFUSE_BUFREG");
    }

    /* The handle cache: reuse, replacement, eviction, errors. */
    {
        fr_config cfg = gpu_config("cufile", 1);
        cfg.engine_args = "handles=4";
        fr_ctx *ctx;
        char err[FR_ERRLEN];
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
        fr_pool *pool = fr_pool_new();
        const char *two[2] = {paths[12], paths[13]};
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, 2) == 0);
        CHECK(fr_read_files(ctx, two, NULL, 2, b) == 0);
        CHECK(same_on_device(b, 0, two[0]) && same_on_device(b, 1, two[1]));
        CHECK(fr_ctx_stat(ctx, "cached_handles") == 2);
        long handles = live("handles");
        CHECK(handles == 2 && live("bufregs") >= 1);
        CHECK(fr_read_files(ctx, two, NULL, 2, b) == 0);
        CHECK(live("handles") == handles); /* reused, not reopened */

        /* Replaced under its name (a new inode): the new bytes, not stale. */
        char *fresh = fr_test_write("fresh.bin", 12 * 4099, 99); /* same size, new bytes */
        CHECK(rename(fresh, two[0]) == 0);
        free(fresh);
        CHECK(fr_read_files(ctx, two, NULL, 2, b) == 0);
        CHECK(same_on_device(b, 0, two[0]) && b->where == FR_ON_DEVICE); /* no repair needed */

        /* Grown in place (same inode): the cached handle reads the new size. */
        FILE *f = fopen(two[1], "ab");
        CHECK(f && fwrite("grown", 1, 5, f) == 5);
        fclose(f);
        CHECK(fr_read_files(ctx, two, NULL, 2, b) == 0);
        CHECK(same_on_device(b, 1, two[1]));

        /* More files than handles: bounded; a batch larger than the cache
         * still reads (the overflow handles live for one batch). */
        const char *many[10];
        for (int i = 0; i < 10; i++)
            many[i] = paths[20 + i];
        CHECK(fr_batch_prepare(b, 10) == 0);
        CHECK(fr_read_files(ctx, many, NULL, 10, b) == 0);
        for (int i = 0; i < 10; i++)
            CHECK(same_on_device(b, (size_t)i, many[i]));
        CHECK(fr_ctx_stat(ctx, "cached_handles") <= 4);

        /* Per-sample errors. */
        char missing[4096], dir[4096];
        snprintf(missing, sizeof(missing), "%s/absent.bin", fr_test_dir());
        snprintf(dir, sizeof(dir), "%s/adir", fr_test_dir());
        CHECK(mkdir(dir, 0700) == 0);
        const char *bad[3] = {missing, dir, paths[5]};
        CHECK(fr_batch_prepare(b, 3) == 0);
        CHECK(fr_read_files(ctx, bad, NULL, 3, b) == 0);
        CHECK(b->samples[0].length == -ENOENT);
        CHECK(b->samples[1].length == -EISDIR);
        CHECK(same_on_device(b, 2, paths[5]));

        /* Ranges of one image, straight to the device. */
        char *image = fr_test_write("image.bin", 3 << 20, 5);
        fr_range r[3] = {{0, 100}, {4096, 70000}, {(2 << 20) + 8192, 4096}};
        CHECK(fr_batch_prepare(b, 3) == 0);
        CHECK(fr_read_ranges(ctx, image, r, 3, b) == 0);
        FILE *img = fopen(image, "rb");
        for (int i = 0; i < 3; i++) {
            CHECK(b->samples[i].length == (int64_t)r[i].length);
            char *want = malloc(r[i].length);
            CHECK(img && fseek(img, (long)r[i].offset, SEEK_SET) == 0 &&
                  fread(want, 1, r[i].length, img) == r[i].length);
            CHECK(memcmp((char *)(uintptr_t)b->device.ptr + b->samples[i].offset, want,
                         r[i].length) == 0);
            free(want);
        }
        fclose(img);
        fr_range past = {(3 << 20) - 10, 100};
        CHECK(fr_batch_prepare(b, 1) == 0);
        CHECK(fr_read_ranges(ctx, image, &past, 1, b) == 0);
        CHECK(b->samples[0].length == -ENODATA);
        free(image);

        fr_batch_recycle(b);
        fr_pool_close(pool);
        fr_ctx_close(ctx);
    }

    /* cuFile refuses a file system (GDS cannot place it): compat=auto reads
     * its files and images on the host with one registration attempt per
     * file system and context, compat=off fails them, and a batch mixing
     * refused and registered files is settled on the host. */
    {
        setenv("MOCK_CUFILE_REFUSE_FILES", "/", 1);
        for (int variant = 0; variant < 4; variant++) {
            fr_config cfg = gpu_config("cufile", variant & 1);
            cfg.o_direct = variant >> 1;
            cfg.threads = 2;
            long attempts = live("register_attempts");
            read_all(&cfg, paths, variant & 1, 1);
            /* At most one per thread racing to the first refusal. */
            CHECK(live("register_attempts") - attempts <= 2 * 2); /* 2 workers x 2 threads */
        }
        fr_config cfg = gpu_config("cufile", 1);
        fr_ctx *ctx;
        char err[FR_ERRLEN];
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
        fr_pool *pool = fr_pool_new();
        fr_batch *b = fr_pool_get(pool);
        const char *three[3] = {paths[1], paths[8], paths[30]};
        CHECK(fr_batch_prepare(b, 3) == 0);
        CHECK(fr_read_files(ctx, three, NULL, 3, b) == 0);
        for (int i = 0; i < 3; i++)
            CHECK(same_on_device(b, (size_t)i, three[i]));
        CHECK(fr_ctx_stat(ctx, "host_files") == 3);
        char *image = fr_test_write("refused.img", 1 << 20, 21);
        fr_range r[2] = {{0, 5000}, {8192, 300000}};
        CHECK(fr_batch_prepare(b, 2) == 0);
        CHECK(fr_read_ranges(ctx, image, r, 2, b) == 0);
        FILE *img = fopen(image, "rb");
        for (int i = 0; i < 2; i++) {
            char *want = malloc(r[i].length);
            CHECK(img && fseek(img, (long)r[i].offset, SEEK_SET) == 0 &&
                  fread(want, 1, r[i].length, img) == r[i].length);
            CHECK(b->samples[i].length == (int64_t)r[i].length &&
                  memcmp((char *)(uintptr_t)b->device.ptr + b->samples[i].offset, want,
                         r[i].length) == 0);
            free(want);
        }
        fclose(img);
        fr_ctx_close(ctx);

        cfg.engine_args = "compat=off";
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
        CHECK(fr_batch_prepare(b, 3) == 0);
        CHECK(fr_read_files(ctx, three, NULL, 3, b) == 0);
        for (int i = 0; i < 3; i++)
            CHECK(b->samples[i].length == -EIO);
        CHECK(fr_batch_prepare(b, 2) == 0);
        CHECK(fr_read_ranges(ctx, image, r, 2, b) == -EIO);
        fr_ctx_close(ctx);
        free(image);
        cfg.engine_args = "compat=maybe";
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "compat"));

        /* Mixed: g04 registers, g05 is refused. */
        setenv("MOCK_CUFILE_REFUSE_FILES", "g05.bin", 1);
        for (int out = 0; out < 2; out++) {
            cfg.engine_args = "";
            cfg.device_output = out;
            CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
            const char *mixed[3] = {paths[4], paths[5], paths[33]};
            CHECK(fr_batch_prepare(b, 3) == 0);
            CHECK(fr_read_files(ctx, mixed, NULL, 3, b) == 0);
            for (int i = 0; i < 3; i++)
                CHECK(out ? same_on_device(b, (size_t)i, mixed[i])
                          : fr_test_same(b, (size_t)i, mixed[i]));
            CHECK(fr_ctx_stat(ctx, "host_files") >= 1);
            fr_ctx_close(ctx);
        }
        unsetenv("MOCK_CUFILE_REFUSE_FILES");
        fr_batch_recycle(b);
        fr_pool_close(pool);
    }

    /* Out of device memory: a batch-level -ENOMEM, not a crash. */
    {
        setenv("MOCK_CUDA_MEM_LIMIT", "1000", 1);
        fr_config cfg = gpu_config("psync", 1);
        fr_ctx *ctx;
        char err[FR_ERRLEN];
        CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
        fr_pool *pool = fr_pool_new();
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, 1) == 0);
        const char *one[1] = {paths[9]};
        CHECK(fr_read_files(ctx, one, NULL, 1, b) == -ENOMEM);
        fr_gpu_last_error(fr_ctx_gpu(ctx), err, sizeof(err));
        CHECK(strstr(err, "cuMemAlloc") != NULL);
        fr_batch_recycle(b);
        fr_pool_close(pool);
        fr_ctx_close(ctx);
        unsetenv("MOCK_CUDA_MEM_LIMIT");
    }

    CHECK(live("allocs") == 0);
    CHECK(live("pins") == 0);
    CHECK(live("streams") == 0);
    CHECK(live("handles") == 0);
    CHECK(live("bufregs") == 0);
    CHECK(live("contexts") == 0);
    for (int i = 0; i < NFILES; i++)
        free(paths[i]);
    return fr_test_finish("test_gpu");
}
