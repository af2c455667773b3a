/* The cql engine's settings and hosts: see cql_config.h. */
#define _GNU_SOURCE
#include "engines/cql/cql_config.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/base.h"
#include "core/engine_args.h"
#include "engines/cql/cql_proto.h"

static int is_identifier(const char *s)
{
    if (!*s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return 0;
    return 1;
}

int cql_parse_config(const char *args, cql_config *cfg, char *err, size_t err_len)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->port = CQL_DEFAULT_PORT;
    strcpy(cfg->id_col, "id");
    strcpy(cfg->data_col, "data");
    strcpy(cfg->label_col, "label");
    cfg->label = LABEL_INT;
    cfg->connections = 1;
    cfg->inflight = 1024;
    cfg->timeout_ms = 12000;
    cfg->connect_timeout_ms = 5000;
    cfg->deadline_ms = 60000;
    cfg->retries = 5;
    cfg->ssl_verify = 1;
    int consistency = 0, verify = 1;
    int hosts_given = 0, table_given = 0;
    const fr_arg_spec specs[] = {
        {.key = "hosts", .kind = FR_ARG_STR, .out = cfg->hosts, .min = 1,
         .max = sizeof(cfg->hosts), .given = &hosts_given},
        {.key = "port", .kind = FR_ARG_INT, .out = &cfg->port, .min = 1, .max = 65535},
        {.key = "table", .kind = FR_ARG_STR, .out = cfg->table, .min = 1,
         .max = sizeof(cfg->table), .given = &table_given},
        {.key = "id_col", .kind = FR_ARG_STR, .out = cfg->id_col, .min = 1,
         .max = sizeof(cfg->id_col)},
        {.key = "data_col", .kind = FR_ARG_STR, .out = cfg->data_col, .min = 1,
         .max = sizeof(cfg->data_col)},
        {.key = "label_col", .kind = FR_ARG_STR, .out = cfg->label_col, .min = 1,
         .max = sizeof(cfg->label_col)},
        {.key = "label", .kind = FR_ARG_CHOICE, .out = &cfg->label, .choices = "none|int|blob"},
        {.key = "username", .kind = FR_ARG_STR, .out = cfg->username,
         .max = sizeof(cfg->username)},
        {.key = "password", .kind = FR_ARG_STR, .out = cfg->password,
         .max = sizeof(cfg->password), .secret = 1},
        {.key = "consistency", .kind = FR_ARG_CHOICE, .out = &consistency,
         .choices = "local_one|one|local_quorum|quorum|all"},
        {.key = "connections", .kind = FR_ARG_INT, .out = &cfg->connections, .min = 1, .max = 16},
        {.key = "inflight", .kind = FR_ARG_INT, .out = &cfg->inflight, .min = 1,
         .max = CQL_MAX_STREAM},
        {.key = "timeout_ms", .kind = FR_ARG_INT, .out = &cfg->timeout_ms, .min = 10,
         .max = 3600000},
        {.key = "connect_timeout_ms", .kind = FR_ARG_INT, .out = &cfg->connect_timeout_ms,
         .min = 10, .max = 600000},
        {.key = "deadline_ms", .kind = FR_ARG_INT, .out = &cfg->deadline_ms, .min = 10,
         .max = 3600000},
        {.key = "retries", .kind = FR_ARG_INT, .out = &cfg->retries, .min = 0, .max = 100},
        {.key = "ssl", .kind = FR_ARG_CHOICE, .out = &cfg->ssl, .choices = "0|1"},
        {.key = "ssl_verify", .kind = FR_ARG_CHOICE, .out = &verify, .choices = "0|1"},
        {.key = "ssl_ca", .kind = FR_ARG_STR, .out = cfg->ssl_ca, .max = sizeof(cfg->ssl_ca)},
        {.key = "ssl_host", .kind = FR_ARG_STR, .out = cfg->ssl_host,
         .max = sizeof(cfg->ssl_host)},
    };
    int rc = fr_args_parse("cql", args, specs, sizeof(specs) / sizeof(specs[0]), err, err_len);
    if (rc)
        return rc;
    static const uint16_t levels[] = {CQL_CONSISTENCY_LOCAL_ONE, CQL_CONSISTENCY_ONE,
                                      CQL_CONSISTENCY_LOCAL_QUORUM, CQL_CONSISTENCY_QUORUM,
                                      CQL_CONSISTENCY_ALL};
    cfg->consistency = levels[consistency];
    cfg->ssl_verify = verify;
    if (!hosts_given || !table_given) {
        fr_set_err(err, err_len, "cql: engine_args needs %s (e.g. hosts=127.0.0.1,table=ks.t)",
                   !hosts_given ? "hosts=" : "table=");
        return -EINVAL;
    }
    /* Names go into the statement unquoted (CQL folds them to lower case,
     * as the plugin's and cqlsh's unquoted names): identifiers only. */
    char *dot = strchr(cfg->table, '.');
    char ks[256] = "";
    if (dot) {
        memcpy(ks, cfg->table, (size_t)(dot - cfg->table));
        ks[dot - cfg->table] = 0;
    }
    if (!dot || !is_identifier(ks) || !is_identifier(dot + 1)) {
        fr_set_err(err, err_len, "cql: engine_args table must be KEYSPACE.TABLE (identifiers: "
                                 "letters, digits, _), got '%s'", cfg->table);
        return -EINVAL;
    }
    const char *cols[][2] = {{"id_col", cfg->id_col},
                             {"data_col", cfg->data_col},
                             {"label_col", cfg->label_col}};
    for (size_t i = 0; i < 3; i++)
        if (!is_identifier(cols[i][1])) {
            fr_set_err(err, err_len, "cql: engine_args %s must be a column name (letters, "
                                     "digits, _), got '%s'", cols[i][0], cols[i][1]);
            return -EINVAL;
        }
    return 0;
}

int cql_resolve_hosts(const char *hosts, long long default_port, cql_target *out, int *n,
                      char *err, size_t err_len)
{
    char list[1024];
    *n = 0;
    snprintf(list, sizeof(list), "%s", hosts);
    char *save = NULL;
    for (char *item = strtok_r(list, "; ", &save); item; item = strtok_r(NULL, "; ", &save)) {
        if (*n == CQL_MAX_HOSTS) {
            fr_set_err(err, err_len, "cql: engine_args hosts: at most %d hosts", CQL_MAX_HOSTS);
            return -EINVAL;
        }
        char host[256];
        long port = (long)default_port;
        const char *colon;
        if (item[0] == '[') {
            const char *close = strchr(item, ']');
            if (!close || (size_t)(close - item - 1) >= sizeof(host)) {
                fr_set_err(err, err_len, "cql: engine_args hosts: bad address '%s'", item);
                return -EINVAL;
            }
            memcpy(host, item + 1, (size_t)(close - item - 1));
            host[close - item - 1] = 0;
            colon = close[1] == ':' ? close + 1 : NULL;
        } else {
            colon = strchr(item, ':');
            size_t hl = colon ? (size_t)(colon - item) : strlen(item);
            if (hl == 0 || hl >= sizeof(host)) {
                fr_set_err(err, err_len, "cql: engine_args hosts: bad host '%s'", item);
                return -EINVAL;
            }
            memcpy(host, item, hl);
            host[hl] = 0;
        }
        if (colon) {
            char *end;
            port = strtol(colon + 1, &end, 10);
            if (*end || port < 1 || port > 65535) {
                fr_set_err(err, err_len, "cql: engine_args hosts: bad port in '%s'", item);
                return -EINVAL;
            }
        }
        cql_target *t = &out[*n];
        char port_s[8];
        snprintf(port_s, sizeof(port_s), "%ld", port);
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        int g = getaddrinfo(host, port_s, &hints, &res);
        if (g != 0 || !res) {
            fr_set_err(err, err_len, "cql: cannot resolve host '%s': %s", host, gai_strerror(g));
            return -EHOSTUNREACH;
        }
        memcpy(&t->addr, res->ai_addr, res->ai_addrlen);
        t->addr_len = res->ai_addrlen;
        freeaddrinfo(res);
        snprintf(t->name, sizeof(t->name), strchr(host, ':') ? "[%s]:%ld" : "%s:%ld", host, port);
        (*n)++;
    }
    if (*n == 0) {
        fr_set_err(err, err_len, "cql: engine_args hosts names no host");
        return -EINVAL;
    }
    return 0;
}

