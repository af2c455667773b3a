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

#include "core/base.h"
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
    /* Nonzero if read_files skips work for files whose size it is given:
     * only then does a context look up remembered sizes for it (the lookup
     * touches every path; psync ran 3-4% slower for nothing at 92 KiB).
     * FR_HINTS_ANY_SIZE: for files of any size, not only small ones
     * (FR_REMEMBER_MAX_MEAN): where a size saves a round trip, not a stat. */
    int uses_size_hints;
    long (*stat)(const void *state, const char *key);
    /* Optional (NULL: -ENOTSUP). Same contract as read_files, one sample per
     * range of `path`; see fr_read_ranges. */
    int (*read_ranges)(void *state, const char *path, const fr_range *ranges, size_t n,
                       fr_batch *batch);
    /* Optional (NULL: none). Why sample i of the last read_files or
     * read_ranges call failed, beyond its errno (e.g. "s3://b/k: 403
     * SignatureDoesNotMatch"), into out[len]: 1, or 0 when there is no
     * message. Never a secret. */
    int (*sample_error)(const void *state, size_t i, char *out, size_t len);
    /* Optional (NULL: calls run to their end). The one entry point another
     * thread may call while a call runs on the state's own thread: on != 0
     * makes the call in progress, and every later call until on == 0, end
     * soon with a batch-level -ECANCELED. For engines whose calls can wait
     * long on a network (a stalled request runs to its deadline otherwise);
     * a reader cancels the batches it will drop (fr_reader_reset, close). */
    void (*cancel)(void *state, int on);
    /* Optional (NULL: none). The version the store gave sample i of the
     * last read_files call (s3: its ETag, quotes and all), or NULL or ""
     * when it gave none; valid until the next call. The object cache keeps
     * it in the entry's record (fr_ocache_drop_stale). */
    const char *(*sample_version)(const void *state, size_t i);
    /* Optional (NULL: none). What besides a URL names an object for this
     * state (s3: the endpoint and who asks), one line of at most 1023
     * bytes into out[len], no secret: the object cache's entries of other
     * scopes are not this state's (fr_ocache_open). */
    void (*cache_scope)(const void *state, char *out, size_t len);
    /* Optional (NULL: -ENOTSUP). Engines whose samples are rows found by a
     * key (cql): sample i is the row of key keys[i * key_len, + key_len),
     * its bytes laid out in batch->arena as read_files lays files out, its
     * label (when the engine reads one) through fr_batch_set_label. Same
     * per-sample contract as read_files. */
    int (*read_keys)(void *state, const uint8_t *keys, size_t key_len, size_t n,
                     fr_batch *batch);
    /* Optional (NULL: -ENOTSUP, or for io_uring contexts a psync pool:
     * see fr_read_file_ranges). Sample i is jobs[i]'s range of
     * paths[jobs[i].file]; same per-sample contract as read_ranges. */
    int (*read_file_ranges)(void *state, const char *const *paths, size_t npaths,
                            const fr_file_range *jobs, size_t n, fr_batch *batch);
} fr_engine;

#define FR_HINTS_ANY_SIZE 2

extern const fr_engine fr_engine_psync;
extern const fr_engine fr_engine_cufile; /* loads CUDA and libcufile at run time */
#ifdef FASTREAD_HAVE_URING
extern const fr_engine fr_engine_uring;
/* Whether io_uring contexts of `cfg` read fr_read_file_ranges on their
 * rings (direct opens linked to reads: Linux 5.17, register_files, no
 * O_DIRECT), not through a psync pool beside them; opens a probe ring. */
int fr_uring_files_usable(const fr_config *cfg);
#endif
#ifdef FASTREAD_HAVE_S3
extern const fr_engine fr_engine_s3; /* "s3": objects over HTTP(S) (engines/s3/, libcurl) */
#endif
extern const fr_engine fr_engine_cql; /* "cql": rows of Cassandra by key (engines/cql/) */
#ifdef FASTREAD_HAVE_XNVME
extern const fr_engine fr_engine_xnvme_file; /* "xnvme-file": whole files via xnvme_file_* */
extern const fr_engine fr_engine_xnvme;      /* "xnvme": ranges of one device or image */
#endif

#endif
