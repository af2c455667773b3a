/*
 * An LRU of open descriptors, keyed by a file's index in a caller's table
 * of paths (fr_read_file_ranges): a context reading ranges of thousands of
 * shards keeps at most `cap` of them open, the most recently used, so the
 * process's descriptors stay bounded whatever the shard count.
 * Internal: not part of the public API. Not thread-safe: one context's
 * calling thread looks up and inserts; helper threads only use the
 * descriptors it handed them for the phase in progress (pinned entries are
 * never evicted while pinned).
 */
#ifndef FASTREAD_FD_CACHE_H
#define FASTREAD_FD_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fr_fd_entry {
    uint32_t file; /* index in the caller's paths */
    int fd;
    int pinned;            /* in use by the phase in progress */
    uint32_t pin_at;       /* its place in the cache's pinned list, while pinned */
    uint32_t prev, next;   /* LRU list (most recent at head); UINT32_MAX: none */
    uint32_t hnext;        /* hash chain */
} fr_fd_entry;

typedef struct fr_fd_cache {
    fr_fd_entry *entries;  /* cap of them */
    uint32_t *buckets;     /* nbuckets heads (power of two) */
    uint32_t nbuckets;
    uint32_t cap, used;
    uint32_t head, tail;   /* LRU ends */
    uint32_t free_head;    /* unused entries */
    /* The entries pinned in the phase in progress (each once): unpinning
     * them all costs what the phase used, not the cache's size (a table
     * of 10^4 shards held open, unpinned once a call, walked all 10^4). */
    uint32_t *pinned_list; /* cap of them */
    uint32_t npinned;
    /* The paths the keys index; a different table (another call's) empties
     * the cache first, so a key never names another file. */
    const void *table;
    long opens, hits, evictions;
    /* Set after init: the values are not descriptors the cache owns but
     * slots of the caller's (io_uring's registered file table), never
     * closed: an evicted or dropped one is only forgotten. */
    int keys_only;
} fr_fd_cache;

/* 0 or -ENOMEM; cap >= 1. */
int fr_fd_cache_init(fr_fd_cache *c, uint32_t cap);
/* Closes every descriptor and frees the cache. */
void fr_fd_cache_free(fr_fd_cache *c);
/* Closes every descriptor (keeps the cache usable). */
void fr_fd_cache_clear(fr_fd_cache *c);
/* Empties the cache if `table` is not the one its keys index. */
void fr_fd_cache_use_table(fr_fd_cache *c, const void *table);
/* The descriptor of `file`, made most recent and pinned; -1 if not cached. */
int fr_fd_cache_get(fr_fd_cache *c, uint32_t file);
/* Room for `k` more entries: evicts (closes) the least recent unpinned
 * ones until used + k <= cap, before the k files are opened, so the
 * descriptors open never pass cap. 0, or -EBUSY when the pinned entries
 * leave too little room. */
int fr_fd_cache_reserve(fr_fd_cache *c, uint32_t k);
/* fr_fd_cache_reserve, but the evicted descriptors (at most k) are handed
 * to the caller in victims[0 .. *nvictims) to close, not closed here: a
 * pool closes them in parallel with its opens instead of one by one on the
 * calling thread (a shuffled epoch over small shards evicts one a sample). */
int fr_fd_cache_reserve_take(fr_fd_cache *c, uint32_t k, int *victims, uint32_t *nvictims);
/* Adds `fd` for `file` (not cached), most recent and pinned, evicting one
 * entry if full; the cache owns and closes it. 0, or -EBUSY (every entry
 * pinned: fd is not taken). */
int fr_fd_cache_put(fr_fd_cache *c, uint32_t file, int fd);
/* Unpins every entry (the phase is over): O(entries pinned). */
void fr_fd_cache_unpin_all(fr_fd_cache *c);
/* Drops `file`'s entry, closing its descriptor (a read through it failed:
 * the next use opens the path again). */
void fr_fd_cache_drop(fr_fd_cache *c, uint32_t file);

/* The directory of a call's shards, open (O_PATH) for that call so that its
 * shards are opened relative to it (openat of the last component: no walk
 * of the whole path each). Used by psync's and io_uring's file ranges. Not
 * thread-safe: one per engine state. */
typedef struct fr_shard_dir {
    int fd;          /* -1: none; shards open by their full paths */
    const char *dir; /* borrowed: the path it was opened from */
    size_t len;      /* bytes of `dir` before its last '/' */
} fr_shard_dir;

static inline void fr_shard_dir_init(fr_shard_dir *d)
{
    d->fd = -1;
    d->dir = NULL;
    d->len = 0;
}
/* Opens the directory of `path` (borrowed until fr_shard_dir_close). Where
 * it has none, is too long or does not open, d stays without one: each
 * shard's own open then says why, by its own path. */
void fr_shard_dir_open(fr_shard_dir *d, const char *path);
/* What to openat `path` by: its name inside d's directory with *dirfd = d's
 * descriptor where `path` is a file directly in it, else path itself with
 * *dirfd = AT_FDCWD. */
const char *fr_shard_dir_name(const fr_shard_dir *d, const char *path, int *dirfd);
void fr_shard_dir_close(fr_shard_dir *d);

#endif
