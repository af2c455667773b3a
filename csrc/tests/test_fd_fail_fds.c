/* Out of descriptors at every point of an engine's open, read and close
 * paths: the k-th call that makes a descriptor (open, openat, socket,
 * eventfd, opendir, mkostemp, fopen, an io_uring ring's setup) fails with
 * EMFILE, once (a moment's exhaustion: RLIMIT_NOFILE shared with other
 * threads) or from then on (the limit reached), for k = 1, 2, ... until a
 * run makes fewer such calls than k. After each run fds 0-2 are the same
 * files, no descriptor is left open, and no close() the library made was
 * of fds 0-2 or failed with EBADF (a descriptor closed twice, or one never
 * opened: on an error path that is how a library closes a number another
 * part of the process holds, a test's stdout pipe say).
 *
 * The calls are wrapped at link time (-Wl,--wrap, CMakeLists.txt); the
 * runs are fault_sweep.h's (cql and s3 against closed loopback ports;
 * psync, io_uring and auto contexts, readers and table readers over a few
 * files). The opens io_uring makes inside the kernel are not wrapped. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#ifdef FASTREAD_HAVE_URING
#include <liburing.h>
#endif

#include "fault_sweep.h"

static atomic_long fail_at; /* 0: disarmed */
static atomic_long seen;
static atomic_int failed, from_then_on;
static atomic_int wrong_closes;

static int should_fail(void)
{
    long at = atomic_load(&fail_at);
    if (at == 0)
        return 0;
    long n = atomic_fetch_add(&seen, 1) + 1;
    if (n < at || (n > at && !atomic_load(&from_then_on)))
        return 0;
    atomic_store(&failed, 1);
    return 1;
}

int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (should_fail()) {
        errno = EMFILE;
        return -1;
    }
    return __real_open(path, flags, mode);
}

int __real_openat(int dir, const char *path, int flags, ...);
int __wrap_openat(int dir, const char *path, int flags, ...);
int __wrap_openat(int dir, const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (should_fail()) {
        errno = EMFILE;
        return -1;
    }
    return __real_openat(dir, path, flags, mode);
}

int __real_socket(int domain, int type, int protocol);
int __wrap_socket(int domain, int type, int protocol);
int __wrap_socket(int domain, int type, int protocol)
{
    if (should_fail()) {
        errno = EMFILE;
        return -1;
    }
    return __real_socket(domain, type, protocol);
}

int __real_eventfd(unsigned int initval, int flags);
int __wrap_eventfd(unsigned int initval, int flags);
int __wrap_eventfd(unsigned int initval, int flags)
{
    if (should_fail()) {
        errno = EMFILE;
        return -1;
    }
    return __real_eventfd(initval, flags);
}

DIR *__real_opendir(const char *path);
DIR *__wrap_opendir(const char *path);
DIR *__wrap_opendir(const char *path)
{
    if (should_fail()) {
        errno = EMFILE;
        return NULL;
    }
    return __real_opendir(path);
}

int __real_mkostemp(char *tmpl, int flags);
int __wrap_mkostemp(char *tmpl, int flags);
int __wrap_mkostemp(char *tmpl, int flags)
{
    if (should_fail()) {
        errno = EMFILE;
        return -1;
    }
    return __real_mkostemp(tmpl, flags);
}

FILE *__real_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode)
{
    if (should_fail()) {
        errno = EMFILE;
        return NULL;
    }
    return __real_fopen(path, mode);
}

#ifdef FASTREAD_HAVE_URING
int __real_io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags);
int __wrap_io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags);
int __wrap_io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
    if (should_fail())
        return -EMFILE;
    return __real_io_uring_queue_init(entries, ring, flags);
}

int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p)
{
    if (should_fail())
        return -EMFILE;
    return __real_io_uring_queue_init_params(entries, ring, p);
}
#endif

/* Every close() the library (and this test) makes: one of fds 0-2, or one
 * that fails with EBADF, is counted (and still made, so the checks after
 * the run see what it did). */
int __real_close(int fd);
int __wrap_close(int fd);
int __wrap_close(int fd)
{
    if (fd >= 0 && fd <= 2)
        atomic_fetch_add(&wrong_closes, 1);
    int rc = __real_close(fd);
    if (rc != 0 && errno == EBADF)
        atomic_fetch_add(&wrong_closes, 1);
    return rc;
}

static void arm(long k)
{
    atomic_store(&seen, 0);
    atomic_store(&failed, 0);
    atomic_store(&wrong_closes, 0);
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

static int broken(void)
{
    return atomic_exchange(&wrong_closes, 0);
}

int main(void)
{
    alarm(300 * fr_test_slowdown()); /* a hang on an error path fails the test */
    fr_test_dir();
    const fault_ops ops = {"descriptor", arm, disarm, hit, broken};
    fprintf(stderr, "-- the k-th descriptor refused once\n");
    atomic_store(&from_then_on, 0);
    sweep_all(&ops);
    fprintf(stderr, "-- every descriptor from the k-th on refused\n");
    atomic_store(&from_then_on, 1);
    sweep_all(&ops);
    return fr_test_finish("test_fd_fail_fds");
}
