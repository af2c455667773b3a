/* The s3 engine's settings, URLs and HTTP judgements: see s3_config.h. */
/* clock_gettime, nanosleep, strncasecmp: POSIX, which -std=c11 hides. */
#define _POSIX_C_SOURCE 200809L
#include "engines/s3/s3_config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "core/engine_args.h"

static const char *env_get(fr_s3_getenv_fn fn, void *arg, const char *name)
{
    const char *v = fn ? fn(name, arg) : getenv(name);
    return v && *v ? v : NULL;
}

/* Copies src into dst[len]; -1 (dst untouched) if it does not fit. */
static int copy_str(char *dst, size_t len, const char *src)
{
    size_t n = strlen(src);
    if (n >= len)
        return -1;
    memcpy(dst, src, n + 1);
    return 0;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = 0;
    return s;
}

/* What one profile section of an AWS file holds (only the keys we use). */
typedef struct profile_values {
    char region[64];
    char endpoint_url[512];
    char access_key_id[128];
    char secret_access_key[256];
    char session_token[4096];
} profile_values;

/* Reads section `section` of the INI file `path` (the AWS files' format:
 * "[section]" lines, "key = value" lines, '#' and ';' comments; indented
 * lines belong to a nested block such as "s3 =" and are skipped). 1 if the
 * section exists, 0 if it or the file does not, -errno (why in err) if the
 * file cannot be read or a value does not fit. */
static int read_profile(const char *path, const char *section, profile_values *out, char *err,
                        size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        int e = errno;
        fr_set_err(err, err_len, "s3: cannot read %s: %s", path, strerror(e));
        return -e;
    }
    char line[8192];
    int in_section = 0, found = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        if (line[0] == ' ' || line[0] == '\t')
            continue; /* a nested block's line (or a continuation): not a key of ours */
        char *s = trim(line);
        if (!*s || *s == '#' || *s == ';')
            continue;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (!close)
                continue;
            *close = 0;
            in_section = strcmp(trim(s + 1), section) == 0;
            found |= in_section;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in_section || !eq)
            continue;
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        struct {
            const char *key;
            char *dst;
            size_t len;
        } known[] = {
            {"region", out->region, sizeof(out->region)},
            {"endpoint_url", out->endpoint_url, sizeof(out->endpoint_url)},
            {"aws_access_key_id", out->access_key_id, sizeof(out->access_key_id)},
            {"aws_secret_access_key", out->secret_access_key, sizeof(out->secret_access_key)},
            {"aws_session_token", out->session_token, sizeof(out->session_token)},
        };
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
            if (strcmp(key, known[i].key) != 0)
                continue;
            if (copy_str(known[i].dst, known[i].len, val) != 0) {
                fr_set_err(err, err_len, "s3: %s, [%s]: %s is longer than %zu bytes", path,
                           section, key, known[i].len - 1);
                rc = -EINVAL;
            }
        }
    }
    if (rc == 0 && ferror(f)) {
        fr_set_err(err, err_len, "s3: cannot read %s", path);
        rc = -EIO;
    }
    fclose(f); /* read-only: nothing to lose */
    return rc ? rc : found;
}

/* The path of an AWS file: the variable's value, else ~/.aws/NAME. 0, or
 * -1 if there is neither (no HOME). */
static int aws_file(fr_s3_getenv_fn fn, void *arg, const char *var, const char *name, char *out,
                    size_t len)
{
    const char *v = env_get(fn, arg, var);
    if (v)
        return copy_str(out, len, v);
    const char *home = env_get(fn, arg, "HOME");
    if (!home)
        return -1;
    int w = snprintf(out, len, "%s/.aws/%s", home, name);
    return w < 0 || (size_t)w >= len ? -1 : 0;
}

static int dns_bucket(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63 || b[0] == '-' || b[n - 1] == '-')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) || b[i] == '-'))
            return 0; /* dots too: a dotted name breaks the TLS wildcard certificate */
    return 1;
}

/* `url` for a message: any user info ("user:password@", which may be
 * credentials) before the host replaced by "***@". */
static void redact_userinfo(const char *url, char *out, size_t len)
{
    const char *sep = strstr(url, "://");
    const char *auth = sep ? sep + 3 : url;
    size_t auth_len = strcspn(auth, "/?#");
    const char *at = NULL;
    for (const char *p = auth; p < auth + auth_len; p++)
        if (*p == '@')
            at = p;
    if (!at) {
        snprintf(out, len, "%s", url);
        return;
    }
    snprintf(out, len, "%.*s***%s", (int)(auth - url), url, at);
}

static int check_endpoint(fr_s3_config *cfg, const char *from, char *err, size_t err_len)
{
    size_t n = strlen(cfg->endpoint);
    while (n && cfg->endpoint[n - 1] == '/')
        cfg->endpoint[--n] = 0;
    const char *host = NULL;
    if (strncmp(cfg->endpoint, "http://", 7) == 0)
        host = cfg->endpoint + 7;
    else if (strncmp(cfg->endpoint, "https://", 8) == 0)
        host = cfg->endpoint + 8;
    if (!host || !*host || strchr(host, '/') || strchr(host, '?') || strchr(host, '@')) {
        char shown[256];
        redact_userinfo(cfg->endpoint, shown, sizeof(shown));
        fr_set_err(err, err_len,
                   "s3: endpoint '%.200s' (%s) is not http(s)://host[:port] (no path, no "
                   "user)", shown, from);
        return -EINVAL;
    }
    /* AWS's own endpoints take virtual-hosted requests (path-style is being
     * retired there); any other server gets path-style, which every
     * S3-compatible server takes. */
    const char *colon = strchr(host, ':');
    size_t hlen = colon ? (size_t)(colon - host) : strlen(host);
    const char *aws = ".amazonaws.com";
    size_t alen = strlen(aws);
    cfg->endpoint_is_aws = hlen > alen && strncmp(host + hlen - alen, aws, alen) == 0;
    return 0;
}

int fr_s3_config_resolve(const char *engine_args, fr_s3_getenv_fn getenv_fn, void *env_arg,
                         fr_s3_config *cfg, char *err, size_t err_len)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->addressing = FR_S3_ADDR_AUTO;
    cfg->verify = 1;
    cfg->inflight = FR_S3_INFLIGHT;
    cfg->part_size = FR_S3_PART_SIZE;
    cfg->retries = FR_S3_RETRIES;
    cfg->deadline_ms = FR_S3_DEADLINE_MS;
    cfg->connect_timeout_ms = FR_S3_CONNECT_TIMEOUT_MS;
    cfg->low_speed_time_s = FR_S3_LOW_SPEED_TIME_S;
    int unsigned_idx = 0, verify_idx = 1;
    int endpoint_given = 0, region_given = 0, profile_given = 0, key_given = 0, secret_given = 0,
        token_given = 0;
    const fr_arg_spec specs[] = {
        {.key = "endpoint", .kind = FR_ARG_STR, .out = cfg->endpoint,
         .max = sizeof(cfg->endpoint), .given = &endpoint_given},
        {.key = "region", .kind = FR_ARG_STR, .out = cfg->region, .max = sizeof(cfg->region),
         .given = &region_given},
        {.key = "addressing", .kind = FR_ARG_CHOICE, .out = &cfg->addressing,
         .choices = "path|virtual|auto"},
        {.key = "profile", .kind = FR_ARG_STR, .out = cfg->profile, .max = sizeof(cfg->profile),
         .given = &profile_given},
        {.key = "unsigned", .kind = FR_ARG_CHOICE, .out = &unsigned_idx, .choices = "0|1"},
        {.key = "verify", .kind = FR_ARG_CHOICE, .out = &verify_idx, .choices = "0|1"},
        {.key = "ca_bundle", .kind = FR_ARG_STR, .out = cfg->ca_bundle,
         .max = sizeof(cfg->ca_bundle)},
        {.key = "access_key_id", .kind = FR_ARG_STR, .out = cfg->access_key_id,
         .max = sizeof(cfg->access_key_id), .given = &key_given},
        {.key = "secret_access_key", .kind = FR_ARG_STR, .out = cfg->secret_access_key,
         .max = sizeof(cfg->secret_access_key), .secret = 1, .given = &secret_given},
        {.key = "session_token", .kind = FR_ARG_STR, .out = cfg->session_token,
         .max = sizeof(cfg->session_token), .secret = 1, .given = &token_given},
        {.key = "inflight", .kind = FR_ARG_INT, .out = &cfg->inflight, .min = 1, .max = 1024},
        /* 64 KiB .. 1 GiB: smaller parts cost a request each for nothing;
         * larger ones exceed FR_MAX_REQUEST-sized thinking elsewhere. */
        {.key = "part_size", .kind = FR_ARG_INT, .out = &cfg->part_size, .min = 64 << 10,
         .max = 1ll << 30},
        {.key = "retries", .kind = FR_ARG_INT, .out = &cfg->retries, .min = 0, .max = 20},
        {.key = "deadline_ms", .kind = FR_ARG_INT, .out = &cfg->deadline_ms, .min = 100,
         .max = 3600000},
        {.key = "connect_timeout_ms", .kind = FR_ARG_INT, .out = &cfg->connect_timeout_ms,
         .min = 10, .max = 600000},
        {.key = "low_speed_time_s", .kind = FR_ARG_INT, .out = &cfg->low_speed_time_s, .min = 1,
         .max = 3600},
    };
    int rc = fr_args_parse("s3", engine_args, specs, sizeof(specs) / sizeof(specs[0]), err,
                           err_len);
    if (rc)
        return rc;
    cfg->unsigned_requests = unsigned_idx == 1;
    cfg->verify = verify_idx == 1;
    if (key_given != secret_given) {
        fr_set_err(err, err_len, "s3: engine_args access_key_id and secret_access_key go "
                                 "together (one was given without the other)");
        return -EINVAL;
    }
    if (token_given && !key_given) {
        fr_set_err(err, err_len, "s3: engine_args session_token needs access_key_id and "
                                 "secret_access_key");
        return -EINVAL;
    }

    /* The profile: its sections of the config and credentials files. */
    const char *profile_env = env_get(getenv_fn, env_arg, "AWS_PROFILE");
    int profile_named = profile_given || profile_env;
    if (!profile_given && copy_str(cfg->profile, sizeof(cfg->profile),
                                   profile_env ? profile_env : "default") != 0) {
        fr_set_err(err, err_len, "s3: AWS_PROFILE is longer than %zu bytes",
                   sizeof(cfg->profile) - 1);
        return -EINVAL;
    }
    profile_values *conf = calloc(2, sizeof(*conf));
    if (!conf)
        return -ENOMEM;
    profile_values *creds = conf + 1;
    char conf_path[1024], creds_path[1024], section[160];
    int have_conf = 0, have_creds = 0;
    if (aws_file(getenv_fn, env_arg, "AWS_CONFIG_FILE", "config", conf_path,
                 sizeof(conf_path)) == 0) {
        if (strcmp(cfg->profile, "default") == 0)
            snprintf(section, sizeof(section), "default");
        else
            snprintf(section, sizeof(section), "profile %s", cfg->profile);
        have_conf = read_profile(conf_path, section, conf, err, err_len);
    }
    if (have_conf >= 0 && aws_file(getenv_fn, env_arg, "AWS_SHARED_CREDENTIALS_FILE",
                                   "credentials", creds_path, sizeof(creds_path)) == 0)
        have_creds = read_profile(creds_path, cfg->profile, creds, err, err_len);
    if (have_conf < 0 || have_creds < 0) {
        rc = have_conf < 0 ? have_conf : have_creds;
        goto out;
    }
    if (profile_named && !have_conf && !have_creds && strcmp(cfg->profile, "default") != 0) {
        fr_set_err(err, err_len, "s3: profile '%s' (%s) is in neither the config file nor the "
                                 "credentials file", cfg->profile,
                   profile_given ? "engine_args profile" : "AWS_PROFILE");
        rc = -EINVAL;
        goto out;
    }

    /* Region, then the endpoint (AWS's default endpoint names the region). */
    if (!region_given) {
        const char *r = env_get(getenv_fn, env_arg, "AWS_REGION");
        const char *from = "AWS_REGION";
        if (!r) {
            r = env_get(getenv_fn, env_arg, "AWS_DEFAULT_REGION");
            from = "AWS_DEFAULT_REGION";
        }
        if (!r && conf->region[0]) {
            r = conf->region;
            from = "the config file's region";
        }
        if (!r)
            r = "us-east-1";
        if (copy_str(cfg->region, sizeof(cfg->region), r) != 0) {
            fr_set_err(err, err_len, "s3: the region (%s) is longer than %zu bytes", from,
                       sizeof(cfg->region) - 1);
            rc = -EINVAL;
            goto out;
        }
    }
    if (!cfg->region[0]) {
        fr_set_err(err, err_len, "s3: engine_args region is empty");
        rc = -EINVAL;
        goto out;
    }
    for (const char *p = cfg->region; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '_')) {
            fr_set_err(err, err_len, "s3: region '%.63s' has characters a region cannot have",
                       cfg->region);
            rc = -EINVAL;
            goto out;
        }
    const char *endpoint_from = "engine_args endpoint";
    if (!endpoint_given) {
        const char *e = env_get(getenv_fn, env_arg, "AWS_ENDPOINT_URL_S3");
        endpoint_from = "AWS_ENDPOINT_URL_S3";
        if (!e) {
            e = env_get(getenv_fn, env_arg, "AWS_ENDPOINT_URL");
            endpoint_from = "AWS_ENDPOINT_URL";
        }
        if (!e && conf->endpoint_url[0]) {
            e = conf->endpoint_url;
            endpoint_from = "the config file's endpoint_url";
        }
        if (e) {
            if (copy_str(cfg->endpoint, sizeof(cfg->endpoint), e) != 0) {
                fr_set_err(err, err_len, "s3: the endpoint (%s) is longer than %zu bytes",
                           endpoint_from, sizeof(cfg->endpoint) - 1);
                rc = -EINVAL;
                goto out;
            }
        } else {
            snprintf(cfg->endpoint, sizeof(cfg->endpoint), "https://s3.%s.amazonaws.com",
                     cfg->region);
            endpoint_from = "AWS's endpoint for the region";
        }
    }
    if ((rc = check_endpoint(cfg, endpoint_from, err, err_len)))
        goto out;

    /* Credentials. */
    if (cfg->unsigned_requests) {
        memset(cfg->access_key_id, 0, sizeof(cfg->access_key_id));
        memset(cfg->secret_access_key, 0, sizeof(cfg->secret_access_key));
        memset(cfg->session_token, 0, sizeof(cfg->session_token));
        snprintf(cfg->credentials_from, sizeof(cfg->credentials_from), "none (unsigned=1)");
        goto out;
    }
    if (key_given) {
        snprintf(cfg->credentials_from, sizeof(cfg->credentials_from), "engine_args");
        goto out;
    }
    const char *ek = env_get(getenv_fn, env_arg, "AWS_ACCESS_KEY_ID");
    const char *es = env_get(getenv_fn, env_arg, "AWS_SECRET_ACCESS_KEY");
    const char *et = env_get(getenv_fn, env_arg, "AWS_SESSION_TOKEN");
    /* An explicit profile= wins over the environment's keys (boto3's
     * Session(profile_name=...) does the same). */
    if (ek && es && !profile_given) {
        if (copy_str(cfg->access_key_id, sizeof(cfg->access_key_id), ek) ||
            copy_str(cfg->secret_access_key, sizeof(cfg->secret_access_key), es) ||
            (et && copy_str(cfg->session_token, sizeof(cfg->session_token), et))) {
            fr_set_err(err, err_len, "s3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or "
                                     "AWS_SESSION_TOKEN is too long");
            rc = -EINVAL;
            goto out;
        }
        snprintf(cfg->credentials_from, sizeof(cfg->credentials_from), "environment");
        goto out;
    }
    const profile_values *src = creds->access_key_id[0] && creds->secret_access_key[0] ? creds
                                : conf->access_key_id[0] && conf->secret_access_key[0] ? conf
                                                                                        : NULL;
    if (!src) {
        fr_set_err(err, err_len,
                   "s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, give "
                   "engine_args access_key_id= and secret_access_key=, put them in profile '%s' "
                   "of %s, or read public buckets with unsigned=1",
                   cfg->profile, have_creds || !have_conf ? "the credentials file" : "the config file");
        rc = -EACCES;
        goto out;
    }
    memcpy(cfg->access_key_id, src->access_key_id, sizeof(cfg->access_key_id));
    memcpy(cfg->secret_access_key, src->secret_access_key, sizeof(cfg->secret_access_key));
    memcpy(cfg->session_token, src->session_token, sizeof(cfg->session_token));
    snprintf(cfg->credentials_from, sizeof(cfg->credentials_from), "profile '%.64s' of the %s file",
             cfg->profile, src == creds ? "credentials" : "config");
out:
    /* The files' secrets are not left in freed memory. */
    memset(conf, 0, 2 * sizeof(*conf));
    free(conf);
    return rc;
}

int fr_s3_is_url(const char *path) { return path && strncmp(path, "s3://", 5) == 0; }

int fr_s3_parse_url(const char *url, char *bucket, const char **key, char *err, size_t err_len)
{
    if (!fr_s3_is_url(url)) {
        fr_set_err(err, err_len, "'%.200s' is not an s3:// URL", url ? url : "(null)");
        return -EINVAL;
    }
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t n = slash ? (size_t)(slash - b) : strlen(b);
    if (n == 0 || n > FR_S3_BUCKET_MAX) {
        fr_set_err(err, err_len, "%.200s: the bucket name must be 1..%d characters", url,
                   FR_S3_BUCKET_MAX);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)b[i]) || b[i] == '.' || b[i] == '-' || b[i] == '_')) {
            fr_set_err(err, err_len, "%.200s: a bucket name has letters, digits, '.', '-' and "
                                     "'_' only", url);
            return -EINVAL;
        }
    memcpy(bucket, b, n);
    bucket[n] = 0;
    *key = slash ? slash + 1 : b + n;
    if (strlen(*key) > FR_S3_KEY_MAX) {
        fr_set_err(err, err_len, "%.200s...: a key is at most %d bytes", url, FR_S3_KEY_MAX);
        return -EINVAL;
    }
    return 0;
}

size_t fr_s3_uri_encode(const char *in, int keep_slash, char *out, size_t out_len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t need = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        int plain = isalnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~' ||
                    (*p == '/' && keep_slash);
        /* isalnum is locale-dependent only above 0x7f in some locales: keep
         * the unreserved set ASCII whatever the locale says. */
        if (*p >= 0x80)
            plain = 0;
        char enc[3] = {(char)*p, 0, 0};
        size_t w = 1;
        if (!plain) {
            enc[0] = '%';
            enc[1] = hex[*p >> 4];
            enc[2] = hex[*p & 15];
            w = 3;
        }
        if (out && need + w < out_len)
            memcpy(out + need, enc, w);
        need += w;
    }
    if (out && out_len)
        out[need < out_len ? need : out_len - 1] = 0;
    return need;
}

int fr_s3_object_url(const fr_s3_config *cfg, const char *bucket, const char *key,
                     const char *query, char *out, size_t out_len)
{
    int virt = cfg->addressing == FR_S3_ADDR_VIRTUAL ||
               (cfg->addressing == FR_S3_ADDR_AUTO && cfg->endpoint_is_aws && dns_bucket(bucket));
    size_t used;
    int w;
    if (virt) {
        const char *host = strstr(cfg->endpoint, "://") + 3; /* checked at resolve */
        w = snprintf(out, out_len, "%.*s%s.%s/", (int)(host - cfg->endpoint), cfg->endpoint,
                     bucket, host);
    } else {
        w = snprintf(out, out_len, "%s/%s/", cfg->endpoint, bucket);
    }
    if (w < 0 || (size_t)w >= out_len)
        return -ENAMETOOLONG;
    used = (size_t)w;
    used += fr_s3_uri_encode(key, 1, out + used, out_len - used);
    if (used >= out_len)
        return -ENAMETOOLONG;
    if (query && *query) {
        w = snprintf(out + used, out_len - used, "?%s", query);
        if (w < 0 || (size_t)w >= out_len - used)
            return -ENAMETOOLONG;
        used += (size_t)w;
    }
    return (int)used;
}

/* Parses decimal digits at *p into *v, moving *p past them; -1 if none or
 * overflow. */
static int parse_u64(const char **p, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    if (!isdigit((unsigned char)*s))
        return -1;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *p = s;
    *v = x;
    return 0;
}

int fr_s3_parse_content_range(const char *v, uint64_t *first, uint64_t *last, uint64_t *total)
{
    while (*v == ' ')
        v++;
    if (strncmp(v, "bytes", 5) != 0)
        return -1;
    v += 5;
    while (*v == ' ' || *v == '=')
        v++;
    if (*v == '*') {
        *first = *last = UINT64_MAX;
        v++;
    } else {
        if (parse_u64(&v, first) || *v++ != '-' || parse_u64(&v, last) || *last < *first)
            return -1;
    }
    if (*v++ != '/')
        return -1;
    if (*v == '*') {
        *total = UINT64_MAX;
        v++;
    } else if (parse_u64(&v, total)) {
        return -1;
    }
    while (*v == ' ' || *v == '\r' || *v == '\n')
        v++;
    if (*v)
        return -1;
    if (*first != UINT64_MAX && *total != UINT64_MAX && *last >= *total)
        return -1; /* a range that ends past the total is a lie */
    return 0;
}

void fr_s3_error_code(const char *body, size_t len, char *out, size_t out_len)
{
    out[0] = 0;
    static const char open[] = "<Code>", close[] = "</Code>";
    const char *end = body + len;
    for (const char *p = body; p + sizeof(open) - 1 <= end; p++) {
        if (memcmp(p, open, sizeof(open) - 1) != 0)
            continue;
        p += sizeof(open) - 1;
        size_t n = 0;
        while (p + n + sizeof(close) - 1 <= end && memcmp(p + n, close, sizeof(close) - 1) != 0)
            n++;
        if (p + n + sizeof(close) - 1 > end)
            return; /* no closing tag: the body was cut */
        size_t w = 0;
        for (size_t i = 0; i < n && w + 1 < out_len; i++)
            if (isalnum((unsigned char)p[i]) || p[i] == '.' || p[i] == '-' || p[i] == '_')
                out[w++] = p[i];
        out[w] = 0;
        return;
    }
}

int fr_s3_status_errno(long status)
{
    switch (status) {
    case 404:
        return -ENOENT;
    case 401:
    case 403:
        return -EACCES;
    case 412:
        return -ESTALE;
    case 416:
        return -ENODATA;
    default:
        return -EIO;
    }
}

int fr_s3_status_retryable(long status)
{
    return status == 500 || status == 502 || status == 503 || status == 504;
}

unsigned fr_s3_backoff_ms(unsigned attempt, uint64_t *rng)
{
    unsigned ceiling = FR_S3_BACKOFF_CAP_MS;
    if (attempt == 0)
        attempt = 1;
    if (attempt - 1 < 16) {
        unsigned c = FR_S3_BACKOFF_BASE_MS << (attempt - 1);
        if (c < ceiling)
            ceiling = c;
    }
    unsigned half = ceiling / 2;
    return half + (unsigned)(fr_splitmix64(rng) % (uint64_t)(ceiling - half + 1));
}

void fr_s3_cache_scope(const fr_s3_config *cfg, char *out, size_t len)
{
    if (cfg->unsigned_requests) {
        snprintf(out, len, "%s unsigned", cfg->endpoint);
        return;
    }
    /* FNV-1a, mixed: a reader with another key id gets other entries; the
     * id itself stays out of the cache's records. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)cfg->access_key_id; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    snprintf(out, len, "%s key:%016llx", cfg->endpoint, (unsigned long long)fr_splitmix64(&h));
}
