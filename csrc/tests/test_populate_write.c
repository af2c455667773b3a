/* fr_populate_write faults a buffer's whole pages in for writing with one
 * madvise: afterwards they are resident (mincore) and hold zeros, the bytes
 * outside whole pages are left alone, and empty or sub-page spans do nothing. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/base.h"
#include "harness.h"

int main(void)
{
    long page = sysconf(_SC_PAGESIZE);
    CHECK(page > 0);
    size_t pages = 64, len = pages * (size_t)page;
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    unsigned char vec[64];
    CHECK(mincore(m, len, vec) == 0);
    size_t before = 0;
    for (size_t i = 0; i < pages; i++)
        before += vec[i] & 1;
    CHECK(before == 0); /* fresh anonymous memory: nothing mapped yet */

    /* Nothing to do: empty, or no whole page inside. */
    CHECK(fr_populate_write(m, 0) == 0);
    CHECK(fr_populate_write(m + 1, (size_t)page - 2) == 0);

    /* From 1 byte in to the end: pages 1 .. 63 are whole. */
    int rc = fr_populate_write(m + 1, len - 1);
    if (rc == EINVAL) {
        /* A kernel before 5.14: the call is refused and nothing changes. */
        fprintf(stderr, "skip: MADV_POPULATE_WRITE refused (EINVAL): kernel before 5.14\n");
        munmap(m, len);
        return 77;
    }
    CHECK(rc == 0);
    CHECK(mincore(m, len, vec) == 0);
    CHECK((vec[0] & 1) == 0); /* page 0 is not whole inside the span */
    for (size_t i = 1; i < pages; i++)
        CHECK(vec[i] & 1);
    for (size_t i = (size_t)page; i < len; i++)
        CHECK(m[i] == 0);
    CHECK(munmap(m, len) == 0);
    return 0;
}
