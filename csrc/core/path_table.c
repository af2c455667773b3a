/* A file tree's paths as borrowed columns (path_table.h). */
#include "core/path_table.h"

#include <errno.h>
#include <string.h>

#include "core/base.h"

static int offsets_ok(const uint64_t *offs, size_t n, const char *what, char *err,
                      size_t err_len)
{
    if (offs[0] != 0) {
        fr_set_err(err, err_len, "path table: %s offsets start at %llu, not 0", what,
                   (unsigned long long)offs[0]);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (offs[i + 1] < offs[i]) {
            fr_set_err(err, err_len, "path table: %s offset %zu decreases", what, i + 1);
            return -EINVAL;
        }
    return 0;
}

int fr_path_table_check(const fr_path_table *t, char *err, size_t err_len)
{
    if (!t->dir_offsets || !t->name_offsets || (t->n && !t->dir_ids)) {
        fr_set_err(err, err_len, "path table: a column is missing");
        return -EINVAL;
    }
    if (t->n && !t->ndirs) {
        fr_set_err(err, err_len, "path table: %zu files but no directories", t->n);
        return -EINVAL;
    }
    int rc = offsets_ok(t->dir_offsets, t->ndirs, "directory", err, err_len);
    if (rc == 0)
        rc = offsets_ok(t->name_offsets, t->n, "name", err, err_len);
    if (rc)
        return rc;
    if ((t->dir_offsets[t->ndirs] && !t->dirs) || (t->name_offsets[t->n] && !t->names)) {
        fr_set_err(err, err_len, "path table: a blob is missing");
        return -EINVAL;
    }
    /* A NUL inside a name would make the path another file's. */
    if ((t->dirs && memchr(t->dirs, '\0', (size_t)t->dir_offsets[t->ndirs])) ||
        (t->names && memchr(t->names, '\0', (size_t)t->name_offsets[t->n]))) {
        fr_set_err(err, err_len, "path table: a name holds a NUL byte");
        return -EINVAL;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (t->dir_ids[i] >= t->ndirs) {
            fr_set_err(err, err_len, "path table: file %zu names directory %u of %zu", i,
                       (unsigned)t->dir_ids[i], t->ndirs);
            return -EINVAL;
        }
        if (fr_path_table_len(t, i) >= FR_PATH_TABLE_MAX) {
            fr_set_err(err, err_len, "path table: path %zu is %zu bytes, longer than %d", i,
                       fr_path_table_len(t, i), FR_PATH_TABLE_MAX - 1);
            return -EINVAL;
        }
    }
    return 0;
}

size_t fr_path_table_len(const fr_path_table *t, size_t i)
{
    uint32_t d = t->dir_ids[i];
    return (size_t)(t->dir_offsets[d + 1] - t->dir_offsets[d]) +
           (size_t)(t->name_offsets[i + 1] - t->name_offsets[i]);
}

size_t fr_path_table_get(const fr_path_table *t, size_t i, char *buf, size_t cap)
{
    uint32_t d = t->dir_ids[i];
    size_t dlen = (size_t)(t->dir_offsets[d + 1] - t->dir_offsets[d]);
    size_t nlen = (size_t)(t->name_offsets[i + 1] - t->name_offsets[i]);
    if (dlen + nlen < cap) {
        if (dlen)
            memcpy(buf, t->dirs + t->dir_offsets[d], dlen);
        if (nlen)
            memcpy(buf + dlen, t->names + t->name_offsets[i], nlen);
        buf[dlen + nlen] = '\0';
    }
    return dlen + nlen;
}

int fr_path_table_fill(const fr_path_table *t, const int64_t *indices, size_t n, char **buf,
                       size_t *cap, const char **paths)
{
    size_t total = 0;
    for (size_t k = 0; k < n; k++)
        total += fr_path_table_len(t, (size_t)indices[k]) + 1;
    if (fr_grow((void **)buf, cap, total, 1, total))
        return -ENOMEM;
    size_t at = 0;
    for (size_t k = 0; k < n; k++) {
        paths[k] = *buf + at;
        at += fr_path_table_get(t, (size_t)indices[k], *buf + at, total - at) + 1;
    }
    return 0;
}
