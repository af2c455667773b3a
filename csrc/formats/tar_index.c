/*
 * The tar header walker (fr_tar_walk) and the shard-file driver
 * (fr_wds_index_files); the grouping is in wds_group.c. tar_index.h says
 * what each does; the Python reference is fastread/formats/webdataset.py
 * (index_tar), whose semantics these follow byte for byte: where a header
 * is something the reference would read in a way this code does not (an
 * octal field with a sign, a pax size with spaces), this code refuses it
 * and the caller redoes the shard in the reference code.
 */
#define _GNU_SOURCE
#include "formats/tar_index.h"

#include "core/base.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 512u
/* The largest shard mapped with MAP_POPULATE. */
#define FR_TAR_POPULATE_MAX (256ull << 20)

void fr_tar_members_free(fr_tar_members *m)
{
    free(m->data_off);
    free(m->size);
    free(m->header_off);
    free(m->name_off);
    free(m->names);
    memset(m, 0, sizeof *m);
}

int fr_tar_members_push(fr_tar_members *m, const char *name, size_t name_len, uint64_t data,
                        uint64_t size, uint64_t header)
{
    if (m->n + 1 >= m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 256;
        uint64_t *a = realloc(m->data_off, cap * sizeof *a);
        if (a)
            m->data_off = a;
        uint64_t *b = a ? realloc(m->size, cap * sizeof *b) : NULL;
        if (b)
            m->size = b;
        uint64_t *c = b ? realloc(m->header_off, cap * sizeof *c) : NULL;
        if (c)
            m->header_off = c;
        uint64_t *d = c ? realloc(m->name_off, (cap + 1) * sizeof *d) : NULL;
        if (!d)
            return -ENOMEM;
        m->name_off = d;
        if (m->n == 0)
            m->name_off[0] = 0;
        m->cap = cap;
    }
    if (fr_grow((void **)&m->names, &m->names_cap, m->names_len + name_len, 1, 4096))
        return -ENOMEM;
    if (name_len)
        memcpy(m->names + m->names_len, name, name_len);
    m->names_len += name_len;
    m->data_off[m->n] = data;
    m->size[m->n] = size;
    m->header_off[m->n] = header;
    m->n++;
    m->name_off[m->n] = m->names_len;
    return 0;
}

/* A numeric header field as the reference reads it: GNU base-256 (high bit
 * set; negative refused), else octal text up to the first NUL with spaces
 * and NULs stripped (empty: 0). 0, or -EINVAL. */
static int parse_octal(const unsigned char *f, size_t len, uint64_t *out)
{
    if (len && (f[0] & 0x80)) {
        if (f[0] & 0x40)
            return -EINVAL;
        uint64_t v = 0;
        for (size_t i = 1; i < len; i++) {
            if (v >> 56)
                return -EINVAL;
            v = v << 8 | f[i];
        }
        *out = v;
        return 0;
    }
    size_t end = 0;
    while (end < len && f[end])
        end++;
    size_t a = 0;
    while (a < end && f[a] == ' ')
        a++;
    while (end > a && f[end - 1] == ' ')
        end--;
    uint64_t v = 0;
    for (size_t i = a; i < end; i++) {
        if (f[i] < '0' || f[i] > '7' || (v >> 60))
            return -EINVAL;
        v = v << 3 | (uint64_t)(f[i] - '0');
    }
    *out = v;
    return 0;
}

static int parse_decimal(const unsigned char *s, size_t len, uint64_t *out)
{
    if (len == 0 || len > 19)
        return -EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

typedef struct pax_info {
    const unsigned char *path;
    size_t path_len;
    int has_path, has_size;
    uint64_t size;
} pax_info;

/* The records of a pax header's data: "LEN key=value\n", later ones win. */
static int parse_pax(const unsigned char *d, size_t len, pax_info *pax)
{
    memset(pax, 0, sizeof *pax);
    size_t pos = 0;
    while (pos < len) {
        if (d[pos] == 0)
            break;
        const unsigned char *sp = memchr(d + pos, ' ', len - pos);
        if (!sp)
            return -EINVAL;
        uint64_t rec_len;
        if (parse_decimal(d + pos, (size_t)(sp - (d + pos)), &rec_len) || rec_len == 0 ||
            rec_len > len - pos || (size_t)(sp - d) + 1 > pos + rec_len - 1)
            return -EINVAL;
        const unsigned char *rec = sp + 1;
        size_t rlen = pos + rec_len - 1 - (size_t)(rec - d);
        const unsigned char *eq = memchr(rec, '=', rlen);
        size_t klen = eq ? (size_t)(eq - rec) : rlen;
        const unsigned char *val = eq ? eq + 1 : rec + rlen;
        size_t vlen = eq ? rlen - klen - 1 : 0;
        if (klen == 4 && memcmp(rec, "path", 4) == 0) {
            if (vlen > FR_TAR_NAME_MAX)
                return -EINVAL;
            pax->path = val;
            pax->path_len = vlen;
            pax->has_path = 1;
        } else if (klen == 4 && memcmp(rec, "size", 4) == 0) {
            if (parse_decimal(val, vlen, &pax->size))
                return -EINVAL;
            pax->has_size = 1;
        }
        pos += rec_len;
    }
    return 0;
}

static size_t name_field(const unsigned char *f, size_t len)
{
    const unsigned char *z = memchr(f, 0, len);
    return z ? (size_t)(z - f) : len;
}

int fr_tar_walk(const unsigned char *buf, uint64_t n, fr_tar_members *out, uint64_t *bad_at,
                char *err, size_t err_len)
{
    uint64_t pos = 0;
    const unsigned char *long_name = NULL;
    size_t long_len = 0;
    pax_info pax = {0};
    int has_pax = 0;
    char name[2 * 256 + 2];
    *bad_at = 0;
    if (n == 0) {
        fr_set_err(err, err_len, "empty file (not a tar archive)");
        return -EINVAL;
    }
    for (;;) {
        *bad_at = pos;
        if (pos > n || n - pos < BLOCK) {
            if (pos == n && pos > 0)
                return 0; /* no end-of-archive blocks: accepted, as tar does */
            fr_set_err(err, err_len, "truncated tar header (%llu of 512 bytes)",
                       (unsigned long long)(pos > n ? 0 : n - pos));
            return -EINVAL;
        }
        const unsigned char *h = buf + pos;
        /* A plain loop the compiler vectorizes; all bytes are unsigned, so
         * the block is all zeros exactly when they sum to 0. */
        uint32_t all = 0;
        for (unsigned i = 0; i < BLOCK; i++)
            all += h[i];
        if (all == 0)
            return 0; /* end of archive */
        uint64_t sum = all + 8u * 32u;
        for (unsigned i = 148; i < 156; i++)
            sum -= h[i];
        uint64_t stored, size;
        if (parse_octal(h + 148, 8, &stored)) {
            fr_set_err(err, err_len, "%s", pos ? "tar header checksum is not an octal number"
                                               : "not a tar archive (bad checksum field)");
            return -EINVAL;
        }
        if (stored != sum) {
            fr_set_err(err, err_len, "%s (header checksum %llu stored, %llu computed)",
                       pos ? "tar header checksum error" : "not a tar archive",
                       (unsigned long long)stored, (unsigned long long)sum);
            return -EINVAL;
        }
        if (parse_octal(h + 124, 12, &size)) {
            fr_set_err(err, err_len, "tar header size is not an octal number");
            return -EINVAL;
        }
        unsigned char kind = h[156];
        uint64_t data = pos + BLOCK;
        if (size > n - data) {
            fr_set_err(err, err_len, "member data runs past the end of the shard (%llu bytes "
                       "from %llu, shard is %llu bytes): truncated",
                       (unsigned long long)size, (unsigned long long)data,
                       (unsigned long long)n);
            return -EINVAL;
        }
        if (kind == 'L') {
            if (size > FR_TAR_NAME_MAX) {
                fr_set_err(err, err_len, "GNU long name of %llu bytes (more than %u)",
                           (unsigned long long)size, FR_TAR_NAME_MAX);
                return -EINVAL;
            }
            long_name = buf + data;
            long_len = name_field(long_name, (size_t)size);
        } else if (kind == 'x') {
            if (size > FR_TAR_PAX_MAX) {
                fr_set_err(err, err_len, "pax header of %llu bytes (more than %u)",
                           (unsigned long long)size, FR_TAR_PAX_MAX);
                return -EINVAL;
            }
            if (parse_pax(buf + data, (size_t)size, &pax)) {
                fr_set_err(err, err_len, "malformed pax extended header");
                return -EINVAL;
            }
            has_pax = 1;
        } else if (kind == '0' || kind == 0 || kind == '7') {
            if (has_pax && pax.has_size) {
                size = pax.size;
                if (size > n - data) {
                    fr_set_err(err, err_len, "member data runs past the end of the shard: "
                               "truncated");
                    return -EINVAL;
                }
            }
            const char *nm;
            size_t nlen;
            if (long_name) {
                nm = (const char *)long_name;
                nlen = long_len;
            } else if (has_pax && pax.has_path) {
                nm = (const char *)pax.path;
                nlen = pax.path_len;
            } else {
                size_t base = name_field(h, 100);
                size_t pre = memcmp(h + 257, "ustar", 5) == 0 ? name_field(h + 345, 155) : 0;
                nlen = 0;
                if (pre) {
                    memcpy(name, h + 345, pre);
                    name[pre] = '/';
                    nlen = pre + 1;
                }
                memcpy(name + nlen, h, base);
                nlen += base;
                nm = name;
            }
            int rc = fr_tar_members_push(out, nm, nlen, data, size, pos);
            if (rc)
                return rc;
            long_name = NULL;
            has_pax = 0;
        } else { /* directories, links, devices, global pax: no data files */
            long_name = NULL;
            has_pax = 0;
        }
        uint64_t blocks = size / BLOCK + (size % BLOCK != 0);
        pos = data + blocks * BLOCK;
    }
}

/* -- many shard files ------------------------------------------------------ */

typedef struct files_job {
    const char *const *paths;
    size_t n;
    const fr_wds_spec *spec;
    fr_wds_shard *out;
    atomic_size_t next;
} files_job;

static void index_one(const char *path, const fr_wds_spec *spec, fr_wds_shard *r)
{
    r->stage = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        r->rc = -errno;
        fr_set_err(r->err, sizeof r->err, "cannot open: %s", strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        r->rc = -errno;
        fr_set_err(r->err, sizeof r->err, "cannot stat: %s", strerror(errno));
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        r->rc = -EINVAL;
        fr_set_err(r->err, sizeof r->err, "not a regular file");
        close(fd);
        return;
    }
    r->file_size = (uint64_t)st.st_size;
    r->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (st.st_size == 0) {
        r->rc = -EINVAL;
        r->stage = 1;
        fr_set_err(r->err, sizeof r->err, "empty file (not a tar archive)");
        close(fd);
        return;
    }
    /* Small shards are mapped whole at once (MAP_POPULATE: one call instead
     * of a page fault per 4 KiB, which serialize on the address space's lock
     * when several threads walk at once); larger ones fault as walked. */
    int populate = (uint64_t)st.st_size <= FR_TAR_POPULATE_MAX ? MAP_POPULATE : 0;
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | populate, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) {
        r->rc = -saved;
        fr_set_err(r->err, sizeof r->err, "cannot map: %s", strerror(saved));
        return;
    }
    fr_tar_members m = {0};
    r->stage = 1;
    r->rc = fr_tar_walk(map, (uint64_t)st.st_size, &m, &r->bad_at, r->err, sizeof r->err);
    munmap(map, (size_t)st.st_size);
    if (r->rc == 0) {
        r->stage = 2;
        r->rc = fr_wds_group(spec, m.names, m.name_off, m.data_off, m.size, m.n, &r->samples,
                             r->err, sizeof r->err);
    }
    fr_tar_members_free(&m);
}

static void *files_worker(void *arg)
{
    files_job *job = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->n)
            return NULL;
        index_one(job->paths[i], job->spec, &job->out[i]);
    }
}

int fr_wds_index_files(const char *const *paths, size_t n, const fr_wds_spec *spec,
                       unsigned threads, fr_wds_shard *out)
{
    files_job job = {.paths = paths, .n = n, .spec = spec, .out = out};
    atomic_init(&job.next, 0);
    if (threads < 1)
        threads = 1;
    if (threads > n)
        threads = n ? (unsigned)n : 1;
    pthread_t *tids = calloc(threads, sizeof *tids);
    if (!tids)
        return -ENOMEM;
    unsigned started = 0;
    for (unsigned t = 1; t < threads; t++) {
        /* A thread that cannot start leaves its share to the others. */
        if (pthread_create(&tids[t], NULL, files_worker, &job) != 0)
            break;
        started++;
    }
    files_worker(&job);
    for (unsigned t = 1; t <= started; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    return 0;
}
