/*
 * A fork-join pool of native threads for the engines that work on threads
 * (psync, xnvme-file, cufile, and io_uring's rings): run(phase, count) has
 * every pool thread and the caller call fn(arg, phase) once and returns when
 * all have returned. Inside fn each thread takes items 0..count-1 with
 * claim() until none is left. One pool per engine context; run() is called
 * by one thread at a time.
 *
 * The _ex variants tell fn which thread it runs on (0: the caller, 1..extra:
 * the pool's own threads, each always the same OS thread), for engines that
 * keep per-thread kernel state that must stay on one thread (an io_uring
 * ring set up with IORING_SETUP_SINGLE_ISSUER); run_helpers() runs a phase
 * on the pool's threads only, so the caller, which may be a different thread
 * each call, never touches that state.
 *
 * Between phases a pool thread polls for the next one for spin_ns (yielding
 * its core between polls), then sleeps: back-to-back phases and calls find
 * the threads awake, an idle pool costs nothing (see threadpool.c).
 */
#ifndef FASTREAD_THREADPOOL_H
#define FASTREAD_THREADPOOL_H

#include <stddef.h>

typedef struct fr_threadpool fr_threadpool;

/* How long pool threads (and a caller waiting for them) poll before they
 * sleep, unless fr_threadpool_set_spin says otherwise: fr_config.spin_us's
 * default (fastread.h says why this much). */
#define FR_POOL_SPIN_NS_DEFAULT 50000L
typedef void (*fr_phase_fn)(void *arg, int phase);
typedef void (*fr_phase_fn_ex)(void *arg, int phase, unsigned worker);

/* Starts `extra` threads besides the caller. 0, or -errno with a message. */
int fr_threadpool_start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, void *arg,
                        const char *owner, char *err, size_t err_len);
int fr_threadpool_start_ex(fr_threadpool **out, unsigned extra, fr_phase_fn_ex fn, void *arg,
                           const char *owner, char *err, size_t err_len);
void fr_threadpool_run(fr_threadpool *pool, int phase, size_t count);
/* As run(), for a phase whose only work is claimed items, which the caller's
 * fn claims until none is left: once it returns with every item claimed,
 * pool threads that have not yet begun the phase skip it (they never call
 * fn) and run_claimed waits only for those inside it. On a busy machine a
 * woken thread may wait tens of microseconds for a core; a short phase the
 * caller finished alone need not wait for it. */
void fr_threadpool_run_claimed(fr_threadpool *pool, int phase, size_t count);
/* Runs the phase on the pool's `extra` threads only (workers 1..extra) and
 * waits for them; the caller does not call fn. Needs extra >= 1. */
void fr_threadpool_run_helpers(fr_threadpool *pool, int phase, size_t count);
/* The next unclaimed item of the running phase in *k: 1, or 0 when all are taken. */
int fr_threadpool_claim(fr_threadpool *pool, size_t *k);
/* Sets how long threads poll before sleeping (0: sleep at once); 0 too
 * where the pool has more threads (caller included) than the process has
 * CPUs. Any thread, any time; takes effect at the next wait. */
void fr_threadpool_set_spin(fr_threadpool *pool, long spin_ns);
/* Cumulative counters, -1 for an unknown key: "pool_phases" (phases run),
 * "pool_joins" (times a pool thread worked in one), "pool_skips" (times one
 * came too late: the caller had claimed every item), "pool_alone" (phases the
 * caller finished with no pool thread), "pool_sleeps" (waits that ended in
 * the kernel rather than while polling), "pool_wake_ns" (sum over joins of
 * the time from hand-out to the thread's start), "pool_spin_ns". Any thread
 * may read them. */
long fr_threadpool_stat(const fr_threadpool *pool, const char *key);
/* Threads working on run(): the extra ones plus the caller. */
unsigned fr_threadpool_size(const fr_threadpool *pool);
void fr_threadpool_stop(fr_threadpool *pool);

#endif
