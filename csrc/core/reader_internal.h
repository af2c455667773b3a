/*
 * What reader.c (the workers, batches in order, reset and close) and
 * reader_open.c (the kinds of reader and their layouts) share: the reader
 * itself. Internal: not part of the public API.
 *
 * Thread-safety: as fastread.h's fr_reader; the fields marked "under lock"
 * are read and written holding `lock`, the rest are set before the workers
 * start (fr_reader_start) and only read after.
 */
#ifndef FASTREAD_READER_INTERNAL_H
#define FASTREAD_READER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/path_table.h"
#include "core/size_memo.h"
#include "engines/engine.h"
#include "gpu/gpu.h"

#define FR_READER_MAX_WORKERS 64
/* Context counters a reader sums over its workers: reader.c's summed_keys
 * (a static assertion there keeps the two equal). */
#define FR_READER_NSUMMED 22

typedef struct request request;

struct fr_reader {
    fr_config cfg;
    char engine[32];
    char opened_engine[32]; /* what the first context opened reads with ("auto" resolved) */
    long auto_fallback;     /* its "auto_fallback" stat */
    char *engine_args;
    char *cache_dir;
    /* summed_keys over the workers' contexts, added by each worker after
     * each batch (under lock): a context is read by its own thread only. */
    long totals[FR_READER_NSUMMED];
    char *blob;
    const char **paths;
    /* Tree reader (fr_reader_open_tree): the paths as borrowed columns,
     * each batch's paths assembled by its worker (scratch.pbuf). */
    int is_tree;
    fr_path_table tree;
    int64_t *sizes; /* each file's size when last read, -1 before; atomic access */
    size_t npaths;  /* samples: files, or ranges of the image */
    char *image;    /* range reader: the image all samples are ranges of */
    fr_range *ranges;                      /* copied (fr_reader_open_ranges), or */
    const uint64_t *c_offsets, *c_lengths; /* borrowed (fr_reader_open_range_columns) */
    uint8_t *keys;  /* key reader: npaths keys of key_len bytes */
    size_t key_len;
    /* Table reader (fr_reader_open_table): npaths samples, ranges of the
     * nfiles files in `paths`; the columns are the caller's (borrowed). */
    int table;
    size_t nfiles;
    const uint32_t *t_files;
    const uint64_t *t_offsets, *t_lengths;
    const uint32_t *t_lengths32; /* fr_reader_open_table32: instead of t_lengths */
    unsigned prefetch;
    unsigned nworkers;
    fr_pool *pool;
    fr_gpu *gpu; /* shared by the workers' contexts and the pool's pinning */

    pthread_t threads[FR_READER_MAX_WORKERS];
    unsigned nthreads;
    /* Each worker's context while it is open, and the generation of the
     * batch it reads (under lock): fr_reader_reset cancels the reads it
     * makes stale (fr_ctx_cancel), so a stalled request does not hold a
     * new epoch, or close, up to its deadline. */
    fr_ctx *ctxs[FR_READER_MAX_WORKERS];
    uint64_t reading_gen[FR_READER_MAX_WORKERS];
    int reading[FR_READER_MAX_WORKERS];
    unsigned nctxs;
    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t ready_cv;
    request *req_head, *req_tail;
    fr_batch *ready;      /* finished batches, sorted by seq */
    size_t nready;
    unsigned nbusy;       /* workers reading a batch */
    size_t outstanding;   /* submitted and not yet taken, this generation */
    uint64_t generation;  /* bumped by reset: older work is dropped */
    uint64_t next_seq;    /* seq of the next request a worker takes */
    uint64_t deliver_seq; /* seq the consumer gets next */
    int dense;            /* fr_reader_set_dense: 0, 1, or -1 (not set: each batch's own) */
    int stop;

    unsigned started;
    int open_rc;
    char open_err[FR_ERRLEN];

    /* The sizes of the files of explicit lists (fr_reader_submit_paths),
     * shared by the workers as `sizes` is for a path table: a list read by
     * one worker gives the sizes to whichever worker reads it next, so a
     * second pass over the lists reads with every size known, as a
     * Reader's second epoch does (each worker's context would know only the
     * lists it happened to read). Made at the first such list; lookups
     * share memo_lock, stores (only when a size changed) hold it alone. */
    fr_size_memo *memo;
    pthread_rwlock_t memo_lock;
    int memo_made; /* 1: memo_lock initialised */
    long hinted_lists; /* lists read with every size known (under lock) */
};

/* A reader with its configuration copied and nothing started: prefetch >= 1,
 * 1 <= workers <= FR_READER_MAX_WORKERS (else -EINVAL with err). The caller
 * lays out its samples, then calls fr_reader_start, or on a failure before
 * that fr_reader_free_unstarted. */
int fr_reader_new_unstarted(const fr_config *cfg, unsigned prefetch, unsigned workers,
                            fr_reader **out, char *err, size_t err_len);
void fr_reader_free_unstarted(fr_reader *rd);

/* Starts the worker threads and waits until each opened its context: 0 and
 * *out = rd, or -errno with err, the reader closed. */
int fr_reader_start(fr_reader *rd, fr_reader **out, char *err, size_t err_len);

#endif /* FASTREAD_READER_INTERNAL_H */
