/*
 * The Squirrel MessagePack walk (formats/squirrel_walk.h): samples of
 * msgpack_numpy-style maps (an array field's "data" bin found, a plain
 * label), keys as str or bin, a later duplicate key winning; refusals
 * naming the offset (not a map, truncated, 0xc1, a missing key, a key
 * that is not UTF-8, a corrupt count); then a seeded fuzz of valid shards
 * edited (squirrel_fuzz_body.h, also the libFuzzer target's body) under
 * ASan and UBSan.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/base.h"
#include "formats/squirrel_walk.h"
#include "fuzz/squirrel_fuzz_body.h"

typedef struct buf {
    unsigned char p[8192];
    size_t n;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->n + n <= sizeof b->p) {
        memcpy(b->p + b->n, d, n);
        b->n += n;
    }
}

static void str(buf *b, const char *s)
{
    unsigned char h = (unsigned char)(0xa0 | strlen(s));
    put(b, &h, 1);
    put(b, s, strlen(s));
}

/* {"image": {"nd": true, "type": "|u1", "shape": [n], "data": bin n}, "label": i} */
static void sample(buf *b, unsigned n, unsigned label, int bin_keys)
{
    unsigned char m2 = 0x82, m4 = 0x84, t = 0xc3, a1 = 0x91, binh[2] = {0xc4, (unsigned char)n};
    put(b, &m2, 1);
    if (bin_keys) {
        unsigned char k[2] = {0xc4, 5};
        put(b, k, 2);
        put(b, "image", 5);
    } else {
        str(b, "image");
    }
    put(b, &m4, 1);
    str(b, "nd");
    put(b, &t, 1);
    str(b, "type");
    str(b, "|u1");
    str(b, "shape");
    put(b, &a1, 1);
    unsigned char dim = (unsigned char)n;
    put(b, &dim, 1);
    str(b, "data");
    put(b, binh, 2);
    for (unsigned i = 0; i < n; i++) {
        unsigned char v = (unsigned char)i;
        put(b, &v, 1);
    }
    str(b, "label");
    unsigned char l = (unsigned char)(label & 0x7f);
    put(b, &l, 1);
}

static int walk(const buf *b, fr_sq_samples *s, uint64_t *bad, char *err)
{
    static const char *const keys[] = {"image", "label"};
    static const size_t key_len[] = {5, 5};
    memset(s, 0, sizeof *s);
    return fr_sq_walk(b->p, b->n, keys, key_len, 2, s, bad, err, 256);
}

static void check_valid(void)
{
    buf b = {.n = 0};
    sample(&b, 3, 7, 0);
    size_t first = b.n;
    sample(&b, 0, 9, 1);
    fr_sq_samples s;
    uint64_t bad;
    char err[256];
    CHECK(walk(&b, &s, &bad, err) == 0);
    CHECK(s.n == 2 && s.start[0] == 0 && s.length[0] == first && s.start[1] == first);
    CHECK(s.data_off[0] >= 0 && s.data_len[0] == 3 && b.p[s.data_off[0]] == 0 &&
          b.p[s.data_off[0] + 2] == 2);
    CHECK(s.data_off[1] == -1 && s.fb[1] - s.fa[1] == 1 && b.p[s.fa[1]] == 7); /* the label */
    CHECK(s.data_off[2] >= 0 && s.data_len[2] == 0);
    fr_sq_samples_free(&s);
    /* A later "label" wins, as the reference's dict. */
    buf d = {.n = 0};
    unsigned char m = 0x83, one = 1, two = 2;
    put(&d, &m, 1);
    str(&d, "label");
    put(&d, &one, 1);
    str(&d, "image");
    put(&d, &one, 1);
    str(&d, "label");
    put(&d, &two, 1);
    CHECK(walk(&d, &s, &bad, err) == 0 && s.n == 1 && d.p[s.fa[1]] == 2);
    fr_sq_samples_free(&s);
}

static void check_errors(void)
{
    static const struct {
        const char *bytes;
        size_t n;
        const char *says;
    } cases[] = {
        {"\x91\x01", 2, "not a MessagePack map"},
        {"\x82\xa5image\x01\xa5label", 14, "truncated"},
        {"\x81\xa5image\xc1", 8, "truncated or malformed"},
        {"\x81\xa5image\x01", 8, "lacks a wanted key"},
        {"\x82\xa5image\x01\xa2\xff\xfe\x01", 12, "not a UTF-8 str"},
        {"\x82\x01\x01\xa5label\x01", 10, "not a UTF-8 str or a bin"},
        {"\x81\xa5image\xdd\xff\xff\xff\xff", 12, "truncated or malformed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b = {.n = 0};
        put(&b, cases[i].bytes, cases[i].n);
        fr_sq_samples s;
        uint64_t bad = 99;
        char err[256] = "";
        CHECK(walk(&b, &s, &bad, err) == -EINVAL);
        if (!strstr(err, cases[i].says))
            fprintf(stderr, "case %zu: %s\n", i, err);
        CHECK(strstr(err, cases[i].says) != NULL && strncmp(err, "byte ", 5) == 0);
        CHECK(bad < b.n);
        fr_sq_samples_free(&s);
    }
}

static void check_fuzz(void)
{
    buf base = {.n = 0};
    for (unsigned i = 0; i < 12; i++)
        sample(&base, i % 5, i, (int)(i % 2));
    uint64_t seed = 53;
    squirrel_fuzz_one(base.p, base.n);
    unsigned char *b = malloc(base.n);
    CHECK(b != NULL);
    if (!b)
        return;
    static const unsigned char hot[] = {0xc1, 0xc4, 0xc6, 0xdd, 0xdf, 0xde, 0x80, 0x8f,
                                        0x9f, 0xbf, 0xff, 0x00, 0xd9, 0xc7, 0xa5};
    for (int round = 0; round < 6000; round++) {
        size_t n = base.n;
        memcpy(b, base.p, n);
        int edits = 1 + (int)(fr_splitmix64(&seed) % 4);
        for (int e = 0; e < edits && n; e++) {
            uint64_t r = fr_splitmix64(&seed);
            size_t at = (size_t)(fr_splitmix64(&seed) % n);
            switch (r % 4) {
            case 0: b[at] ^= (unsigned char)(1u << (r >> 8) % 8); break;
            case 1: b[at] = hot[(r >> 8) % sizeof hot]; break;
            case 2: b[at] = (unsigned char)(r >> 16); break;
            default: n = at; break;
            }
        }
        squirrel_fuzz_one(b, n);
    }
    free(b);
}

int main(void)
{
    check_valid();
    check_errors();
    check_fuzz();
    return fr_test_finish("test_squirrel_walk");
}
