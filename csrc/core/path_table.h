/*
 * A file tree's paths as borrowed columns instead of one string each: a
 * table of directory prefixes (dirs, dir_offsets), one directory id per
 * file and the files' names back to back (names, name_offsets). Path i is
 * dirs[dir_offsets[d] .. dir_offsets[d + 1]) followed by
 * names[name_offsets[i] .. name_offsets[i + 1]), d = dir_ids[i]; nothing is
 * NUL-terminated. 10^6 files in 1,000 folders cost their names' bytes plus
 * 12 bytes a file, not a C string and a pointer each (the prefix is shared).
 *
 * The columns belong to the caller (fr_reader_open_tree): they stay alive
 * and unchanged while the table is used. Read-only after
 * fr_path_table_check, so any number of threads may call fr_path_table_get.
 */
#ifndef FASTREAD_PATH_TABLE_H
#define FASTREAD_PATH_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fr_path_table {
    const char *dirs;
    const uint64_t *dir_offsets; /* ndirs + 1 */
    size_t ndirs;
    const uint32_t *dir_ids; /* n */
    const char *names;
    const uint64_t *name_offsets; /* n + 1 */
    size_t n;
} fr_path_table;

/* 0 if every offset column is non-decreasing from 0, every dir id is below
 * ndirs and no path is longer than FR_PATH_TABLE_MAX - 1 bytes; else
 * -EINVAL with why in err. O(n + ndirs): a walk of the columns, no copy. */
#define FR_PATH_TABLE_MAX 4096
int fr_path_table_check(const fr_path_table *t, char *err, size_t err_len);
/* Path i's length in bytes (without a NUL). i < t->n. */
size_t fr_path_table_len(const fr_path_table *t, size_t i);
/* Writes path i and a NUL into buf if it fits in cap bytes; returns its
 * length either way (snprintf's contract). i < t->n. */
size_t fr_path_table_get(const fr_path_table *t, size_t i, char *buf, size_t cap);
/* paths[k] = path indices[k] (k < n), written back to back with their
 * NULs into *buf, grown as fr_grow does (*cap its capacity), so that one
 * worker's buffer serves every batch. Sized first: the pointers are set
 * once the buffer is final. 0, or -ENOMEM with *buf as it was. */
int fr_path_table_fill(const fr_path_table *t, const int64_t *indices, size_t n, char **buf,
                       size_t *cap, const char **paths);

#endif
