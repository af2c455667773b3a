/*
 * WebDataset indexing in the C core: a tar header walker and the grouping
 * of its members into samples, kept as columnar arrays (no object per
 * sample), for one shard in memory or many shard files at once.
 *
 * The walker reads ustar headers with GNU long names ('L') and pax 'x'
 * path/size records; other typeflags are skipped. It is strict and bounded:
 * a bad checksum, a size that is not a number, a member or header past the
 * end of the buffer, a long name or pax header over FR_TAR_NAME_MAX /
 * FR_TAR_PAX_MAX is an error naming the offset. The grouping is the
 * webdataset library's (fastread.formats.webdataset documents it; the
 * Python module keeps the reference implementation the tests compare with).
 *
 * Thread-safety: no shared state; every function works on what it is given
 * and may run on any thread. fr_wds_index_files runs `threads` threads of
 * its own and returns when they have finished.
 */
#ifndef FASTREAD_TAR_INDEX_H
#define FASTREAD_TAR_INDEX_H

#include <stddef.h>
#include <stdint.h>

/* The longest member name accepted (GNU 'L' or pax path), and the largest
 * pax header whose records are read. */
#define FR_TAR_NAME_MAX 65536u
#define FR_TAR_PAX_MAX (1u << 20)

/* The walk's result left for a caller to redo in the reference code (the
 * grouping met a case it defers: a case-insensitive match of a non-ASCII
 * extension, a duplicate component, a missing component under "error"). */
#define FR_WDS_DEFER 1

/* Regular files of one tar: data offset, size, header offset, and the
 * names as one blob (name_off[i]..name_off[i+1], not NUL-terminated). */
typedef struct fr_tar_members {
    size_t n, cap;
    uint64_t *data_off, *size, *header_off;
    uint64_t *name_off; /* n + 1 entries once n > 0 */
    char *names;
    size_t names_len, names_cap;
} fr_tar_members;

void fr_tar_members_free(fr_tar_members *m);

/* Appends one member (name copied into the blob). 0 or -ENOMEM. */
int fr_tar_members_push(fr_tar_members *m, const char *name, size_t name_len, uint64_t data,
                        uint64_t size, uint64_t header);

/* Parses a DALI wds2idx index held in buf[0, len) (its text: a first line
 * "v1.1 <samples>" or "v1.2 <samples>", then one line per sample of
 * "<ext> <data offset> <size>" groups, v1.2 adding "<member name>"; blank
 * lines ignored; fields split on ASCII white space) into the members it
 * lists, in order, as fr_tar_walk gives them: a v1.2 member's name as
 * written, a v1.1 one's "<sample number>.<ext>"; header_off is the data
 * offset - 512 (where the member's tar header should be: the caller
 * checks a few there). *out zeroed by the caller, or freed and zeroed.
 * 0; -EINVAL for a malformed index (err says what, *bad_line the 1-based
 * line: 1 for the first line or a count that does not match); -ENOMEM.
 * Numbers are decimal digits only, at most 19. */
int fr_wds2idx_parse(const char *buf, size_t len, fr_tar_members *out, size_t *bad_line,
                     char *err, size_t err_len);

/* Walks the tar held in buf[0, len) into *out (zeroed by the caller, or
 * freed and zeroed). 0; -EINVAL for a malformed tar (err says what,
 * *bad_at where); -ENOMEM. */
int fr_tar_walk(const unsigned char *buf, uint64_t len, fr_tar_members *out,
                uint64_t *bad_at, char *err, size_t err_len);

/* What a reader wants of a shard. `wanted` are the extensions (already
 * folded to lower case where fold_case: ASCII only) mapped to their column
 * wanted_col[i] in 0..k-1; the first entry for an extension wins. */
typedef struct fr_wds_spec {
    int k;
    size_t n_wanted;
    const char *const *wanted;
    const size_t *wanted_len;
    const int *wanted_col;
    int fold_case;   /* match extensions case-insensitively (ASCII) */
    int dali;        /* DALI's grouping (see fastread.formats.webdataset) */
    int missing;     /* 0: empty, 1: skip, 2: error */
    int want_keys;   /* fill keys / key_off */
} fr_wds_spec;

/* Samples of one shard, as columns: the byte range [start, start + length)
 * spanning its members, per column j comp_off[i*k + j] (offset of that
 * component from start, -1: missing) and comp_len[i*k + j]; keys as one
 * blob with key_off (n + 1 entries) where asked; samples dropped by
 * missing == skip counted in `skipped`. */
typedef struct fr_wds_samples {
    size_t n, cap;
    int k;
    uint64_t *start, *length;
    int64_t *comp_off;
    uint64_t *comp_len;
    uint64_t *key_off;
    char *keys;
    size_t keys_len, keys_cap;
    uint64_t skipped;
} fr_wds_samples;

void fr_wds_samples_free(fr_wds_samples *s);

/* Groups members (names blob + name_off, data offsets, sizes) into samples.
 * 0; FR_WDS_DEFER (see above; *err says why, *out is freed); -ENOMEM;
 * -EINVAL for a bad spec. */
int fr_wds_group(const fr_wds_spec *spec, const char *names, const uint64_t *name_off,
                 const uint64_t *data_off, const uint64_t *size, size_t n_members,
                 fr_wds_samples *out, char *err, size_t err_len);

/* One shard file's result in fr_wds_index_files. */
typedef struct fr_wds_shard {
    int rc;               /* 0, FR_WDS_DEFER, or -errno */
    int stage;            /* where rc came from: 0 open/stat/map, 1 walk, 2 grouping */
    uint64_t bad_at;      /* for a walk error: the offset */
    uint64_t file_size;
    int64_t mtime_ns;
    char err[256];
    fr_wds_samples samples;
} fr_wds_shard;

/* Indexes shard files paths[0..n) on `threads` threads (at least 1, at most
 * n): each is opened (regular files only: a FIFO, device or directory is
 * refused with -EINVAL without blocking), mapped, walked and grouped into
 * out[i] (zeroed by the caller; free each with fr_wds_samples_free). 0
 * once every shard has its result (a thread that cannot start leaves its
 * share to the others); -ENOMEM where nothing ran. */
int fr_wds_index_files(const char *const *paths, size_t n, const fr_wds_spec *spec,
                       unsigned threads, fr_wds_shard *out);

#endif
