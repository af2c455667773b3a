# cython: language_level=3
"""The s3 engine's client (csrc/engines/s3/s3_client.h): one signed S3
request at a time, for listings and uploads. Cython only adapts: the
settings, signing and retries are the C core's; the GIL is released around
every call into it."""
import os

from libc.stdint cimport uint64_t
from libc.string cimport memset


from fastread._cs3 cimport (fr_s3_client, fr_s3_client_close, fr_s3_client_open,
                            fr_s3_client_request, fr_s3_client_requests,
                            fr_s3_client_get_range, fr_s3_client_bytes,
                            fr_s3_client_retries, fr_s3_client_cache_scope, fr_s3_describe,
                            fr_s3_free, fr_s3_list, fr_s3_listing, fr_s3_listing_free,
                            fr_s3_list_native, fr_s3_strings)


def describe():
    """(True, "libcurl 7.88.1 (...)") when the s3 engine can run on the
    libcurl loaded, else (False, why not)."""
    cdef char out[256]
    cdef int rc
    with nogil:
        rc = fr_s3_describe(out, sizeof(out))
    return rc == 0, out.decode(errors="replace")


cdef class Client:
    """One connection's worth of S3 requests with the s3 engine's settings
    (``engine_args``, then the AWS environment and files). Not for
    concurrent use: calls from several threads are serialized by a lock."""
    cdef fr_s3_client *c
    cdef object lock

    def __cinit__(self, str engine_args=""):
        import threading
        cdef bytes args = engine_args.encode()
        cdef const char *cargs = args
        cdef char err[256]
        err[0] = 0
        cdef int rc
        with nogil:
            rc = fr_s3_client_open(cargs, &self.c, err, sizeof(err))
        if rc != 0:
            msg = err.decode(errors="replace") or os.strerror(-rc)
            if rc == -22:
                raise ValueError(msg)
            raise OSError(-rc, msg)
        self.lock = threading.Lock()

    def __dealloc__(self):
        if self.c != NULL:
            fr_s3_client_close(self.c)
            self.c = NULL

    def cache_scope(self):
        """The object cache's scope of this client's requests: that of
        an s3 context opened with the same ``engine_args`` (its endpoint and
        a hash of the access key id), for :func:`fastread.s3.drop_stale_entries`."""
        cdef char out[1024]
        out[0] = 0
        with self.lock:
            if self.c == NULL:
                raise ValueError("the S3 client is closed")
            fr_s3_client_cache_scope(self.c, out, sizeof(out))
        return out.decode(errors="replace")

    def close(self):
        with self.lock:
            if self.c != NULL:
                fr_s3_client_close(self.c)
                self.c = NULL

    def request(self, str method, str bucket, str key="", str query="", body=None):
        """One request: ``method`` GET or PUT of ``key`` in ``bucket`` (""
        for the bucket), ``query`` appended as given (canonical: sorted,
        encoded). Returns ``(status, body bytes, error text)``: the error
        text is "STATUS CODE" for statuses >= 300, else "". Raises OSError
        when no response came; ValueError for a NUL character in any of
        them (C would end the string there: a request for another object)."""
        for name, value in (("method", method), ("bucket", bucket), ("key", key),
                            ("query", query)):
            if "\0" in value:
                raise ValueError(f"NUL character in the {name} of the S3 request for "
                                 f"{'s3://' + bucket + '/' + key!r}")
        cdef bytes m = method.encode(), b = bucket.encode(), k = key.encode("utf-8"), \
            q = query.encode()
        cdef const char *cm = m
        cdef const char *cb = b
        cdef const char *ck = k
        cdef const char *cq = q
        cdef const unsigned char[::1] data
        cdef const void *pdata = NULL
        cdef size_t ndata = 0
        if body is not None:
            data = memoryview(body).cast("B")
            ndata = data.shape[0]
            if ndata:
                pdata = &data[0]
        cdef char *resp = NULL
        cdef size_t resp_len = 0
        cdef char err[256]
        err[0] = 0
        cdef long status
        with self.lock:
            if self.c == NULL:
                raise ValueError("client is closed")
            with nogil:
                status = fr_s3_client_request(self.c, cm, cb, ck, cq, pdata, ndata, &resp,
                                              &resp_len, err, sizeof(err))
        try:
            if status < 0:
                raise OSError(-status, err.decode(errors="replace") or os.strerror(-status))
            out = resp[:resp_len] if resp_len else b""
            return status, out, err.decode(errors="replace") if status >= 300 else ""
        finally:
            fr_s3_free(resp)

    def get_range(self, str bucket, str key, uint64_t first, uint64_t length):
        """A ranged GET of bytes ``[first, first + length)`` of ``key``, which
        may run past the object's end. Returns ``(status, body bytes, total,
        error text)``: 206 with the bytes (fewer at the end) and ``total``
        the object's size; 416 (starts past the end) with b"" and the size
        where the server gave it; other statuses with ``total`` None and
        "STATUS CODE" as the error text. Raises OSError when no response
        came or the server sent other bytes than those asked for."""
        for name, value in (("bucket", bucket), ("key", key)):
            if "\0" in value:
                raise ValueError(f"NUL character in the {name} of the S3 request for "
                                 f"{'s3://' + bucket + '/' + key!r}")
        cdef bytes b = bucket.encode(), k = key.encode("utf-8")
        cdef const char *cb = b
        cdef const char *ck = k
        cdef char *resp = NULL
        cdef size_t resp_len = 0
        cdef uint64_t total = 0
        cdef char err[256]
        err[0] = 0
        cdef long status
        with self.lock:
            if self.c == NULL:
                raise ValueError("client is closed")
            with nogil:
                status = fr_s3_client_get_range(self.c, cb, ck, first, length, &resp, &resp_len,
                                                &total, err, sizeof(err))
        try:
            if status < 0:
                raise OSError(-status, err.decode(errors="replace") or os.strerror(-status))
            out = resp[:resp_len] if resp_len else b""
            return (status, out, None if total == <uint64_t>-1 else total,
                    err.decode(errors="replace") if status >= 300 else "")
        finally:
            fr_s3_free(resp)

    @property
    def bytes_received(self):
        """Response bytes this client received so far (every attempt's)."""
        return fr_s3_client_bytes(self.c) if self.c != NULL else 0

    @property
    def requests(self):
        return fr_s3_client_requests(self.c) if self.c != NULL else 0

    @property
    def retries(self):
        return fr_s3_client_retries(self.c) if self.c != NULL else 0


def list_native():
    """True where this build parses listings in C (libexpat)."""
    return bool(fr_s3_list_native())


cdef _table(fr_s3_strings *s):
    """(blob bytes, uint64 offsets: n + 1) of a C string table: one copy."""
    import numpy as np
    blob = s.blob[:s.blob_len] if s.blob_len else b""
    if s.n == 0:
        return blob, np.zeros(1, np.uint64)
    off = np.frombuffer((<char *>s.off)[:(s.n + 1) * 8], np.uint64)
    return blob, off


def list_tree(str engine_args, str bucket, str prefix, bint delimiter, int max_depth,
              int inflight):
    """A ListObjectsV2 walk in C (s3_list.h): ``(keys, sizes, etags, left,
    stats)``: keys and etags as ``(blob, offsets)`` tables (UTF-8 bytes,
    ``n + 1`` uint64 offsets), sizes an int64 array, left the common
    prefixes at the depth limit (str), stats the requests, retries and
    bytes. The GIL is released for the whole walk. Raises OSError naming
    the URL (ENOTSUP in a build without libexpat)."""
    import numpy as np
    for name, value in (("engine_args", engine_args), ("bucket", bucket), ("prefix", prefix)):
        if "\0" in value:
            raise ValueError(f"NUL character in the {name} of the listing of "
                             f"{'s3://' + bucket + '/' + prefix!r}")
    cdef bytes a = engine_args.encode(), b = bucket.encode(), p = prefix.encode("utf-8")
    cdef const char *ca = a
    cdef const char *cb = b
    cdef const char *cp = p
    cdef fr_s3_listing l
    memset(&l, 0, sizeof(l))
    cdef char err[512]
    err[0] = 0
    cdef int rc
    cdef int d = delimiter
    with nogil:
        rc = fr_s3_list(ca, cb, cp, d, max_depth, inflight, &l, err, sizeof(err))
    try:
        if rc != 0:
            msg = err.decode(errors="replace") or os.strerror(-rc)
            if rc == -22:
                raise ValueError(msg)
            raise OSError(-rc, msg)
        keys = _table(&l.keys)
        etags = _table(&l.etags)
        n = l.keys.n
        sizes = (np.frombuffer((<char *>l.sizes)[:n * 8], np.int64) if n
                 else np.zeros(0, np.int64))
        lb, lo = _table(&l.left)
        left = [lb[lo[i]:lo[i + 1]].decode("utf-8", "surrogateescape")
                for i in range(l.left.n)]
        stats = {"requests": l.requests, "retries": l.retries, "bytes": l.bytes,
                 "inflight_max": l.inflight_max}
        return keys, sizes, etags, left, stats
    finally:
        fr_s3_listing_free(&l)
