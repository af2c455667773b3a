/* DALI's wds2idx index files parsed in C (formats/tar_index.h documents
 * the format as read): the Python reference (fastread.formats._index_files
 * read_wds2idx_reference) took ~10 us a sample; this is one pass over the
 * text with no allocation per field. Strict and bounded: every field is
 * checked against the buffer's end, numbers are decimal digits only (at
 * most 19: no overflow), and an error names the line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "formats/tar_index.h"

/* Python's bytes.split() white space. */
static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

typedef struct field {
    const char *p;
    size_t len;
} field;

/* The next field of line[*at, end): 1 with *f set, 0 at the line's end. */
static int next_field(const char *line, size_t end, size_t *at, field *f)
{
    size_t i = *at;
    while (i < end && is_space((unsigned char)line[i]))
        i++;
    if (i == end) {
        *at = i;
        return 0;
    }
    size_t a = i;
    while (i < end && !is_space((unsigned char)line[i]))
        i++;
    f->p = line + a;
    f->len = i - a;
    *at = i;
    return 1;
}

static int parse_u64(const field *f, uint64_t *out)
{
    if (f->len == 0 || f->len > 19)
        return -EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < f->len; i++) {
        unsigned char c = (unsigned char)f->p[i];
        if (c < '0' || c > '9')
            return -EINVAL;
        v = v * 10 + (uint64_t)(c - '0');
    }
    *out = v;
    return 0;
}

/* Appends to the last member's name (v1.1's "<number>." then "<ext>"). */
static int extend_last(fr_tar_members *m, const char *p, size_t len)
{
    if (fr_grow((void **)&m->names, &m->names_cap, m->names_len + len, 1, 4096))
        return -ENOMEM;
    memcpy(m->names + m->names_len, p, len);
    m->names_len += len;
    m->name_off[m->n] = m->names_len;
    return 0;
}

static int bad(char *err, size_t err_len, size_t *bad_line, size_t line, const char *what)
{
    *bad_line = line;
    fr_set_err(err, err_len, "line %zu: %s", line, what);
    return -EINVAL;
}

int fr_wds2idx_parse(const char *buf, size_t len, fr_tar_members *out, size_t *bad_line,
                     char *err, size_t err_len)
{
    *bad_line = 0;
    size_t eol = 0;
    while (eol < len && buf[eol] != '\n')
        eol++;
    size_t at = 0;
    field ver, cnt, extra;
    if (!next_field(buf, eol, &at, &ver) || !next_field(buf, eol, &at, &cnt) ||
        next_field(buf, eol, &at, &extra) ||
        !(ver.len == 4 && (memcmp(ver.p, "v1.1", 4) == 0 || memcmp(ver.p, "v1.2", 4) == 0)))
        return bad(err, err_len, bad_line, 1,
                   "not a DALI wds2idx index (the first line must be 'v1.1 <samples>' or "
                   "'v1.2 <samples>')");
    size_t per = ver.p[3] == '2' ? 4 : 3;
    uint64_t count;
    if (parse_u64(&cnt, &count))
        return bad(err, err_len, bad_line, 1, "the sample count is not a number");
    uint64_t samples = 0;
    size_t lineno = 1;
    char name[48];
    for (size_t pos = eol < len ? eol + 1 : len; pos < len;) {
        lineno++;
        size_t end = pos;
        while (end < len && buf[end] != '\n')
            end++;
        size_t i = pos;
        size_t nf = 0;
        field f[4];
        int any = 0;
        for (;;) {
            int got = next_field(buf, end, &i, &f[nf]);
            if (!got)
                break;
            any = 1;
            if (++nf < per)
                continue;
            nf = 0;
            uint64_t off, size;
            if (parse_u64(&f[1], &off) || parse_u64(&f[2], &size))
                return bad(err, err_len, bad_line, lineno,
                           "offset/size not numbers (decimal digits)");
            if (off > UINT64_MAX - size)
                return bad(err, err_len, bad_line, lineno, "offset + size overflows");
            uint64_t header = off >= 512 ? off - 512 : 0;
            int rc;
            if (per == 4) {
                rc = fr_tar_members_push(out, f[3].p, f[3].len, off, size, header);
            } else {
                /* v1.1 names no member: the line (sample) is the key. */
                int w = snprintf(name, sizeof name, "%llu.", (unsigned long long)samples);
                rc = fr_tar_members_push(out, name, (size_t)w, off, size, header);
                if (!rc)
                    rc = extend_last(out, f[0].p, f[0].len);
            }
            if (rc)
                return rc;
        }
        if (nf) {
            char what[96];
            snprintf(what, sizeof what, "a group of %zu fields, not %zu (%s)", nf, per,
                     per == 4 ? "ext offset size name" : "ext offset size");
            return bad(err, err_len, bad_line, lineno, what);
        }
        if (any)
            samples++;
        pos = end < len ? end + 1 : len;
    }
    if (samples != count) {
        char what[96];
        snprintf(what, sizeof what, "the first line says %llu samples, the file has %llu",
                 (unsigned long long)count, (unsigned long long)samples);
        return bad(err, err_len, bad_line, 1, what);
    }
    return 0;
}
