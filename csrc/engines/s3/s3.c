/*
 * s3: objects of S3 (or an S3-compatible server) read over HTTP with
 * libcurl's multi interface, many requests in flight on one thread.
 *
 * A context owns one multi handle and `inflight` easy handles, kept from
 * call to call so their connections (HTTP/1.1 keep-alive, the multi
 * handle's connection cache) and TLS sessions are reused. A call is a list
 * of jobs, each one GET, run by fr_s3_run_jobs: up to `inflight` at once, each
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
 * This file: open/close, each read turned into jobs and a layout, and
 * diagnostics; the job loop is s3_jobs.c (s3_engine.h: what they share).
 *
 * Thread safety: as its context (fastread.h), one thread at a time; no
 * handle, buffer or counter is shared with another context. The one
 * process-wide call, curl_global_init, is reference counted and
 * thread-safe in the libcurl versions the probe accepts.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engines/engine.h"
#include "engines/io_common.h"
#include "engines/range_io.h"
#include "engines/s3/s3_config.h"
#include "engines/s3/s3_engine.h"
#include "engines/s3/s3_http.h"

/* ------------------------------------------------------------- open/close */

static int s3_probe(char *why, size_t why_len) { return fr_s3_curl_probe(why, why_len); }

static void s3_close(void *state)
{
    s3_engine *s = state;
    if (!s)
        return;
    for (size_t i = 0; s->xfers && i < s->nxfers; i++) { /* xfers: NULL if its calloc failed */
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
    s->rng = (uint64_t)(uintptr_t)s ^ (uint64_t)fr_s3_now_ms();
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
            cc = curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, fr_s3_on_body);
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

/* Readies the engine for a call of n samples. */
static int begin_call(s3_engine *s, fr_batch *batch, size_t n)
{
    if (n > s->samples_cap) {
        size_t old = s->samples_cap, cap = old;
        if (fr_s3_grow((void **)&s->samples, &cap, n, sizeof(*s->samples)))
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
        fr_s3_note(s, i, "%s", why);
        return 0;
    }
    if (need_key && !*key) {
        fr_s3_fail_sample(s, i, -EINVAL, "no object key after the bucket");
        return 0;
    }
    /* Encoding at most triples a key's bytes. */
    size_t need = sizeof(s->cfg.endpoint) + strlen(bucket) + 3 * strlen(key) + 8;
    if (fr_s3_grow((void **)&s->urls, &s->urls_cap, s->urls_len + need, 1))
        return -ENOMEM;
    int w = fr_s3_object_url(&s->cfg, bucket, key, NULL, s->urls + s->urls_len, need);
    if (w < 0) {
        fr_s3_fail_sample(s, i, -ENAMETOOLONG, "its URL is too long");
        return 0;
    }
    sm->http_off = s->urls_len;
    s->urls_len += (size_t)w + 1;
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
    fr_s3_clear_jobs(s);
    uint64_t probe = (uint64_t)s->cfg.part_size < PROBE_MAX ? (uint64_t)s->cfg.part_size
                                                             : PROBE_MAX;
    for (size_t q = 0; q < k; q++) {
        s3_sample *sm = &s->samples[list[q]];
        sm->size = -1;
        sm->repair = 0;
        sm->etag[0] = 0;
        if (!sm->err && fr_s3_add_job(s, JOB_PROBE, list[q], 0, probe, 0))
            return -ENOMEM;
    }
    int rc = fr_s3_run_jobs(s);
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
    fr_s3_clear_jobs(s);
    for (size_t q = 0; q < k; q++) {
        s3_sample *sm = &s->samples[list[q]];
        if (sm->err)
            continue;
        uint64_t have = sm->buf_len < (uint64_t)sm->size ? sm->buf_len : (uint64_t)sm->size;
        if (have)
            memcpy(s->batch->arena.base + s->batch->samples[list[q]].offset, sm->buf, have);
        if ((uint64_t)sm->size > have &&
            fr_s3_add_parts(s, JOB_PART, list[q], have, (uint64_t)sm->size - have, have))
            return -ENOMEM;
    }
    s->strict = 1; /* sized just now: another size means another object */
    rc = fr_s3_run_jobs(s);
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
        fr_s3_clear_jobs(s);
        for (size_t i = 0; i < n; i++) {
            if (s->samples[i].err || size_hints[i] < 0)
                continue;
            s->samples[i].size = size_hints[i];
            if (fr_s3_add_parts(s, JOB_PART, i, 0, (uint64_t)size_hints[i], 0))
                return -ENOMEM;
        }
        if ((rc = fr_s3_run_jobs(s)))
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
    fr_s3_clear_jobs(s);
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
            fr_s3_note(s, i, "%s", why);
        }
        if (batch->samples[i].length < 0 && !sm->err)
            fr_s3_fail_sample(s, i, (int)batch->samples[i].length,
                        "range %zu (offset %" PRIu64 ", %" PRIu64 " bytes) overflows", i,
                        ranges[i].offset, ranges[i].length);
        if (!sm->err && fr_s3_add_parts(s, JOB_RANGE, i, ranges[i].offset, ranges[i].length, 0))
            return -ENOMEM;
    }
    if ((rc = fr_s3_run_jobs(s)))
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
    fr_s3_clear_jobs(s);
    size_t last = SIZE_MAX; /* the sample whose URL the next one of its object shares */
    for (size_t i = 0; i < n; i++) {
        s3_sample *sm = &s->samples[i];
        if (jobs[i].file >= npaths) {
            sm->url = "(no object)";
            fr_s3_fail_sample(s, i, -EINVAL, "file index %" PRIu32 " of %zu objects", jobs[i].file,
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
            fr_s3_fail_sample(s, i, (int)batch->samples[i].length,
                        "range %zu (offset %" PRIu64 ", %" PRIu64 " bytes) overflows", i,
                        jobs[i].offset, jobs[i].length);
        if (!sm->err && fr_s3_add_parts(s, JOB_RANGE, i, jobs[i].offset, jobs[i].length, 0))
            return -ENOMEM;
    }
    if ((rc = fr_s3_run_jobs(s)))
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
