/*
 * The engine interface. Every I/O backend is one file under csrc/ that fills
 * in an fr_engine; ctx.c dispatches to it. Engines own no global state: all
 * they keep lives in the `state` their open() returns.
 */
#ifndef FASTREAD_ENGINE_H
#define FASTREAD_ENGINE_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/types.h>

#include "fastread.h"

typedef struct fr_engine {
    const char *name;
    /* 0 if usable on this machine, else -errno and the reason. */
    int (*probe)(char *why, size_t why_len);
    int (*open)(const fr_config *cfg, void **state, char *err, size_t err_len);
    void (*close)(void *state);
    /* Contract: fill batch->samples[0..n) and lay bytes out in batch->arena.
     * Per-sample failures go in samples[i].length as -errno; return 0 or a
     * batch-level -errno. */
    int (*read_files)(void *state, const char *const *paths, const int64_t *size_hints, size_t n,
                      fr_batch *batch);
    long (*stat)(const void *state, const char *key);
    /* Optional (NULL: -ENOTSUP). Same contract as read_files, one sample per
     * range of `path`; see fr_read_ranges. */
    int (*read_ranges)(void *state, const char *path, const fr_range *ranges, size_t n,
                       fr_batch *batch);
} fr_engine;

extern const fr_engine fr_engine_psync;
extern const fr_engine fr_engine_cufile; /* loads CUDA and libcufile at run time */
#ifdef FASTREAD_HAVE_URING
extern const fr_engine fr_engine_uring;
#endif
#ifdef FASTREAD_HAVE_XNVME
extern const fr_engine fr_engine_xnvme_file; /* "xnvme-file": whole files via xnvme_file_* */
extern const fr_engine fr_engine_xnvme;      /* "xnvme": ranges of one device or image */
#endif

/* ---- helpers shared by the engines (io_common.c) ---- */

/* Longest single read request; larger files are read on in pieces. */
#define FR_MAX_REQUEST ((size_t)1 << 30)
/* Alignment of every sample in the arena without O_DIRECT. */
#define FR_SAMPLE_ALIGN 64

static inline size_t fr_round_up(size_t v, size_t align)
{
    return (v + align - 1) & ~(align - 1);
}

/* Bytes a read of a file of `size` bytes asks for: one more than the size, so
 * a file that grew since it was sized is noticed; rounded for O_DIRECT. */
size_t fr_request_len(size_t size, int o_direct, size_t dio_align);

/* Lays samples out in the arena from their sizes (sizes[i] < 0 marks a sample
 * that already failed), growing the arena once. Sets samples[i].offset. */
int fr_layout(fr_batch *batch, const int64_t *sizes, size_t n, int o_direct,
              size_t dio_align);

/* Synchronous repair for the rare sample the fast path could not finish: a
 * short read, a file that changed size, a read cut at FR_MAX_REQUEST. Reads
 * the whole file again without O_DIRECT, into its slot when it fits or at the
 * end of the arena. No I/O may be in flight on the arena. */
void fr_read_whole(fr_batch *batch, size_t i, const char *path, size_t slot_len);

/* pread until `len` bytes or end of file; returns bytes read or -errno. */
ssize_t fr_pread_full(int fd, void *buf, size_t len, off_t offset);

void fr_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
