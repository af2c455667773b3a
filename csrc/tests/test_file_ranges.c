/* Ranges of many files (fr_read_file_ranges, fr_reader_open_table): the
 * descriptor LRU (hits, eviction of the least recent unpinned entry, the
 * reserve that keeps open descriptors within the cap, a new table emptying
 * it, the list of pinned entries), exact bytes from many files in one call with psync and with
 * io_uring (read through its psync side), batches touching more files than
 * the LRU holds (windows), per-sample errors (missing file, truncated file,
 * a directory, a file index past the table), and the table reader over
 * borrowed columns delivering in order with at most max_open_files open. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "engines/fd_cache.h"

#define NFILES 40
#define PER_FILE 5
#define LEN 100

static char *paths[NFILES];
static unsigned char *contents[NFILES];

static void check_lru(void)
{
    fr_fd_cache c;
    CHECK(fr_fd_cache_init(&c, 3) == 0);
    int base = fr_test_open_fds();
    int fds[5];
    for (int i = 0; i < 5; i++)
        fds[i] = dup(0);
    fr_fd_cache_use_table(&c, paths);
    CHECK(fr_fd_cache_get(&c, 1) == -1);
    CHECK(fr_fd_cache_put(&c, 1, fds[0]) == 0);
    CHECK(fr_fd_cache_put(&c, 2, fds[1]) == 0);
    CHECK(fr_fd_cache_put(&c, 3, fds[2]) == 0);
    /* All pinned: no room. */
    CHECK(fr_fd_cache_reserve(&c, 1) == -EBUSY);
    fr_fd_cache_unpin_all(&c);
    CHECK(fr_fd_cache_get(&c, 1) == fds[0]); /* 1 most recent: 2 is the LRU */
    CHECK(fr_fd_cache_put(&c, 4, fds[3]) == 0);
    CHECK(c.evictions == 1 && fr_fd_cache_get(&c, 2) == -1);
    CHECK(fr_fd_cache_get(&c, 3) == fds[2] && fr_fd_cache_get(&c, 4) == fds[3]);
    /* 1, 3, 4 pinned: reserving evicts nothing. */
    CHECK(fr_fd_cache_reserve(&c, 1) == -EBUSY);
    fr_fd_cache_unpin_all(&c);
    (void)fr_fd_cache_get(&c, 4);
    CHECK(fr_fd_cache_reserve(&c, 2) == 0); /* 1 and 3 go; 4 stays */
    CHECK(c.used == 1 && fr_fd_cache_get(&c, 4) == fds[3]);
    CHECK(fr_fd_cache_reserve(&c, 4) == -EBUSY); /* more than the cap */
    fr_fd_cache_drop(&c, 4);
    CHECK(c.used == 0);
    CHECK(fr_fd_cache_put(&c, 7, fds[4]) == 0);
    fr_fd_cache_use_table(&c, contents); /* another table: emptied */
    CHECK(c.used == 0 && fr_fd_cache_get(&c, 7) == -1);
    CHECK(fr_test_open_fds() == base); /* every descriptor it took is closed */
    fr_fd_cache_free(&c);
}

/* The pinned list (unpin_all costs the entries pinned, not the cache's
 * size): each entry listed once however often it is used in a phase, a
 * pinned entry dropped mid-phase (io_uring's failed open) leaves the list,
 * its entry reused in the same phase is listed again, and every entry is
 * evictable after unpin_all. keys_only: the values are slot numbers. */
static void check_pinned_list(void)
{
    fr_fd_cache c;
    CHECK(fr_fd_cache_init(&c, 64) == 0);
    c.keys_only = 1;
    fr_fd_cache_use_table(&c, paths);
    for (uint32_t f = 0; f < 64; f++)
        CHECK(fr_fd_cache_put(&c, f, (int)(100 + f)) == 0);
    CHECK(c.npinned == 64);
    fr_fd_cache_unpin_all(&c);
    CHECK(c.npinned == 0);
    for (int rep = 0; rep < 3; rep++) /* the same files again: listed once */
        for (uint32_t f = 10; f < 13; f++)
            CHECK(fr_fd_cache_get(&c, f) == (int)(100 + f));
    CHECK(c.npinned == 3);
    fr_fd_cache_drop(&c, 11); /* pinned, dropped: off the list */
    CHECK(c.npinned == 2 && c.used == 63);
    CHECK(fr_fd_cache_put(&c, 200, 7) == 0); /* its entry again, pinned */
    CHECK(c.npinned == 3 && fr_fd_cache_get(&c, 200) == 7 && c.npinned == 3);
    for (uint32_t p = 0; p < c.npinned; p++) {
        const fr_fd_entry *e = &c.entries[c.pinned_list[p]];
        CHECK(e->pinned && e->pin_at == p);
    }
    /* 10, 12, 200 pinned: room for 61 more evicts the other 61 only. */
    CHECK(fr_fd_cache_reserve(&c, 62) == -EBUSY);
    CHECK(c.used == 3 && fr_fd_cache_get(&c, 12) == 112 && fr_fd_cache_get(&c, 5) == -1);
    fr_fd_cache_unpin_all(&c);
    CHECK(c.npinned == 0);
    CHECK(fr_fd_cache_reserve(&c, 64) == 0 && c.used == 0); /* nothing pinned any more */
    CHECK(fr_fd_cache_put(&c, 1, 1) == 0 && c.npinned == 1);
    fr_fd_cache_clear(&c);
    CHECK(c.npinned == 0 && c.used == 0);
    fr_fd_cache_free(&c);
}

static void check_ctx(const char *engine)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.max_open_files = 8;
    int before = fr_test_open_fds(); /* io_uring's rings hold descriptors too */
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", engine, err);
        fr_test_failures++;
        return;
    }
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    enum { N = NFILES * PER_FILE };
    fr_file_range jobs[N + 2];
    /* Every range of every file, interleaved across files (file k % NFILES). */
    for (size_t k = 0; k < N; k++)
        jobs[k] = (fr_file_range){.file = (uint32_t)(k % NFILES),
                                  .offset = (k / NFILES) * LEN + (k % 7),
                                  .length = LEN - (k % 7)};
    jobs[N] = (fr_file_range){.file = NFILES, .offset = 0, .length = 1}; /* past the table */
    jobs[N + 1] = (fr_file_range){.file = 0, .offset = 0, .length = 0};  /* empty */
    int base = fr_test_open_fds();
    for (int round = 0; round < 2; round++) {
        CHECK(fr_batch_prepare(b, N + 2) == 0);
        CHECK(fr_read_file_ranges(ctx, (const char *const *)paths, NFILES, jobs, N + 2, b) == 0);
        int exact = 1;
        for (size_t k = 0; k < N; k++) {
            const fr_sample *s = &b->samples[k];
            exact &= s->length == (int64_t)jobs[k].length &&
                     memcmp(b->arena.base + s->offset, contents[jobs[k].file] + jobs[k].offset,
                            jobs[k].length) == 0;
        }
        CHECK(exact);
        CHECK(b->samples[N].length == -EINVAL);
        CHECK(b->samples[N + 1].length == 0);
        CHECK(fr_test_open_fds() - base <= 8); /* the LRU's cap, after 40 files */
    }
    CHECK(fr_ctx_stat(ctx, "fd_cache_evictions") > 0);
    /* Errors of their samples only: a missing file, a truncated one, a directory. */
    const char *bad[4] = {paths[0], "/nonexistent/fastread-shard", fr_test_dir(), paths[1]};
    char *trunc = fr_test_write("trunc.bin", 150, 3);
    bad[3] = trunc;
    fr_file_range ej[5] = {
        {.file = 0, .offset = 10, .length = 20},   {.file = 1, .offset = 0, .length = 5},
        {.file = 2, .offset = 0, .length = 5},     {.file = 3, .offset = 100, .length = 100},
        {.file = 3, .offset = 0, .length = 150},
    };
    CHECK(fr_batch_prepare(b, 5) == 0);
    CHECK(fr_read_file_ranges(ctx, bad, 4, ej, 5, b) == 0);
    CHECK(b->samples[0].length == 20 &&
          memcmp(b->arena.base + b->samples[0].offset, contents[0] + 10, 20) == 0);
    CHECK(b->samples[1].length == -ENOENT);
    CHECK(b->samples[2].length == -EISDIR);
    CHECK(b->samples[3].length == -ENODATA);
    CHECK(b->samples[4].length == 150);
    free(trunc);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
    CHECK(fr_test_open_fds() == before); /* the LRU's descriptors closed with it */
}

/* narrow: the uint32 length column (fr_reader_open_table32), its lengths
 * varied so that a reader reading the wrong column or width fails. */
static void check_table_reader(const char *engine, int narrow)
{
    enum { N = NFILES * PER_FILE };
    static uint32_t ids[N], lens32[N];
    static uint64_t offs[N], lens[N];
    for (size_t i = 0; i < N; i++) {
        ids[i] = (uint32_t)(i / PER_FILE);
        offs[i] = (i % PER_FILE) * LEN;
        lens[i] = narrow ? LEN - i % 7 : LEN;
        lens32[i] = (uint32_t)lens[i];
    }
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.max_open_files = 10; /* 5 a worker */
    fr_reader *rd = NULL;
    char err[FR_ERRLEN] = "";
    int base = fr_test_open_fds();
    int rc = narrow ? fr_reader_open_table32(&cfg, (const char *const *)paths, NFILES, ids, offs,
                                             lens32, N, 2, 2, &rd, err, sizeof(err))
                    : fr_reader_open_table(&cfg, (const char *const *)paths, NFILES, ids, offs,
                                           lens, N, 2, 2, &rd, err, sizeof(err));
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return;
    }
    CHECK(fr_reader_size(rd) == N);
    CHECK(strcmp(fr_reader_path(rd, 7), paths[1]) == 0);
    int64_t idx[N];
    for (size_t i = 0; i < N; i++)
        idx[i] = (int64_t)((i * 37) % N); /* 37 is prime to 200: a permutation */
    for (size_t s = 0; s < N; s += 50)
        CHECK(fr_reader_submit(rd, idx + s, 50) == 0);
    int exact = 1, peak = 0;
    for (size_t s = 0; s < N; s += 50) {
        fr_batch *b = NULL;
        CHECK(fr_reader_next(rd, &b) == 0);
        if (!b)
            break;
        for (size_t i = 0; i < 50; i++) {
            int64_t j = idx[s + i];
            exact &= b->indices[i] == j && b->samples[i].length == (int64_t)lens[j] &&
                     memcmp(b->arena.base + b->samples[i].offset,
                            contents[ids[j]] + offs[j], lens[j]) == 0;
        }
        int now = fr_test_open_fds() - base;
        peak = now > peak ? now : peak;
        fr_batch_recycle(b);
    }
    CHECK(exact);
    /* The workers' LRUs (and, for io_uring, nothing more: psync contexts). */
    CHECK(peak <= 10);
    CHECK(fr_reader_stat(rd, "fd_cache_opens") >= NFILES);
    CHECK(fr_reader_stat(rd, "fd_cache_open") <= 10);
    CHECK(fr_reader_submit_paths(rd, (const char *const *)paths, 1) == -EINVAL);
    fr_reader_close(rd);
}

int main(void)
{
    for (int i = 0; i < NFILES; i++) {
        char name[32];
        snprintf(name, sizeof(name), "shard%02d.bin", i);
        paths[i] = fr_test_write(name, PER_FILE * LEN, (unsigned)i + 1); /* malloc'd */
        FILE *f = fopen(paths[i], "rb");
        contents[i] = malloc(PER_FILE * LEN);
        CHECK(f && fread(contents[i], 1, PER_FILE * LEN, f) == PER_FILE * LEN);
        if (f)
            fclose(f);
    }
    check_lru();
    check_pinned_list();
    const char *engines[] = {"psync", "io_uring"};
    for (int e = 0; e < 2; e++) {
        char why[FR_ERRLEN];
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0) {
            fprintf(stderr, "skipping %s: %s\n", engines[e], why);
            continue;
        }
        check_ctx(engines[e]);
        check_table_reader(engines[e], 0);
        check_table_reader(engines[e], 1);
    }
    for (int i = 0; i < NFILES; i++) {
        free(paths[i]);
        free(contents[i]);
    }
    return fr_test_finish("test_file_ranges");
}
