/* Epoch orders shared by every reader (fr_order, fr_permutation and
 * fr_buffer_shuffle in fastread.h): the Python readers and the DALI
 * operators draw the same order for the same (seed, epoch), so a seeded
 * shuffle does not depend on which path reads it.
 *
 * Up to FR_ORDER_TABLE_MAX samples an epoch's order is a table, drawn by
 * Fisher-Yates (exactly uniform). Beyond, it is a keyed bijection computed
 * per position: a Feistel network on the next power of two above n, with
 * cycle walking (positions that land at or past n are encrypted again
 * until they land inside; the power of two is below 2n, so fewer than two
 * rounds of the network a position on average). No N-element array: the
 * order of 10^9 samples costs a few hundred bytes. */
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

/* Fisher-Yates over (seed, epoch)'s generator: out[0..n) a uniformly
 * drawn permutation of 0..n-1. */
static void fisher_yates(uint64_t seed, uint64_t epoch, int64_t *out, size_t n)
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

/* ------------------------------------------------------------ fr_order */

/* Salts that separate the streams drawn from one (seed, epoch): the full
 * order's keys, the block order's, the windows'. fr_permutation's table
 * (salt 0) is the one fr_permutation always drew. */
#define SALT_BLOCKS 0x243F6A8885A308D3ull
#define SALT_WINDOWS 0x13198A2E03707344ull
#define FEISTEL_ROUNDS 8 /* even: the halves' widths come back */

/* splitmix64's finaliser (Stafford's mix 13): a bijective, avalanching
 * mix of 64 bits, the Feistel round function. */
static inline uint64_t mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A bijection of [0, n): a table (n <= FR_ORDER_TABLE_MAX) or a keyed
 * Feistel network over [0, 2^(lbits + rbits)) walked back into [0, n). */
typedef struct bijection {
    uint64_t n;
    int64_t *table; /* owned; NULL: the network */
    unsigned lbits, rbits;
    uint64_t keys[FEISTEL_ROUNDS];
} bijection;

/* Round keys of the network for one (seed, epoch, salt, tweak). */
static void feistel_keys(uint64_t seed, uint64_t epoch, uint64_t salt, uint64_t tweak,
                         uint64_t keys[FEISTEL_ROUNDS])
{
    uint64_t a = seed ^ salt, b = epoch ^ 0x6A09E667F3BCC909ull, c = tweak ^ salt;
    uint64_t state = fr_splitmix64(&a) ^ rotl(fr_splitmix64(&b), 32) ^ rotl(fr_splitmix64(&c), 17);
    for (int i = 0; i < FEISTEL_ROUNDS; i++)
        keys[i] = fr_splitmix64(&state);
}

/* The network's shape for [0, n), n >= 1: the smallest power of two >= n
 * (at least 4, so each half holds a bit), split into two halves. */
static void feistel_shape(uint64_t n, unsigned *lbits, unsigned *rbits)
{
    unsigned bits = 2;
    while (bits < 64 && (1ull << bits) < n)
        bits++;
    *lbits = bits / 2;
    *rbits = bits - bits / 2;
}

static inline uint64_t mask_bits(unsigned bits) { return bits >= 64 ? ~0ull : (1ull << bits) - 1; }

/* One pass of the (unbalanced) network: (L, R) -> (R, L ^ F(R)), the
 * halves swapping widths each round. */
static uint64_t feistel_encrypt(const uint64_t keys[FEISTEL_ROUNDS], unsigned lbits,
                                unsigned rbits, uint64_t x)
{
    uint64_t l = x >> rbits, r = x & mask_bits(rbits);
    unsigned wl = lbits, wr = rbits;
    for (int i = 0; i < FEISTEL_ROUNDS; i++) {
        uint64_t f = mix64(r ^ keys[i]) & mask_bits(wl);
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
        unsigned t = wl;
        wl = wr;
        wr = t;
    }
    return (l << wr) | r;
}

static uint64_t feistel_decrypt(const uint64_t keys[FEISTEL_ROUNDS], unsigned lbits,
                                unsigned rbits, uint64_t x)
{
    /* After an even number of rounds the widths are (lbits, rbits) again. */
    uint64_t l = x >> rbits, r = x & mask_bits(rbits);
    unsigned wl = lbits, wr = rbits;
    for (int i = FEISTEL_ROUNDS - 1; i >= 0; i--) {
        /* Before round i: L0 had wr bits (R now), R0 had wl bits (L now). */
        uint64_t r0 = l;
        uint64_t l0 = r ^ (mix64(r0 ^ keys[i]) & mask_bits(wr));
        l = l0;
        r = r0;
        unsigned t = wl;
        wl = wr;
        wr = t;
    }
    return (l << wr) | r;
}

/* Cycle walking: the network permutes [0, 2^bits) and n > 2^(bits-1) (or
 * n <= 4), so following the cycle from x < n reaches a value < n in
 * fewer than two steps on average, and the walk is itself a bijection of
 * [0, n). */
static uint64_t walk_forward(const uint64_t keys[FEISTEL_ROUNDS], unsigned lbits, unsigned rbits,
                             uint64_t n, uint64_t x)
{
    do
        x = feistel_encrypt(keys, lbits, rbits, x);
    while (x >= n);
    return x;
}

static uint64_t walk_backward(const uint64_t keys[FEISTEL_ROUNDS], unsigned lbits,
                              unsigned rbits, uint64_t n, uint64_t x)
{
    do
        x = feistel_decrypt(keys, lbits, rbits, x);
    while (x >= n);
    return x;
}

static int bijection_init(bijection *b, uint64_t seed, uint64_t epoch, uint64_t salt, uint64_t n)
{
    memset(b, 0, sizeof(*b));
    b->n = n;
    if (n <= FR_ORDER_TABLE_MAX) {
        b->table = malloc((n ? n : 1) * sizeof(*b->table));
        if (!b->table)
            return -ENOMEM;
        fisher_yates(seed ^ salt, epoch, b->table, (size_t)n);
        return 0;
    }
    feistel_shape(n, &b->lbits, &b->rbits);
    feistel_keys(seed, epoch, salt, 0, b->keys);
    return 0;
}

static inline uint64_t bijection_at(const bijection *b, uint64_t i)
{
    if (b->table)
        return (uint64_t)b->table[i];
    return walk_forward(b->keys, b->lbits, b->rbits, b->n, i);
}

/* Where value v is: bijection_at(b, result) == v. O(n) for a table (only
 * at open, n <= FR_ORDER_TABLE_MAX), O(1) for the network. */
static uint64_t bijection_find(const bijection *b, uint64_t v)
{
    if (b->table) {
        for (uint64_t i = 0; i < b->n; i++)
            if ((uint64_t)b->table[i] == v)
                return i;
        return 0; /* not reached: the table is a permutation */
    }
    return walk_backward(b->keys, b->lbits, b->rbits, b->n, v);
}

struct fr_order {
    uint64_t n;
    fr_order_mode mode;
    uint64_t seed, epoch;
    bijection order; /* FULL: of the samples; BLOCK: of the blocks */
    /* BLOCK: blocks of `block` samples (the last one `tail` samples when
     * tail > 0), windows of `window` consecutive blocks of the block order;
     * the short block sits in window `tail_window` at its place
     * `tail_slot`. */
    uint64_t block, window, blocks, windows, tail, tail_window, tail_slot;
};

int fr_order_open(uint64_t seed, uint64_t epoch, uint64_t n, fr_order_mode mode, uint64_t block,
                  uint64_t window, fr_order **out)
{
    *out = NULL;
    if (n > (uint64_t)INT64_MAX)
        return -EOVERFLOW;
    if (mode != FR_ORDER_SEQUENTIAL && mode != FR_ORDER_FULL && mode != FR_ORDER_BLOCK)
        return -EINVAL;
    if (mode == FR_ORDER_BLOCK && (block == 0 || window == 0))
        return -EINVAL;
    if (mode == FR_ORDER_BLOCK && block > (uint64_t)INT64_MAX / window)
        return -EOVERFLOW;
    fr_order *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->n = n;
    o->mode = mode;
    o->seed = seed;
    o->epoch = epoch;
    int rc = 0;
    if (mode == FR_ORDER_FULL && n > 0) {
        rc = bijection_init(&o->order, seed, epoch, 0, n);
    } else if (mode == FR_ORDER_BLOCK && n > 0) {
        o->block = block;
        o->window = window;
        o->blocks = n / block + (n % block != 0);
        o->windows = o->blocks / window + (o->blocks % window != 0);
        o->tail = n % block;
        rc = bijection_init(&o->order, seed, epoch, SALT_BLOCKS, o->blocks);
        if (rc == 0 && o->tail) {
            uint64_t q = bijection_find(&o->order, o->blocks - 1);
            o->tail_window = q / window;
            o->tail_slot = q % window;
        }
    }
    if (rc) {
        free(o->order.table);
        free(o);
        return rc;
    }
    *out = o;
    return 0;
}

void fr_order_close(fr_order *o)
{
    if (!o)
        return;
    free(o->order.table);
    free(o);
}

uint64_t fr_order_size(const fr_order *o) { return o->n; }

size_t fr_order_memory(const fr_order *o)
{
    return sizeof(*o) + (o->order.table ? (size_t)o->order.n * sizeof(*o->order.table) : 0);
}

/* The window keys of the last window asked for (fill's cache). */
typedef struct window_keys {
    uint64_t window; /* UINT64_MAX: none yet */
    uint64_t size;
    unsigned lbits, rbits;
    uint64_t keys[FEISTEL_ROUNDS];
} window_keys;

/* Samples in window k. */
static uint64_t window_size(const fr_order *o, uint64_t k)
{
    uint64_t blocks = k + 1 < o->windows ? o->window : o->blocks - k * o->window;
    uint64_t size = blocks * o->block;
    if (o->tail && k == o->tail_window)
        size -= o->block - o->tail;
    return size;
}

static int64_t block_at(const fr_order *o, uint64_t i, window_keys *wk)
{
    const uint64_t span = o->window * o->block; /* samples of a window without the short block */
    const uint64_t shortfall = o->tail ? o->block - o->tail : 0;
    /* Windows after the short block's start `shortfall` samples earlier. */
    uint64_t k;
    if (o->tail && o->tail_window + 1 < o->windows && i >= (o->tail_window + 1) * span - shortfall)
        k = (i + shortfall) / span;
    else
        k = i / span;
    uint64_t start = k * span - (o->tail && k > o->tail_window ? shortfall : 0);
    uint64_t j = i - start;
    if (wk->window != k) {
        wk->window = k;
        wk->size = window_size(o, k);
        feistel_shape(wk->size, &wk->lbits, &wk->rbits);
        feistel_keys(o->seed, o->epoch, SALT_WINDOWS, k, wk->keys);
    }
    uint64_t s = wk->size > 1 ? walk_forward(wk->keys, wk->lbits, wk->rbits, wk->size, j) : 0;
    /* Slot s of the window: its blocks' samples laid end to end, the short
     * block (if here) tail samples long at its place. */
    uint64_t m, off;
    if (o->tail && k == o->tail_window && s >= o->tail_slot * o->block) {
        uint64_t after = s - o->tail_slot * o->block;
        if (after < o->tail) {
            m = o->tail_slot;
            off = after;
        } else {
            after -= o->tail;
            m = o->tail_slot + 1 + after / o->block;
            off = after % o->block;
        }
    } else {
        m = s / o->block;
        off = s % o->block;
    }
    return (int64_t)(bijection_at(&o->order, k * o->window + m) * o->block + off);
}

int64_t fr_order_at(const fr_order *o, uint64_t pos)
{
    if (pos >= o->n)
        return -1;
    switch (o->mode) {
    case FR_ORDER_FULL:
        return (int64_t)bijection_at(&o->order, pos);
    case FR_ORDER_BLOCK: {
        window_keys wk = {.window = UINT64_MAX};
        return block_at(o, pos, &wk);
    }
    default:
        return (int64_t)pos;
    }
}

int fr_order_fill(const fr_order *o, uint64_t first, size_t count, int64_t *out)
{
    if (first > o->n || count > o->n - first)
        return -ERANGE;
    switch (o->mode) {
    case FR_ORDER_FULL:
        if (o->order.table) {
            memcpy(out, o->order.table + first, count * sizeof(*out));
        } else {
            for (size_t i = 0; i < count; i++)
                out[i] = (int64_t)bijection_at(&o->order, first + i);
        }
        break;
    case FR_ORDER_BLOCK: {
        window_keys wk = {.window = UINT64_MAX};
        for (size_t i = 0; i < count; i++)
            out[i] = block_at(o, first + i, &wk);
        break;
    }
    default:
        for (size_t i = 0; i < count; i++)
            out[i] = (int64_t)(first + i);
    }
    return 0;
}

void fr_permutation(uint64_t seed, uint64_t epoch, int64_t *out, size_t n)
{
    if (n <= FR_ORDER_TABLE_MAX) {
        fisher_yates(seed, epoch, out, n);
        return;
    }
    bijection b;
    memset(&b, 0, sizeof(b));
    b.n = n;
    feistel_shape(n, &b.lbits, &b.rbits);
    feistel_keys(seed, epoch, 0, 0, b.keys);
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)bijection_at(&b, i);
}
