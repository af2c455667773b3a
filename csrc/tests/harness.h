/* A tiny harness for the C-level tests: temp trees, byte checks, failures. */
#ifndef FR_TEST_HARNESS_H
#define FR_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "fastread.h"

extern int fr_test_failures;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
            fr_test_failures++;                                                       \
        }                                                                             \
    } while (0)

/* Sizes that exercise every edge: empty, one byte, around a page, large. */
extern const size_t fr_test_sizes[];
extern const size_t fr_test_nsizes;

/* A fresh directory under $TMPDIR (or /var/tmp, which is disk-backed so
 * O_DIRECT works); removed by fr_test_cleanup. */
const char *fr_test_dir(void);
void fr_test_cleanup(void);

/* Writes a file of `size` pseudo-random bytes (seeded by `seed`) and returns
 * its path (static storage per call index, caller copies if needed). */
char *fr_test_write(const char *name, size_t size, unsigned seed);

/* Descriptors this process has open (a test's leak check), or -1. */
int fr_test_open_fds(void);

/* 1 if the sample holds exactly the bytes of file `path`. */
int fr_test_same(const fr_batch *batch, size_t i, const char *path);

/* A context of `engine` with every other setting at its default, or NULL
 * (the open's error printed and counted as a failure). */
fr_ctx *fr_test_ctx(const char *engine);

/* Reads each of the test sizes with `cfg`, `repeat` times over, and checks
 * bytes; returns the number of mismatches. */
int fr_test_engine_roundtrip(const fr_config *cfg, int repeat);

/* What a size hint or a remembered size must survive, as files written by
 * fr_test_write_changing: paths[CH_GREW] and paths[CH_SHRANK] of the sizes
 * given (to be rewritten by the test), paths[CH_SAME] of 4096 bytes, and
 * three of 10 bytes that fr_test_unmake_files turns into no regular file. */
enum { CH_GREW, CH_SHRANK, CH_SAME, CH_GONE, CH_DIR, CH_FIFO, CH_COUNT };
void fr_test_write_changing(const char *prefix, size_t grew, size_t shrank,
                            char *paths[CH_COUNT]);
/* Turns three regular files into what a remembered size or a size hint
 * must survive: `gone` removed, `dir` a directory, `fifo` a FIFO with no
 * writer (never to be read forever). 0, or -1 if a step failed. */
int fr_test_unmake_files(const char *gone, const char *dir, const char *fifo);
/* 1 if `batch` read the changing files as they are now: the first three
 * with their current bytes, then ENOENT, EISDIR and EINVAL (a FIFO). */
int fr_test_read_as_now(const fr_batch *batch, char *const paths[CH_COUNT]);

/* How many times slower than a plain build this one runs: the variable
 * FASTREAD_TEST_SLOWDOWN if set (>= 1), else 20 under ThreadSanitizer
 * (__SANITIZE_THREAD__), else 1. Tests multiply the timeouts they expect
 * work to finish within by it (not those they expect to run out). */
unsigned fr_test_slowdown(void);

/* Whether p[0..n) holds each of 0..n-1 exactly once (an epoch's order). */
int fr_test_is_permutation(const int64_t *p, size_t n);

/* Why this build of the tests cannot run xNVMe with `engine_args`, or NULL
 * where it can. Under ThreadSanitizer: async=posix (see harness.c). */
const char *fr_test_xnvme_unrunnable(const char *engine_args);

int fr_test_finish(const char *name);

#endif
