/* Epoch orders shared by every reader (see fr_permutation and
 * fr_buffer_shuffle in fastread.h): the Python readers and the DALI
 * operators draw the same order for the same (seed, epoch), so a seeded
 * shuffle does not depend on which path reads it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "fastread.h"

/* xoshiro256** (Blackman and Vigna): 256 bits of state, seeded below by
 * splitmix64 as its authors recommend. */
typedef struct xoshiro256 {
    uint64_t s[4];
} xoshiro256;

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(xoshiro256 *g)
{
    uint64_t *s = g->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, bound), bound > 0: draws below the largest multiple of
 * bound are kept, so every value is equally likely. */
static uint64_t below(xoshiro256 *g, uint64_t bound)
{
    const uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t r = xoshiro_next(g);
        if (r >= threshold)
            return r % bound;
    }
}

/* The generator of one (seed, epoch). The seed and the epoch each pass
 * through splitmix64 before they are combined, so neighbouring seeds or
 * epochs start far apart. */
static void seed_epoch(xoshiro256 *g, uint64_t seed, uint64_t epoch)
{
    uint64_t a = seed, b = epoch ^ 0x6A09E667F3BCC909ull;
    uint64_t mix = fr_splitmix64(&a) ^ rotl(fr_splitmix64(&b), 32);
    for (int i = 0; i < 4; i++)
        g->s[i] = fr_splitmix64(&mix);
}

void fr_permutation(uint64_t seed, uint64_t epoch, int64_t *out, size_t n)
{
    xoshiro256 g;
    seed_epoch(&g, seed, epoch);
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)i;
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates, from the end */
        size_t j = (size_t)below(&g, (uint64_t)i);
        int64_t t = out[i - 1];
        out[i - 1] = out[j];
        out[j] = t;
    }
}

int fr_buffer_shuffle(uint64_t seed, uint64_t epoch, int64_t *items, size_t n, size_t fill)
{
    if (fill == 0)
        return -EINVAL;
    if (fill > n)
        fill = n;
    if (n < 2)
        return 0;
    int64_t *buffer = malloc(fill * sizeof(*buffer));
    if (!buffer)
        return -ENOMEM;
    /* A different stream from fr_permutation's for the same (seed, epoch). */
    xoshiro256 g;
    seed_epoch(&g, seed ^ 0xB5AD4ECEDA1CE2A9ull, epoch);
    memcpy(buffer, items, fill * sizeof(*buffer));
    size_t held = fill, next = fill;
    /* Output i overwrites items[i], which is already in the buffer or out:
     * next > i at every step (next starts at fill >= 1 and grows with i
     * until it reaches n). */
    for (size_t i = 0; i < n; i++) {
        size_t j = (size_t)below(&g, (uint64_t)held);
        items[i] = buffer[j];
        if (next < n)
            buffer[j] = items[next++];
        else
            buffer[j] = buffer[--held];
    }
    free(buffer);
    return 0;
}
