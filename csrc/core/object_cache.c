/* The node-local object cache: see object_cache.h for the layout, the
 * version checks, the locking and eviction. */
#define _GNU_SOURCE /* F_OFD_SETLK, F_OFD_SETLKW */
#include "core/object_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/base.h"

#define META_MAGIC "FRCACHE1"
#define ETAG_MAX 64
#define URL_MAX 8192
/* The most a scope (fr_ocache_open) adds to an entry's key. */
#define SCOPE_MAX 1024
/* Where the stripes' lock bytes start in index.lock (after the counter). */
#define STRIPE_BASE 4096
/* A lookup rewrites an entry's access stamp only when it is this old:
 * one write per entry per second at most, plenty for LRU between epochs. */
#define STAMP_EVERY_NS 1000000000ull

typedef struct meta_hdr {
    char magic[8];
    uint64_t size;
    uint64_t stamp; /* CLOCK_REALTIME ns of the last use */
    uint32_t crc;
    uint32_t url_len;
    char etag[ETAG_MAX];
} meta_hdr;

/* A remembered entry (fr_ocache_trust): open addressing on h[0]; a slot
 * with h[0] == 0 && h[1] == 0 is free; a forgotten one keeps its slot with
 * size UINT64_MAX (matches nothing). */
typedef struct known_slot {
    uint64_t h[2];
    uint64_t size;
    uint64_t checked_ns; /* CLOCK_MONOTONIC of the last check */
    uint32_t crc;
} known_slot;

struct fr_ocache {
    known_slot *known;
    size_t known_cap, known_n;
    char *dir;
    size_t dir_len;
    char *scope; /* the prefix of every key: "" or the caller's scope and a '\n' */
    size_t scope_len;
    uint64_t max_bytes;
    int index_fd; /* index.lock: the counter and the locks */
    char *scratch; /* fr_ocache_path_max bytes, for this fr_ocache's own paths */
    char *url_buf; /* URL_MAX + 1, a record's URL */
};

static uint64_t now_realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* cannot fail for this clock */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* FNV-1a over the key (the scope's prefix, then the URL) from two offset
 * bases, each finished by splitmix64's mixer: 128 bits, so distinct keys
 * practically never share an ID (and a shared one is a miss: the record
 * names its key). */
static void key_hash(const fr_ocache *c, const char *url, uint64_t h[2])
{
    uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
    const char *parts[2] = {c->scope, url};
    for (int k = 0; k < 2; k++)
        for (const unsigned char *p = (const unsigned char *)parts[k]; *p; p++) {
            a = (a ^ *p) * 0x100000001b3ull;
            b = (b ^ *p) * 0x100000001b3ull;
            b ^= b >> 29;
        }
    h[0] = fr_splitmix64(&a);
    h[1] = fr_splitmix64(&b);
}

/* 1 if a record's key (NUL-terminated) is `url`'s in c's scope. */
static int same_key(const fr_ocache *c, const char *record_key, const char *url)
{
    return strncmp(record_key, c->scope, c->scope_len) == 0 &&
           strcmp(record_key + c->scope_len, url) == 0;
}

void fr_ocache_id(const fr_ocache *c, const char *url, char id[FR_OCACHE_ID_LEN + 1])
{
    uint64_t h[2];
    key_hash(c, url, h);
    snprintf(id, FR_OCACHE_ID_LEN + 1, "%016llx%016llx", (unsigned long long)h[0],
             (unsigned long long)h[1]);
}

unsigned fr_ocache_stripe(const fr_ocache *c, const char *url)
{
    uint64_t h[2];
    key_hash(c, url, h);
    return (unsigned)(h[1] % FR_OCACHE_STRIPES);
}

/* dir + "/XX/" + ID + ".data.tmp" + NUL */
size_t fr_ocache_path_max(const fr_ocache *c) { return c->dir_len + 4 + FR_OCACHE_ID_LEN + 10; }

/* The entry's path with `suffix` (".data", ".meta", ".data.tmp", ...). */
static void entry_path(const fr_ocache *c, const char *url, const char *suffix, char *out)
{
    char id[FR_OCACHE_ID_LEN + 1];
    fr_ocache_id(c, url, id);
    snprintf(out, fr_ocache_path_max(c), "%s/%.2s/%s%s", c->dir, id, id, suffix);
}

void fr_ocache_data_path(const fr_ocache *c, const char *url, char *out)
{
    entry_path(c, url, ".data", out);
}

static int mkdir_ok(const char *path)
{
    if (mkdir(path, 0755) == 0 || errno == EEXIST)
        return 0;
    return -errno;
}

int fr_ocache_open(const char *dir, uint64_t max_bytes, const char *scope, fr_ocache **out,
                   char *err, size_t err_len)
{
    *out = NULL;
    size_t scope_len = scope ? strlen(scope) : 0;
    if (scope_len >= SCOPE_MAX || (scope && strchr(scope, '\n'))) {
        fr_set_err(err, err_len, "cache_dir: the engine's cache scope is not one line of at "
                   "most %d bytes", SCOPE_MAX - 1);
        return -EINVAL;
    }
    size_t len = dir ? strlen(dir) : 0;
    while (len > 1 && dir[len - 1] == '/')
        len--;
    if (len == 0 || len > PATH_MAX - 64) {
        fr_set_err(err, err_len, "cache_dir must be a directory path of 1..%d bytes",
                   PATH_MAX - 64);
        return -EINVAL;
    }
    fr_ocache *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->dir = strndup(dir, len);
    c->dir_len = len;
    c->max_bytes = max_bytes;
    c->index_fd = -1;
    int rc = -ENOMEM;
    /* The scope and a newline, which no scope holds: keys of two scopes
     * never run into each other. */
    c->scope_len = scope_len ? scope_len + 1 : 0;
    if ((c->scope = malloc(c->scope_len + 1)))
        snprintf(c->scope, c->scope_len + 1, "%s%s", scope_len ? scope : "",
                 scope_len ? "\n" : "");
    if (!c->dir || !c->scope || !(c->scratch = malloc(fr_ocache_path_max(c) + 16)) ||
        !(c->url_buf = malloc(URL_MAX + 1)))
        goto fail;
    if ((rc = mkdir_ok(c->dir))) {
        fr_set_err(err, err_len, "cache_dir %s: %s", c->dir, strerror(-rc));
        goto fail;
    }
    snprintf(c->scratch, fr_ocache_path_max(c), "%s/index.lock", c->dir);
    c->index_fd = open(c->scratch, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c->index_fd < 0) {
        rc = -errno;
        fr_set_err(err, err_len, "cache_dir %s: %s", c->scratch, strerror(errno));
        goto fail;
    }
    *out = c;
    return 0;
fail:
    fr_ocache_close(c);
    return rc;
}

void fr_ocache_close(fr_ocache *c)
{
    if (!c)
        return;
    if (c->index_fd >= 0)
        close(c->index_fd); /* drops every lock of this description */
    free(c->known);
    free(c->url_buf);
    free(c->scratch);
    free(c->scope);
    free(c->dir);
    free(c);
}

/* --------------------------------------------------------------- locks */

static int range_lock(fr_ocache *c, off_t start, off_t len, short type, int wait)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    for (;;) {
        if (fcntl(c->index_fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
            return 1;
        if (errno == EINTR)
            continue; /* a signal while waiting: wait on */
        if (!wait && (errno == EAGAIN || errno == EACCES))
            return 0;
        return -errno;
    }
}

int fr_ocache_trylock(fr_ocache *c, unsigned stripe)
{
    return range_lock(c, STRIPE_BASE + (off_t)stripe, 1, F_WRLCK, 0);
}

int fr_ocache_lock(fr_ocache *c, unsigned stripe)
{
    return range_lock(c, STRIPE_BASE + (off_t)stripe, 1, F_WRLCK, 1);
}

void fr_ocache_unlock(fr_ocache *c, unsigned stripe)
{
    /* Unlocking a range this description holds cannot fail but for a bad
     * descriptor, which open() ruled out. */
    (void)range_lock(c, STRIPE_BASE + (off_t)stripe, 1, F_UNLCK, 0);
}

/* ------------------------------------------------------------- counter */

static uint64_t read_counter(fr_ocache *c)
{
    uint64_t v = 0;
    /* A short read is a fresh index (empty file): zero bytes counted. */
    if (pread(c->index_fd, &v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = 0;
    return v;
}

static void write_counter(fr_ocache *c, uint64_t v)
{
    /* The counter is a hint (eviction recounts): a failed write only
     * delays the next eviction until another writer counts. */
    (void)!pwrite(c->index_fd, &v, sizeof(v), 0);
}

/* Adds `delta` (may be negative) to the counter, under its lock. */
static void add_counter(fr_ocache *c, int64_t delta)
{
    if (range_lock(c, 0, 8, F_WRLCK, 1) != 1)
        return;
    uint64_t v = read_counter(c);
    v = delta < 0 && (uint64_t)-delta > v ? 0 : v + (uint64_t)delta;
    write_counter(c, v);
    (void)range_lock(c, 0, 8, F_UNLCK, 0);
}

uint64_t fr_ocache_usage(fr_ocache *c)
{
    if (range_lock(c, 0, 8, F_RDLCK, 1) != 1)
        return 0;
    uint64_t v = read_counter(c);
    (void)range_lock(c, 0, 8, F_UNLCK, 0);
    return v;
}

int fr_ocache_over(fr_ocache *c) { return c->max_bytes && fr_ocache_usage(c) > c->max_bytes; }

/* ------------------------------------------------------ known entries */

static uint64_t now_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The slot of hash h, NULL if absent (add: made, unless the table is full
 * or cannot grow). */
static known_slot *known_find(fr_ocache *c, const uint64_t h[2], int add)
{
    uint64_t key0 = h[0] | (h[0] == 0 && h[1] == 0); /* never the free mark */
    if (add && 4 * (c->known_n + 1) > 3 * c->known_cap) {
        if (c->known_n >= FR_OCACHE_KNOWN_MAX)
            add = 0;
        else {
            size_t cap = c->known_cap ? 2 * c->known_cap : 1024;
            known_slot *t = calloc(cap, sizeof(*t));
            if (!t)
                add = 0;
            else {
                for (size_t i = 0; i < c->known_cap; i++) {
                    known_slot *o = &c->known[i];
                    if (o->h[0] == 0 && o->h[1] == 0)
                        continue;
                    size_t j = o->h[0] & (cap - 1);
                    while (t[j].h[0] || t[j].h[1])
                        j = (j + 1) & (cap - 1);
                    t[j] = *o;
                }
                free(c->known);
                c->known = t;
                c->known_cap = cap;
            }
        }
    }
    if (c->known_cap == 0)
        return NULL;
    size_t j = key0 & (c->known_cap - 1);
    for (;;) {
        known_slot *k = &c->known[j];
        if (k->h[0] == key0 && k->h[1] == h[1])
            return k;
        if (k->h[0] == 0 && k->h[1] == 0) {
            if (!add)
                return NULL;
            k->h[0] = key0;
            k->h[1] = h[1];
            k->size = UINT64_MAX;
            c->known_n++;
            return k;
        }
        j = (j + 1) & (c->known_cap - 1);
    }
}

void fr_ocache_trust(fr_ocache *c, const char *url, const fr_ocache_entry *e)
{
    uint64_t h[2];
    key_hash(c, url, h);
    known_slot *k = known_find(c, h, 1);
    if (!k)
        return; /* full: this entry is checked whole at every use */
    k->size = e->size;
    k->crc = e->crc;
    k->checked_ns = now_mono_ns();
}

void fr_ocache_forget(fr_ocache *c, const char *url)
{
    uint64_t h[2];
    key_hash(c, url, h);
    known_slot *k = known_find(c, h, 0);
    if (k)
        k->size = UINT64_MAX;
}

/* -------------------------------------------------------------- lookup */

/* Reads the record at `path` into *h and its URL into c->url_buf. fd: the
 * open record. 0, or -1 if it is not a whole record. */
static int read_meta(fr_ocache *c, int fd, meta_hdr *h)
{
    if (pread(fd, h, sizeof(*h), 0) != (ssize_t)sizeof(*h) ||
        memcmp(h->magic, META_MAGIC, 8) != 0 || h->url_len > URL_MAX)
        return -1;
    if (pread(fd, c->url_buf, h->url_len, sizeof(*h)) != (ssize_t)h->url_len)
        return -1;
    c->url_buf[h->url_len] = 0;
    h->etag[ETAG_MAX - 1] = 0;
    return 0;
}

int fr_ocache_lookup(fr_ocache *c, const char *url, int64_t want_size, fr_ocache_entry *e)
{
    uint64_t hash[2];
    key_hash(c, url, hash);
    known_slot *k = known_find(c, hash, 0);
    uint64_t mono = now_mono_ns();
    if (k && k->size != UINT64_MAX && mono - k->checked_ns < FR_OCACHE_RECHECK_NS &&
        (want_size < 0 || (uint64_t)want_size == k->size)) {
        e->size = k->size;
        e->crc = k->crc;
        e->trusted = 1;
        return 1;
    }
    entry_path(c, url, ".meta", c->scratch);
    int fd = open(c->scratch, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 0;
    meta_hdr h;
    int whole = read_meta(c, fd, &h) == 0 && same_key(c, c->url_buf, url);
    if (whole) {
        struct stat st;
        entry_path(c, url, ".data", c->scratch);
        whole = stat(c->scratch, &st) == 0 && S_ISREG(st.st_mode) &&
                (uint64_t)st.st_size == h.size;
    }
    /* A size the caller does not expect: another version than the entry's
     * (stale), though the entry itself is whole. */
    int ok = whole && (want_size < 0 || (uint64_t)want_size == h.size);
    if (ok) {
        uint64_t now = now_realtime_ns();
        if (now > h.stamp + STAMP_EVERY_NS) /* a failed write only ages the entry */
            (void)!pwrite(fd, &now, sizeof(now), offsetof(meta_hdr, stamp));
        e->size = h.size;
        e->crc = h.crc;
        /* The version this fr_ocache checked before: trusted again. */
        e->trusted = k && k->size == h.size && k->crc == h.crc;
        if (e->trusted)
            k->checked_ns = mono;
    } else if (k && !whole) {
        k->size = UINT64_MAX;
    }
    close(fd);
    return ok;
}

/* An ETag's opaque part: without a weak prefix and the quotes. */
static void etag_core(const char *etag, const char **p, size_t *len)
{
    const char *s = etag;
    if (s[0] == 'W' && s[1] == '/')
        s += 2;
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
        s++;
        n -= 2;
    }
    *p = s;
    *len = n;
}

static int same_etag(const char *a, const char *b)
{
    const char *pa, *pb;
    size_t na, nb;
    etag_core(a, &pa, &na);
    etag_core(b, &pb, &nb);
    return na == nb && memcmp(pa, pb, na) == 0;
}

int fr_ocache_drop_stale(fr_ocache *c, const char *url, const char *version, int64_t size)
{
    unsigned stripe = fr_ocache_stripe(c, url);
    int rc = fr_ocache_lock(c, stripe);
    if (rc < 0)
        return rc;
    entry_path(c, url, ".meta", c->scratch);
    int fd = open(c->scratch, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = errno == ENOENT ? 0 : -errno;
        fr_ocache_unlock(c, stripe);
        return rc;
    }
    meta_hdr h;
    int stale = read_meta(c, fd, &h) == 0 && same_key(c, c->url_buf, url) &&
                ((size >= 0 && h.size != (uint64_t)size) ||
                 (version && version[0] && h.etag[0] && !same_etag(h.etag, version)));
    close(fd);
    rc = 0;
    if (stale) {
        /* The record first: without it the data is no entry (an orphan
         * eviction removes, should the second unlink fail). */
        if (unlink(c->scratch) != 0 && errno != ENOENT) {
            rc = -errno;
        } else {
            entry_path(c, url, ".data", c->scratch);
            (void)unlink(c->scratch);
            add_counter(c, -(int64_t)h.size);
            fr_ocache_forget(c, url);
            rc = 1;
        }
    }
    fr_ocache_unlock(c, stripe);
    return rc;
}

static uint32_t checksum(const void *bytes, uint64_t len)
{
    /* crc32_z takes a size_t length: one call for any size. */
    return (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)bytes, (z_size_t)len);
}

int fr_ocache_verify(const fr_ocache_entry *e, const void *bytes, uint64_t len)
{
    return len == e->size && checksum(bytes, len) == e->crc;
}

/* ------------------------------------------------------------- publish */

/* Writes all of buf to a fresh (truncated) `path`; at most `limit` bytes
 * (the test hook's stop). 0, or -errno (-EINTR: stopped at limit). */
static int write_file(const char *path, const void *buf, uint64_t len, uint64_t limit)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    const char *p = buf;
    uint64_t todo = len < limit ? len : limit;
    int rc = 0;
    while (todo > 0) {
        ssize_t w = write(fd, p, todo > (1u << 30) ? (1u << 30) : (size_t)todo);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        p += w;
        todo -= (uint64_t)w;
    }
    if (close(fd) != 0 && rc == 0)
        rc = -errno; /* e.g. a deferred ENOSPC or EIO of a network file system */
    if (rc == 0 && limit < len)
        rc = -EINTR;
    return rc;
}

static int publish(fr_ocache *c, const char *url, const void *bytes, uint64_t len,
                   const char *etag, uint64_t stop_after)
{
    size_t url_len = strlen(url), key_len = c->scope_len + url_len;
    if (key_len > URL_MAX)
        return -ENAMETOOLONG;
    size_t pmax = fr_ocache_path_max(c);
    char *tmp = malloc(4 * pmax);
    if (!tmp)
        return -ENOMEM;
    char *data = tmp + pmax, *meta_tmp = tmp + 2 * pmax, *meta = tmp + 3 * pmax;
    entry_path(c, url, ".data.tmp", tmp);
    entry_path(c, url, ".data", data);
    entry_path(c, url, ".meta.tmp", meta_tmp);
    entry_path(c, url, ".meta", meta);
    /* The folder: "DIR/XX" is the data path up to its last '/'. */
    snprintf(c->scratch, pmax, "%.*s", (int)(strrchr(data, '/') - data), data);
    int rc = mkdir_ok(c->scratch);
    struct stat old;
    uint64_t old_size = stat(data, &old) == 0 && S_ISREG(old.st_mode) ? (uint64_t)old.st_size : 0;
    if (rc == 0)
        rc = write_file(tmp, bytes, len, stop_after);
    if (rc == -EINTR) { /* the test hook: leave the temporary as a killed writer would */
        free(tmp);
        return rc;
    }
    char *rec = NULL;
    uint32_t crc = 0;
    if (rc == 0) {
        meta_hdr h;
        memset(&h, 0, sizeof(h));
        memcpy(h.magic, META_MAGIC, 8);
        h.size = len;
        h.stamp = now_realtime_ns();
        h.crc = crc = checksum(bytes, len);
        h.url_len = (uint32_t)key_len;
        if (etag)
            snprintf(h.etag, sizeof(h.etag), "%s", etag);
        rec = malloc(sizeof(h) + key_len);
        if (!rec)
            rc = -ENOMEM;
        else {
            memcpy(rec, &h, sizeof(h));
            memcpy(rec + sizeof(h), c->scope, c->scope_len);
            memcpy(rec + sizeof(h) + c->scope_len, url, url_len);
            rc = write_file(meta_tmp, rec, sizeof(h) + key_len, UINT64_MAX);
        }
    }
    /* The data first, then the record that commits it (object_cache.h). */
    if (rc == 0 && rename(tmp, data) != 0)
        rc = -errno;
    if (rc == 0 && rename(meta_tmp, meta) != 0) {
        rc = -errno;
        (void)unlink(data); /* no record: its space would be an orphan's */
    }
    if (rc != 0) {
        (void)unlink(tmp); /* either may not exist: nothing more to do */
        (void)unlink(meta_tmp);
    } else {
        add_counter(c, (int64_t)len - (int64_t)old_size);
        /* Its checksum was made from these bytes: this fr_ocache need not
         * check them again. */
        fr_ocache_entry e = {len, crc, 1};
        fr_ocache_trust(c, url, &e);
    }
    free(rec);
    free(tmp);
    return rc;
}

int fr_ocache_publish(fr_ocache *c, const char *url, const void *bytes, uint64_t len,
                      const char *etag)
{
    return publish(c, url, bytes, len, etag, UINT64_MAX);
}

int fr_ocache_publish_partial(fr_ocache *c, const char *url, const void *bytes, uint64_t len,
                              uint64_t stop_after)
{
    return publish(c, url, bytes, len, NULL, stop_after);
}

/* ------------------------------------------------------------ eviction */

typedef struct scan_item {
    uint64_t stamp, size;
    unsigned stripe;
    char name[FR_OCACHE_ID_LEN + 4]; /* "XX/ID" and its NUL */
} scan_item;

static int by_stamp(const void *a, const void *b)
{
    const scan_item *x = a, *y = b;
    return x->stamp < y->stamp ? -1 : x->stamp > y->stamp;
}

static int is_hex_id(const char *s)
{
    for (int i = 0; i < FR_OCACHE_ID_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* The stripe of an ID: fr_ocache_stripe's, from the ID's second hash. */
static unsigned id_stripe(const char *id)
{
    return (unsigned)(strtoull(id + 16, NULL, 16) % FR_OCACHE_STRIPES);
}

/* Removes `path` if nobody holds `stripe` (the writer's lock). */
static void remove_orphan(fr_ocache *c, unsigned stripe, const char *path)
{
    if (fr_ocache_trylock(c, stripe) != 1)
        return;
    (void)unlink(path); /* gone meanwhile: nothing to do */
    fr_ocache_unlock(c, stripe);
}

/* Scans folder XX: its records into *items, its orphans removed; the
 * bytes of everything kept added to *total. */
static int scan_folder(fr_ocache *c, const char *sub, scan_item **items, size_t *n, size_t *cap,
                       uint64_t *total)
{
    size_t pmax = fr_ocache_path_max(c);
    char *path = malloc(2 * pmax);
    if (!path)
        return -ENOMEM;
    char *other = path + pmax;
    snprintf(path, pmax, "%s/%s", c->dir, sub);
    DIR *d = opendir(path);
    if (!d) {
        free(path);
        return errno == ENOENT ? 0 : -errno;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        if (strlen(nm) < FR_OCACHE_ID_LEN + 5 || !is_hex_id(nm))
            continue;
        const char *suffix = nm + FR_OCACHE_ID_LEN;
        unsigned stripe = id_stripe(nm);
        snprintf(path, pmax, "%s/%s/%s", c->dir, sub, nm);
        if (strcmp(suffix, ".data.tmp") == 0 || strcmp(suffix, ".meta.tmp") == 0) {
            remove_orphan(c, stripe, path); /* left by a writer that died */
            continue;
        }
        struct stat st;
        if (strcmp(suffix, ".data") == 0) {
            /* Data without a record: its writer died between the renames. */
            snprintf(other, pmax, "%s/%s/%.*s.meta", c->dir, sub, FR_OCACHE_ID_LEN, nm);
            if (access(other, F_OK) != 0 && errno == ENOENT)
                remove_orphan(c, stripe, path);
            else if (stat(path, &st) == 0)
                *total += (uint64_t)st.st_size;
            continue;
        }
        if (strcmp(suffix, ".meta") != 0)
            continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* evicted by another process meanwhile */
        meta_hdr h;
        int good = read_meta(c, fd, &h) == 0;
        close(fd);
        if (!good) {
            remove_orphan(c, stripe, path); /* a damaged record: the entry is a miss anyway */
            continue;
        }
        if (*n == *cap) {
            size_t ncap = *cap ? 2 * *cap : 1024;
            scan_item *grown = realloc(*items, ncap * sizeof(**items));
            if (!grown) {
                rc = -ENOMEM;
                break;
            }
            *items = grown;
            *cap = ncap;
        }
        scan_item *it = &(*items)[(*n)++];
        it->stamp = h.stamp;
        it->size = h.size;
        it->stripe = stripe;
        snprintf(it->name, sizeof(it->name), "%s/%.*s", sub, FR_OCACHE_ID_LEN, nm);
    }
    closedir(d);
    free(path);
    return rc;
}

long fr_ocache_evict(fr_ocache *c)
{
    /* One evictor at a time, and no counting while it recounts: the
     * counter's lock for the whole scan (coarse, rare). */
    int got = range_lock(c, 0, 8, F_WRLCK, 1);
    if (got != 1)
        return got;
    scan_item *items = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    long rc = 0;
    for (unsigned x = 0; x < 256 && rc == 0; x++) {
        char sub[3];
        snprintf(sub, sizeof(sub), "%02x", x);
        rc = scan_folder(c, sub, &items, &n, &cap, &total);
    }
    if (rc == 0) {
        if (n > 1)
            qsort(items, n, sizeof(*items), by_stamp);
        uint64_t target = c->max_bytes / 100 * FR_OCACHE_EVICT_TO_PCT;
        size_t pmax = fr_ocache_path_max(c);
        long evicted = 0;
        for (size_t i = 0; i < n && c->max_bytes && total > target; i++) {
            if (fr_ocache_trylock(c, items[i].stripe) != 1)
                continue; /* being rewritten: newer than its stamp */
            /* The record first: from then on a lookup misses, and a reader
             * that had the data open keeps its bytes (unlink). */
            snprintf(c->scratch, pmax, "%s/%s.meta", c->dir, items[i].name);
            int gone = unlink(c->scratch) == 0;
            snprintf(c->scratch, pmax, "%s/%s.data", c->dir, items[i].name);
            if (gone && unlink(c->scratch) == 0) {
                total -= items[i].size < total ? items[i].size : total;
                evicted++;
            }
            fr_ocache_unlock(c, items[i].stripe);
        }
        write_counter(c, total);
        rc = evicted;
    }
    (void)range_lock(c, 0, 8, F_UNLCK, 0);
    free(items);
    return rc;
}

long fr_cache_drop_stale(const char *dir, const char *scope, const char *const *urls,
                         const char *const *versions, const int64_t *sizes, size_t n, char *err,
                         size_t err_len)
{
    fr_ocache *c;
    int rc = fr_ocache_open(dir, 0, scope, &c, err, err_len);
    if (rc)
        return rc;
    long dropped = 0;
    for (size_t i = 0; i < n; i++) {
        rc = fr_ocache_drop_stale(c, urls[i], versions ? versions[i] : NULL,
                                  sizes ? sizes[i] : -1);
        if (rc < 0) {
            fr_set_err(err, err_len, "cache_dir %s: the entry of %s: %s", dir, urls[i],
                       strerror(-rc));
            fr_ocache_close(c);
            return rc;
        }
        dropped += rc;
    }
    fr_ocache_close(c);
    return dropped;
}
