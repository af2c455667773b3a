/*
 * What the s3 engine and the s3 client share of libcurl: the probe, the
 * options every request of a configuration takes (SigV4 through libcurl's
 * CURLOPT_AWS_SIGV4, timeouts, TLS, HTTP/1.1 keep-alive), the request
 * headers, the response headers we judge, and how curl's errors map to
 * errno and retries. Internal to csrc/engines/s3.
 *
 * Thread-safe: nothing here keeps state; each easy handle belongs to its
 * caller. curl_global_init is called (reference counted by libcurl, and
 * thread-safe in the libcurl versions fr_s3_curl_probe accepts) by whoever
 * opens handles: fr_s3_curl_init / fr_s3_curl_done.
 */
#ifndef FASTREAD_S3_HTTP_H
#define FASTREAD_S3_HTTP_H

#include <curl/curl.h>

#include "engines/s3/s3_config.h"

/* The oldest libcurl with CURLOPT_AWS_SIGV4 (7.75.0) and a thread-safe
 * curl_global_init (7.84.0): the later of the two. */
#define FR_S3_CURL_MIN 0x075400
/* libcurl's receive buffer per transfer (CURLOPT_BUFFERSIZE). */
#define FR_S3_RECV_BUFFER (64u * 1024u)

/* 0 if the libcurl loaded can serve the engine, and what it is in `why`
 * ("libcurl 7.88.1 (OpenSSL/3.0.17; http https; sigv4, keep-alive)");
 * else -ENOTSUP and why not. */
int fr_s3_curl_probe(char *why, size_t why_len);

/* curl_global_init (reference counted by libcurl); 0 or -EIO with why. */
int fr_s3_curl_init(char *err, size_t err_len);
void fr_s3_curl_done(void);

/* A response's headers the engine judges (captured by fr_s3_on_header). */
typedef struct fr_s3_resp_headers {
    char content_range[96];
    char etag[128];
} fr_s3_resp_headers;

/* CURLOPT_HEADERFUNCTION for userdata = fr_s3_resp_headers *: keeps
 * Content-Range and ETag of the last response (a retry's or an interim
 * 100's headers start over at each status line). */
size_t fr_s3_on_header(char *buf, size_t size, size_t n, void *userdata);

/* The options every request of `cfg` takes, set once on an easy handle
 * (kept across requests: libcurl reuses its connection). errbuf:
 * CURL_ERROR_SIZE bytes for CURLOPT_ERRORBUFFER. CURLE_OK or the first
 * option refused. */
CURLcode fr_s3_easy_setup(CURL *h, const fr_s3_config *cfg, char *errbuf);

/* The headers of one request: x-amz-content-sha256 (UNSIGNED-PAYLOAD: the
 * body is not hashed, which S3 accepts for any request; libcurl 7.88 signs
 * the value given here), x-amz-security-token with a session token,
 * "Range: bytes=FIRST-LAST" when range_len > 0, If-Match when if_match is
 * not NULL or "". 0 and the list in *out (NULL when a request needs no
 * header: unsigned, whole), or -ENOMEM. Free with curl_slist_free_all. */
int fr_s3_headers(const fr_s3_config *cfg, uint64_t range_first, uint64_t range_len,
                  const char *if_match, struct curl_slist **out);

/* -errno for a failed transfer: timeouts -ETIMEDOUT, refused or unreachable
 * connections -ECONNREFUSED, out of memory -ENOMEM, the rest -EIO. */
int fr_s3_curl_errno(CURLcode cc);
/* 1 for transfer failures worth another attempt: connection failures and
 * resets, timeouts, an empty or cut response. */
int fr_s3_curl_retryable(CURLcode cc);

#endif
