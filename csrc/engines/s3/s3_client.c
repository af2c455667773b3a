/* One S3 request at a time (listing, uploads, ranged GETs of tar headers):
 * see s3_client.h. */
/* clock_gettime, nanosleep, strncasecmp: POSIX, which -std=c11 hides. */
#define _POSIX_C_SOURCE 200809L
#include "engines/s3/s3_client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base.h"
#include "engines/s3/s3_config.h"
#include "engines/s3/s3_http.h"

struct fr_s3_client {
    fr_s3_config cfg;
    CURL *easy;
    fr_s3_resp_headers resp;
    char errbuf[CURL_ERROR_SIZE];
    uint64_t rng;
    long requests, retries;
    long long bytes; /* response bytes received, over every attempt */
    /* The response of the request in progress. */
    char *body;
    size_t len, cap;
    int oom;
    /* A PUT's body. */
    const char *put;
    size_t put_len, put_done;
};

/* Milliseconds since t0 (CLOCK_MONOTONIC). */
static long long elapsed_ms(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1); /* cannot fail for this clock */
    return (long long)(t1.tv_sec - t0->tv_sec) * 1000 + (t1.tv_nsec - t0->tv_nsec) / 1000000;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    fr_s3_client *c = userdata;
    size_t n = size * nmemb;
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 16384;
        while (cap < c->len + n + 1)
            cap *= 2;
        char *p = realloc(c->body, cap);
        if (!p) {
            c->oom = 1;
            return 0;
        }
        c->body = p;
        c->cap = cap;
    }
    memcpy(c->body + c->len, ptr, n);
    c->len += n;
    c->body[c->len] = 0;
    return n;
}

static size_t on_upload(char *buf, size_t size, size_t nitems, void *userdata)
{
    fr_s3_client *c = userdata;
    size_t n = size * nitems, left = c->put_len - c->put_done;
    if (n > left)
        n = left;
    memcpy(buf, c->put + c->put_done, n);
    c->put_done += n;
    return n;
}

/* A retry reads the body again from its start. */
static int on_seek(void *userdata, curl_off_t offset, int origin)
{
    fr_s3_client *c = userdata;
    if (origin != SEEK_SET || offset < 0 || (size_t)offset > c->put_len)
        return CURL_SEEKFUNC_FAIL;
    c->put_done = (size_t)offset;
    return CURL_SEEKFUNC_OK;
}

void fr_s3_client_close(fr_s3_client *c)
{
    if (!c)
        return;
    if (c->easy)
        curl_easy_cleanup(c->easy);
    free(c->body);
    memset(&c->cfg, 0, sizeof(c->cfg)); /* no credentials left in freed memory */
    free(c);
    fr_s3_curl_done();
}

int fr_s3_client_open(const char *engine_args, fr_s3_client **out, char *err, size_t err_len)
{
    *out = NULL;
    int rc = fr_s3_curl_probe(err, err_len);
    if (rc)
        return rc;
    if ((rc = fr_s3_curl_init(err, err_len)))
        return rc;
    fr_s3_client *c = calloc(1, sizeof(*c));
    if (!c) {
        fr_s3_curl_done();
        return -ENOMEM;
    }
    if ((rc = fr_s3_config_resolve(engine_args, NULL, NULL, &c->cfg, err, err_len))) {
        fr_s3_client_close(c);
        return rc;
    }
    c->rng = (uint64_t)(uintptr_t)c ^ (uint64_t)time(NULL);
    if (!(c->easy = curl_easy_init())) {
        fr_s3_client_close(c);
        return -ENOMEM;
    }
    CURLcode cc = fr_s3_easy_setup(c->easy, &c->cfg, c->errbuf);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, on_body);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_HEADERDATA, &c->resp);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_READFUNCTION, on_upload);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_READDATA, c);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_SEEKFUNCTION, on_seek);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_SEEKDATA, c);
    if (cc != CURLE_OK) {
        fr_set_err(err, err_len, "s3: libcurl refused an option: %s", curl_easy_strerror(cc));
        fr_s3_client_close(c);
        return -EIO;
    }
    *out = c;
    return 0;
}

/* fr_s3_client_request with a Range of bytes [range_first, range_first +
 * range_len) when range_len > 0 (GET only). */
static long client_request(fr_s3_client *c, const char *method, const char *bucket,
                           const char *key, const char *query, const void *body,
                           size_t body_len, uint64_t range_first, uint64_t range_len,
                           char **resp, size_t *resp_len, char *err, size_t err_len)
{
    *resp = NULL;
    *resp_len = 0;
    int put = strcmp(method, "PUT") == 0;
    if (!put && strcmp(method, "GET") != 0) {
        fr_set_err(err, err_len, "s3: method '%.16s' is not GET or PUT", method);
        return -EINVAL;
    }
    char url[8192];
    int w = fr_s3_object_url(&c->cfg, bucket, key ? key : "", query, url, sizeof(url));
    if (w < 0) {
        fr_set_err(err, err_len, "s3: the URL of s3://%.64s/%.64s... is too long", bucket,
                   key ? key : "");
        return w;
    }
    struct curl_slist *headers;
    if (fr_s3_headers(&c->cfg, range_first, put ? 0 : range_len, NULL, &headers))
        return -ENOMEM;
    CURLcode cc = curl_easy_setopt(c->easy, CURLOPT_URL, url);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, headers);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(c->easy, CURLOPT_UPLOAD, put ? 1L : 0L);
    if (cc == CURLE_OK && put)
        cc = curl_easy_setopt(c->easy, CURLOPT_INFILESIZE_LARGE, (curl_off_t)body_len);
    if (cc == CURLE_OK && !put)
        cc = curl_easy_setopt(c->easy, CURLOPT_HTTPGET, 1L);
    long code = 0;
    /* The last answer the server gave to an attempt that was retried (503
     * SlowDown): a later attempt that gets none (it ran out of time) does
     * not hide it, or a throttled bucket would read as a timeout. */
    long answered = 0;
    char answered_code[64] = "";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0); /* cannot fail for this clock */
    /* (A retryable transfer error leaves cc set: the loop goes on.) */
    for (unsigned attempt = 1; cc == CURLE_OK || attempt > 1; attempt++) {
        long long spent = elapsed_ms(&t0);
        long long left = c->cfg.deadline_ms - spent;
        if (left <= 0) {
            cc = CURLE_OPERATION_TIMEDOUT;
            break;
        }
        c->len = 0;
        c->oom = 0;
        c->put = body;
        c->put_len = put ? body_len : 0;
        c->put_done = 0;
        c->errbuf[0] = 0;
        c->resp.content_range[0] = 0;
        if ((cc = curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, (long)left)) != CURLE_OK)
            break;
        c->requests++;
        cc = curl_easy_perform(c->easy);
        c->bytes += (long long)c->len;
        code = 0;
        if (cc == CURLE_OK && curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
            cc = CURLE_BAD_FUNCTION_ARGUMENT;
        int again = cc == CURLE_OK ? fr_s3_status_retryable(code) : fr_s3_curl_retryable(cc);
        if (!again || attempt > (unsigned)c->cfg.retries)
            break;
        unsigned pause = fr_s3_backoff_ms(attempt, &c->rng);
        /* The time this attempt took counts: a retry needs time left
         * after its pause. */
        if (elapsed_ms(&t0) + pause >= c->cfg.deadline_ms)
            break;
        if (cc == CURLE_OK) {
            answered = code;
            fr_s3_error_code(c->body ? c->body : "", c->len, answered_code,
                             sizeof(answered_code));
        }
        c->retries++;
        struct timespec ts = {(time_t)(pause / 1000), (long)(pause % 1000) * 1000000L};
        nanosleep(&ts, NULL); /* a signal only shortens the pause */
    }
    curl_slist_free_all(headers);
    /* The handle keeps no pointer to the freed list or the caller's body. */
    if (curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, NULL) != CURLE_OK && cc == CURLE_OK)
        cc = CURLE_BAD_FUNCTION_ARGUMENT;
    int from_answered = cc != CURLE_OK && answered && !c->oom;
    if (from_answered) {
        /* The server's last answer, and what became of the retry. */
        fr_set_err(err, err_len, "%ld %s (after retries; the last: %s)", answered,
                   answered_code[0] ? answered_code : "(no S3 error code)",
                   curl_easy_strerror(cc));
        c->len = 0;
        code = answered;
        cc = CURLE_OK;
    } else if (cc != CURLE_OK) {
        int e = c->oom ? -ENOMEM : fr_s3_curl_errno(cc);
        fr_set_err(err, err_len, "s3://%.64s/%.120s: %s%s%.120s", bucket, key ? key : "",
                   curl_easy_strerror(cc), c->errbuf[0] ? ": " : "", c->errbuf);
        return e;
    }
    if (code >= 300 && !from_answered) {
        char s3code[64];
        fr_s3_error_code(c->body ? c->body : "", c->len, s3code, sizeof(s3code));
        fr_set_err(err, err_len, "%ld %s", code, s3code[0] ? s3code : "(no S3 error code)");
    }
    /* The body goes to the caller; the client starts a new one next time. */
    if (!c->body && !(c->body = calloc(1, 1)))
        return -ENOMEM;
    *resp = c->body;
    *resp_len = c->len;
    c->body = NULL;
    c->len = c->cap = 0;
    return code;
}

long fr_s3_client_request(fr_s3_client *c, const char *method, const char *bucket,
                          const char *key, const char *query, const void *body, size_t body_len,
                          char **resp, size_t *resp_len, char *err, size_t err_len)
{
    return client_request(c, method, bucket, key, query, body, body_len, 0, 0, resp, resp_len,
                          err, err_len);
}

const char *fr_s3_client_check_range(long code, const char *content_range, uint64_t first,
                                     uint64_t len, size_t *resp_len, uint64_t *total)
{
    *total = UINT64_MAX;
    uint64_t a = 0, b = 0, t = UINT64_MAX;
    int have = content_range && content_range[0] &&
               fr_s3_parse_content_range(content_range, &a, &b, &t) == 0;
    if (code == 206) {
        /* Exactly the bytes asked for, or fewer where the object ends
         * inside the range: anything else is not the object at `first`. */
        if (!have || a != first || a == UINT64_MAX || b - a >= len || b - a + 1 != *resp_len ||
            t == UINT64_MAX)
            return "sent other bytes";
        *total = t;
    } else if (code == 416) {
        if (have && a == UINT64_MAX)
            *total = t; /* a Content-Range of a total and no range: past the end */
        else if (!have && first == 0)
            *total = 0; /* only an empty object refuses bytes 0-N (MinIO: no Content-Range) */
        *resp_len = 0;
    } else if (code == 200) {
        /* A server that ignores Range sends the whole object. */
        if (first != 0)
            return "ignored the Range and sent the whole object";
        *total = *resp_len;
        if (*resp_len > len)
            *resp_len = (size_t)len;
    }
    return NULL;
}

long fr_s3_client_get_range(fr_s3_client *c, const char *bucket, const char *key,
                            uint64_t first, uint64_t len, char **resp, size_t *resp_len,
                            uint64_t *total, char *err, size_t err_len)
{
    *total = UINT64_MAX;
    *resp = NULL;
    *resp_len = 0;
    if (len == 0 || first > UINT64_MAX - len) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: an empty or overflowing range (%" PRIu64
                   " bytes at %" PRIu64 ")", bucket, key, len, first);
        return -EINVAL;
    }
    long code = client_request(c, "GET", bucket, key, NULL, NULL, 0, first, len, resp, resp_len,
                               err, err_len);
    if (code < 0)
        return code;
    const char *bad = fr_s3_client_check_range(code, c->resp.content_range, first, len, resp_len,
                                               total);
    if (bad) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: asked for bytes %" PRIu64 "-%" PRIu64
                   ", the server %s ('%.60s', %zu bytes)", bucket, key, first, first + len - 1,
                   bad, c->resp.content_range, *resp_len);
        fr_s3_free(*resp);
        *resp = NULL;
        *resp_len = 0;
        return -EIO;
    }
    return code;
}

long fr_s3_client_requests(const fr_s3_client *c) { return c->requests; }
long long fr_s3_client_bytes(const fr_s3_client *c) { return c->bytes; }
long fr_s3_client_retries(const fr_s3_client *c) { return c->retries; }

void fr_s3_client_cache_scope(const fr_s3_client *c, char *out, size_t len)
{
    fr_s3_cache_scope(&c->cfg, out, len);
}

void fr_s3_free(void *p) { free(p); }

int fr_s3_describe(char *out, size_t len) { return fr_s3_curl_probe(out, len); }
