"""The pure-Python readers fastread is measured against.

:class:`FileInputIterator` mirrors the seed's ``FileInputIterator``: the
usual DALI ``fn.external_source`` pattern of a plain Python iterator that
reads every sample with ``np.fromfile(path, dtype=np.uint8)`` on the
pipeline's Python thread (with the GIL held) and returns one batch as
``(list of uint8 arrays, list of np.array([label], dtype=np.int32))``,
cycling over the dataset forever. :func:`python_loop` is the same loop
without DALI.
"""
import numpy as np


class FileInputIterator:
    """The seed's DALI external source: ``np.fromfile`` per sample, cycling.

    Use as ``fn.external_source(source=FileInputIterator(...), num_outputs=2,
    batch=True)``. Samples and labels come from :func:`fastread.scan`, so
    they are those of ``fn.readers.file(file_root=...)`` in the same order.
    """

    def __init__(self, file_root=None, batch_size=64, *, paths=None, labels=None):
        if paths is None:
            from fastread import scan
            paths, labels = scan(file_root)
        if len(paths) == 0:
            raise ValueError(f"no samples under {file_root!r}")
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int32)
        self.batch_size = int(batch_size)
        self.n = len(self.paths)
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        batch, labels = [], []
        for _ in range(self.batch_size):
            batch.append(np.fromfile(self.paths[self.i], dtype=np.uint8))
            labels.append(np.array([self.labels[self.i]], dtype=np.int32))
            self.i = (self.i + 1) % self.n
        return batch, labels

    next = __next__

    def __len__(self):
        return self.n


def python_loop(paths, labels, batch_size):
    """One epoch of ``(arrays, labels)`` batches read with ``np.fromfile``
    per sample in a plain Python loop (the last batch may be short)."""
    labels = np.asarray(labels, dtype=np.int32)
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        yield [np.fromfile(p, dtype=np.uint8) for p in chunk], labels[start:start + batch_size]


# -- the seed's xNVMe loop: PyPI ``xnvme`` ctypes bindings, one file at a time ---------
_xnvme = {}


def xnvme_ctypes_error():
    """Why the ctypes baseline cannot run here, or None."""
    try:
        _xnvme_bindings()
    except Exception as e:  # ImportError, OSError for a missing libxnvme, ...
        return f"xNVMe ctypes bindings unavailable ({type(e).__name__}: {e}; pip install xnvme)"
    return None


def _xnvme_bindings():
    if "mod" not in _xnvme:
        import ctypes

        import xnvme.ctypes_bindings as xnvme
        if not xnvme.is_loaded:
            raise OSError("libxnvme not found by the bindings (set XNVME_LIBRARY_PATH)")
        libc = ctypes.CDLL(None)
        libc.__errno_location.restype = ctypes.POINTER(ctypes.c_int)
        _xnvme["mod"], _xnvme["libc"] = xnvme, libc
    return _xnvme["mod"], _xnvme["libc"]


def xnvme_ctypes_read(path, async_be=b"emu", direct=False):
    """One file through xnvme_file_open / xnvme_file_pread / xnvme_file_close
    from Python (the seed's loop; /tmp/xnvme_py_baseline.py), as a uint8 array."""
    import ctypes

    xnvme, libc = _xnvme_bindings()
    errno_ = libc.__errno_location().contents
    opts = xnvme.xnvme_opts_default()
    be = ctypes.create_string_buffer(b"linux")
    asy = ctypes.create_string_buffer(async_be)
    opts.be = be
    setattr(opts, "async", asy)  # 'async' is a keyword
    opts.rdonly, opts.rdwr, opts.direct = 1, 0, int(direct)
    dev = xnvme.xnvme_file_open(path.encode(), ctypes.byref(opts))
    if not dev:
        raise OSError(errno_.value, "xnvme_file_open failed", path)
    try:
        size = xnvme.xnvme_dev_get_geo(dev).contents.tbytes
        nbytes = (size + 4095) // 4096 * 4096 if direct else size
        buf = xnvme.xnvme_buf_alloc(dev, max(nbytes, 1))
        try:
            ctx = xnvme.xnvme_file_get_cmd_ctx(dev)
            errno_.value = 0  # psync: a short read is an error iff errno is set
            err = xnvme.xnvme_file_pread(ctypes.byref(ctx), buf, nbytes, 0)
            if err or ctx.cpl.status.sc:
                raise OSError(-err or ctx.cpl.status.sc, "xnvme_file_pread failed", path)
            return np.frombuffer(ctypes.string_at(buf, ctx.cpl.result), dtype=np.uint8)
        finally:
            xnvme.xnvme_buf_free(dev, buf)
    finally:
        xnvme.xnvme_file_close(dev)


def xnvme_ctypes_loop(paths, labels, batch_size):
    """One epoch of ``(arrays, labels)`` batches read with
    :func:`xnvme_ctypes_read` per sample in a plain Python loop."""
    labels = np.asarray(labels, dtype=np.int32)
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        yield [xnvme_ctypes_read(p) for p in chunk], labels[start:start + batch_size]
