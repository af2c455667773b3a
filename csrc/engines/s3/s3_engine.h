/*
 * What the s3 engine's two files share (internal to csrc/engines/s3): the
 * engine's state (s3_engine: the multi handle, its transfers, the call in
 * progress), the jobs a call is made of, and the job loop that runs them.
 * s3.c opens and closes the engine and turns each read (files, ranges,
 * ranges of many objects) into jobs and a layout; s3_jobs.c runs the jobs
 * on the multi handle and judges every response. s3_jobs.c calls nothing of
 * s3.c.
 *
 * Thread safety: as its context (fastread.h), one thread at a time, but
 * s3_engine.cancelled, which s3_cancel sets from any thread.
 */
#ifndef FASTREAD_S3_ENGINE_H
#define FASTREAD_S3_ENGINE_H

#include <curl/curl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engines/engine.h"
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

    /* Set by s3_cancel from any thread; read by fr_s3_run_jobs. */
    atomic_int cancelled;
} s3_engine;

/* CLOCK_MONOTONIC in milliseconds. */
long long fr_s3_now_ms(void);

/* Keeps a message for sample i (the call's first one for it). */
void fr_s3_note(s3_engine *s, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sample i failed (the first failure stands); `fmt` says why after its URL. */
void fr_s3_fail_sample(s3_engine *s, size_t i, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Grows *p (of *cap elements of `elem` bytes) to hold `want`: 0 or -ENOMEM. */
int fr_s3_grow(void **p, size_t *cap, size_t want, size_t elem);

/* Appends one job; fr_s3_add_parts splits bytes [from, from + len) of sample
 * i into jobs of part_size (an empty object: one job without a Range). */
int fr_s3_add_job(s3_engine *s, int kind, size_t i, uint64_t start, uint64_t len,
                  uint64_t dst_off);
int fr_s3_add_parts(s3_engine *s, int kind, size_t i, uint64_t from, uint64_t len,
                    uint64_t dst_off);
void fr_s3_clear_jobs(s3_engine *s);

/* libcurl's CURLOPT_WRITEFUNCTION for every transfer (userdata: its s3_xfer). */
size_t fr_s3_on_body(char *ptr, size_t size, size_t nmemb, void *userdata);

/* Runs every job of the call to its end: 0, or a batch-level -errno when
 * libcurl's multi handle itself fails (or -ECANCELED). */
int fr_s3_run_jobs(s3_engine *s);

#endif
