/*
 * ListObjectsV2 walks in C: many listings in flight on one libcurl multi
 * handle (the "directories", common prefixes of delimiter "/", listed in
 * parallel; the pages of one prefix follow each other, as S3's
 * continuation tokens require), each answer parsed by libexpat as its
 * bytes arrive, the keys kept as one blob and offsets (no object per key).
 * The same settings, signing and retries as the s3 engine and client
 * (fr_s3_config_resolve over engine_args). Plain C types only: the Cython
 * adapter (src/fastread/_cs3.pxd) declares this header.
 *
 * Built only where libexpat is (FASTREAD_HAVE_EXPAT): without it
 * fr_s3_list returns -ENOTSUP and fastread.s3 lists in Python.
 *
 * Thread safety: fr_s3_list keeps all its state in its call; calls on
 * several threads share nothing. A listing belongs to its caller.
 */
#ifndef FASTREAD_S3_LIST_H
#define FASTREAD_S3_LIST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A string table: string i is blob[off[i] .. off[i + 1]), n + 1 offsets.
 * Not NUL-terminated (a key may hold any byte but NUL). */
typedef struct fr_s3_strings {
    char *blob;
    uint64_t *off;
    size_t n, blob_len, blob_cap, off_cap;
} fr_s3_strings;

typedef struct fr_s3_listing {
    /* Every object found, in the order their pages arrived (not sorted),
     * keys decoded (URL and XML encodings undone); ETags as listed. */
    fr_s3_strings keys, etags;
    int64_t *sizes;
    size_t sizes_cap;
    /* Common prefixes max_depth levels below the prefix: seen, not listed. */
    fr_s3_strings left;
    long requests, retries;
    long long bytes; /* response bytes received */
    int inflight_max;
} fr_s3_listing;

/* Lists `prefix` of `bucket` into *out (zeroed first; free with
 * fr_s3_listing_free, also after a failure). delimiter 0: one flat walk,
 * page after page, every key under the prefix. delimiter 1: the prefix
 * listed with delimiter "/" and every common prefix found listed the same
 * way, up to `inflight` listings at once; those max_depth or more levels
 * below the prefix (counting '/') go to out->left instead (max_depth < 0:
 * none). 0, or -errno with err naming s3://bucket/prefix and the HTTP
 * status and S3 error code; -ENOTSUP without libexpat. Never a secret in
 * err. */
int fr_s3_list(const char *engine_args, const char *bucket, const char *prefix, int delimiter,
               int max_depth, int inflight, fr_s3_listing *out, char *err, size_t err_len);
void fr_s3_listing_free(fr_s3_listing *l);

/* 1 where this build lists in C (libexpat), else 0. */
int fr_s3_list_native(void);

/* Parses one whole ListObjectsV2 answer into *out as fr_s3_list would
 * (for tests and fuzzing: no I/O). Appends the page's common prefixes to
 * *prefixes. *truncated and the continuation token (token_len bytes with
 * its NUL) say whether more pages follow. 0 or -EIO with why in err. */
int fr_s3_list_parse(const char *body, size_t len, fr_s3_listing *out, fr_s3_strings *prefixes,
                     int *truncated, char *token, size_t token_len, char *err, size_t err_len);
void fr_s3_strings_free(fr_s3_strings *s);

#ifdef __cplusplus
}
#endif

#endif
