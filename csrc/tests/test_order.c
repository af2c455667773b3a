/* fr_order: FULL is a permutation for every n tried (the table up to
 * FR_ORDER_TABLE_MAX, the Feistel network past it: 0, 1, 2, primes,
 * powers of two and their neighbours, 10^6 checked whole), fr_order_at
 * and fr_order_fill agree on any slice, fr_permutation is FULL's order
 * whole, one (seed, epoch) gives one order and others another. BLOCK is a
 * permutation whose every window of window*block positions holds whole
 * blocks (tail block included), and windows of 1 block keep each block's
 * samples together. Bad arguments are refused. A Feistel order's
 * positions are uniform (chi-square over value buckets x position
 * buckets), so a broken key schedule or round function fails. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static uint64_t next_random(uint64_t *state)
{
    uint64_t x = *state += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The whole order of n samples, or NULL (counted as a failure). */
static int64_t *whole(uint64_t seed, uint64_t epoch, size_t n, fr_order_mode mode, uint64_t block,
                      uint64_t window)
{
    fr_order *o = NULL;
    int rc = fr_order_open(seed, epoch, n, mode, block, window, &o);
    CHECK(rc == 0);
    if (rc)
        return NULL;
    CHECK(fr_order_size(o) == n);
    int64_t *p = malloc((n ? n : 1) * sizeof(*p));
    CHECK(p != NULL);
    if (p) {
        CHECK(fr_order_fill(o, 0, n, p) == 0);
        /* Any position alone and any slice agree with the whole. */
        for (size_t i = 0; i < n; i += 1 + n / 97)
            CHECK(fr_order_at(o, i) == p[i]);
        if (n > 10) {
            int64_t part[7];
            size_t first = n / 3;
            CHECK(fr_order_fill(o, first, 7, part) == 0);
            CHECK(memcmp(part, p + first, sizeof(part)) == 0);
        }
        CHECK(fr_order_at(o, n) == -1);
        CHECK(fr_order_fill(o, n, 1, p) == -ERANGE);
        CHECK(fr_order_fill(o, n, 0, p) == 0);
    }
    fr_order_close(o);
    return p;
}

static void check_full(size_t n)
{
    int64_t *a = whole(42, 7, n, FR_ORDER_FULL, 0, 0);
    int64_t *b = whole(42, 8, n, FR_ORDER_FULL, 0, 0);
    int64_t *c = malloc((n ? n : 1) * sizeof(*c));
    if (a && b && c) {
        CHECK(fr_test_is_permutation(a, n));
        CHECK(fr_test_is_permutation(b, n));
        if (n > 8)
            CHECK(memcmp(a, b, n * sizeof(*a)) != 0); /* the next epoch differs */
        fr_permutation(42, 7, c, n);
        CHECK(memcmp(a, c, n * sizeof(*a)) == 0);
        if (n > 8) {
            fr_permutation(43, 7, c, n); /* another seed differs */
            CHECK(memcmp(a, c, n * sizeof(*a)) != 0);
        }
    }
    free(a);
    free(b);
    free(c);
}

static void check_block(size_t n, uint64_t block, uint64_t window)
{
    int64_t *p = whole(9, 3, n, FR_ORDER_BLOCK, block, window);
    if (!p)
        return;
    CHECK(fr_test_is_permutation(p, n));
    size_t blocks = (n + block - 1) / block;
    /* Every block's samples lie within one window's span of positions: its
     * first and last positions at most window*block - 1 apart, and the
     * block's samples all present. */
    size_t *lo = malloc((blocks ? blocks : 1) * sizeof(*lo));
    size_t *hi = malloc((blocks ? blocks : 1) * sizeof(*hi));
    if (lo && hi) {
        for (size_t b = 0; b < blocks; b++) {
            lo[b] = SIZE_MAX;
            hi[b] = 0;
        }
        for (size_t i = 0; i < n; i++) {
            size_t b = (size_t)p[i] / block;
            if (i < lo[b])
                lo[b] = i;
            if (i > hi[b])
                hi[b] = i;
        }
        for (size_t b = 0; b < blocks; b++)
            CHECK(hi[b] - lo[b] < window * block);
        if (window == 1) /* each block's samples are consecutive positions */
            for (size_t b = 0; b + 1 < blocks; b++)
                CHECK(hi[b] - lo[b] == block - 1);
    }
    free(lo);
    free(hi);
    free(p);
}

int main(void)
{
    const size_t sizes[] = {0,      1,      2,      3,      5,      7,       8,       13,
                            255,    256,    257,    1000,   65535,  65536,   65537,   65539,
                            131071, 131072, 131073, 262147, 999983, 1000000, 1048575, 1048577};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(*sizes); i++)
        check_full(sizes[i]);

    /* Past the table: 10^9 samples, sampled positions are distinct and in
     * range (a bijection cannot collide; a sample of 2^16 positions of a
     * broken one would). */
    {
        fr_order *o = NULL;
        const uint64_t n = 1000000000ull;
        CHECK(fr_order_open(1, 2, n, FR_ORDER_FULL, 0, 0, &o) == 0);
        CHECK(fr_order_memory(o) < 1024);
        enum { K = 1 << 16 };
        int64_t *got = malloc(K * sizeof(*got));
        CHECK(got != NULL);
        if (got && o) {
            uint64_t state = 5;
            int ok = 1;
            for (size_t i = 0; i < K; i++) {
                uint64_t stride = n / K; /* distinct positions, one per stride */
                uint64_t pos = i * stride + next_random(&state) % stride;
                got[i] = fr_order_at(o, pos);
                ok &= got[i] >= 0 && (uint64_t)got[i] < n;
            }
            CHECK(ok);
            qsort(got, K, sizeof(*got), cmp_int64);
            size_t dup = 0;
            for (size_t i = 1; i < K; i++)
                dup += got[i] == got[i - 1];
            CHECK(dup == 0);
        }
        free(got);
        fr_order_close(o);
    }

    const size_t bn[] = {1, 7, 64, 100, 1000, 1001, 65537 * 3 + 5, 300000};
    const uint64_t bb[] = {1, 4, 64};
    const uint64_t bw[] = {1, 3, 16};
    for (size_t i = 0; i < sizeof(bn) / sizeof(*bn); i++)
        for (size_t j = 0; j < 3; j++)
            for (size_t k = 0; k < 3; k++)
                check_block(bn[i], bb[j], bw[k]);

    fr_order *o = (fr_order *)1;
    CHECK(fr_order_open(1, 1, 10, FR_ORDER_BLOCK, 0, 1, &o) == -EINVAL && o == NULL);
    CHECK(fr_order_open(1, 1, 10, FR_ORDER_BLOCK, 1, 0, &o) == -EINVAL);
    CHECK(fr_order_open(1, 1, 10, (fr_order_mode)7, 1, 1, &o) == -EINVAL);
    CHECK(fr_order_open(1, 1, (uint64_t)INT64_MAX + 1, FR_ORDER_FULL, 0, 0, &o) == -EOVERFLOW);
    CHECK(fr_order_open(1, 1, 10, FR_ORDER_BLOCK, UINT64_MAX / 2, 4, &o) == -EOVERFLOW);
    CHECK(fr_order_open(1, 1, 10, FR_ORDER_SEQUENTIAL, 0, 0, &o) == 0);
    if (o) {
        int64_t p[10];
        CHECK(fr_order_fill(o, 0, 10, p) == 0);
        for (int i = 0; i < 10; i++)
            CHECK(p[i] == i);
        fr_order_close(o);
    }
    fr_order_close(NULL);

    /* Uniform positions past the table: value bucket x position bucket
     * counts over many epochs of n = 70001 (the network). */
    enum { B = 8, EPOCHS = 64 };
    const size_t n = 70001;
    static unsigned counts[B][B];
    int64_t *p = malloc(n * sizeof(*p));
    CHECK(p != NULL);
    for (uint64_t e = 0; p && e < EPOCHS; e++) {
        fr_permutation(3, e, p, n);
        for (size_t pos = 0; pos < n; pos++)
            counts[(size_t)p[pos] * B / n][pos * B / n]++;
    }
    free(p);
    /* A cell holds n * EPOCHS / B^2 draws of a hypergeometric-like count;
     * treat it as chi-square with 49 degrees of freedom (conservative: the
     * permutation's marginals are fixed). */
    double chi2 = 0, expect = (double)n * EPOCHS / (B * B);
    for (int v = 0; v < B; v++)
        for (int q = 0; q < B; q++)
            chi2 += (counts[v][q] - expect) * (counts[v][q] - expect) / expect;
    printf("chi-square of the network's positions over %d x %d cells: %.1f\n", B, B, chi2);
    CHECK(chi2 < 95.0);
    return fr_test_finish("test_order");
}
