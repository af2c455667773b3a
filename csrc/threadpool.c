/* The fork-join pool behind the thread-based engines (threadpool.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "threadpool.h"

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
    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    uint64_t job_id; /* bumped for each phase handed to the pool */
    unsigned busy;   /* threads still inside the current phase */
    unsigned started; /* pool threads that began the current phase */
    int closed;       /* the current phase takes no more threads (run_claimed) */
    int phase;
    int exiting;
    size_t count;       /* items of the current phase */
    atomic_size_t next; /* the next item to claim */
};

static void call(fr_threadpool *p, int phase, unsigned index)
{
    if (p->fn_ex)
        p->fn_ex(p->arg, phase, index);
    else
        p->fn(p->arg, phase);
}

static void *worker(void *t_)
{
    fr_pool_thread *t = t_;
    fr_threadpool *p = t->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->job_id == seen)
            pthread_cond_wait(&p->work_cv, &p->lock);
        seen = p->job_id;
        if (p->exiting)
            break;
        if (p->closed)
            continue; /* run_claimed finished it without us: not counted in busy */
        p->started++;
        int phase = p->phase;
        pthread_mutex_unlock(&p->lock);
        call(p, phase, t->index);
        pthread_mutex_lock(&p->lock);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static int start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, fr_phase_fn_ex fn_ex,
                 void *arg, const char *owner, char *err, size_t err_len)
{
    *out = NULL;
    fr_threadpool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fn = fn;
    p->fn_ex = fn_ex;
    p->arg = arg;
    p->threads = calloc(extra ? extra : 1, sizeof(*p->threads));
    if (!p->threads || pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p->threads);
        free(p);
        return -ENOMEM;
    }
    if (pthread_cond_init(&p->work_cv, NULL) != 0 || pthread_cond_init(&p->done_cv, NULL) != 0) {
        /* Never fails on Linux (no attributes); checked all the same. */
        fr_set_err(err, err_len, "%s: cannot create the pool's condition variables", owner);
        free(p->threads);
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

static void dispatch(fr_threadpool *p, int phase, size_t count, int caller_works, int skip_late)
{
    pthread_mutex_lock(&p->lock);
    p->count = count;
    atomic_store(&p->next, 0);
    p->phase = phase;
    p->busy = p->nthreads;
    p->started = 0;
    p->closed = 0;
    p->job_id++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->lock);

    if (caller_works)
        call(p, phase, 0);

    pthread_mutex_lock(&p->lock);
    if (skip_late && atomic_load(&p->next) >= p->count) {
        /* Every item is claimed: threads not yet in the phase skip it. */
        p->closed = 1;
        p->busy -= p->nthreads - p->started;
    }
    while (p->busy > 0)
        pthread_cond_wait(&p->done_cv, &p->lock);
    pthread_mutex_unlock(&p->lock);
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

void fr_threadpool_stop(fr_threadpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->exiting = 1;
    p->job_id++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i].thread, NULL);
    free(p->threads);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
