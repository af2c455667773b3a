/* One connection to a Cassandra node: see cql_conn.h. */
#define _GNU_SOURCE
#include "engines/cql/cql_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/base.h"
#include "fastread.h"

#ifdef FASTREAD_HAVE_OPENSSL
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

/* Room asked of the receive buffer for each read: a frame header and
 * small rows fit many times; a large row's frame is read whole into a
 * buffer grown to its size. */
#define READ_CHUNK (256u * 1024u)

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cql_conn_init(cql_conn *c, int max_streams)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->max_streams = max_streams;
    c->stream_owner = malloc((size_t)(max_streams + 1) * sizeof(*c->stream_owner));
    c->free_streams = malloc((size_t)max_streams * sizeof(*c->free_streams));
    if (!c->stream_owner || !c->free_streams) {
        cql_conn_free(c);
        return -ENOMEM;
    }
    cql_conn_close(c);
    return 0;
}

void cql_conn_free(cql_conn *c)
{
    cql_conn_close(c);
    free(c->stream_owner);
    free(c->free_streams);
    free(c->in);
    cql_buf_free(&c->out);
    c->stream_owner = NULL;
    c->free_streams = NULL;
    c->in = NULL;
}

void cql_conn_close(cql_conn *c)
{
#ifdef FASTREAD_HAVE_OPENSSL
    if (c->ssl)
        SSL_free(c->ssl); /* no close_notify: the socket goes at once */
#endif
    c->ssl = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->want_write = 0;
    c->out.len = 0;
    c->out.failed = 0;
    c->in_pos = c->in_len = 0;
    c->inflight = 0;
    if (c->stream_owner && c->free_streams) { /* both: cql_conn_init may have got one */
        /* Streams handed out newest-first from the top: low ids first. */
        c->nfree = 0;
        for (int s = c->max_streams; s >= 1; s--) {
            c->stream_owner[s] = -1;
            c->free_streams[c->nfree++] = (int16_t)s;
        }
        c->stream_owner[0] = -1;
    }
}

int cql_conn_take_stream(cql_conn *c, int32_t owner)
{
    if (c->nfree == 0)
        return -1;
    int s = c->free_streams[--c->nfree];
    c->stream_owner[s] = owner;
    c->inflight++;
    return s;
}

int32_t cql_conn_release_stream(cql_conn *c, int s, int abandon)
{
    if (s < 1 || s > c->max_streams)
        return -1;
    int32_t owner = c->stream_owner[s];
    if (owner == -1)
        return -1;
    if (owner >= 0)
        c->inflight--;
    if (abandon && owner >= 0) {
        c->stream_owner[s] = -2;
    } else {
        c->stream_owner[s] = -1;
        c->free_streams[c->nfree++] = (int16_t)s;
    }
    return owner;
}

/* ------------------------------------------------------------- raw I/O */

/* Waits for `events` on the socket until the deadline: 1 ready, 0 timed
 * out, -errno. */
static int wait_fd(int fd, short events, long long deadline_ms)
{
    for (;;) {
        long long left = deadline_ms - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return -errno;
        if (rc > 0)
            return 1;
    }
}

/* send/recv through TLS or not: >0 bytes, -EAGAIN, or -errno (-ECONNRESET
 * for end of stream). */
static long io_send(cql_conn *c, const uint8_t *p, size_t n)
{
#ifdef FASTREAD_HAVE_OPENSSL
    if (c->ssl) {
        size_t done = 0;
        int r = SSL_write_ex(c->ssl, p, n, &done);
        if (r == 1)
            return (long)done;
        int e = SSL_get_error(c->ssl, r);
        ERR_clear_error();
        return e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? -EAGAIN : -ECONNRESET;
    }
#endif
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : -errno;
    return (long)w;
}

static long io_recv(cql_conn *c, uint8_t *p, size_t n)
{
#ifdef FASTREAD_HAVE_OPENSSL
    if (c->ssl) {
        size_t got = 0;
        int r = SSL_read_ex(c->ssl, p, n, &got);
        if (r == 1) {
            c->want_write = 0;
            return (long)got;
        }
        int e = SSL_get_error(c->ssl, r);
        ERR_clear_error();
        if (e == SSL_ERROR_WANT_READ)
            return -EAGAIN;
        if (e == SSL_ERROR_WANT_WRITE) {
            c->want_write = 1;
            return -EAGAIN;
        }
        return -ECONNRESET;
    }
#endif
    ssize_t r = recv(c->fd, p, n, 0);
    if (r < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : -errno;
    if (r == 0)
        return -ECONNRESET;
    return (long)r;
}

int cql_conn_flush(cql_conn *c)
{
    if (c->out.failed)
        return -ENOMEM;
    size_t sent = 0;
    while (sent < c->out.len) {
        long w = io_send(c, c->out.data + sent, c->out.len - sent);
        if (w == -EAGAIN)
            break;
        if (w < 0) {
            cql_buf_consume(&c->out, sent);
            return (int)w;
        }
        sent += (size_t)w;
    }
    cql_buf_consume(&c->out, sent);
    return 0;
}

/* Room for at least `need` more bytes after in_len (moving what is not
 * taken yet to the front first). 0 or -ENOMEM. */
static int in_room(cql_conn *c, size_t need)
{
    if (c->in_pos > 0 && (c->in_pos == c->in_len || c->in_cap - c->in_len < need)) {
        memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
        c->in_len -= c->in_pos;
        c->in_pos = 0;
    }
    if (c->in_cap - c->in_len >= need)
        return 0;
    size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
    while (cap - c->in_len < need)
        cap *= 2;
    uint8_t *p = realloc(c->in, cap);
    if (!p)
        return -ENOMEM;
    c->in = p;
    c->in_cap = cap;
    return 0;
}

int cql_conn_fill(cql_conn *c)
{
    /* The frame being received, when its header is here: room for all of
     * it, so a large row arrives in few reads. */
    size_t need = READ_CHUNK;
    cql_header h;
    if (cql_parse_header(c->in + c->in_pos, c->in_len - c->in_pos, &h) == 0) {
        size_t frame = CQL_HEADER_LEN + (size_t)h.length, have = c->in_len - c->in_pos;
        if (frame > have && frame - have > need)
            need = frame - have;
    }
    if (in_room(c, need) != 0)
        return -ENOMEM;
    int got_any = 0;
    for (;;) {
        size_t room = c->in_cap - c->in_len;
        if (room == 0)
            break;
        long r = io_recv(c, c->in + c->in_len, room);
        if (r == -EAGAIN)
            break;
        if (r < 0)
            return got_any ? 1 : (int)r; /* the bytes first; the next call fails */
        c->in_len += (size_t)r;
        got_any = 1;
        /* A plain socket: poll() says when more is there. TLS: records
         * already decrypted inside OpenSSL are invisible to poll(), so
         * read on until it wants the socket again (or the room is full:
         * the caller takes frames and calls again). */
        if (!c->ssl)
            break;
    }
    return got_any;
}

int cql_conn_frame(cql_conn *c, cql_header *h, const uint8_t **body)
{
    size_t have = c->in_len - c->in_pos;
    int rc = cql_parse_header(c->in + c->in_pos, have, h);
    if (rc == -EAGAIN)
        return 0;
    if (rc)
        return rc;
    if (have < CQL_HEADER_LEN + (size_t)h->length)
        return 0;
    *body = c->in + c->in_pos + CQL_HEADER_LEN;
    c->in_pos += CQL_HEADER_LEN + (size_t)h->length;
    return 1;
}

/* ------------------------------------------------------------ opening */

static int tcp_connect(cql_conn *c, const cql_target *t, long long deadline_ms, char *err,
                       size_t err_len)
{
    int fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        fr_set_err(err, err_len, "cql: %s: socket: %s", t->name, strerror(e));
        return -e;
    }
    int one = 1;
    /* Small requests must leave at once, not wait for Nagle's timer. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        int e = errno;
        close(fd);
        fr_set_err(err, err_len, "cql: %s: TCP_NODELAY: %s", t->name, strerror(e));
        return -e;
    }
    int rc = connect(fd, (const struct sockaddr *)&t->addr, t->addr_len);
    if (rc != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        fr_set_err(err, err_len, "cql: %s: cannot connect: %s", t->name, strerror(e));
        return -e;
    }
    if (rc != 0) {
        int w = wait_fd(fd, POLLOUT, deadline_ms);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
            soerr = errno;
        if (w <= 0 || soerr) {
            close(fd);
            int e = w == 0 ? ETIMEDOUT : w < 0 ? -w : soerr;
            fr_set_err(err, err_len, "cql: %s: cannot connect: %s", t->name,
                       w == 0 ? "no answer (connect timed out)" : strerror(e));
            return -e;
        }
    }
    c->fd = fd;
    return 0;
}

#ifdef FASTREAD_HAVE_OPENSSL
static int tls_handshake(cql_conn *c, const cql_target *t, const cql_login *login,
                         long long deadline_ms, char *err, size_t err_len)
{
    SSL *ssl = SSL_new(login->tls);
    if (!ssl) {
        fr_set_err(err, err_len, "cql: %s: SSL_new failed", t->name);
        return -ENOMEM;
    }
    c->ssl = ssl;
    if (SSL_set_fd(ssl, c->fd) != 1 ||
        (login->tls_host && *login->tls_host &&
         (SSL_set_tlsext_host_name(ssl, login->tls_host) != 1 ||
          SSL_set1_host(ssl, login->tls_host) != 1))) {
        fr_set_err(err, err_len, "cql: %s: cannot set up TLS", t->name);
        return -EIO;
    }
    for (;;) {
        int r = SSL_connect(ssl);
        if (r == 1)
            return 0;
        int e = SSL_get_error(ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            int w = wait_fd(c->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ms);
            if (w <= 0) {
                fr_set_err(err, err_len, "cql: %s: TLS handshake: %s", t->name,
                           w == 0 ? "no answer in time" : strerror(-w));
                return w == 0 ? -ETIMEDOUT : w;
            }
            continue;
        }
        char why[160] = "the connection was closed";
        unsigned long code = ERR_get_error();
        if (code)
            ERR_error_string_n(code, why, sizeof(why));
        long verify = SSL_get_verify_result(ssl);
        ERR_clear_error();
        if (verify != X509_V_OK)
            fr_set_err(err, err_len, "cql: %s: TLS: the node's certificate was refused: %s",
                       t->name, X509_verify_cert_error_string(verify));
        else
            fr_set_err(err, err_len, "cql: %s: TLS handshake failed: %s", t->name, why);
        return -ECONNREFUSED;
    }
}
#endif

int cql_conn_roundtrip(cql_conn *c, const cql_target *t, cql_buf *b, long long deadline_ms,
                       cql_header *h, const uint8_t **body, char *err, size_t err_len)
{
    if (b->failed)
        return -ENOMEM;
    size_t sent = 0;
    while (sent < b->len) {
        long w = io_send(c, b->data + sent, b->len - sent);
        if (w == -EAGAIN) {
            int r = wait_fd(c->fd, POLLOUT, deadline_ms);
            if (r <= 0) {
                fr_set_err(err, err_len, "cql: %s: %s", t->name,
                           r == 0 ? "no answer in time" : strerror(-r));
                return r == 0 ? -ETIMEDOUT : r;
            }
            continue;
        }
        if (w < 0) {
            fr_set_err(err, err_len, "cql: %s: send: %s", t->name, strerror((int)-w));
            return (int)w;
        }
        sent += (size_t)w;
    }
    b->len = 0;
    for (;;) {
        int f = cql_conn_frame(c, h, body);
        if (f < 0) {
            fr_set_err(err, err_len, "cql: %s: malformed frame (not a CQL v4 node?)", t->name);
            return -EPROTO;
        }
        if (f == 1) {
            if (h->opcode == CQL_OP_EVENT)
                continue; /* never registered for: skip */
            return 0;
        }
        int r = cql_conn_fill(c);
        if (r < 0) {
            fr_set_err(err, err_len, "cql: %s: %s", t->name,
                       r == -ECONNRESET ? "the node closed the connection" : strerror(-r));
            return r;
        }
        if (r == 0) {
            int w = wait_fd(c->fd, c->want_write ? POLLOUT : POLLIN, deadline_ms);
            if (w <= 0) {
                fr_set_err(err, err_len, "cql: %s: %s", t->name,
                           w == 0 ? "no answer in time" : strerror(-w));
                return w == 0 ? -ETIMEDOUT : w;
            }
        }
    }
}

/* An answer that should have been `want`: the node's ERROR, or a
 * protocol mix-up, in err. Returns the errno for it. */
static int unexpected(const cql_target *t, const cql_header *h, const uint8_t *body,
                      const char *what, char *err, size_t err_len)
{
    if (h->opcode == CQL_OP_ERROR) {
        int32_t code;
        char msg[FR_ERRLEN];
        if (cql_parse_error(body, h->length, &code, msg, sizeof(msg)) == 0) {
            fr_set_err(err, err_len, "cql: %s: %s: %s (%s)", t->name, what, msg,
                       cql_error_name(code));
            if (code == CQL_ERR_BAD_CREDENTIALS || code == CQL_ERR_UNAUTHORIZED)
                return -EACCES;
            if (code == CQL_ERR_INVALID || code == CQL_ERR_SYNTAX || code == CQL_ERR_CONFIG)
                return -EINVAL;
            if (code == CQL_ERR_PROTOCOL)
                return -EPROTO;
            return -EIO;
        }
    }
    fr_set_err(err, err_len, "cql: %s: %s: unexpected answer (opcode 0x%02x)", t->name, what,
               h->opcode);
    return -EPROTO;
}

static int handshake(cql_conn *c, const cql_target *t, const cql_login *login, const char *query,
                     long long deadline_ms, char *err, size_t err_len)
{
    cql_buf b = {0};
    cql_header h;
    const uint8_t *body;
    int rc = cql_put_startup(&b, 0);
    if (rc == 0)
        rc = cql_conn_roundtrip(c, t, &b, deadline_ms, &h, &body, err, err_len);
    if (rc == 0 && h.opcode == CQL_OP_AUTHENTICATE) {
        char who[128] = "";
        (void)cql_parse_authenticate(body, h.length, who, sizeof(who));
        if (!login->username || !*login->username) {
            fr_set_err(err, err_len,
                       "cql: %s asks for authentication (%s): give a username and password",
                       t->name, who);
            rc = -EACCES;
        } else {
            rc = cql_put_auth_plain(&b, 0, login->username, login->password ? login->password : "");
            if (rc == 0)
                rc = cql_conn_roundtrip(c, t, &b, deadline_ms, &h, &body, err, err_len);
            /* The token held the password: not left in freed memory. */
            if (b.data)
                memset(b.data, 0, b.cap);
            if (rc == 0 && h.opcode == CQL_OP_AUTH_CHALLENGE) {
                fr_set_err(err, err_len,
                           "cql: %s: the authenticator (%s) wants more than SASL PLAIN", t->name,
                           who);
                rc = -EACCES;
            } else if (rc == 0 && h.opcode != CQL_OP_AUTH_SUCCESS) {
                char why[FR_ERRLEN];
                rc = unexpected(t, &h, body, "login", why, sizeof(why));
                if (rc == -EACCES)
                    fr_set_err(err, err_len, "cql: %s: authentication failed for user '%s' "
                               "(wrong username or password)", t->name, login->username);
                else
                    fr_set_err(err, err_len, "%s", why);
            }
        }
    } else if (rc == 0 && h.opcode != CQL_OP_READY) {
        rc = unexpected(t, &h, body, "STARTUP", err, err_len);
    }
    if (rc == 0 && query) {
        rc = cql_put_prepare(&b, 0, query);
        if (rc == 0)
            rc = cql_conn_roundtrip(c, t, &b, deadline_ms, &h, &body, err, err_len);
        if (rc == 0 && h.opcode != CQL_OP_RESULT)
            rc = unexpected(t, &h, body, query, err, err_len);
        else if (rc == 0 && cql_parse_prepared(body, h.length, &c->prepared) != 0) {
            fr_set_err(err, err_len, "cql: %s: malformed PREPARED answer to %s", t->name, query);
            rc = -EPROTO;
        }
    }
    cql_buf_free(&b);
    return rc;
}

int cql_conn_open(cql_conn *c, const cql_target *t, const cql_login *login, const char *query,
                  long long deadline_ms, char *err, size_t err_len)
{
    cql_conn_close(c);
    int rc = tcp_connect(c, t, deadline_ms, err, err_len);
#ifdef FASTREAD_HAVE_OPENSSL
    if (rc == 0 && login->tls)
        rc = tls_handshake(c, t, login, deadline_ms, err, err_len);
#else
    if (rc == 0 && login->tls) {
        fr_set_err(err, err_len, "cql: TLS is not built in");
        rc = -ENOTSUP;
    }
#endif
    if (rc == 0)
        rc = handshake(c, t, login, query, deadline_ms, err, err_len);
    if (rc)
        cql_conn_close(c);
    return rc;
}

/* ------------------------------------------------------------------ TLS */

int cql_tls_probe(char *why, size_t why_len)
{
#ifdef FASTREAD_HAVE_OPENSSL
    (void)why;
    (void)why_len;
    return 0;
#else
    fr_set_err(why, why_len, "TLS (ssl=1) is not built in: OpenSSL was not found by pkg-config "
                             "at build time (apt-get install libssl-dev, then rebuild)");
    return -ENOTSUP;
#endif
}

int cql_tls_new(void **out, const char *ca, int verify, char *err, size_t err_len)
{
    *out = NULL;
#ifdef FASTREAD_HAVE_OPENSSL
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        fr_set_err(err, err_len, "cql: cannot make a TLS context");
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = ca && *ca ? SSL_CTX_load_verify_locations(ctx, ca, NULL)
                           : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            ERR_clear_error();
            SSL_CTX_free(ctx);
            fr_set_err(err, err_len, "cql: cannot load the CA certificates %s%s",
                       ca && *ca ? "from " : "(the system's store)", ca && *ca ? ca : "");
            return -EINVAL;
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    *out = ctx;
    return 0;
#else
    (void)ca;
    (void)verify;
    return cql_tls_probe(err, err_len);
#endif
}

void cql_tls_free(void *ctx)
{
#ifdef FASTREAD_HAVE_OPENSSL
    SSL_CTX_free(ctx);
#else
    (void)ctx;
#endif
}
