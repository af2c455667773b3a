/*
 * cql_proto: the CQL native protocol, version 4, as bytes: frames built
 * into a growable buffer and server frames parsed from a buffer. No I/O,
 * no allocation in the parsers: every function that reads server bytes
 * takes (buf, len), checks every length against len and returns -EPROTO
 * for anything malformed, so each can be fuzzed alone
 * (csrc/tests/fuzz/fuzz_cql.c, test_cql_proto's seeded fuzz).
 *
 * The subset a reader needs: STARTUP, AUTH_RESPONSE (SASL PLAIN), OPTIONS,
 * QUERY, PREPARE, EXECUTE; READY, AUTHENTICATE, AUTH_SUCCESS,
 * AUTH_CHALLENGE, ERROR, SUPPORTED and RESULT (rows, prepared, void,
 * set_keyspace, schema_change). Version 4 rather than 5: v5 adds
 * checksummed segments around frames (CRC24 headers, CRC32 payloads),
 * which buy integrity TCP already gives on a data centre's links and cost
 * a pass over every byte; every Cassandra since 2.2 and ScyllaDB speak v4.
 *
 * Stateless: thread-safe.
 */
#ifndef FASTREAD_CQL_PROTO_H
#define FASTREAD_CQL_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define CQL_VERSION_REQ 0x04
#define CQL_VERSION_RESP 0x84
#define CQL_HEADER_LEN 9
/* The largest body accepted from a server: above Cassandra's own limit
 * (native_transport_max_frame_size, 16 MiB by default, at most 2 GiB);
 * a longer length is taken as a corrupt stream, not allocated. */
#define CQL_MAX_BODY ((uint32_t)256 << 20)
#define CQL_MAX_STREAM 32767

enum cql_opcode {
    CQL_OP_ERROR = 0x00,
    CQL_OP_STARTUP = 0x01,
    CQL_OP_READY = 0x02,
    CQL_OP_AUTHENTICATE = 0x03,
    CQL_OP_OPTIONS = 0x05,
    CQL_OP_SUPPORTED = 0x06,
    CQL_OP_QUERY = 0x07,
    CQL_OP_RESULT = 0x08,
    CQL_OP_PREPARE = 0x09,
    CQL_OP_EXECUTE = 0x0A,
    CQL_OP_EVENT = 0x0C,
    CQL_OP_AUTH_CHALLENGE = 0x0E,
    CQL_OP_AUTH_RESPONSE = 0x0F,
    CQL_OP_AUTH_SUCCESS = 0x10,
};

enum cql_result_kind {
    CQL_RESULT_VOID = 1,
    CQL_RESULT_ROWS = 2,
    CQL_RESULT_SET_KEYSPACE = 3,
    CQL_RESULT_PREPARED = 4,
    CQL_RESULT_SCHEMA_CHANGE = 5,
};

/* Error codes (the protocol's section 9) we act on. */
enum cql_error_code {
    CQL_ERR_SERVER = 0x0000,
    CQL_ERR_PROTOCOL = 0x000A,
    CQL_ERR_BAD_CREDENTIALS = 0x0100,
    CQL_ERR_UNAVAILABLE = 0x1000,
    CQL_ERR_OVERLOADED = 0x1001,
    CQL_ERR_BOOTSTRAPPING = 0x1002,
    CQL_ERR_TRUNCATE = 0x1003,
    CQL_ERR_WRITE_TIMEOUT = 0x1100,
    CQL_ERR_READ_TIMEOUT = 0x1200,
    CQL_ERR_READ_FAILURE = 0x1300,
    CQL_ERR_FUNCTION_FAILURE = 0x1400,
    CQL_ERR_WRITE_FAILURE = 0x1500,
    CQL_ERR_SYNTAX = 0x2000,
    CQL_ERR_UNAUTHORIZED = 0x2100,
    CQL_ERR_INVALID = 0x2200,
    CQL_ERR_CONFIG = 0x2300,
    CQL_ERR_ALREADY_EXISTS = 0x2400,
    CQL_ERR_UNPREPARED = 0x2500,
};

/* Consistency levels. */
enum cql_consistency {
    CQL_CONSISTENCY_ONE = 0x0001,
    CQL_CONSISTENCY_QUORUM = 0x0004,
    CQL_CONSISTENCY_ALL = 0x0005,
    CQL_CONSISTENCY_LOCAL_QUORUM = 0x0006,
    CQL_CONSISTENCY_LOCAL_ONE = 0x000A,
};

/* Column types (the protocol's [option] ids) the reader checks. */
enum cql_type {
    CQL_TYPE_CUSTOM = 0x0000,
    CQL_TYPE_ASCII = 0x0001,
    CQL_TYPE_BIGINT = 0x0002,
    CQL_TYPE_BLOB = 0x0003,
    CQL_TYPE_INT = 0x0009,
    CQL_TYPE_UUID = 0x000C,
    CQL_TYPE_VARCHAR = 0x000D,
    CQL_TYPE_TIMEUUID = 0x000F,
    CQL_TYPE_LIST = 0x0020,
    CQL_TYPE_MAP = 0x0021,
    CQL_TYPE_SET = 0x0022,
    CQL_TYPE_UDT = 0x0030,
    CQL_TYPE_TUPLE = 0x0031,
};

typedef struct cql_header {
    uint8_t version;
    uint8_t flags;
    int16_t stream;
    uint8_t opcode;
    uint32_t length; /* of the body that follows */
} cql_header;

/* A frame being built: bytes appended at the end; `failed` once an
 * allocation failed (later appends are no-ops, the caller checks once). */
typedef struct cql_buf {
    uint8_t *data;
    size_t len, cap;
    int failed;
} cql_buf;

void cql_buf_free(cql_buf *b);
/* Drops the first n bytes (sent), keeping the rest. */
void cql_buf_consume(cql_buf *b, size_t n);

/* Requests, appended to b (0, or -ENOMEM). Strings are NUL-terminated. */
int cql_put_startup(cql_buf *b, int16_t stream);
int cql_put_options(cql_buf *b, int16_t stream);
/* SASL PLAIN: the token "\0user\0password". */
int cql_put_auth_plain(cql_buf *b, int16_t stream, const char *user, const char *password);
int cql_put_query(cql_buf *b, int16_t stream, const char *query, uint16_t consistency);
int cql_put_prepare(cql_buf *b, int16_t stream, const char *query);
/* EXECUTE of a prepared statement with one bound value (the key),
 * skip_metadata set: the rows come without column specs (known from the
 * PREPARE's result metadata). */
int cql_put_execute(cql_buf *b, int16_t stream, const uint8_t *id, size_t id_len,
                    uint16_t consistency, const uint8_t *value, size_t value_len);

/* A frame header from buf[0..len): 0, -EAGAIN if len < CQL_HEADER_LEN, or
 * -EPROTO (not a v4 response, a body over CQL_MAX_BODY, a compressed
 * frame: we never ask for compression). */
int cql_parse_header(const uint8_t *buf, size_t len, cql_header *h);

/* An ERROR body: its code and message (truncated to fit msg[msg_len],
 * bytes that are not printable ASCII replaced by '?'). For UNPREPARED the
 * statement id is not returned: the reader prepares again anyway. 0 or
 * -EPROTO. */
int cql_parse_error(const uint8_t *body, size_t len, int32_t *code, char *msg, size_t msg_len);
/* The name of an error code ("read_timeout", ...), "error" if unknown. */
const char *cql_error_name(int32_t code);

/* A RESULT body's kind: 0 and *kind, or -EPROTO. */
int cql_parse_result_kind(const uint8_t *body, size_t len, int32_t *kind);

/* What a PREPARED result says: the statement id (at most 64 bytes; a
 * longer one is -EPROTO), the bound variables' types, and the result
 * columns' types, at most CQL_MAX_COLUMNS of each (more: -EPROTO). */
#define CQL_MAX_ID 64
#define CQL_MAX_COLUMNS 8
typedef struct cql_prepared {
    uint8_t id[CQL_MAX_ID];
    size_t id_len;
    int nbound;
    uint16_t bound_types[CQL_MAX_COLUMNS];
    int ncolumns;
    uint16_t column_types[CQL_MAX_COLUMNS];
} cql_prepared;
int cql_parse_prepared(const uint8_t *body, size_t len, cql_prepared *out);

/* A ROWS result: its row count and where the rows' cells start. The
 * metadata is skipped whether or not it is there (skip_metadata asked the
 * server to leave it out; it may send it anyway); *ncolumns is its
 * columns_count. Paging state is refused (-EPROTO: we ask for a single
 * row by its key). */
typedef struct cql_rows {
    int32_t ncolumns;
    int32_t nrows;
    size_t cells; /* offset in the body of the first row's first cell */
} cql_rows;
int cql_parse_rows(const uint8_t *body, size_t len, cql_rows *out);
/* The cell at *pos in body[0..len): 0 and (*off, *cell_len) where its
 * bytes are (*cell_len -1: null), *pos advanced past it; or -EPROTO. */
int cql_next_cell(const uint8_t *body, size_t len, size_t *pos, size_t *off, int32_t *cell_len);

/* An AUTHENTICATE body: the authenticator's class name into out[len].
 * 0 or -EPROTO. */
int cql_parse_authenticate(const uint8_t *body, size_t len, char *out, size_t out_len);

/* The tokens of a ROWS result of `SELECT tokens FROM system.local` (one
 * row, one cell: a set<varchar> of decimal Murmur3 tokens): up to `cap`
 * into out, their count in *n. 0 or -EPROTO. */
int cql_parse_token_set(const uint8_t *body, size_t len, int64_t *out, size_t cap, size_t *n);

/* Cassandra's Murmur3Partitioner token of a partition key (its bytes as
 * the protocol sends them): MurmurHash3_x64_128 with seed 0, as
 * org.apache.cassandra.utils.MurmurHash computes it (the tail's bytes
 * sign-extended), first half, Long.MIN_VALUE mapped to Long.MAX_VALUE. */
int64_t cql_murmur3_token(const uint8_t *key, size_t len);

/* The node that owns `token` on a ring of n (token, node) pairs sorted by
 * token: the first whose token is >= it, wrapping to the first. n > 0. */
typedef struct cql_ring_entry {
    int64_t token;
    int node;
} cql_ring_entry;
int cql_ring_owner(const cql_ring_entry *ring, size_t n, int64_t token);

#endif
