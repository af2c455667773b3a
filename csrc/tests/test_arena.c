/* Arenas grow without losing bytes, keep the regions they moved out of
 * mapped; batches return to their pool when their last holder lets go, and
 * pools free everything once the last holder lets go. */
#include <stdio.h>
#include <string.h>

#include "harness.h"

int main(void)
{
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 10) == 0);
    CHECK(fr_arena_reserve(&b->arena, 1000) == 0);
    uint8_t *first = b->arena.base;
    memset(first, 0xAB, 1000);
    b->arena.used = 1000;
    uint64_t gen = b->arena.generation;
    CHECK(fr_arena_reserve(&b->arena, 64u << 20) == 0);
    CHECK(b->arena.generation != gen);
    CHECK(b->arena.capacity >= (64u << 20));
    CHECK(b->arena.base[0] == 0xAB && b->arena.base[999] == 0xAB);
    /* The old region is still mapped: reading it must not fault. */
    volatile uint8_t old = first[0];
    (void)old;

    /* A retained batch goes back to the pool only when its last holder
     * recycles it, and is not handed out again before. */
    fr_batch *held = fr_pool_get(pool);
    CHECK(fr_batch_prepare(held, 1) == 0);
    CHECK(fr_arena_reserve(&held->arena, 4096) == 0);
    fr_batch_retain(held);
    fr_batch_retain(held);
    fr_batch_recycle(held);
    fr_batch_recycle(held);
    CHECK(fr_pool_bytes(pool) == 0);
    fr_batch *other = fr_pool_get(pool);
    CHECK(other != held);
    fr_batch_recycle(other);
    fr_batch_recycle(held);
    CHECK(fr_pool_bytes(pool) >= 4096);
    fr_batch *again = fr_pool_get(pool);
    CHECK(again->holds == 1);
    fr_batch_recycle(again);

    /* The pool outlives its owner's reference while a batch is out. */
    fr_pool_retain(pool);
    fr_pool_close(pool);
    fr_pool_close(pool);
    CHECK(b->arena.base[500] == 0xAB);
    fr_batch_recycle(b); /* last reference: frees everything (ASan checks) */
    return fr_test_finish("test_arena");
}
