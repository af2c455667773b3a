/*
 * Does the process-wide descriptor table limit many threads reading small
 * cached files? Each of T threads opens, fstats, preads and closes files of
 * one list (taken from a shared counter, round and round) for a few seconds,
 * with the process's table shared by every thread ("shared") or with a
 * private table per thread from unshare(CLONE_FILES) ("private").
 *
 *   cc -O2 -pthread bench/tools/fdtable_probe.c -o /tmp/fdtable_probe
 *   find /tmp/engines-4k -type f > /tmp/list && /tmp/fdtable_probe /tmp/list 16 private 2
 *
 * Prints files/s and CPU microseconds per file (getrusage of the process).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char **paths;
static size_t npaths;
static atomic_size_t next_item;
static atomic_int stop;
static int private_table;
static char buf[1 << 20];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker(void *arg)
{
    long *done = arg;
    char local[1 << 17];
    if (private_table && unshare(CLONE_FILES) != 0) {
        perror("unshare(CLONE_FILES)");
        exit(1);
    }
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        size_t k = atomic_fetch_add(&next_item, 1) % npaths;
        int fd = open(paths[k], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            perror(paths[k]);
            exit(1);
        }
        struct stat st;
        if (fstat(fd, &st) != 0 || pread(fd, local, sizeof(local), 0) < 0) {
            perror(paths[k]);
            exit(1);
        }
        close(fd);
        (*done)++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s LIST THREADS shared|private SECONDS\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    size_t cap = 1024;
    paths = malloc(cap * sizeof(*paths));
    char line[4096];
    while (paths && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (npaths == cap)
            paths = realloc(paths, (cap *= 2) * sizeof(*paths));
        if (paths)
            paths[npaths++] = strdup(line);
    }
    fclose(f);
    if (!paths || npaths == 0) {
        fprintf(stderr, "no paths in %s\n", argv[1]);
        return 1;
    }
    int threads = atoi(argv[2]);
    private_table = strcmp(argv[3], "private") == 0;
    double secs = atof(argv[4]);
    (void)buf;
    pthread_t *tid = calloc((size_t)threads, sizeof(*tid));
    long *done = calloc((size_t)threads, sizeof(*done) * 16); /* one cache line each */
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    double t0 = now();
    for (int t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, worker, &done[t * 16]);
    usleep((useconds_t)(secs * 1e6));
    atomic_store(&stop, 1);
    long total = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        total += done[t * 16];
    }
    double dt = now() - t0;
    getrusage(RUSAGE_SELF, &r1);
    double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec -
                          r0.ru_stime.tv_sec) +
                 (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec -
                          r0.ru_stime.tv_usec) * 1e-6;
    printf("%s table, %d threads: %.0f files/s, %.2f us cpu/file\n", argv[3], threads,
           (double)total / dt, cpu / (double)total * 1e6);
    return 0;
}
