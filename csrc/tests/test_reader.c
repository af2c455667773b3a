/* The reader returns batches in submission order with the right samples
 * (with one worker and with several),
 * bounds read-ahead, drops abandoned work on reset, and keeps batches the
 * caller holds valid after it is closed; lists of explicit paths
 * (fr_reader_submit_paths) come out the same way, mixed with indices. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NFILES 50

int main(void)
{
    char *paths[NFILES];
    char name[64];
    for (int i = 0; i < NFILES; i++) {
        snprintf(name, sizeof(name), "r%02d.bin", i);
        paths[i] = fr_test_write(name, (size_t)(i * 997), (unsigned)i);
    }
    const char *engines[] = {"psync", "io_uring", "psync", "io_uring"};
    for (int e = 0; e < 4; e++) {
        unsigned workers = e < 2 ? 1 : 3; /* in-order delivery across workers */
        char why[FR_ERRLEN];
        if (fr_engine_probe(engines[e], why, sizeof(why)) != 0)
            continue;
        fr_config cfg;
        fr_config_init(&cfg);
        cfg.engine = engines[e];
        fr_reader *rd;
        char err[FR_ERRLEN];
        CHECK(fr_reader_open(&cfg, (const char *const *)paths, NFILES, 2, workers, &rd, err,
                             sizeof(err)) == 0);

        fr_batch *b = NULL;
        CHECK(fr_reader_next(rd, &b) == -ENODATA);
        int64_t bad[] = {NFILES};
        CHECK(fr_reader_submit(rd, bad, 1) == -EINVAL);

        /* Ten batches of five, in reverse order of files. */
        for (int k = 0; k < 10; k++) {
            int64_t idx[5];
            for (int j = 0; j < 5; j++)
                idx[j] = NFILES - 1 - (k * 5 + j);
            CHECK(fr_reader_submit(rd, idx, 5) == 0);
        }
        CHECK(fr_reader_pending(rd) == 10);
        fr_batch *kept = NULL;
        for (int k = 0; k < 10; k++) {
            CHECK(fr_reader_next(rd, &b) == 0);
            CHECK(b->count == 5 && b->status == 0);
            for (int j = 0; j < 5; j++) {
                int64_t want = NFILES - 1 - (k * 5 + j);
                CHECK(b->indices[j] == want);
                CHECK(fr_test_same(b, (size_t)j, paths[want]));
            }
            if (k == 3)
                kept = b; /* held across close below */
            else
                fr_batch_recycle(b);
        }
        CHECK(fr_reader_next(rd, &b) == -ENODATA);

        /* Abandon an epoch halfway: reset drops the rest. */
        for (int k = 0; k < 6; k++) {
            int64_t idx[3] = {k, k + 1, k + 2};
            CHECK(fr_reader_submit(rd, idx, 3) == 0);
        }
        CHECK(fr_reader_next(rd, &b) == 0);
        fr_batch_recycle(b);
        fr_reader_reset(rd);
        CHECK(fr_reader_pending(rd) == 0);
        CHECK(fr_reader_next(rd, &b) == -ENODATA);
        int64_t one[] = {7};
        CHECK(fr_reader_submit(rd, one, 1) == 0);
        CHECK(fr_reader_next(rd, &b) == 0);
        CHECK(b->count == 1 && b->indices[0] == 7 && fr_test_same(b, 0, paths[7]));
        fr_batch_recycle(b);

        /* Reading ahead is bounded: with nothing taken, at most prefetch
         * finished batches plus the one being read exist. */
        for (int k = 0; k < 20; k++) {
            int64_t idx[2] = {k, k + 1};
            CHECK(fr_reader_submit(rd, idx, 2) == 0);
        }
        fr_reader_close(rd);
        /* The batch kept from before is still readable after close. */
        for (int j = 0; j < 5; j++)
            CHECK(fr_test_same(kept, (size_t)j, paths[kept->indices[j]]));
        fr_batch_recycle(kept);

        /* A reader over no paths reads lists of explicit ones: copied at
         * submit (the caller's strings are overwritten at once), in
         * submission order, a missing file failing alone, an empty list
         * empty; indices are out of range for it. */
        CHECK(fr_reader_open(&cfg, NULL, 0, 2, workers, &rd, err, sizeof(err)) == 0);
        CHECK(fr_reader_submit(rd, one, 1) == -EINVAL);
        char missing[] = "/nonexistent/fastread-test/missing.bin";
        for (int k = 0; k < 12; k++) {
            const char *list[4];
            char *copies[4];
            size_t n = (size_t)(k % 5 == 4 ? 0 : 4);
            for (size_t j = 0; j < n; j++) {
                copies[j] = strdup(k == 7 && j == 2 ? missing : paths[(k * 4 + (int)j) % NFILES]);
                list[j] = copies[j];
            }
            CHECK(fr_reader_submit_paths(rd, list, n) == 0);
            for (size_t j = 0; j < n; j++) {
                memset(copies[j], 'x', strlen(copies[j]));
                free(copies[j]);
            }
        }
        for (int k = 0; k < 12; k++) {
            CHECK(fr_reader_next(rd, &b) == 0);
            size_t n = (size_t)(k % 5 == 4 ? 0 : 4);
            CHECK(b->status == 0 && b->count == n);
            for (size_t j = 0; j < b->count; j++) {
                CHECK(b->indices[j] == (int64_t)j);
                if (k == 7 && j == 2)
                    CHECK(b->samples[j].length == -ENOENT);
                else
                    CHECK(fr_test_same(b, j, paths[(k * 4 + (int)j) % NFILES]));
            }
            fr_batch_recycle(b);
        }
        CHECK(fr_reader_next(rd, &b) == -ENODATA);
        CHECK(fr_reader_stat(rd, "hinted_lists") == 0); /* no size known yet */
        /* The same lists again, whichever worker reads each: every size is
         * known now (shared by the workers), but for the list with the
         * missing file (a failed path is forgotten) and the empty ones. A
         * file that grew since is read whole all the same (a stale hint
         * costs time, never bytes). */
        free(fr_test_write("r05.bin", 30000, 99)); /* paths[5], in list 1 */
        for (int k = 0; k < 12; k++) {
            const char *list[4];
            size_t n = (size_t)(k % 5 == 4 ? 0 : 4);
            for (size_t j = 0; j < n; j++)
                list[j] = k == 7 && j == 2 ? missing : paths[(k * 4 + (int)j) % NFILES];
            CHECK(fr_reader_submit_paths(rd, list, n) == 0);
        }
        for (int k = 0; k < 12; k++) {
            CHECK(fr_reader_next(rd, &b) == 0);
            for (size_t j = 0; j < b->count; j++)
                if (!(k == 7 && j == 2))
                    CHECK(fr_test_same(b, j, paths[(k * 4 + (int)j) % NFILES]));
            fr_batch_recycle(b);
        }
        CHECK(fr_reader_stat(rd, "hinted_lists") == 9);
        free(fr_test_write("r05.bin", (size_t)(5 * 997), 5)); /* as it was */
        /* Dropped by reset like any batch; then read again. */
        const char *two[] = {paths[1], paths[2]};
        CHECK(fr_reader_submit_paths(rd, two, 2) == 0);
        fr_reader_reset(rd);
        CHECK(fr_reader_next(rd, &b) == -ENODATA);
        CHECK(fr_reader_submit_paths(rd, two, 2) == 0);
        CHECK(fr_reader_next(rd, &b) == 0);
        CHECK(b->count == 2 && fr_test_same(b, 0, paths[1]) && fr_test_same(b, 1, paths[2]));
        fr_batch_recycle(b);
        /* Closed with lists still queued: nothing leaks (ASan). */
        for (int k = 0; k < 8; k++)
            CHECK(fr_reader_submit_paths(rd, two, 2) == 0);
        fr_reader_close(rd);
    }
    /* A range reader reads ranges of its image, not lists of paths. */
    {
        fr_config cfg;
        fr_config_init(&cfg);
        cfg.engine = "psync";
        fr_range r = {.offset = 0, .length = 10};
        fr_reader *rd;
        char err[FR_ERRLEN];
        CHECK(fr_reader_open_ranges(&cfg, paths[3], &r, 1, 1, 1, &rd, err, sizeof(err)) == 0);
        const char *list[] = {paths[1]};
        CHECK(fr_reader_submit_paths(rd, list, 1) == -EINVAL);
        fr_reader_close(rd);
    }
    for (int i = 0; i < NFILES; i++)
        free(paths[i]);
    return fr_test_finish("test_reader");
}
