/* Paths xNVMe cannot take, and aliases it can (see xnvme_path.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engines/xnvme/xnvme_path.h"

int fr_xnvme_path_ok(const char *path, size_t max_len)
{
    size_t len = strnlen(path, max_len + 1);
    return len > 0 && len <= max_len && memchr(path, '?', len) == NULL;
}

static int copy_out(const char *name, size_t max_len, char *buf, size_t buf_len)
{
    size_t len = strlen(name);
    if (len >= buf_len || !fr_xnvme_path_ok(name, max_len))
        return -ENAMETOOLONG;
    memcpy(buf, name, len + 1);
    return 0;
}

int fr_xnvme_path_alias(const char *path, size_t max_len, char *buf, size_t buf_len, int *fd)
{
    *fd = -1;
    if (fr_xnvme_path_ok(path, max_len))
        return copy_out(path, max_len, buf, buf_len);
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    if (S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode)) {
        /* xNVMe finds a device's sysfs entries from its name: keep the name. */
        char *real = realpath(path, NULL);
        if (!real)
            return -errno;
        int rc = copy_out(real, max_len, buf, buf_len);
        free(real);
        return rc;
    }
    int d;
    do {
        d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (d < 0 && errno == EINTR);
    if (d < 0)
        return -errno;
    char name[64];
    snprintf(name, sizeof(name), "/proc/self/fd/%d", d);
    struct stat via;
    /* The alias must reach the same file (no /proc: it does not). */
    if (stat(name, &via) != 0 || via.st_dev != st.st_dev || via.st_ino != st.st_ino) {
        close(d);
        return -ENAMETOOLONG;
    }
    int rc = copy_out(name, max_len, buf, buf_len);
    if (rc) {
        close(d);
        return rc;
    }
    *fd = d;
    return 0;
}
