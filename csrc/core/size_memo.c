/* Remembered file sizes: an open-addressing table of 64-bit path hashes (see
 * size_memo.h).
 *
 * Only the hash is kept, not the path: a lookup then touches one table slot
 * and no string, and the slots of a whole list are prefetched before they
 * are probed. On the 16-core H200 a version that kept and compared paths
 * spent about 200 ns a path in cache misses (50 us a list of 256, all the
 * time remembering saved). Two paths with the same hash (odds about n^2 /
 * 2^65) share a size: for one of them a wrong hint, which costs a read
 * again, never bytes (see fr_read_files). */
#include "core/size_memo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PRESIZE_SLOTS ((size_t)1 << 20) /* 16 MiB of table at most up front */
#define DELETED ((int64_t)INT64_MIN)    /* a forgotten path's size */
#define PREFETCH_AHEAD 16               /* slots prefetched ahead of the probe */

typedef struct memo_entry {
    uint64_t hash; /* 0: empty slot */
    int64_t size;  /* DELETED: forgotten (the slot stays taken) */
} memo_entry;

struct fr_size_memo {
    memo_entry *slots;
    size_t cap;   /* a power of two; at most half full */
    size_t count; /* entries, forgotten ones included */
    size_t max_paths;
};

/* A hash of the path, never 0 (0 marks an empty slot): eight bytes a step
 * (multiply, xor-shift), a few ns for a typical 40-80 byte path. */
uint64_t fr_size_memo_hash(const char *p)
{
    size_t len = strlen(p);
    uint64_t h = 0x9E3779B97F4A7C15ull ^ len;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, len);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    return h ? h : 1;
}

fr_size_memo *fr_size_memo_new(size_t max_paths)
{
    fr_size_memo *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    /* Room for max_paths at the start (up to PRESIZE_SLOTS): calloc's
     * untouched pages cost nothing, and a table that doubles as it fills
     * moves every entry each time, at a cache miss each (2-core VM, a first
     * epoch of 20,000 files in lists of 256: 16% slower reads). */
    m->cap = 1024;
    while (m->cap < PRESIZE_SLOTS && m->cap / 2 < max_paths)
        m->cap *= 2;
    m->slots = calloc(m->cap, sizeof(*m->slots));
    if (!m->slots) {
        m->cap = 1024;
        m->slots = calloc(m->cap, sizeof(*m->slots));
    }
    if (!m->slots) {
        free(m);
        return NULL;
    }
    m->max_paths = max_paths;
    return m;
}

void fr_size_memo_free(fr_size_memo *m)
{
    if (!m)
        return;
    free(m->slots);
    free(m);
}

size_t fr_size_memo_count(const fr_size_memo *m) { return m->count; }

static memo_entry *find(const fr_size_memo *m, uint64_t h)
{
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        memo_entry *e = &m->slots[i];
        if (e->hash == 0 || e->hash == h)
            return e;
    }
}

size_t fr_size_memo_lookup(const fr_size_memo *m, const char *const *paths, size_t n,
                           uint64_t *hashes, int64_t *sizes)
{
    size_t found = 0, mask = m->cap - 1;
    for (size_t i = 0; i < n && i < PREFETCH_AHEAD; i++) {
        hashes[i] = fr_size_memo_hash(paths[i]);
        __builtin_prefetch(&m->slots[hashes[i] & mask]);
    }
    for (size_t i = 0; i < n; i++) {
        size_t ahead = i + PREFETCH_AHEAD;
        if (ahead < n) {
            hashes[ahead] = fr_size_memo_hash(paths[ahead]);
            __builtin_prefetch(&m->slots[hashes[ahead] & mask]);
        }
        const memo_entry *e = find(m, hashes[i]);
        sizes[i] = e->hash && e->size != DELETED ? e->size : -1;
        found += sizes[i] >= 0;
    }
    return found;
}

/* Doubles the table; 0 or -ENOMEM (then the memo stays as it was). */
static int grow(fr_size_memo *m)
{
    size_t cap = m->cap * 2;
    memo_entry *slots = calloc(cap, sizeof(*slots));
    if (!slots)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        memo_entry *e = &m->slots[i];
        if (!e->hash)
            continue;
        size_t k = (size_t)e->hash & (cap - 1);
        while (slots[k].hash)
            k = (k + 1) & (cap - 1);
        slots[k] = *e;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

void fr_size_memo_store(fr_size_memo *m, const uint64_t *hashes, const fr_sample *samples,
                        const int64_t *looked_up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (looked_up[i] >= 0 && samples[i].length == looked_up[i])
            continue; /* remembered as it is */
        memo_entry *e = find(m, hashes[i]);
        int64_t size = samples[i].length >= 0 ? samples[i].length : DELETED;
        if (e->hash) {
            e->size = size;
            continue;
        }
        if (size == DELETED || m->count >= m->max_paths)
            continue;
        if (2 * (m->count + 1) > m->cap) {
            if (grow(m) != 0)
                return;
            e = find(m, hashes[i]);
        }
        e->hash = hashes[i];
        e->size = size;
        m->count++;
    }
}
