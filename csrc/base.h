/*
 * The bottom layer of the C core: error messages and small arithmetic that
 * every other file may use. It includes nothing of fastread's, so nothing
 * above it can form a cycle through it.
 */
#ifndef FASTREAD_BASE_H
#define FASTREAD_BASE_H

#include <stddef.h>

/* Formats an error message into err (if err is not NULL and err_len > 0). */
void fr_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* v rounded up to a multiple of align (a power of two). */
static inline size_t fr_round_up(size_t v, size_t align)
{
    return (v + align - 1) & ~(align - 1);
}

#endif
