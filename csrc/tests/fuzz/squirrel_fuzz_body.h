/* The Squirrel MessagePack walk (formats/squirrel_walk.h) over one input:
 * the body of the libFuzzer target (fuzz_squirrel.c) and of
 * test_squirrel_walk's seeded fuzz. A shard may be refused for anything;
 * what is accepted must lie inside it: samples back to back within the
 * input, every wanted field within its sample, a data payload within its
 * field. */
#ifndef FASTREAD_SQUIRREL_FUZZ_BODY_H
#define FASTREAD_SQUIRREL_FUZZ_BODY_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/squirrel_walk.h"

static inline void squirrel_fuzz_check(int ok)
{
    if (!ok)
        abort(); /* an index entry outside the shard */
}

static inline void squirrel_fuzz_one(const uint8_t *data, size_t len)
{
    static const char *const keys[] = {"image", "label"};
    static const size_t key_len[] = {5, 5};
    fr_sq_samples s;
    memset(&s, 0, sizeof s);
    uint64_t bad_at = 0;
    char err[256];
    int rc = fr_sq_walk(data, len, keys, key_len, 2, &s, &bad_at, err, sizeof err);
    if (rc == 0) {
        uint64_t at = 0;
        for (size_t i = 0; i < s.n; i++) {
            squirrel_fuzz_check(s.start[i] == at && s.length[i] > 0 &&
                                s.length[i] <= len - at);
            for (size_t j = 0; j < 2; j++) {
                uint64_t fa = s.fa[i * 2 + j], fb = s.fb[i * 2 + j];
                squirrel_fuzz_check(fa < fb && fb <= s.length[i]);
                int64_t d = s.data_off[i * 2 + j];
                squirrel_fuzz_check(d == -1 || ((uint64_t)d >= fa && (uint64_t)d <= fb &&
                                                s.data_len[i * 2 + j] <= fb - (uint64_t)d));
            }
            at += s.length[i];
        }
        squirrel_fuzz_check(at == len);
    } else {
        squirrel_fuzz_check(rc == -ENOMEM || (rc == -EINVAL && bad_at <= len && err[0]));
    }
    fr_sq_samples_free(&s);
}

#endif
