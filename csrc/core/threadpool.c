/* The fork-join pool behind the thread-based engines (threadpool.h).
 *
 * Hand-off without a lock: a phase is published by bumping `job` (a futex
 * word); pool threads that finished the previous phase less than spin_ns ago
 * are still polling it and start at once, the others sleep in FUTEX_WAIT and
 * are woken together by one FUTEX_WAKE. The caller waits for the end of a
 * phase the same way on `done`. Why: with a mutex and condition variables,
 * every phase cost each pool thread a futex wake-up plus a turn on the
 * mutex, one after the other; on a 16-core machine a read_files() call on
 * 64 cached 4 KiB files (~40 us of work spread out) was over before the
 * helpers got there, so the caller read nearly every file itself (291k
 * files/s, one thread's rate). Spinning is bounded (spin_ns after each
 * phase), so an idle pool sleeps. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "core/threadpool.h"

/* entry: the phase's job number (high 32 bits), CLOSED once the caller
 * finished every item alone (run_claimed), and how many pool threads joined
 * the phase (low 31 bits). One word, so a thread joins only a phase that is
 * still the current one and still open. */
#define ENTRY_CLOSED ((uint64_t)1 << 31)
#define ENTRY_JOINED_MASK (ENTRY_CLOSED - 1)

/* Polling only while it pays: after SPIN_GIVE_UP polls in a row that ran
 * out without work, a thread (or the caller) polls on only one wait in
 * SPIN_RETRY_EVERY, to notice when phases come close together again. Where
 * calls are far apart (a training loop between read_files() calls) or the
 * machine is busy, polls run out, and on the 2-core VM, shared with other
 * benchmarks, polling on every wait cost read_files() of 64 cached 4 KiB
 * files 10-13% (6.7 -> 7.5 us of CPU per file). */
#define SPIN_GIVE_UP 4
#define SPIN_RETRY_EVERY 16

typedef struct spin_state {
    unsigned misses; /* polls in a row that found nothing */
    unsigned skipped;
} spin_state;

typedef struct fr_pool_thread {
    struct fr_threadpool *pool;
    unsigned index; /* 1..extra */
    pthread_t thread;
} fr_pool_thread;

struct fr_threadpool {
    fr_phase_fn fn;
    fr_phase_fn_ex fn_ex;
    void *arg;
    fr_pool_thread *threads;
    unsigned nthreads;
    atomic_long spin_ns; /* how long a thread polls before it sleeps */

    /* The phase: written by the caller before `job` is bumped, read by the
     * pool threads after they saw the bump (seq_cst atomics order both). */
    int phase;
    atomic_int exiting; /* atomic: a thread late for the last phase reads it while stop() sets it */
    size_t count;       /* items of the current phase */
    atomic_size_t next; /* the next item to claim */
    uint64_t dispatched_ns; /* when the phase was handed out (for wake_ns) */

    atomic_uint job;      /* futex word: bumped for each phase and on stop */
    atomic_uint sleepers; /* pool threads asleep (or going to sleep) on job */
    _Atomic uint64_t entry;
    atomic_uint done;         /* futex word: pool threads that finished the phase */
    atomic_int caller_asleep; /* the caller sleeps (or is going to) on done */
    spin_state caller_spin;   /* the caller's polls for done (one caller at a time) */

    /* Counters for fr_threadpool_stat, cumulative. */
    atomic_long st_phases, st_joins, st_skips, st_sleeps, st_wake_ns, st_alone, st_preempted;
};

static long futex(atomic_uint *word, int op, unsigned val)
{
    return syscall(SYS_futex, (unsigned *)word, op, val, NULL, NULL, 0);
}

/* Sleeps while *word == val. EAGAIN (it changed already) and EINTR send the
 * caller back to its check; nothing else can fail with a valid private word. */
static void futex_wait(atomic_uint *word, unsigned val)
{
    (void)futex(word, FUTEX_WAIT_PRIVATE, val);
}

static void futex_wake_all(atomic_uint *word)
{
    (void)futex(word, FUTEX_WAKE_PRIVATE, INT_MAX); /* fails only for a bad address */
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail with this clock */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A burst of 32 polls takes a microsecond or two; a gap this long between
 * two looks at the clock means the thread was descheduled while polling:
 * more runnable threads than cores, where polling takes a core from a thread
 * with work to do. The poller then sleeps at once. */
#define PREEMPTED_NS 20000

/* Polls until *word != val or spin_ns pass; 1 if it changed. No
 * sched_yield between polls: under EEVDF (Linux 6.6+) each yield pushes the
 * thread's deadline back by a whole slice, and a thread that yielded through
 * 50 us of polling then waited behind every other runnable task for its turn
 * (2-core VM: helpers joined 9 of 128 phases, 0.6 ms late on average). */
static int spin_while(fr_threadpool *p, atomic_uint *word, unsigned val)
{
    long spin = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    if (spin <= 0)
        return atomic_load(word) != val;
    uint64_t last = now_ns(), deadline = last + (uint64_t)spin;
    for (;;) {
        for (int i = 0; i < 32; i++) {
            if (atomic_load_explicit(word, memory_order_acquire) != val)
                return 1;
            cpu_relax();
        }
        uint64_t now = now_ns();
        if (now >= deadline || now - last > PREEMPTED_NS) {
            if (now < deadline)
                atomic_fetch_add_explicit(&p->st_preempted, 1, memory_order_relaxed);
            return atomic_load(word) != val;
        }
        last = now;
    }
}

static int spin_adaptive(fr_threadpool *p, spin_state *s, atomic_uint *word, unsigned val)
{
    if (atomic_load_explicit(&p->spin_ns, memory_order_relaxed) <= 0 ||
        (s->misses >= SPIN_GIVE_UP && ++s->skipped % SPIN_RETRY_EVERY != 0))
        return atomic_load(word) != val;
    int found = spin_while(p, word, val);
    s->misses = found ? 0 : s->misses + 1;
    return found;
}

static void call(fr_threadpool *p, int phase, unsigned index)
{
    if (p->fn_ex)
        p->fn_ex(p->arg, phase, index);
    else
        p->fn(p->arg, phase);
}

/* Waits for a job other than `seen`; returns it. */
static unsigned wait_job(fr_threadpool *p, spin_state *spin, unsigned seen)
{
    if (spin_adaptive(p, spin, &p->job, seen))
        return atomic_load(&p->job);
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->job) == seen)
        futex_wait(&p->job, seen);
    atomic_fetch_sub(&p->sleepers, 1);
    atomic_fetch_add_explicit(&p->st_sleeps, 1, memory_order_relaxed);
    return atomic_load(&p->job);
}

static void *worker(void *t_)
{
    fr_pool_thread *t = t_;
    fr_threadpool *p = t->pool;
    unsigned seen = 0;
    spin_state spin = {0, 0};
    for (;;) {
        unsigned job = wait_job(p, &spin, seen);
        seen = job;
        if (atomic_load(&p->exiting))
            break;
        /* Join the phase if it is still job `job` and open. */
        uint64_t e = atomic_load(&p->entry);
        int joined = 0;
        while ((uint32_t)(e >> 32) == job && !(e & ENTRY_CLOSED)) {
            if (atomic_compare_exchange_weak(&p->entry, &e, e + 1)) {
                joined = 1;
                break;
            }
        }
        if (!joined) {
            /* Finished without us (or already followed by another phase,
             * which the next wait_job returns at once). */
            atomic_fetch_add_explicit(&p->st_skips, 1, memory_order_relaxed);
            continue;
        }
        /* The caller waits for us now: the phase's fields hold still. */
        uint64_t late = now_ns() - p->dispatched_ns;
        atomic_fetch_add_explicit(&p->st_wake_ns, (long)late, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->st_joins, 1, memory_order_relaxed);
        call(p, p->phase, t->index);
        atomic_fetch_add(&p->done, 1);
        if (atomic_load(&p->caller_asleep))
            futex_wake_all(&p->done);
    }
    return NULL;
}

static int start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, fr_phase_fn_ex fn_ex,
                 void *arg, const char *owner, char *err, size_t err_len)
{
    *out = NULL;
    if (extra > ENTRY_JOINED_MASK) {
        fr_set_err(err, err_len, "%s: %u pool threads is too many", owner, extra);
        return -EINVAL;
    }
    fr_threadpool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fn = fn;
    p->fn_ex = fn_ex;
    p->arg = arg;
    p->threads = calloc(extra ? extra : 1, sizeof(*p->threads));
    if (!p->threads) {
        free(p);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < extra; i++) {
        fr_pool_thread *t = &p->threads[i];
        t->pool = p;
        t->index = i + 1;
        int rc = pthread_create(&t->thread, NULL, worker, t);
        if (rc != 0) {
            fr_threadpool_stop(p);
            fr_set_err(err, err_len, "%s: cannot start worker thread %u: %s", owner, i,
                       strerror(rc));
            return -rc;
        }
        /* Named so a profile or /proc/<pid>/task shows whose thread it is;
         * a name that does not fit (15 bytes) is only cosmetic. */
        char name[16];
        snprintf(name, sizeof(name), "fr-%.6s-%u", owner, (i + 1) % 1000u);
        (void)pthread_setname_np(t->thread, name);
        p->nthreads = i + 1;
    }
    fr_threadpool_set_spin(p, FR_POOL_SPIN_NS_DEFAULT);
    *out = p;
    return 0;
}

int fr_threadpool_start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, void *arg,
                        const char *owner, char *err, size_t err_len)
{
    return start(out, extra, fn, NULL, arg, owner, err, err_len);
}

int fr_threadpool_start_ex(fr_threadpool **out, unsigned extra, fr_phase_fn_ex fn, void *arg,
                           const char *owner, char *err, size_t err_len)
{
    return start(out, extra, NULL, fn, arg, owner, err, err_len);
}

void fr_threadpool_set_spin(fr_threadpool *p, long spin_ns)
{
    /* Polling pays only where every thread of the pool has a core of its
     * own; with more threads than cores a poller holds a core that one of
     * its own pool's threads wants (2-core VM, Reader with 4 psync threads,
     * cached 4 KiB files: 8.6 -> 12.3 us of CPU per file). */
    if (spin_ns < 0 || p->nthreads + 1 > fr_usable_cpus())
        spin_ns = 0;
    atomic_store(&p->spin_ns, spin_ns);
}

/* Hands out the phase, wakes the pool threads that sleep. */
static void publish(fr_threadpool *p, int phase, size_t count)
{
    unsigned job = atomic_load(&p->job) + 1;
    p->phase = phase;
    p->count = count;
    atomic_store(&p->next, 0);
    atomic_store(&p->done, 0);
    atomic_store(&p->entry, (uint64_t)job << 32);
    p->dispatched_ns = now_ns();
    atomic_fetch_add_explicit(&p->st_phases, 1, memory_order_relaxed);
    atomic_store(&p->job, job);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->job);
}

/* Waits until `joined` pool threads finished the phase. */
static void wait_done(fr_threadpool *p, unsigned joined)
{
    unsigned d;
    while ((d = atomic_load(&p->done)) < joined) {
        if (spin_adaptive(p, &p->caller_spin, &p->done, d))
            continue;
        atomic_store(&p->caller_asleep, 1);
        while ((d = atomic_load(&p->done)) < joined)
            futex_wait(&p->done, d);
        atomic_store(&p->caller_asleep, 0);
    }
}

static void dispatch(fr_threadpool *p, int phase, size_t count, int caller_works, int skip_late)
{
    publish(p, phase, count);
    if (caller_works)
        call(p, phase, 0);
    unsigned joined = p->nthreads;
    if (skip_late && atomic_load(&p->next) >= p->count) {
        /* Every item is claimed: threads not yet in the phase skip it. */
        uint64_t e = atomic_fetch_or(&p->entry, ENTRY_CLOSED);
        joined = (unsigned)(e & ENTRY_JOINED_MASK);
        if (joined == 0)
            atomic_fetch_add_explicit(&p->st_alone, 1, memory_order_relaxed);
    }
    wait_done(p, joined);
}

void fr_threadpool_run(fr_threadpool *p, int phase, size_t count)
{
    dispatch(p, phase, count, 1, 0);
}

void fr_threadpool_run_claimed(fr_threadpool *p, int phase, size_t count)
{
    dispatch(p, phase, count, 1, 1);
}

void fr_threadpool_run_helpers(fr_threadpool *p, int phase, size_t count)
{
    dispatch(p, phase, count, 0, 0);
}

int fr_threadpool_claim(fr_threadpool *p, size_t *k)
{
    *k = atomic_fetch_add(&p->next, 1);
    return *k < p->count;
}

unsigned fr_threadpool_size(const fr_threadpool *p) { return p->nthreads + 1; }

long fr_threadpool_stat(const fr_threadpool *p, const char *key)
{
    fr_threadpool *q = (fr_threadpool *)p; /* atomics are read, not changed */
    if (strcmp(key, "pool_spin_ns") == 0)
        return atomic_load(&q->spin_ns);
    if (strcmp(key, "pool_phases") == 0)
        return atomic_load(&q->st_phases);
    if (strcmp(key, "pool_joins") == 0)
        return atomic_load(&q->st_joins);
    if (strcmp(key, "pool_skips") == 0)
        return atomic_load(&q->st_skips);
    if (strcmp(key, "pool_sleeps") == 0)
        return atomic_load(&q->st_sleeps);
    if (strcmp(key, "pool_wake_ns") == 0)
        return atomic_load(&q->st_wake_ns);
    if (strcmp(key, "pool_alone") == 0)
        return atomic_load(&q->st_alone);
    if (strcmp(key, "pool_preempted") == 0)
        return atomic_load(&q->st_preempted);
    return -1;
}

void fr_threadpool_stop(fr_threadpool *p)
{
    if (!p)
        return;
    atomic_store(&p->exiting, 1);
    atomic_fetch_add(&p->job, 1);
    futex_wake_all(&p->job);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i].thread, NULL);
    free(p->threads);
    free(p);
}
