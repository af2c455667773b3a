/*
 * engine_args: the one parser of fr_config.engine_args ("key=value,key=value")
 * for every engine. An engine describes its keys in a table; a value is
 * accepted whole or refused with an error that names the engine and the key.
 * Values of keys marked secret (credentials) never appear in a message.
 *
 * Stateless and reentrant: thread-safe.
 */
#ifndef FASTREAD_ENGINE_ARGS_H
#define FASTREAD_ENGINE_ARGS_H

#include <stddef.h>

typedef enum fr_arg_kind {
    FR_ARG_INT,    /* long long in [min, max]; decimal, or 0x hex */
    FR_ARG_CHOICE, /* one of `choices` ("a|b|c"): *(int *)out = its index */
    FR_ARG_STR,    /* copied to (char *)out, a buffer of `max` bytes including the NUL;
                    * at least `min` bytes long (0: may be empty) */
} fr_arg_kind;

typedef struct fr_arg_spec {
    const char *key;
    fr_arg_kind kind;
    void *out;           /* long long *, int * or char [max] as kind says; untouched if absent */
    long long min, max;  /* FR_ARG_INT: the range; FR_ARG_STR: shortest value, buffer size */
    const char *choices; /* FR_ARG_CHOICE */
    int secret;          /* never echo the value (credentials) */
    int *given;          /* optional: set to 1 when the key appears */
} fr_arg_spec;

/* Parses `args` (NULL or "" is empty; empty items are skipped; a key given
 * twice keeps the last value) against specs[0..n). 0, or -EINVAL with why in
 * err ("ENGINE: engine_args ..."), naming the key; unknown keys list the
 * known ones. On failure some outputs may already be set. */
int fr_args_parse(const char *engine, const char *args, const fr_arg_spec *specs, size_t n,
                  char *err, size_t err_len);

#endif
