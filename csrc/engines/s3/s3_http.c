/* libcurl plumbing shared by the s3 engine and client: see s3_http.h. */
/* clock_gettime, nanosleep, strncasecmp: POSIX, which -std=c11 hides. */
#define _POSIX_C_SOURCE 200809L
#include "engines/s3/s3_http.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/base.h"
#include "fastread.h"

int fr_s3_curl_probe(char *why, size_t why_len)
{
    const curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);
    if (!v) {
        fr_set_err(why, why_len, "libcurl does not say what it is (curl_version_info)");
        return -ENOTSUP;
    }
    int http = 0, https = 0;
    for (const char *const *p = v->protocols; p && *p; p++) {
        http |= strcmp(*p, "http") == 0;
        https |= strcmp(*p, "https") == 0;
    }
    if (v->version_num < FR_S3_CURL_MIN || !http) {
        fr_set_err(why, why_len,
                   "libcurl %s is too old or lacks HTTP: the s3 engine needs 7.84 or later "
                   "(CURLOPT_AWS_SIGV4, thread-safe initialisation) with http",
                   v->version);
        return -ENOTSUP;
    }
    if (!(v->features & CURL_VERSION_THREADSAFE)) {
        fr_set_err(why, why_len, "libcurl %s was built without thread-safe initialisation",
                   v->version);
        return -ENOTSUP;
    }
    fr_set_err(why, why_len, "libcurl %s (%s; %s; SigV4 signing, HTTP/1.1 keep-alive%s%s)",
               v->version, v->ssl_version ? v->ssl_version : "no TLS",
               https ? "http and https" : "http only: no https",
               v->features & CURL_VERSION_HTTP2 ? ", HTTP/2 built in (unused)" : "",
               v->features & CURL_VERSION_ASYNCHDNS ? ", asynchronous DNS" : "");
    return 0;
}

int fr_s3_curl_init(char *err, size_t err_len)
{
    CURLcode cc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (cc != CURLE_OK) {
        fr_set_err(err, err_len, "s3: libcurl did not initialise: %s", curl_easy_strerror(cc));
        return -EIO;
    }
    return 0;
}

void fr_s3_curl_done(void) { curl_global_cleanup(); }

size_t fr_s3_on_header(char *buf, size_t size, size_t n, void *userdata)
{
    fr_s3_resp_headers *h = userdata;
    size_t len = size * n;
    if (len >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
        /* A new response (after a 100 Continue, or the next attempt). */
        h->content_range[0] = 0;
        h->etag[0] = 0;
        return len;
    }
    struct {
        const char *name;
        char *dst;
        size_t cap;
    } wanted[] = {
        {"content-range:", h->content_range, sizeof(h->content_range)},
        {"etag:", h->etag, sizeof(h->etag)},
    };
    for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        size_t nl = strlen(wanted[i].name);
        if (len < nl || strncasecmp(buf, wanted[i].name, nl) != 0)
            continue;
        const char *v = buf + nl;
        size_t vl = len - nl;
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        if (vl < wanted[i].cap) { /* a value too long to be ours is left out */
            memcpy(wanted[i].dst, v, vl);
            wanted[i].dst[vl] = 0;
        }
    }
    return len;
}

#define SET(opt, val)                                                                      \
    do {                                                                                   \
        CURLcode c_ = curl_easy_setopt(h, opt, val);                                       \
        if (c_ != CURLE_OK)                                                                \
            return c_;                                                                     \
    } while (0)

CURLcode fr_s3_easy_setup(CURL *h, const fr_s3_config *cfg, char *errbuf)
{
    SET(CURLOPT_ERRORBUFFER, errbuf);
    /* Signals are the application's (Python's); timeouts need none with
     * libcurl's threaded resolver, and without it NOSIGNAL only costs DNS
     * timeouts. */
    SET(CURLOPT_NOSIGNAL, 1L);
    /* One request per connection at a time, the connection kept for the
     * next: S3 serves HTTP/1.1, and many connections spread over its
     * front ends better than streams of one HTTP/2 connection. */
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_FOLLOWLOCATION, 0L); /* S3 redirects (wrong region) are errors to report */
    /* A key with "./" or "../" segments is a key, not a path to tidy. */
    SET(CURLOPT_PATH_AS_IS, 1L);
    SET(CURLOPT_USERAGENT, "fastread/" FR_VERSION);
    SET(CURLOPT_CONNECTTIMEOUT_MS, (long)cfg->connect_timeout_ms);
    /* A connection that stalls (below a byte a second for this long) fails
     * and is retried, rather than holding a batch until the deadline. */
    SET(CURLOPT_LOW_SPEED_LIMIT, 1L);
    SET(CURLOPT_LOW_SPEED_TIME, (long)cfg->low_speed_time_s);
    /* Fewer, larger reads from the socket for large objects than the 16 KiB
     * default; a buffer per easy handle, so 64 KiB keeps a context of 128
     * requests in flight at 8 MiB of them. */
    SET(CURLOPT_BUFFERSIZE, (long)FR_S3_RECV_BUFFER);
    SET(CURLOPT_SSL_VERIFYPEER, cfg->verify ? 1L : 0L);
    SET(CURLOPT_SSL_VERIFYHOST, cfg->verify ? 2L : 0L);
    if (cfg->ca_bundle[0])
        SET(CURLOPT_CAINFO, cfg->ca_bundle);
    SET(CURLOPT_HEADERFUNCTION, fr_s3_on_header);
    if (!cfg->unsigned_requests) {
        char sigv4[96];
        snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:s3", cfg->region);
        SET(CURLOPT_AWS_SIGV4, sigv4); /* libcurl copies string options */
        /* USERNAME and PASSWORD apart: a ':' in either stays what it is. */
        SET(CURLOPT_USERNAME, cfg->access_key_id);
        SET(CURLOPT_PASSWORD, cfg->secret_access_key);
    }
    return CURLE_OK;
}

#undef SET

int fr_s3_headers(const fr_s3_config *cfg, uint64_t range_first, uint64_t range_len,
                  const char *if_match, struct curl_slist **out)
{
    struct curl_slist *list = NULL, *next;
    char line[4200];
#define ADD(...)                                                                           \
    do {                                                                                   \
        snprintf(line, sizeof(line), __VA_ARGS__);                                         \
        if (!(next = curl_slist_append(list, line)))                                       \
            goto fail;                                                                     \
        list = next;                                                                       \
    } while (0)
    if (!cfg->unsigned_requests)
        ADD("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (cfg->session_token[0])
        ADD("x-amz-security-token: %s", cfg->session_token);
    if (range_len > 0)
        ADD("Range: bytes=%" PRIu64 "-%" PRIu64, range_first, range_first + range_len - 1);
    if (if_match && *if_match)
        ADD("If-Match: %s", if_match);
    /* A PUT keeps libcurl's "Expect: 100-continue": removing it with an
     * empty "Expect:" makes libcurl 7.88 sign a header it does not send
     * (SignatureDoesNotMatch); the round trip it costs is one per upload. */
#undef ADD
    memset(line, 0, sizeof(line)); /* it held the token */
    *out = list;
    return 0;
fail:
    memset(line, 0, sizeof(line));
    curl_slist_free_all(list);
    *out = NULL;
    return -ENOMEM;
}

int fr_s3_curl_errno(CURLcode cc)
{
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return -ECONNREFUSED;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    default:
        return -EIO;
    }
}

int fr_s3_curl_retryable(CURLcode cc)
{
    switch (cc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
        return 1;
    default:
        return 0;
    }
}
