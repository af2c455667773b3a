/* Engine registry and the context that dispatches to one engine. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "gpu.h"

static const fr_engine *const engines[] = {
#ifdef FASTREAD_HAVE_URING
    &fr_engine_uring,
#endif
    &fr_engine_psync,
#ifdef FASTREAD_HAVE_XNVME
    &fr_engine_xnvme_file,
    &fr_engine_xnvme,
#endif
    &fr_engine_cufile,
    NULL,
};

static const char *const engine_names[] = {
#ifdef FASTREAD_HAVE_URING
    "io_uring",
#endif
    "psync",
#ifdef FASTREAD_HAVE_XNVME
    "xnvme-file",
    "xnvme",
#endif
    "cufile",
    NULL,
};

struct fr_ctx {
    const fr_engine *engine;
    void *state;
    fr_gpu *gpu;        /* NULL for host-only contexts */
    fr_CUstream stream; /* this context's copies to and from the GPU */
    int device_output;
    /* The process that opened the context. A fork()ed child inherits the
     * context's memory but none of its helper threads (psync's pool, one
     * thread per io_uring ring), and io_uring's registered buffers still
     * point at the parent's pages: in a child every read would wait forever
     * for threads that do not exist, or land in the parent's memory. So a
     * child's calls fail with ECHILD, and its close frees what it safely
     * can. */
    pid_t pid;
};

void fr_config_init(fr_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->engine = "io_uring";
    cfg->queue_depth = 64;
    cfg->threads = 4;
    cfg->o_direct = 0;
    cfg->direct_alignment = 4096;
    cfg->register_buffers = 1;
    cfg->register_files = 1;
    cfg->engine_args = "";
    cfg->device_id = -1;
    cfg->pin_memory = 0;
    cfg->device_output = 0;
    cfg->gpu = NULL;
}

const char *const *fr_engine_names(void) { return engine_names; }

static const fr_engine *find_engine(const char *name)
{
    for (size_t i = 0; engines[i]; i++)
        if (strcmp(engines[i]->name, name) == 0)
            return engines[i];
    return NULL;
}

int fr_engine_probe(const char *engine, char *why, size_t why_len)
{
    const fr_engine *e = engine ? find_engine(engine) : NULL;
    if (!e) {
        fr_set_err(why, why_len, "engine '%s' is not compiled into this build",
                   engine ? engine : "(null)");
        return -ENOENT;
    }
    return e->probe(why, why_len);
}

static int check_config(const fr_config *cfg, char *err, size_t err_len)
{
    unsigned a = cfg->direct_alignment;
    if (a < 512 || (a & (a - 1)) != 0) {
        fr_set_err(err, err_len, "direct_alignment must be a power of two >= 512, got %u", a);
        return -EINVAL;
    }
    if (cfg->queue_depth == 0 || cfg->queue_depth > 4096) {
        fr_set_err(err, err_len, "queue_depth must be in 1..4096, got %u", cfg->queue_depth);
        return -EINVAL;
    }
    if (cfg->threads > 1024) {
        fr_set_err(err, err_len, "threads must be in 0..1024, got %u", cfg->threads);
        return -EINVAL;
    }
    if (cfg->device_id < 0 && (cfg->device_output || cfg->pin_memory)) {
        fr_set_err(err, err_len, "%s needs a device_id (a CUDA device number)",
                   cfg->device_output ? "device output" : "pin_memory");
        return -EINVAL;
    }
    if (cfg->gpu && fr_gpu_device_id(cfg->gpu) != cfg->device_id) {
        fr_set_err(err, err_len, "the gpu handed in is device %d, not device_id %d",
                   fr_gpu_device_id(cfg->gpu), cfg->device_id);
        return -EINVAL;
    }
    return 0;
}

int fr_ctx_open(const fr_config *cfg, fr_ctx **out, char *err, size_t err_len)
{
    *out = NULL;
    const fr_engine *e = cfg->engine ? find_engine(cfg->engine) : NULL;
    if (!e) {
        fr_set_err(err, err_len, "unknown engine '%s'", cfg->engine ? cfg->engine : "(null)");
        return -ENOENT;
    }
    int rc = check_config(cfg, err, err_len);
    if (rc)
        return rc;
    fr_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->engine = e;
    ctx->device_output = cfg->device_output;
    ctx->pid = getpid();
    fr_config local = *cfg;
    /* CUDA is loaded only for a context that has GPU work to do. */
    if (cfg->device_id >= 0 &&
        (cfg->device_output || cfg->pin_memory || e == &fr_engine_cufile)) {
        if (cfg->gpu) {
            fr_gpu_retain(cfg->gpu);
            ctx->gpu = cfg->gpu;
        } else if ((rc = fr_gpu_open(cfg->device_id, &ctx->gpu, err, err_len))) {
            free(ctx);
            return rc;
        }
        if ((rc = fr_gpu_stream_create(ctx->gpu, &ctx->stream))) {
            fr_gpu_last_error(ctx->gpu, err, err_len);
            fr_gpu_close(ctx->gpu);
            free(ctx);
            return rc;
        }
        local.gpu = ctx->gpu;
    }
    rc = e->open(&local, &ctx->state, err, err_len);
    if (rc) {
        fr_gpu_stream_destroy(ctx->gpu, ctx->stream);
        fr_gpu_close(ctx->gpu);
        free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

void fr_ctx_close(fr_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->pid != getpid()) {
        /* A forked child: the engine's close would join threads that only
         * exist in the parent, and the GPU's driver state is the parent's.
         * The engine's state is left to the child's exit. */
        free(ctx);
        return;
    }
    ctx->engine->close(ctx->state);
    if (ctx->gpu) {
        fr_gpu_stream_destroy(ctx->gpu, ctx->stream);
        fr_gpu_close(ctx->gpu);
    }
    free(ctx);
}

fr_gpu *fr_ctx_gpu(const fr_ctx *ctx) { return ctx->gpu; }

const char *fr_ctx_engine(const fr_ctx *ctx) { return ctx->engine->name; }

/* Readies batch for n samples: 1 if there is reading to do, else 0 or -errno. */
static int begin_batch(fr_batch *batch, size_t n)
{
    if (batch->samples_cap < n)
        return -EINVAL;
    batch->count = n;
    batch->status = 0;
    batch->where = FR_ON_HOST;
    return n > 0;
}

/* Moves a read batch to where the caller wants it: to the GPU for device
 * output, back to the host when an engine read into the GPU for a host
 * caller. One copy of the arena's used region either way. */
static int end_batch(fr_ctx *ctx, fr_batch *batch, int rc)
{
    if (rc == 0 && ctx->gpu) {
        if (ctx->device_output && !(batch->where & FR_ON_DEVICE)) {
            rc = fr_gpu_upload(ctx->gpu, ctx->stream, batch);
            if (rc == 0)
                batch->where |= FR_ON_DEVICE;
        } else if (!ctx->device_output && !(batch->where & FR_ON_HOST)) {
            rc = fr_gpu_download(ctx->gpu, ctx->stream, batch);
            if (rc == 0)
                batch->where |= FR_ON_HOST;
        }
    }
    return batch->status = rc;
}

int fr_read_files(fr_ctx *ctx, const char *const *paths, const int64_t *size_hints, size_t n,
                  fr_batch *batch)
{
    if (ctx->pid != getpid())
        return -ECHILD; /* opened by the parent process: see struct fr_ctx */
    int rc = begin_batch(batch, n);
    if (rc <= 0)
        return rc;
    return end_batch(ctx, batch,
                     ctx->engine->read_files(ctx->state, paths, size_hints, n, batch));
}

int fr_read_ranges(fr_ctx *ctx, const char *path, const fr_range *ranges, size_t n,
                   fr_batch *batch)
{
    if (!ctx->engine->read_ranges)
        return -ENOTSUP;
    if (ctx->pid != getpid())
        return -ECHILD;
    int rc = begin_batch(batch, n);
    if (rc <= 0)
        return rc;
    return end_batch(ctx, batch, ctx->engine->read_ranges(ctx->state, path, ranges, n, batch));
}

long fr_ctx_stat(const fr_ctx *ctx, const char *key)
{
    return ctx->engine->stat ? ctx->engine->stat(ctx->state, key) : -1;
}
