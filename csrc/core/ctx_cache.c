/* A context's reads through the node-local object cache (cfg.cache_dir
 * with a URL engine, e.g. s3): hits read from local files with a file
 * engine and checked, misses fetched once per node under the cache's
 * stripe locks and stored (core/object_cache.h). The context's other
 * parts are in ctx.c; what both use is ctx_internal.h. Thread safety: that
 * of the context (one thread at a time). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx_internal.h"

/* cache_work.flags */
enum { CW_DAMAGED = 1, CW_UNLOCKED = 2 };

/* Grows one of cache_work's arrays to n elements of `elem` bytes. */
static int grow_array(void *pp, size_t n, size_t elem)
{
    void **p = pp;
    void *q = realloc(*p, n * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    return 0;
}

static int work_reserve(fr_ctx *ctx, size_t n)
{
    cache_work *w = &ctx->work;
    if (n <= w->cap)
        return 0;
    w->path_len = fr_ocache_path_max(ctx->cache);
    /* Each array keeps what it got on a failure; cap only says all did. */
    if (grow_array(&w->res, n, sizeof(*w->res)) || grow_array(&w->hit, n, sizeof(size_t)) ||
        grow_array(&w->miss, n, sizeof(size_t)) || grow_array(&w->fetch, n, sizeof(size_t)) ||
        grow_array(&w->wait, n, sizeof(size_t)) || grow_array(&w->late, n, sizeof(size_t)) ||
        grow_array(&w->direct, n, sizeof(size_t)) ||
        grow_array(&w->stripes, n, sizeof(unsigned)) ||
        grow_array(&w->held, n, sizeof(unsigned)) || grow_array(&w->paths, n, sizeof(char *)) ||
        grow_array(&w->hints, n, sizeof(int64_t)) || grow_array(&w->ents, n, sizeof(*w->ents)) ||
        grow_array(&w->flags, n, 1) || grow_array(&w->data_paths, n, w->path_len))
        return -ENOMEM;
    w->cap = n;
    return 0;
}

static char *data_path(cache_work *w, size_t i) { return w->data_paths + i * w->path_len; }

/* Keeps the engine's message of sample j of its last call as the message
 * of the caller's sample i (fr_ctx_sample_error). */
static void keep_note(fr_ctx *ctx, size_t i, size_t j)
{
    cache_work *w = &ctx->work;
    if (!ctx->engine->sample_error)
        return;
    if (w->nnotes == w->notes_cap) {
        size_t cap = w->notes_cap ? 2 * w->notes_cap : 16;
        if (cap > 4096 || grow_array(&w->notes, cap, sizeof(*w->notes)))
            return; /* past that the errno alone explains the sample */
        w->notes_cap = cap;
    }
    struct cache_note *nt = &w->notes[w->nnotes];
    if (ctx->engine->sample_error(ctx->state, j, nt->msg, sizeof(nt->msg)) == 1) {
        nt->sample = i;
        w->nnotes++;
    }
}

/* The file engine the hits are read with: io_uring, else psync, opened
 * on first use (a context that never hits never opens one). 0, or -1 if
 * neither opens (then every object is read over the network). */
static int open_file_engine(fr_ctx *ctx)
{
    if (ctx->file_engine)
        return 0;
    if (ctx->file_failed)
        return -1;
#ifdef FASTREAD_HAVE_URING
    ctx->file_cfg.engine = "io_uring";
    if (fr_engine_uring.open(&ctx->file_cfg, &ctx->file_state, NULL, 0) == 0) {
        ctx->file_engine = &fr_engine_uring;
        return 0;
    }
#endif
    ctx->file_cfg.engine = "psync";
    if (fr_engine_psync.open(&ctx->file_cfg, &ctx->file_state, NULL, 0) == 0) {
        ctx->file_engine = &fr_engine_psync;
        return 0;
    }
    ctx->file_failed = 1;
    return -1;
}

/* Copies sample j of `from` to the end of batch's arena: *out says where.
 * A failed sample is copied as its error. */
static void append_sample(fr_batch *batch, const fr_batch *from, size_t j, fr_sample *out)
{
    fr_sample s = from->samples[j];
    if (s.length < 0) {
        *out = s;
        return;
    }
    size_t off = fr_round_up(batch->arena.used, batch->dense ? 1 : 64);
    int rc = fr_arena_reserve(&batch->arena, off + (size_t)s.length);
    if (rc) {
        out->offset = 0;
        out->length = rc;
        return;
    }
    memcpy(batch->arena.base + off, from->arena.base + s.offset, (size_t)s.length);
    batch->arena.used = off + (size_t)s.length;
    out->offset = off;
    out->length = s.length;
}

/* Reads the entries of samples list[0..k) (found by fr_ocache_lookup) with
 * the file engine into `into` (the caller's batch: samples stay where the
 * engine put them; the scratch batch: appended to `batch`), and checks
 * each against its entry. Those that pass are hits; the rest are added to
 * failed[*nfailed], a read that passed its size but not its checksum
 * marked damaged. */
static void read_hits(fr_ctx *ctx, const char *const *urls, const size_t *list, size_t k,
                      fr_batch *into, fr_batch *batch, size_t *failed, size_t *nfailed)
{
    cache_work *w = &ctx->work;
    if (k == 0)
        return;
    int rc = open_file_engine(ctx);
    if (rc == 0 && into != batch)
        rc = fr_batch_prepare(into, k);
    if (rc == 0) {
        for (size_t j = 0; j < k; j++) {
            w->paths[j] = data_path(w, list[j]);
            w->hints[j] = (int64_t)w->ents[list[j]].size;
        }
        into->count = k;
        rc = ctx->file_engine->read_files(ctx->file_state, w->paths, w->hints, k, into);
    }
    if (rc != 0) { /* out of memory, a broken ring: over the network instead */
        into->arena.used = 0;
        for (size_t j = 0; j < k; j++)
            failed[(*nfailed)++] = list[j];
        return;
    }
    if (into->dense_spill) {
        /* The repair of a dense read rereads a first byte from the path
         * it was read from: the data file, which only this call knows. */
        for (size_t j = 0; j < k; j++)
            (void)fr_batch_reread_first_byte(into, j, w->paths[j]); /* errors land in the sample */
        into->dense_spill = 0;
    }
    for (size_t j = 0; j < k; j++) {
        size_t i = list[j];
        fr_sample sm = into->samples[j];
        fr_ocache_entry *e = &w->ents[i];
        /* A trusted entry (fr_ocache_lookup): its size; any other: its
         * size and checksum, and trusted from then on. */
        int good = sm.length >= 0 && (uint64_t)sm.length == e->size &&
                   (e->trusted ||
                    fr_ocache_verify(e, into->arena.base + sm.offset, (uint64_t)sm.length));
        if (good && !e->trusted)
            fr_ocache_trust(ctx->cache, urls[i], e);
        if (good) {
            if (into == batch)
                w->res[i] = sm;
            else
                append_sample(batch, into, j, &w->res[i]);
            ctx->cache_hits++;
            continue;
        }
        /* Gone since the lookup (evicted) is a miss; read whole but wrong
         * (bit rot, a torn write after a crash, a record of another
         * version) is damaged: fetched again without trusting the entry. */
        fr_ocache_forget(ctx->cache, urls[i]);
        if (sm.length >= 0 && !e->trusted) {
            w->flags[i] |= CW_DAMAGED;
            ctx->cache_damaged++;
        }
        failed[(*nfailed)++] = list[j];
    }
}

/* Reads the objects of samples list[0..k) over the network into the
 * scratch batch, stores each that arrived whole in the cache unless
 * `store` is 0 (or its lock could not be taken), and appends it to batch.
 * 0, or the engine's batch-level -errno. */
static int fetch_objects(fr_ctx *ctx, const char *const *paths, const int64_t *hints,
                         const size_t *list, size_t k, fr_batch *batch, int store)
{
    cache_work *w = &ctx->work;
    if (k == 0)
        return 0;
    fr_batch *sc = &ctx->scratch;
    int rc = fr_batch_prepare(sc, k);
    if (rc)
        return rc;
    for (size_t j = 0; j < k; j++) {
        w->paths[j] = paths[list[j]];
        w->hints[j] = hints ? hints[list[j]] : -1;
    }
    rc = ctx->engine->read_files(ctx->state, w->paths, hints ? w->hints : NULL, k, sc);
    if (rc)
        return rc;
    for (size_t j = 0; j < k; j++) {
        size_t i = list[j];
        fr_sample sm = sc->samples[j];
        ctx->cache_misses++;
        if (sm.length < 0) {
            keep_note(ctx, i, j);
        } else if (store && !(w->flags[i] & CW_UNLOCKED)) {
            const char *version =
                ctx->engine->sample_version ? ctx->engine->sample_version(ctx->state, j) : NULL;
            if (fr_ocache_publish(ctx->cache, paths[i], sc->arena.base + sm.offset,
                                  (uint64_t)sm.length, version) == 0)
                ctx->cache_bytes_written += sm.length;
            else
                ctx->cache_write_errors++; /* a full disk: the bytes are read all the same */
        }
        append_sample(batch, sc, j, &w->res[i]);
    }
    return 0;
}

static void unlock_held(fr_ctx *ctx, size_t *nheld)
{
    for (size_t j = 0; j < *nheld; j++)
        fr_ocache_unlock(ctx->cache, ctx->work.held[j]);
    *nheld = 0;
}

static int by_value(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Places in the wait list: (stripe << WAIT_SHIFT) | sample, so that one
 * sort orders them by stripe. */
#define WAIT_SHIFT 40

/* fr_read_files through the object cache (cfg.cache_dir):
 *  1. every path looked up; the hits read with the file engine straight
 *     into the caller's batch and checked (read_hits);
 *  2. the rest: each entry's lock tried. Taken: looked up again (another
 *     process may just have stored it) and read from the cache, or else
 *     fetched, stored and unlocked. Held by another process: waited for
 *     afterwards, in stripe order, and then read from the cache, or (its
 *     writer failed or died) fetched and stored;
 *  3. what was read from the cache after a lock and failed its check is
 *     fetched without storing (rare: evicted or damaged meanwhile).
 * Everything not read into the batch directly is appended to its arena,
 * and the samples are put back in list order. One object is fetched by
 * one process at a time; a process never waits for a lock while holding
 * one taken out of stripe order (object_cache.h). */
int fr_ctx_cached_read(fr_ctx *ctx, const char *const *paths, const int64_t *hints, size_t n,
                       fr_batch *batch)
{
    int rc = work_reserve(ctx, n);
    if (rc)
        return rc;
    cache_work *w = &ctx->work;
    fr_ocache *c = ctx->cache;
    long long written_before = ctx->cache_bytes_written;
    w->nnotes = 0;
    size_t nhit = 0, nmiss = 0;
    for (size_t i = 0; i < n; i++) {
        w->flags[i] = 0;
        w->res[i].offset = 0;
        w->res[i].length = -EIO;
        if (!ctx->file_failed &&
            fr_ocache_lookup(c, paths[i], hints ? hints[i] : -1, &w->ents[i])) {
            fr_ocache_data_path(c, paths[i], data_path(w, i));
            w->hit[nhit++] = i;
        } else {
            w->miss[nmiss++] = i;
        }
    }
    read_hits(ctx, paths, w->hit, nhit, batch, batch, w->miss, &nmiss);

    size_t nfetch = 0, nwait = 0, nlate = 0, ndirect = 0, nheld = 0;
    for (size_t m = 0; m < nmiss; m++) {
        size_t i = w->miss[m];
        w->stripes[i] = fr_ocache_stripe(c, paths[i]);
        int got = fr_ocache_trylock(c, w->stripes[i]);
        if (got == 0) {
            w->wait[nwait++] = ((size_t)w->stripes[i] << WAIT_SHIFT) | i;
            continue;
        }
        if (got < 0)
            w->flags[i] |= CW_UNLOCKED; /* cannot lock: fetch, do not store */
        else
            w->held[nheld++] = w->stripes[i];
        if (got == 1 && !(w->flags[i] & CW_DAMAGED) &&
            fr_ocache_lookup(c, paths[i], hints ? hints[i] : -1, &w->ents[i])) {
            fr_ocache_data_path(c, paths[i], data_path(w, i));
            w->late[nlate++] = i;
        } else {
            w->fetch[nfetch++] = i;
        }
    }
    rc = fetch_objects(ctx, paths, hints, w->fetch, nfetch, batch, 1);
    unlock_held(ctx, &nheld);
    if (rc)
        return rc;

    /* Objects another process is fetching: wait for it, one lock at a
     * time in stripe order (a stripe shared by two samples is taken once). */
    qsort(w->wait, nwait, sizeof(*w->wait), by_value);
    nfetch = 0;
    for (size_t m = 0; m < nwait; m++) {
        size_t i = w->wait[m] & (((size_t)1 << WAIT_SHIFT) - 1);
        unsigned stripe = w->stripes[i];
        int got = nheld && w->held[nheld - 1] == stripe ? 1 : fr_ocache_lock(c, stripe);
        if (got == 1 && !(nheld && w->held[nheld - 1] == stripe))
            w->held[nheld++] = stripe;
        if (got != 1)
            w->flags[i] |= CW_UNLOCKED;
        ctx->cache_waits++;
        if (got == 1 && !(w->flags[i] & CW_DAMAGED) &&
            fr_ocache_lookup(c, paths[i], hints ? hints[i] : -1, &w->ents[i])) {
            fr_ocache_data_path(c, paths[i], data_path(w, i));
            w->late[nlate++] = i;
        } else {
            w->fetch[nfetch++] = i; /* its writer failed or died: ours to fetch */
        }
    }
    rc = fetch_objects(ctx, paths, hints, w->fetch, nfetch, batch, 1);
    unlock_held(ctx, &nheld);
    if (rc)
        return rc;

    read_hits(ctx, paths, w->late, nlate, &ctx->scratch, batch, w->direct, &ndirect);
    rc = fetch_objects(ctx, paths, hints, w->direct, ndirect, batch, 0);
    if (rc)
        return rc;

    memcpy(batch->samples, w->res, n * sizeof(*w->res));
    batch->count = n;
    /* Only a call that stored entries can have passed the limit (its
     * check costs three system calls: not for an epoch of hits). */
    if (ctx->cache_bytes_written != written_before && fr_ocache_over(c)) {
        long gone = fr_ocache_evict(c);
        if (gone > 0)
            ctx->cache_evictions += gone;
    }
    return 0;
}

void fr_ctx_cache_work_free(cache_work *w)
{
    free(w->res);
    free(w->hit);
    free(w->miss);
    free(w->fetch);
    free(w->wait);
    free(w->late);
    free(w->direct);
    free(w->stripes);
    free(w->held);
    free(w->paths);
    free(w->hints);
    free(w->ents);
    free(w->flags);
    free(w->data_paths);
    free(w->notes);
}
