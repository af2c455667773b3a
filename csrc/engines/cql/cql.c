/*
 * cql: rows of an Apache Cassandra (or ScyllaDB) table read by key over
 * the CQL native protocol v4, many requests in flight per connection.
 *
 * A context holds `connections` connections to each of its `hosts`, opened
 * (and the statement `SELECT data_col[, label_col] FROM table WHERE id_col
 * = ?` prepared on each) when the context opens; a wrong password or a
 * missing table fails the open with the node's words. A read_keys call
 * sends one EXECUTE per key, as many at once as the connections' stream
 * ids allow (`inflight` per connection), and runs one poll() loop over the
 * sockets until every sample has its row, its error, or its deadline:
 *
 * - routing: with several hosts, each key goes to the node owning its
 *   Murmur3 token (the ring from each node's system.local tokens), else
 *   to the next live node; with one host, round-robin over its
 *   connections;
 * - a row's cells are copied from the connection's receive buffer into
 *   the arena as it arrives (back to back for dense batches, 64-byte
 *   aligned otherwise), its label into the batch's labels;
 * - no row: -ENOENT naming the id and table; a null data cell: -ENODATA;
 * - the node's read_timeout, unavailable, overloaded, is_bootstrapping,
 *   read_failure and server errors, requests unanswered after
 *   `timeout_ms`, and connections lost are retried (jittered exponential
 *   backoff) on any live connection, within `retries` answers and
 *   `deadline_ms` from the call's start; connections are reopened with
 *   backoff while samples wait for them. A dead node is therefore an error
 *   of each sample within deadline_ms, naming the node and why (refused,
 *   timed out), never a hang;
 * - other errors of the node (invalid, unauthorized) are the sample's at
 *   once, in its words;
 * - fr_ctx_cancel ends the call within one poll (an eventfd wakes it); the
 *   requests in flight are abandoned (their answers dropped when they
 *   come).
 *
 * Thread safety: as its context (fastread.h): one thread at a time, except
 * cql_cancel. Nothing is shared between contexts: no global state (the one
 * process-wide thing, OpenSSL's own initialisation, is its library's and
 * thread-safe in OpenSSL >= 1.1).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "engines/cql/cql_config.h"
#include "engines/cql/cql_conn.h"
#include "engines/cql/cql_proto.h"
#include "engines/engine.h"

#define MAX_RING 4096 /* tokens over all hosts (num_tokens 16 x 64 nodes = 1024) */
#define MAX_NOTES 4096

enum { REQ_PENDING, REQ_SENT, REQ_DONE };

typedef struct cql_req {
    int state;
    int conn, stream;
    unsigned attempts;    /* requests sent */
    long long sent_ms;
    long long not_before_ms;
    int last_err;          /* why its last attempt failed (-errno), 0 none yet */
    int32_t last_code;     /* the node's error code for it, -1 none */
    int last_host;
} cql_req;

typedef struct cql_note {
    size_t sample;
    char msg[FR_ERRLEN];
} cql_note;

typedef struct cql_engine {
    cql_config cfg;
    char query[512];
    cql_target hosts[CQL_MAX_HOSTS];
    int nhosts;
    cql_conn *conns; /* host h's connections: conns[h * connections ...] */
    int nconns;
    char (*conn_err)[FR_ERRLEN]; /* each connection's last failure to open */
    cql_ring_entry *ring;
    size_t nring;
    cql_login login;
    void *tls;
    size_t key_width; /* bytes a key of the id column's type has (0: any) */
    uint16_t id_type;
    uint64_t rng;
    unsigned rr;

    /* The call in progress. */
    fr_batch *batch;
    const uint8_t *keys;
    size_t key_len, n;
    cql_req *reqs;
    size_t reqs_cap;
    size_t *pending;
    size_t npending;
    struct pollfd *pfds;
    int *pfd_conn;
    cql_note *notes;
    size_t nnotes, notes_cap;
    uint64_t mean_size; /* bytes per row of the last call: the arena's first reserve */

    long requests, retries, timeouts, connects, inflight_max, rows_missing;
    long long bytes;

    int wake_fd; /* eventfd: cql_cancel wakes poll() */
    atomic_int cancelled;
} cql_engine;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t next_rand(cql_engine *s) { return fr_splitmix64(&s->rng); }

/* --------------------------------------------------------------- opening */

/* Checks the prepared statement's types against what was asked. */
static int check_prepared(cql_engine *s, const cql_prepared *p, char *err, size_t err_len)
{
    const cql_config *c = &s->cfg;
    int want_cols = c->label == LABEL_NONE ? 1 : 2;
    if (p->nbound != 1 || p->ncolumns != want_cols) {
        fr_set_err(err, err_len, "cql: %s: the statement has %d bound values and %d columns, "
                   "not 1 and %d", c->table, p->nbound, p->ncolumns, want_cols);
        return -EINVAL;
    }
    uint16_t id = p->bound_types[0];
    switch (id) {
    case CQL_TYPE_UUID:
    case CQL_TYPE_TIMEUUID: s->key_width = 16; break;
    case CQL_TYPE_BIGINT: s->key_width = 8; break;
    case CQL_TYPE_INT: s->key_width = 4; break;
    case CQL_TYPE_BLOB:
    case CQL_TYPE_VARCHAR:
    case CQL_TYPE_ASCII: s->key_width = 0; break;
    default:
        fr_set_err(err, err_len, "cql: %s: column %s is of type 0x%04x; keys of type uuid, "
                   "timeuuid, bigint, int, blob or text are read", c->table, c->id_col, id);
        return -EINVAL;
    }
    s->id_type = id;
    uint16_t dt = p->column_types[0];
    if (dt != CQL_TYPE_BLOB && dt != CQL_TYPE_VARCHAR && dt != CQL_TYPE_ASCII) {
        fr_set_err(err, err_len, "cql: %s: column %s is of type 0x%04x, not blob (or text)",
                   c->table, c->data_col, dt);
        return -EINVAL;
    }
    if (c->label == LABEL_INT && p->column_types[1] != CQL_TYPE_INT) {
        fr_set_err(err, err_len, "cql: %s: label column %s is of type 0x%04x, not int "
                   "(label_type='blob' reads other types' bytes)", c->table, c->label_col,
                   p->column_types[1]);
        return -EINVAL;
    }
    return 0;
}

static int by_token(const void *a, const void *b)
{
    int64_t x = ((const cql_ring_entry *)a)->token, y = ((const cql_ring_entry *)b)->token;
    return x < y ? -1 : x > y;
}

/* The ring: each host's own tokens (system.local), asked on its first
 * open connection. Hosts that could not be asked own nothing (their keys
 * go to the others, which forward them). */
static void build_ring(cql_engine *s, long long deadline)
{
    s->nring = 0;
    for (int h = 0; h < s->nhosts; h++) {
        cql_conn *c = &s->conns[h * s->cfg.connections];
        if (c->fd < 0)
            continue;
        cql_buf b = {0};
        cql_header hd;
        const uint8_t *body;
        char err[FR_ERRLEN];
        int64_t tokens[512];
        size_t nt = 0;
        if (cql_put_query(&b, 0, "SELECT tokens FROM system.local", CQL_CONSISTENCY_ONE) == 0 &&
            cql_conn_roundtrip(c, &s->hosts[h], &b, deadline, &hd, &body, err, sizeof(err)) ==
                0 &&
            hd.opcode == CQL_OP_RESULT &&
            cql_parse_token_set(body, hd.length, tokens, 512, &nt) == 0)
            for (size_t i = 0; i < nt && s->nring < MAX_RING; i++)
                s->ring[s->nring++] = (cql_ring_entry){tokens[i], h};
        cql_buf_free(&b);
    }
    qsort(s->ring, s->nring, sizeof(*s->ring), by_token);
}

static int open_conn(cql_engine *s, int i, long long deadline, char *err, size_t err_len)
{
    int host = i / (int)s->cfg.connections;
    long long until = now_ms() + s->cfg.connect_timeout_ms;
    if (deadline && until > deadline)
        until = deadline;
    int rc = cql_conn_open(&s->conns[i], &s->hosts[host], &s->login, s->query, until, err,
                           err_len);
    s->connects++;
    cql_conn *c = &s->conns[i];
    if (rc == 0) {
        rc = check_prepared(s, &c->prepared, err, err_len);
        if (rc)
            cql_conn_close(c);
    }
    if (rc) {
        fr_set_err(s->conn_err[i], FR_ERRLEN, "%s", err);
        c->failures++;
        unsigned shift = c->failures < 6 ? c->failures : 6;
        long long backoff = (25ll << shift) + (long long)(next_rand(s) % 25);
        c->retry_at_ms = now_ms() + backoff; /* 50 ms .. 1.6 s */
    } else {
        c->failures = 0;
        s->conn_err[i][0] = 0;
    }
    return rc;
}

static void cql_close(void *state);

static int cql_open(const fr_config *fc, void **out, char *err, size_t err_len)
{
    *out = NULL;
    cql_engine *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->wake_fd = -1;
    atomic_init(&s->cancelled, 0);
    s->rng = (uint64_t)(uintptr_t)s ^ (uint64_t)now_ms();
    int rc = cql_parse_config(fc->engine_args, &s->cfg, err, err_len);
    if (rc == 0)
        rc = cql_resolve_hosts(s->cfg.hosts, s->cfg.port, s->hosts, &s->nhosts, err, err_len);
    if (rc) {
        cql_close(s);
        return rc;
    }
    const cql_config *c = &s->cfg;
    if (c->label == LABEL_NONE)
        snprintf(s->query, sizeof(s->query), "SELECT %s FROM %s WHERE %s = ?", c->data_col,
                 c->table, c->id_col);
    else
        snprintf(s->query, sizeof(s->query), "SELECT %s, %s FROM %s WHERE %s = ?", c->data_col,
                 c->label_col, c->table, c->id_col);
    if (c->ssl && (rc = cql_tls_new(&s->tls, c->ssl_ca, c->ssl_verify, err, err_len)) != 0) {
        cql_close(s);
        return rc;
    }
    s->login = (cql_login){.username = c->username, .password = c->password, .tls = s->tls,
                           .tls_host = c->ssl_host};
    s->nconns = s->nhosts * (int)c->connections;
    s->conns = calloc((size_t)s->nconns, sizeof(*s->conns));
    s->conn_err = calloc((size_t)s->nconns, sizeof(*s->conn_err));
    s->ring = malloc(MAX_RING * sizeof(*s->ring));
    s->pfds = calloc((size_t)s->nconns + 1, sizeof(*s->pfds));
    s->pfd_conn = calloc((size_t)s->nconns + 1, sizeof(*s->pfd_conn));
    /* Every connection down (fd -1) before anything can fail: calloc's
     * zeros are descriptor 0, which cql_close would close (stdin, or
     * whatever took its number) once per connection. */
    for (int i = 0; s->conns && i < s->nconns; i++)
        s->conns[i].fd = -1;
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->conns || !s->conn_err || !s->ring || !s->pfds || !s->pfd_conn) {
        cql_close(s);
        return -ENOMEM;
    }
    if (s->wake_fd < 0) {
        rc = -errno;
        fr_set_err(err, err_len, "cql: eventfd: %s", strerror(errno));
        cql_close(s);
        return rc;
    }
    for (int i = 0; i < s->nconns; i++)
        if ((rc = cql_conn_init(&s->conns[i], (int)c->inflight)) != 0) {
            cql_close(s);
            return rc;
        }
    /* Every connection now: the first failure that is not about reaching
     * a node (credentials, the statement) fails the open; a node that
     * cannot be reached fails it only when none can. */
    int up = 0, first_rc = 0;
    char first[FR_ERRLEN] = "";
    for (int i = 0; i < s->nconns; i++) {
        char why[FR_ERRLEN] = "";
        int r = open_conn(s, i, 0, why, sizeof(why));
        if (r == 0) {
            up++;
            continue;
        }
        if (r == -EACCES || r == -EINVAL || r == -EPROTO || r == -ENOTSUP) {
            fr_set_err(err, err_len, "%s", why);
            cql_close(s);
            return r;
        }
        if (!first_rc) {
            first_rc = r;
            snprintf(first, sizeof(first), "%s", why);
        }
    }
    if (!up) {
        fr_set_err(err, err_len, "%s", first);
        cql_close(s);
        return first_rc;
    }
    if (s->nhosts > 1)
        build_ring(s, now_ms() + c->connect_timeout_ms);
    *out = s;
    return 0;
}

static void cql_close(void *state)
{
    cql_engine *s = state;
    if (!s)
        return;
    for (int i = 0; s->conns && i < s->nconns; i++)
        cql_conn_free(&s->conns[i]);
    free(s->conns);
    free(s->conn_err);
    free(s->ring);
    free(s->reqs);
    free(s->pending);
    free(s->pfds);
    free(s->pfd_conn);
    free(s->notes);
    cql_tls_free(s->tls);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    /* The password is not left in freed memory. */
    memset(s->cfg.password, 0, sizeof(s->cfg.password));
    free(s);
}

static int cql_probe(char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    return 0; /* plain TCP: runs everywhere; TLS's absence is said by ssl=1 */
}

/* ------------------------------------------------------------- messages */

static void note(cql_engine *s, size_t i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void note(cql_engine *s, size_t i, const char *fmt, ...)
{
    if (s->nnotes >= MAX_NOTES)
        return;
    if (s->nnotes == s->notes_cap) {
        size_t cap = s->notes_cap ? 2 * s->notes_cap : 16;
        cql_note *p = realloc(s->notes, cap * sizeof(*p));
        if (!p)
            return; /* the errno still says what failed */
        s->notes = p;
        s->notes_cap = cap;
    }
    cql_note *nt = &s->notes[s->nnotes++];
    nt->sample = i;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nt->msg, sizeof(nt->msg), fmt, ap);
    va_end(ap);
}

/* Sample i's key as the table's id type writes it. */
static void key_text(const cql_engine *s, size_t i, char *out, size_t len)
{
    const uint8_t *k = s->keys + i * s->key_len;
    if ((s->id_type == CQL_TYPE_UUID || s->id_type == CQL_TYPE_TIMEUUID) && s->key_len == 16) {
        snprintf(out, len,
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", k[0],
                 k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11], k[12], k[13],
                 k[14], k[15]);
        return;
    }
    if ((s->id_type == CQL_TYPE_BIGINT && s->key_len == 8) ||
        (s->id_type == CQL_TYPE_INT && s->key_len == 4)) {
        int64_t v = (int8_t)k[0]; /* sign from the first byte */
        for (size_t j = 1; j < s->key_len; j++)
            v = (int64_t)((uint64_t)v << 8 | k[j]);
        snprintf(out, len, "%lld", (long long)v);
        return;
    }
    size_t w = 0;
    for (size_t j = 0; j < s->key_len && w + 3 < len && j < 64; j++)
        w += (size_t)snprintf(out + w, len - w, "%02x", k[j]);
    if (len)
        out[w < len ? w : len - 1] = 0;
}

static void finish(cql_engine *s, size_t i, int err)
{
    cql_req *r = &s->reqs[i];
    r->state = REQ_DONE;
    if (err)
        s->batch->samples[i] = (fr_sample){0, err};
}

/* Sample i failed for good: its errno and a message naming its id. */
static void fail(cql_engine *s, size_t i, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail(cql_engine *s, size_t i, int err, const char *fmt, ...)
{
    char id[80], why[FR_ERRLEN];
    key_text(s, i, id, sizeof(id));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    note(s, i, "cql: %s id %s: %s", s->cfg.table, id, why);
    finish(s, i, err);
}

/* Why a sample that ran out of attempts or time failed, from its last try. */
static void fail_last(cql_engine *s, size_t i, const char *what)
{
    cql_req *r = &s->reqs[i];
    const char *host = r->last_host >= 0 ? s->hosts[r->last_host].name : s->hosts[0].name;
    if (r->last_code >= 0) {
        fail(s, i, r->last_err ? r->last_err : -EIO, "%s: %s (%s after %u attempts)", host,
             cql_error_name(r->last_code), what, r->attempts);
        return;
    }
    if (r->last_err == -ETIMEDOUT) {
        fail(s, i, -ETIMEDOUT, "%s: no answer within %lld ms (%s after %u attempts)", host,
             s->cfg.timeout_ms, what, r->attempts);
        return;
    }
    /* Never sent, or its connection was lost: why the nodes could not be
     * reached, from the connections' last failures. */
    for (int c = 0; c < s->nconns; c++)
        if (s->conn_err[c][0]) {
            note(s, i, "%s (%s: %lld ms)", s->conn_err[c], what, s->cfg.deadline_ms);
            finish(s, i, r->last_err && r->last_err != -ECONNRESET ? r->last_err : -EHOSTUNREACH);
            return;
        }
    fail(s, i, r->last_err ? r->last_err : -ETIMEDOUT, "%s: %s (%s after %u attempts)", host,
         r->last_err ? strerror(-r->last_err) : "no answer", what, r->attempts);
}

/* --------------------------------------------------------------- the loop */

static void requeue(cql_engine *s, size_t i, long long now)
{
    cql_req *r = &s->reqs[i];
    if (r->attempts > (unsigned)s->cfg.retries) {
        fail_last(s, i, "retries exhausted");
        return;
    }
    unsigned shift = r->attempts < 6 ? r->attempts : 6;
    long long base = 10ll << shift; /* 20 ms .. 640 ms */
    r->not_before_ms = now + base / 2 + (long long)(next_rand(s) % (uint64_t)base);
    r->state = REQ_PENDING;
    r->conn = -1;
    s->pending[s->npending++] = i;
    s->retries++;
}

/* A connection broke: its requests go back to the queue. */
static void conn_failed(cql_engine *s, int ci, int err, long long now)
{
    cql_conn *c = &s->conns[ci];
    int host = ci / (int)s->cfg.connections;
    fr_set_err(s->conn_err[ci], FR_ERRLEN, "cql: %s: connection lost: %s", s->hosts[host].name,
             err == -ECONNRESET ? "closed by the node" : strerror(-err));
    for (int st = 1; st <= c->max_streams; st++) {
        int32_t owner = c->stream_owner[st];
        if (owner < 0)
            continue;
        cql_req *r = &s->reqs[owner];
        r->last_err = err;
        r->last_code = -1;
        r->last_host = host;
        requeue(s, (size_t)owner, now);
    }
    cql_conn_close(c);
    c->failures++;
    c->retry_at_ms = now + 20 + (long long)(next_rand(s) % 30);
}

static int pick_conn(cql_engine *s, size_t i)
{
    int host;
    if (s->nring) {
        int64_t t = cql_murmur3_token(s->keys + i * s->key_len, s->key_len);
        host = cql_ring_owner(s->ring, s->nring, t);
    } else {
        host = (int)(s->rr % (unsigned)s->nhosts);
    }
    int per = (int)s->cfg.connections;
    for (int k = 0; k < s->nhosts; k++) {
        int h = (host + k) % s->nhosts;
        for (int j = 0; j < per; j++) {
            int ci = h * per + (int)((s->rr + (unsigned)j) % (unsigned)per);
            cql_conn *c = &s->conns[ci];
            if (c->fd >= 0 && c->nfree > 0) {
                s->rr++;
                return ci;
            }
        }
    }
    return -1;
}

/* Sends what can be sent of the queue; reopens connections due. */
static void dispatch(cql_engine *s, long long now, long long deadline)
{
    if (s->npending == 0)
        return;
    /* Connections down and due: reopened (synchronously, bounded). */
    for (int ci = 0; ci < s->nconns; ci++) {
        cql_conn *c = &s->conns[ci];
        if (c->fd < 0 && c->retry_at_ms <= now && now < deadline) {
            char why[FR_ERRLEN];
            (void)open_conn(s, ci, deadline, why, sizeof(why));
            now = now_ms();
        }
    }
    size_t keep = 0;
    for (size_t k = 0; k < s->npending; k++) {
        size_t i = s->pending[k];
        cql_req *r = &s->reqs[i];
        if (r->state != REQ_PENDING)
            continue;
        int ci = r->not_before_ms <= now ? pick_conn(s, i) : -1;
        if (ci < 0) {
            s->pending[keep++] = i;
            continue;
        }
        cql_conn *c = &s->conns[ci];
        int st = cql_conn_take_stream(c, (int32_t)i);
        if (cql_put_execute(&c->out, (int16_t)st, c->prepared.id, c->prepared.id_len,
                            (uint16_t)s->cfg.consistency, s->keys + i * s->key_len,
                            s->key_len) != 0) {
            cql_conn_release_stream(c, st, 0);
            fail(s, i, -ENOMEM, "out of memory for its request");
            continue;
        }
        r->state = REQ_SENT;
        r->conn = ci;
        r->stream = st;
        r->sent_ms = now;
        r->attempts++;
        s->requests++;
        if (c->inflight > s->inflight_max)
            s->inflight_max = c->inflight;
    }
    s->npending = keep;
}

static int place(cql_engine *s, size_t i, const uint8_t *p, size_t len)
{
    fr_arena *a = &s->batch->arena;
    size_t at = s->batch->dense ? a->used : (a->used + 63) & ~(size_t)63;
    if (at + len > a->capacity) {
        /* Grow for the rest of the batch at once: each growth keeps the
         * region it left mapped until the arena is freed. */
        size_t left = 0;
        for (size_t j = 0; j < s->n; j++)
            left += s->reqs[j].state != REQ_DONE;
        size_t want = at + len + left * (s->mean_size + 64);
        int rc = fr_arena_reserve(a, want);
        if (rc)
            return rc;
    }
    if (len)
        memcpy(a->base + at, p, len);
    a->used = at + len;
    s->batch->samples[i] = (fr_sample){at, (int64_t)len};
    return 0;
}

/* A RESULT for sample i. */
static void got_result(cql_engine *s, size_t i, const uint8_t *body, size_t len)
{
    cql_rows rows;
    int want = s->cfg.label == LABEL_NONE ? 1 : 2;
    if (cql_parse_rows(body, len, &rows) != 0 || rows.ncolumns != want) {
        fail(s, i, -EPROTO, "malformed ROWS answer");
        return;
    }
    if (rows.nrows == 0) {
        s->rows_missing++;
        fail(s, i, -ENOENT, "not found (no row with this %s)", s->cfg.id_col);
        return;
    }
    size_t pos = rows.cells, off, loff = 0;
    int32_t dl, ll = -1;
    if (cql_next_cell(body, len, &pos, &off, &dl) != 0 ||
        (want == 2 && cql_next_cell(body, len, &pos, &loff, &ll) != 0)) {
        fail(s, i, -EPROTO, "malformed row");
        return;
    }
    if (dl < 0) {
        fail(s, i, -ENODATA, "column %s is null", s->cfg.data_col);
        return;
    }
    if (s->cfg.label == LABEL_INT && ll != 4 && ll != -1) {
        fail(s, i, -EPROTO, "label %s has %d bytes, not 4", s->cfg.label_col, (int)ll);
        return;
    }
    int rc = place(s, i, body + off, (size_t)dl);
    if (rc == 0 && want == 2 && ll >= 0)
        rc = fr_batch_set_label(s->batch, i, body + loff, (size_t)ll);
    if (rc) {
        fail(s, i, rc, "out of memory for its %d bytes", (int)dl);
        return;
    }
    s->bytes += dl;
    finish(s, i, 0);
}

static int retryable(int32_t code)
{
    return code == CQL_ERR_READ_TIMEOUT || code == CQL_ERR_UNAVAILABLE ||
           code == CQL_ERR_OVERLOADED || code == CQL_ERR_BOOTSTRAPPING ||
           code == CQL_ERR_READ_FAILURE || code == CQL_ERR_SERVER || code == CQL_ERR_UNPREPARED;
}

/* Takes the complete frames connection ci holds. 0, or -errno: broken. */
static int take_frames(cql_engine *s, int ci, long long now)
{
    cql_conn *c = &s->conns[ci];
    int host = ci / (int)s->cfg.connections;
    int reprepare = 0;
    for (;;) {
        cql_header h;
        const uint8_t *body;
        int f = cql_conn_frame(c, &h, &body);
        if (f < 0)
            return -EPROTO;
        if (f == 0)
            break;
        if (h.stream <= 0)
            continue; /* an event (never registered for) or a stray answer */
        int32_t owner = cql_conn_release_stream(c, h.stream, 0);
        if (owner < 0 || (size_t)owner >= s->n || s->reqs[owner].state != REQ_SENT ||
            s->reqs[owner].conn != ci)
            continue; /* abandoned: answered elsewhere, or a call that was cancelled */
        size_t i = (size_t)owner;
        cql_req *r = &s->reqs[i];
        if (h.opcode == CQL_OP_RESULT) {
            got_result(s, i, body, h.length);
            continue;
        }
        int32_t code = -1;
        char msg[FR_ERRLEN] = "";
        if (h.opcode != CQL_OP_ERROR || cql_parse_error(body, h.length, &code, msg,
                                                        sizeof(msg)) != 0) {
            fail(s, i, -EPROTO, "%s: unexpected answer (opcode 0x%02x)", s->hosts[host].name,
                 h.opcode);
            continue;
        }
        r->last_code = code;
        r->last_host = host;
        r->last_err = code == CQL_ERR_READ_TIMEOUT ? -ETIMEDOUT : -EIO;
        if (code == CQL_ERR_UNPREPARED) {
            reprepare = 1; /* the node forgot the statement (restarted): prepare anew */
            r->attempts--;  /* not the sample's fault */
            requeue(s, i, now);
        } else if (retryable(code)) {
            requeue(s, i, now);
        } else {
            fail(s, i, code == CQL_ERR_UNAUTHORIZED ? -EACCES : -EIO, "%s: %s (%s)",
                 s->hosts[host].name, msg, cql_error_name(code));
        }
    }
    return reprepare ? -ESTALE : 0;
}

/* Requests unanswered for timeout_ms: abandoned and sent again. */
static void expire(cql_engine *s, long long now)
{
    for (size_t i = 0; i < s->n; i++) {
        cql_req *r = &s->reqs[i];
        if (r->state != REQ_SENT || now - r->sent_ms < s->cfg.timeout_ms)
            continue;
        cql_conn_release_stream(&s->conns[r->conn], r->stream, 1);
        r->last_err = -ETIMEDOUT;
        r->last_code = -1;
        r->last_host = r->conn / (int)s->cfg.connections;
        s->timeouts++;
        requeue(s, i, now);
    }
}

/* How long poll may sleep: until the next timeout, backoff or reopen. */
static int poll_ms(cql_engine *s, long long now, long long deadline)
{
    long long next = deadline;
    for (size_t i = 0; i < s->n; i++) {
        const cql_req *r = &s->reqs[i];
        if (r->state == REQ_SENT && r->sent_ms + s->cfg.timeout_ms < next)
            next = r->sent_ms + s->cfg.timeout_ms;
        else if (r->state == REQ_PENDING && r->not_before_ms < next)
            next = r->not_before_ms;
    }
    if (s->npending)
        for (int ci = 0; ci < s->nconns; ci++)
            if (s->conns[ci].fd < 0 && s->conns[ci].retry_at_ms < next)
                next = s->conns[ci].retry_at_ms;
    long long wait = next - now;
    return wait < 0 ? 0 : wait > 1000 ? 1000 : (int)wait;
}

static int cql_read_keys(void *state, const uint8_t *keys, size_t key_len, size_t n,
                         fr_batch *batch)
{
    cql_engine *s = state;
    if (s->key_width && key_len != s->key_width) {
        return -EINVAL; /* the id column's type takes keys of key_width bytes */
    }
    if (n > s->reqs_cap) {
        cql_req *r = realloc(s->reqs, n * sizeof(*r));
        size_t *p = r ? realloc(s->pending, n * sizeof(*p)) : NULL;
        if (r)
            s->reqs = r;
        if (!p)
            return -ENOMEM;
        s->pending = p;
        s->reqs_cap = n;
    }
    s->batch = batch;
    s->keys = keys;
    s->key_len = key_len;
    s->n = n;
    s->nnotes = 0;
    s->npending = 0;
    batch->arena.used = 0;
    if (s->cfg.label != LABEL_NONE && fr_batch_labels_begin(batch, n) != 0)
        return -ENOMEM;
    if (s->mean_size && fr_arena_reserve(&batch->arena, n * (s->mean_size + 64)) != 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        s->reqs[i] = (cql_req){.state = REQ_PENDING, .conn = -1, .last_code = -1,
                               .last_host = -1};
        batch->samples[i] = (fr_sample){0, 0};
        s->pending[s->npending++] = i;
    }
    long long start = now_ms(), deadline = start + s->cfg.deadline_ms;
    size_t done = 0;
    for (;;) {
        if (atomic_load_explicit(&s->cancelled, memory_order_acquire)) {
            for (size_t i = 0; i < n; i++)
                if (s->reqs[i].state == REQ_SENT)
                    cql_conn_release_stream(&s->conns[s->reqs[i].conn], s->reqs[i].stream, 1);
            return -ECANCELED;
        }
        long long now = now_ms();
        if (now >= deadline) {
            for (size_t i = 0; i < n; i++) {
                if (s->reqs[i].state == REQ_DONE)
                    continue;
                if (s->reqs[i].state == REQ_SENT) {
                    cql_conn_release_stream(&s->conns[s->reqs[i].conn], s->reqs[i].stream, 1);
                    s->reqs[i].last_err = -ETIMEDOUT;
                    s->reqs[i].last_code = -1;
                    s->reqs[i].last_host = s->reqs[i].conn / (int)s->cfg.connections;
                }
                fail_last(s, i, "deadline_ms passed");
            }
            break;
        }
        expire(s, now);
        dispatch(s, now, deadline);
        done = 0;
        for (size_t i = 0; i < n; i++)
            done += s->reqs[i].state == REQ_DONE;
        if (done == n)
            break;
        int np = 0;
        for (int ci = 0; ci < s->nconns; ci++) {
            cql_conn *c = &s->conns[ci];
            if (c->fd < 0)
                continue;
            if (c->out.len) {
                int rc = cql_conn_flush(c);
                if (rc) {
                    conn_failed(s, ci, rc, now);
                    continue;
                }
            }
            s->pfds[np] = (struct pollfd){
                .fd = c->fd,
                .events = (short)(POLLIN | (c->out.len || c->want_write ? POLLOUT : 0))};
            s->pfd_conn[np++] = ci;
        }
        s->pfds[np] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
        int rc = poll(s->pfds, (nfds_t)np + 1, poll_ms(s, now_ms(), deadline));
        if (rc < 0 && errno != EINTR)
            return -errno;
        if (rc <= 0)
            continue;
        if (s->pfds[np].revents) {
            uint64_t v;
            (void)!read(s->wake_fd, &v, sizeof(v)); /* drained; the flag says the rest */
        }
        now = now_ms();
        for (int k = 0; k < np; k++) {
            int ci = s->pfd_conn[k];
            cql_conn *c = &s->conns[ci];
            if (!s->pfds[k].revents || c->fd < 0)
                continue;
            int r = 0;
            if (s->pfds[k].revents & (POLLIN | POLLERR | POLLHUP)) {
                /* Frames are taken after every read: the buffer then holds
                 * one read's worth besides a large frame in progress. */
                while ((r = cql_conn_fill(c)) > 0)
                    if ((r = take_frames(s, ci, now)) != 0)
                        break;
                if (r == 0)
                    r = take_frames(s, ci, now);
            }
            if (r == 0 && (s->pfds[k].revents & POLLOUT) && c->out.len)
                r = cql_conn_flush(c);
            if (r == -ESTALE) {
                /* Reopened (and the statement prepared again) before its
                 * samples are sent again. */
                int host = ci / (int)s->cfg.connections;
                conn_failed(s, ci, -ESTALE, now);
                fr_set_err(s->conn_err[ci], FR_ERRLEN, "cql: %s: the statement was unprepared",
                         s->hosts[host].name);
                c->retry_at_ms = now;
            } else if (r < 0) {
                conn_failed(s, ci, r, now);
            }
        }
    }
    if (n && batch->arena.used)
        s->mean_size = batch->arena.used / n;
    return 0;
}

/* ------------------------------------------------------------- the rest */

static int cql_read_files(void *state, const char *const *paths, const int64_t *hints, size_t n,
                          fr_batch *batch)
{
    (void)state;
    (void)paths;
    (void)hints;
    (void)n;
    (void)batch;
    return -ENOTSUP; /* rows by key only: fr_read_keys */
}

static int cql_sample_error(const void *state, size_t i, char *out, size_t len)
{
    const cql_engine *s = state;
    for (size_t j = 0; j < s->nnotes; j++)
        if (s->notes[j].sample == i) {
            snprintf(out, len, "%s", s->notes[j].msg);
            return 1;
        }
    return 0;
}

static void cql_cancel(void *state, int on)
{
    cql_engine *s = state;
    atomic_store_explicit(&s->cancelled, on != 0, memory_order_release);
    if (on) {
        uint64_t one = 1;
        (void)!write(s->wake_fd, &one, sizeof(one)); /* EAGAIN: already awake */
    }
}

static long cql_stat(const void *state, const char *key)
{
    const cql_engine *s = state;
    struct {
        const char *key;
        long value;
    } stats[] = {
        {"cql_requests", s->requests},
        {"cql_retries", s->retries},
        {"cql_timeouts", s->timeouts},
        {"cql_connects", s->connects},
        {"cql_inflight_max", s->inflight_max},
        {"cql_rows_missing", s->rows_missing},
        {"cql_bytes", (long)s->bytes},
        {"cql_hosts", s->nhosts},
        {"cql_ring_tokens", (long)s->nring},
        {"connections", (long)s->cfg.connections},
        {"inflight", (long)s->cfg.inflight},
        {"timeout_ms", (long)s->cfg.timeout_ms},
        {"deadline_ms", (long)s->cfg.deadline_ms},
        {"retries", (long)s->cfg.retries},
        {"ssl", s->tls != NULL},
    };
    for (size_t i = 0; i < sizeof(stats) / sizeof(stats[0]); i++)
        if (strcmp(key, stats[i].key) == 0)
            return stats[i].value;
    if (strcmp(key, "cql_connections_up") == 0) {
        long up = 0;
        for (int i = 0; i < s->nconns; i++)
            up += s->conns[i].fd >= 0;
        return up;
    }
    return -1;
}

int fr_cql_tls_probe(char *why, size_t why_len) { return cql_tls_probe(why, why_len); }

int64_t fr_cql_token(const uint8_t *key, size_t len) { return cql_murmur3_token(key, len); }

const fr_engine fr_engine_cql = {
    .name = "cql",
    .probe = cql_probe,
    .open = cql_open,
    .close = cql_close,
    .read_files = cql_read_files,
    .uses_size_hints = 0,
    .stat = cql_stat,
    .sample_error = cql_sample_error,
    .cancel = cql_cancel,
    .read_keys = cql_read_keys,
};
