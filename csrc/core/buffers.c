/* Arenas, batches and the batch pool. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/base.h"
#include "fastread.h"
#include "gpu/gpu.h"

/* Arenas grow in 2 MiB steps so transparent huge pages can back them. */
#define ARENA_GRANULE ((size_t)2 << 20)

/* A region an arena grew out of. It stays mapped (its pages released) until
 * the arena is freed, so a view a caller kept into an old region can never
 * point at unmapped memory: at worst it reads zeros. */
typedef struct retired_region {
    void *base;
    size_t size;
    struct retired_region *next;
} retired_region;

/* Engines cache what they did with an arena's memory (io_uring's registered
 * buffers) under (arena address, generation). A freed batch's arena struct
 * can come back at the same address from malloc, so a generation counted
 * from 0 would repeat too: a new arena matched a freed one's registration and
 * io_uring read into pages that were no longer the arena's (EFAULT at best,
 * bytes lost at worst; test_uring_pipelined in a Release build). A new
 * arena's first generation is therefore drawn from its address, the clock and
 * the region, so it repeats another arena's with odds of 2^-64. */
static void next_generation(fr_arena *arena)
{
    if (arena->generation == 0) {
        struct timespec ts;
        (void)clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail with a valid clock */
        uint64_t seed = (uint64_t)(uintptr_t)arena ^ (uint64_t)(uintptr_t)arena->base ^
                        ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
        arena->generation = fr_splitmix64(&seed) | 1;
    } else {
        arena->generation++;
        if (arena->generation == 0)
            arena->generation = 1;
    }
}

int fr_arena_reserve(fr_arena *arena, size_t bytes)
{
    if (bytes <= arena->capacity)
        return 0;
    size_t want = arena->capacity + arena->capacity / 2;
    if (want < bytes)
        want = bytes;
    want = (want + ARENA_GRANULE - 1) & ~(ARENA_GRANULE - 1);

    retired_region *old = NULL;
    if (arena->base) {
        old = malloc(sizeof(*old));
        if (!old)
            return -ENOMEM;
    }
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(old);
        return -ENOMEM;
    }
    (void)madvise(p, want, MADV_HUGEPAGE); /* a hint; failure is harmless */
    if (arena->pin) {
        /* Pinned once per region, never per batch: registering is slow (it
         * faults in and locks every page), reusing a pinned arena is free. */
        int rc = fr_gpu_host_register(arena->pin, p, want);
        if (rc) {
            munmap(p, want);
            free(old);
            return rc;
        }
    }
    if (old) {
        memcpy(p, arena->base, arena->used);
        /* Unlocked first: the kernel cannot release pages the GPU driver
         * still holds. */
        if (arena->pin)
            fr_gpu_host_unregister(arena->pin, arena->base);
        (void)madvise(arena->base, arena->capacity, MADV_DONTNEED);
        old->base = arena->base;
        old->size = arena->capacity;
        old->next = arena->retired;
        arena->retired = old;
    }
    arena->base = p;
    arena->capacity = want;
    next_generation(arena);
    return 0;
}

void fr_arena_free(fr_arena *arena)
{
    if (arena->base) {
        if (arena->pin)
            fr_gpu_host_unregister(arena->pin, arena->base);
        munmap(arena->base, arena->capacity);
    }
    retired_region *r = arena->retired;
    while (r) {
        retired_region *next = r->next;
        munmap(r->base, r->size);
        free(r);
        r = next;
    }
    arena->retired = NULL;
    arena->base = NULL;
    arena->capacity = 0;
    arena->used = 0;
    next_generation(arena);
}

int fr_batch_prepare(fr_batch *batch, size_t count)
{
    if (count > batch->samples_cap) {
        size_t cap = batch->samples_cap ? batch->samples_cap : 64;
        while (cap < count)
            cap *= 2;
        fr_sample *s = realloc(batch->samples, cap * sizeof(*s));
        if (!s)
            return -ENOMEM;
        int64_t *idx = realloc(batch->indices, cap * sizeof(*idx));
        if (!idx) {
            batch->samples = s;
            return -ENOMEM;
        }
        batch->samples = s;
        batch->indices = idx;
        batch->samples_cap = cap;
    }
    batch->count = count;
    batch->status = 0;
    batch->arena.used = 0;
    batch->where = FR_ON_HOST;
    return 0;
}

int fr_batch_labels_begin(fr_batch *batch, size_t n)
{
    if (n > batch->labels_cap) {
        fr_sample *l = realloc(batch->labels, n * sizeof(*l));
        if (!l)
            return -ENOMEM;
        batch->labels = l;
        batch->labels_cap = n;
    }
    for (size_t i = 0; i < n; i++)
        batch->labels[i] = (fr_sample){0, -1};
    batch->label_count = n;
    batch->label_bytes_used = 0;
    return 0;
}

int fr_batch_set_label(fr_batch *batch, size_t i, const uint8_t *bytes, size_t len)
{
    if (i >= batch->label_count)
        return -EINVAL;
    if (fr_grow((void **)&batch->label_bytes, &batch->label_bytes_cap,
                batch->label_bytes_used + len, 1, 4096))
        return -ENOMEM;
    if (len)
        memcpy(batch->label_bytes + batch->label_bytes_used, bytes, len);
    batch->labels[i] = (fr_sample){batch->label_bytes_used, (int64_t)len};
    batch->label_bytes_used += len;
    return 0;
}

static void batch_destroy(fr_batch *batch)
{
    if (batch->device.ptr)
        fr_gpu_device_free(batch->device.owner, &batch->device);
    fr_arena_free(&batch->arena);
    free(batch->samples);
    free(batch->indices);
    free(batch->labels);
    free(batch->label_bytes);
    free(batch);
}

struct fr_pool {
    pthread_mutex_t lock;
    fr_batch *free_list;
    size_t refs;     /* the owner's reference plus one per batch handed out */
    size_t batches;  /* allocated, free or not */
    fr_gpu *gpu;     /* arenas are page-locked through it when pin is set */
    int pin;
};

fr_pool *fr_pool_new(void)
{
    fr_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool);
        return NULL;
    }
    pool->refs = 1;
    return pool;
}

static void pool_destroy(fr_pool *pool)
{
    fr_batch *b = pool->free_list;
    while (b) {
        fr_batch *next = b->next;
        batch_destroy(b);
        b = next;
    }
    fr_gpu_close(pool->gpu);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

fr_batch *fr_pool_get(fr_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    fr_batch *b = pool->free_list;
    if (b) {
        pool->free_list = b->next;
    } else {
        b = calloc(1, sizeof(*b));
        if (b) {
            b->pool = pool;
            b->arena.pin = pool->pin ? pool->gpu : NULL;
            pool->batches++;
        }
    }
    if (b) {
        b->next = NULL;
        b->holds = 1;
        pool->refs++;
    }
    pthread_mutex_unlock(&pool->lock);
    return b;
}

void fr_batch_retain(fr_batch *batch)
{
    pthread_mutex_lock(&batch->pool->lock);
    batch->holds++;
    pthread_mutex_unlock(&batch->pool->lock);
}

void fr_batch_recycle(fr_batch *batch)
{
    if (!batch)
        return;
    fr_pool *pool = batch->pool;
    pthread_mutex_lock(&pool->lock);
    if (--batch->holds > 0) {
        pthread_mutex_unlock(&pool->lock);
        return;
    }
    batch->next = pool->free_list;
    pool->free_list = batch;
    int last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->lock);
    if (last)
        pool_destroy(pool);
}

void fr_pool_retain(fr_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    pool->refs++;
    pthread_mutex_unlock(&pool->lock);
}

void fr_pool_close(fr_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    int last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->lock);
    if (last)
        pool_destroy(pool);
}

/* Bytes the idle batches hold: host arenas, or device buffers. */
static size_t idle_bytes(fr_pool *pool, int device)
{
    size_t bytes = 0;
    pthread_mutex_lock(&pool->lock);
    for (fr_batch *b = pool->free_list; b; b = b->next)
        bytes += device ? b->device.capacity : b->arena.capacity;
    pthread_mutex_unlock(&pool->lock);
    return bytes;
}

size_t fr_pool_bytes(fr_pool *pool) { return idle_bytes(pool, 0); }

void fr_pool_set_gpu(fr_pool *pool, fr_gpu *gpu, int pin)
{
    fr_gpu_retain(gpu);
    pthread_mutex_lock(&pool->lock);
    fr_gpu *old = pool->gpu;
    pool->gpu = gpu;
    pool->pin = pin;
    pthread_mutex_unlock(&pool->lock);
    fr_gpu_close(old);
}

size_t fr_pool_device_bytes(fr_pool *pool) { return idle_bytes(pool, 1); }

size_t fr_pool_batches(fr_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    size_t n = pool->batches;
    pthread_mutex_unlock(&pool->lock);
    return n;
}
