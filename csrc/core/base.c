/* The bottom layer: error messages, CPUs, the page-cache probe and the checked
 * open of a data file (see base.h). */
#define _GNU_SOURCE /* mincore, sched_getaffinity */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base.h"

void fr_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

unsigned fr_usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return (unsigned)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

unsigned fr_resident_sample(const void *map, size_t len, unsigned n, uint64_t *seed,
                            unsigned *asked)
{
    size_t pages = len / 4096;
    unsigned in = 0;
    *asked = 0;
    for (unsigned i = 0; map && pages && i < n; i++) {
        uint64_t x = fr_splitmix64(seed);
        unsigned char vec = 0;
        if (mincore((char *)(uintptr_t)map + (x % pages) * 4096, 4096, &vec) == 0) {
            (*asked)++;
            in += vec & 1;
        }
    }
    return in;
}

/* Linux's value (uapi asm-generic/mman-common.h, 5.14), for C libraries
 * whose headers lack it. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int fr_populate_write(void *buf, size_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return EINVAL;
    uintptr_t mask = (uintptr_t)page - 1;
    uintptr_t a = (uintptr_t)buf;
    uintptr_t start = (a + mask) & ~mask, end = (a + len) & ~mask;
    if (len == 0 || end <= start)
        return 0;
    return madvise((void *)start, (size_t)(end - start), MADV_POPULATE_WRITE) == 0 ? 0 : errno;
}

int fr_open_data(const char *path, int flags, int block_ok, struct stat *st_out)
{
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | flags);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = -errno;
    else if (S_ISDIR(st.st_mode))
        rc = -EISDIR;
    else if (!S_ISREG(st.st_mode) && !(block_ok && S_ISBLK(st.st_mode)))
        rc = -EINVAL;
    if (rc == 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
            rc = -errno;
    }
    if (rc) {
        close(fd);
        return rc;
    }
    if (st_out)
        *st_out = st;
    return fd;
}

int fr_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : (first ? first : 1);
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : 2 * c;
    if (elem && c > SIZE_MAX / elem)
        return -ENOMEM;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}
