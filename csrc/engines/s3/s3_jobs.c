/*
 * s3's job loop: the GETs of a call run on the context's multi handle, up
 * to `inflight` at once, each retried on 5xx answers, resets and timeouts
 * with jittered exponential backoff within `retries` and `deadline_ms`, and
 * every response judged against what was asked (status, Content-Range, the
 * body's length, the ETag). What a job is and why: s3.c's opening comment.
 *
 * Thread safety: s3_engine.h.
 */
/* clock_gettime, nanosleep: POSIX, which -std=c11 hides. */
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
#include "engines/s3/s3_engine.h"
#include "engines/s3/s3_http.h"

long long fr_s3_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Keeps a message for sample i (the call's first one for it). */
void fr_s3_note(s3_engine *s, size_t i, const char *fmt, ...)
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
void fr_s3_fail_sample(s3_engine *s, size_t i, int err, const char *fmt, ...)
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
    fr_s3_note(s, i, "%.160s: %s", sm->url, why);
}

int fr_s3_grow(void **p, size_t *cap, size_t want, size_t elem)
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

int fr_s3_add_job(s3_engine *s, int kind, size_t i, uint64_t start, uint64_t len,
                   uint64_t dst_off)
{
    if (fr_s3_grow((void **)&s->jobs, &s->jobs_cap, s->njobs + 1, sizeof(*s->jobs)))
        return -ENOMEM;
    s->jobs[s->njobs++] = (s3_job){
        .sample = i, .start = start, .len = len, .dst_off = dst_off, .kind = kind};
    return 0;
}

/* Jobs for bytes [from, from + len) of sample i, part_size each. An empty
 * object is one job without a Range (S3 refuses any range of it). */
int fr_s3_add_parts(s3_engine *s, int kind, size_t i, uint64_t from, uint64_t len,
                     uint64_t dst_off)
{
    if (len == 0)
        return kind == JOB_PART && from == 0 ? fr_s3_add_job(s, kind, i, 0, 0, 0) : 0;
    uint64_t part = (uint64_t)s->cfg.part_size;
    for (uint64_t done = 0; done < len; done += part) {
        uint64_t l = len - done < part ? len - done : part;
        if (fr_s3_add_job(s, kind, i, from + done, l, dst_off + done))
            return -ENOMEM;
    }
    return 0;
}

void fr_s3_clear_jobs(s3_engine *s)
{
    s->njobs = s->next_job = s->jobs_done = s->nretry = 0;
}

/* ------------------------------------------------------ one transfer's body */

size_t fr_s3_on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
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
            fr_s3_fail_sample(s, job->sample, fr_s3_status_errno(job->last_status),
                        "%ld %s (after %u attempts; deadline_ms=%lld reached)", job->last_status,
                        job->last_code[0] ? job->last_code : "(no S3 error code)",
                        job->attempts, s->cfg.deadline_ms);
        else
            fr_s3_fail_sample(s, job->sample, -ETIMEDOUT,
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
        fr_s3_fail_sample(s, job->sample, cc == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO,
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
        fr_s3_fail_sample(s, i, -ESTALE, "the object changed while it was read (%s); read it again",
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
        fr_s3_fail_sample(s, i, -EIO, "206 with a Content-Range of '%.40s' for bytes %" PRIu64 "-%" PRIu64,
                    t->resp.content_range, job->start, job->start + job->len - 1);
        return;
    }
    if (code != 200 && code != 206) {
        fr_s3_fail_sample(s, i, -EIO, "HTTP %ld where 200 or 206 was expected", code);
        return;
    }
    int exact = have_range && first == job->start && last == job->start + job->len - 1 &&
                t->got == job->len;
    switch (job->kind) {
    case JOB_PROBE:
        if (have_range && (first != 0 || last + 1 != t->got || total == UINT64_MAX)) {
            fr_s3_fail_sample(s, i, -EIO, "asked for bytes 0-%" PRIu64 ", got '%.40s' and %" PRIu64
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
            fr_s3_fail_sample(s, i, -EIO, "asked for bytes %" PRIu64 "-%" PRIu64 ", got '%.40s' and %"
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
            fr_s3_fail_sample(s, i, -EIO, "asked for bytes %" PRIu64 "-%" PRIu64 ", the server sent "
                        "others ('%.40s')", job->start, job->start + job->len - 1,
                        have_range ? t->resp.content_range : "the whole object");
        } else if (!have_range && job->start != 0) {
            fr_s3_fail_sample(s, i, -EIO, "the server ignored Range bytes=%" PRIu64 "-%" PRIu64,
                        job->start, job->start + job->len - 1);
        } else if (t->got != job->len) {
            fr_s3_fail_sample(s, i, -ENODATA, "the object ends inside bytes %" PRIu64 "-%" PRIu64
                        " (%" PRIu64 " bytes)", job->start, job->start + job->len - 1,
                        have_range ? total : t->got);
        } else if (!sm->etag[0]) {
            /* The parts of one range are of one version: the first to
             * answer names it (the If-Match of those started after). */
            memcpy(sm->etag, t->resp.etag, sizeof(sm->etag));
        } else if (etags_differ(sm->etag, t->resp.etag)) {
            fr_s3_fail_sample(s, i, -ESTALE, "the object changed while it was read (another "
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
        fr_s3_fail_sample(s, i, -EIO, "libcurl: %s", curl_multi_strerror(mc));
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
            fr_s3_fail_sample(s, i, -ENOMEM, "no memory for the object's first %" PRIu64 " bytes",
                        job->len);
        else if (job->last_status)
            fr_s3_fail_sample(s, i, fr_s3_status_errno(job->last_status),
                        "%ld %s (after %u attempts; the last: %s)", job->last_status,
                        job->last_code[0] ? job->last_code : "(no S3 error code)",
                        job->attempts, curl_easy_strerror(cc));
        else
            fr_s3_fail_sample(s, i, fr_s3_curl_errno(cc), "%s%s%.120s (%u attempts)",
                        curl_easy_strerror(cc), t->errbuf[0] ? ": " : "", t->errbuf,
                        job->attempts);
        job_done(s);
        return;
    }
    if (code < 200 || code >= 300) {
        uint64_t first, last, total;
        int unsatisfied = code == 416 && fr_s3_parse_content_range(t->resp.content_range, &first,
                                                                   &last, &total) == 0;
        /* A probe asks for bytes 0-N, which only an empty object cannot
         * satisfy (RFC 9110 14.1.1). S3 says so with a Content-Range
         * of total 0; MinIO sends a 416 with no Content-Range (nor ETag). */
        if (code == 416 && job->kind == JOB_PROBE &&
            ((unsatisfied && total == 0) || !t->resp.content_range[0])) {
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
            fr_s3_fail_sample(s, i, -ESTALE, "the object changed while it was read (another "
                        "version); read it again");
        } else if (fr_s3_status_retryable(code) && retry_later(s, j, now)) {
            job->last_status = code;
            fr_s3_error_code(t->errbody, t->errlen, job->last_code, sizeof(job->last_code));
            return;
        } else {
            char s3code[64];
            fr_s3_error_code(t->errbody, t->errlen, s3code, sizeof(s3code));
            if (code == 416 && job->kind == JOB_RANGE && unsatisfied)
                fr_s3_fail_sample(s, i, -ENODATA, "416: bytes %" PRIu64 "-%" PRIu64 " start past the "
                            "object's end (%" PRIu64 " bytes)", job->start,
                            job->start + job->len - 1, total);
            else
                fr_s3_fail_sample(s, i, code ? fr_s3_status_errno(code) : -EIO, "%ld %s%s", code,
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
int fr_s3_run_jobs(s3_engine *s)
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
        long long now = fr_s3_now_ms();
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
            now = fr_s3_now_ms();
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
            /* A retry whose backoff is over waits for a transfer (none was
             * idle, or it would have started): only the network frees one. */
            if (d > 0 && d < wait)
                wait = d;
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
