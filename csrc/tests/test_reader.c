/* The reader returns batches in submission order with the right samples
 * (with one worker and with several),
 * bounds read-ahead, drops abandoned work on reset, and keeps batches the
 * caller holds valid after it is closed. */
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
    }
    for (int i = 0; i < NFILES; i++)
        free(paths[i]);
    return fr_test_finish("test_reader");
}
