/* The context's private parts, shared by ctx.c (the engine registry, open,
 * close, the auto engine, the read calls) and ctx_cache.c (reads through the
 * node-local object cache). Nothing outside csrc/core/ includes this. */
#ifndef FASTREAD_CTX_INTERNAL_H
#define FASTREAD_CTX_INTERNAL_H

#include <sys/types.h>

#include "core/auto_trial.h"
#include "core/object_cache.h"
#include "core/size_memo.h"
#include "engines/engine.h"
#include "gpu/gpu.h"

/* One cached call's lists (cached_read), kept from call to call. */
typedef struct cache_work {
    size_t cap;                /* samples each array below holds */
    fr_sample *res;            /* the call's results, in list order */
    /* Samples by what happens to them: read from the cache, fetched,
     * waited for (another process holds their lock), found complete once
     * locked or waited for ("late" hits), fetched without storing. */
    size_t *hit, *miss, *fetch, *wait, *late, *direct;
    unsigned *stripes;         /* each sample's lock (fr_ocache_stripe) */
    unsigned *held;            /* stripes this phase took */
    const char **paths;        /* the paths (or data files) of one engine call */
    int64_t *hints;            /* its size hints */
    fr_ocache_entry *ents;     /* each sample's entry when it is a hit */
    unsigned char *flags;      /* CW_* per sample */
    char *data_paths;          /* cap data-file paths of path_len bytes */
    size_t path_len;
    /* Messages of samples that failed in this call (fr_ctx_sample_error). */
    struct cache_note {
        size_t sample;
        char msg[FR_ERRLEN];
    } *notes;
    size_t nnotes, notes_cap;
} cache_work;

struct fr_ctx {
    const fr_engine *engine;
    void *state;
    fr_gpu *gpu;        /* NULL for host-only contexts */
    fr_CUstream stream; /* this context's copies to and from the GPU */
    int device_output;
    /* The process that opened the context. A fork()ed child inherits the
     * context's memory but none of its helper threads (psync's pool, one
     * thread per io_uring ring), and io_uring's registered buffers still
     * point at the parent's pages: in a child every read would wait forever
     * for threads that do not exist, or land in the parent's memory. So a
     * child's calls fail with ECHILD, and its close frees what it safely
     * can. */
    pid_t pid;

    /* cfg.auto_engine: batches of cached large files go to psync (`alt`,
     * opened on first use), the rest to io_uring; see fr_auto_rule. */
    int auto_engine;
    fr_config alt_cfg;
    void *alt_state;
    int alt_failed;        /* psync could not open: io_uring reads everything */
    unsigned cpus;         /* CPUs the process may use, at open */
    int resident;          /* the last sample's verdict: 1 cached, 0 not, -1 none yet */
    uint64_t seed;         /* the residency sample's page picks */
    long auto_batches[2];  /* batches read by io_uring, by psync */
    int last_pick;         /* FR_AUTO_URING or FR_AUTO_PSYNC */
    uint64_t size_est;     /* running mean of the batches' file sizes, 0: none yet */
    unsigned size_jumps;   /* consecutive batches 4x or more off size_est */
    /* Batches of large cached files ("the band"; see auto_pick) go to the
     * engine the trials of auto_trial.h find faster: in_band, the last batch
     * was there; band_batch, this batch's pick came from the trials. */
    int in_band;
    int band_batch;
    size_t band_files;          /* files a batch when the band was entered */
    unsigned band_length_jumps; /* batches in a row 2x or more off band_files */
    fr_auto_trial trial;

    /* fr_read_file_ranges on an engine without it (io_uring): a psync
     * state of the context's settings, opened on first use. */
    fr_config ranges_cfg;
    void *ranges_state;
    int ranges_failed; /* -errno: psync would not open */
    int ranges_call;   /* the last call read through ranges_state */

    /* fr_read_files calls and the wall time spent in them (the engine's
     * read, the auto pick, any GPU hand-off): against the caller's own
     * clock, what a binding costs around the native call. */
    long file_calls;
    long file_call_ns;

    /* Sizes of files read without hints (cfg.remember_sizes; made on first
     * use), and for the call in progress its paths' hashes and the sizes
     * looked up for them: one buffer, memo_cap of each. */
    unsigned remember_sizes;
    fr_size_memo *memo;
    int64_t *memo_scratch;
    size_t memo_cap;
    long memo_calls; /* calls whose every size was remembered */
    uint64_t unhinted_mean; /* arena bytes a file of the last call without hints (0: none yet) */

    /* engine "auto": why it reads with psync rather than io_uring (an
     * errno: io_uring's probe or open failed), 0 if it does not. */
    int auto_fallback;
    /* cfg.cache_dir with a URL engine: see cached_read. */
    fr_ocache *cache;
    fr_config file_cfg;            /* the hits' file engine: the context's settings */
    const fr_engine *file_engine;  /* opened on first use; NULL: not yet */
    void *file_state;
    int file_failed;               /* no file engine would open: every object is a miss */
    fr_batch scratch;              /* misses and late hits, before they join the batch */
    int cache_call;                /* the last fr_read_files went through the cache */
    cache_work work;
    long cache_hits, cache_misses, cache_damaged, cache_write_errors, cache_evictions,
        cache_waits;
    long long cache_bytes_written;
};

/* fr_read_files through the object cache (cfg.cache_dir with a URL
 * engine): ctx_cache.c. 0, or a batch-level -errno. */
int fr_ctx_cached_read(fr_ctx *ctx, const char *const *paths, const int64_t *hints, size_t n,
                       fr_batch *batch);

/* Frees what cached reads kept from call to call (fr_ctx_close). */
void fr_ctx_cache_work_free(cache_work *w);

#endif
