/* GPU outputs of fastread's DALI operator: see upload_ring.h. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign, sysconf */
#include "upload_ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base.h"

typedef struct upload_slot {
    fr_batch *batch; /* NULL: free */
    void *event;
    int32_t *labels; /* page-locked when `labels_pinned` */
    size_t labels_cap; /* in labels */
    int labels_pinned;
} upload_slot;

struct fr_upload_ring {
    fr_gpu *gpu;
    upload_slot *slots;
    unsigned nslots;
    unsigned head;  /* oldest batch in flight */
    unsigned count; /* batches in flight */
    unsigned last_copies;
};

/* Recycles the oldest batch once its event is done (wait: block for it). */
static int retire_oldest(fr_upload_ring *r, int wait)
{
    upload_slot *s = &r->slots[r->head];
    int rc = wait ? fr_gpu_event_wait(r->gpu, s->event) : fr_gpu_event_query(r->gpu, s->event);
    if (rc == -EAGAIN)
        return rc;
    if (rc != 0) {
        /* The driver cannot say whether the copy is done (a sticky CUDA
         * error): the batch stays out of the pool for good rather than be
         * read into under a copy. The error goes to the caller. */
        s->batch = NULL;
    } else {
        fr_batch_recycle(s->batch);
        s->batch = NULL;
    }
    r->head = (r->head + 1) % r->nslots;
    r->count--;
    return rc;
}

int fr_upload_ring_open(fr_gpu *gpu, unsigned slots, fr_upload_ring **out, char *err,
                        size_t err_len)
{
    *out = NULL;
    if (!gpu || slots == 0) {
        fr_set_err(err, err_len, "upload ring: needs a GPU and at least one slot");
        return -EINVAL;
    }
    fr_upload_ring *r = calloc(1, sizeof(*r));
    if (!r || !(r->slots = calloc(slots, sizeof(*r->slots)))) {
        free(r);
        fr_set_err(err, err_len, "upload ring: out of memory");
        return -ENOMEM;
    }
    fr_gpu_retain(gpu);
    r->gpu = gpu;
    r->nslots = slots;
    for (unsigned i = 0; i < slots; i++) {
        int rc = fr_gpu_event_create(gpu, &r->slots[i].event);
        if (rc) {
            char cuda[FR_ERRLEN];
            fr_gpu_last_error(gpu, cuda, sizeof(cuda));
            fr_set_err(err, err_len, "upload ring: cannot create a CUDA event: %s",
                       rc == -ENOSYS ? "the CUDA driver has no event API" : cuda);
            fr_upload_ring_close(r);
            return rc;
        }
    }
    *out = r;
    return 0;
}

/* The slot's labels buffer, at least n labels; page-locked where the driver
 * allows (else the tiny copy goes through the driver's staging). */
static int labels_reserve(fr_upload_ring *r, upload_slot *s, size_t n)
{
    if (n <= s->labels_cap)
        return 0;
    if (s->labels_pinned)
        fr_gpu_host_unregister(r->gpu, s->labels);
    free(s->labels);
    s->labels_pinned = 0;
    s->labels_cap = 0;
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 0 ? (size_t)page : 4096;
    size_t bytes = fr_round_up(n * sizeof(int32_t), align);
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0)
        return -ENOMEM;
    s->labels = p;
    s->labels_cap = bytes / sizeof(int32_t);
    s->labels_pinned = fr_gpu_host_register(r->gpu, p, bytes) == 0;
    return 0;
}

/* The samples lie back to back in the arena: one copy moves them all. */
static int back_to_back(const fr_batch *b)
{
    uint64_t end = b->count ? b->samples[0].offset : 0;
    for (size_t i = 0; i < b->count; i++) {
        if (b->samples[i].length < 0 || b->samples[i].offset != end)
            return 0;
        end += (uint64_t)b->samples[i].length;
    }
    return 1;
}

static int queue_copies(fr_upload_ring *r, upload_slot *s, uint64_t data_dst,
                        const int32_t *labels, uint64_t labels_dst, fr_CUstream stream)
{
    const fr_batch *b = s->batch;
    unsigned copies = 0;
    int rc = 0;
    if (b->count && back_to_back(b)) {
        uint64_t first = b->samples[0].offset;
        size_t bytes = 0;
        for (size_t i = 0; i < b->count; i++)
            bytes += (size_t)b->samples[i].length;
        if (bytes)
            rc = fr_gpu_copy_htod_async(r->gpu, data_dst, b->arena.base + first, bytes, stream);
        copies += bytes != 0;
    } else {
        uint64_t dst = data_dst;
        for (size_t i = 0; i < b->count && rc == 0; i++) {
            const fr_sample *smp = &b->samples[i];
            if (smp->length < 0)
                return -EINVAL; /* the caller hands out only batches read whole */
            if (smp->length > 0) {
                rc = fr_gpu_copy_htod_async(r->gpu, dst, b->arena.base + smp->offset,
                                            (size_t)smp->length, stream);
                copies++;
            }
            dst += (uint64_t)smp->length;
        }
    }
    if (rc == 0 && b->count && labels) {
        rc = labels_reserve(r, s, b->count);
        if (rc == 0) {
            memcpy(s->labels, labels, b->count * sizeof(int32_t));
            rc = fr_gpu_copy_htod_async(r->gpu, labels_dst, s->labels,
                                        b->count * sizeof(int32_t), stream);
            copies++;
        }
    }
    if (rc == 0)
        rc = fr_gpu_event_record(r->gpu, s->event, stream);
    r->last_copies = copies;
    return rc;
}

int fr_upload_ring_push(fr_upload_ring *r, fr_batch *batch, uint64_t data_dst,
                        const int32_t *labels, uint64_t labels_dst, fr_CUstream stream,
                        char *err, size_t err_len)
{
    if (r->count == r->nslots) {
        /* Every slot in flight: the oldest copy was queued nslots batches
         * ago, so this wait is rare (the GPU fell that far behind). */
        int rc = retire_oldest(r, 1);
        if (rc) {
            char cuda[FR_ERRLEN];
            fr_gpu_last_error(r->gpu, cuda, sizeof(cuda));
            fr_set_err(err, err_len, "waiting for an earlier batch's copy to the GPU: %s", cuda);
            fr_batch_recycle(batch);
            return rc;
        }
    }
    upload_slot *s = &r->slots[(r->head + r->count) % r->nslots];
    s->batch = batch;
    int rc = queue_copies(r, s, data_dst, labels, labels_dst, stream);
    if (rc) {
        char cuda[FR_ERRLEN];
        fr_gpu_last_error(r->gpu, cuda, sizeof(cuda));
        fr_set_err(err, err_len, "copying a batch of %zu samples to the GPU: %s", batch->count,
                   rc == -ENOMEM ? "out of host memory" : rc == -EINVAL ? "a sample failed" : cuda);
        /* Copies already queued may still read the arena: recycle it only
         * once the stream has drained (never, if that fails too). */
        if (fr_gpu_stream_wait(r->gpu, stream) == 0)
            fr_batch_recycle(batch);
        s->batch = NULL;
        return rc;
    }
    r->count++;
    return 0;
}

int fr_upload_ring_reap(fr_upload_ring *r)
{
    int done = 0;
    while (r->count) {
        int rc = retire_oldest(r, 0);
        if (rc == -EAGAIN)
            break;
        if (rc)
            return rc;
        done++;
    }
    return done;
}

size_t fr_upload_ring_in_flight(const fr_upload_ring *r) { return r->count; }

unsigned fr_upload_ring_last_copies(const fr_upload_ring *r) { return r->last_copies; }

void fr_upload_ring_close(fr_upload_ring *r)
{
    if (!r)
        return;
    while (r->count)
        (void)retire_oldest(r, 1);
    for (unsigned i = 0; i < r->nslots; i++) {
        upload_slot *s = &r->slots[i];
        if (s->event)
            fr_gpu_event_destroy(r->gpu, s->event);
        if (s->labels_pinned)
            fr_gpu_host_unregister(r->gpu, s->labels);
        free(s->labels);
    }
    free(r->slots);
    fr_gpu_close(r->gpu);
    free(r);
}
