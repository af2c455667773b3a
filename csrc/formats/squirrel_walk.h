/*
 * Squirrel MessagePack shards indexed in C: an inflated shard (a run of
 * MessagePack maps, one per sample) walked into columns, per sample its
 * byte range and per wanted key where its field lies, so the Python layer
 * decodes each distinct field layout once instead of every sample
 * (fastread.formats.squirrel documents the format; its Python walker is
 * the reference the tests compare with).
 *
 * The walk checks structure only: every value's extent within the shard
 * (bounds, counts, the unused byte 0xc1), the keys of each sample (str or
 * bin; a str must be UTF-8) and, for the wanted fields, a map's "data"
 * bin. What it does not decode (the contents of fields not wanted) it does
 * not judge. Anything it will not index (a malformed shard, a key of
 * another type, a wanted key missing) is an error naming the offset: the
 * caller redoes that shard with the reference, which words the error.
 *
 * Thread-safety: no shared state; may run on any thread.
 */
#ifndef FASTREAD_SQUIRREL_WALK_H
#define FASTREAD_SQUIRREL_WALK_H

#include <stddef.h>
#include <stdint.h>

/* Samples of one shard. Per sample i: start[i], length[i]; per wanted key
 * j (k of them), at i*k + j: the field's value [start + fa, start + fb),
 * and where it is a map holding a "data" bin, that payload's offset from
 * the sample's start in data_off (-1: none) and its length in data_len. */
typedef struct fr_sq_samples {
    size_t n, cap;
    int k;
    uint64_t *start, *length;
    uint64_t *fa, *fb;
    int64_t *data_off;
    uint64_t *data_len;
} fr_sq_samples;

void fr_sq_samples_free(fr_sq_samples *s);

/* Walks buf[0, len) for the keys keys[0..k) (UTF-8 bytes, key_len[j]).
 * 0; -EINVAL (err says what, *bad_at where); -ENOMEM. *out zeroed by the
 * caller, or freed and zeroed. */
int fr_sq_walk(const unsigned char *buf, uint64_t len, const char *const *keys,
               const size_t *key_len, int k, fr_sq_samples *out, uint64_t *bad_at, char *err,
               size_t err_len);

#endif
