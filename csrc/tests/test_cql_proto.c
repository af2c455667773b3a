/* The CQL protocol codec (engines/cql/cql_proto.c): requests byte for
 * byte, the parsers on well-formed answers built here as a node sends
 * them, Cassandra's Murmur3 token on vectors from the Python driver's
 * murmur3 (cassandra.murmur3, which Cassandra's token(id) agrees with:
 * tests/test_cassandra.py checks the C token against the server), ring
 * lookups, and a bounded seeded fuzz of every parser (cql_fuzz_body.h:
 * the libFuzzer target's body) over mutated answers and random bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "engines/cql/cql_proto.h"
#include "fuzz/cql_fuzz_body.h"
#include "harness.h"

/* ------------------------------------------------ answers as a node sends */

typedef struct w {
    uint8_t b[4096];
    size_t n;
} w;

static void u8(w *x, uint8_t v) { x->b[x->n++] = v; }
static void u16(w *x, uint16_t v)
{
    u8(x, (uint8_t)(v >> 8));
    u8(x, (uint8_t)v);
}
static void u32(w *x, uint32_t v)
{
    u16(x, (uint16_t)(v >> 16));
    u16(x, (uint16_t)v);
}
static void str(w *x, const char *s)
{
    u16(x, (uint16_t)strlen(s));
    memcpy(x->b + x->n, s, strlen(s));
    x->n += strlen(s);
}
static void bytes(w *x, const void *p, int32_t n)
{
    u32(x, (uint32_t)n);
    if (n > 0) {
        memcpy(x->b + x->n, p, (size_t)n);
        x->n += (size_t)n;
    }
}

/* A PREPARED answer for SELECT data, label FROM ks.t WHERE id = ?. */
static void prepared(w *x)
{
    u32(x, CQL_RESULT_PREPARED);
    u16(x, 16);
    for (int i = 0; i < 16; i++)
        u8(x, (uint8_t)(0xA0 + i));
    u32(x, 0x0001); /* bound variables: global table spec */
    u32(x, 1);
    u32(x, 1);
    u16(x, 0);
    str(x, "ks");
    str(x, "t");
    str(x, "id");
    u16(x, CQL_TYPE_UUID);
    u32(x, 0x0001); /* result metadata */
    u32(x, 2);
    str(x, "ks");
    str(x, "t");
    str(x, "data");
    u16(x, CQL_TYPE_BLOB);
    str(x, "label");
    u16(x, CQL_TYPE_INT);
}

/* A ROWS answer with one row (skip_metadata: No_metadata). */
static void one_row(w *x, const void *data, int32_t dlen, int32_t label)
{
    u32(x, CQL_RESULT_ROWS);
    u32(x, 0x0004);
    u32(x, 2);
    u32(x, 1);
    bytes(x, data, dlen);
    uint8_t l[4] = {(uint8_t)(label >> 24), (uint8_t)(label >> 16), (uint8_t)(label >> 8),
                    (uint8_t)label};
    bytes(x, l, 4);
}

/* ROWS with full metadata (a QUERY's), one set<varchar> cell of tokens. */
static void token_rows(w *x)
{
    u32(x, CQL_RESULT_ROWS);
    u32(x, 0x0001);
    u32(x, 1);
    str(x, "system");
    str(x, "local");
    str(x, "tokens");
    u16(x, CQL_TYPE_SET);
    u16(x, CQL_TYPE_VARCHAR);
    u32(x, 1);
    w set = {.n = 0};
    u32(&set, 3);
    const char *t[] = {"-9223372036854775808", "0", "4611686018427387904"};
    for (int i = 0; i < 3; i++)
        bytes(&set, t[i], (int32_t)strlen(t[i]));
    bytes(x, set.b, (int32_t)set.n);
}

static void test_requests(void)
{
    cql_buf b = {0};
    CHECK(cql_put_startup(&b, 0) == 0);
    static const uint8_t startup[] = {0x04, 0, 0, 0, 0x01, 0, 0, 0, 22, 0, 1, 0, 11, 'C', 'Q',
                                      'L', '_', 'V', 'E', 'R', 'S', 'I', 'O', 'N', 0, 5, '3',
                                      '.', '0', '.', '0'};
    CHECK(b.len == sizeof(startup) && memcmp(b.data, startup, b.len) == 0);
    b.len = 0;
    CHECK(cql_put_auth_plain(&b, 0, "u", "pw") == 0);
    static const uint8_t auth[] = {0x04, 0, 0, 0, 0x0F, 0, 0, 0, 9, 0, 0, 0, 5, 0, 'u', 0, 'p',
                                   'w'};
    CHECK(b.len == sizeof(auth) && memcmp(b.data, auth, b.len) == 0);
    b.len = 0;
    uint8_t id[2] = {0xAB, 0xCD}, key[3] = {1, 2, 3};
    CHECK(cql_put_execute(&b, 300, id, 2, CQL_CONSISTENCY_LOCAL_ONE, key, 3) == 0);
    static const uint8_t exec[] = {0x04, 0, 0x01, 0x2C, 0x0A, 0, 0, 0, 16, 0, 2, 0xAB, 0xCD,
                                   0, 0x0A, 0x03, 0, 1, 0, 0, 0, 3, 1, 2, 3};
    CHECK(b.len == sizeof(exec) && memcmp(b.data, exec, b.len) == 0);
    cql_buf_consume(&b, 9);
    CHECK(b.len == sizeof(exec) - 9 && b.data[0] == 0 && b.data[1] == 2);
    cql_buf_free(&b);
}

static void test_parsers(void)
{
    uint8_t head[9] = {0x84, 0, 0x7F, 0xFF, 0x08, 0, 0, 1, 0};
    cql_header h;
    CHECK(cql_parse_header(head, 9, &h) == 0 && h.stream == 32767 && h.opcode == 0x08 &&
          h.length == 256);
    CHECK(cql_parse_header(head, 8, &h) == -EAGAIN);
    head[0] = 0x85; /* v5 */
    CHECK(cql_parse_header(head, 9, &h) == -EPROTO);
    head[0] = 0x84;
    head[1] = 0x01; /* compressed */
    CHECK(cql_parse_header(head, 9, &h) == -EPROTO);
    head[1] = 0;
    head[5] = 0x7F; /* 2 GiB body */
    CHECK(cql_parse_header(head, 9, &h) == -EPROTO);

    w e = {.n = 0};
    u32(&e, CQL_ERR_BAD_CREDENTIALS);
    str(&e, "Provided username u and/or password are incorrect\x01");
    int32_t code;
    char msg[128];
    CHECK(cql_parse_error(e.b, e.n, &code, msg, sizeof(msg)) == 0);
    CHECK(code == CQL_ERR_BAD_CREDENTIALS && strstr(msg, "incorrect?") != NULL);
    CHECK(strcmp(cql_error_name(code), "bad_credentials") == 0);
    CHECK(cql_parse_error(e.b, e.n - 1, &code, msg, sizeof(msg)) == -EPROTO);

    w p = {.n = 0};
    prepared(&p);
    cql_prepared pr;
    CHECK(cql_parse_prepared(p.b, p.n, &pr) == 0);
    CHECK(pr.id_len == 16 && pr.id[0] == 0xA0 && pr.nbound == 1 &&
          pr.bound_types[0] == CQL_TYPE_UUID && pr.ncolumns == 2 &&
          pr.column_types[0] == CQL_TYPE_BLOB && pr.column_types[1] == CQL_TYPE_INT);
    for (size_t cut = 0; cut < p.n; cut++)
        CHECK(cql_parse_prepared(p.b, cut, &pr) == -EPROTO);

    w r = {.n = 0};
    one_row(&r, "hello", 5, -7);
    cql_rows rows;
    CHECK(cql_parse_rows(r.b, r.n, &rows) == 0 && rows.nrows == 1 && rows.ncolumns == 2);
    size_t pos = rows.cells, off;
    int32_t cl;
    CHECK(cql_next_cell(r.b, r.n, &pos, &off, &cl) == 0 && cl == 5 &&
          memcmp(r.b + off, "hello", 5) == 0);
    CHECK(cql_next_cell(r.b, r.n, &pos, &off, &cl) == 0 && cl == 4 && r.b[off + 3] == 0xF9);
    CHECK(cql_next_cell(r.b, r.n, &pos, &off, &cl) == -EPROTO); /* past the end */
    w nul = {.n = 0};
    one_row(&nul, NULL, -1, 0);
    CHECK(cql_parse_rows(nul.b, nul.n, &rows) == 0);
    pos = rows.cells;
    CHECK(cql_next_cell(nul.b, nul.n, &pos, &off, &cl) == 0 && cl == -1);
    w bad = {.n = 0};
    one_row(&bad, "x", 1, 0);
    bad.b[16 + 3] = 0xFE; /* the data cell's length: -2 */
    bad.b[16] = 0xFF;
    bad.b[17] = 0xFF;
    bad.b[18] = 0xFF;
    CHECK(cql_parse_rows(bad.b, bad.n, &rows) == 0);
    pos = rows.cells;
    CHECK(cql_next_cell(bad.b, bad.n, &pos, &off, &cl) == -EPROTO);

    w t = {.n = 0};
    token_rows(&t);
    int64_t tokens[4];
    size_t nt;
    CHECK(cql_parse_token_set(t.b, t.n, tokens, 4, &nt) == 0 && nt == 3);
    CHECK(tokens[0] == INT64_MIN && tokens[1] == 0 && tokens[2] == 4611686018427387904LL);

    w a = {.n = 0};
    str(&a, "org.apache.cassandra.auth.PasswordAuthenticator");
    char who[16];
    CHECK(cql_parse_authenticate(a.b, a.n, who, sizeof(who)) == 0 && strlen(who) == 15);
}

static void test_token(void)
{
    /* key i = (i * 37 + 200) & 0xff, as in the vectors' generator. */
    static const struct {
        size_t n;
        int64_t token;
    } v[] = {
        {1, 8767593904841234184LL},  {3, 3360815430260917352LL},
        {7, 6848258939198013424LL},  {8, 6825294896896719330LL},
        {9, 712808515514910092LL},   {15, -6264688551098331046LL},
        {16, 98493579079920379LL},   {17, 468209433970893934LL},
        {31, 7904706896177658798LL}, {33, -1327470326574766236LL},
    };
    uint8_t key[64];
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)((i * 37 + 200) & 0xff);
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
        int64_t got = cql_murmur3_token(key, v[k].n);
        if (got != v[k].token)
            fprintf(stderr, "token of %zu bytes: %lld, want %lld\n", v[k].n, (long long)got,
                    (long long)v[k].token);
        CHECK(got == v[k].token);
    }
    cql_ring_entry ring[] = {{-100, 0}, {0, 1}, {100, 2}};
    CHECK(cql_ring_owner(ring, 3, -200) == 0);
    CHECK(cql_ring_owner(ring, 3, -100) == 0);
    CHECK(cql_ring_owner(ring, 3, -99) == 1);
    CHECK(cql_ring_owner(ring, 3, 100) == 2);
    CHECK(cql_ring_owner(ring, 3, 101) == 0); /* wraps */
    CHECK(cql_ring_owner(ring, 1, 5) == 0);
}

static uint64_t rng = 0x5EEDu;

static void test_fuzz(void)
{
    /* Seeds: the well-formed answers above; each mutated (bytes flipped,
     * lengths poked, cut short) and fed whole and cut at every tenth
     * position; then random buffers. Bounded: ~60k parses. */
    w seeds[5] = {{.n = 0}};
    prepared(&seeds[0]);
    one_row(&seeds[1], "abcdefgh", 8, 3);
    token_rows(&seeds[2]);
    u32(&seeds[3], CQL_ERR_UNPREPARED);
    str(&seeds[3], "unprepared");
    str(&seeds[4], "org.apache.cassandra.auth.PasswordAuthenticator");
    uint8_t buf[4096];
    for (int round = 0; round < 2000; round++) {
        const w *s = &seeds[round % 5];
        memcpy(buf, s->b, s->n);
        size_t n = s->n;
        int flips = 1 + (int)(fr_splitmix64(&rng) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = fr_splitmix64(&rng) % n;
            uint64_t r = fr_splitmix64(&rng);
            buf[at] = (r & 3) == 0 ? 0xFF : (r & 3) == 1 ? 0x00 : (uint8_t)(r >> 8);
        }
        for (size_t cut = n; cut > 0; cut = cut > 10 ? cut - 10 : 0)
            cql_fuzz_one(buf, cut);
    }
    for (int round = 0; round < 20000; round++) {
        size_t n = fr_splitmix64(&rng) % 64;
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)fr_splitmix64(&rng);
        cql_fuzz_one(buf, n);
    }
}

int main(void)
{
    test_requests();
    test_parsers();
    test_token();
    test_fuzz();
    return fr_test_failures ? 1 : 0;
}
