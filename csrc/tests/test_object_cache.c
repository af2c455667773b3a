/* The object cache alone (core/object_cache.c), without a server:
 *  - entry naming: IDs are 32 hex digits, one per URL, under their folder;
 *  - atomic publish: an entry is found only once whole, with its size and
 *    checksum, no temporary left; a size the caller expects that differs
 *    is a stale entry; replacing an entry keeps the byte count right;
 *  - damaged entries: other bytes of the same size fail the checksum, a
 *    truncated data file or a broken record is no entry;
 *  - LRU eviction within max_bytes, down to 90%, the least recently used
 *    first (a lookup renews an entry);
 *  - processes racing on the same objects (fork) fetch each exactly once,
 *    following the protocol of ctx.c's cached_read: try the lock, look up
 *    again once it is taken, wait in stripe order for the rest;
 *  - a writer killed (SIGKILL) mid-write leaves no entry, its lock is free,
 *    and its temporary file is removed by the next eviction scan, as is
 *    data left without a record. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "core/base.h"
#include "core/object_cache.h"

static char dir_buf[1024];

static const char *cache_dir(const char *name)
{
    snprintf(dir_buf, sizeof(dir_buf), "%s/%s", fr_test_dir(), name);
    return dir_buf;
}

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
}

/* The whole file at path into a fresh buffer (*len bytes), or NULL. */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    return buf;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* A lookup as another process would make it: by a fresh fr_ocache, which
 * remembers no entry (fr_ocache_trust) and so reads the record. */
static int lookup_fresh(const char *dir, const char *url, int64_t want, fr_ocache_entry *e)
{
    fr_ocache *f;
    if (fr_ocache_open(dir, 0, NULL, &f, NULL, 0) != 0)
        return -1;
    int r = fr_ocache_lookup(f, url, want, e);
    fr_ocache_close(f);
    return r;
}

/* The entry's file with `suffix` instead of ".data". */
static void sibling(const char *data, const char *suffix, char *out, size_t len)
{
    snprintf(out, len, "%.*s%s", (int)(strlen(data) - 5), data, suffix);
}

static void check_naming(void)
{
    fr_ocache *c;
    char err[FR_ERRLEN];
    CHECK(fr_ocache_open(cache_dir("naming/"), 0, NULL, &c, err, sizeof(err)) == 0);
    char a[FR_OCACHE_ID_LEN + 1], b[FR_OCACHE_ID_LEN + 1], a2[FR_OCACHE_ID_LEN + 1];
    fr_ocache_id(c, "s3://bucket/key", a);
    fr_ocache_id(c, "s3://bucket/key", a2);
    fr_ocache_id(c, "s3://bucket/kez", b);
    CHECK(strlen(a) == FR_OCACHE_ID_LEN && strspn(a, "0123456789abcdef") == FR_OCACHE_ID_LEN);
    CHECK(strcmp(a, a2) == 0 && strcmp(a, b) != 0);
    /* Bucket and key both count: the same key in another bucket differs. */
    fr_ocache_id(c, "s3://bucket2/key", b);
    CHECK(strcmp(a, b) != 0);
    char path[2048], want[2048];
    fr_ocache_data_path(c, "s3://bucket/key", path);
    /* The trailing '/' of the directory is not doubled. */
    snprintf(want, sizeof(want), "%s/naming/%.2s/%s.data", fr_test_dir(), a, a);
    CHECK(strcmp(path, want) == 0);
    CHECK(strlen(path) + 5 == fr_ocache_path_max(c)); /* room for ".tmp" and the NUL */
    CHECK(fr_ocache_stripe(c, "s3://bucket/key") < FR_OCACHE_STRIPES);
    CHECK(fr_ocache_stripe(c, "s3://bucket/key") == (unsigned)(strtoull(a + 16, NULL, 16) % FR_OCACHE_STRIPES));
    fr_ocache_close(c);
    CHECK(fr_ocache_open("", 0, NULL, &c, err, sizeof(err)) == -EINVAL && strstr(err, "cache_dir"));
}

static void check_publish_and_damage(void)
{
    fr_ocache *c;
    char err[FR_ERRLEN];
    CHECK(fr_ocache_open(cache_dir("pub"), 0, NULL, &c, err, sizeof(err)) == 0);
    const char *url = "s3://b/dir/object.bin";
    enum { LEN = 10000 };
    unsigned char buf[LEN];
    fill(buf, LEN, 1);
    fr_ocache_entry e;
    CHECK(fr_ocache_lookup(c, url, -1, &e) == 0);
    CHECK(fr_ocache_trylock(c, fr_ocache_stripe(c, url)) == 1);
    CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    fr_ocache_unlock(c, fr_ocache_stripe(c, url));
    /* The writer trusts what it wrote: found with no record read. */
    CHECK(fr_ocache_lookup(c, url, -1, &e) == 1 && e.size == LEN && e.trusted);
    const char *dir = cache_dir("pub");
    CHECK(lookup_fresh(dir, url, -1, &e) == 1 && e.size == LEN && !e.trusted);
    CHECK(lookup_fresh(dir, url, LEN, &e) == 1);
    CHECK(lookup_fresh(dir, url, LEN + 1, &e) == 0); /* a changed size: stale */
    CHECK(fr_ocache_lookup(c, url, LEN + 1, &e) == 0);
    /* A size the caller does not expect leaves the version remembered. */
    CHECK(fr_ocache_lookup(c, url, LEN, &e) == 1 && e.trusted);
    /* Trust is by version: forgotten, then found by its record, the
     * version remembered is no longer trusted without a check. */
    fr_ocache_forget(c, url);
    CHECK(fr_ocache_lookup(c, url, LEN, &e) == 1 && !e.trusted);
    fr_ocache_trust(c, url, &e);
    CHECK(fr_ocache_lookup(c, url, LEN, &e) == 1 && e.trusted);
    CHECK(fr_ocache_lookup(c, "s3://b/dir/other", -1, &e) == 0);
    CHECK(fr_ocache_usage(c) == LEN);

    char data[2048], tmp[2048], meta[2048];
    fr_ocache_data_path(c, url, data);
    sibling(data, ".data.tmp", tmp, sizeof(tmp));
    CHECK(!exists(tmp));
    sibling(data, ".meta.tmp", tmp, sizeof(tmp));
    CHECK(!exists(tmp));
    sibling(data, ".meta", meta, sizeof(meta));
    size_t got = 0;
    unsigned char *back = slurp(data, &got);
    CHECK(back && got == LEN && memcmp(back, buf, LEN) == 0);
    CHECK(back && fr_ocache_verify(&e, back, got));
    CHECK(back && !fr_ocache_verify(&e, back, got - 1));
    free(back);

    /* Replaced by a smaller version: the count follows. */
    CHECK(fr_ocache_publish(c, url, buf, LEN / 2, "\"etag\"") == 0);
    CHECK(lookup_fresh(dir, url, -1, &e) == 1 && e.size == LEN / 2);
    CHECK(fr_ocache_usage(c) == LEN / 2);

    /* Other bytes of the same size: found by size, refused by checksum. */
    unsigned char other[LEN / 2];
    fill(other, sizeof(other), 2);
    FILE *f = fopen(data, "r+b");
    CHECK(f && fwrite(other, 1, sizeof(other), f) == sizeof(other));
    if (f)
        fclose(f);
    CHECK(lookup_fresh(dir, url, -1, &e) == 1 && !e.trusted);
    back = slurp(data, &got);
    CHECK(back && got == LEN / 2 && !fr_ocache_verify(&e, back, got));
    free(back);
    /* Truncated: no entry. */
    CHECK(truncate(data, 100) == 0);
    CHECK(lookup_fresh(dir, url, -1, &e) == 0);
    /* A broken record: no entry, even with the right data. */
    CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    CHECK(lookup_fresh(dir, url, -1, &e) == 1);
    f = fopen(meta, "r+b");
    CHECK(f && fwrite("XXXX", 1, 4, f) == 4);
    if (f)
        fclose(f);
    CHECK(lookup_fresh(dir, url, -1, &e) == 0);
    /* A record cut short (its URL half gone): no entry. */
    CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    struct stat st;
    CHECK(stat(meta, &st) == 0 && truncate(meta, st.st_size - 4) == 0);
    CHECK(lookup_fresh(dir, url, -1, &e) == 0);
    /* An empty object is an entry like any other. */
    CHECK(fr_ocache_publish(c, "s3://b/empty", buf, 0, NULL) == 0);
    CHECK(lookup_fresh(dir, "s3://b/empty", 0, &e) == 1 && e.size == 0 &&
          fr_ocache_verify(&e, buf, 0));
    fr_ocache_close(c);
}

static void url_of(char *out, size_t len, int i)
{
    snprintf(out, len, "s3://bucket/train/%05d.jpg", i);
}

static void check_lru(void)
{
    fr_ocache *c;
    char err[FR_ERRLEN];
    enum { LEN = 1000, N = 10 };
    CHECK(fr_ocache_open(cache_dir("lru"), N * LEN, NULL, &c, err, sizeof(err)) == 0);
    unsigned char buf[LEN];
    char url[64];
    for (int i = 0; i < N; i++) {
        fill(buf, LEN, (unsigned)i);
        url_of(url, sizeof(url), i);
        CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    }
    CHECK(fr_ocache_usage(c) == N * LEN && !fr_ocache_over(c));
    /* A lookup renews a stamp only when it is a second old. */
    struct timespec pause = {1, 100000000};
    nanosleep(&pause, NULL);
    fr_ocache_entry e;
    url_of(url, sizeof(url), 0);
    /* Another reader's lookup renews the stamp (the writer's own would not
     * read the record within FR_OCACHE_RECHECK_NS). */
    CHECK(lookup_fresh(cache_dir("lru"), url, LEN, &e) == 1); /* 0 is now the most recent */
    url_of(url, sizeof(url), N);
    CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    CHECK(fr_ocache_over(c));
    /* 11000 bytes, at most 9000 after: the two least recent go, 1 and 2. */
    CHECK(fr_ocache_evict(c) == 2);
    CHECK(fr_ocache_usage(c) == (N - 1) * LEN && !fr_ocache_over(c));
    for (int i = 0; i <= N; i++) {
        url_of(url, sizeof(url), i);
        /* Files only: a lookup would renew the stamps checked below. */
        char data[2048], meta[2048];
        fr_ocache_data_path(c, url, data);
        sibling(data, ".meta", meta, sizeof(meta));
        CHECK(exists(data) == (i != 1 && i != 2) && exists(meta) == (i != 1 && i != 2));
    }
    /* An entry being written (its lock held by another fr_ocache) is
     * skipped, however old. */
    fr_ocache *other;
    CHECK(fr_ocache_open(cache_dir("lru"), N * LEN, NULL, &other, err, sizeof(err)) == 0);
    url_of(url, sizeof(url), 3); /* now the least recent */
    CHECK(fr_ocache_trylock(other, fr_ocache_stripe(other, url)) == 1);
    CHECK(fr_ocache_trylock(c, fr_ocache_stripe(c, url)) == 0);
    for (int i = N + 1; i < N + 3; i++) {
        url_of(url, sizeof(url), i);
        CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    }
    CHECK(fr_ocache_evict(c) == 2);
    url_of(url, sizeof(url), 3);
    CHECK(lookup_fresh(cache_dir("lru"), url, LEN, &e) == 1);
    url_of(url, sizeof(url), 4);
    CHECK(lookup_fresh(cache_dir("lru"), url, LEN, &e) == 0);
    fr_ocache_close(other); /* drops its lock */
    url_of(url, sizeof(url), 3);
    CHECK(fr_ocache_trylock(c, fr_ocache_stripe(c, url)) == 1);
    fr_ocache_unlock(c, fr_ocache_stripe(c, url));
    fr_ocache_close(c);
}

/* The count of "fetches" each process made, one byte per object appended
 * to `log` (O_APPEND: whole writes from several processes). */
static void log_fetch(const char *log, int i)
{
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    unsigned char b = (unsigned char)i;
    if (fd < 0 || write(fd, &b, 1) != 1)
        _exit(3);
    close(fd);
}

/* One racing process: reads objects 0..n-1 in an order of its own,
 * following cached_read's protocol; exit status 0 if every object it
 * ended with has the right bytes. */
static int racer(const char *dir, const char *log, int n, unsigned seed)
{
    fr_ocache *c;
    char err[FR_ERRLEN];
    if (fr_ocache_open(dir, 0, NULL, &c, err, sizeof(err)) != 0)
        return 4;
    enum { LEN = 4096 };
    unsigned char want[LEN], got[LEN];
    int order[64];
    for (int i = 0; i < n; i++)
        order[i] = i;
    uint64_t s = seed;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(fr_splitmix64(&s) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int bad = 0;
    for (int k = 0; k < n; k++) {
        int i = order[k];
        char url[64], data[2048];
        url_of(url, sizeof(url), i);
        fill(want, LEN, (unsigned)i);
        fr_ocache_entry e;
        if (!fr_ocache_lookup(c, url, LEN, &e)) {
            unsigned st = fr_ocache_stripe(c, url);
            int r = fr_ocache_trylock(c, st);
            if (r == 0)
                r = fr_ocache_lock(c, st) == 1 ? 2 : -1;
            if (r < 0)
                return 5;
            if (!fr_ocache_lookup(c, url, LEN, &e)) {
                log_fetch(log, i);
                struct timespec slow = {0, 20000000}; /* a fetch takes time */
                nanosleep(&slow, NULL);
                if (fr_ocache_publish(c, url, want, LEN, NULL) != 0)
                    return 6;
                if (!fr_ocache_lookup(c, url, LEN, &e))
                    return 7;
            }
            fr_ocache_unlock(c, st);
        }
        fr_ocache_data_path(c, url, data);
        int fd = open(data, O_RDONLY);
        if (fd < 0 || read(fd, got, LEN) != LEN || !fr_ocache_verify(&e, got, LEN) ||
            memcmp(got, want, LEN) != 0)
            bad++;
        if (fd >= 0)
            close(fd);
    }
    fr_ocache_close(c);
    return bad ? 8 : 0;
}

static void check_race(void)
{
    enum { PROCS = 4, N = 24 };
    char dir[1024], log[1100];
    snprintf(dir, sizeof(dir), "%s", cache_dir("race"));
    snprintf(log, sizeof(log), "%s/../race.log", dir);
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0)
            _exit(racer(dir, log, N, 1000u + (unsigned)p));
    }
    for (int p = 0; p < PROCS; p++) {
        int status = 0;
        CHECK(pids[p] > 0 && waitpid(pids[p], &status, 0) == pids[p]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    size_t len = 0;
    unsigned char *fetched = slurp(log, &len);
    CHECK(fetched && len == N); /* each object once, whoever fetched it */
    int seen[N] = {0};
    for (size_t k = 0; fetched && k < len; k++)
        if (fetched[k] < N)
            seen[fetched[k]]++;
    for (int i = 0; i < N; i++)
        CHECK(seen[i] == 1);
    free(fetched);
}

static void check_killed_writer(void)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", cache_dir("killed"));
    const char *url = "s3://bucket/big.bin";
    enum { LEN = 1 << 20 };
    unsigned char *buf = malloc(LEN);
    CHECK(buf != NULL);
    if (!buf)
        return;
    fill(buf, LEN, 9);
    fr_ocache *c;
    char err[FR_ERRLEN];
    CHECK(fr_ocache_open(dir, 0, NULL, &c, err, sizeof(err)) == 0);
    char data[2048], tmp[2048];
    fr_ocache_data_path(c, url, data);
    sibling(data, ".data.tmp", tmp, sizeof(tmp));
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* Never outlive a parent whose check failed before its kill. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1)
            _exit(5);
        fr_ocache *w;
        if (fr_ocache_open(dir, 0, NULL, &w, NULL, 0) != 0 || fr_ocache_trylock(w, fr_ocache_stripe(w, url)) != 1)
            _exit(2);
        /* Half the object written, then stopped as if killed there. */
        if (fr_ocache_publish_partial(w, url, buf, LEN, LEN / 2) != -EINTR)
            _exit(3);
        if (write(ready[1], "x", 1) != 1)
            _exit(4);
        for (;;)
            pause(); /* killed here, holding the lock */
    }
    char x;
    CHECK(read(ready[0], &x, 1) == 1);
    fr_ocache_entry e;
    CHECK(fr_ocache_trylock(c, fr_ocache_stripe(c, url)) == 0); /* the writer holds it */
    CHECK(fr_ocache_lookup(c, url, -1, &e) == 0);
    CHECK(exists(tmp));
    /* The scan leaves a temporary whose writer is alive. */
    CHECK(fr_ocache_evict(c) == 0 && exists(tmp));
    CHECK(kill(pid, SIGKILL) == 0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
    close(ready[0]);
    close(ready[1]);
    /* Dead: no entry, its lock free, its temporary removed by the scan. */
    CHECK(fr_ocache_lookup(c, url, -1, &e) == 0 && !exists(data));
    CHECK(fr_ocache_trylock(c, fr_ocache_stripe(c, url)) == 1);
    fr_ocache_unlock(c, fr_ocache_stripe(c, url));
    CHECK(fr_ocache_evict(c) == 0 && !exists(tmp));
    /* Fetched again: whole. */
    CHECK(fr_ocache_publish(c, url, buf, LEN, NULL) == 0);
    CHECK(lookup_fresh(dir, url, LEN, &e) == 1);
    size_t got = 0;
    unsigned char *back = slurp(data, &got);
    CHECK(back && got == LEN && fr_ocache_verify(&e, back, got) && memcmp(back, buf, LEN) == 0);
    free(back);
    /* Killed between its two renames: data without a record, no entry,
     * removed by the scan. */
    char meta[2048];
    sibling(data, ".meta", meta, sizeof(meta));
    CHECK(unlink(meta) == 0);
    CHECK(lookup_fresh(dir, url, -1, &e) == 0);
    CHECK(fr_ocache_evict(c) == 0 && !exists(data));
    CHECK(fr_ocache_usage(c) == 0);
    fr_ocache_close(c);
    free(buf);
}

/* Entries of one scope (an S3 endpoint and credentials) are another
 * scope's misses, even in one directory; scope "" and NULL are one. */
static void check_scopes(void)
{
    char err[FR_ERRLEN];
    const char *dir = cache_dir("scopes");
    fr_ocache *a, *b, *none;
    CHECK(fr_ocache_open(dir, 0, "http://h:1 key:1", &a, err, sizeof(err)) == 0);
    CHECK(fr_ocache_open(dir, 0, "http://h:2 key:1", &b, err, sizeof(err)) == 0);
    CHECK(fr_ocache_open(dir, 0, "", &none, err, sizeof(err)) == 0);
    if (!a || !b || !none)
        return;
    const char *url = "s3://b/k";
    char ia[FR_OCACHE_ID_LEN + 1], ib[FR_OCACHE_ID_LEN + 1], in[FR_OCACHE_ID_LEN + 1];
    fr_ocache_id(a, url, ia);
    fr_ocache_id(b, url, ib);
    fr_ocache_id(none, url, in);
    CHECK(strcmp(ia, ib) != 0 && strcmp(ia, in) != 0 && strcmp(ib, in) != 0);
    unsigned char buf[100];
    fill(buf, sizeof(buf), 9);
    fr_ocache_entry e;
    CHECK(fr_ocache_publish(a, url, buf, sizeof(buf), "\"v1\"") == 0);
    CHECK(fr_ocache_lookup(a, url, -1, &e) == 1 && e.size == sizeof(buf));
    CHECK(fr_ocache_lookup(b, url, -1, &e) == 0);
    CHECK(fr_ocache_lookup(none, url, -1, &e) == 0);
    CHECK(lookup_fresh(dir, url, -1, &e) == 0); /* NULL scope: none's */
    /* A record of scope a whose key is asked in scope b: a miss though its
     * file is where b would look (a hash collision, forced). */
    char pa[2048], pb[2048];
    fr_ocache_data_path(a, url, pa);
    fr_ocache_data_path(b, url, pb);
    char ma[2048], mb[2048];
    sibling(pa, ".meta", ma, sizeof(ma));
    sibling(pb, ".meta", mb, sizeof(mb));
    char folder[2048];
    snprintf(folder, sizeof(folder), "%.*s", (int)(strrchr(pb, '/') - pb), pb);
    CHECK(mkdir(folder, 0755) == 0 || errno == EEXIST);
    CHECK(link(pa, pb) == 0 && link(ma, mb) == 0);
    CHECK(fr_ocache_lookup(b, url, -1, &e) == 0);
    /* Scopes are one line each. */
    fr_ocache *bad = NULL;
    CHECK(fr_ocache_open(dir, 0, "a\nb", &bad, err, sizeof(err)) == -EINVAL && !bad &&
          strstr(err, "scope"));
    fr_ocache_close(a);
    fr_ocache_close(b);
    fr_ocache_close(none);
}

int main(void)
{
    check_naming();
    check_scopes();
    check_publish_and_damage();
    check_lru();
    check_race();
    check_killed_writer();
    return fr_test_finish("test_object_cache");
}
