/* ListObjectsV2 walks on one multi handle, answers parsed by libexpat as
 * they arrive: see s3_list.h. */
/* clock_gettime, nanosleep: POSIX, which -std=c11 hides. */
#define _POSIX_C_SOURCE 200809L
#include "engines/s3/s3_list.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"

void fr_s3_strings_free(fr_s3_strings *s)
{
    free(s->blob);
    free(s->off);
    memset(s, 0, sizeof(*s));
}

void fr_s3_listing_free(fr_s3_listing *l)
{
    fr_s3_strings_free(&l->keys);
    fr_s3_strings_free(&l->etags);
    fr_s3_strings_free(&l->left);
    free(l->sizes);
    memset(l, 0, sizeof(*l));
}

#ifndef FASTREAD_HAVE_EXPAT

int fr_s3_list_native(void) { return 0; }

int fr_s3_list(const char *engine_args, const char *bucket, const char *prefix, int delimiter,
               int max_depth, int inflight, fr_s3_listing *out, char *err, size_t err_len)
{
    (void)engine_args, (void)delimiter, (void)max_depth, (void)inflight;
    memset(out, 0, sizeof(*out));
    fr_set_err(err, err_len, "s3://%.64s/%.120s: listing in C needs libexpat, not in this build",
               bucket, prefix);
    return -ENOTSUP;
}

int fr_s3_list_parse(const char *body, size_t len, fr_s3_listing *out, fr_s3_strings *prefixes,
                     int *truncated, char *token, size_t token_len, char *err, size_t err_len)
{
    (void)body, (void)len, (void)out, (void)prefixes, (void)truncated, (void)token,
        (void)token_len;
    fr_set_err(err, err_len, "s3: listing in C needs libexpat, not in this build");
    return -ENOTSUP;
}

#else

#include <curl/curl.h>
#include <expat.h>
#include <time.h>

#include "engines/s3/s3_config.h"
#include "engines/s3/s3_http.h"

int fr_s3_list_native(void) { return 1; }

/* A continuation token's most bytes (S3's are ~100-300; SeaweedFS's keys). */
#define TOKEN_MAX 4096

static int strings_push(fr_s3_strings *s, const char *p, size_t n)
{
    if (s->n + 2 > s->off_cap) {
        size_t cap = s->off_cap ? 2 * s->off_cap : 1024;
        uint64_t *o = realloc(s->off, cap * sizeof(*o));
        if (!o)
            return -ENOMEM;
        s->off = o;
        s->off_cap = cap;
    }
    if (fr_grow((void **)&s->blob, &s->blob_cap, s->blob_len + n, 1, 16384))
        return -ENOMEM;
    if (s->n == 0)
        s->off[0] = 0;
    if (n)
        memcpy(s->blob + s->blob_len, p, n);
    s->blob_len += n;
    s->off[++s->n] = s->blob_len;
    return 0;
}

static void strings_clear(fr_s3_strings *s)
{
    s->n = 0;
    s->blob_len = 0;
}

static const char *str_at(const fr_s3_strings *s, size_t i, size_t *len)
{
    *len = (size_t)(s->off[i + 1] - s->off[i]);
    return s->blob + s->off[i];
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Undoes S3's encoding-type=url (form encoding: '+' a space, %XX a byte)
 * of every string of s, in place (never longer than encoded). */
static void url_decode_all(fr_s3_strings *s)
{
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t r = (size_t)s->off[i], end = (size_t)s->off[i + 1];
        s->off[i] = w;
        while (r < end) {
            char c = s->blob[r];
            int hi, lo;
            if (c == '+') {
                s->blob[w++] = ' ';
                r++;
            } else if (c == '%' && r + 2 < end && (hi = hexval(s->blob[r + 1])) >= 0 &&
                       (lo = hexval(s->blob[r + 2])) >= 0) {
                s->blob[w++] = (char)(hi * 16 + lo);
                r += 3;
            } else {
                s->blob[w++] = c;
                r++;
            }
        }
    }
    if (s->n)
        s->off[s->n] = w;
    s->blob_len = w;
}

/* ------------------------------------------------------------ one page */

enum field { F_NONE, F_KEY, F_SIZE, F_ETAG, F_PREFIX, F_TRUNC, F_TOKEN, F_ENC };

/* One answer being parsed: its objects and common prefixes staged here
 * and added to the listing only when the whole page has been judged good
 * (a retried page must not leave half its keys behind). */
typedef struct page {
    XML_Parser xp;
    int depth, in_contents, in_common, root_ok, bad, encoded, truncated;
    int field;
    fr_s3_strings keys, etags, prefixes;
    int64_t *sizes;
    size_t sizes_cap;
    char *text;
    size_t text_len, text_cap;
    int64_t size;
    int have_size;
    char key_done, etag_done;
    char token[TOKEN_MAX];
    char why[160];
} page;

static void page_fail(page *pg, const char *why)
{
    if (!pg->bad) {
        pg->bad = 1;
        fr_set_err(pg->why, sizeof(pg->why), "%s", why);
    }
    XML_StopParser(pg->xp, XML_FALSE);
}

static void XMLCALL on_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
    (void)attrs;
    page *pg = ud;
    pg->depth++;
    pg->field = F_NONE;
    if (pg->depth == 1) {
        if (strcmp(name, "ListBucketResult") != 0)
            page_fail(pg, "the listing is not a ListObjectsV2 answer");
        pg->root_ok = 1;
    } else if (pg->depth == 2) {
        if (strcmp(name, "Contents") == 0) {
            pg->in_contents = 1;
            pg->have_size = 0;
            pg->size = 0;
            pg->key_done = pg->etag_done = 0;
            /* Key and ETag go to the staging tables as they end; an object
             * without one gets "" (pushed at </Contents>). */
        } else if (strcmp(name, "CommonPrefixes") == 0) {
            pg->in_common = 1;
        } else if (strcmp(name, "IsTruncated") == 0) {
            pg->field = F_TRUNC;
        } else if (strcmp(name, "NextContinuationToken") == 0) {
            pg->field = F_TOKEN;
        } else if (strcmp(name, "EncodingType") == 0) {
            pg->field = F_ENC;
        }
    } else if (pg->depth == 3 && pg->in_contents) {
        if (strcmp(name, "Key") == 0)
            pg->field = F_KEY;
        else if (strcmp(name, "Size") == 0)
            pg->field = F_SIZE;
        else if (strcmp(name, "ETag") == 0)
            pg->field = F_ETAG;
    } else if (pg->depth == 3 && pg->in_common && strcmp(name, "Prefix") == 0) {
        pg->field = F_PREFIX;
    }
    pg->text_len = 0;
}

static void XMLCALL on_text(void *ud, const XML_Char *s, int len)
{
    page *pg = ud;
    if (pg->field == F_NONE || len <= 0)
        return;
    size_t need = pg->text_len + (size_t)len + 1;
    if (need > pg->text_cap) {
        size_t cap = pg->text_cap ? pg->text_cap : 256;
        while (cap < need)
            cap *= 2;
        char *t = realloc(pg->text, cap);
        if (!t) {
            page_fail(pg, "out of memory");
            return;
        }
        pg->text = t;
        pg->text_cap = cap;
    }
    memcpy(pg->text + pg->text_len, s, (size_t)len);
    pg->text_len += (size_t)len;
    pg->text[pg->text_len] = 0;
}

static int text_is(const page *pg, const char *v)
{
    return pg->text_len == strlen(v) && memcmp(pg->text, v, pg->text_len) == 0;
}

static void XMLCALL on_end(void *ud, const XML_Char *name)
{
    (void)name;
    page *pg = ud;
    int rc = 0;
    if (pg->depth == 3 && pg->in_contents) {
        if (pg->field == F_KEY && !pg->key_done) {
            rc = strings_push(&pg->keys, pg->text, pg->text_len);
            pg->key_done = 1;
        } else if (pg->field == F_ETAG && !pg->etag_done) {
            rc = strings_push(&pg->etags, pg->text, pg->text_len);
            pg->etag_done = 1;
        } else if (pg->field == F_SIZE) {
            char *end;
            if (pg->text_len)
                pg->text[pg->text_len] = 0;
            long long v = pg->text_len ? strtoll(pg->text, &end, 10) : -1;
            if (!pg->text_len || *end || v < 0) {
                page_fail(pg, "an object's <Size> is not a number");
                return;
            }
            pg->size = v;
            pg->have_size = 1;
        }
    } else if (pg->depth == 3 && pg->in_common && pg->field == F_PREFIX) {
        rc = strings_push(&pg->prefixes, pg->text, pg->text_len);
    } else if (pg->depth == 2 && pg->in_contents) {
        pg->in_contents = 0;
        if (!pg->key_done)
            rc = strings_push(&pg->keys, "", 0);
        if (!rc && !pg->etag_done)
            rc = strings_push(&pg->etags, "", 0);
        if (!rc && pg->keys.n > pg->sizes_cap) {
            size_t cap = pg->sizes_cap ? 2 * pg->sizes_cap : 1024;
            int64_t *p = realloc(pg->sizes, cap * sizeof(*p));
            if (p) {
                pg->sizes = p;
                pg->sizes_cap = cap;
            } else {
                rc = -ENOMEM;
            }
        }
        if (!rc)
            pg->sizes[pg->keys.n - 1] = pg->size;
    } else if (pg->depth == 2 && pg->in_common) {
        pg->in_common = 0;
    } else if (pg->depth == 2 && pg->field == F_TRUNC) {
        pg->truncated = text_is(pg, "true");
    } else if (pg->depth == 2 && pg->field == F_TOKEN) {
        if (pg->text_len >= sizeof(pg->token)) {
            page_fail(pg, "a NextContinuationToken longer than 4,095 bytes");
            return;
        }
        memcpy(pg->token, pg->text, pg->text_len);
        pg->token[pg->text_len] = 0;
    } else if (pg->depth == 2 && pg->field == F_ENC) {
        pg->encoded = text_is(pg, "url");
    }
    if (rc)
        page_fail(pg, "out of memory");
    pg->field = F_NONE;
    pg->depth--;
}

/* A listing has no DTD: one (entity expansion) is refused outright. */
static void XMLCALL on_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                               const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    page_fail(ud, "a listing with a DOCTYPE");
}

/* Readies pg for a new answer: 0 or -ENOMEM. */
static int page_begin(page *pg)
{
    if (pg->xp) {
        if (!XML_ParserReset(pg->xp, NULL))
            return -ENOMEM;
    } else if (!(pg->xp = XML_ParserCreate(NULL))) {
        return -ENOMEM;
    }
    XML_SetUserData(pg->xp, pg);
    XML_SetElementHandler(pg->xp, on_start, on_end);
    XML_SetCharacterDataHandler(pg->xp, on_text);
    XML_SetStartDoctypeDeclHandler(pg->xp, on_doctype);
    pg->depth = pg->in_contents = pg->in_common = pg->root_ok = pg->bad = 0;
    pg->encoded = pg->truncated = 0;
    pg->field = F_NONE;
    pg->token[0] = 0;
    pg->why[0] = 0;
    strings_clear(&pg->keys);
    strings_clear(&pg->etags);
    strings_clear(&pg->prefixes);
    return 0;
}

static void page_free(page *pg)
{
    if (pg->xp)
        XML_ParserFree(pg->xp);
    fr_s3_strings_free(&pg->keys);
    fr_s3_strings_free(&pg->etags);
    fr_s3_strings_free(&pg->prefixes);
    free(pg->sizes);
    free(pg->text);
    memset(pg, 0, sizeof(*pg));
}

/* Feeds bytes of the answer (final: the end): 0, or -1 (pg->why says). */
static int page_feed(page *pg, const char *p, size_t n, int final)
{
    if (pg->bad)
        return -1;
    while (n > 0 || final) {
        int chunk = n > (1u << 30) ? (1 << 30) : (int)n;
        if (XML_Parse(pg->xp, p, chunk, final && (size_t)chunk == n) == XML_STATUS_ERROR) {
            if (!pg->bad) {
                pg->bad = 1;
                fr_set_err(pg->why, sizeof(pg->why), "the listing is not well-formed XML "
                           "(line %lu: %s)", (unsigned long)XML_GetCurrentLineNumber(pg->xp),
                           XML_ErrorString(XML_GetErrorCode(pg->xp)));
            }
            return -1;
        }
        p += chunk;
        n -= (size_t)chunk;
        if (n == 0)
            break;
    }
    return 0;
}

/* The page is whole: judged, decoded, and its objects added to out. */
static int page_commit(page *pg, fr_s3_listing *out)
{
    if (!pg->root_ok) {
        fr_set_err(pg->why, sizeof(pg->why), "the listing is not a ListObjectsV2 answer");
        return -EIO;
    }
    if (pg->truncated && !pg->token[0]) {
        fr_set_err(pg->why, sizeof(pg->why), "a truncated listing without a "
                   "NextContinuationToken");
        return -EIO;
    }
    if (pg->encoded) {
        url_decode_all(&pg->keys);
        url_decode_all(&pg->prefixes);
    }
    size_t n0 = out->keys.n;
    if (n0 + pg->keys.n > out->sizes_cap) {
        size_t cap = out->sizes_cap ? out->sizes_cap : 1024;
        while (cap < n0 + pg->keys.n)
            cap *= 2;
        int64_t *p = realloc(out->sizes, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        out->sizes = p;
        out->sizes_cap = cap;
    }
    for (size_t i = 0; i < pg->keys.n; i++) {
        size_t kl, el;
        const char *k = str_at(&pg->keys, i, &kl), *e = str_at(&pg->etags, i, &el);
        if (strings_push(&out->keys, k, kl) || strings_push(&out->etags, e, el))
            return -ENOMEM;
        out->sizes[n0 + i] = pg->sizes[i];
    }
    return 0;
}

int fr_s3_list_parse(const char *body, size_t len, fr_s3_listing *out, fr_s3_strings *prefixes,
                     int *truncated, char *token, size_t token_len, char *err, size_t err_len)
{
    page pg;
    memset(&pg, 0, sizeof(pg));
    int rc = page_begin(&pg);
    if (!rc && page_feed(&pg, body, len, 1))
        rc = -EIO;
    if (!rc)
        rc = page_commit(&pg, out);
    for (size_t i = 0; !rc && i < pg.prefixes.n; i++) {
        size_t l;
        const char *p = str_at(&pg.prefixes, i, &l);
        rc = strings_push(prefixes, p, l);
    }
    if (!rc) {
        *truncated = pg.truncated;
        fr_set_err(token, token_len, "%s", pg.token);
    } else {
        fr_set_err(err, err_len, "s3: %s", rc == -ENOMEM ? "out of memory" : pg.why);
    }
    page_free(&pg);
    return rc;
}

/* ------------------------------------------------------------ the walk */

/* One listing to make: a prefix, and the token of its next page. */
typedef struct task {
    char *prefix;
    char token[TOKEN_MAX];
    unsigned attempts;
    long long first_ms, not_before_ms;
    /* The server's last answer to a retried attempt (503 SlowDown) and its
     * S3 code: the error should a later attempt get none, so that
     * throttling does not read as a timeout. */
    long last_status;
    char last_code[64];
} task;

typedef struct xfer {
    CURL *easy;
    struct curl_slist *headers;
    fr_s3_resp_headers resp;
    task *t;
    page pg;
    int busy;
    char errbody[1024];
    size_t errlen;
    char errbuf[CURL_ERROR_SIZE];
} xfer;

typedef struct walk {
    fr_s3_config cfg;
    CURLM *multi;
    xfer *xf;
    size_t nxf, active;
    task **todo; /* listings waiting for a transfer (or their backoff) */
    size_t ntodo, todo_cap;
    const char *bucket;
    int delimiter, max_depth, base_depth;
    uint64_t rng;
    fr_s3_listing *out;
    char *url;
    size_t url_cap;
} walk;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    xfer *x = userdata;
    size_t n = size * nmemb;
    long code = 0;
    if (curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        return 0;
    if (code != 200) {
        size_t room = sizeof(x->errbody) - 1 - x->errlen;
        size_t w = n < room ? n : room;
        memcpy(x->errbody + x->errlen, ptr, w);
        x->errlen += w;
        x->errbody[x->errlen] = 0;
        return n;
    }
    /* Parsed as it arrives: no copy of the page is kept. */
    return page_feed(&x->pg, ptr, n, 0) ? 0 : n;
}

/* Queues t (a new task, a retry, a next page): 0 or -ENOMEM. */
static int todo_push(walk *w, task *t)
{
    if (w->ntodo == w->todo_cap) {
        size_t cap = w->todo_cap ? 2 * w->todo_cap : 64;
        task **p = realloc(w->todo, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        w->todo = p;
        w->todo_cap = cap;
    }
    w->todo[w->ntodo++] = t;
    return 0;
}

static int push_task(walk *w, const char *prefix, size_t len)
{
    task *t = calloc(1, sizeof(*t));
    if (!t || !(t->prefix = malloc(len + 1))) {
        free(t);
        return -ENOMEM;
    }
    memcpy(t->prefix, prefix, len);
    t->prefix[len] = 0;
    if (todo_push(w, t)) {
        free(t->prefix);
        free(t);
        return -ENOMEM;
    }
    return 0;
}

static void free_task(task *t)
{
    if (t) {
        free(t->prefix);
        free(t);
    }
}

/* Appends "name=ENCODED(value)" (and '&' before it unless first). */
static size_t query_param(char *out, size_t at, size_t cap, const char *name, const char *value)
{
    int w = snprintf(out + at, at < cap ? cap - at : 0, "%s%s=", at ? "&" : "", name);
    at += w > 0 ? (size_t)w : 0;
    at += fr_s3_uri_encode(value, 0, out + (at < cap ? at : cap), at < cap ? cap - at : 0);
    return at;
}

/* Starts task t on idle transfer x: 0 or -errno (err says why). */
static int start(walk *w, xfer *x, task *t, long long now, char *err, size_t err_len)
{
    if (t->attempts == 0)
        t->first_ms = now;
    long long left = t->first_ms + w->cfg.deadline_ms - now;
    if (left <= 0) {
        if (t->last_status) {
            fr_set_err(err, err_len, "s3://%.64s/%.120s: %ld %s (after %u attempts; "
                       "deadline_ms=%lld reached)", w->bucket, t->prefix, t->last_status,
                       t->last_code[0] ? t->last_code : "(no S3 error code)", t->attempts,
                       w->cfg.deadline_ms);
            return fr_s3_status_errno(t->last_status);
        }
        fr_set_err(err, err_len, "s3://%.64s/%.120s: no answer within deadline_ms=%lld",
                   w->bucket, t->prefix, w->cfg.deadline_ms);
        return -ETIMEDOUT;
    }
    /* The query, canonical for SigV4: sorted by name, encoded. */
    size_t qcap = 3 * (strlen(t->prefix) + strlen(t->token)) + 128;
    char *q = malloc(qcap);
    if (!q)
        return -ENOMEM;
    size_t at = 0;
    if (t->token[0])
        at = query_param(q, at, qcap, "continuation-token", t->token);
    if (w->delimiter)
        at = query_param(q, at, qcap, "delimiter", "/");
    at = query_param(q, at, qcap, "encoding-type", "url");
    at = query_param(q, at, qcap, "list-type", "2");
    at = query_param(q, at, qcap, "prefix", t->prefix);
    size_t need = sizeof(w->cfg.endpoint) + strlen(w->bucket) + at + 16;
    if (need > w->url_cap) {
        char *u = realloc(w->url, need);
        if (!u) {
            free(q);
            return -ENOMEM;
        }
        w->url = u;
        w->url_cap = need;
    }
    int uw = fr_s3_object_url(&w->cfg, w->bucket, "", q, w->url, w->url_cap);
    free(q);
    if (uw < 0) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: the listing's URL is too long", w->bucket,
                   t->prefix);
        return uw;
    }
    if (page_begin(&x->pg) || fr_s3_headers(&w->cfg, 0, 0, NULL, &x->headers))
        return -ENOMEM;
    x->t = t;
    x->errlen = 0;
    x->errbody[0] = 0;
    x->errbuf[0] = 0;
    x->resp.content_range[0] = x->resp.etag[0] = 0;
    CURLcode cc = curl_easy_setopt(x->easy, CURLOPT_URL, w->url); /* copied by libcurl */
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(x->easy, CURLOPT_HTTPGET, 1L);
    if (cc == CURLE_OK)
        cc = curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, (long)left);
    CURLMcode mc = cc == CURLE_OK ? curl_multi_add_handle(w->multi, x->easy) : CURLM_OK;
    if (cc != CURLE_OK || mc != CURLM_OK) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: the listing could not start: %s",
                   w->bucket, t->prefix,
                   cc != CURLE_OK ? curl_easy_strerror(cc) : curl_multi_strerror(mc));
        curl_slist_free_all(x->headers);
        x->headers = NULL;
        return -EIO;
    }
    x->busy = 1;
    w->active++;
    t->attempts++;
    w->out->requests++;
    if ((int)w->active > w->out->inflight_max)
        w->out->inflight_max = (int)w->active;
    return 0;
}

/* Task t tried again after its backoff, if attempts and time are left. */
static int retry_later(walk *w, task *t, long long now)
{
    if (t->attempts > (unsigned)w->cfg.retries)
        return 0;
    long long when = now + fr_s3_backoff_ms(t->attempts, &w->rng);
    if (when >= t->first_ms + w->cfg.deadline_ms)
        return 0;
    t->not_before_ms = when;
    if (todo_push(w, t))
        return 0; /* no memory to queue it: the failure stands */
    w->out->retries++;
    return 1;
}

static int depth_of(const char *p, size_t len)
{
    int d = 0;
    for (size_t i = 0; i < len; i++)
        d += p[i] == '/';
    return d;
}

/* Transfer x ended with curl's verdict cc: 0, or -errno (err says why). */
static int finish(walk *w, xfer *x, CURLcode cc, long long now, char *err, size_t err_len)
{
    task *t = x->t;
    long code = 0;
    if (curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        code = 0;
    curl_off_t got = 0;
    if (curl_easy_getinfo(x->easy, CURLINFO_SIZE_DOWNLOAD_T, &got) == CURLE_OK)
        w->out->bytes += got;
    CURLMcode mc = curl_multi_remove_handle(w->multi, x->easy);
    x->busy = 0;
    x->t = NULL;
    w->active--;
    curl_slist_free_all(x->headers);
    x->headers = NULL;
    int rc = 0;
    if (mc != CURLM_OK) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: libcurl: %s", w->bucket, t->prefix,
                   curl_multi_strerror(mc));
        rc = -EIO;
    } else if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && x->pg.bad)) {
        if (fr_s3_curl_retryable(cc) && retry_later(w, t, now))
            return 0;
        if (t->last_status) {
            fr_set_err(err, err_len, "s3://%.64s/%.120s: %ld %s (after %u attempts; the last: "
                       "%s)", w->bucket, t->prefix, t->last_status,
                       t->last_code[0] ? t->last_code : "(no S3 error code)", t->attempts,
                       curl_easy_strerror(cc));
            rc = fr_s3_status_errno(t->last_status);
        } else {
            fr_set_err(err, err_len, "s3://%.64s/%.120s: %s%s%.120s (%u attempts)", w->bucket,
                       t->prefix, curl_easy_strerror(cc), x->errbuf[0] ? ": " : "", x->errbuf,
                       t->attempts);
            rc = fr_s3_curl_errno(cc);
        }
    } else if (code != 200) {
        char s3code[64];
        fr_s3_error_code(x->errbody, x->errlen, s3code, sizeof(s3code));
        if (fr_s3_status_retryable(code) && retry_later(w, t, now)) {
            t->last_status = code;
            fr_set_err(t->last_code, sizeof(t->last_code), "%s", s3code);
            return 0;
        }
        fr_set_err(err, err_len, "s3://%.64s/%.120s: %ld %s", w->bucket, t->prefix, code,
                   s3code[0] ? s3code : "(no S3 error code)");
        rc = code ? fr_s3_status_errno(code) : -EIO;
    } else if (page_feed(&x->pg, NULL, 0, 1) || (rc = page_commit(&x->pg, w->out))) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: %s", w->bucket, t->prefix,
                   rc == -ENOMEM ? "out of memory" : x->pg.why);
        rc = rc ? rc : -EIO;
    }
    if (rc) {
        free_task(t);
        return rc;
    }
    /* Its common prefixes: listed next, or left at the depth limit. */
    for (size_t i = 0; i < x->pg.prefixes.n; i++) {
        size_t l;
        const char *p = str_at(&x->pg.prefixes, i, &l);
        if (w->max_depth >= 0 && depth_of(p, l) - w->base_depth >= w->max_depth)
            rc = strings_push(&w->out->left, p, l);
        else
            rc = push_task(w, p, l);
        if (rc) {
            fr_set_err(err, err_len, "s3://%.64s/%.120s: out of memory", w->bucket, t->prefix);
            free_task(t);
            return rc;
        }
    }
    if (x->pg.truncated) { /* the next page of the same prefix */
        memcpy(t->token, x->pg.token, sizeof(t->token));
        t->attempts = 0;
        t->last_status = 0;
        t->last_code[0] = 0;
        t->not_before_ms = 0;
        if (todo_push(w, t)) {
            free_task(t);
            fr_set_err(err, err_len, "s3://%.64s: out of memory", w->bucket);
            return -ENOMEM;
        }
        return 0;
    }
    free_task(t);
    return 0;
}

/* Takes the next task whose backoff is over; NULL if none. */
static task *next_ready(walk *w, long long now)
{
    for (size_t k = 0; k < w->ntodo; k++)
        if (w->todo[k]->not_before_ms <= now) {
            task *t = w->todo[k];
            /* Order kept (FIFO: the shallow prefixes first, as listed). */
            memmove(w->todo + k, w->todo + k + 1, (w->ntodo - k - 1) * sizeof(*w->todo));
            w->ntodo--;
            return t;
        }
    return NULL;
}

static void walk_close(walk *w)
{
    for (size_t i = 0; i < w->nxf; i++) {
        xfer *x = &w->xf[i];
        if (x->easy) {
            if (x->busy && w->multi) {
                curl_multi_remove_handle(w->multi, x->easy); /* best effort: it failed */
                free_task(x->t);
            }
            curl_easy_cleanup(x->easy);
        }
        curl_slist_free_all(x->headers);
        page_free(&x->pg);
    }
    if (w->multi)
        curl_multi_cleanup(w->multi);
    for (size_t k = 0; k < w->ntodo; k++)
        free_task(w->todo[k]);
    free(w->todo);
    free(w->xf);
    free(w->url);
    memset(&w->cfg, 0, sizeof(w->cfg)); /* no credentials left in freed memory */
}

static int walk_open(walk *w, const char *engine_args, int inflight, char *err, size_t err_len)
{
    int rc = fr_s3_config_resolve(engine_args, NULL, NULL, &w->cfg, err, err_len);
    if (rc)
        return rc;
    w->rng = (uint64_t)(uintptr_t)w ^ (uint64_t)now_ms();
    w->nxf = (size_t)inflight;
    if (!(w->xf = calloc(w->nxf, sizeof(*w->xf))) || !(w->multi = curl_multi_init()))
        return -ENOMEM;
    if (curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, (long)w->nxf) != CURLM_OK) {
        fr_set_err(err, err_len, "s3: libcurl refused CURLMOPT_MAXCONNECTS");
        return -EIO;
    }
    for (size_t i = 0; i < w->nxf; i++) {
        xfer *x = &w->xf[i];
        if (!(x->easy = curl_easy_init()))
            return -ENOMEM;
        CURLcode cc = fr_s3_easy_setup(x->easy, &w->cfg, x->errbuf);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, on_body);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(x->easy, CURLOPT_HEADERDATA, &x->resp);
        if (cc == CURLE_OK)
            cc = curl_easy_setopt(x->easy, CURLOPT_PRIVATE, x);
        if (cc != CURLE_OK) {
            fr_set_err(err, err_len, "s3: libcurl refused an option: %s", curl_easy_strerror(cc));
            return -EIO;
        }
    }
    return 0;
}

/* The walk's loop: until no task is left or one fails. */
static int walk_run(walk *w, char *err, size_t err_len)
{
    while (w->ntodo > 0 || w->active > 0) {
        long long now = now_ms();
        for (size_t i = 0; i < w->nxf && w->ntodo > 0; i++) {
            if (w->xf[i].busy)
                continue;
            task *t = next_ready(w, now);
            if (!t)
                break;
            int rc = start(w, &w->xf[i], t, now, err, err_len);
            if (rc) {
                free_task(t);
                return rc;
            }
        }
        if (w->active > 0) {
            int running;
            CURLMcode mc = curl_multi_perform(w->multi, &running);
            if (mc != CURLM_OK) {
                fr_set_err(err, err_len, "s3://%.64s: libcurl: %s", w->bucket,
                           curl_multi_strerror(mc));
                return -EIO;
            }
            CURLMsg *m;
            int left, finished = 0;
            now = now_ms();
            while ((m = curl_multi_info_read(w->multi, &left))) {
                if (m->msg != CURLMSG_DONE)
                    continue;
                xfer *x = NULL;
                if (curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x) != CURLE_OK ||
                    !x)
                    return -EIO;
                int rc = finish(w, x, m->data.result, now, err, err_len);
                if (rc)
                    return rc;
                finished++;
            }
            if (finished)
                continue; /* start the next listings before waiting */
        }
        /* Wait for the network, or for the earliest backoff to end. A task
         * that is ready but still queued waits for a transfer, which only
         * the network frees: it must not shorten the wait (a spin). */
        long long wait = 100;
        for (size_t k = 0; k < w->ntodo; k++) {
            long long d = w->todo[k]->not_before_ms - now;
            if (d > 0 && d < wait)
                wait = d;
        }
        if (w->active > 0) {
            if (curl_multi_poll(w->multi, NULL, 0, (int)wait, NULL) != CURLM_OK)
                return -EIO;
        } else if (wait > 0) {
            struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
            nanosleep(&ts, NULL); /* an early wake-up only loops once more */
        }
    }
    return 0;
}

int fr_s3_list(const char *engine_args, const char *bucket, const char *prefix, int delimiter,
               int max_depth, int inflight, fr_s3_listing *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    if (inflight < 1 || inflight > 1024) {
        fr_set_err(err, err_len, "s3://%.64s/%.120s: inflight must be 1-1024, got %d", bucket,
                   prefix, inflight);
        return -EINVAL;
    }
    int rc = fr_s3_curl_probe(err, err_len);
    if (rc || (rc = fr_s3_curl_init(err, err_len)))
        return rc;
    walk w;
    memset(&w, 0, sizeof(w));
    w.bucket = bucket;
    w.delimiter = delimiter != 0;
    w.max_depth = delimiter ? max_depth : -1;
    w.base_depth = depth_of(prefix, strlen(prefix));
    w.out = out;
    /* Without a delimiter one task walks it all: one listing at a time. */
    rc = walk_open(&w, engine_args, delimiter ? inflight : 1, err, err_len);
    if (rc && rc != -ENOMEM) { /* a setting: named with what was being listed */
        char why[512];
        fr_set_err(why, sizeof(why), "%s", err);
        fr_set_err(err, err_len, "s3://%.64s/%.120s: %s", bucket, prefix, why);
    }
    if (!rc)
        rc = push_task(&w, prefix, strlen(prefix));
    if (!rc)
        rc = walk_run(&w, err, err_len);
    if (rc == -ENOMEM)
        fr_set_err(err, err_len, "s3://%.64s/%.120s: out of memory listing it", bucket, prefix);
    walk_close(&w);
    fr_s3_curl_done();
    return rc;
}

#endif
