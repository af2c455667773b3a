/*
 * How the s3 engine reaches a bucket: its settings (engine_args, then the
 * AWS environment variables, then the shared config and credentials files,
 * as the AWS SDKs resolve them), s3:// URLs, SigV4's URI encoding, the
 * object URLs it builds (path-style or virtual-hosted), and the pieces of
 * an HTTP exchange it judges (Content-Range, S3's XML error code, which
 * statuses are retried, the backoff between retries).
 *
 * No curl and no I/O beyond reading the two AWS files: everything here is
 * tested without a server (csrc/tests/test_s3_config.c). Secrets
 * (secret_access_key, session_token) never appear in an error message.
 *
 * Reentrant: thread-safe as long as nobody changes the environment
 * (setenv) meanwhile, which getenv() needs anyway.
 */
#ifndef FASTREAD_S3_CONFIG_H
#define FASTREAD_S3_CONFIG_H

#include <stddef.h>
#include <stdint.h>

enum { FR_S3_ADDR_PATH, FR_S3_ADDR_VIRTUAL, FR_S3_ADDR_AUTO };

/* Longest object key S3 allows, in bytes (UTF-8). */
#define FR_S3_KEY_MAX 1024
/* Bucket names are 3..63 characters on AWS; other servers (and AWS's
 * legacy us-east-1 buckets) allow up to 255. */
#define FR_S3_BUCKET_MAX 255

/* Defaults of the tuning keys (see fr_s3_config). */
#define FR_S3_INFLIGHT 128
#define FR_S3_PART_SIZE (8ll << 20)
#define FR_S3_RETRIES 5
#define FR_S3_DEADLINE_MS 60000
#define FR_S3_CONNECT_TIMEOUT_MS 5000
#define FR_S3_LOW_SPEED_TIME_S 15
/* Backoff before retry k (1-based): uniform in [c/2, c] where c is
 * FR_S3_BACKOFF_BASE_MS * 2^(k-1), at most FR_S3_BACKOFF_CAP_MS ("equal
 * jitter": never zero, so a server that sheds load gets a pause; spread, so
 * the 128 requests of a batch do not come back at once). */
#define FR_S3_BACKOFF_BASE_MS 100u
#define FR_S3_BACKOFF_CAP_MS 5000u

typedef struct fr_s3_config {
    char endpoint[512];  /* scheme://host[:port], no trailing '/' */
    char region[64];
    int addressing;      /* FR_S3_ADDR_*; auto is decided per bucket (fr_s3_object_url) */
    int endpoint_is_aws; /* the endpoint is AWS's own (*.amazonaws.com) */
    int unsigned_requests; /* unsigned=1: anonymous requests, no credentials looked up */
    int verify;          /* verify=0 turns TLS certificate checks off */
    char ca_bundle[1024];
    char profile[128];
    char access_key_id[128];
    char secret_access_key[256]; /* secret */
    char session_token[4096];    /* secret */
    /* Where each setting came from, for messages (never a value of a secret). */
    char credentials_from[160];
    long long inflight;          /* requests in flight per context, 1..1024 */
    long long part_size;         /* bytes per ranged GET of a large object */
    long long retries;           /* attempts per request after the first, 0..20 */
    long long deadline_ms;       /* per request, all its attempts together */
    long long connect_timeout_ms;
    long long low_speed_time_s;  /* a transfer below 1 byte/s this long fails (and is retried) */
} fr_s3_config;

/* Looks up an environment variable (getenv by default). */
typedef const char *(*fr_s3_getenv_fn)(const char *name, void *arg);

/* Fills `cfg` from engine_args (keys: endpoint, region, addressing,
 * profile, unsigned, verify, ca_bundle, access_key_id, secret_access_key,
 * session_token, inflight, part_size, retries, deadline_ms,
 * connect_timeout_ms, low_speed_time_s), then what they leave out from the
 * environment (`getenv_fn` NULL: getenv) and the AWS files:
 *   endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
 *     endpoint_url, else https://s3.REGION.amazonaws.com;
 *   region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, us-east-1;
 *   credentials (unless unsigned=1): access_key_id + secret_access_key
 *     (+ session_token) given, else AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY
 *     (+ AWS_SESSION_TOKEN) unless profile= was given, else the profile's
 *     section of the credentials file (AWS_SHARED_CREDENTIALS_FILE or
 *     ~/.aws/credentials), else of the config file (AWS_CONFIG_FILE or
 *     ~/.aws/config, "[profile NAME]" or "[default]");
 *   profile: profile=, AWS_PROFILE, "default".
 * 0; -EINVAL (a bad key or value, a profile named but absent); -EACCES
 * (no credentials found); -errno of a file that exists but cannot be
 * read. Why in err, naming the key, variable or file, never a secret. */
int fr_s3_config_resolve(const char *engine_args, fr_s3_getenv_fn getenv_fn, void *env_arg,
                         fr_s3_config *cfg, char *err, size_t err_len);

/* Splits "s3://bucket/key": the bucket into `bucket` (FR_S3_BUCKET_MAX + 1
 * bytes) and *key pointing into url after the bucket's '/' ("" when the URL
 * has none). 0, or -EINVAL with why in err. */
int fr_s3_parse_url(const char *url, char *bucket, const char **key, char *err, size_t err_len);

/* 1 if `path` is an s3:// URL. */
int fr_s3_is_url(const char *path);

/* The object cache's scope of cfg's requests (fr_engine.cache_scope): its
 * endpoint, and who asks: a hash of the access key id, or "unsigned".
 * Never the key id itself nor any secret. */
void fr_s3_cache_scope(const fr_s3_config *cfg, char *out, size_t len);

/* SigV4's URI encoding (AWS "UriEncode"): every byte but A-Z a-z 0-9 - . _ ~
 * as %XX (upper-case hex), and '/' too unless keep_slash. Writes at most
 * out_len bytes including the NUL; returns the length the encoding needs
 * (excluding the NUL): the output is whole only if that is < out_len. */
size_t fr_s3_uri_encode(const char *in, int keep_slash, char *out, size_t out_len);

/* The http(s) URL of `key` in `bucket` (key encoded here, '/' kept),
 * followed by "?query" when query is not NULL or "" (query must already be
 * canonical: sorted, encoded). Path-style: ENDPOINT/bucket/key; virtual:
 * scheme://bucket.host[:port]/key; auto: virtual for AWS's own endpoints
 * and buckets that are DNS names without dots, else path-style. Returns
 * the length, or -ENAMETOOLONG if out_len is too small. */
int fr_s3_object_url(const fr_s3_config *cfg, const char *bucket, const char *key,
                     const char *query, char *out, size_t out_len);

/* Parses a Content-Range value: "bytes FIRST-LAST/TOTAL" (TOTAL may be
 * '*': *total = UINT64_MAX) or "bytes * /TOTAL" (unsatisfied: *first =
 * *last = UINT64_MAX). 0, or -1 if malformed. */
int fr_s3_parse_content_range(const char *v, uint64_t *first, uint64_t *last, uint64_t *total);

/* S3's error code from an XML error body (<Error><Code>X</Code>), at most
 * out_len - 1 printable characters; "" if there is none. */
void fr_s3_error_code(const char *body, size_t len, char *out, size_t out_len);

/* -errno for a final HTTP status: 404 -ENOENT, 401/403 -EACCES, 416
 * -ENODATA (a range past the object's end), 412 -ESTALE (the object
 * changed), others -EIO. */
int fr_s3_status_errno(long status);
/* 1 for statuses worth another attempt: 500, 502, 503, 504. */
int fr_s3_status_retryable(long status);

/* Milliseconds to wait before retry `attempt` (1-based); see
 * FR_S3_BACKOFF_*. `rng` is the caller's PRNG state (splitmix64). */
unsigned fr_s3_backoff_ms(unsigned attempt, uint64_t *rng);

#endif
