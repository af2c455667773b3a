/*
 * A reader: one native thread that owns an engine context and reads
 * submitted batches ahead of the consumer, at most `prefetch` finished
 * batches waiting. Batches come back in submission order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct request {
    int64_t *indices;
    size_t n;
    struct request *next;
} request;

struct fr_reader {
    fr_config cfg;
    char engine[32];
    char *blob;
    const char **paths;
    int64_t *sizes; /* each file's size when last read, -1 before; reader thread only */
    size_t npaths;
    unsigned prefetch;
    fr_pool *pool;

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t ready_cv;
    request *req_head, *req_tail;
    fr_batch *ready_head, *ready_tail;
    size_t nready;
    size_t outstanding; /* submitted and not yet taken, this generation */
    uint64_t generation; /* bumped by reset: work of older generations is dropped */
    uint64_t seq;
    int stop;

    int started;
    int open_rc;
    char open_err[FR_ERRLEN];
};

static void free_requests(request *r)
{
    while (r) {
        request *next = r->next;
        free(r->indices);
        free(r);
        r = next;
    }
}

typedef struct scratch {
    const char **paths;
    int64_t *hints;
    size_t cap;
} scratch;

static int read_request(fr_reader *rd, fr_ctx *ctx, const request *req, fr_batch *b, scratch *sc)
{
    int rc = fr_batch_prepare(b, req->n);
    if (rc)
        return rc;
    if (req->n > sc->cap) {
        const char **p = realloc(sc->paths, req->n * sizeof(*p));
        if (!p)
            return -ENOMEM;
        sc->paths = p;
        int64_t *h = realloc(sc->hints, req->n * sizeof(*h));
        if (!h)
            return -ENOMEM;
        sc->hints = h;
        sc->cap = req->n;
    }
    for (size_t i = 0; i < req->n; i++) {
        int64_t idx = req->indices[i];
        b->indices[i] = idx;
        sc->paths[i] = rd->paths[idx];
        sc->hints[i] = rd->sizes[idx];
    }
    rc = fr_read_files(ctx, sc->paths, sc->hints, req->n, b);
    if (rc == 0)
        for (size_t i = 0; i < req->n; i++)
            rd->sizes[req->indices[i]] = b->samples[i].length >= 0 ? b->samples[i].length : -1;
    return rc;
}

static void *reader_main(void *arg)
{
    fr_reader *rd = arg;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    /* The context is opened here so the thread that submits also set it up. */
    int rc = fr_ctx_open(&rd->cfg, &ctx, err, sizeof(err));
    pthread_mutex_lock(&rd->lock);
    rd->open_rc = rc;
    memcpy(rd->open_err, err, sizeof(err));
    rd->started = 1;
    pthread_cond_broadcast(&rd->ready_cv);
    if (rc) {
        pthread_mutex_unlock(&rd->lock);
        return NULL;
    }

    scratch sc = {NULL, NULL, 0};
    while (!rd->stop) {
        if (!rd->req_head || rd->nready >= rd->prefetch) {
            pthread_cond_wait(&rd->work_cv, &rd->lock);
            continue;
        }
        request *req = rd->req_head;
        rd->req_head = req->next;
        if (!rd->req_head)
            rd->req_tail = NULL;
        uint64_t gen = rd->generation;
        uint64_t seq = rd->seq++;
        pthread_mutex_unlock(&rd->lock);

        fr_batch *b = fr_pool_get(rd->pool);
        if (b) {
            b->seq = seq;
            rc = read_request(rd, ctx, req, b, &sc);
            if (rc) {
                b->count = 0;
                b->status = rc;
            }
        }
        free(req->indices);
        free(req);

        pthread_mutex_lock(&rd->lock);
        if (gen != rd->generation) {
            pthread_mutex_unlock(&rd->lock);
            fr_batch_recycle(b);
            pthread_mutex_lock(&rd->lock);
            continue;
        }
        if (!b) {
            /* No memory for even a batch header: report it through the
             * consumer rather than dropping the request. */
            rd->open_rc = -ENOMEM;
            rd->stop = 1;
            pthread_cond_broadcast(&rd->ready_cv);
            break;
        }
        b->next = NULL;
        if (rd->ready_tail)
            rd->ready_tail->next = b;
        else
            rd->ready_head = b;
        rd->ready_tail = b;
        rd->nready++;
        pthread_cond_broadcast(&rd->ready_cv);
    }
    pthread_mutex_unlock(&rd->lock);
    free(sc.paths);
    free(sc.hints);
    fr_ctx_close(ctx);
    return NULL;
}

int fr_reader_open(const fr_config *cfg, const char *const *paths, size_t npaths,
                   unsigned prefetch, fr_reader **out, char *err, size_t err_len)
{
    *out = NULL;
    if (prefetch == 0) {
        fr_set_err(err, err_len, "prefetch must be at least 1");
        return -EINVAL;
    }
    fr_reader *rd = calloc(1, sizeof(*rd));
    if (!rd)
        return -ENOMEM;
    rd->cfg = *cfg;
    snprintf(rd->engine, sizeof(rd->engine), "%s", cfg->engine ? cfg->engine : "");
    rd->cfg.engine = rd->engine;
    rd->prefetch = prefetch;
    rd->npaths = npaths;

    size_t total = 0;
    for (size_t i = 0; i < npaths; i++)
        total += strlen(paths[i]) + 1;
    rd->blob = malloc(total ? total : 1);
    rd->paths = malloc((npaths ? npaths : 1) * sizeof(char *));
    rd->sizes = malloc((npaths ? npaths : 1) * sizeof(int64_t));
    rd->pool = fr_pool_new();
    if (!rd->blob || !rd->paths || !rd->sizes || !rd->pool) {
        fr_pool_close(rd->pool);
        free(rd->blob);
        free(rd->paths);
        free(rd->sizes);
        free(rd);
        return -ENOMEM;
    }
    char *p = rd->blob;
    for (size_t i = 0; i < npaths; i++) {
        size_t len = strlen(paths[i]) + 1;
        memcpy(p, paths[i], len);
        rd->paths[i] = p;
        rd->sizes[i] = -1;
        p += len;
    }
    pthread_mutex_init(&rd->lock, NULL);
    pthread_cond_init(&rd->work_cv, NULL);
    pthread_cond_init(&rd->ready_cv, NULL);

    int rc = pthread_create(&rd->thread, NULL, reader_main, rd);
    if (rc != 0) {
        fr_set_err(err, err_len, "cannot start the reader thread: %s", strerror(rc));
        rd->started = 0;
        fr_pool_close(rd->pool);
        free(rd->blob);
        free(rd->paths);
        free(rd->sizes);
        free(rd);
        return -rc;
    }
    pthread_mutex_lock(&rd->lock);
    while (!rd->started)
        pthread_cond_wait(&rd->ready_cv, &rd->lock);
    rc = rd->open_rc;
    pthread_mutex_unlock(&rd->lock);
    if (rc) {
        fr_set_err(err, err_len, "%s", rd->open_err);
        fr_reader_close(rd);
        return rc;
    }
    *out = rd;
    return 0;
}

int fr_reader_submit(fr_reader *rd, const int64_t *indices, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (indices[i] < 0 || (size_t)indices[i] >= rd->npaths)
            return -EINVAL;
    request *req = malloc(sizeof(*req));
    int64_t *copy = malloc((n ? n : 1) * sizeof(*copy));
    if (!req || !copy) {
        free(req);
        free(copy);
        return -ENOMEM;
    }
    memcpy(copy, indices, n * sizeof(*copy));
    req->indices = copy;
    req->n = n;
    req->next = NULL;
    pthread_mutex_lock(&rd->lock);
    if (rd->req_tail)
        rd->req_tail->next = req;
    else
        rd->req_head = req;
    rd->req_tail = req;
    rd->outstanding++;
    pthread_cond_signal(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    return 0;
}

int fr_reader_next(fr_reader *rd, fr_batch **out)
{
    *out = NULL;
    pthread_mutex_lock(&rd->lock);
    if (rd->outstanding == 0) {
        pthread_mutex_unlock(&rd->lock);
        return -ENODATA;
    }
    while (rd->nready == 0 && !rd->stop)
        pthread_cond_wait(&rd->ready_cv, &rd->lock);
    if (rd->nready == 0) {
        int rc = rd->open_rc ? rd->open_rc : -EPIPE;
        pthread_mutex_unlock(&rd->lock);
        return rc;
    }
    fr_batch *b = rd->ready_head;
    rd->ready_head = b->next;
    if (!rd->ready_head)
        rd->ready_tail = NULL;
    rd->nready--;
    rd->outstanding--;
    b->next = NULL;
    pthread_cond_signal(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    *out = b;
    return 0;
}

void fr_reader_reset(fr_reader *rd)
{
    pthread_mutex_lock(&rd->lock);
    request *reqs = rd->req_head;
    fr_batch *ready = rd->ready_head;
    rd->req_head = rd->req_tail = NULL;
    rd->ready_head = rd->ready_tail = NULL;
    rd->nready = 0;
    rd->outstanding = 0;
    rd->generation++;
    pthread_cond_signal(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    free_requests(reqs);
    while (ready) {
        fr_batch *next = ready->next;
        fr_batch_recycle(ready);
        ready = next;
    }
}

size_t fr_reader_pending(fr_reader *rd)
{
    pthread_mutex_lock(&rd->lock);
    size_t n = rd->outstanding;
    pthread_mutex_unlock(&rd->lock);
    return n;
}

const char *fr_reader_path(const fr_reader *rd, size_t index)
{
    return index < rd->npaths ? rd->paths[index] : NULL;
}

size_t fr_reader_size(const fr_reader *rd) { return rd->npaths; }

fr_pool *fr_reader_pool(fr_reader *rd) { return rd->pool; }

void fr_reader_close(fr_reader *rd)
{
    if (!rd)
        return;
    fr_reader_reset(rd);
    pthread_mutex_lock(&rd->lock);
    rd->stop = 1;
    pthread_cond_broadcast(&rd->work_cv);
    pthread_mutex_unlock(&rd->lock);
    pthread_join(rd->thread, NULL);
    pthread_cond_destroy(&rd->work_cv);
    pthread_cond_destroy(&rd->ready_cv);
    pthread_mutex_destroy(&rd->lock);
    /* Batches the caller still holds keep the pool, and their memory, alive. */
    fr_pool_close(rd->pool);
    free(rd->blob);
    free(rd->paths);
    free(rd->sizes);
    free(rd);
}
