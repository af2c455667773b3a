/* Helpers every engine shares: request sizing, arena layout, the slow path. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

void fr_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

size_t fr_request_len(size_t size, int o_direct, size_t dio_align)
{
    size_t len = size + 1;
    if (o_direct)
        len = fr_round_up(len, dio_align);
    if (len > FR_MAX_REQUEST)
        len = FR_MAX_REQUEST;
    return len;
}

int fr_layout(fr_batch *batch, const int64_t *sizes, size_t n, int o_direct,
              size_t dio_align)
{
    size_t align = o_direct ? dio_align : FR_SAMPLE_ALIGN;
    size_t off = fr_round_up(batch->arena.used, align);
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] < 0) {
            batch->samples[i].offset = 0;
            batch->samples[i].length = sizes[i];
            continue;
        }
        size_t slot = fr_round_up(fr_request_len((size_t)sizes[i], o_direct, dio_align), align);
        batch->samples[i].offset = off;
        batch->samples[i].length = 0;
        off += slot;
    }
    int rc = fr_arena_reserve(&batch->arena, off);
    if (rc == 0)
        batch->arena.used = off;
    return rc;
}

ssize_t fr_pread_full(int fd, void *buf, size_t len, off_t offset)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, (char *)buf + done, len - done, offset + (off_t)done);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

void fr_read_whole(fr_batch *batch, size_t i, const char *path, size_t slot_len)
{
    fr_sample *s = &batch->samples[i];
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        s->length = -errno;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        s->length = -errno;
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        s->length = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        close(fd);
        return;
    }
    /* Loop in case the file keeps growing: read until a read hits EOF. */
    size_t want = (size_t)st.st_size + 1;
    for (;;) {
        size_t dest = s->offset;
        if (want > slot_len) {
            dest = fr_round_up(batch->arena.used, FR_SAMPLE_ALIGN);
            if (fr_arena_reserve(&batch->arena, dest + want) != 0) {
                s->length = -ENOMEM;
                break;
            }
            batch->arena.used = dest + want;
            slot_len = want;
        }
        ssize_t got = fr_pread_full(fd, batch->arena.base + dest, want, 0);
        if (got < 0) {
            s->length = got;
            break;
        }
        if ((size_t)got < want) {
            s->offset = dest;
            s->length = got;
            break;
        }
        want *= 2;
    }
    close(fd);
}
