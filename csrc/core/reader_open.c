/*
 * The kinds of reader (fastread.h: fr_reader_open, _tree, _ranges,
 * _range_columns, _keys, _table, _table32): each checks its arguments,
 * lays out what its samples are (paths copied or a path table borrowed,
 * ranges of one image, keys, a table's borrowed columns) in a reader made by
 * fr_reader_new_unstarted, then starts its workers (fr_reader_start). What
 * the workers do with a batch of each kind is reader.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "core/reader_internal.h"
#include "engines/range_io.h"

/* The reader's own copy of `paths`: one blob, rd->paths pointing into it
 * (freed with the reader). 0 or -ENOMEM. */
static int copy_paths(fr_reader *rd, const char *const *paths, size_t npaths)
{
    size_t total = 0;
    for (size_t i = 0; i < npaths; i++)
        total += strlen(paths[i]) + 1;
    rd->blob = malloc(total ? total : 1);
    rd->paths = malloc((npaths ? npaths : 1) * sizeof(char *));
    if (!rd->blob || !rd->paths)
        return -ENOMEM;
    char *p = rd->blob;
    for (size_t i = 0; i < npaths; i++) {
        size_t len = strlen(paths[i]) + 1;
        memcpy(p, paths[i], len);
        rd->paths[i] = p;
        p += len;
    }
    return 0;
}

int fr_reader_open(const fr_config *cfg, const char *const *paths, size_t npaths,
                   unsigned prefetch, unsigned workers, fr_reader **out, char *err,
                   size_t err_len)
{
    fr_reader *rd;
    int rc = fr_reader_new_unstarted(cfg, prefetch, workers, &rd, err, err_len);
    *out = NULL;
    if (rc)
        return rc;
    rd->npaths = npaths;
    rd->sizes = malloc((npaths ? npaths : 1) * sizeof(int64_t));
    if (!rd->sizes || copy_paths(rd, paths, npaths) != 0) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    for (size_t i = 0; i < npaths; i++)
        rd->sizes[i] = -1;
    return fr_reader_start(rd, out, err, err_len);
}

int fr_reader_open_tree(const fr_config *cfg, const char *dirs, const uint64_t *dir_offsets,
                        size_t ndirs, const uint32_t *dir_ids, const char *names,
                        const uint64_t *name_offsets, size_t n, unsigned prefetch,
                        unsigned workers, fr_reader **out, char *err, size_t err_len)
{
    *out = NULL;
    fr_path_table tree = {.dirs = dirs, .dir_offsets = dir_offsets, .ndirs = ndirs,
                          .dir_ids = dir_ids, .names = names, .name_offsets = name_offsets,
                          .n = n};
    int rc = fr_path_table_check(&tree, err, err_len);
    if (rc)
        return rc;
    fr_reader *rd;
    if ((rc = fr_reader_new_unstarted(cfg, prefetch, workers, &rd, err, err_len)) != 0)
        return rc;
    rd->npaths = n;
    rd->is_tree = 1;
    rd->tree = tree;
    rd->sizes = malloc((n ? n : 1) * sizeof(int64_t));
    if (!rd->sizes) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    memset(rd->sizes, 0xff, n * sizeof(int64_t)); /* every size -1: not read yet */
    return fr_reader_start(rd, out, err, err_len);
}

/* What both range readers share: the image checked and copied into a reader
 * of n samples, not yet started (reader_free undoes it). */
static int range_reader_new(const fr_config *cfg, const char *image, size_t n,
                            unsigned prefetch, unsigned workers, fr_reader **rd_out, char *err,
                            size_t err_len)
{
    if (!image || !*image) {
        fr_set_err(err, err_len, "a range reader needs an image path");
        return -EINVAL;
    }
    fr_reader *rd;
    int rc = fr_reader_new_unstarted(cfg, prefetch, workers, &rd, err, err_len);
    if (rc)
        return rc;
    rd->npaths = n;
    rd->image = strdup(image);
    if (!rd->image) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    *rd_out = rd;
    return 0;
}

int fr_reader_open_ranges(const fr_config *cfg, const char *image, const fr_range *ranges,
                          size_t n, unsigned prefetch, unsigned workers, fr_reader **out,
                          char *err, size_t err_len)
{
    *out = NULL;
    fr_reader *rd;
    int rc = range_reader_new(cfg, image, n, prefetch, workers, &rd, err, err_len);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (fr_check_range(&ranges[i], cfg->o_direct, cfg->direct_alignment) != 0) {
            fr_set_err(err, err_len,
                       "range %zu of %s (offset %llu, length %llu) is out of bounds%s", i, image,
                       (unsigned long long)ranges[i].offset,
                       (unsigned long long)ranges[i].length,
                       cfg->o_direct ? " or not aligned to direct_alignment for O_DIRECT" : "");
            fr_reader_free_unstarted(rd);
            return -EINVAL;
        }
    }
    rd->ranges = malloc((n ? n : 1) * sizeof(*rd->ranges));
    if (!rd->ranges) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    if (n)
        memcpy(rd->ranges, ranges, n * sizeof(*rd->ranges));
    return fr_reader_start(rd, out, err, err_len);
}

int fr_reader_open_range_columns(const fr_config *cfg, const char *image,
                                 const uint64_t *offsets, const uint64_t *lengths, size_t n,
                                 unsigned prefetch, unsigned workers, fr_reader **out,
                                 char *err, size_t err_len)
{
    *out = NULL;
    if (n && (!offsets || !lengths)) {
        fr_set_err(err, err_len, "a range reader over columns needs offsets and lengths");
        return -EINVAL;
    }
    fr_reader *rd;
    int rc = range_reader_new(cfg, image, n, prefetch, workers, &rd, err, err_len);
    if (rc)
        return rc;
    rd->c_offsets = offsets;
    rd->c_lengths = lengths;
    return fr_reader_start(rd, out, err, err_len);
}

int fr_reader_open_keys(const fr_config *cfg, const uint8_t *keys, size_t key_len, size_t n,
                        unsigned prefetch, unsigned workers, fr_reader **out, char *err,
                        size_t err_len)
{
    *out = NULL;
    if (key_len < 1 || key_len > 256) {
        fr_set_err(err, err_len, "a key reader's keys are 1..256 bytes long, got %zu", key_len);
        return -EINVAL;
    }
    fr_reader *rd;
    int rc = fr_reader_new_unstarted(cfg, prefetch, workers, &rd, err, err_len);
    if (rc)
        return rc;
    rd->npaths = n;
    rd->key_len = key_len;
    rd->keys = malloc(n ? n * key_len : 1);
    if (!rd->keys) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    if (n)
        memcpy(rd->keys, keys, n * key_len);
    return fr_reader_start(rd, out, err, err_len);
}

/* The table readers' one opening: exactly one of lengths / lengths32 is
 * read (the other NULL). */
static int table_open(const fr_config *cfg, const char *const *paths, size_t npaths,
                      const uint32_t *file_ids, const uint64_t *offsets, const uint64_t *lengths,
                      const uint32_t *lengths32, size_t n, unsigned prefetch, unsigned workers,
                      fr_reader **out, char *err, size_t err_len)
{
    *out = NULL;
    if (n && (!file_ids || !offsets || (!lengths && !lengths32))) {
        fr_set_err(err, err_len, "a table reader needs file ids, offsets and lengths");
        return -EINVAL;
    }
    if (cfg->o_direct) {
        fr_set_err(err, err_len, "ranges of many files are read buffered (no O_DIRECT)");
        return -ENOTSUP;
    }
    fr_config c = *cfg;
    /* io_uring's contexts read file ranges on their rings where the kernel
     * allows (engines/uring/file_ranges.c); elsewhere, and for auto (psync
     * measured no slower at 100 shards: docs/benchmarks.md), they would
     * read them through a psync pool beside their idle rings: open psync
     * ones, so the threads are the workers and their helpers alone. */
    int uring_rings = 0;
#ifdef FASTREAD_HAVE_URING
    uring_rings = c.engine && strcmp(c.engine, "io_uring") == 0 && fr_uring_files_usable(&c);
#endif
    if (c.engine && !uring_rings &&
        (strcmp(c.engine, "io_uring") == 0 || strcmp(c.engine, "auto") == 0)) {
        c.engine = "psync";
        c.engine_args = "";
        c.auto_engine = 0;
    }
    /* The descriptors are shared out among the workers' contexts. */
    unsigned total = cfg->max_open_files ? cfg->max_open_files : FR_MAX_OPEN_FILES;
    unsigned w = workers ? workers : 1;
    c.max_open_files = total / w > 0 ? total / w : 1;
    fr_reader *rd;
    int rc = fr_reader_new_unstarted(&c, prefetch, workers, &rd, err, err_len);
    if (rc)
        return rc;
    rd->table = 1;
    rd->npaths = n;
    rd->nfiles = npaths;
    rd->t_files = file_ids;
    rd->t_offsets = offsets;
    rd->t_lengths = lengths;
    rd->t_lengths32 = lengths32;
    if (copy_paths(rd, paths, npaths) != 0) {
        fr_reader_free_unstarted(rd);
        return -ENOMEM;
    }
    return fr_reader_start(rd, out, err, err_len);
}

int fr_reader_open_table(const fr_config *cfg, const char *const *paths, size_t npaths,
                         const uint32_t *file_ids, const uint64_t *offsets,
                         const uint64_t *lengths, size_t n, unsigned prefetch,
                         unsigned workers, fr_reader **out, char *err, size_t err_len)
{
    return table_open(cfg, paths, npaths, file_ids, offsets, lengths, NULL, n, prefetch,
                      workers, out, err, err_len);
}

int fr_reader_open_table32(const fr_config *cfg, const char *const *paths, size_t npaths,
                           const uint32_t *file_ids, const uint64_t *offsets,
                           const uint32_t *lengths, size_t n, unsigned prefetch,
                           unsigned workers, fr_reader **out, char *err, size_t err_len)
{
    return table_open(cfg, paths, npaths, file_ids, offsets, NULL, lengths, n, prefetch,
                      workers, out, err, err_len);
}
