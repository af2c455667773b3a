/*
 * DALI wds2idx index files parsed in C (formats/tar_index.h
 * fr_wds2idx_parse): v1.2 and v1.1 (names made from the sample number),
 * blank lines and white space, and the errors, each naming its line: a
 * foreign first line, a count that does not match, a group cut short,
 * numbers that are not decimal digits or overflow; then a seeded fuzz of
 * valid indexes edited (wds2idx_fuzz_body.h, also the libFuzzer target's
 * body) under ASan and UBSan.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/base.h"
#include "formats/tar_index.h"
#include "fuzz/wds2idx_fuzz_body.h"

static int parse(const char *text, fr_tar_members *m, size_t *line, char *err)
{
    memset(m, 0, sizeof *m);
    return fr_wds2idx_parse(text, strlen(text), m, line, err, 256);
}

static int name_is(const fr_tar_members *m, size_t i, const char *want)
{
    size_t n = (size_t)(m->name_off[i + 1] - m->name_off[i]);
    return n == strlen(want) && memcmp(m->names + m->name_off[i], want, n) == 0;
}

static void check_valid(void)
{
    fr_tar_members m;
    size_t line;
    char err[256];
    CHECK(parse("v1.2 2\njpg 512 10 a/s0.jpg cls 1536 1 a/s0.cls\n\n"
                "jpg 2560 3 a/s1.jpg\n", &m, &line, err) == 0);
    CHECK(m.n == 3);
    CHECK(name_is(&m, 0, "a/s0.jpg") && name_is(&m, 1, "a/s0.cls") && name_is(&m, 2, "a/s1.jpg"));
    CHECK(m.data_off[0] == 512 && m.size[0] == 10 && m.header_off[0] == 0);
    CHECK(m.data_off[2] == 2560 && m.size[2] == 3 && m.header_off[2] == 2048);
    fr_tar_members_free(&m);
    /* v1.1: no names, the line is the key; tabs, CR and no final newline. */
    CHECK(parse("v1.1\t2\r\njpg 512 10\tcls 1536 1\r\njpg 2560 3", &m, &line, err) == 0);
    CHECK(m.n == 3);
    CHECK(name_is(&m, 0, "0.jpg") && name_is(&m, 1, "0.cls") && name_is(&m, 2, "1.jpg"));
    fr_tar_members_free(&m);
    CHECK(parse("v1.2 0\n", &m, &line, err) == 0 && m.n == 0);
    fr_tar_members_free(&m);
}

static void check_errors(void)
{
    static const struct {
        const char *text, *says;
        size_t line;
    } cases[] = {
        {"", "not a DALI wds2idx", 1},
        {"v2.0 1\njpg 512 1 a.jpg\n", "not a DALI wds2idx", 1},
        {"v1.2 1 extra\njpg 512 1 a.jpg\n", "not a DALI wds2idx", 1},
        {"v1.2 x\n", "not a number", 1},
        {"v1.2 2\njpg 512 1 a.jpg\n", "says 2 samples, the file has 1", 1},
        {"v1.2 1\njpg 512 1\n", "a group of 3 fields, not 4", 2},
        {"v1.1 2\njpg 512 1\n\njpg 1024 1 cls\n", "a group of 1 fields, not 3", 4},
        {"v1.2 1\njpg -512 1 a.jpg\n", "not numbers", 2},
        {"v1.2 1\njpg 512 99999999999999999999 a.jpg\n", "not numbers", 2},
        {"v1.2 1\njpg 18446744073709551615 9 a.jpg\n", "not numbers", 2},
        {"v1.2 1\njpg 9999999999999999999 9999999999999999999 a.jpg\n", "overflows", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fr_tar_members m;
        size_t line = 0;
        char err[256] = "";
        int rc = parse(cases[i].text, &m, &line, err);
        CHECK(rc == -EINVAL);
        CHECK(line == cases[i].line);
        if (!strstr(err, cases[i].says) || line != cases[i].line)
            fprintf(stderr, "case %zu: line %zu: %s\n", i, line, err);
        CHECK(strstr(err, cases[i].says) != NULL);
        char want[32];
        snprintf(want, sizeof want, "line %zu:", cases[i].line);
        CHECK(strncmp(err, want, strlen(want)) == 0);
        fr_tar_members_free(&m);
    }
}

/* Valid v1.1 and v1.2 indexes with bytes flipped or replaced by white
 * space, digits, newlines, cut anywhere and lines repeated: every input
 * parses consistently or is refused naming a line. */
static void check_fuzz(void)
{
    char text[4096];
    size_t len = 0;
    len += (size_t)snprintf(text + len, sizeof text - len, "v1.2 40\n");
    for (int i = 0; i < 40; i++)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "jpg %d %d d/s%d.jpg cls %d 1 d/s%d.cls\n", 512 + 2048 * i,
                                i * 7, i, 1536 + 2048 * i, i);
    uint64_t seed = 47;
    char *buf = malloc(2 * sizeof text);
    CHECK(buf != NULL);
    if (!buf)
        return;
    static const char alphabet[] = " \t\n\r0123456789v.-x";
    wds2idx_fuzz_one((const uint8_t *)text, len);
    for (int round = 0; round < 6000; round++) {
        size_t n = len;
        memcpy(buf, text, n);
        if (round % 2)
            memcpy(buf, "v1.1", 4); /* the same lines read as v1.1 groups of 3 */
        int edits = 1 + (int)(fr_splitmix64(&seed) % 4);
        for (int e = 0; e < edits && n; e++) {
            uint64_t r = fr_splitmix64(&seed);
            size_t at = (size_t)(fr_splitmix64(&seed) % n);
            switch (r % 5) {
            case 0: buf[at] = (char)(buf[at] ^ (char)(1u << (r >> 8) % 8)); break;
            case 1: buf[at] = alphabet[(r >> 8) % (sizeof alphabet - 1)]; break;
            case 2: buf[at] = (char)(r >> 16); break;
            case 3: n = at; break; /* cut */
            default: { /* a stretch repeated */
                size_t k = (size_t)((r >> 8) % 64);
                if (n + k <= 2 * sizeof text && at + k <= n) {
                    memmove(buf + at + k, buf + at, n - at);
                    n += k;
                }
                break;
            }
            }
        }
        wds2idx_fuzz_one((const uint8_t *)buf, n);
    }
    free(buf);
}

int main(void)
{
    check_valid();
    check_errors();
    check_fuzz();
    return fr_test_finish("test_wds2idx");
}
