/* Every allocation failure on an engine's open, read and close paths
 * leaves the process's descriptors alone: fds 0-2 stay the files they were
 * (a struct of descriptors zeroed by calloc and closed on an error path
 * before they were set to -1 closes stdin, and whatever the process opens
 * next takes its number), and none is left open.
 *
 * malloc and calloc are wrapped at link time (-Wl,--wrap, CMakeLists.txt):
 * fault_sweep.h fails the k-th allocation after arming, for k = 1, 2, ...
 * until a run makes fewer allocations than k, over cql (against a closed
 * loopback port: its open allocates everything before it connects), s3
 * (another closed port), psync, io_uring and auto (contexts reading a few
 * files: read_files, fr_read_file_ranges twice, so a call after a failed
 * one runs on what that left, fr_read_ranges; readers; table readers). */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "fault_sweep.h"

/* The test's allocation fault: 0 disarmed, else the allocation number
 * (counted from arming) that fails. */
static atomic_long fail_at;
static atomic_long seen;
static atomic_int failed;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);

static int should_fail(void)
{
    long at = atomic_load(&fail_at);
    if (at == 0)
        return 0;
    if (atomic_fetch_add(&seen, 1) + 1 != at)
        return 0;
    atomic_store(&failed, 1);
    return 1;
}

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n)
{
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

static void arm(long k)
{
    atomic_store(&seen, 0);
    atomic_store(&failed, 0);
    atomic_store(&fail_at, k);
}

static void disarm(void)
{
    atomic_store(&fail_at, 0);
}

static int hit(void)
{
    return atomic_load(&failed);
}

int main(void)
{
    alarm(120 * fr_test_slowdown()); /* a hang on an error path fails the test */
    fr_test_dir();
    const fault_ops ops = {"allocation", arm, disarm, hit, NULL};
    sweep_all(&ops);
    return fr_test_finish("test_alloc_fail_fds");
}
