/*
 * A fork-join pool of native threads for the engines that work on threads
 * (psync, xnvme-file, cufile): run(phase, count) has every pool thread and
 * the caller call fn(arg, phase) once and returns when all have returned.
 * Inside fn each thread takes items 0..count-1 with claim() until none is
 * left. One pool per engine context; run() is called by one thread at a time.
 */
#ifndef FASTREAD_THREADPOOL_H
#define FASTREAD_THREADPOOL_H

#include <stddef.h>

typedef struct fr_threadpool fr_threadpool;
typedef void (*fr_phase_fn)(void *arg, int phase);

/* Starts `extra` threads besides the caller. 0, or -errno with a message. */
int fr_threadpool_start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, void *arg,
                        const char *owner, char *err, size_t err_len);
void fr_threadpool_run(fr_threadpool *pool, int phase, size_t count);
/* The next unclaimed item of the running phase in *k: 1, or 0 when all are taken. */
int fr_threadpool_claim(fr_threadpool *pool, size_t *k);
/* Threads working on run(): the extra ones plus the caller. */
unsigned fr_threadpool_size(const fr_threadpool *pool);
void fr_threadpool_stop(fr_threadpool *pool);

#endif
