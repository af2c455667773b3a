/* The fork-join pool. run_claimed: every item is handed out exactly once,
 * run_claimed returns only when no thread is inside the phase (a thread that
 * was late never runs a phase that is over, even while the next one runs),
 * and when the caller stops before every item is claimed (a broken io_uring
 * ring does) it waits for the pool's threads to take the rest. Polling
 * between phases: bounded (an idle pool's threads sleep), off where the
 * pool has more threads than the process has CPUs, and every counter adds
 * up. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "core/threadpool.h"

#define NITEMS 64
#define NPHASES 3000
#define EXTRA 3

typedef struct state {
    fr_threadpool *pool;
    atomic_int current;          /* the phase being run */
    atomic_int inside;           /* threads inside fn */
    atomic_int stale;            /* fn calls for a phase that was not current */
    atomic_int taken[NITEMS];    /* per item: times handed out this phase */
    atomic_int caller_claims;    /* 0: the caller (worker 0) claims nothing */
    atomic_int helper_calls;     /* fn calls on pool threads */
} state;

static void pause_a_little(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static void phase_fn(void *arg, int phase, unsigned worker)
{
    state *s = arg;
    atomic_fetch_add(&s->inside, 1);
    if (phase != atomic_load(&s->current))
        atomic_fetch_add(&s->stale, 1);
    if (worker != 0)
        atomic_fetch_add(&s->helper_calls, 1);
    if (worker != 0 || atomic_load(&s->caller_claims)) {
        size_t k;
        while (fr_threadpool_claim(s->pool, &k)) {
            if (k < NITEMS)
                atomic_fetch_add(&s->taken[k], 1);
            if (worker != 0)
                pause_a_little(); /* the caller takes most items */
        }
    }
    atomic_fetch_sub(&s->inside, 1);
}

static int every_item_once(state *s)
{
    int ok = 1;
    for (int k = 0; k < NITEMS; k++) {
        ok &= atomic_load(&s->taken[k]) == 1;
        atomic_store(&s->taken[k], 0);
    }
    return ok;
}

int main(void)
{
    static state s;
    char err[256] = "";
    CHECK(fr_threadpool_start_ex(&s.pool, EXTRA, phase_fn, &s, "test", err, sizeof(err)) == 0);
    if (!s.pool)
        return fr_test_finish("test_threadpool");

    /* The caller claims too: late pool threads may skip a phase. */
    atomic_store(&s.caller_claims, 1);
    int bad = 0;
    for (int ph = 1; ph <= NPHASES; ph++) {
        atomic_store(&s.current, ph);
        fr_threadpool_run_claimed(s.pool, ph, NITEMS);
        bad += !every_item_once(&s);
        bad += atomic_load(&s.inside) != 0;
    }
    CHECK(bad == 0);
    CHECK(atomic_load(&s.stale) == 0);
    /* Pool threads join at most every phase, and skipped some. */
    int calls = atomic_load(&s.helper_calls);
    CHECK(calls <= NPHASES * EXTRA);
    printf("run_claimed: %d of %d pool-thread turns taken\n", calls, NPHASES * EXTRA);

    /* The caller claims nothing (as a ring that broke returns early): the
     * pool's threads must read every item before run_claimed returns. */
    atomic_store(&s.caller_claims, 0);
    bad = 0;
    for (int ph = NPHASES + 1; ph <= NPHASES + 200; ph++) {
        atomic_store(&s.current, ph);
        fr_threadpool_run_claimed(s.pool, ph, NITEMS);
        bad += !every_item_once(&s);
        bad += atomic_load(&s.inside) != 0;
    }
    CHECK(bad == 0);

    /* Plain run() still runs every thread in every phase. */
    atomic_store(&s.caller_claims, 1);
    atomic_store(&s.helper_calls, 0);
    for (int ph = 1; ph <= 100; ph++) {
        atomic_store(&s.current, -ph);
        fr_threadpool_run(s.pool, -ph, NITEMS);
        CHECK(every_item_once(&s));
    }
    CHECK(atomic_load(&s.helper_calls) == 100 * EXTRA);
    CHECK(atomic_load(&s.stale) == 0);

    /* Every pool thread either joined or skipped each phase it saw; a
     * thread that slept through a whole phase saw only the next one. */
    long phases = fr_threadpool_stat(s.pool, "pool_phases");
    long joins = fr_threadpool_stat(s.pool, "pool_joins");
    long skips = fr_threadpool_stat(s.pool, "pool_skips");
    CHECK(phases == NPHASES + 200 + 100);
    CHECK(joins + skips <= phases * EXTRA);
    CHECK(joins >= 200 * EXTRA + 100 * EXTRA); /* the phases no thread could skip */
    CHECK(fr_threadpool_stat(s.pool, "pool_alone") <= NPHASES);
    CHECK(fr_threadpool_stat(s.pool, "pool_wake_ns") >= 0);
    CHECK(fr_threadpool_stat(s.pool, "no such key") == -1);

    /* Polling: off with more threads than CPUs, else as set. */
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
    int fits = EXTRA + 1 <= CPU_COUNT(&set);
    CHECK(fr_threadpool_stat(s.pool, "pool_spin_ns") == (fits ? FR_POOL_SPIN_NS_DEFAULT : 0));
    fr_threadpool_set_spin(s.pool, 2000000);
    CHECK(fr_threadpool_stat(s.pool, "pool_spin_ns") == (fits ? 2000000 : 0));
    fr_threadpool_set_spin(s.pool, -5);
    CHECK(fr_threadpool_stat(s.pool, "pool_spin_ns") == 0);

    /* An idle pool sleeps: after a pause well past the polling time, every
     * thread's wait for the next phase ended in the kernel. */
    fr_threadpool_set_spin(s.pool, 1000000); /* 1 ms */
    atomic_store(&s.current, 1);
    fr_threadpool_run(s.pool, 1, NITEMS);
    every_item_once(&s);
    long slept = fr_threadpool_stat(s.pool, "pool_sleeps");
    struct timespec idle = {0, 50 * 1000000L};
    nanosleep(&idle, NULL);
    atomic_store(&s.current, 2);
    fr_threadpool_run(s.pool, 2, NITEMS);
    CHECK(every_item_once(&s));
    CHECK(fr_threadpool_stat(s.pool, "pool_sleeps") - slept == EXTRA);
    fr_threadpool_stop(s.pool);

    /* Back-to-back phases with polling on find the threads awake: a pool
     * of one helper, which fits any machine of 2 CPUs or more. A helper
     * descheduled while polling (a busy machine) sleeps instead, and after a
     * few such misses polls less: then only that is reported. */
    if (CPU_COUNT(&set) >= 2) {
        CHECK(fr_threadpool_start_ex(&s.pool, 1, phase_fn, &s, "test", err, sizeof(err)) == 0);
        fr_threadpool_set_spin(s.pool, 20000000); /* 20 ms: far past any phase gap */
        CHECK(fr_threadpool_stat(s.pool, "pool_spin_ns") == 20000000);
        for (int ph = 0; ph < 200; ph++) {
            atomic_store(&s.current, ph);
            fr_threadpool_run(s.pool, ph, NITEMS);
            CHECK(every_item_once(&s));
        }
        long sleeps = fr_threadpool_stat(s.pool, "pool_sleeps");
        long preempted = fr_threadpool_stat(s.pool, "pool_preempted");
        printf("polling: %ld of 200 waits slept, %ld polls cut by preemption\n", sleeps,
               preempted);
        if (preempted == 0)
            CHECK(sleeps <= 1); /* the first wait may have begun before the 20 ms */
        /* Polls that keep running out are given up (one wait in 16 polls). */
        fr_threadpool_set_spin(s.pool, 200000); /* 0.2 ms */
        long before = fr_threadpool_stat(s.pool, "pool_sleeps");
        struct timespec gap = {0, 2000000L}; /* 2 ms between phases */
        for (int ph = 0; ph < 40; ph++) {
            atomic_store(&s.current, ph);
            fr_threadpool_run(s.pool, ph, NITEMS);
            CHECK(every_item_once(&s));
            nanosleep(&gap, NULL);
        }
        /* (The first wait may still be the one polling for 20 ms.) */
        long slept_gaps = fr_threadpool_stat(s.pool, "pool_sleeps") - before;
        CHECK(slept_gaps >= 20 && slept_gaps <= 40); /* a descheduled poll may see the job */
        CHECK(atomic_load(&s.stale) == 0);
        fr_threadpool_stop(s.pool);
    }
    return fr_test_finish("test_threadpool");
}
