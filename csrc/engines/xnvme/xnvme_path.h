/*
 * Paths that xNVMe's device identifiers cannot hold. xNVMe parses every path
 * it opens as a URI of at most XNVME_IDENT_URI_LEN - 1 bytes (383 in xNVMe
 * 0.7; longer ones fail with a bare EINVAL) and reads '?' as the start of URI
 * options. The xNVMe engines check paths with these helpers first: a file
 * whose path xNVMe cannot take is read with plain pread (xnvme-file) or
 * opened through an alias xNVMe can take (xnvme: "/proc/self/fd/N" of a
 * descriptor the engine holds, or a block device's real path).
 * No xNVMe dependency: built and tested on every machine.
 */
#ifndef FASTREAD_XNVME_PATH_H
#define FASTREAD_XNVME_PATH_H

#include <stddef.h>

/* XNVME_IDENT_URI_LEN - 1 of xNVMe 0.7 (libxnvme_ident.h). */
#define FR_XNVME_PATH_MAX 383

/* 1 if xNVMe takes `path` verbatim: at most max_len bytes and no '?'. */
int fr_xnvme_path_ok(const char *path, size_t max_len);

/* A name for `path` that xNVMe takes: `path` itself when fr_xnvme_path_ok;
 * for a block device its real path, if that is short enough; else
 * "/proc/self/fd/N" of a read-only descriptor stored in *fd, which the
 * caller closes once xNVMe has closed the device (*fd is -1 when none was
 * opened). Returns 0, or -errno: -ENAMETOOLONG when no alias works (no /proc,
 * or a long block device path), the open's errno when `path` cannot be
 * opened. */
int fr_xnvme_path_alias(const char *path, size_t max_len, char *buf, size_t buf_len, int *fd);

#endif
