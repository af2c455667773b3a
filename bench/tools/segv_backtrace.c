/* A native backtrace for a crash on a machine without gdb (the GPU machine).
 *
 * Preloaded into a test process (`bash bench/gpu.sh tests` with GDB=1 builds
 * it with the machine's cc when gdb is missing):
 *
 *   cc -shared -fPIC -O0 -o /tmp/libsegv_backtrace.so bench/tools/segv_backtrace.c
 *   LD_PRELOAD=/tmp/libsegv_backtrace.so python3 -X faulthandler -m pytest ...
 *
 * Python's faulthandler, when enabled later, takes SIGSEGV first, prints the
 * Python stacks, restores the handler it found (this one) and re-raises, so
 * both stacks end up in the log. The frames print as `lib.so(symbol+0xoff)`,
 * or `lib.so(+0xoff)` for hidden symbols: `addr2line -f -C -e lib.so 0xoff`
 * names the line where the library has debug information. The backtrace goes
 * to the process's original stderr, kept as a duplicate at load time: pytest
 * captures fd 2 into a file that a crash never shows. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static int original_stderr = STDERR_FILENO;

static void print_backtrace_and_die(int signum) {
    static const char header[] = "\n== native backtrace of the crashing thread ==\n";
    void *frames[64];
    /* backtrace() is not async-signal-safe on its first call (it loads
     * libgcc_s); segv_backtrace_init() calls it once so that here it is. */
    int n = backtrace(frames, 64);
    ssize_t ignored = write(original_stderr, header, sizeof header - 1);
    (void)ignored;
    backtrace_symbols_fd(frames, n, original_stderr);
    signal(signum, SIG_DFL);
    raise(signum);
}

__attribute__((constructor)) static void segv_backtrace_init(void) {
    int saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 100);
    if (saved >= 0)
        original_stderr = saved;
    void *warm[1];
    (void)backtrace(warm, 1);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = print_backtrace_and_die;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        sigaction(fatal[i], &action, NULL);
}
