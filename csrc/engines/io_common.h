/*
 * Helpers the engines share for whole-file reads: request sizing, arena
 * layout and the slow repair path. Implemented in io_common.c (with the
 * range helpers of range_io.h). Internal: not part of the public API.
 */
#ifndef FASTREAD_IO_COMMON_H
#define FASTREAD_IO_COMMON_H

#include <sys/types.h>

#include "core/base.h"
#include "fastread.h"

/* Longest single read request; larger files are read on in pieces. */
#define FR_MAX_REQUEST ((size_t)1 << 30)
/* Largest sample a batch lays out (1 TiB): a larger size is a sparse or
 * corrupt file's, and that sample fails with -EFBIG on its own. */
#define FR_MAX_SAMPLE ((uint64_t)1 << 40)
/* Alignment of every sample in the arena without O_DIRECT. */
#define FR_SAMPLE_ALIGN 64

/* Bytes a read of a file of `size` bytes asks for: one more than the size, so
 * a file that grew since it was sized is noticed; rounded for O_DIRECT. */
size_t fr_request_len(size_t size, int o_direct, size_t dio_align);

/* Lays samples out in the arena from their sizes (sizes[i] < 0 marks a sample
 * that already failed), growing the arena once. Sets samples[i].offset.
 * Samples start FR_SAMPLE_ALIGN-aligned (direct_alignment with O_DIRECT)
 * with room for fr_request_len; a dense batch (fr_batch.dense, without
 * O_DIRECT) has them back to back, each exactly its size, plus one byte
 * reserved after the last. A size over FR_MAX_SAMPLE (or one whose slot
 * would wrap the total) fails its sample: sizes[i] and the sample's length
 * become -EFBIG, so the engine, which reads what sizes[] says was sized,
 * skips it as any failed sample. */
int fr_layout(fr_batch *batch, int64_t *sizes, size_t n, int o_direct, size_t dio_align);

/* Synchronous repair for the rare sample the fast path could not finish: a
 * short read, a file that changed size, a read cut at FR_MAX_REQUEST. Reads
 * the whole file again without O_DIRECT, into its slot when it fits or at the
 * end of the arena. No I/O may be in flight on the arena. slot_len is the
 * request fr_request_len gave the sample; in a dense batch its slot is one
 * byte less, and the batch is flagged dense_spill (see fastread.h). */
void fr_read_whole(fr_batch *batch, size_t i, const char *path, size_t slot_len);

/* Times in a row a read may fail with EINTR or EAGAIN (EAGAIN after a 1 ms
 * pause) before its errno is the sample's error. */
#define FR_RETRY_LIMIT 100

/* Sleeps about a millisecond (between retries of a refused call). */
void fr_pause_1ms(void);

/* open(path, flags), retrying EINTR and EAGAIN (at most FR_RETRY_LIMIT
 * times, EAGAIN after 1 ms); the descriptor, or -1 with errno set. */
int fr_open_retry(const char *path, int flags);

/* pread until `len` bytes or end of file, retrying EINTR/EAGAIN (at most
 * FR_RETRY_LIMIT in a row) and short reads; returns bytes read or -errno. */
ssize_t fr_pread_full(int fd, void *buf, size_t len, off_t offset);

#endif
