/*
 * WebDataset grouping of tar members into samples (fr_wds_group;
 * tar_index.h says what it computes). The reference is
 * WebDataset._group in fastread/formats/webdataset.py: same keys
 * (split_name), same skips, same sample order. Two cases are left to the
 * reference (FR_WDS_DEFER), which raises its own worded errors or folds
 * Unicode: a duplicate component or a missing one under "error", and a
 * case-insensitive match of an extension that is not ASCII.
 */
#include "formats/tar_index.h"

#include "core/base.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void fr_wds_samples_free(fr_wds_samples *s)
{
    free(s->start);
    free(s->length);
    free(s->comp_off);
    free(s->comp_len);
    free(s->key_off);
    free(s->keys);
    memset(s, 0, sizeof *s);
}

/* split_name: key = the name up to the first dot of its base name, which
 * must not start with a dot; the regular expression's '.' does not cross a
 * newline, so a newline before the last '/' means no match. */
static int split_name(const char *nm, size_t len, size_t *key_len)
{
    size_t slash = len;
    for (size_t i = len; i > 0; i--) {
        if (nm[i - 1] == '/') {
            slash = i - 1;
            break;
        }
    }
    size_t base = slash == len ? 0 : slash + 1;
    if (base && memchr(nm, '\n', base))
        return 0;
    const char *dot = memchr(nm + base, '.', len - base);
    if (!dot || dot == nm + base)
        return 0;
    *key_len = (size_t)(dot - nm);
    return 1;
}

/* The extensions seen in the current sample: open addressing over member
 * numbers, a generation per slot so a new sample clears it in O(1). */
typedef struct seen_set {
    uint32_t *member, *gen;
    uint64_t *hash;
    size_t cap, count;
    uint32_t cur;
} seen_set;

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int seen_grow(seen_set *t, size_t cap)
{
    uint32_t *m = calloc(cap, sizeof *m), *g = calloc(cap, sizeof *g);
    uint64_t *h = calloc(cap, sizeof *h);
    if (!m || !g || !h) {
        free(m);
        free(g);
        free(h);
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->cap; i++) {
        if (t->gen[i] != t->cur)
            continue;
        size_t j = t->hash[i] & (cap - 1);
        while (g[j] == t->cur)
            j = (j + 1) & (cap - 1);
        m[j] = t->member[i];
        g[j] = t->cur;
        h[j] = t->hash[i];
    }
    free(t->member);
    free(t->gen);
    free(t->hash);
    t->member = m;
    t->gen = g;
    t->hash = h;
    t->cap = cap;
    return 0;
}

/* 1 if ext (of member `mi`) is already in the set, else adds it: 0; -ENOMEM. */
static int seen_add(seen_set *t, const char *names, const uint64_t *name_off, const char *ext, size_t elen, uint32_t mi, size_t *ext_pos)
{
    if (2 * (t->count + 1) > t->cap && seen_grow(t, t->cap ? 2 * t->cap : 16))
        return -ENOMEM;
    uint64_t h = fnv1a(ext, elen);
    size_t j = h & (t->cap - 1);
    while (t->gen[j] == t->cur) {
        if (t->hash[j] == h) {
            uint32_t o = t->member[j];
            size_t ob = ext_pos[o], olen = name_off[o + 1] - name_off[o] - ob;
            if (olen == elen && memcmp(names + name_off[o] + ob, ext, elen) == 0)
                return 1;
        }
        j = (j + 1) & (t->cap - 1);
    }
    t->gen[j] = t->cur;
    t->hash[j] = h;
    t->member[j] = mi;
    t->count++;
    return 0;
}

static int samples_push(fr_wds_samples *s, const fr_wds_spec *spec, uint64_t start,
                        uint64_t end, const int64_t *off, const uint64_t *len,
                        const char *key, size_t key_len)
{
    int k = spec->k;
    if (s->n + 1 >= s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        uint64_t *a = realloc(s->start, cap * sizeof *a);
        if (a)
            s->start = a;
        uint64_t *b = a ? realloc(s->length, cap * sizeof *b) : NULL;
        if (b)
            s->length = b;
        int64_t *c = b ? realloc(s->comp_off, cap * (size_t)k * sizeof *c) : NULL;
        if (c)
            s->comp_off = c;
        uint64_t *d = c ? realloc(s->comp_len, cap * (size_t)k * sizeof *d) : NULL;
        if (d)
            s->comp_len = d;
        if (!d)
            return -ENOMEM;
        if (spec->want_keys) {
            uint64_t *e = realloc(s->key_off, (cap + 1) * sizeof *e);
            if (!e)
                return -ENOMEM;
            s->key_off = e;
            if (s->n == 0)
                e[0] = 0;
        }
        s->cap = cap;
    }
    if (spec->want_keys) {
        if (fr_grow((void **)&s->keys, &s->keys_cap, s->keys_len + key_len, 1, 4096))
            return -ENOMEM;
        if (key_len)
            memcpy(s->keys + s->keys_len, key, key_len);
        s->keys_len += key_len;
        s->key_off[s->n + 1] = s->keys_len;
    }
    s->start[s->n] = start;
    s->length[s->n] = end - start;
    memcpy(s->comp_off + s->n * (size_t)k, off, (size_t)k * sizeof *off);
    memcpy(s->comp_len + s->n * (size_t)k, len, (size_t)k * sizeof *len);
    s->n++;
    return 0;
}

static int wanted_column(const fr_wds_spec *spec, const char *ext, size_t elen, int *col)
{
    char low[64];
    const char *e = ext;
    if (spec->fold_case) {
        for (size_t i = 0; i < elen; i++) {
            if ((unsigned char)ext[i] >= 0x80)
                return FR_WDS_DEFER; /* str.lower folds more than ASCII */
        }
        if (elen > sizeof low) { /* longer than any wanted entry can match after folding */
            int longest = 0;
            for (size_t w = 0; w < spec->n_wanted; w++)
                longest |= spec->wanted_len[w] == elen;
            if (!longest) {
                *col = -1;
                return 0;
            }
            return FR_WDS_DEFER;
        }
        for (size_t i = 0; i < elen; i++)
            low[i] = (char)(ext[i] >= 'A' && ext[i] <= 'Z' ? ext[i] + 32 : ext[i]);
        e = low;
    }
    for (size_t w = 0; w < spec->n_wanted; w++) {
        if (spec->wanted_len[w] == elen && memcmp(spec->wanted[w], e, elen) == 0) {
            *col = spec->wanted_col[w];
            return 0;
        }
    }
    *col = -1;
    return 0;
}

int fr_wds_group(const fr_wds_spec *spec, const char *names, const uint64_t *name_off,
                 const uint64_t *data_off, const uint64_t *size, size_t n_members,
                 fr_wds_samples *out, char *err, size_t err_len)
{
    int k = spec->k;
    if (k < 1 || k > 4096) {
        fr_set_err(err, err_len, "a WebDataset spec needs 1..4096 components, got %d", k);
        return -EINVAL;
    }
    memset(out, 0, sizeof *out);
    out->k = k;
    int64_t *off = malloc((size_t)k * sizeof *off);
    uint64_t *len = malloc((size_t)k * sizeof *len);
    size_t *ext_pos = malloc((n_members ? n_members : 1) * sizeof *ext_pos);
    seen_set seen = {0};
    int rc = (!off || !len || !ext_pos) ? -ENOMEM : 0;
    int have = 0, any_seen = 0;
    size_t cur_key = 0, cur_key_len = 0; /* the current key: names[cur_key, +len) */
    uint64_t first = 0, last = 0;
    for (size_t m = 0; rc == 0 && m <= n_members; m++) {
        const char *nm = NULL;
        size_t nlen = 0, klen = 0, elen = 0;
        int has_ext = 0;
        if (m < n_members) {
            nm = names + name_off[m];
            nlen = name_off[m + 1] - name_off[m];
            if (!spec->dali && !memchr(nm, '/', nlen) && nlen >= 2 && nm[0] == '_' &&
                nm[1] == '_' && nm[nlen - 2] == '_' && nm[nlen - 1] == '_')
                continue; /* __key__-style shard metadata */
            has_ext = split_name(nm, nlen, &klen);
            if (!has_ext) {
                if (!spec->dali)
                    continue;
                klen = nlen;
            }
            elen = has_ext ? nlen - klen - 1 : 0;
            ext_pos[m] = klen + 1;
            if (have && klen == cur_key_len && memcmp(names + cur_key, nm, klen) == 0)
                goto same_sample;
        }
        if (have) { /* close the current sample */
            int missing = 0;
            for (int j = 0; j < k; j++)
                missing |= off[j] < 0;
            if (!any_seen && !spec->dali) {
                /* nothing in it: dropped, as the webdataset library does */
            } else if (missing && spec->missing == 1) {
                out->skipped++;
            } else if (missing && spec->missing == 2) {
                fr_set_err(err, err_len, "a sample has a missing component");
                rc = FR_WDS_DEFER;
                break;
            } else {
                for (int j = 0; j < k; j++)
                    if (off[j] >= 0)
                        off[j] -= (int64_t)first;
                rc = samples_push(out, spec, first, last, off, len, names + cur_key,
                                  cur_key_len);
                if (rc)
                    break;
            }
        }
        if (m == n_members)
            break;
        have = 1;
        any_seen = 0;
        cur_key = name_off[m];
        cur_key_len = klen;
        first = data_off[m];
        for (int j = 0; j < k; j++) {
            off[j] = -1;
            len[j] = 0;
        }
        if (++seen.cur == 0) { /* generations wrapped: clear the stamps */
            if (seen.gen)
                memset(seen.gen, 0, seen.cap * sizeof *seen.gen);
            seen.cur = 1;
        }
        seen.count = 0;
    same_sample:
        last = data_off[m] + size[m];
        if (!has_ext)
            continue;
        {
            const char *ext = nm + klen + 1;
            int dup = seen_add(&seen, names, name_off, ext, elen, (uint32_t)m, ext_pos);
            if (dup < 0) {
                rc = dup;
                break;
            }
            if (dup) {
                fr_set_err(err, err_len, "a sample has a component twice");
                rc = FR_WDS_DEFER;
                break;
            }
            any_seen = 1;
            int col;
            rc = wanted_column(spec, ext, elen, &col);
            if (rc)
                break;
            if (col >= 0 && off[col] < 0) {
                off[col] = (int64_t)data_off[m];
                len[col] = size[m];
            }
        }
    }
    if (rc == FR_WDS_DEFER && err && err_len && !err[0])
        fr_set_err(err, err_len, "a case-insensitive extension that is not ASCII");
    free(off);
    free(len);
    free(ext_pos);
    free(seen.member);
    free(seen.gen);
    free(seen.hash);
    if (rc)
        fr_wds_samples_free(out);
    return rc;
}
