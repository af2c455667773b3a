/*
 * One S3 request at a time, for what the engine does not do: ListObjectsV2
 * (a GET of the bucket with a query), PUT uploads, and ranged GETs that may
 * run past an object's end (a tar header walk: the engine's ranges must lie
 * inside the object). The same settings
 * as the s3 engine (fr_s3_config_resolve over engine_args, the AWS
 * environment and files), the same signing (libcurl's SigV4) and retries.
 * Plain C types only: the Cython adapter (src/fastread/_cs3.pxd) declares
 * this header.
 *
 * Thread safety: a client is used by one thread at a time; clients share
 * nothing.
 */
#ifndef FASTREAD_S3_CLIENT_H
#define FASTREAD_S3_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_s3_client fr_s3_client;

/* 0, or -errno with why in err (a bad engine_args key or value, no
 * credentials, libcurl missing or too old). Never echoes a secret. */
int fr_s3_client_open(const char *engine_args, fr_s3_client **out, char *err, size_t err_len);
void fr_s3_client_close(fr_s3_client *c);

/* One request: method "GET" or "PUT", of `key` (encoded here; "" for the
 * bucket itself) in `bucket`, with `query` appended as it is (NULL or "":
 * none; it must be canonical for SigV4: parameters sorted by name, names
 * and values URI-encoded, '=' after each name). A PUT sends body[0..
 * body_len). Retried like the engine's GETs (5xx, resets, timeouts).
 * Returns the final HTTP status (> 0), with the response body in *resp
 * (malloc'ed, NUL-terminated, *resp_len bytes; free with fr_s3_free) and,
 * for statuses >= 300, "STATUS CODE" (S3's error code) in err; or -errno
 * when no response came (err says why). */
long fr_s3_client_request(fr_s3_client *c, const char *method, const char *bucket,
                          const char *key, const char *query, const void *body, size_t body_len,
                          char **resp, size_t *resp_len, char *err, size_t err_len);

/* A GET of bytes [first, first + len) of `key` (len > 0), retried as
 * fr_s3_client_request. Returns the HTTP status: 206 with the bytes in
 * *resp (fewer than len where the object ends inside the range) and the
 * object's size in *total; 416 (the range starts at or past the end) with
 * *resp_len 0 and *total the size where the server said it (0 for a
 * refused range from byte 0, said or not: only an empty object refuses
 * it); 200 (a server
 * that ignores Range; only accepted for first == 0) with at most len bytes
 * and *total the object's size; other statuses as fr_s3_client_request
 * (*total UINT64_MAX). -EIO when a 206 is not the range asked for (err
 * says what came). Free *resp with fr_s3_free. */
long fr_s3_client_get_range(fr_s3_client *c, const char *bucket, const char *key,
                            uint64_t first, uint64_t len, char **resp, size_t *resp_len,
                            uint64_t *total, char *err, size_t err_len);

/* fr_s3_client_get_range's judgement of a response to a GET of bytes
 * [first, first + len) with HTTP status `code`, Content-Range
 * `content_range` ("" or NULL: none) and *resp_len body bytes: NULL when
 * it is what the call returns (*total and *resp_len set as it says), else
 * what the server did wrong. Pure: no I/O. */
const char *fr_s3_client_check_range(long code, const char *content_range, uint64_t first,
                                     uint64_t len, size_t *resp_len, uint64_t *total);

/* Requests made and retried by this client so far, and the response bytes
 * it received (bodies of every attempt, error answers included). */
long fr_s3_client_requests(const fr_s3_client *c);
long long fr_s3_client_bytes(const fr_s3_client *c);
long fr_s3_client_retries(const fr_s3_client *c);
/* The object cache's scope of this client's requests (fr_s3_cache_scope):
 * that of the s3 engine opened with the same engine_args. */
void fr_s3_client_cache_scope(const fr_s3_client *c, char *out, size_t len);

void fr_s3_free(void *p);

/* What libcurl this build runs on, and whether it serves the s3 engine: 0
 * and the description, or -errno and why not (fr_s3_curl_probe). */
int fr_s3_describe(char *out, size_t len);

#ifdef __cplusplus
}
#endif

#endif
