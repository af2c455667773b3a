/* Paths xNVMe cannot take (xnvme_path.h): the check, and aliases that reach
 * the same file. Runs without xNVMe (named so CMake does not skip it). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "engines/xnvme/xnvme_path.h"

/* A path of about `want` bytes: nested directories under the test dir. */
static char *long_path(size_t want)
{
    static char path[4096];
    snprintf(path, sizeof(path), "%s", fr_test_dir());
    while (strlen(path) + 60 < want) {
        size_t len = strlen(path);
        snprintf(path + len, sizeof(path) - len, "/%s", "d123456789012345678901234567890123456789");
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return NULL;
    }
    size_t len = strlen(path);
    snprintf(path + len, sizeof(path) - len, "/f");
    while (strlen(path) < want)
        strcat(path, "x");
    return path;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int main(void)
{
    /* The check: length limit, '?', empty. */
    CHECK(fr_xnvme_path_ok("/dev/nvme0n1", FR_XNVME_PATH_MAX));
    CHECK(!fr_xnvme_path_ok("", FR_XNVME_PATH_MAX));
    CHECK(!fr_xnvme_path_ok("/data/a?b.jpg", FR_XNVME_PATH_MAX));
    char edge[FR_XNVME_PATH_MAX + 2];
    memset(edge, 'a', sizeof(edge));
    edge[0] = '/';
    edge[FR_XNVME_PATH_MAX] = '\0';
    CHECK(fr_xnvme_path_ok(edge, FR_XNVME_PATH_MAX)); /* 383 bytes: fits */
    edge[FR_XNVME_PATH_MAX] = 'a';
    edge[FR_XNVME_PATH_MAX + 1] = '\0';
    CHECK(!fr_xnvme_path_ok(edge, FR_XNVME_PATH_MAX)); /* 384: does not */

    char buf[512];
    int fd = 99;
    /* A short path is its own name, and no descriptor is opened. */
    char *shortp = fr_test_write("short.bin", 10, 1);
    CHECK(fr_xnvme_path_alias(shortp, FR_XNVME_PATH_MAX, buf, sizeof(buf), &fd) == 0);
    CHECK(strcmp(buf, shortp) == 0 && fd == -1);
    free(shortp);

    /* A 700-byte path: an alias of at most 383 bytes that reaches the file. */
    char *lp = long_path(700);
    CHECK(lp != NULL);
    if (lp) {
        char keep[4096];
        snprintf(keep, sizeof(keep), "%s", lp);
        int w = open(keep, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        CHECK(w >= 0);
        if (w >= 0) {
            CHECK(write(w, "hello", 5) == 5);
            CHECK(close(w) == 0);
        }
        CHECK(strlen(keep) >= 700 && !fr_xnvme_path_ok(keep, FR_XNVME_PATH_MAX));
        int rc = fr_xnvme_path_alias(keep, FR_XNVME_PATH_MAX, buf, sizeof(buf), &fd);
        CHECK(rc == 0);
        if (rc == 0) {
            CHECK(fd >= 0 && fr_xnvme_path_ok(buf, FR_XNVME_PATH_MAX));
            CHECK(same_file(buf, keep));
            /* Opening the alias reads the file's bytes, as xNVMe's open would. */
            int r = open(buf, O_RDONLY | O_CLOEXEC);
            char got[8] = {0};
            CHECK(r >= 0 && read(r, got, sizeof(got)) == 5 && memcmp(got, "hello", 5) == 0);
            if (r >= 0)
                close(r);
            CHECK(close(fd) == 0);
        }
        /* A long path that does not exist: its errno, no descriptor. */
        strcat(keep, "-missing");
        CHECK(fr_xnvme_path_alias(keep, FR_XNVME_PATH_MAX, buf, sizeof(buf), &fd) == -ENOENT);
        CHECK(fd == -1);
    }
    /* '?' in a short path goes through an alias too. */
    char *q = fr_test_write("what?.bin", 3, 2);
    CHECK(fr_xnvme_path_alias(q, FR_XNVME_PATH_MAX, buf, sizeof(buf), &fd) == 0);
    CHECK(fd >= 0 && same_file(buf, q) && strchr(buf, '?') == NULL);
    if (fd >= 0)
        close(fd);
    free(q);
    /* A buffer too small for any alias: a clear error, nothing leaked. */
    q = fr_test_write("what?.bin", 3, 2);
    CHECK(fr_xnvme_path_alias(q, FR_XNVME_PATH_MAX, buf, 4, &fd) == -ENAMETOOLONG && fd == -1);
    free(q);
    return fr_test_finish("test_xnvme_path_alias");
}
