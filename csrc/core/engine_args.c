#include "core/engine_args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"

/* The index of `val` (vlen bytes) in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *val, size_t vlen)
{
    int i = 0;
    for (const char *c = choices; c && *c; i++) {
        const char *bar = strchr(c, '|');
        size_t clen = bar ? (size_t)(bar - c) : strlen(c);
        if (clen == vlen && strncmp(c, val, vlen) == 0)
            return i;
        if (!bar)
            break;
        c = bar + 1;
    }
    return -1;
}

static void known_keys(const fr_arg_spec *specs, size_t n, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && used < len; i++) {
        int w;
        if (specs[i].kind == FR_ARG_CHOICE)
            w = snprintf(out + used, len - used, "%s%s=%s", i ? ", " : "", specs[i].key,
                         specs[i].choices);
        else
            w = snprintf(out + used, len - used, "%s%s=<%s>", i ? ", " : "", specs[i].key,
                         specs[i].kind == FR_ARG_INT ? "n" : "text");
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* Echoes a value in a message only when it is not secret and short. */
static void shown(const fr_arg_spec *s, const char *val, size_t vlen, char *out, size_t len)
{
    if (s->secret)
        snprintf(out, len, "(not shown: secret)");
    else if (vlen > 64)
        snprintf(out, len, "'%.48s...' (%zu bytes)", val, vlen);
    else
        snprintf(out, len, "'%.*s'", (int)vlen, val);
}

static int parse_one(const char *engine, const fr_arg_spec *s, const char *val, size_t vlen,
                     char *err, size_t err_len)
{
    char v[96]; /* room for shown()'s longest text: 48 characters and a 20-digit size */
    switch (s->kind) {
    case FR_ARG_INT: {
        char num[32];
        if (vlen == 0 || vlen >= sizeof(num))
            goto bad_int;
        memcpy(num, val, vlen);
        num[vlen] = 0;
        char *end;
        errno = 0;
        long long x = strtoll(num, &end, 0);
        if (*end || errno || x < s->min || x > s->max)
            goto bad_int;
        *(long long *)s->out = x;
        return 0;
    bad_int:
        shown(s, val, vlen, v, sizeof(v));
        fr_set_err(err, err_len, "%s: engine_args %s=%s is not a whole number in %lld..%lld",
                   engine, s->key, v, s->min, s->max);
        return -EINVAL;
    }
    case FR_ARG_CHOICE: {
        int i = choice_index(s->choices, val, vlen);
        if (i < 0) {
            shown(s, val, vlen, v, sizeof(v));
            fr_set_err(err, err_len, "%s: engine_args %s=%s is not one of %s", engine, s->key, v,
                       s->choices);
            return -EINVAL;
        }
        *(int *)s->out = i;
        return 0;
    }
    case FR_ARG_STR:
        if (s->max <= 0 || vlen >= (size_t)s->max) {
            fr_set_err(err, err_len, "%s: engine_args %s is %zu bytes long, at most %lld allowed",
                       engine, s->key, vlen, s->max > 0 ? s->max - 1 : 0);
            return -EINVAL;
        }
        memcpy(s->out, val, vlen);
        ((char *)s->out)[vlen] = 0;
        return 0;
    }
    return -EINVAL;
}

int fr_args_parse(const char *engine, const char *args, const fr_arg_spec *specs, size_t n,
                  char *err, size_t err_len)
{
    for (const char *p = args ? args : ""; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len) {
            const char *eq = memchr(p, '=', len);
            size_t klen = eq ? (size_t)(eq - p) : len;
            const fr_arg_spec *s = NULL;
            for (size_t i = 0; i < n && !s; i++)
                if (strlen(specs[i].key) == klen && strncmp(specs[i].key, p, klen) == 0)
                    s = &specs[i];
            if (!s) {
                char known[512];
                known_keys(specs, n, known, sizeof(known));
                fr_set_err(err, err_len, "%s: unknown engine_args key '%.*s' (known: %s)", engine,
                           (int)(klen > 64 ? 64 : klen), p, n ? known : "none");
                return -EINVAL;
            }
            if (!eq) {
                fr_set_err(err, err_len, "%s: engine_args item '%s' has no value (write %s=...)",
                           engine, s->key, s->key);
                return -EINVAL;
            }
            int rc = parse_one(engine, s, eq + 1, len - klen - 1, err, err_len);
            if (rc)
                return rc;
            if (s->given)
                *s->given = 1;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}
