/*
 * The sizes of files a context read without size hints, by path, so that its
 * next read of the same paths can skip sizing them (a training loop reads the
 * same list every epoch). A remembered size is a hint: an engine that finds
 * a file changed reads it again, so a stale entry costs time, never bytes.
 *
 * Bounded: at most `max_paths` paths; once full, sizes of paths already
 * known are updated and new paths are not added. One memo per context, used
 * by one thread at a time (the context's caller); not thread-safe.
 */
#ifndef FASTREAD_SIZE_MEMO_H
#define FASTREAD_SIZE_MEMO_H

#include <stddef.h>
#include <stdint.h>

#include "fastread.h"

typedef struct fr_size_memo fr_size_memo;

/* NULL on ENOMEM. */
fr_size_memo *fr_size_memo_new(size_t max_paths);
void fr_size_memo_free(fr_size_memo *memo);
/* The hash a path is remembered by. */
uint64_t fr_size_memo_hash(const char *path);
/* sizes[i] = the remembered size of paths[i], or -1, and hashes[i] its
 * path's hash (for fr_size_memo_store); returns how many were found. */
size_t fr_size_memo_lookup(const fr_size_memo *memo, const char *const *paths, size_t n,
                           uint64_t *hashes, int64_t *sizes);
/* After a read of the paths looked up (hashes, and looked_up: the sizes the
 * lookup gave): remembers samples[i].length for every sample read whole
 * (length >= 0) that differs from looked_up[i], and forgets the paths of
 * failed ones. Out of memory it simply remembers less. */
void fr_size_memo_store(fr_size_memo *memo, const uint64_t *hashes, const fr_sample *samples,
                        const int64_t *looked_up, size_t n);
size_t fr_size_memo_count(const fr_size_memo *memo);

#endif
