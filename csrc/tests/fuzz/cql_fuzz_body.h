/* Every parser of server bytes in engines/cql/cql_proto.h over one input:
 * the body of the libFuzzer target (fuzz_cql.c) and of test_cql_proto's
 * seeded fuzz. The first byte picks nothing: every parser sees every
 * input (and the input minus its first bytes), so each gets the whole
 * corpus. A parser may refuse anything; it must never read out of
 * bounds, loop, or hand back a cell outside the input. */
#ifndef FASTREAD_CQL_FUZZ_BODY_H
#define FASTREAD_CQL_FUZZ_BODY_H

#include <stdint.h>
#include <stdlib.h>

#include "engines/cql/cql_proto.h"

static inline void cql_fuzz_check(int ok)
{
    if (!ok)
        abort(); /* a parser handed back bytes outside its input */
}

static inline void cql_fuzz_one(const uint8_t *data, size_t len)
{
    for (size_t skip = 0; skip <= 4 && skip <= len; skip += 4) {
        const uint8_t *p = data + skip;
        size_t n = len - skip;
        cql_header h;
        (void)cql_parse_header(p, n, &h);
        int32_t code, kind;
        char msg[64];
        if (cql_parse_error(p, n, &code, msg, sizeof(msg)) == 0)
            (void)cql_error_name(code);
        (void)cql_parse_result_kind(p, n, &kind);
        cql_prepared prep;
        if (cql_parse_prepared(p, n, &prep) == 0)
            cql_fuzz_check(prep.id_len <= CQL_MAX_ID && prep.ncolumns <= CQL_MAX_COLUMNS);
        cql_rows rows;
        if (cql_parse_rows(p, n, &rows) == 0) {
            cql_fuzz_check(rows.cells <= n);
            size_t pos = rows.cells;
            for (int i = 0; i < 64; i++) {
                size_t off;
                int32_t cl;
                if (cql_next_cell(p, n, &pos, &off, &cl) != 0)
                    break;
                cql_fuzz_check(pos <= n && (cl < 0 || (off <= n && (size_t)cl <= n - off)));
            }
        }
        char who[32];
        (void)cql_parse_authenticate(p, n, who, sizeof(who));
        int64_t tokens[16];
        size_t nt;
        if (cql_parse_token_set(p, n, tokens, 16, &nt) == 0)
            cql_fuzz_check(nt <= 16);
        (void)cql_murmur3_token(p, n);
    }
}

#endif
