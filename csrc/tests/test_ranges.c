/* Range reads (fr_read_ranges) and range readers, for every engine,
 * buffered and O_DIRECT: true lengths at aligned and unaligned offsets,
 * ranges longer than one transfer (split), empty ranges, ranges past the end
 * of the image (-ENODATA), unaligned offsets under O_DIRECT (-EINVAL), a
 * missing image (per-sample -ENOENT), reopening when the path changes or
 * names a new file (replaced by rename), and the reader over ranges
 * delivering in order. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define ALIGN 4096
#define NR 12

static unsigned char *image_bytes;
static size_t image_len;

/* Ranges of the image: every edge length at aligned offsets, one > 2 MiB. */
static size_t build_ranges(fr_range *r)
{
    size_t n = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < fr_test_nsizes && n < NR; i++) {
        r[n].offset = off;
        r[n].length = fr_test_sizes[i];
        off += (fr_test_sizes[i] + ALIGN - 1) / ALIGN * ALIGN;
        if (fr_test_sizes[i] == 0)
            off += ALIGN; /* keep every offset distinct */
        n++;
    }
    return n;
}

static char *write_image(const char *name, size_t len, unsigned seed)
{
    char *path = fr_test_write(name, len, seed);
    FILE *f = fopen(path, "rb");
    image_bytes = realloc(image_bytes, len);
    CHECK(f && fread(image_bytes, 1, len, f) == len);
    if (f)
        fclose(f);
    image_len = len;
    return path;
}

static int same_range(const fr_batch *b, size_t i, const fr_range *r)
{
    const fr_sample *s = &b->samples[i];
    return s->length == (int64_t)r->length &&
           (r->length == 0 ||
            memcmp(b->arena.base + s->offset, image_bytes + r->offset, r->length) == 0);
}

static void check_engine(const char *engine, int direct, const char *img, const char *img2)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.o_direct = direct;
    cfg.queue_depth = 4; /* fewer slots than chunks: queueing is exercised */
    fr_ctx *ctx;
    char err[FR_ERRLEN];
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", engine, err);
        fr_test_failures++;
        return;
    }
    fr_pool *pool = fr_pool_new();
    fr_range r[NR + 4];
    size_t n = build_ranges(r);

    for (int round = 0; round < 2; round++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, n) == 0);
        CHECK(fr_read_ranges(ctx, img, r, n, b) == 0);
        for (size_t i = 0; i < n; i++) {
            if (!same_range(b, i, &r[i])) {
                fprintf(stderr, "%s direct=%d: range %zu (%llu+%llu) differs, length %lld\n",
                        engine, direct, i, (unsigned long long)r[i].offset,
                        (unsigned long long)r[i].length, (long long)b->samples[i].length);
                fr_test_failures++;
            }
            if (direct)
                CHECK(b->samples[i].offset % ALIGN == 0);
        }
        fr_batch_recycle(b);
    }

    /* Edge cases in one batch. */
    fr_range e[5];
    e[0] = (fr_range){.offset = 8192, .length = 100};              /* fine */
    e[1] = (fr_range){.offset = image_len - 10, .length = 100};    /* past the end */
    e[2] = (fr_range){.offset = (image_len + ALIGN) / ALIGN * ALIGN + 8192, .length = 10}; /* wholly past the end */
    e[3] = (fr_range){.offset = 4096 + 3, .length = 50};           /* unaligned */
    e[4] = (fr_range){.offset = UINT64_MAX - 5, .length = 10};     /* overflows */
    if (direct)
        e[1].offset = image_len / ALIGN * ALIGN - ALIGN + 0, e[1].length = 2 * ALIGN;
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 5) == 0);
    CHECK(fr_read_ranges(ctx, img, e, 5, b) == 0);
    CHECK(same_range(b, 0, &e[0]));
    CHECK(b->samples[1].length == -ENODATA);
    CHECK(b->samples[2].length == -ENODATA);
    if (direct && fr_ctx_stat(ctx, "image_direct") == 1)
        CHECK(b->samples[3].length == -EINVAL);
    else
        CHECK(same_range(b, 3, &e[3]));
    CHECK(b->samples[4].length == -EINVAL);
    fr_batch_recycle(b);

    /* A missing image: a per-sample error, not a batch failure. */
    char missing[1100];
    snprintf(missing, sizeof(missing), "%s.missing", img);
    b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 2) == 0);
    CHECK(fr_read_ranges(ctx, missing, r, 2, b) == 0);
    CHECK(b->samples[0].length == -ENOENT && b->samples[1].length == -ENOENT);
    fr_batch_recycle(b);

    /* Another image: the cached descriptor is replaced. */
    b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 1) == 0);
    fr_range one = {.offset = 4096, .length = 5000};
    CHECK(fr_read_ranges(ctx, img2, &one, 1, b) == 0);
    CHECK(b->samples[0].length == 5000);
    fr_batch_recycle(b);

    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

static void check_reader(const char *engine, int direct, const char *img)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.o_direct = direct;
    fr_range r[NR];
    size_t n = build_ranges(r);
    fr_reader *rd;
    char err[FR_ERRLEN];
    CHECK(fr_reader_open_ranges(&cfg, img, r, n, 2, 2, &rd, err, sizeof(err)) == 0);
    CHECK(fr_reader_size(rd) == n);
    CHECK(strcmp(fr_reader_path(rd, 0), img) == 0);
    int64_t bad[] = {(int64_t)n};
    CHECK(fr_reader_submit(rd, bad, 1) == -EINVAL);
    for (int k = 0; k < 6; k++) {
        int64_t idx[3];
        for (int j = 0; j < 3; j++)
            idx[j] = (int64_t)((size_t)(k * 3 + j) % n);
        CHECK(fr_reader_submit(rd, idx, 3) == 0);
    }
    for (int k = 0; k < 6; k++) {
        fr_batch *b;
        CHECK(fr_reader_next(rd, &b) == 0);
        CHECK(b->status == 0 && b->count == 3);
        for (int j = 0; j < 3; j++) {
            size_t want = (size_t)(k * 3 + j) % n;
            CHECK(b->indices[j] == (int64_t)want);
            CHECK(same_range(b, (size_t)j, &r[want]));
        }
        fr_batch_recycle(b);
    }
    fr_reader_close(rd);

    /* Unaligned ranges are refused up front under O_DIRECT. */
    if (direct) {
        fr_range u = {.offset = 1, .length = 10};
        CHECK(fr_reader_open_ranges(&cfg, img, &u, 1, 2, 1, &rd, err, sizeof(err)) == -EINVAL);
        CHECK(strstr(err, "not aligned") != NULL);
    }

    /* The same ranges as borrowed columns, plus one bad range (overflowing;
     * unaligned too under O_DIRECT): the same bytes, and the bad one is
     * its own sample's -EINVAL when read, not an error at open. */
    uint64_t offs[NR + 1], lens[NR + 1];
    for (size_t i = 0; i < n; i++) {
        offs[i] = r[i].offset;
        lens[i] = r[i].length;
    }
    offs[n] = UINT64_MAX - 1;
    lens[n] = 10;
    CHECK(fr_reader_open_range_columns(&cfg, img, offs, lens, n + 1, 2, 2, &rd, err,
                                       sizeof(err)) == 0);
    CHECK(fr_reader_size(rd) == n + 1);
    int64_t all[NR + 1];
    for (size_t i = 0; i <= n; i++)
        all[i] = (int64_t)(n - i); /* the bad one first, then backwards */
    CHECK(fr_reader_submit(rd, all, n + 1) == 0);
    fr_batch *b;
    CHECK(fr_reader_next(rd, &b) == 0);
    CHECK(b->count == n + 1);
    CHECK(b->samples[0].length == -EINVAL);
    for (size_t j = 1; j <= n; j++)
        CHECK(same_range(b, j, &r[n - j]));
    fr_batch_recycle(b);
    fr_reader_close(rd);
    CHECK(fr_reader_open_range_columns(&cfg, img, NULL, NULL, 1, 2, 1, &rd, err,
                                       sizeof(err)) == -EINVAL);
}

/* An image replaced by rename between two reads through one context (as
 * fastread.pack replaces one): the second read sees the new file's bytes,
 * not the old descriptor's; once removed, its samples say -ENOENT. */
static void check_replaced(const char *engine, int direct)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.o_direct = direct;
    fr_ctx *ctx;
    char err[FR_ERRLEN];
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    fr_pool *pool = fr_pool_new();
    fr_range one = {.offset = ALIGN, .length = 3000};
    char *path = write_image("swap.img", 3 * ALIGN, 11);
    for (unsigned seed = 12; seed < 15; seed++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, 1) == 0);
        CHECK(fr_read_ranges(ctx, path, &one, 1, b) == 0);
        if (!same_range(b, 0, &one)) {
            fprintf(stderr, "%s direct=%d: image %s read stale after a replace (seed %u)\n",
                    engine, direct, path, seed);
            fr_test_failures++;
        }
        fr_batch_recycle(b);
        char *next = write_image("swap.next", 3 * ALIGN, seed); /* image_bytes: the new one */
        CHECK(rename(next, path) == 0);
        free(next);
    }
    CHECK(unlink(path) == 0);
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 1) == 0);
    CHECK(fr_read_ranges(ctx, path, &one, 1, b) == 0);
    CHECK(b->samples[0].length == -ENOENT);
    fr_batch_recycle(b);
    free(path);
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

int main(void)
{
    fr_range r[NR];
    size_t n = build_ranges(r);
    size_t len = (size_t)(r[n - 1].offset + r[n - 1].length);
    len = (len + ALIGN - 1) / ALIGN * ALIGN + 777; /* a tail that is not whole blocks */
    char *img2 = write_image("other.img", 3 * ALIGN, 99);
    char *img = write_image("ranges.img", len, 7);
    const char *engines[] = {"psync", "io_uring"};
    for (int e = 0; e < 2; e++) {
        char why[FR_ERRLEN];
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0) {
            fprintf(stderr, "skipping %s: %s\n", engines[e], why);
            continue;
        }
        for (int direct = 0; direct < 2; direct++) {
            check_engine(engines[e], direct, img, img2);
            check_reader(engines[e], direct, img);
        }
    }
    for (int e = 0; e < 2; e++) { /* last: it replaces image_bytes */
        char why[FR_ERRLEN];
        for (int direct = 0; direct < 2 && fr_engine_probe(engines[e], why, sizeof(why)) == 0;
             direct++)
            check_replaced(engines[e], direct);
    }
    free(image_bytes);
    free(img);
    free(img2);
    return fr_test_finish("test_ranges");
}
