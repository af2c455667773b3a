/*
 * Helpers the engines share for range reads (fr_read_ranges): samples of a
 * packed image or a block device, defined by (offset, length) in one file.
 * Implemented in io_common.c. Internal: not part of the public API.
 */
#ifndef FASTREAD_RANGE_IO_H
#define FASTREAD_RANGE_IO_H

#include <sys/types.h>

#include "engines/io_common.h"

/* Largest single transfer of a range read; longer ranges are split. 1 MiB
 * stays within every device's max_sectors and keeps many requests in flight. */
#define FR_RANGE_CHUNK ((size_t)1 << 20)

/* Bytes a range read asks for: the range itself, or with O_DIRECT whole
 * aligned blocks (the bytes past `length` are read but never returned). */
size_t fr_range_request_len(uint64_t length, int o_direct, size_t dio_align);

/* 0, or -EINVAL for a range that overflows or (O_DIRECT) is not aligned. */
int fr_check_range(const fr_range *r, int o_direct, size_t dio_align);

/* Lays the ranges out in the arena (growing it once) and sets
 * samples[i].offset; samples[i].length is 0, or -EINVAL for a bad range. */
int fr_layout_ranges(fr_batch *batch, const fr_range *ranges, size_t n, int o_direct,
                     size_t dio_align);

/* Opens an image (regular file or block device) for range reads: O_DIRECT
 * when asked and the file system allows it (*direct_out says which). Returns
 * the descriptor or -errno (-EISDIR, -EINVAL for other file types). */
int fr_open_image(const char *path, int o_direct, int *direct_out);

/* The slow, sure path for one range: a fresh buffered descriptor (of a
 * regular file or block device: fr_open_image's checks) and pread until the
 * whole range is in its slot. Sets samples[i].length to the range's
 * length, -ENODATA if the image ends inside the range, or -errno. Writes only
 * inside the sample's slot, so it may run on several threads at once. */
void fr_read_range_plain(fr_batch *batch, size_t i, const char *path, const fr_range *r);

/* A context's cached image descriptor: opened on first use, reopened when
 * the path changes or names another file than the one open (an image
 * replaced by rename, as fastread.pack writes them: the old descriptor would
 * go on reading the replaced file). */
typedef struct fr_image_cache {
    char *path;
    int fd;     /* -1: none open */
    int direct; /* fd was opened with O_DIRECT */
    int err;    /* -errno of the last failed open of `path`, else 0 */
    dev_t dev;  /* the open file's identity, when fd >= 0 */
    ino_t ino;
} fr_image_cache;

void fr_image_cache_init(fr_image_cache *c);
/* 1 if the cached descriptor changed (opened, reopened or closed), else 0;
 * costs one stat(2) of `path` when the descriptor is kept;
 * c->fd is the descriptor, or -1 with c->err saying why. -ENOMEM on no memory. */
int fr_image_cache_get(fr_image_cache *c, const char *path, int o_direct);
void fr_image_cache_close(fr_image_cache *c);

/* Ranges of one file in a fr_read_file_ranges batch whose gap is at most
 * FR_COALESCE_GAP bytes are one vector read (psync's preadv, io_uring's
 * READV): the gap's bytes land in a discard buffer. A WebDataset sample's
 * members are a 512-byte tar header apart and samples read in order are
 * adjacent, so a batch costs a read a run, not a read a member. A run is at
 * most FR_COALESCE_IOV vectors (jobs and gaps). */
#define FR_COALESCE_GAP 8192
#define FR_COALESCE_IOV 64

/* Sorts job numbers v[0..n) by (file, offset, number): a file's ranges
 * read in order (the page cache's read-ahead) and each file's jobs one
 * run. */
void fr_sort_file_jobs(const fr_file_range *jobs, uint32_t *v, size_t n);

/* What every engine reading a table batch does first: lays the n jobs'
 * ranges out in the batch (`ranges`: n entries of scratch), fails a job
 * naming a file at or past npaths with -EINVAL, and returns in
 * sorted[0 .. *valid) the jobs left to read, in fr_sort_file_jobs's order.
 * 0, or fr_layout_ranges's error. */
int fr_prepare_file_jobs(fr_batch *batch, const fr_file_range *jobs, size_t n, size_t npaths,
                         fr_range *ranges, size_t dio_align, uint32_t *sorted, size_t *valid);

/* Splits sorted positions [first, end) of v (jobs in fr_sort_file_jobs's
 * order) into runs: the same file, each job starting at or past the
 * previous one's end and within FR_COALESCE_GAP of it (an overlapping job
 * starts a run of its own: a vector read cannot deliver the same bytes
 * twice), at most FR_COALESCE_IOV vectors. runs[k] is run k's first
 * sorted position, runs[nruns] = end; returns nruns. */
size_t fr_file_runs(const fr_file_range *jobs, const uint32_t *v, size_t first, size_t end,
                    uint32_t *runs);

#endif
