/*
 * GPU outputs of fastread's DALI operator: each batch read into a
 * page-locked host arena is copied to device memory on the caller's CUDA
 * stream (DALI's), and the batch goes back to the reader's pool only once an
 * event recorded after its copies says they are done. The copies are
 * asynchronous, so the operator never waits for them, and bounded: a ring of
 * `slots` batches in flight, the oldest waited for when all are taken.
 *
 * Per batch: one copy of the samples' bytes when they lie back to back in
 * the arena (dense batches, fr_batch.dense), else one per sample; and one
 * copy of the labels, from a page-locked buffer of the slot.
 *
 * C11, no DALI: built into the plugin and tested on its own against the mock
 * CUDA driver (dali_plugin/tests/test_upload_ring.c). A ring is used by one
 * thread at a time (the operator's); batches may be recycled from any thread
 * (fr_batch_recycle is thread-safe).
 */
#ifndef FASTREAD_UPLOAD_RING_H
#define FASTREAD_UPLOAD_RING_H

#include <stddef.h>
#include <stdint.h>

#include "fastread.h"
#include "gpu/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_upload_ring fr_upload_ring;

/* A ring of `slots` (>= 1) batches in flight over `gpu` (retained). 0, or
 * -errno with the reason in err (-ENOSYS: the driver has no events). */
int fr_upload_ring_open(fr_gpu *gpu, unsigned slots, fr_upload_ring **out, char *err,
                        size_t err_len);

/* Queues on `stream` the copies of `batch` to device memory: sample i to
 * data_dst + (the lengths of samples 0..i-1), labels[0..count) to
 * labels_dst; then records the slot's event. The ring owns the batch from
 * here, on failure too (it is recycled once the stream has finished with
 * it). 0, or -errno with the reason in err. */
int fr_upload_ring_push(fr_upload_ring *ring, fr_batch *batch, uint64_t data_dst,
                        const int32_t *labels, uint64_t labels_dst, fr_CUstream stream,
                        char *err, size_t err_len);

/* Recycles, oldest first, the batches whose copies are done; the number
 * recycled, or -errno when the driver reports an error. */
int fr_upload_ring_reap(fr_upload_ring *ring);

size_t fr_upload_ring_in_flight(const fr_upload_ring *ring);
/* Copies queued by the last push: 1 + 1 for a dense batch (bytes, labels). */
unsigned fr_upload_ring_last_copies(const fr_upload_ring *ring);

/* Waits for every copy in flight, recycles the batches and frees the ring. */
void fr_upload_ring_close(fr_upload_ring *ring);

#ifdef __cplusplus
}
#endif

#endif
