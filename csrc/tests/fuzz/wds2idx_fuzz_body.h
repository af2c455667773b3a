/* DALI wds2idx parsing (formats/tar_index.h fr_wds2idx_parse) over one
 * input: the body of the libFuzzer target (fuzz_wds2idx.c) and of
 * test_wds2idx's seeded fuzz. An index may be refused for anything (and
 * must then name a line); what is accepted must be consistent: names
 * within the names blob in order, no offset + size overflowing. */
#ifndef FASTREAD_WDS2IDX_FUZZ_BODY_H
#define FASTREAD_WDS2IDX_FUZZ_BODY_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/tar_index.h"

static inline void wds2idx_fuzz_check(int ok)
{
    if (!ok)
        abort(); /* an inconsistent parse */
}

static inline void wds2idx_fuzz_one(const uint8_t *data, size_t len)
{
    fr_tar_members m;
    memset(&m, 0, sizeof m);
    size_t line = 0;
    char err[256];
    int rc = fr_wds2idx_parse((const char *)data, len, &m, &line, err, sizeof err);
    if (rc == 0) {
        for (size_t i = 0; i < m.n; i++) {
            wds2idx_fuzz_check(m.name_off[i] < m.name_off[i + 1] &&
                               m.name_off[i + 1] <= m.names_len);
            wds2idx_fuzz_check(m.data_off[i] <= UINT64_MAX - m.size[i]);
        }
    } else {
        wds2idx_fuzz_check(rc == -ENOMEM || (rc == -EINVAL && line >= 1 && err[0]));
    }
    fr_tar_members_free(&m);
}

#endif
