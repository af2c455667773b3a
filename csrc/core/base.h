/*
 * The bottom layer of the C core: error messages, small arithmetic, the
 * process's CPU count, a page-cache probe and the checked open of a data
 * file, that every other file may use. It includes nothing of fastread's, so
 * nothing above it can form a cycle through it.
 */
#ifndef FASTREAD_BASE_H
#define FASTREAD_BASE_H

#include <stddef.h>
#include <stdint.h>

/* Formats an error message into err (if err is not NULL and err_len > 0). */
void fr_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Grows *p, an array of *cap elements of `elem` bytes, to hold at least
 * `need`: the capacity doubles (from `first` when *cap is 0), so appends cost
 * amortised O(1). 0, or -ENOMEM (also when the size would overflow) with *p
 * and *cap as they were. The one growth rule of the core's growing arrays. */
int fr_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first);

/* v rounded up to a multiple of align (a power of two). */
static inline size_t fr_round_up(size_t v, size_t align)
{
    return (v + align - 1) & ~(align - 1);
}

/* The next value of splitmix64 on *state: a small, fast and well-mixed
 * generator for sampling and for seeding larger ones. */
static inline uint64_t fr_splitmix64(uint64_t *state)
{
    uint64_t x = *state += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* CPUs this process may run on (its affinity mask: a container's or
 * taskset's share), else the online count; at least 1. */
unsigned fr_usable_cpus(void);

/* Of n 4 KiB pages of the mapping [map, map + len) drawn at random
 * (splitmix64 on *seed), how many the page cache holds (mincore); *asked
 * gets how many mincore answered. Tells a cold file from a warm one
 * without reading it. Thread-safe if each thread has its own seed. */
unsigned fr_resident_sample(const void *map, size_t len, unsigned n, uint64_t *seed,
                            unsigned *asked);

/* Faults in the whole pages inside [buf, buf + len) for writing with one
 * madvise(MADV_POPULATE_WRITE): the kernel allocates and zeroes them at once
 * instead of one page fault per 4 KiB page as they are first written (the
 * Parquet source's row groups: docs/parquet.md). 0, or the errno (EINVAL on
 * a kernel before 5.14: nothing was done). Thread-safe. */
int fr_populate_write(void *buf, size_t len);

/* Opens `path` for reading data that must be a regular file (or, with
 * block_ok, a block device): O_RDONLY | O_CLOEXEC | O_NOCTTY | `flags`, with
 * O_NONBLOCK so that a FIFO put in its place cannot block the open; then
 * fstat of the descriptor (no stat-then-open race) and O_NONBLOCK cleared.
 * Returns the descriptor, or -errno: -EISDIR for a directory, -EINVAL for a
 * FIFO, socket or device (open(2) itself refuses a socket with -ENXIO).
 * Symlinks are followed: the target is what is checked. *st_out (if not
 * NULL) gets the descriptor's fstat. Thread-safe. */
struct stat;
int fr_open_data(const char *path, int flags, int block_ok, struct stat *st_out);

#endif
