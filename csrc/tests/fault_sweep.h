/* What test_alloc_fail_fds and test_fd_fail_fds share: runs of the
 * engines, contexts and readers that open descriptors, each made with one
 * call (an allocation, a descriptor) failing in turn, and the checks after
 * each: fds 0-2 still the same files, no descriptor left open. Each test
 * wraps the calls it fails at link time (-Wl,--wrap: CMakeLists.txt) and
 * hands sweep_all its fault_ops. Static functions: included by one test
 * file each. */
#ifndef FR_TEST_FAULT_SWEEP_H
#define FR_TEST_FAULT_SWEEP_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fastread.h"
#include "harness.h"

typedef struct stdio_id {
    dev_t dev[3];
    ino_t ino[3];
} stdio_id;

/* fds 0-2 open on something (/dev/null where one is closed), and who they are. */
static void stdio_take(stdio_id *id)
{
    for (int fd = 0; fd < 3; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            int n = open("/dev/null", O_RDWR);
            if (n >= 0 && n != fd) {
                dup2(n, fd);
                close(n);
            }
            CHECK(fstat(fd, &st) == 0);
        }
        id->dev[fd] = st.st_dev;
        id->ino[fd] = st.st_ino;
    }
}

/* 1 if fds 0-2 are still the files `id` saw. */
static int stdio_same(const stdio_id *id)
{
    for (int fd = 0; fd < 3; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_dev != id->dev[fd] || st.st_ino != id->ino[fd])
            return 0;
    }
    return 1;
}

static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    close(fd); /* nobody listens there now */
    return ntohs(a.sin_port);
}

/* One run of `engine`: a context, a read of `paths` (read_files, ranges of
 * many files twice, ranges of one), the close. */
static void run_once(const char *engine, const char *args, char **paths, size_t n)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.engine_args = args;
    cfg.threads = 2;
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN];
    if (fr_ctx_open(&cfg, &ctx, err, sizeof(err)) != 0)
        return;
    if (paths) {
        const char *const *cpaths = (const char *const *)paths;
        fr_pool *pool = fr_pool_new();
        fr_batch *b = pool ? fr_pool_get(pool) : NULL;
        if (b && fr_batch_prepare(b, n) == 0)
            (void)fr_read_files(ctx, cpaths, NULL, n, b);
        /* Ranges of many files, twice: what a failed first call leaves
         * (the descriptor LRU half made) is what the second one uses. */
        fr_file_range jobs[16];
        for (size_t j = 0; j < 16; j++)
            jobs[j] = (fr_file_range){.file = (uint32_t)(j % n), .offset = 10 * (j / n),
                                      .length = 50};
        for (int call = 0; call < 2; call++)
            if (b && fr_batch_prepare(b, 16) == 0)
                (void)fr_read_file_ranges(ctx, cpaths, n, jobs, 16, b);
        fr_range ranges[4] = {{0, 10}, {20, 30}, {5, 90}, {0, 100}};
        if (b && fr_batch_prepare(b, 4) == 0)
            (void)fr_read_ranges(ctx, paths[0], ranges, 4, b);
        if (b)
            fr_batch_recycle(b);
        fr_pool_close(pool);
    }
    fr_ctx_close(ctx);
}

/* A reader of `paths` (table: over ranges of them), two batches taken. */
static void run_reader(const char *engine, int table, char **paths, size_t n)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = engine;
    cfg.threads = 2;
    fr_reader *rd = NULL;
    char err[FR_ERRLEN];
    uint32_t ids[16];
    uint64_t offs[16], lens[16];
    for (size_t j = 0; j < 16; j++) {
        ids[j] = (uint32_t)(j % n);
        offs[j] = 7 * (j / n);
        lens[j] = 40;
    }
    const char *const *cpaths = (const char *const *)paths;
    int rc = table ? fr_reader_open_table(&cfg, cpaths, n, ids, offs, lens, 16, 2, 2, &rd, err,
                                          sizeof(err))
                   : fr_reader_open(&cfg, cpaths, n, 2, 2, &rd, err, sizeof(err));
    if (rc != 0)
        return;
    int64_t idx[8];
    for (int64_t i = 0; i < 8; i++)
        idx[i] = (i * 3) % (int64_t)n;
    int queued = 0;
    for (int k = 0; k < 2; k++)
        queued += fr_reader_submit(rd, idx, 8) == 0;
    for (int k = 0; k < queued; k++) {
        fr_batch *b = NULL;
        if (fr_reader_next(rd, &b) == 0 && b)
            fr_batch_recycle(b);
    }
    fr_reader_close(rd);
}

/* What one sweep step runs: an engine's context, or a reader. */
typedef enum { RUN_CTX, RUN_READER, RUN_TABLE } run_kind;

static void run_kind_once(run_kind kind, const char *engine, const char *args, char **paths,
                          size_t n)
{
    if (kind == RUN_CTX)
        run_once(engine, args, paths, n);
    else
        run_reader(engine, kind == RUN_TABLE, paths, n);
}

/* A test's fault: what fails is the k-th call (counted from arm) of what
 * the test wraps; hit() says whether a run got that far; broken() (may be
 * NULL) counts what else the test's wrappers saw go wrong in the run. */
typedef struct fault_ops {
    const char *what; /* "allocation", "descriptor" */
    void (*arm)(long k);
    void (*disarm)(void);
    int (*hit)(void);
    int (*broken)(void);
} fault_ops;

/* Every fault k = 1, 2, ... of `ops` in turn, a run of `kind` each, until a
 * run makes fewer than k such calls: after each, fds 0-2 are the same
 * files and as many descriptors are open as before. */
static void sweep_kind(const fault_ops *ops, run_kind kind, const char *engine, const char *args,
                       char **paths, size_t n)
{
    char why[FR_ERRLEN];
    if (strcmp(engine, "auto") != 0 && fr_engine_probe(engine, why, sizeof(why)) != 0) {
        fprintf(stderr, "%s: skipped (%s)\n", engine, why);
        return;
    }
    stdio_id id;
    stdio_take(&id);
    run_kind_once(kind, engine, args, paths, n); /* the first run's lazy setup (libcurl, CPUs) */
    int fds0 = fr_test_open_fds();
    long k;
    int bad_stdio = 0, bad_leak = 0, bad_broken = 0;
    for (k = 1; k < 100000; k++) {
        ops->arm(k);
        run_kind_once(kind, engine, args, paths, n);
        int hit = ops->hit();
        ops->disarm();
        int broken = ops->broken ? ops->broken() : 0;
        if (broken && !bad_broken++)
            fprintf(stderr, "%s: %s %ld failing: %d wrong closes (fds 0-2, or EBADF)\n", engine,
                    ops->what, k, broken);
        if (!stdio_same(&id)) {
            if (!bad_stdio++)
                fprintf(stderr, "%s: %s %ld failing closed or replaced fds 0-2\n", engine,
                        ops->what, k);
            stdio_take(&id); /* reopened, to go on */
        }
        int fds = fr_test_open_fds();
        if (fds != fds0) {
            if (!bad_leak++)
                fprintf(stderr, "%s: %s %ld failing left %d descriptors open (%d before)\n",
                        engine, ops->what, k, fds, fds0);
            fds0 = fds;
        }
        if (!hit)
            break; /* the run made fewer than k such calls: every one was failed once */
    }
    CHECK(bad_stdio == 0);
    CHECK(bad_leak == 0);
    CHECK(bad_broken == 0);
    CHECK(k > 1); /* the wrap took: the runs make such calls */
    static const char *const kinds[] = {"context", "reader", "table reader"};
    fprintf(stderr, "%s %s: %ld %s failures tried\n", engine, kinds[kind], k - 1, ops->what);
}

/* The sweeps both tests run: cql against a closed loopback port, s3
 * against another, and psync, io_uring and auto over a few files (their
 * contexts, readers and table readers). */
static void sweep_all(const fault_ops *ops)
{
    char *paths[8];
    for (int i = 0; i < 8; i++) {
        char name[16];
        snprintf(name, sizeof(name), "f%d", i);
        paths[i] = fr_test_write(name, 100 + (size_t)i * 4000, (unsigned)i);
    }
    char args[256];
    snprintf(args, sizeof(args),
             "hosts=127.0.0.1,port=%d,table=ks.t,connections=3,connect_timeout_ms=200",
             closed_port());
    sweep_kind(ops, RUN_CTX, "cql", args, NULL, 0);
    char s3args[512];
    snprintf(s3args, sizeof(s3args),
             "endpoint=http://127.0.0.1:%d,region=us-east-1,access_key_id=k,"
             "secret_access_key=s,retries=0,deadline_ms=200,connect_timeout_ms=100",
             closed_port());
    char *urls[4];
    for (int i = 0; i < 4; i++) {
        urls[i] = malloc(32);
        snprintf(urls[i], 32, "s3://b/k%d", i);
    }
    sweep_kind(ops, RUN_CTX, "s3", s3args, urls, 4);
    for (int i = 0; i < 4; i++)
        free(urls[i]);
    const char *file_engines[] = {"psync", "io_uring", "auto"};
    for (int e = 0; e < 3; e++)
        for (run_kind kind = RUN_CTX; kind <= RUN_TABLE; kind++)
            sweep_kind(ops, kind, file_engines[e], NULL, paths, 8);
    for (int i = 0; i < 8; i++)
        free(paths[i]);
}

#endif
