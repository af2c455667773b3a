/*
 * A fork-join pool of native threads for the engines that work on threads
 * (psync, xnvme-file): run(phase) has every pool thread and the caller call
 * fn(arg, phase) once and returns when all have returned. fn claims its own
 * work (an atomic counter, typically). One pool per engine context; run() is
 * called by one thread at a time.
 */
#ifndef FASTREAD_THREADPOOL_H
#define FASTREAD_THREADPOOL_H

typedef struct fr_threadpool fr_threadpool;
typedef void (*fr_phase_fn)(void *arg, int phase);

/* Starts `extra` threads besides the caller. 0, or -errno with a message. */
int fr_threadpool_start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, void *arg,
                        const char *owner, char *err, size_t err_len);
void fr_threadpool_run(fr_threadpool *pool, int phase);
/* Threads working on run(): the extra ones plus the caller. */
unsigned fr_threadpool_size(const fr_threadpool *pool);
void fr_threadpool_stop(fr_threadpool *pool);

#endif
