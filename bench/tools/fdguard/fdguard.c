/*
 * fdguard: an LD_PRELOAD shim for the descriptor audit (issue: a child's
 * stdout cut at 64 KiB). It logs, with a backtrace, to $FDGUARD_LOG:
 *   - close, dup2/dup3 onto, fcntl F_SETFL/F_SETFD, ioctl FIONBIO of fds 0-2;
 *   - any switch to non-blocking (F_SETFL with O_NONBLOCK, FIONBIO != 0) of a
 *     pipe or FIFO (a pipe is what a test's child writes its stdout to);
 *   - close() failing with EBADF (a descriptor closed twice, caught when its
 *     number was not reused in between).
 * Test tooling only: not part of the library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void note(const char *what, int fd, long arg, int rc, int err)
{
    const char *path = getenv("FDGUARD_LOG");
    if (!path)
        return;
    int saved = errno;
    int lf = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (lf < 0) {
        errno = saved;
        return;
    }
    char line[256];
    int n = snprintf(line, sizeof(line), "pid %d tid %ld: %s fd=%d arg=%#lx rc=%d errno=%d\n",
                     (int)getpid(), (long)syscall(SYS_gettid), what, fd, arg, rc, err);
    (void)!write(lf, line, (size_t)n);
    void *frames[32];
    int nf = backtrace(frames, 32);
    backtrace_symbols_fd(frames, nf, lf);
    (void)!write(lf, "--\n", 3);
    syscall(SYS_close, lf);
    errno = saved;
}

static int is_pipe(int fd)
{
    struct stat st;
    int saved = errno;
    int r = fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
    errno = saved;
    return r;
}

int close(int fd)
{
    if (fd >= 0 && fd <= 2)
        note("close(stdio)", fd, 0, 0, 0);
    int rc = (int)syscall(SYS_close, fd);
    int e = errno;
    if (rc != 0 && e == EBADF)
        note("close EBADF", fd, 0, rc, e);
    errno = e;
    return rc;
}

int dup2(int old, int nfd)
{
    if (nfd >= 0 && nfd <= 2)
        note("dup2 onto stdio", nfd, old, 0, 0);
    return (int)syscall(SYS_dup2, old, nfd);
}

int dup3(int old, int nfd, int flags)
{
    if (nfd >= 0 && nfd <= 2)
        note("dup3 onto stdio", nfd, old, 0, 0);
    return (int)syscall(SYS_dup3, old, nfd, flags);
}

static int fcntl_common(const char *name, int fd, int cmd, long arg)
{
    if (cmd == F_SETFL || cmd == F_SETFD) {
        if (fd >= 0 && fd <= 2)
            note(cmd == F_SETFL ? "fcntl F_SETFL(stdio)" : "fcntl F_SETFD(stdio)", fd, arg, 0, 0);
        else if (cmd == F_SETFL && (arg & O_NONBLOCK) && is_pipe(fd))
            note("fcntl F_SETFL O_NONBLOCK on a pipe", fd, arg, 0, 0);
    }
    (void)name;
    return (int)syscall(SYS_fcntl, fd, cmd, arg);
}

int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return fcntl_common("fcntl", fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return fcntl_common("fcntl64", fd, cmd, arg);
}

int ioctl(int fd, unsigned long req, ...)
{
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (req == FIONBIO) {
        int on = arg ? *(int *)arg : 0;
        if (fd >= 0 && fd <= 2)
            note("ioctl FIONBIO(stdio)", fd, on, 0, 0);
        else if (on && is_pipe(fd))
            note("ioctl FIONBIO on a pipe", fd, on, 0, 0);
    }
    return (int)syscall(SYS_ioctl, fd, req, arg);
}
