/* The device-side cache and submission ring of fastread_device.cuh, built
 * as plain C11, with pthreads playing GPU threads and host service threads
 * playing the proxy: hits, CLOCK evictions, concurrent misses to one page
 * (one read, many waiters), ring wrap-around, full-ring back-pressure,
 * timeouts, abort, read errors from the host, and a stress run that checks
 * every row and the cache's invariants afterwards. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gather/device/fastread_device.cuh"
#include "harness.h"

#define ROW 256u
#define PAGE 4096u
#define RPP (PAGE / ROW)

/* The "file": byte b of page p. */
static uint8_t pattern(uint64_t page, uint32_t b)
{
    return (uint8_t)(page * 131u + b * 7u + (b >> 8));
}

typedef struct env {
    fr_dev_store s;
    fr_dev_result result;
    uint32_t abort;
    uint64_t tail;
    /* service threads */
    pthread_t svc[4];
    unsigned nsvc;
    /* Written by the test's thread, read by the service threads: atomic, not
     * volatile (a plain int there is a data race, which ThreadSanitizer
     * reports, and the compiler may hoist the load out of the loop). */
    atomic_int running;
    unsigned delay_ms;      /* before serving anything */
    int64_t fail_page;      /* page whose reads fail with -EIO; -1 none */
    uint32_t reads[1024];   /* reads served, per page */
} env;

typedef struct svc_arg {
    env *e;
    unsigned shard;
} svc_arg;
static svc_arg svc_args[4];

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A proxy service thread: serves tickets shard, shard + nsvc, ... in order. */
static void *service(void *p)
{
    svc_arg *a = p;
    env *e = a->e;
    const fr_dev_ring *r = &e->s.fetch.ring;
    if (e->delay_ms)
        sleep_ms(e->delay_ms);
    uint64_t pos = a->shard;
    while (atomic_load_explicit(&e->running, memory_order_acquire)) {
        if (!fr_ring_host_submitted(r, pos)) {
            sched_yield();
            continue;
        }
        fr_dev_ring_cell *c = fr_ring_host_cell(r, pos);
        uint64_t page = c->page;
        uint32_t len = c->len;
        int32_t status = 0;
        if ((int64_t)page == e->fail_page) {
            status = -EIO;
        } else {
            uint8_t *dst = fr_ring_host_staging(r, pos);
            for (uint32_t b = 0; b < len; b++)
                dst[b] = pattern(page, b);
            __atomic_fetch_add(&e->reads[page], 1, __ATOMIC_SEQ_CST);
        }
        fr_ring_host_complete(r, pos, status);
        pos += e->nsvc;
    }
    return NULL;
}

static env *env_new(uint64_t rows, uint32_t nslots, unsigned log2_ring, unsigned nsvc,
                    uint64_t timeout_ms)
{
    env *e = calloc(1, sizeof(*e));
    fr_dev_store *s = &e->s;
    s->rows = rows;
    s->row_bytes = ROW;
    s->data_bytes = rows * ROW;
    s->rows_per_page = RPP;
    s->timeout_ns = timeout_ms * 1000000ull;
    fr_dev_cache *c = &s->cache;
    c->npages = (s->data_bytes + PAGE - 1) / PAGE;
    c->nslots = nslots;
    c->page_bytes = PAGE;
    c->page_table = calloc(c->npages, sizeof(uint32_t));
    c->tags = malloc(nslots * sizeof(uint64_t));
    memset(c->tags, 0xFF, nslots * sizeof(uint64_t));
    c->refs = calloc(nslots, sizeof(uint32_t));
    c->clock_bits = calloc(nslots, sizeof(uint32_t));
    c->hand = calloc(1, sizeof(uint32_t));
    c->data = malloc((size_t)nslots * PAGE);
    s->abort = &e->abort;
    s->result = &e->result;
    e->result.first_bad = ~0ull;
    fr_dev_ring *r = &s->fetch.ring;
    r->log2_entries = log2_ring;
    r->page_bytes = PAGE;
    r->cells = calloc((size_t)1 << log2_ring, sizeof(fr_dev_ring_cell));
    r->staging = malloc(((size_t)1 << log2_ring) * PAGE);
    r->tail = &e->tail;
    e->nsvc = nsvc;
    e->fail_page = -1;
    return e;
}

static void env_start(env *e)
{
    atomic_store_explicit(&e->running, 1, memory_order_release);
    for (unsigned i = 0; i < e->nsvc; i++) {
        svc_args[i].e = e;
        svc_args[i].shard = i;
        CHECK(pthread_create(&e->svc[i], NULL, service, &svc_args[i]) == 0);
    }
}

static void env_stop(env *e)
{
    atomic_store_explicit(&e->running, 0, memory_order_release);
    for (unsigned i = 0; i < e->nsvc; i++)
        pthread_join(e->svc[i], NULL);
}

/* What the proxy does after a failed gather: rings and cache start clean. */
static void env_reset(env *e)
{
    fr_ring_host_reset(&e->s.fetch.ring);
    e->tail = 0;
    fr_dev_cache *c = &e->s.cache;
    memset(c->page_table, 0, c->npages * sizeof(uint32_t));
    memset(c->tags, 0xFF, c->nslots * sizeof(uint64_t));
    memset(c->refs, 0, c->nslots * sizeof(uint32_t));
    memset(c->clock_bits, 0, c->nslots * sizeof(uint32_t));
    e->abort = 0;
}

static void env_free(env *e)
{
    fr_dev_cache *c = &e->s.cache;
    free(c->page_table);
    free(c->tags);
    free(c->refs);
    free(c->clock_bits);
    free(c->hand);
    free(c->data);
    free(c->pins);
    free(e->s.fetch.ring.cells);
    free(e->s.fetch.ring.staging);
    free(e);
}

static int page_ok(const env *e, uint32_t slot, uint64_t page)
{
    const uint8_t *d = fr_dev_slot_data(&e->s.cache, slot);
    uint32_t len = fr_dev_page_len(&e->s, page);
    for (uint32_t b = 0; b < len; b++)
        if (d[b] != pattern(page, b))
            return 0;
    return 1;
}

static int row_ok(const uint8_t *row, uint64_t id)
{
    uint64_t page = id / RPP;
    uint32_t at = (uint32_t)(id % RPP) * ROW;
    for (uint32_t b = 0; b < ROW; b++)
        if (row[b] != pattern(page, at + b))
            return 0;
    return 1;
}

/* No references or EXCL bits left, and page table and tags agree. */
static int cache_consistent(const env *e)
{
    const fr_dev_cache *c = &e->s.cache;
    for (uint32_t i = 0; i < c->nslots; i++) {
        if (c->refs[i] != 0)
            return 0;
        if (c->tags[i] != FR_TAG_NONE && c->page_table[c->tags[i]] != i + 1)
            return 0;
    }
    for (uint64_t p = 0; p < c->npages; p++) {
        uint32_t v = c->page_table[p];
        if (v == FR_PT_LOADING || (v && c->tags[v - 1] != p))
            return 0;
    }
    return 1;
}

static void test_hits_and_evictions(void)
{
    env *e = env_new(10 * RPP, 4, 3, 1, 5000);
    env_start(e);
    fr_dev_counts cnt = {{0}};
    uint32_t slot;
    CHECK(fr_cache_acquire(&e->s, 3, &slot, &cnt) == FR_GOT_MISS);
    CHECK(page_ok(e, slot, 3));
    fr_cache_release(&e->s.cache, slot);
    CHECK(fr_cache_acquire(&e->s, 3, &slot, &cnt) == FR_GOT_HIT);
    CHECK(page_ok(e, slot, 3));
    fr_cache_release(&e->s.cache, slot);
    CHECK(cnt.c[FR_CNT_MISSES] == 1 && cnt.c[FR_CNT_EVICTIONS] == 0);
    CHECK(e->reads[3] == 1);

    /* A cyclic scan of 10 pages through 4 slots: CLOCK misses every time. */
    memset(&cnt, 0, sizeof(cnt));
    for (int round = 0; round < 2; round++)
        for (uint64_t p = 0; p < 10; p++) {
            int rc = fr_cache_acquire(&e->s, p, &slot, &cnt);
            CHECK(rc >= 0);
            if (rc >= 0) {
                CHECK(page_ok(e, slot, p));
                fr_cache_release(&e->s.cache, slot);
            }
        }
    /* Page 3 was resident at the start: the first round hits it once. */
    CHECK(cnt.c[FR_CNT_MISSES] == 19);
    CHECK(cnt.c[FR_CNT_EVICTIONS] == 19 - 3);
    CHECK(cache_consistent(e));

    /* Rows through fr_dev_read_row, with a held page pinning its slot. */
    CHECK(fr_cache_acquire(&e->s, 9, &slot, &cnt) >= 0);
    uint32_t pinned = slot;
    uint8_t row[ROW];
    for (uint64_t id = 0; id < 10 * RPP; id += 5) {
        CHECK(fr_dev_read_row(&e->s, (int64_t)id, row, &cnt) == 0);
        CHECK(row_ok(row, id));
        CHECK(e->s.cache.tags[pinned] == 9); /* never evicted while held */
    }
    fr_cache_release(&e->s.cache, pinned);
    CHECK(fr_dev_read_row(&e->s, -1, row, &cnt) == FR_DEV_ERANGE);
    CHECK(fr_dev_read_row(&e->s, 10 * RPP, row, &cnt) == FR_DEV_ERANGE);
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

/* Threads wanting one page at once: one read, everyone gets the page. */
typedef struct same_arg {
    env *e;
    uint64_t page;
    pthread_barrier_t *bar;
    int rc;
    int ok;
    fr_dev_counts cnt;
} same_arg;

static void *acquire_one(void *p)
{
    same_arg *a = p;
    uint32_t slot = 0;
    if (a->bar)
        pthread_barrier_wait(a->bar);
    a->rc = fr_cache_acquire(&a->e->s, a->page, &slot, &a->cnt);
    if (a->rc >= 0) {
        a->ok = page_ok(a->e, slot, a->page);
        fr_cache_release(&a->e->s.cache, slot);
    }
    return NULL;
}

static void test_concurrent_misses(void)
{
    enum { T = 16 };
    env *e = env_new(64 * RPP, 32, 4, 1, 5000);
    e->delay_ms = 50; /* every thread is waiting before the read is served */
    env_start(e);
    pthread_t th[T];
    same_arg a[T];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, T);
    for (int i = 0; i < T; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].e = e;
        a[i].page = 7;
        a[i].bar = &bar;
        CHECK(pthread_create(&th[i], NULL, acquire_one, &a[i]) == 0);
    }
    int misses = 0, others = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].rc >= 0 && a[i].ok);
        misses += a[i].rc == FR_GOT_MISS;
        others += a[i].rc == FR_GOT_WAITED || a[i].rc == FR_GOT_HIT;
    }
    pthread_barrier_destroy(&bar);
    CHECK(misses == 1 && others == T - 1);
    CHECK(e->reads[7] == 1); /* one read for sixteen threads */
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

static void test_ring_wraparound(void)
{
    env *e = env_new(200 * RPP, 8, 2, 1, 5000); /* 4 cells */
    env_start(e);
    fr_dev_counts cnt = {{0}};
    for (uint64_t p = 0; p < 100; p++) {
        uint32_t slot = 0;
        int rc = fr_cache_acquire(&e->s, p * 2, &slot, &cnt);
        CHECK(rc == FR_GOT_MISS);
        if (rc >= 0) {
            CHECK(page_ok(e, slot, p * 2));
            fr_cache_release(&e->s.cache, slot);
        }
    }
    CHECK(e->tail == 100); /* 25 laps of a 4-cell ring */
    for (uint64_t i = 0; i < 4; i++)
        CHECK(e->s.fetch.ring.cells[i].seq == 4 * 25); /* all free for lap 25 */
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

static void test_backpressure(void)
{
    enum { T = 8 };
    env *e = env_new(64 * RPP, 32, 1, 2, 5000); /* 2 cells, 2 service shards */
    e->delay_ms = 30;
    env_start(e);
    pthread_t th[T];
    same_arg a[T];
    for (int i = 0; i < T; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].e = e;
        a[i].page = (uint64_t)i * 3;
        CHECK(pthread_create(&th[i], NULL, acquire_one, &a[i]) == 0);
    }
    uint64_t full = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].rc == FR_GOT_MISS && a[i].ok);
        full += a[i].cnt.c[FR_CNT_RING_FULL];
    }
    /* Eight requests, two cells: at least six found their cell taken. */
    CHECK(full >= T - 2);
    CHECK(e->tail == T);
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct aborter {
    env *e;
    unsigned ms;
} aborter;

static void *abort_later(void *p)
{
    aborter *a = p;
    sleep_ms(a->ms);
    __atomic_store_n(&a->e->abort, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_timeout_abort_and_errors(void)
{
    env *e = env_new(16 * RPP, 8, 2, 1, 60); /* 60 ms timeout, nobody serving */
    fr_dev_counts cnt = {{0}};
    uint32_t slot;
    double t0 = now_s();
    CHECK(fr_cache_acquire(&e->s, 2, &slot, &cnt) == FR_DEV_ETIMEDOUT);
    CHECK(now_s() - t0 >= 0.055);
    /* The failed load left the page absent and the slot free. */
    CHECK(e->s.cache.page_table[2] == 0);
    CHECK(cache_consistent(e));

    /* Abort: the loader and the threads waiting on its LOADING page stop. */
    e->s.timeout_ns = 10ull * 1000000000ull;
    pthread_t th[4], ab;
    same_arg a[4];
    for (int i = 0; i < 4; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].e = e;
        a[i].page = 5;
        CHECK(pthread_create(&th[i], NULL, acquire_one, &a[i]) == 0);
    }
    aborter ar = {e, 30};
    t0 = now_s();
    CHECK(pthread_create(&ab, NULL, abort_later, &ar) == 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].rc == FR_DEV_ECANCELED);
    }
    pthread_join(ab, NULL);
    CHECK(now_s() - t0 < 5.0);

    /* Reset (as after a failed gather), then a host-side read error. */
    env_reset(e);
    CHECK(cache_consistent(e));
    e->fail_page = 4;
    env_start(e);
    CHECK(fr_cache_acquire(&e->s, 4, &slot, &cnt) == FR_DEV_EIO);
    CHECK(e->s.cache.page_table[4] == 0);
    e->fail_page = -1;
    CHECK(fr_cache_acquire(&e->s, 4, &slot, &cnt) == FR_GOT_MISS);
    CHECK(page_ok(e, slot, 4));
    fr_cache_release(&e->s.cache, slot);
    CHECK(fr_cache_acquire(&e->s, 2, &slot, &cnt) == FR_GOT_MISS);
    CHECK(page_ok(e, slot, 2));
    fr_cache_release(&e->s.cache, slot);
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

/* Many threads, random rows, a small cache and ring, two service shards. */
typedef struct stress_arg {
    env *e;
    unsigned seed;
    int bad;
    fr_dev_counts cnt;
} stress_arg;

static void *stress(void *p)
{
    stress_arg *a = p;
    uint32_t x = a->seed * 2654435761u + 1;
    uint8_t row[ROW];
    uint64_t rows = a->e->s.rows;
    for (int i = 0; i < 3000; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        uint64_t id = x % rows;
        if (fr_dev_read_row(&a->e->s, (int64_t)id, row, &a->cnt) != 0 || !row_ok(row, id))
            a->bad++;
    }
    return NULL;
}

static void test_stress(void)
{
    enum { T = 8 };
    env *e = env_new(40 * RPP + 5, 12, 3, 2, 10000); /* last page short */
    env_start(e);
    pthread_t th[T];
    stress_arg a[T];
    for (int i = 0; i < T; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].e = e;
        a[i].seed = (unsigned)i + 1;
        CHECK(pthread_create(&th[i], NULL, stress, &a[i]) == 0);
    }
    uint64_t hits = 0, misses = 0, evictions = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].bad == 0);
        hits += a[i].cnt.c[FR_CNT_HITS];
        misses += a[i].cnt.c[FR_CNT_MISSES];
        evictions += a[i].cnt.c[FR_CNT_EVICTIONS];
    }
    uint64_t reads = 0;
    for (int p = 0; p < 41; p++)
        reads += e->reads[p];
    CHECK(reads == misses);
    CHECK(evictions + 12 >= misses && evictions <= misses);
    CHECK(hits > 0);
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

/* Pins (fastread_device.cuh, "Pins"): readers of one gather epoch read
 * pinned slots with no reference while others miss and evict around them.
 * Every row must be right, a slot pinned for the epoch must never change
 * page during it, no more than pin_limit slots are pinned, and the next
 * epoch may evict what the last one pinned. */
typedef struct pin_arg {
    env *e;
    unsigned seed;
    uint32_t epoch;
    int bad;
    fr_dev_counts cnt;
} pin_arg;

static void *pin_reader(void *p)
{
    pin_arg *a = p;
    uint32_t x = a->seed * 2654435761u + 7;
    uint8_t row[ROW];
    uint64_t rows = a->e->s.rows;
    const fr_dev_cache *c = &a->e->s.cache;
    for (int i = 0; i < 3000; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        /* Half the reads on 4 hot pages (they get pinned), half anywhere. */
        uint64_t id = (i & 1) ? x % rows : x % (4 * RPP);
        if (fr_dev_read_row_e(&a->e->s, (int64_t)id, row, &a->cnt, a->epoch) != 0 ||
            !row_ok(row, id))
            a->bad++;
        /* A slot pinned for this epoch holds its page: tag and pin agree. */
        uint32_t sl = x % c->nslots;
        uint64_t pin = __atomic_load_n(&c->pins[sl], __ATOMIC_ACQUIRE);
        if ((uint32_t)(pin >> 32) == a->epoch &&
            __atomic_load_n(&c->tags[sl], __ATOMIC_ACQUIRE) != (pin & 0xFFFFFFFFull))
            a->bad++;
    }
    return NULL;
}

static void test_pins(void)
{
    enum { T = 8 };
    env *e = env_new(40 * RPP, 12, 3, 2, 10000);
    fr_dev_cache *c = &e->s.cache;
    c->pins = calloc(c->nslots, sizeof(uint64_t));
    c->epoch_now = &e->result.epoch;
    c->pinned = &e->result.counters[FR_CNT_PINNED];
    c->pin_limit = c->nslots / 2;
    env_start(e);
    uint64_t pinned_hits = 0;
    for (uint32_t epoch = 1; epoch <= 3; epoch++) {
        /* What the host does before each gather. */
        e->result.epoch = epoch;
        e->result.counters[FR_CNT_PINNED] = 0;
        pthread_t th[T];
        pin_arg a[T];
        for (int i = 0; i < T; i++) {
            memset(&a[i], 0, sizeof(a[i]));
            a[i].e = e;
            a[i].seed = (unsigned)i + 10 * epoch;
            a[i].epoch = epoch;
            CHECK(pthread_create(&th[i], NULL, pin_reader, &a[i]) == 0);
        }
        for (int i = 0; i < T; i++) {
            pthread_join(th[i], NULL);
            CHECK(a[i].bad == 0);
            pinned_hits += a[i].cnt.c[FR_CNT_HITS];
        }
        uint32_t n = 0;
        for (uint32_t i = 0; i < c->nslots; i++)
            if ((uint32_t)(c->pins[i] >> 32) == epoch)
                n++;
        CHECK(n > 0 && n <= c->pin_limit);
        CHECK(cache_consistent(e));
    }
    CHECK(pinned_hits > 0);
    /* Between gathers epoch_now moves on: what epoch 3 pinned may be evicted. */
    uint32_t held3 = 0;
    for (uint32_t i = 0; i < c->nslots; i++)
        if ((uint32_t)(c->pins[i] >> 32) == 3) {
            CHECK(fr_cache_pinned_now(c, i));
            held3++;
        }
    e->result.epoch = 4;
    for (uint32_t i = 0; i < c->nslots; i++)
        CHECK(!fr_cache_pinned_now(c, i));
    CHECK(held3 > 0);
    uint32_t slot;
    fr_dev_counts cnt;
    memset(&cnt, 0, sizeof(cnt));
    for (uint64_t p = 20; p < 40; p++) {
        CHECK(fr_cache_acquire(&e->s, p, &slot, &cnt) >= 0);
        fr_cache_release(c, slot);
    }
    CHECK(cache_consistent(e));
    env_stop(e);
    env_free(e);
}

int main(void)
{
    test_hits_and_evictions();
    test_concurrent_misses();
    test_ring_wraparound();
    test_backpressure();
    test_timeout_abort_and_errors();
    test_stress();
    test_pins();
    return fr_test_finish("test_gather_cache");
}
