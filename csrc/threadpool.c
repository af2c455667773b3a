/* The fork-join pool behind the thread-based engines (threadpool.h). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "threadpool.h"

struct fr_threadpool {
    fr_phase_fn fn;
    void *arg;
    pthread_t *threads;
    unsigned nthreads;
    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    uint64_t job_id; /* bumped for each phase handed to the pool */
    unsigned busy;   /* threads still inside the current phase */
    int phase;
    int exiting;
    size_t count;       /* items of the current phase */
    atomic_size_t next; /* the next item to claim */
};

static void *worker(void *p_)
{
    fr_threadpool *p = p_;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->job_id == seen)
            pthread_cond_wait(&p->work_cv, &p->lock);
        seen = p->job_id;
        if (p->exiting)
            break;
        int phase = p->phase;
        pthread_mutex_unlock(&p->lock);
        p->fn(p->arg, phase);
        pthread_mutex_lock(&p->lock);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int fr_threadpool_start(fr_threadpool **out, unsigned extra, fr_phase_fn fn, void *arg,
                        const char *owner, char *err, size_t err_len)
{
    *out = NULL;
    fr_threadpool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fn = fn;
    p->arg = arg;
    p->threads = calloc(extra ? extra : 1, sizeof(pthread_t));
    if (!p->threads || pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p->threads);
        free(p);
        return -ENOMEM;
    }
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (unsigned i = 0; i < extra; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker, p);
        if (rc != 0) {
            fr_threadpool_stop(p);
            fr_set_err(err, err_len, "%s: cannot start worker thread %u: %s", owner, i,
                       strerror(rc));
            return -rc;
        }
        p->nthreads = i + 1;
    }
    *out = p;
    return 0;
}

void fr_threadpool_run(fr_threadpool *p, int phase, size_t count)
{
    pthread_mutex_lock(&p->lock);
    p->count = count;
    atomic_store(&p->next, 0);
    p->phase = phase;
    p->busy = p->nthreads;
    p->job_id++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->lock);

    p->fn(p->arg, phase); /* the caller works too */

    pthread_mutex_lock(&p->lock);
    while (p->busy > 0)
        pthread_cond_wait(&p->done_cv, &p->lock);
    pthread_mutex_unlock(&p->lock);
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
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
