/* The cql engine against a small in-process CQL v4 server (a thread on a
 * loopback port): rows by key with labels, a missing key, SASL PLAIN with
 * a wrong password (refused, the password in no message), a closed port,
 * a stalled answer ended by fr_ctx_cancel from another thread (under
 * TSan: the flag and the eventfd), request timeouts within the deadline,
 * a key reader (fr_reader_open_keys), and token-aware routing over two
 * such nodes (each key sent to the one owning its Murmur3 token, the ring
 * from their system.local tokens). The real Cassandra is
 * tests/test_cassandra.py's; this one runs everywhere, sanitizers on.
 *
 * The server's rows: key k (16 bytes) has data = k[1] repeated k[1] * 37
 * times and label k[2]; k[0] == 0xFF has no row; k[0] == 0xEE is never
 * answered. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fastread.h"
#include "harness.h"

#define MAXC 32

typedef struct server {
    int listen_fd, port, stop_fd[2];
    pthread_t thread;
    atomic_int executes;
    /* Token-aware routing: the token this node says it owns (system.local),
     * and the rule that says which keys are its own: misrouted counts the
     * EXECUTEs of keys another node owns. */
    const char *token;
    int (*owns)(int64_t token);
    atomic_int misrouted;
} server;

typedef struct conn {
    int fd;
    uint8_t in[1 << 16];
    size_t n;
    int authed;
} conn;

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Sends a frame: header + body. */
static void reply(int fd, int16_t stream, uint8_t op, const uint8_t *body, size_t len)
{
    uint8_t h[9] = {0x84, 0, (uint8_t)(stream >> 8), (uint8_t)stream, op};
    be32(h + 5, (uint32_t)len);
    if (send(fd, h, 9, MSG_NOSIGNAL) != 9 || (len && send(fd, body, len, MSG_NOSIGNAL) != (ssize_t)len))
        return; /* the client went away: its test says so */
}

static size_t put_str(uint8_t *p, const char *s)
{
    size_t n = strlen(s);
    p[0] = (uint8_t)(n >> 8);
    p[1] = (uint8_t)n;
    memcpy(p + 2, s, n);
    return n + 2;
}

static void handle(conn *c, int16_t stream, uint8_t op, const uint8_t *body, size_t len,
                   server *s)
{
    uint8_t out[8192];
    size_t n = 0;
    if (op == 0x01) { /* STARTUP: ask for a password */
        n = put_str(out, "org.apache.cassandra.auth.PasswordAuthenticator");
        reply(c->fd, stream, 0x03, out, n);
    } else if (op == 0x0F) { /* AUTH_RESPONSE: \0user\0pass */
        static const char want[] = "\0u\0right";
        if (len == 4 + sizeof(want) - 1 && memcmp(body + 4, want, sizeof(want) - 1) == 0) {
            c->authed = 1;
            be32(out, 0xFFFFFFFFu); /* null token */
            reply(c->fd, stream, 0x10, out, 4);
        } else {
            be32(out, 0x0100);
            n = 4 + put_str(out + 4, "Provided username u and/or password are incorrect");
            reply(c->fd, stream, 0x00, out, n);
        }
    } else if (op == 0x09) { /* PREPARE */
        be32(out, 4);
        out[4] = 0;
        out[5] = 16;
        memset(out + 6, 0x5A, 16);
        n = 22;
        be32(out + n, 1); /* bound: global spec */
        be32(out + n + 4, 1);
        be32(out + n + 8, 1);
        n += 12;
        out[n++] = 0;
        out[n++] = 0; /* pk index 0 */
        n += put_str(out + n, "ks");
        n += put_str(out + n, "t");
        n += put_str(out + n, "id");
        out[n++] = 0;
        out[n++] = 0x0C; /* uuid */
        be32(out + n, 1);
        be32(out + n + 4, 2);
        n += 8;
        n += put_str(out + n, "ks");
        n += put_str(out + n, "t");
        n += put_str(out + n, "data");
        out[n++] = 0;
        out[n++] = 0x03;
        n += put_str(out + n, "label");
        out[n++] = 0;
        out[n++] = 0x09;
        reply(c->fd, stream, 0x08, out, n);
    } else if (op == 0x07 && s->token) { /* QUERY: SELECT tokens FROM system.local */
        be32(out, 2);
        be32(out + 4, 0x0001);
        be32(out + 8, 1);
        n = 12;
        n += put_str(out + n, "system");
        n += put_str(out + n, "local");
        n += put_str(out + n, "tokens");
        out[n++] = 0;
        out[n++] = 0x22; /* set<varchar> */
        out[n++] = 0;
        out[n++] = 0x0D;
        be32(out + n, 1);
        size_t tl = strlen(s->token);
        be32(out + n + 4, (uint32_t)(4 + 4 + tl));
        be32(out + n + 8, 1);
        be32(out + n + 12, (uint32_t)tl);
        memcpy(out + n + 16, s->token, tl);
        reply(c->fd, stream, 0x08, out, n + 16 + tl);
    } else if (op == 0x0A && c->authed) { /* EXECUTE: id(2+16) cons(2) flags(1) n(2) len(4) key */
        atomic_fetch_add(&s->executes, 1);
        const uint8_t *k = body + 2 + 16 + 2 + 1 + 2 + 4;
        if (len < 2 + 16 + 2 + 1 + 2 + 4 + 16 || k[0] == 0xEE)
            return;
        if (s->owns && !s->owns(fr_cql_token(k, 16)))
            atomic_fetch_add(&s->misrouted, 1);
        be32(out, 2);
        be32(out + 4, 0x0004);
        be32(out + 8, 2);
        if (k[0] == 0xFF) {
            be32(out + 12, 0);
            reply(c->fd, stream, 0x08, out, 16);
            return;
        }
        be32(out + 12, 1);
        size_t dl = (size_t)k[1] * 37;
        be32(out + 16, (uint32_t)dl);
        memset(out + 20, k[1], dl);
        n = 20 + dl;
        be32(out + n, 4);
        be32(out + n + 4, k[2]);
        reply(c->fd, stream, 0x08, out, n + 8);
    } else {
        be32(out, 0x000A);
        n = 4 + put_str(out + 4, "unexpected");
        reply(c->fd, stream, 0x00, out, n);
    }
}

static void *serve(void *arg)
{
    server *s = arg;
    conn *cs = calloc(MAXC, sizeof(*cs));
    int nc = 0;
    for (;;) {
        struct pollfd p[MAXC + 2];
        p[0] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = s->stop_fd[0], .events = POLLIN};
        for (int i = 0; i < nc; i++)
            p[i + 2] = (struct pollfd){.fd = cs[i].fd, .events = POLLIN};
        if (poll(p, (nfds_t)nc + 2, 1000) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if ((p[0].revents & POLLIN) && nc < MAXC) {
            int fd = accept(s->listen_fd, NULL, NULL);
            if (fd >= 0)
                cs[nc++] = (conn){.fd = fd};
        }
        for (int i = 0; i < nc; i++) {
            if (!p[i + 2].revents)
                continue;
            conn *c = &cs[i];
            ssize_t r = recv(c->fd, c->in + c->n, sizeof(c->in) - c->n, 0);
            if (r <= 0) {
                close(c->fd);
                cs[i] = cs[--nc];
                break; /* the poll set changed */
            }
            c->n += (size_t)r;
            size_t at = 0;
            while (c->n - at >= 9) {
                const uint8_t *h = c->in + at;
                size_t len = (size_t)h[5] << 24 | (size_t)h[6] << 16 | (size_t)h[7] << 8 | h[8];
                if (c->n - at < 9 + len)
                    break;
                handle(c, (int16_t)(h[2] << 8 | h[3]), h[4], h + 9, len, s);
                at += 9 + len;
            }
            memmove(c->in, c->in + at, c->n - at);
            c->n -= at;
        }
    }
    for (int i = 0; i < nc; i++)
        close(cs[i].fd);
    free(cs);
    return NULL;
}

static void server_start(server *s, const char *token, int (*owns)(int64_t))
{
    memset(s, 0, sizeof(*s));
    s->token = token; /* set before the thread starts: it only reads them */
    s->owns = owns;
    s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(s->listen_fd, 16) != 0 ||
        getsockname(s->listen_fd, (struct sockaddr *)&a, &al) != 0 || pipe(s->stop_fd) != 0) {
        perror("server");
        exit(1);
    }
    s->port = ntohs(a.sin_port);
    pthread_create(&s->thread, NULL, serve, s);
}

static void server_stop(server *s)
{
    (void)!write(s->stop_fd[1], "x", 1);
    pthread_join(s->thread, NULL);
    close(s->listen_fd);
    close(s->stop_fd[0]);
    close(s->stop_fd[1]);
}

static int open_ctx(int port, const char *password, const char *extra, fr_ctx **ctx, char *err)
{
    char args[512];
    snprintf(args, sizeof(args),
             "hosts=127.0.0.1,port=%d,table=ks.t,username=u,password=%s%s%s", port, password,
             extra ? "," : "", extra ? extra : "");
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "cql";
    cfg.engine_args = args;
    return fr_ctx_open(&cfg, ctx, err, FR_ERRLEN);
}

static void make_key(uint8_t *k, uint8_t tag, uint8_t a, uint8_t b)
{
    memset(k, 0x11, 16);
    k[0] = tag;
    k[1] = a;
    k[2] = b;
}

static long long ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_rows(int port)
{
    fr_ctx *ctx;
    char err[FR_ERRLEN] = "";
    CHECK(open_ctx(port, "right", "connections=2,inflight=64", &ctx, err) == 0);
    if (!ctx) {
        fprintf(stderr, "open: %s\n", err);
        return;
    }
    enum { N = 500 };
    uint8_t *keys = malloc(N * 16);
    for (int i = 0; i < N; i++)
        make_key(keys + 16 * i, 0, (uint8_t)(i % 200), (uint8_t)(i % 7));
    make_key(keys + 16 * 123, 0xFF, 0, 0); /* no such row */
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    b->dense = 1;
    CHECK(fr_batch_prepare(b, N) == 0);
    CHECK(fr_read_keys(ctx, keys, 16, N, b) == 0);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        if (i == 123) {
            CHECK(b->samples[i].length == -ENOENT);
            continue;
        }
        size_t want = (size_t)(i % 200) * 37;
        const uint8_t *p = b->arena.base + b->samples[i].offset;
        bad += b->samples[i].length != (int64_t)want;
        for (size_t j = 0; j < want && !bad; j++)
            bad += p[j] != (uint8_t)(i % 200);
        bad += b->label_count != N || b->labels[i].length != 4 ||
               b->label_bytes[b->labels[i].offset + 3] != (uint8_t)(i % 7);
    }
    CHECK(bad == 0);
    char msg[FR_ERRLEN];
    CHECK(fr_ctx_sample_error(ctx, 123, msg, sizeof(msg)) == 1 && strstr(msg, "not found") &&
          strstr(msg, "ff000011-1111-"));
    CHECK(fr_ctx_stat(ctx, "cql_requests") == N);
    CHECK(fr_read_keys(ctx, keys, 8, N, b) == -EINVAL); /* uuid keys are 16 bytes */
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
    free(keys);
}

static void test_wrong_password_and_closed_port(int port)
{
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    CHECK(open_ctx(port, "s3cr3t-wrong", NULL, &ctx, err) == -EACCES && ctx == NULL);
    CHECK(strstr(err, "authentication failed for user 'u'") != NULL);
    CHECK(strstr(err, "s3cr3t") == NULL);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    int closed = ntohs(a.sin_port);
    close(fd); /* nobody listens there now */
    long long t0 = ms_now();
    CHECK(open_ctx(closed, "right", NULL, &ctx, err) == -ECONNREFUSED);
    CHECK(strstr(err, "127.0.0.1:") != NULL && ms_now() - t0 < 3000);
}

typedef struct canceller {
    fr_ctx *ctx;
    int delay_ms;
} canceller;

static void *cancel_later(void *arg)
{
    canceller *c = arg;
    struct timespec ts = {0, (long)c->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    fr_ctx_cancel(c->ctx, 1);
    return NULL;
}

static void test_stall_cancel_and_timeout(int port)
{
    fr_ctx *ctx;
    char err[FR_ERRLEN] = "";
    CHECK(open_ctx(port, "right", "timeout_ms=60,deadline_ms=400,retries=3", &ctx, err) == 0);
    if (!ctx)
        return;
    uint8_t keys[4 * 16];
    for (int i = 0; i < 4; i++)
        make_key(keys + 16 * i, i == 2 ? 0xEE : 0, 3, 1);
    fr_pool *pool = fr_pool_new();
    fr_batch *b = fr_pool_get(pool);
    CHECK(fr_batch_prepare(b, 4) == 0);
    long long t0 = ms_now();
    CHECK(fr_read_keys(ctx, keys, 16, 4, b) == 0);
    long long took = ms_now() - t0;
    CHECK(took >= 300 && took < 3000); /* the deadline, not a hang */
    CHECK(b->samples[0].length == 111 && b->samples[2].length == -ETIMEDOUT);
    char msg[FR_ERRLEN];
    CHECK(fr_ctx_sample_error(ctx, 2, msg, sizeof(msg)) == 1 && strstr(msg, "127.0.0.1:"));
    fr_ctx_close(ctx);

    CHECK(open_ctx(port, "right", NULL, &ctx, err) == 0); /* default deadline: 60 s */
    canceller c = {ctx, 200};
    pthread_t t;
    pthread_create(&t, NULL, cancel_later, &c);
    t0 = ms_now();
    CHECK(fr_read_keys(ctx, keys, 16, 4, b) == -ECANCELED);
    CHECK(ms_now() - t0 < 5000);
    pthread_join(t, NULL);
    fr_ctx_cancel(ctx, 0);
    CHECK(fr_read_keys(ctx, keys, 16, 2, b) == 0 && b->samples[1].length == 111);
    fr_batch_recycle(b);
    fr_pool_close(pool);
    fr_ctx_close(ctx);
}

static void test_key_reader(int port)
{
    char args[256];
    snprintf(args, sizeof(args), "hosts=127.0.0.1,port=%d,table=ks.t,username=u,password=right",
             port);
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "cql";
    cfg.engine_args = args;
    enum { N = 300 };
    uint8_t *keys = malloc(N * 16);
    for (int i = 0; i < N; i++)
        make_key(keys + 16 * i, 0, (uint8_t)(i % 50), (uint8_t)i);
    fr_reader *rd;
    char err[FR_ERRLEN] = "";
    CHECK(fr_reader_open_keys(&cfg, keys, 16, N, 3, 2, &rd, err, sizeof(err)) == 0);
    free(keys); /* copied */
    if (!rd)
        return;
    int64_t idx[100];
    for (int j = 0; j < 3; j++) {
        for (int i = 0; i < 100; i++)
            idx[i] = (j * 100 + i * 7) % N;
        CHECK(fr_reader_submit(rd, idx, 100) == 0);
    }
    int bad = 0;
    for (int j = 0; j < 3; j++) {
        fr_batch *b;
        CHECK(fr_reader_next(rd, &b) == 0);
        for (size_t i = 0; i < b->count; i++) {
            int64_t k = b->indices[i];
            bad += b->samples[i].length != (k % 50) * 37 ||
                   b->label_bytes[b->labels[i].offset + 3] != (uint8_t)k;
        }
        fr_batch_recycle(b);
    }
    CHECK(bad == 0);
    CHECK(fr_reader_stat(rd, "cql_requests") == 300);
    fr_reader_close(rd);
}

/* Two nodes: B owns (-inf, -2^62] and (0, +inf) (its token -2^62, the
 * ring wrapping), A owns (-2^62, 0] (token 0). */
static int a_owns(int64_t t) { return t > -4611686018427387904LL && t <= 0; }
static int b_owns(int64_t t) { return !a_owns(t); }

static void test_token_aware_routing(void)
{
    server a, b;
    server_start(&a, "0", a_owns);
    server_start(&b, "-4611686018427387904", b_owns);
    char args[256];
    snprintf(args, sizeof(args),
             "hosts=127.0.0.1:%d;127.0.0.1:%d,table=ks.t,username=u,password=right", a.port,
             b.port);
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "cql";
    cfg.engine_args = args;
    fr_ctx *ctx;
    char err[FR_ERRLEN] = "";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    if (ctx) {
        CHECK(fr_ctx_stat(ctx, "cql_ring_tokens") == 2);
        enum { N = 400 };
        uint8_t *keys = malloc(N * 16);
        for (int i = 0; i < N; i++) {
            make_key(keys + 16 * i, 0, 2, 0);
            keys[16 * i + 5] = (uint8_t)i;
            keys[16 * i + 6] = (uint8_t)(i >> 8);
        }
        fr_pool *pool = fr_pool_new();
        fr_batch *bt = fr_pool_get(pool);
        CHECK(fr_batch_prepare(bt, N) == 0);
        CHECK(fr_read_keys(ctx, keys, 16, N, bt) == 0);
        int ok = 0;
        for (int i = 0; i < N; i++)
            ok += bt->samples[i].length == 74;
        CHECK(ok == N);
        int na = atomic_load(&a.executes), nb = atomic_load(&b.executes);
        CHECK(na + nb == N && na > N / 8 && nb > N / 8); /* both own a share */
        CHECK(atomic_load(&a.misrouted) == 0 && atomic_load(&b.misrouted) == 0);
        fr_batch_recycle(bt);
        fr_pool_close(pool);
        fr_ctx_close(ctx);
        free(keys);
    }
    server_stop(&a);
    server_stop(&b);
}

int main(void)
{
    test_token_aware_routing();
    server s;
    server_start(&s, NULL, NULL);
    test_rows(s.port);
    test_wrong_password_and_closed_port(s.port);
    test_stall_cancel_and_timeout(s.port);
    test_key_reader(s.port);
    server_stop(&s);
    return fr_test_failures ? 1 : 0;
}
