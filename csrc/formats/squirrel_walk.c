/* Squirrel shards walked in C (formats/squirrel_walk.h). The value walk is
 * the reference's (fastread.formats.squirrel.value_end): a count of values
 * still to skip, each type's extent from its first byte; a count that
 * cannot fit in the bytes left is refused at once, so a corrupt length
 * never loops. */
#include "formats/squirrel_walk.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"

void fr_sq_samples_free(fr_sq_samples *s)
{
    free(s->start);
    free(s->length);
    free(s->fa);
    free(s->fb);
    free(s->data_off);
    free(s->data_len);
    memset(s, 0, sizeof *s);
}

static int be_uint(const unsigned char *b, uint64_t pos, unsigned size, uint64_t end,
                   uint64_t *out)
{
    if (pos > end || size > end - pos)
        return -EINVAL;
    uint64_t v = 0;
    for (unsigned i = 0; i < size; i++)
        v = v << 8 | b[pos + i];
    *out = v;
    return 0;
}

/* Where the value at pos ends, in b[0, end). 0 or -EINVAL. */
static int value_end(const unsigned char *b, uint64_t pos, uint64_t end, uint64_t *out)
{
    uint64_t remaining = 1, n;
    while (remaining) {
        if (pos >= end)
            return -EINVAL;
        unsigned c = b[pos++];
        remaining--;
        if (c <= 0x7f || c >= 0xe0)
            continue;
        if (c <= 0x8f) {
            remaining += 2u * (c & 0x0f);
        } else if (c <= 0x9f) {
            remaining += c & 0x0f;
        } else if (c <= 0xbf) {
            pos += c & 0x1f;
        } else {
            switch (c) {
            case 0xc0: case 0xc2: case 0xc3: break;
            case 0xcc: case 0xd0: pos += 1; break;
            case 0xcd: case 0xd1: case 0xd4: pos += 2; break;
            case 0xd5: pos += 3; break;
            case 0xca: case 0xce: case 0xd2: pos += 4; break;
            case 0xd6: pos += 5; break;
            case 0xcb: case 0xcf: case 0xd3: pos += 8; break;
            case 0xd7: pos += 9; break;
            case 0xd8: pos += 17; break;
            case 0xc4: case 0xd9: /* bin 8, str 8 */
            case 0xc5: case 0xda:
            case 0xc6: case 0xdb: {
                unsigned size = (c == 0xc4 || c == 0xd9) ? 1 : (c == 0xc5 || c == 0xda) ? 2 : 4;
                if (be_uint(b, pos, size, end, &n))
                    return -EINVAL;
                pos += size + n;
                break;
            }
            case 0xc7: case 0xc8: case 0xc9: { /* ext: length, type, data */
                unsigned size = c == 0xc7 ? 1 : c == 0xc8 ? 2 : 4;
                if (be_uint(b, pos, size, end, &n))
                    return -EINVAL;
                pos += size + 1 + n;
                break;
            }
            case 0xdc: case 0xdd: case 0xde: case 0xdf: {
                unsigned size = (c == 0xdc || c == 0xde) ? 2 : 4;
                if (be_uint(b, pos, size, end, &n))
                    return -EINVAL;
                pos += size;
                remaining += (c >= 0xde ? 2 : 1) * n;
                break;
            }
            default: /* 0xc1: never used */
                return -EINVAL;
            }
        }
        if (pos > end || remaining > end - pos)
            return -EINVAL;
    }
    *out = pos;
    return 0;
}

/* A map header at pos: its pairs and where they start; -EINVAL if none. */
static int map_header(const unsigned char *b, uint64_t pos, uint64_t end, uint64_t *pairs,
                      uint64_t *first)
{
    if (pos >= end)
        return -EINVAL;
    unsigned c = b[pos];
    if (c >= 0x80 && c <= 0x8f) {
        *pairs = c & 0x0f;
        *first = pos + 1;
        return 0;
    }
    if (c == 0xde || c == 0xdf) {
        unsigned size = c == 0xde ? 2 : 4;
        if (be_uint(b, pos + 1, size, end, pairs))
            return -EINVAL;
        *first = pos + 1 + size;
        return 0;
    }
    return -EINVAL;
}

/* A str or bin at pos (already known to end by `end`): its bytes. 1 for a
 * str, 2 for a bin, 0 for another type. */
static int str_or_bin(const unsigned char *b, uint64_t pos, uint64_t end, uint64_t *at,
                      uint64_t *n)
{
    unsigned c = b[pos];
    unsigned size;
    int kind;
    if (c >= 0xa0 && c <= 0xbf) {
        *at = pos + 1;
        *n = c & 0x1f;
        return 1;
    }
    switch (c) {
    case 0xd9: size = 1; kind = 1; break;
    case 0xda: size = 2; kind = 1; break;
    case 0xdb: size = 4; kind = 1; break;
    case 0xc4: size = 1; kind = 2; break;
    case 0xc5: size = 2; kind = 2; break;
    case 0xc6: size = 4; kind = 2; break;
    default: return 0;
    }
    if (be_uint(b, pos + 1, size, end, n))
        return 0;
    *at = pos + 1 + size;
    return kind;
}

/* Strict UTF-8 as Python decodes it (no overlong forms, no surrogates,
 * nothing past U+10FFFF). */
static int utf8_ok(const unsigned char *s, uint64_t n)
{
    for (uint64_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
        if (!len || c > 0xf4 || n - i < len)
            return 0;
        uint32_t cp = c & (0x7fu >> len);
        for (unsigned j = 1; j < len; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += len;
    }
    return 1;
}

static int grow(fr_sq_samples *s)
{
    if (s->n < s->cap)
        return 0;
    size_t cap = s->cap ? 2 * s->cap : 1024;
    size_t k = (size_t)s->k;
    void *p;
#define GROW(field, per)                                                  \
    p = realloc(s->field, cap * (per) * sizeof *s->field);                \
    if (!p)                                                               \
        return -ENOMEM;                                                   \
    s->field = p;
    GROW(start, 1)
    GROW(length, 1)
    GROW(fa, k)
    GROW(fb, k)
    GROW(data_off, k)
    GROW(data_len, k)
#undef GROW
    s->cap = cap;
    return 0;
}

static int fail(char *err, size_t err_len, uint64_t *bad_at, uint64_t at, const char *what)
{
    *bad_at = at;
    fr_set_err(err, err_len, "byte %llu: %s", (unsigned long long)at, what);
    return -EINVAL;
}

/* A wanted field's value at [pos, end): the "data" bin of a map, if any
 * (later pairs win, as the reference's dict does). */
static int field_data(const unsigned char *b, uint64_t pos, uint64_t end, int64_t *doff,
                      uint64_t *dlen)
{
    uint64_t pairs, p;
    *doff = -1;
    *dlen = 0;
    if (map_header(b, pos, end, &pairs, &p))
        return 0; /* not a map: a plain value */
    for (uint64_t i = 0; i < pairs; i++) {
        uint64_t k_end, v_end, at, n;
        if (value_end(b, p, end, &k_end) || value_end(b, k_end, end, &v_end))
            return -EINVAL;
        int kind = str_or_bin(b, p, k_end, &at, &n);
        if (kind == 1 && !utf8_ok(b + at, n))
            return -EINVAL;
        /* A key the reference cannot name a field by (nil, a map, a list,
         * an ext): left to it (it refuses them). */
        unsigned c = b[p];
        if (kind == 0 && !(c <= 0x7f || c >= 0xe0 || c == 0xc2 || c == 0xc3 ||
                           (c >= 0xca && c <= 0xd3)))
            return -EINVAL;
        if (kind && n == 4 && memcmp(b + at, "data", 4) == 0) {
            uint64_t dat, dn;
            if (str_or_bin(b, k_end, v_end, &dat, &dn) == 2) {
                *doff = (int64_t)dat;
                *dlen = dn;
            }
        }
        p = v_end;
    }
    return 0;
}

int fr_sq_walk(const unsigned char *buf, uint64_t len, const char *const *keys,
               const size_t *key_len, int k, fr_sq_samples *out, uint64_t *bad_at, char *err,
               size_t err_len)
{
    *bad_at = 0;
    if (k < 1)
        return fail(err, err_len, bad_at, 0, "no keys wanted");
    out->k = k;
    size_t kk = (size_t)k;
    for (uint64_t pos = 0; pos < len;) {
        uint64_t pairs, p;
        if (map_header(buf, pos, len, &pairs, &p))
            return fail(err, err_len, bad_at, pos, "a sample is not a MessagePack map");
        int rc = grow(out);
        if (rc)
            return rc;
        size_t i = out->n;
        for (size_t j = 0; j < kk; j++)
            out->fb[i * kk + j] = 0; /* fb 0: not seen (a value is never empty) */
        for (uint64_t q = 0; q < pairs; q++) {
            uint64_t k_end, v_end, at, n;
            if (value_end(buf, p, len, &k_end) || value_end(buf, k_end, len, &v_end))
                return fail(err, err_len, bad_at, p, "truncated or malformed MessagePack");
            int kind = str_or_bin(buf, p, k_end, &at, &n);
            if (!kind || (kind == 1 && !utf8_ok(buf + at, n)))
                return fail(err, err_len, bad_at, p, "a key that is not a UTF-8 str or a bin");
            for (size_t j = 0; j < kk; j++) {
                if (key_len[j] != n || memcmp(buf + at, keys[j], n) != 0)
                    continue;
                int64_t doff;
                uint64_t dlen;
                if (field_data(buf, k_end, v_end, &doff, &dlen))
                    return fail(err, err_len, bad_at, k_end, "a field the walk will not read");
                out->fa[i * kk + j] = k_end - pos;
                out->fb[i * kk + j] = v_end - pos;
                out->data_off[i * kk + j] = doff < 0 ? -1 : doff - (int64_t)pos;
                out->data_len[i * kk + j] = dlen;
            }
            p = v_end;
        }
        for (size_t j = 0; j < kk; j++)
            if (out->fb[i * kk + j] == 0)
                return fail(err, err_len, bad_at, pos, "a sample lacks a wanted key");
        out->start[i] = pos;
        out->length[i] = p - pos;
        out->n++;
        pos = p;
    }
    return 0;
}
