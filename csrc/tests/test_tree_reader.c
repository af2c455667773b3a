/* The tree reader (fr_reader_open_tree): files named by a directory table
 * and a names blob read exactly as fr_reader_open reads the same paths
 * (every engine given, shuffled batches, a second epoch with sizes known),
 * fr_reader_path_copy naming them, a missing file as that sample's error,
 * and the column checks refusing bad tables with why. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

#define NDIRS 3
#define PER_DIR 7
#define N (NDIRS * PER_DIR)

static char dirs[512];
static uint64_t dir_offs[NDIRS + 1];
static char names[N * 16];
static uint64_t name_offs[N + 1];
static uint32_t dir_ids[N];
static char full[N][256];

static void make_tree(void)
{
    const char *root = fr_test_dir();
    size_t at = 0;
    for (int d = 0; d < NDIRS; d++) {
        char dir[256];
        snprintf(dir, sizeof(dir), "%s/class%d", root, d);
        CHECK(mkdir(dir, 0755) == 0);
        dir_offs[d] = at;
        at += (size_t)snprintf(dirs + at, sizeof(dirs) - at, "%s/", dir);
    }
    dir_offs[NDIRS] = at;
    at = 0;
    for (int i = 0; i < N; i++) {
        /* Files interleave directories: ids need not be grouped. */
        int d = i % NDIRS;
        dir_ids[i] = (uint32_t)d;
        name_offs[i] = at;
        int len = snprintf(names + at, sizeof(names) - at, "f%02d.bin", i);
        char rel[64];
        snprintf(rel, sizeof(rel), "class%d/f%02d.bin", d, i);
        char *p = fr_test_write(rel, (size_t)(i * 97 % 5000), (unsigned)i + 1);
        snprintf(full[i], sizeof(full[i]), "%s", p);
        free(p);
        at += (size_t)len;
    }
    name_offs[N] = at;
}

static fr_reader *open_tree(const fr_config *cfg, const uint32_t *ids, size_t ndirs, char *err)
{
    fr_reader *rd = NULL;
    int rc = fr_reader_open_tree(cfg, dirs, dir_offs, ndirs, ids, names, name_offs, N, 2, 2,
                                 &rd, err, FR_ERRLEN);
    return rc == 0 ? rd : NULL;
}

static void check_reads(const char *engine)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    char err[FR_ERRLEN] = "";
    fr_reader *rd = open_tree(&cfg, dir_ids, NDIRS, err);
    CHECK(rd != NULL);
    if (!rd) {
        fprintf(stderr, "%s: %s\n", engine, err);
        return;
    }
    CHECK(fr_reader_size(rd) == N);
    CHECK(fr_reader_path(rd, 0) == NULL);
    char buf[256];
    for (size_t i = 0; i < N; i++) {
        CHECK(fr_reader_path_copy(rd, i, buf, sizeof(buf)) == strlen(full[i]));
        CHECK(strcmp(buf, full[i]) == 0);
    }
    CHECK(fr_reader_path_copy(rd, 0, buf, 4) == strlen(full[0])); /* too small: length only */
    CHECK(fr_reader_path_copy(rd, N, buf, sizeof(buf)) == (size_t)-1);
    int64_t idx[N];
    for (int epoch = 0; epoch < 2; epoch++) { /* the second with sizes known */
        for (size_t i = 0; i < N; i++)
            idx[i] = (int64_t)((i * 5 + (size_t)epoch) % N); /* 5 is prime to 21 */
        CHECK(fr_reader_submit(rd, idx, 10) == 0);
        CHECK(fr_reader_submit(rd, idx + 10, N - 10) == 0);
        size_t seen = 0;
        for (int k = 0; k < 2; k++) {
            fr_batch *b = NULL;
            CHECK(fr_reader_next(rd, &b) == 0);
            if (!b)
                break;
            for (size_t i = 0; i < b->count; i++, seen++) {
                CHECK(b->indices[i] == idx[seen]);
                CHECK(fr_test_same(b, i, full[idx[seen]]));
            }
            fr_batch_recycle(b);
        }
        CHECK(seen == N);
    }
    /* A file gone: that sample's -ENOENT, the others read. */
    CHECK(remove(full[4]) == 0);
    CHECK(fr_reader_submit(rd, idx, N) == 0);
    fr_batch *b = NULL;
    CHECK(fr_reader_next(rd, &b) == 0);
    if (b) {
        for (size_t i = 0; i < b->count; i++)
            CHECK(idx[i] == 4 ? b->samples[i].length == -ENOENT
                              : fr_test_same(b, i, full[idx[i]]));
        fr_batch_recycle(b);
    }
    fr_reader_close(rd);
    /* Back as it was, for the next engine's pass. */
    char rel[64];
    snprintf(rel, sizeof(rel), "class%d/f%02d.bin", 4 % NDIRS, 4);
    free(fr_test_write(rel, 4 * 97 % 5000, 5));
}

static void check_refused(void)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "psync";
    char err[FR_ERRLEN] = "";
    uint32_t bad[N];
    memcpy(bad, dir_ids, sizeof(bad));
    bad[9] = NDIRS;
    CHECK(open_tree(&cfg, bad, NDIRS, err) == NULL);
    CHECK(strstr(err, "file 9") != NULL);
    uint64_t keep = name_offs[5];
    name_offs[5] = name_offs[6] + 1; /* decreasing */
    CHECK(open_tree(&cfg, dir_ids, NDIRS, err) == NULL);
    CHECK(strstr(err, "name offset 6 decreases") != NULL);
    name_offs[5] = keep;
    char c = names[3];
    names[3] = '\0';
    CHECK(open_tree(&cfg, dir_ids, NDIRS, err) == NULL);
    CHECK(strstr(err, "NUL") != NULL);
    names[3] = c;
    CHECK(open_tree(&cfg, dir_ids, 0, err) == NULL); /* files but no directories */
}

int main(void)
{
    make_tree();
    check_reads("psync");
    char why[256];
    if (fr_engine_probe("io_uring", why, sizeof(why)) == 0)
        check_reads("io_uring");
    else
        printf("test_tree_reader: io_uring part skipped: %s\n", why);
    check_refused();
    fr_test_cleanup();
    if (fr_test_failures)
        fprintf(stderr, "%d failure(s)\n", fr_test_failures);
    return fr_test_failures ? 1 : 0;
}
