/*
 * s3: objects of S3 (or an S3-compatible server) read over HTTP with
 * libcurl's multi interface, many requests in flight on one thread.
 *
 * A context owns one multi handle and `inflight` easy handles, kept from
 * call to call so their connections (HTTP/1.1 keep-alive, the multi
 * handle's connection cache) and TLS sessions are reused. A call is a list
 * of jobs, each one GET, run by run_jobs: up to `inflight` at once, each
 * retried on 5xx answers, resets and timeouts with jittered exponential
 * backoff, within `retries` attempts and `deadline_ms`.
 *
 * read_files, sizes unknown (the first read of a list): a "probe" GET per
 * object for its first min(part_size, PROBE_MAX) bytes into a buffer of the
 * size the response announces, which also gives the object's size
 * (Content-Range); then the batch is laid out once (fr_layout), the probed
 * bytes copied into place and the rest of each large object fetched by
 * ranged GETs of part_size straight into the arena (If-Match the probe's
 * ETag, so a part of another version of the object is refused).
 * read_files, sizes known (size hints, or sizes the context remembered:
 * uses_size_hints): laid out first, those objects read by ranged GETs
 * straight into the arena; the objects of unknown size, and any whose size
 * changed, are then read as above into room at the end of the arena (a
 * wrong hint costs time, never bytes).
 * read_ranges: one ranged GET per part_size of each range, into the arena.
 *
 * Every response is checked against what was asked: the status, the
 * Content-Range (first, last and total bytes) and the body's length; a
 * short body or another range is an error of that sample, never short
 * data. Errors travel per sample as -errno, with a message naming the URL
 * and the HTTP status and S3 error code (fr_ctx_sample_error).
 *
 * Thread safety: as its context (fastread.h), one thread at a time; no
 * handle, buffer or counter is shared with another context. The one
 * process-wide call, curl_global_init, is reference counted and
 * thread-safe in the libcurl versions the probe accepts.
 */
/* clock_gettime, nanosleep, strncasecmp: POSIX, which -std=c11 hides. */
#define _POSIX_C_SOURCE 200809L
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engines/engine.h"
#include "engines/io_common.h"
#include "engines/range_io.h"
#include "engines/s3/s3_config.h"
#include "engines/s3/s3_http.h"

/* The most a probe asks for: its bytes wait in a buffer until the batch is
 * laid out, so a batch of large objects holds at most this much of each
 * besides the arena (objects up to this size are read by the probe alone). */
#define PROBE_MAX ((uint64_t)1 << 20)
/* Per-sample messages kept per call: enough to explain any batch's first
 * failures; past it errors keep their errno only. */
#define MAX_NOTES 4096

enum job_kind {
    JOB_PROBE, /* size unknown: bytes [0, len) into the sample's buffer, learning the size */
    JOB_PART,  /* size known: bytes [start, start + len) of the object into the arena;
                * len 0: the whole object, which must be empty (no Range) */
    JOB_RANGE, /* read_ranges: bytes [start, start + len) of the object into the arena */
};

typedef struct s3_job {
    size_t sample;
    uint64_t start, len;
    uint64_t dst_off; /* where in the sample's slot the bytes go */
    int kind;
    unsigned attempts;
    long long first_ms;      /* the first attempt's start: the deadline counts from it */
    long long not_before_ms; /* a retry's backoff */
    /* The server's last answer to an attempt that was retried (503
     * SlowDown) and its S3 code: the sample's error should a later attempt
     * get none (out of time), so that throttling does not read as a timeout. */
    long last_status;
    char last_code[32];
} s3_job;

typedef struct s3_sample {
    const char *url;  /* the caller's s3:// URL, for messages */
    size_t http_off;  /* its http(s) URL in s3_engine.urls */
    int64_t size;     /* the object's size; -1 unknown */
    int err;          /* -errno, the sample's first failure */
    int repair;       /* its known size proved wrong: read it again */
    uint8_t *buf;     /* a probe's bytes until laid out */
    uint64_t buf_len, buf_cap;
    char etag[128];
} s3_sample;

typedef struct s3_xfer {
    CURL *easy;
    struct s3_engine *s;
    struct curl_slist *headers;
    fr_s3_resp_headers resp;
    size_t job;
    uint8_t *dst; /* NULL for a probe (its sample's buffer) */
    uint64_t cap, got;
    int overflow; /* the body went past what was asked: the transfer was stopped */
    int busy;     /* added to the multi handle */
    char errbody[1024];
    size_t errlen;
    char errbuf[CURL_ERROR_SIZE];
} s3_xfer;

typedef struct s3_note {
    size_t sample;
    char msg[FR_ERRLEN];
} s3_note;

typedef struct s3_engine {
    fr_s3_config cfg;
    CURLM *multi;
    s3_xfer *xfers;
    size_t nxfers;
    size_t *idle; /* indices of xfers not in flight */
    size_t nidle;
    uint64_t rng; /* backoff jitter: per context, no global state */

    /* The call in progress. */
    fr_batch *batch;
    size_t n;
    s3_sample *samples;
    size_t samples_cap;
    int64_t *sizes;
    size_t *list;
    s3_job *jobs;
    size_t njobs, jobs_cap, next_job, jobs_done;
    size_t *retry; /* jobs waiting for their backoff */
    size_t nretry;
    char *urls;
    size_t urls_len, urls_cap;
    size_t active;
    int strict; /* a size mismatch is an error (the object changed), not a repair */
    s3_note *notes;
    size_t nnotes, notes_cap;

    long requests, retries, repairs, inflight_max, connections;
    long long bytes;
    /* Memory the engine holds beyond the caller's arenas: the probes'
     * buffers now and at most (their bound: a call's samples times
     * min(part_size, PROBE_MAX), KEEP_PROBES between calls), and per
     * transfer its struct and libcurl's receive buffer (BUFFERSIZE in
     * s3_http.c). Reported as s3_buffer_bytes and s3_buffer_bytes_max. */
    uint64_t probe_bytes, probe_bytes_max;

    /* Set by s3_cancel from any thread; read by run_jobs. */
    atomic_int cancelled;
} s3_engine;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void note(s3_engine *s, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Keeps a message for sample i (the call's first one for it). */
static void note(s3_engine *s, size_t i, const char *fmt, ...)
{
    if (s->nnotes >= MAX_NOTES)
        return;
    if (s->nnotes == s->notes_cap) {
        size_t cap = s->notes_cap ? 2 * s->notes_cap : 16;
        s3_note *p = realloc(s->notes, cap * sizeof(*p));
        if (!p)
            return; /* the errno still says what failed */
        s->notes = p;
        s->notes_cap = cap;
    }
    s3_note *nt = &s->notes[s->nnotes++];
    nt->sample = i;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nt->msg, sizeof(nt->msg), fmt, ap);
    va_end(ap);
}

/* Sample i failed (the first failure stands); `fmt` says why after its URL. */
static void fail_sample(s3_engine *s, size_t i, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail_sample(s3_engine *s, size_t i, int err, const char *fmt, ...)
{
    s3_sample *sm = &s->samples[i];
    if (sm->err)
        return;
    sm->err = err;
    char why[FR_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    note(s, i, "%.160s: %s", sm->url, why);
}

/* ------------------------------------------------------------- open/close */

static int s3_probe(char *why, size_t why_len) { return fr_s3_curl_probe(why, why_len); }

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata);

static void s3_close(void *state)
{
    s3_engine *s = state;
    if (!s)
        return;
    for (size_t i = 0; i < s->nxfers; i++) {
        if (s->xfers[i].easy) {
            if (s->multi)
                curl_multi_remove_handle(s->multi, s->xfers[i].easy); /* a no-op if not added */
            curl_easy_cleanup(s->xfers[i].easy);
        }
        curl_slist_free_all(s->xfers[i].headers);
    }
    if (s->multi)
        curl_multi_cleanup(s->multi);
    for (size_t i = 0; i < s->samples_cap; i++)
        free(s->samples[i].buf);
    free(s->xfers);
    free(s->idle);
    free(s->samples);
    free(s->sizes);
    free(s->list);
    free(s->jobs);
    free(s->retry);
    free(s->urls);
    free(s->notes);
    memset(&s->cfg, 0, sizeof(s->cfg)); /* no credentials left in freed memory */
    free(s);
    fr_s3_curl_done();
}

static int s3_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    int rc = fr_s3_curl_probe(err, err_len);
    if (rc)
        return rc;
    if ((rc = fr_s3_curl_init(err, err_len)))
        return rc;
    s3_engine *s = calloc(1, sizeof(*s));
    if (!s) {
        fr_s3_curl_done();
        return -ENOMEM;
    }
    if ((rc = fr_s3_config_resolve(cfg->engine_args, NULL, NULL, &s->cfg, err, err_len))) {
        memset(&s->cfg, 0, sizeof(s->cfg));
        free(s);
        fr_s3_curl_done();
        return rc;
    }
    atomic_init(&s->cancelled, 0);
    s->rng = (uint64_t)(uintptr_t)s ^ (uint64_t)now_ms();
    s->nxfers = (size_t)s->cfg.inflight;
    s->xfers = calloc(s->nxfers, sizeof(*s->xfers));
    s->idle = calloc(s->nxfers, sizeof(*s->idle));
    s->multi = curl_multi_init();
    if (!s->xfers || !s->idle || !s->multi) {
        s3_close(s);
        return -ENOMEM;
    }
    /* The connection cache holds one connection per request in flight, so
     * every one is kept for the next request to the host. */
    CURLMcode mc = curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS, (long)s->nxfers);
    if (mc != CURLM_OK) {
        fr_set_err(err, err_len, "s3: libcurl refused CURLMOPT_MAXCONNECTS: %s",
                   curl_multi_strerror(mc));
        s3_close(s);
        return -EIO;
    }
    for (size_t i = 0; i < s->nxfers; i++) {
        s3_xfer *t = &s->xfers[i];
        t->s = s;
        if (!(t->easy = curl_easy_init())) {
            s3_close(s);
            return -ENOMEM;
        }
        CURLcode cc = fr_s3_easy_setup(t->easy, &s->cfg, t->errbuf);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_body);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(t->easy, CURLOPT_HEADERDATA, &t->resp);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t);
        if (cc != CURLE_OK) {
            fr_set_err(err, err_len, "s3: libcurl refused an option: %s", curl_easy_strerror(cc));
            s3_close(s);
            return -EIO;
        }
        s->idle[s->nidle++] = i;
    }
    *state = s;
    return 0;
}

/* ---------------------------------------------------------------- a call */

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < want)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* Readies the engine for a call of n samples. */
static int begin_call(s3_engine *s, fr_batch *batch, size_t n)
{
    if (n > s->samples_cap) {
        size_t old = s->samples_cap, cap = old;
        if (grow((void **)&s->samples, &cap, n, sizeof(*s->samples)))
            return -ENOMEM;
        memset(s->samples + old, 0, (cap - old) * sizeof(*s->samples));
        int64_t *sizes = realloc(s->sizes, cap * sizeof(*sizes));
        if (sizes)
            s->sizes = sizes;
        size_t *list = realloc(s->list, cap * sizeof(*list));
        if (list)
            s->list = list;
        /* The capacity covers all three arrays: raising it when one of them
         * kept its old size would let a later call write past that one. */
        if (!sizes || !list)
            return -ENOMEM;
        s->samples_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        s3_sample *sm = &s->samples[i];
        sm->url = NULL;
        sm->size = -1;
        sm->err = 0;
        sm->repair = 0;
        sm->buf_len = 0;
        sm->etag[0] = 0;
    }
    s->batch = batch;
    s->n = n;
    s->urls_len = 0;
    s->nnotes = 0;
    s->strict = 0;
    return 0;
}

/* Frees the probes' buffers but those of small objects, up to KEEP_PROBES
 * bytes in all, which the next call's probes reuse without allocating. */
#define KEEP_PROBES ((uint64_t)16 << 20)
static void end_call(s3_engine *s)
{
    uint64_t kept = 0;
    for (size_t i = 0; i < s->samples_cap; i++) {
        s3_sample *sm = &s->samples[i];
        if (sm->buf_cap <= (64u << 10) && kept + sm->buf_cap <= KEEP_PROBES) {
            kept += sm->buf_cap;
            continue;
        }
        s->probe_bytes -= sm->buf_cap;
        free(sm->buf);
        sm->buf = NULL;
        sm->buf_cap = 0;
    }
}

/* Sample i's http(s) URL from its s3:// URL; the sample fails if it is not one. */
static int set_url(s3_engine *s, size_t i, const char *url, int need_key)
{
    s3_sample *sm = &s->samples[i];
    sm->url = url ? url : "(null)";
    char bucket[FR_S3_BUCKET_MAX + 1], why[FR_ERRLEN];
    const char *key;
    if (fr_s3_parse_url(url, bucket, &key, why, sizeof(why)) != 0) {
        sm->err = -EINVAL;
        note(s, i, "%s", why);
        return 0;
    }
    if (need_key && !*key) {
        fail_sample(s, i, -EINVAL, "no object key after the bucket");
        return 0;
    }
    /* Encoding at most triples a key's bytes. */
    size_t need = sizeof(s->cfg.endpoint) + strlen(bucket) + 3 * strlen(key) + 8;
    if (grow((void **)&s->urls, &s->urls_cap, s->urls_len + need, 1))
        return -ENOMEM;
    int w = fr_s3_object_url(&s->cfg, bucket, key, NULL, s->urls + s->urls_len, need);
    if (w < 0) {
        fail_sample(s, i, -ENAMETOOLONG, "its URL is too long");
        return 0;
    }
    sm->http_off = s->urls_len;
    s->urls_len += (size_t)w + 1;
    return 0;
}

static int add_job(s3_engine *s, int kind, size_t i, uint64_t start, uint64_t len,
                   uint64_t dst_off)
{
    if (grow((void **)&s->jobs, &s->jobs_cap, s->njobs + 1, sizeof(*s->jobs)))
        return -ENOMEM;
    s->jobs[s->njobs++] = (s3_job){
        .sample = i, .start = start, .len = len, .dst_off = dst_off, .kind = kind};
    return 0;
}

/* Jobs for bytes [from, from + len) of sample i, part_size each. An empty
 * object is one job without a Range (S3 refuses any range of it). */
static int add_parts(s3_engine *s, int kind, size_t i, uint64_t from, uint64_t len,
                     uint64_t dst_off)
{
    if (len == 0)
        return kind == JOB_PART && from == 0 ? add_job(s, kind, i, 0, 0, 0) : 0;
    uint64_t part = (uint64_t)s->cfg.part_size;
    for (uint64_t done = 0; done < len; done += part) {
        uint64_t l = len - done < part ? len - done : part;
        if (add_job(s, kind, i, from + done, l, dst_off + done))
            return -ENOMEM;
    }
    return 0;
}

static void clear_jobs(s3_engine *s)
{
    s->njobs = s->next_job = s->jobs_done = s->nretry = 0;
}

/* ------------------------------------------------------ one transfer's body */

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    s3_xfer *t = userdata;
    size_t n = size * nmemb;
    long code = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        return 0;
    if (code < 200 || code >= 300) {
        /* An error's XML body: its <Code> goes into the message. */
        size_t room = sizeof(t->errbody) - 1 - t->errlen;
        size_t w = n < room ? n : room;
        memcpy(t->errbody + t->errlen, ptr, w);
        t->errlen += w;
        t->errbody[t->errlen] = 0;
        return n;
    }
    if (!t->dst) {
        /* A probe: into its sample's buffer, sized from Content-Length. */
        s3_sample *sm = &t->s->samples[t->s->jobs[t->job].sample];
        if (t->got + n > sm->buf_cap) {
            curl_off_t announced = -1;
            if (curl_easy_getinfo(t->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced) !=
                CURLE_OK)
                announced = -1;
            uint64_t want = announced >= 0 && (uint64_t)announced >= t->got + n
                                ? (uint64_t)announced
                                : 2 * (t->got + n);
            uint8_t *p = realloc(sm->buf, want);
            if (!p)
                return 0; /* CURLE_WRITE_ERROR; the sample fails with ENOMEM */
            sm->buf = p;
            t->s->probe_bytes += want - sm->buf_cap;
            if (t->s->probe_bytes > t->s->probe_bytes_max)
                t->s->probe_bytes_max = t->s->probe_bytes;
            sm->buf_cap = want;
        }
        memcpy(sm->buf + t->got, ptr, n);
        t->got += n;
        return n;
    }
    if (n > t->cap - t->got) {
        t->overflow = 1; /* more than the range asked: never written past its slot */
        return 0;
    }
    memcpy(t->dst + t->got, ptr, n);
    t->got += n;
    return n;
}

/* ------------------------------------------------------------ the job loop */

static void job_done(s3_engine *s) { s->jobs_done++; }

/* Starts job j on an idle transfer (there is one). */
static void start_job(s3_engine *s, size_t j, long long now)
{
    s3_job *job = &s->jobs[j];
    s3_sample *sm = &s->samples[job->sample];
    if (sm->err || (sm->repair && job->kind == JOB_PART)) {
        job_done(s); /* its sample failed or is read again: no more parts */
        return;
    }
    if (job->attempts == 0)
        job->first_ms = now;
    long long left = job->first_ms + s->cfg.deadline_ms - now;
    if (left <= 0) {
        if (job->last_status)
            fail_sample(s, job->sample, fr_s3_status_errno(job->last_status),
                        "%ld %s (after %u attempts; deadline_ms=%lld reached)", job->last_status,
                        job->last_code[0] ? job->last_code : "(no S3 error code)",
                        job->attempts, s->cfg.deadline_ms);
        else
            fail_sample(s, job->sample, -ETIMEDOUT,
                        "no answer within deadline_ms=%lld (%u attempts)", s->cfg.deadline_ms,
                        job->attempts);
        job_done(s);
        return;
    }
    s3_xfer *t = &s->xfers[s->idle[--s->nidle]];
    t->job = j;
    t->got = 0;
    t->overflow = 0;
    t->errlen = 0;
    t->errbody[0] = 0;
    t->errbuf[0] = 0;
    t->resp.content_range[0] = t->resp.etag[0] = 0;
    uint64_t range_len = job->len;
    if (job->kind == JOB_PROBE) {
        t->dst = NULL;
        t->cap = 0;
        sm->buf_len = 0;
    } else {
        t->dst = s->batch->arena.base + s->batch->samples[job->sample].offset + job->dst_off;
        t->cap = job->len;
    }
    CURLcode cc = fr_s3_headers(&s->cfg, job->start, range_len,
                                job->kind != JOB_PROBE ? sm->etag : NULL, &t->headers)
                      ? CURLE_OUT_OF_MEMORY
                      : CURLE_OK;
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(t->easy, CURLOPT_URL, s->urls + sm->http_off);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, (long)left);
    CURLMcode mc = CURLM_OK;
    if (cc == CURLE_OK)
        mc = curl_multi_add_handle(s->multi, t->easy);
    if (cc != CURLE_OK || mc != CURLM_OK) {
        fail_sample(s, job->sample, cc == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO,
                    "the request could not start: %s",
                    cc != CURLE_OK ? curl_easy_strerror(cc) : curl_multi_strerror(mc));
        curl_slist_free_all(t->headers);
        t->headers = NULL;
        s->idle[s->nidle++] = (size_t)(t - s->xfers);
        job_done(s);
        return;
    }
    t->busy = 1;
    job->attempts++;
    s->requests++;
    s->active++;
    if ((long)s->active > s->inflight_max)
        s->inflight_max = (long)s->active;
}

/* Job j is tried again after its backoff if attempts and time are left;
 * 1 if it will be, 0 if not. */
static int retry_later(s3_engine *s, size_t j, long long now)
{
    s3_job *job = &s->jobs[j];
    if (job->attempts > (unsigned)s->cfg.retries)
        return 0;
    long long when = now + fr_s3_backoff_ms(job->attempts, &s->rng);
    if (when >= job->first_ms + s->cfg.deadline_ms)
        return 0;
    job->not_before_ms = when;
    s->retry[s->nretry++] = j;
    s->retries++;
    return 1;
}

/* A known size proved wrong (the object changed since it was sized): read
 * it again (the first pass), or fail it (a read that sized it just now). */
static void size_changed(s3_engine *s, size_t i, const char *what)
{
    if (s->strict)
        fail_sample(s, i, -ESTALE, "the object changed while it was read (%s); read it again",
                    what);
    else
        s->samples[i].repair = 1;
}

/* Two ETags name other versions; an absent one (a server that sends
 * none) proves nothing either way. */
static int etags_differ(const char *a, const char *b)
{
    return a[0] && b[0] && strcmp(a, b) != 0;
}

static void judge_ok(s3_engine *s, s3_xfer *t, s3_job *job, long code)
{
    s3_sample *sm = &s->samples[job->sample];
    size_t i = job->sample;
    uint64_t first = 0, last = 0, total = 0;
    int have_range = code == 206 && fr_s3_parse_content_range(t->resp.content_range, &first,
                                                              &last, &total) == 0;
    if (code == 206 && !have_range) {
        fail_sample(s, i, -EIO, "206 with a Content-Range of '%.40s' for bytes %" PRIu64 "-%" PRIu64,
                    t->resp.content_range, job->start, job->start + job->len - 1);
        return;
    }
    if (code != 200 && code != 206) {
        fail_sample(s, i, -EIO, "HTTP %ld where 200 or 206 was expected", code);
        return;
    }
    int exact = have_range && first == job->start && last == job->start + job->len - 1 &&
                t->got == job->len;
    switch (job->kind) {
    case JOB_PROBE:
        if (have_range && (first != 0 || last + 1 != t->got || total == UINT64_MAX)) {
            fail_sample(s, i, -EIO, "asked for bytes 0-%" PRIu64 ", got '%.40s' and %" PRIu64
                        " bytes", job->len - 1, t->resp.content_range, t->got);
            return;
        }
        sm->size = have_range ? (int64_t)total : (int64_t)t->got; /* 200: the whole object */
        sm->buf_len = t->got;
        memcpy(sm->etag, t->resp.etag, sizeof(sm->etag));
        break;
    case JOB_PART:
        if (job->len == 0) { /* an empty object, asked for whole */
            if (code != 200 || t->got != 0 || t->overflow)
                size_changed(s, i, "it is no longer empty");
        } else if (have_range && total != (uint64_t)sm->size) {
            size_changed(s, i, "its size is not the one it had");
        } else if (have_range && !exact) {
            fail_sample(s, i, -EIO, "asked for bytes %" PRIu64 "-%" PRIu64 ", got '%.40s' and %"
                        PRIu64 " bytes", job->start, job->start + job->len - 1,
                        t->resp.content_range, t->got);
        } else if (!have_range && (job->start != 0 || job->len != (uint64_t)sm->size ||
                                   t->overflow || t->got != job->len)) {
            /* 200: the server sent the whole object. */
            size_changed(s, i, "the server sent the whole object, of another size");
        } else if (!sm->etag[0]) {
            /* Sizes known, no probe: the first part to arrive names the
             * version (for the object cache's record, and the If-Match of
             * the parts started after it). */
            memcpy(sm->etag, t->resp.etag, sizeof(sm->etag));
        } else if (etags_differ(sm->etag, t->resp.etag)) {
            /* A part started before the first answered carried no
             * If-Match: its ETag is the only proof it is of the same
             * version. Another one: the object was rewritten mid-read, and
             * its bytes would be a mix of two versions. */
            size_changed(s, i, "another version");
        }
        break;
    case JOB_RANGE:
        if (t->overflow || (have_range && (first != job->start || last >= job->start + job->len))) {
            fail_sample(s, i, -EIO, "asked for bytes %" PRIu64 "-%" PRIu64 ", the server sent "
                        "others ('%.40s')", job->start, job->start + job->len - 1,
                        have_range ? t->resp.content_range : "the whole object");
        } else if (!have_range && job->start != 0) {
            fail_sample(s, i, -EIO, "the server ignored Range bytes=%" PRIu64 "-%" PRIu64,
                        job->start, job->start + job->len - 1);
        } else if (t->got != job->len) {
            fail_sample(s, i, -ENODATA, "the object ends inside bytes %" PRIu64 "-%" PRIu64
                        " (%" PRIu64 " bytes)", job->start, job->start + job->len - 1,
                        have_range ? total : t->got);
        } else if (!sm->etag[0]) {
            /* The parts of one range are of one version: the first to
             * answer names it (the If-Match of those started after). */
            memcpy(sm->etag, t->resp.etag, sizeof(sm->etag));
        } else if (etags_differ(sm->etag, t->resp.etag)) {
            fail_sample(s, i, -ESTALE, "the object changed while it was read (another "
                        "version); read it again");
        }
        break;
    }
    s->bytes += (long long)t->got;
}

/* Transfer t ended with curl's verdict cc. */
static void finish(s3_engine *s, s3_xfer *t, CURLcode cc, long long now)
{
    size_t j = t->job;
    s3_job *job = &s->jobs[j];
    size_t i = job->sample;
    long code = 0, conns = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        code = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_NUM_CONNECTS, &conns) == CURLE_OK)
        s->connections += conns;
    CURLMcode mc = curl_multi_remove_handle(s->multi, t->easy);
    t->busy = 0;
    curl_slist_free_all(t->headers);
    t->headers = NULL;
    s->active--;
    if (mc != CURLM_OK) {
        /* A handle the multi would not let go of cannot be reused. */
        fail_sample(s, i, -EIO, "libcurl: %s", curl_multi_strerror(mc));
        job_done(s);
        return;
    }
    s->idle[s->nidle++] = (size_t)(t - s->xfers);
    s3_sample *sm = &s->samples[i];
    if (sm->err) {
        job_done(s);
        return;
    }
    if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && t->overflow)) {
        if (fr_s3_curl_retryable(cc) && retry_later(s, j, now))
            return;
        if (cc == CURLE_WRITE_ERROR && job->kind == JOB_PROBE)
            fail_sample(s, i, -ENOMEM, "no memory for the object's first %" PRIu64 " bytes",
                        job->len);
        else if (job->last_status)
            fail_sample(s, i, fr_s3_status_errno(job->last_status),
                        "%ld %s (after %u attempts; the last: %s)", job->last_status,
                        job->last_code[0] ? job->last_code : "(no S3 error code)",
                        job->attempts, curl_easy_strerror(cc));
        else
            fail_sample(s, i, fr_s3_curl_errno(cc), "%s%s%.120s (%u attempts)",
                        curl_easy_strerror(cc), t->errbuf[0] ? ": " : "", t->errbuf,
                        job->attempts);
        job_done(s);
        return;
    }
    if (code < 200 || code >= 300) {
        uint64_t first, last, total;
        int unsatisfied = code == 416 && fr_s3_parse_content_range(t->resp.content_range, &first,
                                                                   &last, &total) == 0;
        if (unsatisfied && job->kind == JOB_PROBE && total == 0) {
            /* S3 answers any range of an empty object so. */
            sm->size = 0;
            sm->buf_len = 0;
            memcpy(sm->etag, t->resp.etag, sizeof(sm->etag));
        } else if (job->kind == JOB_PART && (code == 412 || code == 416 || code == 404)) {
            if (code == 404 && !s->strict)
                sm->repair = 1; /* gone since it was sized: the probe says so */
            else
                size_changed(s, i, code == 412 ? "another version" : code == 404 ? "it is gone"
                                                                          : "it is shorter");
        } else if (job->kind == JOB_RANGE && code == 412) {
            /* If-Match of the ETag an earlier part of this range had. */
            fail_sample(s, i, -ESTALE, "the object changed while it was read (another "
                        "version); read it again");
        } else if (fr_s3_status_retryable(code) && retry_later(s, j, now)) {
            job->last_status = code;
            fr_s3_error_code(t->errbody, t->errlen, job->last_code, sizeof(job->last_code));
            return;
        } else {
            char s3code[64];
            fr_s3_error_code(t->errbody, t->errlen, s3code, sizeof(s3code));
            if (code == 416 && job->kind == JOB_RANGE && unsatisfied)
                fail_sample(s, i, -ENODATA, "416: bytes %" PRIu64 "-%" PRIu64 " start past the "
                            "object's end (%" PRIu64 " bytes)", job->start,
                            job->start + job->len - 1, total);
            else
                fail_sample(s, i, code ? fr_s3_status_errno(code) : -EIO, "%ld %s%s", code,
                            s3code[0] ? s3code : "(no S3 error code)",
                            job->attempts > 1 ? " (after retries)" : "");
        }
        job_done(s);
        return;
    }
    judge_ok(s, t, job, code);
    job_done(s);
}

/* The next job to start: a retry whose backoff is over, else the next
 * fresh one. 1 and its index, or 0. */
static int next_ready(s3_engine *s, long long now, size_t *j)
{
    for (size_t k = 0; k < s->nretry; k++)
        if (s->jobs[s->retry[k]].not_before_ms <= now) {
            *j = s->retry[k];
            s->retry[k] = s->retry[--s->nretry];
            return 1;
        }
    if (s->next_job < s->njobs) {
        *j = s->next_job++;
        return 1;
    }
    return 0;
}

/* Stops every transfer in flight (a batch-level failure). */
static void abort_all(s3_engine *s)
{
    for (size_t k = 0; k < s->nxfers; k++) {
        s3_xfer *t = &s->xfers[k];
        if (!t->busy)
            continue;
        t->busy = 0;
        curl_multi_remove_handle(s->multi, t->easy); /* best effort: the batch fails anyway */
        curl_slist_free_all(t->headers);
        t->headers = NULL;
        s->idle[s->nidle++] = k;
    }
    s->active = 0;
}

/* Runs every job of the call to its end: 0, or a batch-level -errno when
 * libcurl's multi handle itself fails. */
static int run_jobs(s3_engine *s)
{
    size_t *retry = realloc(s->retry, (s->njobs ? s->njobs : 1) * sizeof(*retry));
    if (!retry)
        return -ENOMEM;
    s->retry = retry;
    while (s->jobs_done < s->njobs) {
        if (atomic_load_explicit(&s->cancelled, memory_order_acquire)) {
            abort_all(s);
            return -ECANCELED;
        }
        long long now = now_ms();
        size_t j;
        while (s->nidle > 0 && next_ready(s, now, &j))
            start_job(s, j, now);
        int finished = 0;
        if (s->active > 0) {
            int running;
            CURLMcode mc = curl_multi_perform(s->multi, &running);
            if (mc != CURLM_OK) {
                abort_all(s);
                return -EIO;
            }
            CURLMsg *m;
            int left;
            now = now_ms();
            while ((m = curl_multi_info_read(s->multi, &left))) {
                if (m->msg != CURLMSG_DONE)
                    continue;
                s3_xfer *t = NULL;
                if (curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&t) != CURLE_OK ||
                    !t) {
                    abort_all(s);
                    return -EIO;
                }
                finish(s, t, m->data.result, now);
                finished++;
            }
        }
        if (s->jobs_done >= s->njobs)
            break;
        if (finished && s->nidle > 0)
            continue; /* start the next jobs before waiting */
        /* Wait for the network, or for the earliest retry's backoff. */
        long long wait = 100;
        for (size_t k = 0; k < s->nretry; k++) {
            long long d = s->jobs[s->retry[k]].not_before_ms - now;
            if (d < wait)
                wait = d < 0 ? 0 : d;
        }
        if (s->active > 0) {
            CURLMcode mc = curl_multi_poll(s->multi, NULL, 0, (int)wait, NULL);
            if (mc != CURLM_OK) {
                abort_all(s);
                return -EIO;
            }
        } else if (wait > 0) {
            struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
            nanosleep(&ts, NULL); /* an early wake-up only loops once more */
        }
    }
    return 0;
}

/* ------------------------------------------------------------- read_files */

/* Lays samples list[0..k) out at the end of the arena (repairs, after the
 * batch's layout), as fr_layout would have. */
static int append_layout(s3_engine *s, const size_t *list, size_t k)
{
    fr_batch *b = s->batch;
    int dense = b->dense;
    size_t align = dense ? 1 : FR_SAMPLE_ALIGN;
    size_t off = fr_round_up(b->arena.used, align);
    for (size_t q = 0; q < k; q++) {
        s3_sample *sm = &s->samples[list[q]];
        if (sm->err)
            continue;
        b->samples[list[q]].offset = off;
        off += dense ? (size_t)sm->size
                     : fr_round_up(fr_request_len((size_t)sm->size, 0, 0), align);
    }
    int rc = fr_arena_reserve(&b->arena, off + (dense ? 1 : 0));
    if (rc == 0)
        b->arena.used = off;
    return rc;
}

/* Reads samples list[0..k) of unknown size: probes, layout (the whole
 * batch's, or appended for repairs), then the rest of large objects. */
static int probe_pass(s3_engine *s, const size_t *list, size_t k, int append)
{
    clear_jobs(s);
    uint64_t probe = (uint64_t)s->cfg.part_size < PROBE_MAX ? (uint64_t)s->cfg.part_size
                                                             : PROBE_MAX;
    for (size_t q = 0; q < k; q++) {
        s3_sample *sm = &s->samples[list[q]];
        sm->size = -1;
        sm->repair = 0;
        sm->etag[0] = 0;
        if (!sm->err && add_job(s, JOB_PROBE, list[q], 0, probe, 0))
            return -ENOMEM;
    }
    int rc = run_jobs(s);
    if (rc)
        return rc;
    if (append) {
        rc = append_layout(s, list, k);
    } else {
        for (size_t i = 0; i < s->n; i++)
            s->sizes[i] = s->samples[i].err ? s->samples[i].err : s->samples[i].size;
        rc = fr_layout(s->batch, s->sizes, s->n, 0, 0);
        for (size_t i = 0; rc == 0 && i < s->n; i++)
            if (s->sizes[i] == -EFBIG && !s->samples[i].err)
                s->samples[i].err = -EFBIG; /* refused by the layout: no GET into it */
    }
    if (rc)
        return rc;
    clear_jobs(s);
    for (size_t q = 0; q < k; q++) {
        s3_sample *sm = &s->samples[list[q]];
        if (sm->err)
            continue;
        uint64_t have = sm->buf_len < (uint64_t)sm->size ? sm->buf_len : (uint64_t)sm->size;
        if (have)
            memcpy(s->batch->arena.base + s->batch->samples[list[q]].offset, sm->buf, have);
        if ((uint64_t)sm->size > have &&
            add_parts(s, JOB_PART, list[q], have, (uint64_t)sm->size - have, have))
            return -ENOMEM;
    }
    s->strict = 1; /* sized just now: another size means another object */
    rc = run_jobs(s);
    s->strict = 0;
    return rc;
}

static int read_files_call(void *state, const char *const *paths, const int64_t *size_hints,
                           size_t n, fr_batch *batch)
{
    s3_engine *s = state;
    int rc = begin_call(s, batch, n);
    if (rc)
        return rc;
    size_t known = 0;
    for (size_t i = 0; i < n; i++) {
        if ((rc = set_url(s, i, paths[i], 1)))
            return rc;
        known += size_hints && size_hints[i] >= 0 && !s->samples[i].err;
    }
    if (known) {
        /* The objects of known size straight into the arena; the others
         * (-1: a placeholder fr_layout leaves out) probed after them and
         * laid out at its end, with any whose size proved wrong. */
        for (size_t i = 0; i < n; i++)
            s->sizes[i] = s->samples[i].err ? s->samples[i].err
                          : size_hints[i] >= 0 ? size_hints[i] : -1;
        if ((rc = fr_layout(batch, s->sizes, n, 0, 0)))
            return rc;
        for (size_t i = 0; i < n; i++)
            if (s->sizes[i] == -EFBIG && !s->samples[i].err)
                s->samples[i].err = -EFBIG; /* refused by the layout: no GET into it */
        clear_jobs(s);
        for (size_t i = 0; i < n; i++) {
            if (s->samples[i].err || size_hints[i] < 0)
                continue;
            s->samples[i].size = size_hints[i];
            if (add_parts(s, JOB_PART, i, 0, (uint64_t)size_hints[i], 0))
                return -ENOMEM;
        }
        if ((rc = run_jobs(s)))
            return rc;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (s->samples[i].err)
                continue;
            s->repairs += s->samples[i].repair;
            if (s->samples[i].repair || size_hints[i] < 0)
                s->list[k++] = i;
        }
        if (k && (rc = probe_pass(s, s->list, k, 1)))
            return rc;
    } else {
        for (size_t i = 0; i < n; i++)
            s->list[i] = i;
        if ((rc = probe_pass(s, s->list, n, 0)))
            return rc;
    }
    for (size_t i = 0; i < n; i++)
        batch->samples[i].length = s->samples[i].err ? s->samples[i].err : s->samples[i].size;
    return 0;
}

static int s3_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                         size_t n, fr_batch *batch)
{
    int rc = read_files_call(state, paths, size_hints, n, batch);
    end_call(state); /* a failed (or cancelled) call's probes too */
    return rc;
}

/* ------------------------------------------------------------ read_ranges */

static int s3_sample_error(const void *state, size_t i, char *out, size_t len);

static int s3_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                          fr_batch *batch)
{
    s3_engine *s = state;
    int rc = begin_call(s, batch, n);
    if (rc)
        return rc;
    if ((rc = fr_layout_ranges(batch, ranges, n, 0, FR_SAMPLE_ALIGN)))
        return rc;
    /* One URL for every range: the first sample's, shared. */
    if ((rc = set_url(s, 0, path, 1)))
        return rc;
    clear_jobs(s);
    for (size_t i = 0; i < n; i++) {
        s3_sample *sm = &s->samples[i];
        sm->url = s->samples[0].url;
        sm->http_off = s->samples[0].http_off;
        if (i > 0 && s->samples[0].err) {
            /* A bad URL fails every range, each with the message. */
            char why[FR_ERRLEN];
            if (!s3_sample_error(s, 0, why, sizeof(why)))
                why[0] = 0;
            sm->err = s->samples[0].err;
            note(s, i, "%s", why);
        }
        if (batch->samples[i].length < 0 && !sm->err)
            fail_sample(s, i, (int)batch->samples[i].length,
                        "range %zu (offset %" PRIu64 ", %" PRIu64 " bytes) overflows", i,
                        ranges[i].offset, ranges[i].length);
        if (!sm->err && add_parts(s, JOB_RANGE, i, ranges[i].offset, ranges[i].length, 0))
            return -ENOMEM;
    }
    if ((rc = run_jobs(s)))
        return rc;
    for (size_t i = 0; i < n; i++)
        batch->samples[i].length = s->samples[i].err ? s->samples[i].err
                                                     : (int64_t)ranges[i].length;
    return 0;
}

/* ------------------------------------------------------- read_file_ranges */

/* Ranges of many objects: one ranged GET per part_size of each, all on the
 * context's one multi handle (connections kept across objects and calls). */
static int s3_read_file_ranges(void *state, const char *const *paths, size_t npaths,
                               const fr_file_range *jobs, size_t n, fr_batch *batch)
{
    s3_engine *s = state;
    int rc = begin_call(s, batch, n);
    if (rc)
        return rc;
    /* fr_layout_ranges reads offset and length only: the jobs' layout
     * matches fr_range's from `offset` on, but not its start; copy. */
    fr_range *ranges = malloc((n ? n : 1) * sizeof(*ranges));
    if (!ranges)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        ranges[i] = (fr_range){jobs[i].offset, jobs[i].length};
    rc = fr_layout_ranges(batch, ranges, n, 0, FR_SAMPLE_ALIGN);
    free(ranges);
    if (rc)
        return rc;
    clear_jobs(s);
    size_t last = SIZE_MAX; /* the sample whose URL the next one of its object shares */
    for (size_t i = 0; i < n; i++) {
        s3_sample *sm = &s->samples[i];
        if (jobs[i].file >= npaths) {
            sm->url = "(no object)";
            fail_sample(s, i, -EINVAL, "file index %" PRIu32 " of %zu objects", jobs[i].file,
                        npaths);
            continue;
        }
        if (last != SIZE_MAX && jobs[last].file == jobs[i].file) {
            sm->url = s->samples[last].url;
            sm->http_off = s->samples[last].http_off;
        } else {
            if ((rc = set_url(s, i, paths[jobs[i].file], 1)))
                return rc;
            if (sm->err)
                continue;
            last = i;
        }
        if (batch->samples[i].length < 0 && !sm->err)
            fail_sample(s, i, (int)batch->samples[i].length,
                        "range %zu (offset %" PRIu64 ", %" PRIu64 " bytes) overflows", i,
                        jobs[i].offset, jobs[i].length);
        if (!sm->err && add_parts(s, JOB_RANGE, i, jobs[i].offset, jobs[i].length, 0))
            return -ENOMEM;
    }
    if ((rc = run_jobs(s)))
        return rc;
    for (size_t i = 0; i < n; i++)
        batch->samples[i].length = s->samples[i].err ? s->samples[i].err
                                                     : (int64_t)jobs[i].length;
    return 0;
}

static int s3_read_file_ranges_call(void *state, const char *const *paths, size_t npaths,
                                    const fr_file_range *jobs, size_t n, fr_batch *batch)
{
    int rc = s3_read_file_ranges(state, paths, npaths, jobs, n, batch);
    end_call(state);
    return rc;
}

/* ------------------------------------------------------------ diagnostics */

static void s3_cancel(void *state, int on)
{
    s3_engine *s = state;
    atomic_store_explicit(&s->cancelled, on != 0, memory_order_release);
    /* Ends a curl_multi_poll in progress now rather than at its timeout;
     * libcurl documents it as callable from any thread. */
    if (on)
        (void)curl_multi_wakeup(s->multi);
}

/* Per transfer: its struct and libcurl's receive buffer (CURLOPT_BUFFERSIZE). */
#define XFER_BYTES (sizeof(s3_xfer) + FR_S3_RECV_BUFFER)

static long s3_stat(const void *state, const char *key)
{
    const s3_engine *s = state;
    if (strcmp(key, "s3_requests") == 0)
        return s->requests;
    if (strcmp(key, "s3_retries") == 0)
        return s->retries;
    if (strcmp(key, "s3_bytes") == 0)
        return (long)s->bytes;
    if (strcmp(key, "s3_inflight_max") == 0)
        return s->inflight_max;
    if (strcmp(key, "s3_repairs") == 0)
        return s->repairs;
    if (strcmp(key, "s3_buffer_bytes") == 0)
        return (long)(s->probe_bytes + s->nxfers * XFER_BYTES);
    if (strcmp(key, "s3_buffer_bytes_max") == 0)
        return (long)(s->probe_bytes_max + s->nxfers * XFER_BYTES);
    if (strcmp(key, "s3_connections") == 0)
        return s->connections;
    if (strcmp(key, "inflight") == 0)
        return (long)s->cfg.inflight;
    if (strcmp(key, "part_size") == 0)
        return (long)s->cfg.part_size;
    if (strcmp(key, "retries") == 0)
        return (long)s->cfg.retries;
    if (strcmp(key, "deadline_ms") == 0)
        return (long)s->cfg.deadline_ms;
    if (strcmp(key, "unsigned") == 0)
        return s->cfg.unsigned_requests;
    if (strcmp(key, "path_style") == 0)
        return s->cfg.addressing == FR_S3_ADDR_PATH ||
               (s->cfg.addressing == FR_S3_ADDR_AUTO && !s->cfg.endpoint_is_aws);
    return -1;
}

static const char *s3_sample_version(const void *state, size_t i)
{
    const s3_engine *s = state;
    return i < s->n ? s->samples[i].etag : NULL;
}

static void s3_cache_scope(const void *state, char *out, size_t len)
{
    const s3_engine *s = state;
    fr_s3_cache_scope(&s->cfg, out, len);
}

static int s3_sample_error(const void *state, size_t i, char *out, size_t len)
{
    const s3_engine *s = state;
    for (size_t k = 0; k < s->nnotes; k++)
        if (s->notes[k].sample == i) {
            fr_set_err(out, len, "%s", s->notes[k].msg);
            return 1;
        }
    return 0;
}

const fr_engine fr_engine_s3 = {
    .name = "s3",
    .probe = s3_probe,
    .open = s3_open,
    .close = s3_close,
    .read_files = s3_read_files,
    /* Known sizes let a read skip the probe, its copy and, for a large
     * object, a round trip before its parts: worth it at any size. */
    .uses_size_hints = FR_HINTS_ANY_SIZE,
    .stat = s3_stat,
    .read_ranges = s3_read_ranges,
    .read_file_ranges = s3_read_file_ranges_call,
    .sample_error = s3_sample_error,
    .cancel = s3_cancel,
    .cache_scope = s3_cache_scope,
    .sample_version = s3_sample_version,
};
