/* The bottom layer: error messages (see base.h). */
#include <stdarg.h>
#include <stdio.h>

#include "base.h"

void fr_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}
