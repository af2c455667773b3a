/*
 * A test-only LD_PRELOAD shim that makes libc's open/openat/read/pread/preadv fail,
 * return short or stall for chosen paths. Built by tests/test_faults.py with
 * cc; never part of fastread.
 *
 * Environment:
 *   FR_FAULT_PATH   substring of the paths to fault (required)
 *   FR_FAULT_OP     open | read  (read covers read, pread and preadv on descriptors
 *                   opened from a matching path)
 *   FR_FAULT_MODE   eio | eintr | eagain | short | stall
 *   FR_FAULT_COUNT  faults to inject in all (default 1; -1: every call)
 *   FR_FAULT_STALL_MS  how long `stall` sleeps before the real call (200)
 *
 * What it cannot reach: io_uring's openat and read requests run in the
 * kernel, not through libc, so only the io_uring engine's libc calls (fstat,
 * its slow repair path's open/pread) see it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536

static atomic_uchar tracked[MAX_FD];
static atomic_long remaining = -2; /* -2: not read from the environment yet */

static const char *env(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static int matches(const char *path)
{
    const char *want = getenv("FR_FAULT_PATH");
    return path && want && *want && strstr(path, want) != NULL;
}

/* 1 if this call is to be faulted (consumes one of FR_FAULT_COUNT). */
static int take(const char *op)
{
    if (strcmp(env("FR_FAULT_OP", "read"), op) != 0)
        return 0;
    long r = atomic_load(&remaining);
    if (r == -2) {
        long n = atol(env("FR_FAULT_COUNT", "1"));
        long expected = -2;
        atomic_compare_exchange_strong(&remaining, &expected, n);
        r = atomic_load(&remaining);
    }
    if (r == -1)
        return 1;
    while (r > 0) {
        if (atomic_compare_exchange_weak(&remaining, &r, r - 1))
            return 1;
    }
    return 0;
}

static void stall(void)
{
    long ms = atol(env("FR_FAULT_STALL_MS", "200"));
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* For a faulted call: -1 with errno set, or 0 to go on (stall, short). */
static int fail_now(void)
{
    const char *mode = env("FR_FAULT_MODE", "eio");
    if (strcmp(mode, "eio") == 0)
        errno = EIO;
    else if (strcmp(mode, "eintr") == 0)
        errno = EINTR;
    else if (strcmp(mode, "eagain") == 0)
        errno = EAGAIN;
    else if (strcmp(mode, "stall") == 0) {
        stall();
        return 0;
    } else
        return 0; /* short: the caller halves the request */
    return -1;
}

static int is_short(void) { return strcmp(env("FR_FAULT_MODE", "eio"), "short") == 0; }

static void track(int fd, const char *path)
{
    if (fd >= 0 && fd < MAX_FD)
        atomic_store(&tracked[fd], (unsigned char)matches(path));
}

typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open_fn)(const char *, int, ...);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*preadv_fn)(int, const struct iovec *, int, off_t);
typedef int (*close_fn)(int);

static int do_open(const char *name, int dirfd, const char *path, int flags, mode_t mode)
{
    if (matches(path) && take("open") && fail_now() < 0)
        return -1;
    int fd;
    if (dirfd == -1000) {
        open_fn real = (open_fn)dlsym(RTLD_NEXT, name);
        fd = real(path, flags, mode);
    } else {
        openat_fn real = (openat_fn)dlsym(RTLD_NEXT, name);
        fd = real(dirfd, path, flags, mode);
    }
    track(fd, path);
    return fd;
}

#define MODE_ARG(flags)                                                     \
    mode_t mode = 0;                                                        \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                  \
        va_list ap;                                                         \
        va_start(ap, flags);                                                \
        mode = (mode_t)va_arg(ap, int);                                     \
        va_end(ap);                                                         \
    }

int open(const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open("open", -1000, path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open("open64", -1000, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open("openat", dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open("openat64", dirfd, path, flags, mode);
}

static int faulted_fd(int fd)
{
    return fd >= 0 && fd < MAX_FD && atomic_load(&tracked[fd]);
}

static ssize_t do_pread(const char *name, int fd, void *buf, size_t len, off_t off)
{
    pread_fn real = (pread_fn)dlsym(RTLD_NEXT, name);
    if (faulted_fd(fd) && take("read")) {
        if (fail_now() < 0)
            return -1;
        if (is_short() && len > 1)
            len /= 2;
    }
    return real(fd, buf, len, off);
}

ssize_t pread(int fd, void *buf, size_t len, off_t off) { return do_pread("pread", fd, buf, len, off); }

ssize_t pread64(int fd, void *buf, size_t len, off_t off)
{
    return do_pread("pread64", fd, buf, len, off);
}

/* psync reads a run of nearby ranges of a file with one preadv
 * (csrc/engines/psync.c): the same faults; `short` drops the run's last
 * vector, or halves a lone one, so the caller sees a short read. */
static ssize_t do_preadv(const char *name, int fd, const struct iovec *iov, int iovcnt, off_t off)
{
    preadv_fn real = (preadv_fn)dlsym(RTLD_NEXT, name);
    if (faulted_fd(fd) && take("read")) {
        if (fail_now() < 0)
            return -1;
        if (is_short() && iovcnt > 1)
            return real(fd, iov, iovcnt - 1, off);
        if (is_short() && iovcnt == 1 && iov[0].iov_len > 1) {
            struct iovec half = {iov[0].iov_base, iov[0].iov_len / 2};
            return real(fd, &half, 1, off);
        }
    }
    return real(fd, iov, iovcnt, off);
}

ssize_t preadv(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
    return do_preadv("preadv", fd, iov, iovcnt, off);
}

ssize_t preadv64(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
    return do_preadv("preadv64", fd, iov, iovcnt, off);
}

ssize_t read(int fd, void *buf, size_t len)
{
    read_fn real = (read_fn)dlsym(RTLD_NEXT, "read");
    if (faulted_fd(fd) && take("read")) {
        if (fail_now() < 0)
            return -1;
        if (is_short() && len > 1)
            len /= 2;
    }
    return real(fd, buf, len);
}

int close(int fd)
{
    close_fn real = (close_fn)dlsym(RTLD_NEXT, "close");
    if (fd >= 0 && fd < MAX_FD)
        atomic_store(&tracked[fd], 0);
    return real(fd);
}

/* The entry points a caller built with _FORTIFY_SOURCE calls instead
 * (Ubuntu's compilers turn it on by default): the same faults, then the
 * plain call (the buffer checks are the caller's compiler's business). */
int __open_2(const char *path, int flags) { return do_open("open", -1000, path, flags, 0); }

int __open64_2(const char *path, int flags) { return do_open("open64", -1000, path, flags, 0); }

int __openat_2(int dirfd, const char *path, int flags)
{
    return do_open("openat", dirfd, path, flags, 0);
}

int __openat64_2(int dirfd, const char *path, int flags)
{
    return do_open("openat64", dirfd, path, flags, 0);
}

ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
    (void)buflen;
    return read(fd, buf, len);
}

ssize_t __pread_chk(int fd, void *buf, size_t len, off_t off, size_t buflen)
{
    (void)buflen;
    return do_pread("pread", fd, buf, len, off);
}

ssize_t __pread64_chk(int fd, void *buf, size_t len, off_t off, size_t buflen)
{
    (void)buflen;
    return do_pread("pread64", fd, buf, len, off);
}
