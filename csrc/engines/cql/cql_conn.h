/*
 * cql_conn: one connection to one Cassandra node, as the cql engine's
 * event loop drives it: a non-blocking socket (TLS through OpenSSL where
 * it is built in), frames queued for sending, bytes received and cut into
 * frames, and the stream ids of the requests in flight.
 *
 * Opening is synchronous and bounded by a deadline: connect, TLS
 * handshake, STARTUP, SASL PLAIN where the node asks for it, PREPARE of
 * the statement. After that the engine writes frames into `out`, calls
 * cql_conn_flush and cql_conn_fill when poll() says so, and takes complete
 * frames with cql_conn_frame.
 *
 * Thread safety: a connection belongs to one engine state, used by one
 * thread at a time.
 */
#ifndef FASTREAD_CQL_CONN_H
#define FASTREAD_CQL_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "engines/cql/cql_proto.h"

/* Where and how to connect: shared by an engine's connections. */
typedef struct cql_target {
    char name[300]; /* "host:port", for messages */
    struct sockaddr_storage addr;
    socklen_t addr_len;
} cql_target;

typedef struct cql_login {
    const char *username; /* NULL or "": none */
    const char *password;
    void *tls;            /* an SSL_CTX, or NULL for plain TCP */
    const char *tls_host; /* name checked against the certificate, or NULL */
} cql_login;

typedef struct cql_conn {
    int fd;           /* -1 while down */
    void *ssl;        /* SSL *, or NULL */
    int want_write;   /* TLS needs the socket writable to go on reading */
    cql_buf out;      /* frames not yet sent */
    uint8_t *in;      /* bytes received: [in_pos, in_len) not yet taken */
    size_t in_pos, in_len, in_cap;
    /* Streams 1..max_streams: stream_owner[s] is the sample a request on s
     * is for, -1 free, -2 abandoned (its answer, when it comes, is
     * dropped: the sample was sent again elsewhere). */
    int32_t *stream_owner;
    int16_t *free_streams;
    int nfree, max_streams;
    int inflight; /* streams owned by a sample */
    cql_prepared prepared;
    long long retry_at_ms; /* down: when to try connecting again */
    unsigned failures;     /* connection failures in a row (backoff) */
} cql_conn;

/* Readies a closed connection with `max_streams` streams (1..32767). 0 or
 * -ENOMEM. */
int cql_conn_init(cql_conn *c, int max_streams);
void cql_conn_free(cql_conn *c);

/* Connects to `t` and readies the statement `query` by the deadline
 * (CLOCK_MONOTONIC milliseconds). 0, or -errno and why in err (naming the
 * node; never the password). -EACCES: the node refused the credentials
 * (not worth retrying); -EINVAL: it refused the statement. */
int cql_conn_open(cql_conn *c, const cql_target *t, const cql_login *login, const char *query,
                  long long deadline_ms, char *err, size_t err_len);

/* One request answered synchronously on an open connection with nothing
 * in flight (stream 0): sends b's frame, waits for the answer by the
 * deadline. 0 with the answer's header and body (valid until the next
 * call on c), or -errno and why in err. */
int cql_conn_roundtrip(cql_conn *c, const cql_target *t, cql_buf *b, long long deadline_ms,
                       cql_header *h, const uint8_t **body, char *err, size_t err_len);

/* Closes the socket (streams and buffers reset; every stream free). */
void cql_conn_close(cql_conn *c);

/* Sends what `out` holds, as far as the socket takes it. 0 (the rest
 * waits for POLLOUT), or -errno: the connection is broken. */
int cql_conn_flush(cql_conn *c);
/* Reads what has arrived. 1 if bytes came, 0 if none (EAGAIN), or
 * -errno (-ECONNRESET for an orderly close by the node). */
int cql_conn_fill(cql_conn *c);
/* The next complete frame received: 1 with its header and body (valid
 * until the next cql_conn_fill), 0 if none is complete, -EPROTO for a
 * malformed header. */
int cql_conn_frame(cql_conn *c, cql_header *h, const uint8_t **body);

/* Takes a free stream for sample `owner`: the stream, or -1 if none. */
int cql_conn_take_stream(cql_conn *c, int32_t owner);
/* Gives stream s back (answered), or marks it abandoned (abandon != 0).
 * Returns who owned it (-1 free, -2 abandoned, else the sample). */
int32_t cql_conn_release_stream(cql_conn *c, int s, int abandon);

/* TLS (where OpenSSL is built in; else these say why not). A client
 * context that checks the node's certificate against the CA file `ca`
 * (NULL: the system's store; verify 0: no check at all). 0 or -errno and
 * why in err. */
int cql_tls_new(void **ctx, const char *ca, int verify, char *err, size_t err_len);
void cql_tls_free(void *ctx);
/* 0 if TLS is built in, else -ENOTSUP and why. */
int cql_tls_probe(char *why, size_t why_len);

#endif
