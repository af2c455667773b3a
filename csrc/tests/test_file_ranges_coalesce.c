/* Nearby ranges of one file in a fr_read_file_ranges batch are read as one
 * vector read (psync, and io_uring through its psync side): adjacent,
 * overlapping and duplicate ranges, gaps below and past the threshold,
 * zero-length ranges among them, runs longer than one read's vectors, a
 * file that ends inside a run (the ranges before its end delivered, those
 * across or past it -ENODATA), and a file truncated between two calls
 * through a cached descriptor (never stale bytes past the new end), shards
 * of several directories opened relative to one of them. Every
 * sample's bytes are checked against the file's. */
#define _POSIX_C_SOURCE 200809L /* truncate */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define SIZE 200000
#define J(f, o, l) {.file = (f), .offset = (o), .length = (l)}

static unsigned char *load(const char *path, size_t size)
{
    unsigned char *buf = malloc(size);
    FILE *f = fopen(path, "rb");
    CHECK(buf && f && fread(buf, 1, size, f) == size);
    if (f)
        fclose(f);
    return buf;
}

static int exact(const fr_batch *b, size_t i, const unsigned char *want, const fr_file_range *r)
{
    const fr_sample *s = &b->samples[i];
    return s->length == (int64_t)r->length &&
           (r->length == 0 || memcmp(b->arena.base + s->offset, want + r->offset, r->length) == 0);
}

static void check_engine(const char *engine, char *const paths[2], unsigned char *const data[2])
{
    fr_ctx *ctx = fr_test_ctx(engine);
    if (!ctx)
        return;
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    /* Shuffled on purpose: the engine sorts by (file, offset). */
    fr_file_range jobs[] = {
        J(0, 1000, 100),  /* adjacent to the next: one run */
        J(0, 0, 1000),
        J(0, 1100, 0),    /* zero-length inside the run */
        J(0, 1100, 50),
        J(0, 1120, 60),   /* overlaps the one before: a run of its own */
        J(0, 1120, 60),   /* a duplicate */
        J(0, 1180, 10),
        J(0, 1190 + 8000, 10),  /* a gap under the threshold: same run */
        J(0, 50000, 10),        /* a gap past it: a new run */
        J(1, 0, 10),            /* another file, interleaved */
        J(0, SIZE - 10, 10),    /* the file's last bytes */
        J(1, 10, 10),
        J(0, SIZE, 0),          /* zero-length at the end */
        J(1, SIZE - 5, 10),     /* across the end: -ENODATA */
        J(1, SIZE + 100, 4),    /* past the end, same run as the one before */
        J(1, SIZE - 20, 10),    /* in, before the end, in the same run */
    };
    enum { NJ = sizeof(jobs) / sizeof(jobs[0]) };
    CHECK(fr_batch_prepare(b, NJ) == 0);
    CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, 2, jobs, NJ, b) == 0);
    for (size_t i = 0; i < NJ; i++) {
        int across = jobs[i].offset + jobs[i].length > SIZE;
        if (across)
            CHECK(b->samples[i].length == -ENODATA);
        else if (!exact(b, i, data[jobs[i].file], &jobs[i])) {
            fprintf(stderr, "%s: job %zu: length %lld\n", engine, i,
                    (long long)b->samples[i].length);
            CHECK(0);
        }
    }
    long reads0 = fr_ctx_stat(ctx, "fd_cache_reads");

    /* 300 adjacent 100-byte ranges of one file: many runs of at most 64
     * vectors each, every byte where it belongs. */
    enum { NA = 300 };
    fr_file_range adj[NA];
    for (size_t i = 0; i < NA; i++)
        adj[i] = (fr_file_range)J(0, (uint64_t)(NA - 1 - i) * 100, 100);
    CHECK(fr_batch_prepare(b, NA) == 0);
    CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, 2, adj, NA, b) == 0);
    int all = 1;
    for (size_t i = 0; i < NA; i++)
        all &= exact(b, i, data[0], &adj[i]);
    CHECK(all);
    { /* io_uring: its psync side (fr_ctx_stat routes fd_cache_ keys there) */
        long reads = fr_ctx_stat(ctx, "fd_cache_reads") - reads0;
        CHECK(reads >= NA / 64 && reads <= NA / 32); /* coalesced, in vectors of 64 */
    }

    /* Truncated between calls, read through the descriptor the LRU kept:
     * what lies past the new end is -ENODATA, never the old bytes. */
    CHECK(truncate(paths[0], 1050) == 0);
    CHECK(fr_batch_prepare(b, 3) == 0);
    CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, 2, jobs, 3, b) == 0);
    CHECK(b->samples[0].length == -ENODATA); /* 1000..1100 across the new end */
    CHECK(exact(b, 1, data[0], &jobs[1]));
    CHECK(b->samples[2].length == -ENODATA || b->samples[2].length == 0);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
}

/* Shards opened relative to the first one's directory (psync's dir_fd),
 * beside shards of other directories and a missing one: each the bytes of
 * its own path, the missing one -ENOENT. */
static void check_directories(const char *engine)
{
    enum { NF = 12 };
    char *paths[NF];
    unsigned char *data[NF];
    char sub[512];
    snprintf(sub, sizeof(sub), "%s/sub", fr_test_dir());
    CHECK(mkdir(sub, 0700) == 0 || errno == EEXIST);
    for (int i = 0; i < NF; i++) {
        char name[32];
        snprintf(name, sizeof(name), "%sd%02d.bin", i % 3 == 2 ? "sub/" : "", i);
        paths[i] = fr_test_write(name, 100, (unsigned)i + 40);
        data[i] = load(paths[i], 100);
    }
    CHECK(unlink(paths[4]) == 0);
    fr_ctx *ctx = fr_test_ctx(engine);
    if (ctx) {
        fr_pool *pool = fr_pool_new();
        fr_batch *b = fr_pool_get(pool);
        fr_file_range jobs[NF];
        for (int i = 0; i < NF; i++)
            jobs[i] = (fr_file_range)J((uint32_t)(NF - 1 - i), 3, 50);
        CHECK(fr_batch_prepare(b, NF) == 0);
        CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NF, jobs, NF, b) == 0);
        for (int i = 0; i < NF; i++) {
            if (jobs[i].file == 4)
                CHECK(b->samples[i].length == -ENOENT);
            else
                CHECK(exact(b, (size_t)i, data[jobs[i].file], &jobs[i]));
        }
        fr_batch_recycle(b);
        fr_pool_close(pool);
        fr_ctx_close(ctx);
    }
    for (int i = 0; i < NF; i++) {
        free(paths[i]);
        free(data[i]);
    }
}

int main(void)
{
    const char *engines[] = {"psync", "io_uring"};
    for (int e = 0; e < 2; e++) {
        char why[FR_ERRLEN];
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0) {
            fprintf(stderr, "skipping %s: %s\n", engines[e], why);
            continue;
        }
        char name0[32], name1[32];
        snprintf(name0, sizeof(name0), "co0-%d.bin", e);
        snprintf(name1, sizeof(name1), "co1-%d.bin", e);
        char *paths[2] = {fr_test_write(name0, SIZE, 11), fr_test_write(name1, SIZE, 12)};
        unsigned char *data[2] = {load(paths[0], SIZE), load(paths[1], SIZE)};
        check_engine(engines[e], paths, data);
        check_directories(engines[e]);
        for (int i = 0; i < 2; i++) {
            free(paths[i]);
            free(data[i]);
        }
    }
    return fr_test_finish("test_file_ranges_coalesce");
}
