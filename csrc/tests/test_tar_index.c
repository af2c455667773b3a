/*
 * The tar header walker and the WebDataset grouping (formats/tar_index.h):
 * ustar names with a prefix, GNU long names, pax path and size records,
 * skipped typeflags, keys and extensions, missing and duplicate components,
 * and the bounds: truncated members, bad checksums, oversized names; the
 * file driver on several shards and threads, and a FIFO refused at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "core/base.h"
#include "formats/tar_index.h"
#include "fuzz/tar_fuzz_body.h"

typedef struct tarbuf {
    unsigned char *p;
    size_t len, cap;
} tarbuf;

static void put(tarbuf *t, const void *d, size_t n)
{
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2 + 4096;
        t->p = realloc(t->p, t->cap);
    }
    memcpy(t->p + t->len, d, n);
    t->len += n;
}

static void pad(tarbuf *t)
{
    static const unsigned char zeros[512];
    if (t->len % 512)
        put(t, zeros, 512 - t->len % 512);
}

/* One header (typeflag `kind`) and its data; prefix for ustar's prefix field. */
static void member(tarbuf *t, char kind, const char *prefix, const char *name, const void *data,
                   size_t size)
{
    unsigned char h[512] = {0};
    strncpy((char *)h, name, 100);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    char num[32];
    snprintf(num, sizeof num, "%011zo", size);
    memcpy(h + 124, num, 12);
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    if (prefix)
        strncpy((char *)h + 345, prefix, 155);
    h[156] = (unsigned char)kind;
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf(num, sizeof num, "%06o", sum & 0777777u);
    memcpy(h + 148, num, 7);
    put(t, h, 512);
    put(t, data, size);
    pad(t);
}

static void file(tarbuf *t, const char *name, const char *data)
{
    member(t, '0', NULL, name, data, strlen(data));
}

static void end(tarbuf *t)
{
    static const unsigned char zeros[1024];
    put(t, zeros, 1024);
}

static int walk(tarbuf *t, fr_tar_members *m, char *err)
{
    uint64_t at;
    memset(m, 0, sizeof *m);
    return fr_tar_walk(t->p, t->len, m, &at, err, 256);
}

static int name_is(const fr_tar_members *m, size_t i, const char *s)
{
    size_t n = m->name_off[i + 1] - m->name_off[i];
    return n == strlen(s) && memcmp(m->names + m->name_off[i], s, n) == 0;
}

static void check_walk(void)
{
    tarbuf t = {0};
    char err[256];
    fr_tar_members m;
    file(&t, "a/x.jpg", "JPEG");
    member(&t, '5', NULL, "dir/", "", 0);              /* a directory: skipped */
    member(&t, '0', "deep/prefix", "x.cls", "7", 1);    /* ustar prefix */
    char longname[300];
    memset(longname, 'n', sizeof longname);
    memcpy(longname + 290, "/k.txt", 7);
    member(&t, 'L', NULL, "././@LongLink", longname, strlen(longname) + 1);
    file(&t, "short", "long-named");
    const char pax[] = "19 path=p/q.r.json\n10 size=3\n";
    member(&t, 'x', NULL, "PaxHeader", pax, strlen(pax));
    member(&t, '0', NULL, "ignored", "abc", 3);
    end(&t);
    CHECK(walk(&t, &m, err) == 0);
    CHECK(m.n == 4);
    if (m.n == 4) {
        CHECK(name_is(&m, 0, "a/x.jpg") && m.size[0] == 4 && m.data_off[0] == 512);
        CHECK(m.header_off[0] == 0);
        CHECK(name_is(&m, 1, "deep/prefix/x.cls") && m.size[1] == 1);
        CHECK(name_is(&m, 2, longname) && m.size[2] == 10);
        CHECK(name_is(&m, 3, "p/q.r.json") && m.size[3] == 3);
        CHECK(memcmp(t.p + m.data_off[3], "abc", 3) == 0);
    }
    fr_tar_members_free(&m);

    /* Bounds: a member past the end, a bad checksum, an empty buffer. */
    size_t whole = t.len;
    t.len = 512 + 2; /* the first member's data cut short */
    CHECK(walk(&t, &m, err) == -EINVAL && strstr(err, "truncated"));
    fr_tar_members_free(&m);
    t.len = whole;
    t.p[0] ^= 1;
    CHECK(walk(&t, &m, err) == -EINVAL && strstr(err, "not a tar archive"));
    fr_tar_members_free(&m);
    t.p[0] ^= 1;
    t.p[1024 + 3] ^= 1; /* the second header (the directory) */
    uint64_t at = 0;
    memset(&m, 0, sizeof m);
    CHECK(fr_tar_walk(t.p, t.len, &m, &at, err, sizeof err) == -EINVAL && at == 1024 &&
          strstr(err, "checksum error"));
    fr_tar_members_free(&m);
    CHECK(fr_tar_walk(t.p, 0, &m, &at, err, sizeof err) == -EINVAL);
    /* A header cut in the middle, and no end-of-archive blocks (accepted). */
    t.p[1024 + 3] ^= 1;
    t.len = whole - 1024;
    CHECK(walk(&t, &m, err) == 0 && m.n == 4);
    fr_tar_members_free(&m);
    t.len = whole - 1024 - 100;
    CHECK(walk(&t, &m, err) == -EINVAL && strstr(err, "truncated tar header"));
    fr_tar_members_free(&m);
    free(t.p);

    /* A long name over the limit is refused. */
    tarbuf big = {0};
    char *huge = malloc(FR_TAR_NAME_MAX + 10);
    memset(huge, 'a', FR_TAR_NAME_MAX + 9);
    huge[FR_TAR_NAME_MAX + 9] = 0;
    member(&big, 'L', NULL, "././@LongLink", huge, FR_TAR_NAME_MAX + 10);
    file(&big, "x", "y");
    end(&big);
    CHECK(walk(&big, &m, err) == -EINVAL && strstr(err, "long name"));
    fr_tar_members_free(&m);
    free(huge);
    free(big.p);
}

static const char *const wanted[] = {"jpg", "png", "cls"};
static const size_t wanted_len[] = {3, 3, 3};
static const int wanted_col[] = {0, 0, 1}; /* "jpg;png", "cls" */

static fr_wds_spec spec_of(int missing, int fold, int dali)
{
    fr_wds_spec s = {.k = 2, .n_wanted = 3, .wanted = wanted, .wanted_len = wanted_len,
                     .wanted_col = wanted_col, .fold_case = fold, .dali = dali,
                     .missing = missing, .want_keys = 1};
    return s;
}

static int group(tarbuf *t, const fr_wds_spec *spec, fr_wds_samples *s, char *err)
{
    fr_tar_members m;
    int rc = walk(t, &m, err);
    if (rc == 0)
        rc = fr_wds_group(spec, m.names, m.name_off, m.data_off, m.size, m.n, s, err, 256);
    fr_tar_members_free(&m);
    return rc;
}

static int key_is(const fr_wds_samples *s, size_t i, const char *k)
{
    size_t n = s->key_off[i + 1] - s->key_off[i];
    return n == strlen(k) && memcmp(s->keys + s->key_off[i], k, n) == 0;
}

static void check_group(void)
{
    tarbuf t = {0};
    char err[256] = "";
    fr_wds_samples s;
    file(&t, "__meta__", "m");          /* shard metadata: skipped */
    file(&t, "s/a.jpg", "AAAA");
    file(&t, "s/a.cls", "1");
    file(&t, "s/b.PNG", "BB");          /* only with case folding */
    file(&t, "s/b.seg.x", "zz");        /* extension "seg.x": unwanted */
    file(&t, "noext", "q");             /* no extension: skipped (a sample in dali) */
    file(&t, "s/.hidden", "h");         /* no key: skipped */
    file(&t, "s/c.cls", "3");
    file(&t, "s/a.png", "again");       /* a key seen again: a new sample */
    end(&t);
    fr_wds_spec sp = spec_of(0, 0, 0);
    CHECK(group(&t, &sp, &s, err) == 0);
    CHECK(s.n == 4);
    if (s.n == 4) {
        CHECK(key_is(&s, 0, "s/a") && key_is(&s, 1, "s/b") && key_is(&s, 2, "s/c") &&
              key_is(&s, 3, "s/a"));
        CHECK(s.comp_off[0] == 0 && s.comp_len[0] == 4);
        CHECK(s.comp_off[1] == 1024 && s.comp_len[1] == 1);
        CHECK(s.start[0] == 1536 && s.length[0] == 1024 + 1);
        CHECK(s.comp_off[2] == -1 && s.comp_off[3] == -1); /* b: no png (case), no cls */
        CHECK(s.comp_off[4] == -1 && s.comp_off[5] == 0 && s.comp_len[5] == 1);
        CHECK(s.comp_off[6] == 0 && s.comp_len[6] == 5);
    }
    fr_wds_samples_free(&s);
    sp = spec_of(0, 1, 0);
    CHECK(group(&t, &sp, &s, err) == 0 && s.n == 4 && s.comp_len[2] == 2);
    fr_wds_samples_free(&s);
    sp = spec_of(1, 0, 0); /* skip: only s/a (first) has both */
    CHECK(group(&t, &sp, &s, err) == 0 && s.n == 1 && s.skipped == 3);
    fr_wds_samples_free(&s);
    sp = spec_of(2, 0, 0);
    CHECK(group(&t, &sp, &s, err) == FR_WDS_DEFER);
    sp = spec_of(0, 0, 1); /* dali: __meta__ and noext are samples of their own */
    CHECK(group(&t, &sp, &s, err) == 0 && s.n == 7 && key_is(&s, 0, "__meta__") &&
          key_is(&s, 3, "noext"));
    fr_wds_samples_free(&s);
    free(t.p);

    tarbuf d = {0};
    file(&d, "k.jpg", "1");
    file(&d, "k.jpg", "2");
    end(&d);
    sp = spec_of(0, 0, 0);
    CHECK(group(&d, &sp, &s, err) == FR_WDS_DEFER && strstr(err, "twice"));
    free(d.p);

    /* Many components in one sample: the set of extensions grows. */
    tarbuf many = {0};
    for (int i = 0; i < 300; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "k.e%d", i);
        file(&many, nm, "x");
    }
    file(&many, "k.e17", "dup");
    end(&many);
    CHECK(group(&many, &sp, &s, err) == FR_WDS_DEFER);
    many.len -= 2048; /* drop the duplicate and the end blocks */
    CHECK(group(&many, &sp, &s, err) == 0 && s.n == 1);
    fr_wds_samples_free(&s);
    free(many.p);
}

static void check_files(void)
{
    const char *dir = fr_test_dir();
    char paths[5][512];
    const char *ptrs[5];
    for (int i = 0; i < 4; i++) {
        tarbuf t = {0};
        for (int j = 0; j <= i; j++) {
            char nm[32];
            snprintf(nm, sizeof nm, "s%d.jpg", j);
            file(&t, nm, "data");
        }
        end(&t);
        snprintf(paths[i], sizeof paths[i], "%s/shard%d.tar", dir, i);
        FILE *f = fopen(paths[i], "wb");
        CHECK(f && fwrite(t.p, 1, t.len, f) == t.len);
        if (f)
            fclose(f);
        free(t.p);
        ptrs[i] = paths[i];
    }
    snprintf(paths[4], sizeof paths[4], "%s/fifo.tar", dir);
    CHECK(mkfifo(paths[4], 0600) == 0);
    ptrs[4] = paths[4];
    fr_wds_spec sp = spec_of(0, 0, 0);
    fr_wds_shard out[5];
    memset(out, 0, sizeof out);
    CHECK(fr_wds_index_files(ptrs, 5, &sp, 3, out) == 0);
    for (int i = 0; i < 4; i++) {
        CHECK(out[i].rc == 0 && out[i].samples.n == (size_t)i + 1);
        CHECK(out[i].file_size > 0 && out[i].mtime_ns > 0);
        fr_wds_samples_free(&out[i].samples);
    }
    CHECK(out[4].rc == -EINVAL && strstr(out[4].err, "not a regular file"));
    unlink(paths[4]);
}

/* A bounded seeded fuzz of the walker and the grouping (tar_fuzz_body.h,
 * also the libFuzzer target's body): valid shards with long names, pax
 * records, empty and missing components, then bytes flipped, size fields
 * rewritten, cut anywhere and blocks repeated; under ASan and UBSan a read
 * outside the shard fails the test, and the body aborts on an index entry
 * outside it. */
static void check_fuzz(void)
{
    tarbuf t = {0};
    char longname[300];
    memset(longname, 'k', sizeof longname);
    memcpy(longname + 290, ".jpg", 5);
    for (int i = 0; i < 6; i++) {
        char name[64];
        snprintf(name, sizeof name, "dir/s%d.jpg", i);
        file(&t, name, i % 2 ? "JPEGDATA" : "");
        snprintf(name, sizeof name, "dir/s%d.cls", i);
        file(&t, name, "7");
    }
    member(&t, 'L', NULL, "././@LongLink", longname, strlen(longname) + 1);
    file(&t, "ignored-by-L", "xyz");
    static const char pax[] = "27 path=dir/pax-sample.cls\n";
    member(&t, 'x', NULL, "PaxHeader", pax, strlen(pax));
    file(&t, "short", "3");
    end(&t);
    uint64_t seed = 43;
    unsigned char *buf = malloc(t.len * 2);
    CHECK(buf != NULL);
    if (!buf)
        return;
    tar_fuzz_one(t.p, t.len); /* the valid shard itself */
    for (int round = 0; round < 4000; round++) {
        size_t n = t.len;
        memcpy(buf, t.p, n);
        int edits = 1 + (int)(fr_splitmix64(&seed) % 4);
        for (int e = 0; e < edits; e++) {
            uint64_t r = fr_splitmix64(&seed);
            size_t at = (size_t)(fr_splitmix64(&seed) % n);
            switch (r % 5) {
            case 0: buf[at] ^= (unsigned char)(1u << (r >> 8) % 8); break;
            case 1: buf[at] = (unsigned char)(r >> 16); break;
            case 2: { /* a size field of some header: digits or junk */
                size_t h = at / 512 * 512;
                if (h + 136 <= n)
                    memcpy(buf + h + 124, (r >> 8) % 2 ? "77777777777" : "00000001000", 11);
                break;
            }
            case 3: n = at; break; /* cut */
            default: /* a block repeated over the next */
                if (at / 512 * 512 + 1024 <= n)
                    memcpy(buf + at / 512 * 512 + 512, buf + at / 512 * 512, 512);
                break;
            }
        }
        tar_fuzz_one(buf, n);
    }
    free(buf);
    free(t.p);
}

int main(void)
{
    check_walk();
    check_group();
    check_files();
    check_fuzz();
    fr_test_cleanup();
    return fr_test_finish("test_tar_index");
}
