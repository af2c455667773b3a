/* Helpers every engine shares: request sizing, arena layout, the slow path. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "engines/io_common.h"
#include "engines/range_io.h"

size_t fr_request_len(size_t size, int o_direct, size_t dio_align)
{
    size_t len = size + 1;
    if (o_direct)
        len = fr_round_up(len, dio_align);
    if (len > FR_MAX_REQUEST) {
        /* Capped: the read cannot see past the size, so it must not return
         * exactly the size either, or a file of exactly FR_MAX_REQUEST
         * bytes that grew would be taken whole (the engines accept a read
         * of `size` bytes). One block less sends it to fr_read_whole. */
        len = FR_MAX_REQUEST;
        if (len == size)
            len -= o_direct ? dio_align : 1;
    }
    return len;
}

/* Dense layout (fr_batch.dense, never with O_DIRECT): each sample takes
 * exactly its size, the next one starts where it ends. Reads still ask for
 * size + 1 bytes (fr_request_len), so a file that grew since it was sized
 * writes one byte past its slot: onto the first byte of the next sample, or
 * onto the one byte reserved past the last. Such a read always goes on to
 * fr_read_whole, which flags the batch (dense_spill) for the owner to
 * re-read first bytes (fr_batch_reread_first_byte). */
static int dense_layout(const fr_batch *batch, int o_direct)
{
    return batch->dense && !o_direct;
}

/* Starts a layout: a batch's first layout (arena empty) clears the spill
 * flag of its previous read. */
static void layout_begin(fr_batch *batch)
{
    if (batch->arena.used == 0)
        batch->dense_spill = 0;
}

int fr_layout(fr_batch *batch, int64_t *sizes, size_t n, int o_direct, size_t dio_align)
{
    int dense = dense_layout(batch, o_direct);
    size_t align = dense ? 1 : o_direct ? dio_align : FR_SAMPLE_ALIGN;
    layout_begin(batch);
    size_t off = fr_round_up(batch->arena.used, align);
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] < 0 || (uint64_t)sizes[i] > FR_MAX_SAMPLE) {
            /* Past FR_MAX_SAMPLE (a sparse or corrupt file): that sample's
             * error, not the batch's (its slot would not fit, or would wrap
             * the running offset and aim reads at the arena's start). */
            if (sizes[i] >= 0)
                sizes[i] = -EFBIG;
            batch->samples[i].offset = 0;
            batch->samples[i].length = sizes[i];
            continue;
        }
        size_t slot = dense ? (size_t)sizes[i]
                            : fr_round_up(fr_request_len((size_t)sizes[i], o_direct, dio_align),
                                          align);
        if (slot > SIZE_MAX - 1 - off) { /* the batch's total would wrap */
            sizes[i] = -EFBIG;
            batch->samples[i].offset = 0;
            batch->samples[i].length = -EFBIG;
            continue;
        }
        batch->samples[i].offset = off;
        batch->samples[i].length = 0;
        off += slot;
    }
    /* Dense: room for the last sample's growth check byte. */
    int rc = fr_arena_reserve(&batch->arena, off + (dense ? 1 : 0));
    if (rc == 0)
        batch->arena.used = off;
    return rc;
}

void fr_pause_1ms(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

int fr_open_retry(const char *path, int flags)
{
    for (unsigned tries = 1;; tries++) {
        int fd = open(path, flags);
        if (fd >= 0)
            return fd;
        int e = errno;
        if ((e != EINTR && e != EAGAIN) || tries >= FR_RETRY_LIMIT) {
            errno = e;
            return -1;
        }
        if (e == EAGAIN)
            fr_pause_1ms(); /* e.g. a lease being broken */
    }
}

ssize_t fr_pread_full(int fd, void *buf, size_t len, off_t offset)
{
    size_t done = 0;
    unsigned tries = 0; /* EINTR/EAGAIN in a row, without a byte read */
    while (done < len) {
        ssize_t r = pread(fd, (char *)buf + done, len - done, offset + (off_t)done);
        if (r < 0) {
            int e = errno;
            if ((e == EINTR || e == EAGAIN) && ++tries < FR_RETRY_LIMIT) {
                if (e == EAGAIN)
                    fr_pause_1ms(); /* give whatever holds the file a moment */
                continue;
            }
            return -e; /* a file that never stops refusing is an error, not a hang */
        }
        tries = 0;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

void fr_read_whole(fr_batch *batch, size_t i, const char *path, size_t slot_len)
{
    fr_sample *s = &batch->samples[i];
    if (batch->dense && slot_len > 0 && slot_len < FR_MAX_REQUEST) {
        /* The engine's slot_len is the request (size + 1): the dense slot
         * is one byte shorter. (A request cut at FR_MAX_REQUEST is shorter
         * than its dense slot, and an O_DIRECT batch, laid out padded,
         * has a longer one: either only moves the file sooner.) */
        slot_len -= 1;
    }
    if (batch->dense)
        batch->dense_spill = 1;
    int fd;
    fd = fr_open_retry(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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
    if ((uint64_t)st.st_size > FR_MAX_SAMPLE) { /* as fr_layout says of such sizes */
        s->length = -EFBIG;
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
        if (want > FR_MAX_SAMPLE + 1) { /* grew past what a sample may be */
            s->length = -EFBIG;
            break;
        }
    }
    close(fd);
}

int fr_batch_reread_first_byte(fr_batch *batch, size_t i, const char *path)
{
    fr_sample *s = &batch->samples[i];
    if (s->length <= 0)
        return s->length < 0 ? (int)s->length : 0;
    int fd = fr_open_retry(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        s->length = -errno;
        return (int)s->length;
    }
    ssize_t got = fr_pread_full(fd, batch->arena.base + s->offset, 1, 0);
    close(fd);
    if (got < 0)
        s->length = got;
    else if (got == 0)
        s->length = -ENODATA; /* emptied since it was read */
    return s->length < 0 ? (int)s->length : 0;
}

/* ---- range reads (packed images, block devices) ---- */

size_t fr_range_request_len(uint64_t length, int o_direct, size_t dio_align)
{
    return o_direct ? fr_round_up((size_t)length, dio_align) : (size_t)length;
}

int fr_check_range(const fr_range *r, int o_direct, size_t dio_align)
{
    /* At most 2^24 chunks per range (16 TiB), and no offset overflow. */
    if (r->length > ((uint64_t)FR_RANGE_CHUNK << 24) || r->length > (uint64_t)SIZE_MAX / 2 ||
        r->offset > (uint64_t)INT64_MAX - r->length)
        return -EINVAL;
    if (o_direct && (r->offset & (dio_align - 1)) != 0)
        return -EINVAL;
    return 0;
}

int fr_layout_ranges(fr_batch *batch, const fr_range *ranges, size_t n, int o_direct,
                     size_t dio_align)
{
    /* Ranges are read to their exact length without O_DIRECT: no growth
     * check byte, nothing to reserve for it. */
    size_t align = dense_layout(batch, o_direct) ? 1 : o_direct ? dio_align : FR_SAMPLE_ALIGN;
    layout_begin(batch);
    size_t off = fr_round_up(batch->arena.used, align);
    for (size_t i = 0; i < n; i++) {
        int rc = fr_check_range(&ranges[i], o_direct, dio_align);
        size_t slot = 0;
        if (rc == 0 && ranges[i].length > FR_MAX_SAMPLE)
            rc = -EFBIG;
        if (rc == 0) {
            slot = fr_round_up(fr_range_request_len(ranges[i].length, o_direct, dio_align), align);
            if (slot > SIZE_MAX - 1 - off)
                rc = -EFBIG; /* the batch's total would wrap */
        }
        batch->samples[i].offset = off;
        batch->samples[i].length = rc;
        if (rc)
            continue;
        off += slot;
    }
    int rc = fr_arena_reserve(&batch->arena, off);
    if (rc == 0)
        batch->arena.used = off;
    return rc;
}

int fr_open_image(const char *path, int o_direct, int *direct_out)
{
    int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
    int fd;
    *direct_out = 0;
    if (o_direct) {
        fd = fr_open_retry(path, flags | O_DIRECT);
        if (fd >= 0) {
            *direct_out = 1;
            goto opened;
        }
        if (errno != EINVAL)
            return -errno;
        /* This file system refuses O_DIRECT: read through the page cache. */
    }
    fd = fr_open_retry(path, flags);
    if (fd < 0)
        return -errno;
opened:;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        close(fd);
        return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    }
    /* O_NONBLOCK only kept a FIFO from blocking the open; reads of files and
     * block devices ignore it, but clear it anyway. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

void fr_read_range_plain(fr_batch *batch, size_t i, const char *path, const fr_range *r)
{
    fr_sample *s = &batch->samples[i];
    /* Opened as the image was: a FIFO put in its place is no wait, a device
     * (a link to /dev/zero) no source of bytes. */
    int direct;
    int fd = fr_open_image(path, 0, &direct);
    if (fd < 0) {
        s->length = fd;
        return;
    }
    ssize_t got = fr_pread_full(fd, batch->arena.base + s->offset, (size_t)r->length,
                                (off_t)r->offset);
    close(fd);
    if (got < 0)
        s->length = got;
    else if ((uint64_t)got < r->length)
        s->length = -ENODATA; /* the range ends past the end of the image */
    else
        s->length = (int64_t)r->length;
}

void fr_image_cache_init(fr_image_cache *c)
{
    c->path = NULL;
    c->fd = -1;
    c->direct = 0;
    c->err = 0;
    c->dev = 0;
    c->ino = 0;
}

void fr_image_cache_close(fr_image_cache *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->path);
    fr_image_cache_init(c);
}

int fr_image_cache_get(fr_image_cache *c, const char *path, int o_direct)
{
    if (c->path && strcmp(c->path, path) == 0 && c->fd >= 0) {
        /* The same path: kept while it names the file open. A failed stat
         * (the image removed) reopens too, so the samples say why. */
        struct stat st;
        if (stat(path, &st) == 0 && st.st_dev == c->dev && st.st_ino == c->ino)
            return 0;
    }
    char *copy = strdup(path);
    if (!copy)
        return -ENOMEM;
    int had = c->fd >= 0;
    fr_image_cache_close(c);
    c->path = copy;
    int fd = fr_open_image(path, o_direct, &c->direct);
    if (fd < 0) {
        c->err = fd; /* retried on the next call: the image may appear */
        return had;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        c->err = -errno;
        close(fd);
        return had;
    }
    c->fd = fd;
    c->dev = st.st_dev;
    c->ino = st.st_ino;
    return 1;
}

/* qsort has no context argument (no global state here), so a shell sort:
 * a batch is hundreds of jobs. */
static int job_before(const fr_file_range *jobs, uint32_t a, uint32_t b)
{
    if (jobs[a].file != jobs[b].file)
        return jobs[a].file < jobs[b].file;
    if (jobs[a].offset != jobs[b].offset)
        return jobs[a].offset < jobs[b].offset;
    return a < b;
}

void fr_sort_file_jobs(const fr_file_range *jobs, uint32_t *v, size_t n)
{
    static const size_t gaps[] = {1750, 701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t g = 0; g < sizeof(gaps) / sizeof(gaps[0]); g++) {
        size_t gap = gaps[g];
        for (size_t i = gap; i < n; i++) {
            uint32_t x = v[i];
            size_t j = i;
            while (j >= gap && job_before(jobs, x, v[j - gap])) {
                v[j] = v[j - gap];
                j -= gap;
            }
            v[j] = x;
        }
    }
}

int fr_prepare_file_jobs(fr_batch *batch, const fr_file_range *jobs, size_t n, size_t npaths,
                         fr_range *ranges, size_t dio_align, uint32_t *sorted, size_t *valid)
{
    for (size_t i = 0; i < n; i++) {
        ranges[i].offset = jobs[i].offset;
        ranges[i].length = jobs[i].length;
    }
    int rc = fr_layout_ranges(batch, ranges, n, 0, dio_align);
    if (rc)
        return rc;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].file >= npaths)
            batch->samples[i].length = -EINVAL;
        else if (batch->samples[i].length == 0)
            sorted[k++] = (uint32_t)i; /* not a bad range */
    }
    fr_sort_file_jobs(jobs, sorted, k);
    *valid = k;
    return 0;
}

size_t fr_file_runs(const fr_file_range *jobs, const uint32_t *v, size_t first, size_t end,
                    uint32_t *runs)
{
    size_t nruns = 0;
    uint64_t at = 0;
    int niov = 0;
    for (size_t pos = first; pos < end; pos++) {
        const fr_file_range *r = &jobs[v[pos]];
        int fresh = pos == first || r->file != jobs[v[pos - 1]].file || r->offset < at ||
                    r->offset - at > FR_COALESCE_GAP || niov + 2 > FR_COALESCE_IOV;
        if (fresh) {
            runs[nruns++] = (uint32_t)pos;
            niov = 0;
        } else if (r->offset > at) {
            niov++; /* the gap's vector */
        }
        niov++;
        at = r->offset + r->length;
    }
    runs[nruns] = (uint32_t)end;
    return nruns;
}
