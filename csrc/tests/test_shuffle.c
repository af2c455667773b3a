/* fr_permutation: every draw is a permutation (n = 0, 1, 2, and large),
 * one (seed, epoch) always gives the same order, other seeds and epochs
 * give other orders, and positions are uniform: over 20,000 draws of n = 8
 * each value lands at each position about 1/8 of the time (chi-square).
 * fr_buffer_shuffle: a permutation of the items given (any values), the
 * same for one (seed, epoch), other for others, item k never before
 * position k - fill + 1, fill 1 keeps the order, fill >= n mixes the whole
 * list, fill 0 is refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

int main(void)
{
    static const size_t sizes[] = {0, 1, 2, 3, 1000, 100003};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        int64_t *a = malloc((n ? n : 1) * sizeof(*a)), *b = malloc((n ? n : 1) * sizeof(*b));
        CHECK(a && b);
        fr_permutation(42, 7, a, n);
        CHECK(fr_test_is_permutation(a, n));
        fr_permutation(42, 7, b, n);
        CHECK(memcmp(a, b, n * sizeof(*a)) == 0); /* deterministic */
        if (n >= 1000) {
            fr_permutation(42, 8, b, n); /* the next epoch */
            CHECK(fr_test_is_permutation(b, n) && memcmp(a, b, n * sizeof(*a)) != 0);
            fr_permutation(43, 7, b, n); /* another seed */
            CHECK(fr_test_is_permutation(b, n) && memcmp(a, b, n * sizeof(*a)) != 0);
            fr_permutation(UINT64_MAX, UINT64_MAX, b, n);
            CHECK(fr_test_is_permutation(b, n));
        }
        free(a);
        free(b);
    }

    static const size_t fills[] = {1, 2, 7, 64, 1000, 5000};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        for (size_t f = 0; f < sizeof(fills) / sizeof(fills[0]); f++) {
            size_t fill = fills[f];
            int64_t *a = malloc((n ? n : 1) * sizeof(*a)), *b = malloc((n ? n : 1) * sizeof(*b));
            CHECK(a && b);
            /* The items are indices offset by 10, so the shuffle moves
             * values, not positions. */
            for (size_t i = 0; i < n; i++)
                a[i] = b[i] = (int64_t)i + 10;
            CHECK(fr_buffer_shuffle(5, 3, a, n, fill) == 0);
            CHECK(fr_buffer_shuffle(5, 3, b, n, fill) == 0);
            CHECK(memcmp(a, b, n * sizeof(*a)) == 0); /* deterministic */
            for (size_t i = 0; i < n; i++)
                a[i] -= 10;
            CHECK(fr_test_is_permutation(a, n));
            int bounded = 1, moved = 0;
            for (size_t pos = 0; pos < n; pos++) {
                bounded &= (size_t)a[pos] < pos + fill; /* item k at pos >= k - fill + 1 */
                moved |= a[pos] != (int64_t)pos;
            }
            CHECK(bounded);
            CHECK(moved == (fill > 1 && n > 1) || n < 8); /* tiny lists may come out in order */
            if (n >= 1000 && fill > 1) {
                for (size_t i = 0; i < n; i++)
                    b[i] = (int64_t)i + 10;
                CHECK(fr_buffer_shuffle(5, 4, b, n, fill) == 0); /* the next epoch */
                for (size_t i = 0; i < n; i++)
                    b[i] -= 10;
                CHECK(fr_test_is_permutation(b, n) && memcmp(a, b, n * sizeof(*a)) != 0);
            }
            free(a);
            free(b);
        }
    }
    int64_t one = 0;
    CHECK(fr_buffer_shuffle(5, 3, &one, 1, 0) == -EINVAL);

    /* Uniform positions: counts[v][pos] over many epochs of one seed. */
    enum { N = 8, DRAWS = 20000 };
    static unsigned counts[N][N];
    int64_t p[N];
    for (uint64_t e = 0; e < DRAWS; e++) {
        fr_permutation(1, e, p, N);
        for (int pos = 0; pos < N; pos++)
            counts[p[pos]][pos]++;
    }
    double chi2 = 0, expect = (double)DRAWS / N;
    for (int v = 0; v < N; v++)
        for (int pos = 0; pos < N; pos++)
            chi2 += (counts[v][pos] - expect) * (counts[v][pos] - expect) / expect;
    /* 49 degrees of freedom: the 99.99th percentile is about 95. */
    printf("chi-square over %d x %d cells: %.1f\n", N, N, chi2);
    CHECK(chi2 < 95.0);
    return fr_test_finish("test_shuffle");
}
