#define _GNU_SOURCE
/* Dense batches (fr_batch.dense): samples laid out back to back, exactly
 * their sizes, so a batch read without incident is one contiguous block.
 * The layout itself (failed samples, empty files, O_DIRECT keeps aligned
 * slots, ranges), every engine that lays files out with fr_layout, a failed
 * sample in the middle of a dense batch, and a file that grew since it was
 * sized: its growth check byte lands on the next sample, and the batch says
 * so (dense_spill) until the first bytes are read again. Sizes past
 * FR_MAX_SAMPLE (sparse or corrupt files) fail their own sample with
 * -EFBIG, never wrapping the batch's layout onto its arena's start. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "engines/io_common.h"
#include "engines/range_io.h"

/* 1 if every sample of [from, to) that read anything starts where the
 * previous one ended. */
static int back_to_back(const fr_batch *b, size_t from, size_t to)
{
    int have_prev = 0;
    uint64_t end = 0;
    for (size_t i = from; i < to; i++) {
        const fr_sample *s = &b->samples[i];
        if (s->length < 0)
            continue;
        if (have_prev && s->offset != end)
            return 0;
        end = s->offset + (uint64_t)s->length;
        have_prev = 1;
    }
    return 1;
}

static void test_layout(fr_pool *pool)
{
    int64_t sizes[] = {10, -ENOENT, 0, 5, 100};
    fr_batch *b = fr_pool_get(pool);
    CHECK(b->dense == 0); /* off by default */
    b->dense = 1;
    CHECK(fr_batch_prepare(b, 5) == 0);
    b->dense_spill = 1; /* left over from an earlier read: cleared by the layout */
    CHECK(fr_layout(b, sizes, 5, 0, 4096) == 0);
    CHECK(b->dense_spill == 0);
    CHECK(b->samples[0].offset == 0);
    CHECK(b->samples[1].length == -ENOENT);
    CHECK(b->samples[2].offset == 10);
    CHECK(b->samples[3].offset == 10);
    CHECK(b->samples[4].offset == 15);
    CHECK(b->arena.used == 115);
    CHECK(b->arena.capacity >= 116); /* the last sample's growth check byte */

    /* A second window continues where the first ended, unaligned. */
    int64_t more[] = {7};
    fr_sample *saved = b->samples;
    b->samples = saved + 4; /* as the engines shift a window's view */
    CHECK(fr_layout(b, more, 1, 0, 4096) == 0);
    b->samples = saved;
    CHECK(b->samples[4].offset == 115 && b->arena.used == 122);

    /* O_DIRECT needs aligned slots: the dense flag does not apply. */
    CHECK(fr_batch_prepare(b, 5) == 0);
    CHECK(fr_layout(b, sizes, 5, 1, 4096) == 0);
    CHECK(b->samples[2].offset == 4096 && b->samples[3].offset == 8192 &&
          b->samples[4].offset == 12288);

    /* The default layout: 64-byte aligned, with the growth check byte. */
    b->dense = 0;
    CHECK(fr_batch_prepare(b, 5) == 0);
    CHECK(fr_layout(b, sizes, 5, 0, 4096) == 0);
    CHECK(b->samples[2].offset == 64 && b->samples[3].offset == 128 &&
          b->samples[4].offset == 192);

    /* Ranges: exact lengths, back to back; a bad range keeps its error. */
    b->dense = 1;
    const fr_range ranges[] = {{0, 3}, {100, UINT64_MAX}, {7, 9}, {1, 0}, {4, 2}};
    CHECK(fr_batch_prepare(b, 5) == 0);
    CHECK(fr_layout_ranges(b, ranges, 5, 0, 4096) == 0);
    CHECK(b->samples[0].offset == 0 && b->samples[1].length == -EINVAL);
    CHECK(b->samples[2].offset == 3 && b->samples[3].offset == 12 &&
          b->samples[4].offset == 12 && b->arena.used == 14);
    fr_batch_recycle(b);

    /* The flag stays with the batch when the pool hands it out again. */
    fr_batch *again = fr_pool_get(pool);
    CHECK(again == b && again->dense == 1);
    again->dense = 0;
    fr_batch_recycle(again);
}

/* A file that grew since it was sized: the read of size + 1 bytes put the
 * new byte on the first byte of the next sample. fr_read_whole moves the
 * file to the end of the arena, flags the batch, and re-reading first bytes
 * restores the neighbour. */
static void test_growth(fr_pool *pool)
{
    char *grown = fr_test_write("grown", 12, 1);
    char *next = fr_test_write("next", 6, 2);
    fr_batch *b = fr_pool_get(pool);
    b->dense = 1;
    CHECK(fr_batch_prepare(b, 2) == 0);
    int64_t sizes[] = {4, 6}; /* "grown" was 4 bytes when sized */
    CHECK(fr_layout(b, sizes, 2, 0, 4096) == 0);
    CHECK(b->samples[1].offset == 4);
    /* What the engine's read did: the neighbour first, then 5 bytes of the
     * grown file, one onto the neighbour's first byte. */
    FILE *f = fopen(next, "rb");
    CHECK(f && fread(b->arena.base + 4, 1, 6, f) == 6);
    fclose(f);
    b->samples[1].length = 6;
    uint8_t neighbour_first = b->arena.base[4];
    f = fopen(grown, "rb");
    CHECK(f && fread(b->arena.base, 1, 5, f) == 5);
    fclose(f);
    int clobbered = b->arena.base[4] != neighbour_first;
    fr_read_whole(b, 0, grown, fr_request_len(4, 0, 4096));
    CHECK(b->dense_spill == 1);
    CHECK(fr_test_same(b, 0, grown));
    CHECK(b->samples[0].offset >= 10); /* moved: it no longer fits 4 bytes */
    CHECK(!clobbered || !fr_test_same(b, 1, next));
    CHECK(fr_batch_reread_first_byte(b, 0, grown) == 0);
    CHECK(fr_batch_reread_first_byte(b, 1, next) == 0);
    CHECK(fr_test_same(b, 0, grown) && fr_test_same(b, 1, next));

    /* A file that is gone when first bytes are read again: its error. */
    CHECK(remove(next) == 0);
    CHECK(fr_batch_reread_first_byte(b, 1, next) == -ENOENT);
    CHECK(b->samples[1].length == -ENOENT);

    /* A file that shrank fits its dense slot and stays there. */
    char *shrunk = fr_test_write("shrunk", 3, 3);
    CHECK(fr_batch_prepare(b, 1) == 0);
    int64_t was[] = {8};
    CHECK(fr_layout(b, was, 1, 0, 4096) == 0);
    fr_read_whole(b, 0, shrunk, fr_request_len(8, 0, 4096));
    CHECK(b->samples[0].offset == 0 && fr_test_same(b, 0, shrunk));
    /* Read to its end: nothing past its 8-byte slot (+1 reserved) written. */
    CHECK(b->arena.used == 8);
    b->dense = 0;
    fr_batch_recycle(b);
    free(grown);
    free(next);
    free(shrunk);
}

#define NFILES 24

/* Every engine that lays files out with fr_layout: the bytes of every edge
 * size, back to back, and a missing file in the middle failing alone. */
/* Sizes that would not fit, or would wrap the running offset (two of
 * INT64_MAX: a review measured reads aimed at the arena's start): -EFBIG for
 * those samples only, dense and not, files and ranges. */
static void test_layout_huge(fr_pool *pool)
{
    for (int dense = 0; dense < 2; dense++) {
        int64_t sizes[] = {10, INT64_MAX, INT64_MAX, 3, (int64_t)FR_MAX_SAMPLE + 1};
        fr_batch *b = fr_pool_get(pool);
        b->dense = dense;
        CHECK(fr_batch_prepare(b, 5) == 0);
        CHECK(fr_layout(b, sizes, 5, 0, 4096) == 0);
        CHECK(b->samples[0].offset == 0 && b->samples[0].length == 0);
        CHECK(b->samples[1].length == -EFBIG && b->samples[2].length == -EFBIG);
        CHECK(b->samples[4].length == -EFBIG);
        /* ... and in sizes[], which the engines read by: no read is issued. */
        CHECK(sizes[1] == -EFBIG && sizes[2] == -EFBIG && sizes[4] == -EFBIG && sizes[3] == 3);
        CHECK(b->samples[3].length == 0 && b->samples[3].offset > 0);
        CHECK(b->arena.used < 4096 && b->arena.used >= b->samples[3].offset + 3);
        b->dense = 0;
        fr_batch_recycle(b);
    }
    fr_range r[3] = {{.offset = 0, .length = 10},
                     {.offset = 4096, .length = FR_MAX_SAMPLE + 1},
                     {.offset = 8192, .length = 7}};
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 3) == 0);
    CHECK(fr_layout_ranges(b, r, 3, 0, 4096) == 0);
    CHECK(b->samples[1].length == -EFBIG && b->samples[0].length == 0 &&
          b->samples[2].length == 0 && b->arena.used < 4096);
    fr_batch_recycle(b);
}

/* A sparse file of 2 TiB among small ones, read dense by an engine: its
 * sample fails with -EFBIG, the others read whole. Skipped where the file
 * system refuses that size. */
static void test_huge_sparse(fr_pool *pool, const char *engine)
{
    char *small = fr_test_write("small-beside-huge", 5000, 3);
    char huge[1100];
    snprintf(huge, sizeof(huge), "%s/huge-sparse", fr_test_dir());
    int fd = open(huge, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    int sized = ftruncate(fd, (off_t)((int64_t)2 << 40)) == 0;
    CHECK(close(fd) == 0);
    if (!sized) {
        printf("test_dense: a 2 TiB sparse file refused here (%s): skipped\n", strerror(errno));
    } else {
        fr_ctx *ctx = fr_test_ctx(engine);
        const char *paths[3] = {small, huge, small};
        for (int dense = 0; dense < 2 && ctx; dense++) {
            fr_batch *b = fr_pool_get(pool);
            b->dense = dense;
            CHECK(fr_batch_prepare(b, 3) == 0);
            CHECK(fr_read_files(ctx, paths, NULL, 3, b) == 0);
            CHECK(b->samples[0].length == 5000 && b->samples[2].length == 5000);
            if (b->samples[1].length != -EFBIG)
                fprintf(stderr, "%s dense=%d: the 2 TiB sample gave %lld\n", engine, dense,
                        (long long)b->samples[1].length);
            CHECK(b->samples[1].length == -EFBIG);
            b->dense = 0;
            fr_batch_recycle(b);
        }
        if (ctx)
            fr_ctx_close(ctx);
    }
    unlink(huge);
    free(small);
}

static void test_engine(fr_pool *pool, const char *engine, int with_hints)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe(engine, why, sizeof(why)) != 0) {
        printf("test_dense: %s skipped: %s\n", engine, why);
        return;
    }
    char *paths[NFILES];
    int64_t hints[NFILES];
    for (size_t i = 0; i < NFILES; i++) {
        char name[64];
        size_t size = fr_test_sizes[i % fr_test_nsizes];
        snprintf(name, sizeof(name), "%s-%zu", engine, i);
        paths[i] = fr_test_write(name, size, (unsigned)i + 7);
        hints[i] = (int64_t)size;
    }
    char missing[1024];
    snprintf(missing, sizeof(missing), "%s/no-such-file", fr_test_dir());
    free(paths[5]);
    paths[5] = strdup(missing);
    hints[5] = 100;
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.threads = 2;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
    CHECK(rc == 0);
    if (rc != 0) {
        fprintf(stderr, "test_dense: %s: %s\n", engine, err);
        return;
    }
    fr_batch *b = fr_pool_get(pool);
    b->dense = 1;
    for (int round = 0; round < 3; round++) {
        CHECK(fr_batch_prepare(b, NFILES) == 0);
        CHECK(fr_read_files(ctx, (const char *const *)paths, with_hints ? hints : NULL, NFILES,
                            b) == 0);
        CHECK(b->dense_spill == 0);
        /* A file that fails before it is sized takes no room; one that
         * fails after (its size hinted) leaves its slot empty. */
        int dense = with_hints ? back_to_back(b, 0, 5) && back_to_back(b, 6, NFILES)
                               : back_to_back(b, 0, NFILES);
        if (!dense) {
            CHECK(!"back to back");
            fprintf(stderr, "test_dense: %s%s: not back to back:", engine,
                    with_hints ? " (hints)" : "");
            for (size_t i = 0; i < NFILES; i++)
                fprintf(stderr, " %llu+%lld", (unsigned long long)b->samples[i].offset,
                        (long long)b->samples[i].length);
            fprintf(stderr, "\n");
        }
        for (size_t i = 0; i < NFILES; i++) {
            if (i == 5)
                CHECK(b->samples[i].length == -ENOENT);
            else if (!fr_test_same(b, i, paths[i]))
                CHECK(!"same bytes");
        }
    }

    /* A file bigger than its hint (it grew since it was last read): read
     * right, and the batch says its neighbour's first byte needs reading
     * again where the read took the slow path. */
    if (with_hints) {
        free(paths[5]);
        paths[5] = fr_test_write("grew", 5000, 99);
        hints[5] = 100;
        CHECK(fr_batch_prepare(b, NFILES) == 0);
        CHECK(fr_read_files(ctx, (const char *const *)paths, hints, NFILES, b) == 0);
        if (b->dense_spill)
            for (size_t i = 0; i < NFILES; i++)
                CHECK(fr_batch_reread_first_byte(b, i, paths[i]) == 0);
        for (size_t i = 0; i < NFILES; i++)
            if (!fr_test_same(b, i, paths[i]))
                CHECK(!"same bytes after a file grew");
        /* io_uring with direct descriptors trusts the hints: the slow path. */
        if (strcmp(engine, "io_uring") == 0 && fr_ctx_stat(ctx, "fixed_files") == 1)
            CHECK(b->dense_spill == 1);
    }
    b->dense = 0;
    fr_batch_recycle(b);
    fr_ctx_close(ctx);
    for (size_t i = 0; i < NFILES; i++)
        free(paths[i]);
}

/* fr_reader_set_dense: every batch a reader's workers read after it is
 * dense (samples of one size back to back), the pool's first batches
 * included; set_dense(0) turns it off again for later batches. */
static void test_reader_dense(void)
{
    char *path = fr_test_write("reader-dense", 40 * 24, 5);
    fr_range ranges[24];
    for (size_t i = 0; i < 24; i++)
        ranges[i] = (fr_range){i * 40, 40};
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "psync";
    cfg.threads = 2;
    fr_reader *rd = NULL;
    char err[FR_ERRLEN] = "";
    int rc = fr_reader_open_ranges(&cfg, path, ranges, 24, 2, 2, &rd, err, sizeof(err));
    CHECK(rc == 0);
    if (rc != 0) {
        fprintf(stderr, "test_dense: reader: %s\n", err);
        free(path);
        return;
    }
    fr_reader_set_dense(rd, 1);
    for (int round = 0; round < 2; round++) {
        int64_t idx[6];
        for (int k = 0; k < 4; k++) { /* more batches than the pool has at first */
            for (int j = 0; j < 6; j++)
                idx[j] = k * 6 + j;
            CHECK(fr_reader_submit(rd, idx, 6) == 0);
        }
        for (int k = 0; k < 4; k++) {
            fr_batch *b = NULL;
            CHECK(fr_reader_next(rd, &b) == 0);
            if (!b)
                break;
            CHECK(b->dense == (round == 0));
            if (round == 0)
                CHECK(back_to_back(b, 0, b->count) && b->samples[0].length == 40);
            else
                CHECK(b->samples[1].offset >= b->samples[0].offset + 64);  /* aligned slots */
            fr_batch_recycle(b);
        }
        fr_reader_set_dense(rd, 0);
    }
    fr_reader_close(rd);
    free(path);
}

/* A dense list batch (fr_reader_submit_paths) whose first file grew since
 * its size was remembered: the growth check byte lands on the next
 * sample's first byte, and the reader repairs it from the list's own paths
 * before handing the batch out (the consumer's repair by index read a byte
 * of another file, or none: indices of a list are positions in it). */
static void test_reader_list_spill(void)
{
    char *a = fr_test_write("list-spill-a", 3000, 21);
    char *bpath = fr_test_write("list-spill-b", 2000, 22);
    FILE *f = fopen(bpath, "rb");
    unsigned char b0 = 0;
    CHECK(f && fread(&b0, 1, 1, f) == 1);
    if (f)
        fclose(f);
    /* io_uring reads with the remembered sizes (psync stats every file). */
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0) {
        printf("test_dense: list spill skipped: %s\n", why);
        free(a);
        free(bpath);
        return;
    }
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    fr_reader *rd = NULL;
    char err[FR_ERRLEN] = "";
    CHECK(fr_reader_open(&cfg, NULL, 0, 1, 1, &rd, err, sizeof(err)) == 0);
    if (!rd) {
        fprintf(stderr, "test_dense: list reader: %s\n", err);
        return;
    }
    fr_reader_set_dense(rd, 1);
    const char *list[2] = {a, bpath};
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* a grows by 100 bytes after its size was remembered */
            FILE *g = fopen(a, "ab");
            unsigned char more[100];
            memset(more, 0x5A, sizeof(more));
            CHECK(g && fwrite(more, 1, sizeof(more), g) == sizeof(more));
            if (g)
                fclose(g);
        }
        CHECK(fr_reader_submit_paths(rd, list, 2) == 0);
        fr_batch *b = NULL;
        CHECK(fr_reader_next(rd, &b) == 0);
        if (!b)
            break;
        CHECK(b->dense_spill == 0);
        CHECK(b->samples[0].length == (round ? 3100 : 3000));
        CHECK(b->samples[1].length == 2000);
        if (b->samples[1].length == 2000)
            CHECK(b->arena.base[b->samples[1].offset] == b0);
        fr_batch_recycle(b);
    }
    fr_reader_close(rd);
    free(a);
    free(bpath);
}

int main(void)
{
    test_reader_dense();
    test_reader_list_spill();
    fr_pool *pool = fr_pool_new();
    CHECK(pool != NULL);
    test_layout(pool);
    test_layout_huge(pool);
    test_growth(pool);
    const char *const *names = fr_engine_names();
    for (size_t k = 0; names[k]; k++) {
        /* Engines that read files into host arenas through fr_layout. */
        if (strcmp(names[k], "io_uring") != 0 && strcmp(names[k], "psync") != 0 &&
            strcmp(names[k], "xnvme-file") != 0)
            continue;
        test_engine(pool, names[k], 0);
        test_engine(pool, names[k], 1);
        if (strcmp(names[k], "xnvme-file") != 0 && fr_engine_probe(names[k], NULL, 0) == 0)
            test_huge_sparse(pool, names[k]);
    }
    fr_pool_close(pool);
    fr_test_cleanup();
    return fr_test_finish("test_dense");
}
