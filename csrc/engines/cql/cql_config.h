/*
 * cql_config: the cql engine's engine_args (fr_args_parse's table: hosts,
 * table, columns, credentials, timeouts, TLS) and its hosts resolved into
 * addresses. Names that go into the statement are checked to be plain
 * identifiers here. Stateless: thread-safe.
 */
#ifndef FASTREAD_CQL_CONFIG_H
#define FASTREAD_CQL_CONFIG_H

#include <stddef.h>

#include "engines/cql/cql_conn.h"

#define CQL_MAX_HOSTS 64
#define CQL_DEFAULT_PORT 9042

enum { LABEL_NONE, LABEL_INT, LABEL_BLOB };

typedef struct cql_config {
    char hosts[1024];
    long long port;
    char table[256];
    char id_col[64], data_col[64], label_col[64];
    int label; /* 0 none, 1 int, 2 blob */
    char username[256];
    char password[256];
    int consistency;
    long long connections, inflight, timeout_ms, connect_timeout_ms, deadline_ms, retries;
    int ssl, ssl_verify;
    char ssl_ca[512], ssl_host[256];
} cql_config;

/* engine_args into cfg (defaults filled in). 0, or -EINVAL and why in err
 * naming the key; the password never appears in it. */
int cql_parse_config(const char *args, cql_config *cfg, char *err, size_t err_len);

/* hosts "a;b:9043;[::1]:9042" resolved into out[CQL_MAX_HOSTS], *n of them
 * (default_port where an item names none). 0 or -errno and why in err. */
int cql_resolve_hosts(const char *hosts, long long default_port, cql_target *out, int *n,
                      char *err, size_t err_len);

#endif
