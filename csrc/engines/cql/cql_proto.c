/* The CQL native protocol v4 as bytes: see cql_proto.h. Every read of
 * server bytes goes through `rd` below, whose reads fail (and keep
 * failing) rather than run past the end. */
#include "engines/cql/cql_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- writing */

void cql_buf_free(cql_buf *b)
{
    free(b->data);
    *b = (cql_buf){0};
}

void cql_buf_consume(cql_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

static uint8_t *grow(cql_buf *b, size_t n)
{
    if (b->failed)
        return NULL;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->data, cap);
        if (!p) {
            b->failed = 1;
            return NULL;
        }
        b->data = p;
        b->cap = cap;
    }
    uint8_t *at = b->data + b->len;
    b->len += n;
    return at;
}

static void put_u8(cql_buf *b, uint8_t v)
{
    uint8_t *p = grow(b, 1);
    if (p)
        p[0] = v;
}

static void put_u16(cql_buf *b, uint16_t v)
{
    uint8_t *p = grow(b, 2);
    if (p) {
        p[0] = (uint8_t)(v >> 8);
        p[1] = (uint8_t)v;
    }
}

static void put_u32_at(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put_u32(cql_buf *b, uint32_t v)
{
    uint8_t *p = grow(b, 4);
    if (p)
        put_u32_at(p, v);
}

static void put_raw(cql_buf *b, const void *src, size_t n)
{
    uint8_t *p = grow(b, n);
    if (p && n)
        memcpy(p, src, n);
}

static void put_string(cql_buf *b, const char *s)
{
    size_t n = strlen(s);
    put_u16(b, (uint16_t)n);
    put_raw(b, s, n);
}

static void put_long_string(cql_buf *b, const char *s)
{
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put_raw(b, s, n);
}

/* Starts a frame; returns where its header is (the body length is filled
 * in by end_frame), or (size_t)-1. */
static size_t begin_frame(cql_buf *b, int16_t stream, uint8_t opcode)
{
    size_t at = b->len;
    put_u8(b, CQL_VERSION_REQ);
    put_u8(b, 0);
    put_u16(b, (uint16_t)stream);
    put_u8(b, opcode);
    put_u32(b, 0);
    return b->failed ? (size_t)-1 : at;
}

static int end_frame(cql_buf *b, size_t at)
{
    if (b->failed || at == (size_t)-1)
        return -ENOMEM;
    put_u32_at(b->data + at + 5, (uint32_t)(b->len - at - CQL_HEADER_LEN));
    return 0;
}

int cql_put_startup(cql_buf *b, int16_t stream)
{
    size_t at = begin_frame(b, stream, CQL_OP_STARTUP);
    put_u16(b, 1); /* a string map of one entry; no COMPRESSION */
    put_string(b, "CQL_VERSION");
    put_string(b, "3.0.0");
    return end_frame(b, at);
}

int cql_put_options(cql_buf *b, int16_t stream)
{
    return end_frame(b, begin_frame(b, stream, CQL_OP_OPTIONS));
}

int cql_put_auth_plain(cql_buf *b, int16_t stream, const char *user, const char *password)
{
    size_t at = begin_frame(b, stream, CQL_OP_AUTH_RESPONSE);
    size_t nu = strlen(user), np = strlen(password);
    put_u32(b, (uint32_t)(nu + np + 2));
    put_u8(b, 0);
    put_raw(b, user, nu);
    put_u8(b, 0);
    put_raw(b, password, np);
    return end_frame(b, at);
}

int cql_put_query(cql_buf *b, int16_t stream, const char *query, uint16_t consistency)
{
    size_t at = begin_frame(b, stream, CQL_OP_QUERY);
    put_long_string(b, query);
    put_u16(b, consistency);
    put_u8(b, 0); /* no values, metadata wanted, no paging */
    return end_frame(b, at);
}

int cql_put_prepare(cql_buf *b, int16_t stream, const char *query)
{
    size_t at = begin_frame(b, stream, CQL_OP_PREPARE);
    put_long_string(b, query);
    return end_frame(b, at);
}

int cql_put_execute(cql_buf *b, int16_t stream, const uint8_t *id, size_t id_len,
                    uint16_t consistency, const uint8_t *value, size_t value_len)
{
    size_t at = begin_frame(b, stream, CQL_OP_EXECUTE);
    put_u16(b, (uint16_t)id_len);
    put_raw(b, id, id_len);
    put_u16(b, consistency);
    put_u8(b, 0x01 | 0x02); /* values, skip_metadata */
    put_u16(b, 1);
    put_u32(b, (uint32_t)value_len);
    put_raw(b, value, value_len);
    return end_frame(b, at);
}

/* ---------------------------------------------------------------- reading */

typedef struct rd {
    const uint8_t *p;
    size_t len, pos;
    int bad;
} rd;

static int take(rd *r, size_t n)
{
    if (r->bad || n > r->len - r->pos) {
        r->bad = 1;
        return 0;
    }
    r->pos += n;
    return 1;
}

static uint32_t get_u32(rd *r)
{
    size_t at = r->pos;
    if (!take(r, 4))
        return 0;
    const uint8_t *p = r->p + at;
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int32_t get_i32(rd *r) { return (int32_t)get_u32(r); }

static uint16_t get_u16(rd *r)
{
    size_t at = r->pos;
    if (!take(r, 2))
        return 0;
    return (uint16_t)(r->p[at] << 8 | r->p[at + 1]);
}

/* A [string]: where its bytes start, *n its length. */
static size_t get_string(rd *r, size_t *n)
{
    *n = get_u16(r);
    size_t at = r->pos;
    take(r, *n);
    return at;
}

static void skip_string(rd *r)
{
    size_t n;
    (void)get_string(r, &n);
}

/* A [bytes]: where its bytes start, *n its length (-1: null). */
static size_t get_bytes(rd *r, int32_t *n)
{
    *n = get_i32(r);
    size_t at = r->pos;
    if (*n > 0)
        take(r, (size_t)*n);
    else if (*n < -1)
        r->bad = 1;
    return at;
}

/* Skips a type [option], nested types included (depth-bounded). */
static uint16_t skip_option(rd *r, int depth)
{
    uint16_t id = get_u16(r);
    if (r->bad || depth > 16) {
        r->bad = 1;
        return id;
    }
    switch (id) {
    case CQL_TYPE_CUSTOM:
        skip_string(r);
        break;
    case CQL_TYPE_LIST:
    case CQL_TYPE_SET:
        skip_option(r, depth + 1);
        break;
    case CQL_TYPE_MAP:
        skip_option(r, depth + 1);
        skip_option(r, depth + 1);
        break;
    case CQL_TYPE_UDT: {
        skip_string(r);
        skip_string(r);
        uint16_t n = get_u16(r);
        for (uint16_t i = 0; i < n && !r->bad; i++) {
            skip_string(r);
            skip_option(r, depth + 1);
        }
        break;
    }
    case CQL_TYPE_TUPLE: {
        uint16_t n = get_u16(r);
        for (uint16_t i = 0; i < n && !r->bad; i++)
            skip_option(r, depth + 1);
        break;
    }
    default:
        if (id > 0x0015 && id != 0x0030 && id != 0x0031)
            r->bad = 1; /* no such type in v4 (0x0015 duration is the last simple one) */
        break;
    }
    return id;
}

/* Column specs of a metadata block: `n` columns, their types into
 * types[cap] when given. */
static void column_specs(rd *r, int32_t flags, int32_t n, uint16_t *types, int cap)
{
    int global = flags & 0x0001;
    if (global) {
        skip_string(r);
        skip_string(r);
    }
    for (int32_t i = 0; i < n && !r->bad; i++) {
        if (!global) {
            skip_string(r);
            skip_string(r);
        }
        skip_string(r); /* the column's name */
        uint16_t t = skip_option(r, 0);
        if (types && i < cap)
            types[i] = t;
    }
}

/* A result metadata block (rows, or a PREPARED's second block). */
static void result_metadata(rd *r, int32_t *ncolumns, uint16_t *types, int cap)
{
    int32_t flags = get_i32(r);
    int32_t n = get_i32(r);
    if (n < 0 || n > 65535) /* a table has at most 64 Ki columns */
        r->bad = 1;
    *ncolumns = n;
    if (r->bad)
        return;
    if (flags & 0x0002) { /* Has_more_pages: never for one row by its key */
        r->bad = 1;
        return;
    }
    if (flags & 0x0004) /* No_metadata */
        return;
    column_specs(r, flags, n, types, cap);
}

int cql_parse_header(const uint8_t *buf, size_t len, cql_header *h)
{
    if (len < CQL_HEADER_LEN)
        return -EAGAIN;
    h->version = buf[0];
    h->flags = buf[1];
    h->stream = (int16_t)(buf[2] << 8 | buf[3]);
    h->opcode = buf[4];
    h->length = (uint32_t)buf[5] << 24 | (uint32_t)buf[6] << 16 | (uint32_t)buf[7] << 8 | buf[8];
    /* Flags: compression (0x01) was never asked for; tracing (0x02),
     * custom payload (0x04) and warnings (0x08) would put bytes before the
     * body's own, and none is asked for either. */
    if (h->version != CQL_VERSION_RESP || (h->flags & 0x0F) || h->length > CQL_MAX_BODY)
        return -EPROTO;
    return 0;
}

int cql_parse_error(const uint8_t *body, size_t len, int32_t *code, char *msg, size_t msg_len)
{
    rd r = {body, len, 0, 0};
    *code = get_i32(&r);
    size_t n;
    size_t at = get_string(&r, &n);
    if (msg_len) {
        msg[0] = 0;
        if (!r.bad) {
            size_t k = n < msg_len - 1 ? n : msg_len - 1;
            for (size_t i = 0; i < k; i++) {
                uint8_t c = body[at + i];
                msg[i] = c >= 0x20 && c < 0x7F ? (char)c : '?';
            }
            msg[k] = 0;
        }
    }
    return r.bad ? -EPROTO : 0;
}

const char *cql_error_name(int32_t code)
{
    switch (code) {
    case CQL_ERR_SERVER: return "server_error";
    case CQL_ERR_PROTOCOL: return "protocol_error";
    case CQL_ERR_BAD_CREDENTIALS: return "bad_credentials";
    case CQL_ERR_UNAVAILABLE: return "unavailable";
    case CQL_ERR_OVERLOADED: return "overloaded";
    case CQL_ERR_BOOTSTRAPPING: return "is_bootstrapping";
    case CQL_ERR_TRUNCATE: return "truncate_error";
    case CQL_ERR_WRITE_TIMEOUT: return "write_timeout";
    case CQL_ERR_READ_TIMEOUT: return "read_timeout";
    case CQL_ERR_READ_FAILURE: return "read_failure";
    case CQL_ERR_FUNCTION_FAILURE: return "function_failure";
    case CQL_ERR_WRITE_FAILURE: return "write_failure";
    case CQL_ERR_SYNTAX: return "syntax_error";
    case CQL_ERR_UNAUTHORIZED: return "unauthorized";
    case CQL_ERR_INVALID: return "invalid";
    case CQL_ERR_CONFIG: return "config_error";
    case CQL_ERR_ALREADY_EXISTS: return "already_exists";
    case CQL_ERR_UNPREPARED: return "unprepared";
    default: return "error";
    }
}

int cql_parse_result_kind(const uint8_t *body, size_t len, int32_t *kind)
{
    rd r = {body, len, 0, 0};
    *kind = get_i32(&r);
    return r.bad ? -EPROTO : 0;
}

int cql_parse_prepared(const uint8_t *body, size_t len, cql_prepared *out)
{
    rd r = {body, len, 0, 0};
    memset(out, 0, sizeof(*out));
    if (get_i32(&r) != CQL_RESULT_PREPARED)
        return -EPROTO;
    size_t n = get_u16(&r);
    size_t at = r.pos;
    if (!take(&r, n) || n == 0 || n > CQL_MAX_ID)
        return -EPROTO;
    memcpy(out->id, body + at, n);
    out->id_len = n;
    /* The bound variables' metadata: flags, count, partition key indices. */
    int32_t flags = get_i32(&r);
    int32_t nbound = get_i32(&r);
    int32_t npk = get_i32(&r);
    if (r.bad || nbound < 0 || nbound > CQL_MAX_COLUMNS || npk < 0 || npk > nbound)
        return -EPROTO;
    for (int32_t i = 0; i < npk; i++)
        (void)get_u16(&r);
    column_specs(&r, flags, nbound, out->bound_types, CQL_MAX_COLUMNS);
    out->nbound = nbound;
    int32_t ncols = 0;
    result_metadata(&r, &ncols, out->column_types, CQL_MAX_COLUMNS);
    if (r.bad || ncols > CQL_MAX_COLUMNS)
        return -EPROTO;
    out->ncolumns = ncols;
    return 0;
}

int cql_parse_rows(const uint8_t *body, size_t len, cql_rows *out)
{
    rd r = {body, len, 0, 0};
    if (get_i32(&r) != CQL_RESULT_ROWS)
        return -EPROTO;
    result_metadata(&r, &out->ncolumns, NULL, 0);
    out->nrows = get_i32(&r);
    if (r.bad || out->nrows < 0)
        return -EPROTO;
    out->cells = r.pos;
    return 0;
}

int cql_next_cell(const uint8_t *body, size_t len, size_t *pos, size_t *off, int32_t *cell_len)
{
    if (*pos > len)
        return -EPROTO;
    rd r = {body, len, *pos, 0};
    *off = get_bytes(&r, cell_len);
    if (r.bad)
        return -EPROTO;
    *pos = r.pos;
    return 0;
}

int cql_parse_authenticate(const uint8_t *body, size_t len, char *out, size_t out_len)
{
    rd r = {body, len, 0, 0};
    size_t n;
    size_t at = get_string(&r, &n);
    if (r.bad)
        return -EPROTO;
    if (out_len) {
        size_t k = n < out_len - 1 ? n : out_len - 1;
        for (size_t i = 0; i < k; i++) {
            uint8_t c = body[at + i];
            out[i] = c >= 0x20 && c < 0x7F ? (char)c : '?';
        }
        out[k] = 0;
    }
    return 0;
}

/* A decimal int64 from s[0..n): 0 or -1. */
static int parse_i64(const uint8_t *s, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (n && (s[0] == '-' || s[0] == '+')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n || n - i > 19)
        return -1;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

int cql_parse_token_set(const uint8_t *body, size_t len, int64_t *out, size_t cap, size_t *n)
{
    cql_rows rows;
    *n = 0;
    if (cql_parse_rows(body, len, &rows) != 0 || rows.nrows != 1 || rows.ncolumns != 1)
        return -EPROTO;
    size_t pos = rows.cells, off;
    int32_t cell;
    if (cql_next_cell(body, len, &pos, &off, &cell) != 0 || cell < 0)
        return -EPROTO;
    rd r = {body, off + (size_t)cell, off, 0};
    int32_t count = get_i32(&r);
    if (count < 0)
        return -EPROTO;
    for (int32_t i = 0; i < count && !r.bad; i++) {
        int32_t sl;
        size_t at = get_bytes(&r, &sl);
        int64_t t;
        if (r.bad || sl <= 0 || parse_i64(body + at, (size_t)sl, &t) != 0)
            return -EPROTO;
        if (*n < cap)
            out[(*n)++] = t;
    }
    return r.bad ? -EPROTO : 0;
}

/* ------------------------------------------------------------ the ring */

static uint64_t rotl64(uint64_t v, int n) { return v << n | v >> (64 - n); }

static uint64_t fmix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static uint64_t block(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* A tail byte as Java's (long) of a signed byte. */
static uint64_t sbyte(uint8_t b) { return (uint64_t)(int64_t)(int8_t)b; }

static const uint64_t C1 = 0x87c37b91114253d5ULL, C2 = 0x4cf5ad432745937fULL;

static uint64_t mix_k1(uint64_t k1) { return rotl64(k1 * C1, 31) * C2; }
static uint64_t mix_k2(uint64_t k2) { return rotl64(k2 * C2, 33) * C1; }

int64_t cql_murmur3_token(const uint8_t *key, size_t len)
{
    uint64_t h1 = 0, h2 = 0;
    size_t nblocks = len / 16;
    for (size_t i = 0; i < nblocks; i++) {
        h1 ^= mix_k1(block(key + 16 * i));
        h1 = rotl64(h1, 27) + h2;
        h1 = h1 * 5 + 0x52dce729;
        h2 ^= mix_k2(block(key + 16 * i + 8));
        h2 = rotl64(h2, 31) + h1;
        h2 = h2 * 5 + 0x38495ab5;
    }
    const uint8_t *tail = key + 16 * nblocks;
    uint64_t k1 = 0, k2 = 0;
    size_t rest = len & 15;
    for (size_t i = rest; i > 8; i--)
        k2 ^= sbyte(tail[i - 1]) << (8 * (i - 9));
    if (rest > 8)
        h2 ^= mix_k2(k2);
    for (size_t i = rest < 8 ? rest : 8; i > 0; i--)
        k1 ^= sbyte(tail[i - 1]) << (8 * (i - 1));
    if (rest > 0)
        h1 ^= mix_k1(k1);
    h1 ^= (uint64_t)len;
    h2 ^= (uint64_t)len;
    h1 += h2;
    h2 += h1;
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1 += h2;
    int64_t token = (int64_t)h1;
    return token == INT64_MIN ? INT64_MAX : token;
}

int cql_ring_owner(const cql_ring_entry *ring, size_t n, int64_t token)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ring[mid].token < token)
            lo = mid + 1;
        else
            hi = mid;
    }
    return ring[lo == n ? 0 : lo].node;
}
