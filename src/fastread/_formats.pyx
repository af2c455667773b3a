# cython: language_level=3
"""The record formats' native indexers (csrc/formats/tar_index.h): tar
headers walked and WebDataset members grouped into samples in C, the GIL
released, several shard files at once. Cython only adapts: it builds the
spec, calls the C core and copies its columns into NumPy arrays (one copy
of a few arrays per shard, no object per sample)."""
import os

import numpy as np

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

from fastread._formats cimport (FR_WDS_DEFER, fr_tar_members, fr_tar_members_free,
                                fr_tar_walk, fr_wds2idx_parse, fr_wds_group,
                                fr_wds_index_files, fr_wds_samples, fr_wds_samples_free,
                                fr_wds_shard, fr_wds_spec, fr_sq_samples, fr_sq_samples_free,
                                fr_sq_walk)

DEFER = FR_WDS_DEFER


cdef class _Spec:
    """A fr_wds_spec and the bytes it points into."""
    cdef fr_wds_spec spec
    cdef const char **wanted
    cdef size_t *wanted_len
    cdef int *wanted_col
    cdef list keep

    def __cinit__(self, int k, wanted, bint fold_case, bint dali, int missing, bint want_keys):
        cdef size_t n = len(wanted), i
        self.keep = [bytes(w) for w, _col in wanted]
        self.wanted = <const char **>calloc(max(n, 1), sizeof(char *))
        self.wanted_len = <size_t *>calloc(max(n, 1), sizeof(size_t))
        self.wanted_col = <int *>calloc(max(n, 1), sizeof(int))
        if not self.wanted or not self.wanted_len or not self.wanted_col:
            raise MemoryError()
        for i, (_w, col) in enumerate(wanted):
            self.wanted[i] = <const char *>(<bytes>self.keep[i])
            self.wanted_len[i] = len(self.keep[i])
            self.wanted_col[i] = col
        memset(&self.spec, 0, sizeof(self.spec))
        self.spec.k = k
        self.spec.n_wanted = n
        self.spec.wanted = self.wanted
        self.spec.wanted_len = self.wanted_len
        self.spec.wanted_col = self.wanted_col
        self.spec.fold_case = fold_case
        self.spec.dali = dali
        self.spec.missing = missing
        self.spec.want_keys = want_keys

    def __dealloc__(self):
        free(self.wanted)
        free(self.wanted_len)
        free(self.wanted_col)


cdef object _u64(const uint64_t *p, size_t n):
    out = np.empty(n, np.uint64)
    cdef uint64_t[::1] v = out
    if n:
        memcpy(&v[0], p, n * sizeof(uint64_t))
    return out


cdef object _i64(const int64_t *p, size_t n):
    out = np.empty(n, np.int64)
    cdef int64_t[::1] v = out
    if n:
        memcpy(&v[0], p, n * sizeof(int64_t))
    return out


cdef dict _columns(fr_wds_samples *s, int k, bint want_keys):
    cdef size_t n = s.n
    out = {
        "start": _u64(s.start, n),
        "length": _u64(s.length, n),
        "comp_off": _i64(s.comp_off, n * k).reshape(n, k),
        "comp_len": _u64(s.comp_len, n * k).reshape(n, k),
        "skipped": int(s.skipped),
    }
    if want_keys:
        out["keys"] = s.keys[:s.keys_len] if s.keys_len else b""
        out["key_off"] = _u64(s.key_off, n + 1) if n else np.zeros(1, np.uint64)
    return out


def index_files(paths, int k, wanted, bint fold_case, bint dali, int missing,
                bint want_keys, unsigned threads):
    """Indexes WebDataset shard files ``paths`` (see the header): a list with,
    per shard, a dict of columns (``start``, ``length``, ``comp_off``,
    ``comp_len``, ``skipped``, ``keys`` + ``key_off`` where asked, ``size``,
    ``mtime_ns``) or, where the C core did not finish it, ``(rc, stage,
    bad_at, message)`` for the caller to redo in the reference code."""
    spec = _Spec(k, wanted, fold_case, dali, missing, want_keys)
    cdef size_t n = len(paths), i
    encoded = [os.fsencode(p) for p in paths]
    cdef const char **cpaths = <const char **>calloc(max(n, 1), sizeof(char *))
    cdef fr_wds_shard *res = <fr_wds_shard *>calloc(max(n, 1), sizeof(fr_wds_shard))
    cdef int rc
    if not cpaths or not res:
        free(cpaths)
        free(res)
        raise MemoryError()
    for i in range(n):
        cpaths[i] = <const char *>(<bytes>encoded[i])
    try:
        with nogil:
            rc = fr_wds_index_files(cpaths, n, &spec.spec, threads, res)
        if rc:
            raise MemoryError("fr_wds_index_files")
        out = []
        for i in range(n):
            if res[i].rc == 0:
                d = _columns(&res[i].samples, k, want_keys)
                d["size"] = int(res[i].file_size)
                d["mtime_ns"] = int(res[i].mtime_ns)
                out.append(d)
            else:
                out.append((res[i].rc, res[i].stage, int(res[i].bad_at),
                            res[i].err.decode("utf-8", "replace")))
        return out
    finally:
        for i in range(n):
            fr_wds_samples_free(&res[i].samples)
        free(cpaths)
        free(res)


def group_members(names, name_off, data_off, sizes, int k, wanted, bint fold_case, bint dali,
                  int missing, bint want_keys=False):
    """Groups the tar members of one shard into samples, natively: ``names``
    (bytes: every name, one after the other), ``name_off`` (uint64, one more
    than the members: name i is ``names[name_off[i]:name_off[i+1]]``),
    ``data_off`` and ``sizes`` (uint64, per member). The columns as
    :func:`index_files` gives them, or None where the reference code must
    redo it (FR_WDS_DEFER)."""
    cdef bytes blob = bytes(names)
    cdef uint64_t[::1] no = np.ascontiguousarray(name_off, np.uint64)
    cdef uint64_t[::1] do = np.ascontiguousarray(data_off, np.uint64)
    cdef uint64_t[::1] sz = np.ascontiguousarray(sizes, np.uint64)
    cdef size_t n = do.shape[0]
    if sz.shape[0] != n or no.shape[0] != n + 1 or (n and no[n] > <uint64_t>len(blob)):
        raise ValueError(f"group_members: {n} data offsets, {sz.shape[0]} sizes and "
                         f"{no.shape[0]} name offsets (needs one more than members), "
                         f"names of {len(blob)} bytes")
    for i in range(n):
        if no[i] > no[i + 1]:
            raise ValueError(f"group_members: name offsets decrease at member {i}")
    spec = _Spec(k, wanted, fold_case, dali, missing, want_keys)
    cdef fr_wds_samples s
    cdef char err[256]
    cdef const char *cnames = blob
    cdef int rc
    err[0] = 0
    memset(&s, 0, sizeof(s))
    cdef const uint64_t *pno = &no[0]
    cdef const uint64_t *pdo = &do[0] if n else NULL
    cdef const uint64_t *psz = &sz[0] if n else NULL
    with nogil:
        rc = fr_wds_group(&spec.spec, cnames, pno, pdo, psz, n, &s, err, sizeof(err))
    try:
        if rc == FR_WDS_DEFER:
            return None
        if rc:
            raise (MemoryError() if rc == -12 else
                   ValueError(err.decode("utf-8", "replace")))
        return _columns(&s, k, want_keys)
    finally:
        fr_wds_samples_free(&s)


def walk_tar(buffer, shard="tar"):
    """The regular files of a tar in ``buffer`` (any object with the buffer
    protocol: bytes, mmap, NumPy): ``(names, name_off, data_off, sizes,
    header_off)`` as :func:`group_members` takes them. Raises ValueError
    ``"{shard}: byte {offset}: ..."`` for a malformed tar."""
    cdef const unsigned char[::1] view = memoryview(buffer).cast("B")
    cdef fr_tar_members m
    cdef uint64_t bad_at = 0
    cdef char err[256]
    cdef int rc
    cdef uint64_t n = view.shape[0]
    cdef const unsigned char *p = &view[0] if n else NULL
    err[0] = 0
    memset(&m, 0, sizeof(m))
    with nogil:
        rc = fr_tar_walk(p, n, &m, &bad_at, err, sizeof(err))
    try:
        if rc == -12:
            raise MemoryError()
        if rc:
            raise ValueError(f"{shard}: byte {bad_at}: {err.decode('utf-8', 'replace')}")
        names = m.names[:m.names_len] if m.names_len else b""
        return (names, _u64(m.name_off, m.n + 1) if m.n else np.zeros(1, np.uint64),
                _u64(m.data_off, m.n), _u64(m.size, m.n), _u64(m.header_off, m.n))
    finally:
        fr_tar_members_free(&m)


def parse_wds2idx(buffer):
    """The members a DALI wds2idx index (its text in ``buffer``) lists:
    ``(names, name_off, data_off, sizes)`` as :func:`group_members` takes
    them (fr_wds2idx_parse). Raises ValueError ``(line, message)`` for a
    malformed index (the message starts ``line N:``)."""
    cdef const unsigned char[::1] view = memoryview(buffer).cast("B")
    cdef fr_tar_members m
    cdef size_t bad_line = 0
    cdef char err[256]
    cdef int rc
    cdef size_t n = view.shape[0]
    cdef const char *p = <const char *>&view[0] if n else NULL
    err[0] = 0
    memset(&m, 0, sizeof(m))
    with nogil:
        rc = fr_wds2idx_parse(p, n, &m, &bad_line, err, sizeof(err))
    try:
        if rc == -12:
            raise MemoryError()
        if rc:
            raise ValueError(int(bad_line), err.decode("utf-8", "replace"))
        names = m.names[:m.names_len] if m.names_len else b""
        return (names, _u64(m.name_off, m.n + 1) if m.n else np.zeros(1, np.uint64),
                _u64(m.data_off, m.n), _u64(m.size, m.n))
    finally:
        fr_tar_members_free(&m)


def squirrel_walk(buffer, keys):
    """Squirrel samples of an inflated shard in ``buffer`` for the ``keys``
    (str): a dict of columns ``start``, ``length`` (uint64 per sample),
    ``fa``, ``fb``, ``data_off`` (int64, -1: none), ``data_len`` ((samples,
    len(keys))), as fr_sq_walk documents them. Raises ValueError
    ``(offset, message)`` where the walk leaves the shard to the reference."""
    cdef const unsigned char[::1] view = memoryview(buffer).cast("B")
    cdef list enc = [str(key).encode("utf-8", "surrogateescape") for key in keys]
    cdef int k = len(enc), j
    cdef const char **ck = <const char **>malloc(max(k, 1) * sizeof(char *))
    cdef size_t *cl = <size_t *>malloc(max(k, 1) * sizeof(size_t))
    cdef fr_sq_samples s
    cdef uint64_t bad_at = 0
    cdef char err[256]
    cdef int rc
    cdef uint64_t n = view.shape[0]
    cdef const unsigned char *p = &view[0] if n else NULL
    if ck == NULL or cl == NULL:
        free(ck)
        free(cl)
        raise MemoryError()
    for j in range(k):
        ck[j] = enc[j]
        cl[j] = len(enc[j])
    err[0] = 0
    memset(&s, 0, sizeof(s))
    try:
        with nogil:
            rc = fr_sq_walk(p, n, ck, cl, k, &s, &bad_at, err, sizeof(err))
        if rc == -12:
            raise MemoryError()
        if rc:
            raise ValueError(int(bad_at), err.decode("utf-8", "replace"))
        m = s.n
        return {"start": _u64(s.start, m), "length": _u64(s.length, m),
                "fa": _u64(s.fa, m * k).reshape(m, k).astype(np.int64),
                "fb": _u64(s.fb, m * k).reshape(m, k).astype(np.int64),
                "data_off": _i64(s.data_off, m * k).reshape(m, k),
                "data_len": _u64(s.data_len, m * k).reshape(m, k).astype(np.int64)}
    finally:
        fr_sq_samples_free(&s)
        free(ck)
        free(cl)
