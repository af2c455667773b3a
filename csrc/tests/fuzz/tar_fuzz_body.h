/* The tar header walker and the WebDataset grouping (formats/tar_index.h)
 * over one input: the body of the libFuzzer target (fuzz_tar.c) and of
 * test_tar_index's seeded fuzz. A shard may be refused for anything; what
 * is accepted must lie inside it: every member's data and header within
 * the input, names within the names blob, every sample's span within the
 * input and its components within the span. */
#ifndef FASTREAD_TAR_FUZZ_BODY_H
#define FASTREAD_TAR_FUZZ_BODY_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/tar_index.h"

static inline void tar_fuzz_check(int ok)
{
    if (!ok)
        abort(); /* an index entry outside the shard */
}

static inline void tar_fuzz_one(const uint8_t *data, size_t len)
{
    fr_tar_members m;
    memset(&m, 0, sizeof m);
    uint64_t bad_at = 0;
    char err[256];
    if (fr_tar_walk(data, len, &m, &bad_at, err, sizeof err) != 0) {
        fr_tar_members_free(&m);
        return;
    }
    for (size_t i = 0; i < m.n; i++) {
        tar_fuzz_check(m.data_off[i] <= len && m.size[i] <= len - m.data_off[i]);
        tar_fuzz_check(m.header_off[i] + 512 <= m.data_off[i]);
        tar_fuzz_check(m.name_off[i] <= m.name_off[i + 1] && m.name_off[i + 1] <= m.names_len);
    }
    static const char *const wanted[] = {"jpg", "png", "cls"};
    static const size_t wanted_len[] = {3, 3, 3};
    static const int wanted_col[] = {0, 0, 1};
    for (int variant = 0; variant < 4; variant++) {
        fr_wds_spec spec = {.k = 2, .n_wanted = 3, .wanted = wanted, .wanted_len = wanted_len,
                            .wanted_col = wanted_col, .fold_case = variant & 1,
                            .dali = variant >> 1, .missing = variant & 1, .want_keys = 1};
        fr_wds_samples s;
        memset(&s, 0, sizeof s);
        if (m.n && fr_wds_group(&spec, m.names, m.name_off, m.data_off, m.size, m.n, &s, err,
                                sizeof err) == 0) {
            for (size_t i = 0; i < s.n; i++) {
                tar_fuzz_check(s.start[i] <= len && s.length[i] <= len - s.start[i]);
                for (int j = 0; j < s.k; j++) {
                    int64_t off = s.comp_off[i * (size_t)s.k + (size_t)j];
                    uint64_t n = s.comp_len[i * (size_t)s.k + (size_t)j];
                    tar_fuzz_check(off == -1 || ((uint64_t)off <= s.length[i] &&
                                                 n <= s.length[i] - (uint64_t)off));
                }
                tar_fuzz_check(s.key_off[i] <= s.key_off[i + 1] &&
                               s.key_off[i + 1] <= s.keys_len);
            }
        }
        fr_wds_samples_free(&s);
    }
    fr_tar_members_free(&m);
}

#endif
