/* Special files where data should be, in the C paths that open user files
 * other than whole-file reads (test_dense and test_size_hints cover those):
 * fr_open_data (base.h: the checked open of gathers) refuses a FIFO with and
 * without a writer, a socket, a directory and a character device without
 * blocking, follows links to regular files and clears O_NONBLOCK; range
 * reads of an image that is a FIFO, a socket, a directory or a link to
 * /dev/zero fail every sample (-EINVAL, -ENXIO, -EISDIR) through every range
 * engine, as does the slow path (fr_read_range_plain) when the image is
 * swapped for a link to /dev/zero after its descriptor was cached (zeros
 * were returned as the image's bytes); a store over a FIFO or a directory is
 * refused at open, naming the path. Each blocking step runs under alarm(),
 * so a regression fails the test instead of hanging it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/base.h"
#include "engines/range_io.h"
#include "fastread_gather.h"
#include "harness.h"

enum { FIFO, FIFO_WRITER, SOCKET, DIR_, CHARDEV, KINDS };
static const char *const kind_names[KINDS] = {"fifo", "fifo with a writer", "socket",
                                              "directory", "link to /dev/zero"};
static char special[KINDS][1024];
static int writer_fd = -1, sock_fd = -1;

static void make_specials(void)
{
    const char *d = fr_test_dir();
    for (int k = 0; k < KINDS; k++)
        snprintf(special[k], sizeof(special[k]), "%s/special%d.img", d, k);
    CHECK(mkfifo(special[FIFO], 0600) == 0);
    CHECK(mkfifo(special[FIFO_WRITER], 0600) == 0);
    /* A writer that never closes (O_RDWR opens a FIFO at once). */
    writer_fd = open(special[FIFO_WRITER], O_RDWR | O_CLOEXEC);
    CHECK(writer_fd >= 0 && write(writer_fd, "partial", 7) == 7);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK(strlen(special[SOCKET]) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, special[SOCKET], strnlen(special[SOCKET], sizeof(sa.sun_path) - 1));
    sock_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(sock_fd >= 0 && bind(sock_fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    CHECK(mkdir(special[DIR_], 0700) == 0);
    CHECK(symlink("/dev/zero", special[CHARDEV]) == 0);
}

static int refused(int rc, int kind)
{
    switch (kind) {
    case DIR_:
        return rc == -EISDIR;
    case SOCKET:
        return rc == -ENXIO || rc == -EINVAL; /* open(2) refuses a socket itself */
    default:
        return rc == -EINVAL;
    }
}

static void test_open_data(void)
{
    for (int k = 0; k < KINDS; k++) {
        alarm(20);
        int fd = fr_open_data(special[k], 0, 1, NULL);
        alarm(0);
        if (!refused(fd, k)) {
            fprintf(stderr, "fr_open_data(%s): %d\n", kind_names[k], fd);
            fr_test_failures++;
        }
        if (fd >= 0)
            close(fd);
    }
    char *good = fr_test_write("good.bin", 5000, 1);
    char link[1100];
    snprintf(link, sizeof(link), "%s.link", good);
    CHECK(symlink(good, link) == 0);
    struct stat st;
    int fd = fr_open_data(link, 0, 0, &st);
    CHECK(fd >= 0 && S_ISREG(st.st_mode) && st.st_size == 5000);
    if (fd >= 0) {
        int fl = fcntl(fd, F_GETFL);
        CHECK(fl >= 0 && !(fl & O_NONBLOCK)); /* reads of it may block as files do */
        char b[10];
        CHECK(read(fd, b, sizeof(b)) == 10);
        close(fd);
    }
    CHECK(fr_open_data("/dev/null", 0, 1, NULL) == -EINVAL);
    char missing[1100];
    snprintf(missing, sizeof(missing), "%s.missing", good);
    CHECK(fr_open_data(missing, 0, 0, NULL) == -ENOENT);
    free(good);
}

static void test_ranges(const char *engine)
{
    fr_ctx *ctx = fr_test_ctx(engine);
    if (!ctx)
        return;
    fr_pool *pool = fr_pool_new();
    fr_range r[2] = {{.offset = 0, .length = 100}, {.offset = 4096, .length = 10}};
    for (int k = 0; k < KINDS; k++) {
        fr_batch *b = fr_pool_get(pool);
        CHECK(fr_batch_prepare(b, 2) == 0);
        alarm(20);
        int rc = fr_read_ranges(ctx, special[k], r, 2, b);
        alarm(0);
        CHECK(rc == 0);
        for (int i = 0; i < 2; i++) {
            if (!refused((int)b->samples[i].length, k)) {
                fprintf(stderr, "%s: range %d of a %s: length %lld\n", engine, i, kind_names[k],
                        (long long)b->samples[i].length);
                fr_test_failures++;
            }
        }
        fr_batch_recycle(b);
    }
    fr_ctx_close(ctx);
    fr_pool_close(pool);
}

/* The slow path reopens the image by name: swapped for a link to /dev/zero
 * it gave 100 zero bytes as the range. */
static void test_plain_path_after_a_swap(void)
{
    char *path = fr_test_write("swapped.img", 8192, 2);
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 1) == 0);
    fr_range r = {.offset = 0, .length = 100};
    CHECK(fr_layout_ranges(b, &r, 1, 0, 4096) == 0);
    fr_read_range_plain(b, 0, path, &r);
    CHECK(b->samples[0].length == 100);
    CHECK(unlink(path) == 0 && symlink("/dev/zero", path) == 0);
    b->samples[0].length = 0;
    fr_read_range_plain(b, 0, path, &r);
    CHECK(b->samples[0].length == -EINVAL);
    CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
    alarm(20);
    fr_read_range_plain(b, 0, path, &r);
    alarm(0);
    CHECK(b->samples[0].length == -EINVAL);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    free(path);
}

static void test_store(void)
{
    for (int k = 0; k < KINDS; k++) {
        if (k == CHARDEV)
            continue; /* /dev/zero has no size: refused too, but by its size (0 bytes) */
        fr_store_config cfg;
        fr_store_config_init(&cfg);
        cfg.path = special[k];
        cfg.rows = 1;
        cfg.row_bytes = 4;
        cfg.backend = "host";
        cfg.device_id = -1;
        fr_store *s = NULL;
        char err[FR_ERRLEN] = "";
        alarm(20);
        int rc = fr_store_open(&cfg, &s, err, sizeof(err));
        alarm(0);
        if (rc == 0 || s != NULL || !strstr(err, special[k])) {
            fprintf(stderr, "store over a %s: rc %d, '%s'\n", kind_names[k], rc, err);
            fr_test_failures++;
        }
        if (s)
            fr_store_close(s);
    }
}

int main(void)
{
    make_specials();
    test_open_data();
    static const char *const engines[] = {"psync", "io_uring", NULL};
    for (const char *const *e = engines; *e; e++) {
        char why[FR_ERRLEN];
        if (fr_engine_probe(*e, why, sizeof(why)) == 0)
            test_ranges(*e);
        else
            fprintf(stderr, "skipping %s: %s\n", *e, why);
    }
    test_plain_path_after_a_swap();
    test_store();
    if (writer_fd >= 0)
        close(writer_fd);
    if (sock_fd >= 0)
        close(sock_fd);
    fr_test_cleanup();
    if (fr_test_failures)
        fprintf(stderr, "%d failure(s)\n", fr_test_failures);
    return fr_test_failures ? 1 : 0;
}
