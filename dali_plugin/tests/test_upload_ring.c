/* The DALI operator's GPU outputs (dali_plugin/upload_ring.c) against the
 * mock CUDA driver, whose device memory is host memory: the bytes and labels
 * land back to back at the destination, a dense batch takes one copy of its
 * bytes (plus one of its labels) and a sparse one one per sample, copies come
 * from page-locked memory, a batch returns to the pool only once its copy's
 * event is done (MOCK_CUDA_EVENT_BUSY keeps events "not ready"), a full ring
 * waits for its oldest copy, and closing frees every pin. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "harness.h"
#include "upload_ring.h"

#define NFILES 24
#define BATCH 8

static long (*live_cuda)(const char *);

static char *paths[NFILES];
static size_t sizes[NFILES];

/* 1 if device memory at dst holds the files of `idx` back to back. */
static int packed_on_device(uint64_t dst, const int64_t *idx, size_t n)
{
    const uint8_t *dev = (const uint8_t *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) {
        FILE *f = fopen(paths[idx[i]], "rb");
        if (!f)
            return 0;
        uint8_t *want = malloc(sizes[idx[i]] + 1);
        size_t got = want ? fread(want, 1, sizes[idx[i]] + 1, f) : 0;
        fclose(f);
        int same = want && got == sizes[idx[i]] && memcmp(dev, want, got) == 0;
        free(want);
        if (!same)
            return 0;
        dev += got;
    }
    return 1;
}

static fr_reader *open_reader(int dense)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "psync";
    cfg.device_id = 0;
    cfg.pin_memory = 1;
    fr_reader *rd = NULL;
    char err[FR_ERRLEN] = "";
    int rc = fr_reader_open(&cfg, (const char *const *)paths, NFILES, 2, 1, &rd, err, sizeof(err));
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "fr_reader_open: %s\n", err);
        return NULL;
    }
    /* As the operator does: mark the batches the reader will read into. */
    fr_batch *held[8];
    for (int i = 0; i < 8; i++) {
        held[i] = fr_pool_get(fr_reader_pool(rd));
        CHECK(held[i] != NULL);
        if (held[i])
            held[i]->dense = dense;
    }
    for (int i = 0; i < 8; i++)
        if (held[i])
            fr_batch_recycle(held[i]);
    return rd;
}

static fr_batch *read_batch(fr_reader *rd, const int64_t *idx)
{
    CHECK(fr_reader_submit(rd, idx, BATCH) == 0);
    fr_batch *b = NULL;
    CHECK(fr_reader_next(rd, &b) == 0 && b && b->status == 0);
    return b;
}

static void check_copies(int dense)
{
    fr_reader *rd = open_reader(dense);
    if (!rd)
        return;
    fr_gpu *gpu = fr_reader_gpu(rd);
    CHECK(gpu != NULL);
    fr_upload_ring *ring = NULL;
    char err[FR_ERRLEN] = "";
    CHECK(fr_upload_ring_open(gpu, 3, &ring, err, sizeof(err)) == 0);
    uint64_t data = 0, labels_dst = 0;
    size_t total = 0;
    for (int i = 0; i < NFILES; i++)
        total += sizes[i];
    CHECK(fr_gpu_alloc(gpu, total, &data) == 0);
    CHECK(fr_gpu_alloc(gpu, BATCH * sizeof(int32_t), &labels_dst) == 0);

    long pageable0 = live_cuda("pageable_copies");
    for (int round = 0; round < NFILES / BATCH; round++) {
        int64_t idx[BATCH];
        int32_t labels[BATCH];
        size_t nonempty = 0;
        for (int i = 0; i < BATCH; i++) {
            idx[i] = (round * BATCH + i * 5) % NFILES;
            labels[i] = 1000 * round + i;
            nonempty += sizes[idx[i]] > 0;
        }
        fr_batch *b = read_batch(rd, idx);
        if (!b)
            break;
        CHECK(fr_upload_ring_push(ring, b, data, labels, labels_dst, NULL, err, sizeof(err)) == 0);
        /* Dense: the batch's bytes in one copy, and the labels. */
        CHECK(fr_upload_ring_last_copies(ring) == (dense ? 2u : nonempty + 1));
        CHECK(packed_on_device(data, idx, BATCH));
        CHECK(memcmp((const void *)(uintptr_t)labels_dst, labels, sizeof(labels)) == 0);
        CHECK(fr_upload_ring_reap(ring) == 1); /* the mock's copies are done at once */
        CHECK(fr_upload_ring_in_flight(ring) == 0);
    }
    /* Every copy from page-locked memory: arenas and the labels' buffers. */
    CHECK(live_cuda("pageable_copies") == pageable0);

    /* A copy still running (its event not ready): the batch stays out of
     * the pool until the event is done. */
    int64_t idx[BATCH] = {0, 1, 2, 3, 4, 5, 6, 7};
    setenv("MOCK_CUDA_EVENT_BUSY", "2", 1);
    fr_batch *b = read_batch(rd, idx);
    size_t idle = fr_pool_bytes(fr_reader_pool(rd));
    size_t arena = b ? b->arena.capacity : 0;
    CHECK(fr_upload_ring_push(ring, b, data, NULL, 0, NULL, err, sizeof(err)) == 0);
    CHECK(fr_upload_ring_reap(ring) == 0 && fr_upload_ring_in_flight(ring) == 1);
    CHECK(fr_upload_ring_reap(ring) == 0 && fr_upload_ring_in_flight(ring) == 1);
    CHECK(fr_pool_bytes(fr_reader_pool(rd)) == idle);
    CHECK(fr_upload_ring_reap(ring) == 1 && fr_upload_ring_in_flight(ring) == 0);
    CHECK(fr_pool_bytes(fr_reader_pool(rd)) == idle + arena);

    /* A full ring: the fourth push waits for the oldest copy, and the ring
     * never holds more than its slots. */
    setenv("MOCK_CUDA_EVENT_BUSY", "1000000", 1);
    for (int i = 0; i < 4; i++) {
        b = read_batch(rd, idx);
        CHECK(fr_upload_ring_push(ring, b, data, NULL, 0, NULL, err, sizeof(err)) == 0);
        CHECK(fr_upload_ring_in_flight(ring) == (size_t)(i < 3 ? i + 1 : 3));
    }
    CHECK(fr_upload_ring_reap(ring) == 0);
    unsetenv("MOCK_CUDA_EVENT_BUSY");
    fr_upload_ring_close(ring); /* waits for the three, recycles them */
    fr_gpu_free(gpu, data);
    fr_gpu_free(gpu, labels_dst);
    fr_reader_close(rd);
}

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_gpu_probe(0, why, sizeof(why)) != 0) {
        printf("skip: no CUDA driver, not even the mock: %s\n", why);
        return 77;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW); /* held: live_cuda stays callable */
    live_cuda = lib ? (long (*)(const char *))dlsym(lib, "mock_cuda_live") : NULL;
    if (!live_cuda) {
        printf("skip: this test needs the mock driver (LD_LIBRARY_PATH=build/mockcuda)\n");
        return 77;
    }
    for (int i = 0; i < NFILES; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%02d", i);
        sizes[i] = i == 3 ? 0 : fr_test_sizes[(size_t)i % fr_test_nsizes] + (size_t)i;
        paths[i] = fr_test_write(name, sizes[i], (unsigned)i + 1); /* ours to free */
    }
    long pins0 = live_cuda("pins"), allocs0 = live_cuda("allocs");
    check_copies(1);
    check_copies(0);
    CHECK(live_cuda("pins") == pins0);
    CHECK(live_cuda("allocs") == allocs0);

    /* No slots, no GPU: refused, saying so. */
    fr_upload_ring *ring = NULL;
    char err[FR_ERRLEN] = "";
    CHECK(fr_upload_ring_open(NULL, 2, &ring, err, sizeof(err)) == -EINVAL && !ring &&
          strstr(err, "needs a GPU"));
    for (int i = 0; i < NFILES; i++)
        free(paths[i]);
    return fr_test_finish("test_upload_ring");
}
