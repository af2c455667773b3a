"""Feature stores: rows of a storage-backed array gathered by id, to the GPU
or the host (GNN node features, embedding tables).

::

    store = fastread.FeatureStore("/data/feat.npy")        # shape, dtype from the header
    x = store.gather(node_ids)        # CUDA ids -> rows on that GPU, in input order
    x = store.gather(ids, device="cpu")                     # NumPy rows, no GPU needed

A store is one file or block device holding ``shape[0]`` rows of
``shape[1:]`` items of ``dtype`` each, row 0 at ``offset``: a raw file, a
``.npy`` file (its header gives shape and dtype), one sample of a packed
image (``fastread.PackedImage``; the sample's byte range is the array, itself
raw or ``.npy``), or a block device.

Backends (``backend=``): ``"host"`` sorts the ids on the host, coalesces
adjacent rows into range reads and copies to the GPU once -- it runs
everywhere and is what ``device="cpu"`` always uses. ``"proxy"`` gathers
from a CUDA kernel: an HBM page cache in front, a page-locked host tier
(``host_bytes``/``hot_ids``) read by GPU threads, and storage behind both,
misses served by native host threads through rings in mapped memory.
A miss loads the row's page into the cache, except in sparse batches over
an array larger than the cache, whose rows are read on their own
(``stats()["direct_rows"]``; ``FASTREAD_GATHER_FETCH=auto|pages|rows``);
such rows asked for again are kept by row in a hot-row cache, admitted by
frequency (TinyLFU; ``stats()["admission"]``, ``FASTREAD_GATHER_ADMIT=auto|off``).
Gathers from a host tier over 1 GiB sort their ids by region first, which
keeps the GPU's address translation within reach
(``FASTREAD_GATHER_ORDER=auto|on|off``). ``"xnvme-cuda"`` does the same with xNVMe's GPU-resident NVMe queues.
``"auto"``: proxy where a GPU, NVRTC and a row size that divides a cache page
allow, else host; then, per gather, the host backend's path for cold gathers
over an array larger than the cache (``stats()["route_rule"]``).

Settings not given come from the environment (``fastread._gather_defaults``:
``FASTREAD_GATHER_BACKEND``, ``FASTREAD_GATHER_CACHE_BYTES``,
``FASTREAD_GATHER_PAGE_BYTES``, ``FASTREAD_GATHER_HOST_BYTES``, ...).
"""
import errno
import math
import os
from importlib import resources

import numpy as np

from fastread import _core, _defaults, _devarrays as D, _gather, _gather_defaults as G
from fastread._safe_open import open_fd
from fastread.errors import SpecialFileError
from fastread.image import PackedImage, _open_region
from fastread.npy import MAGIC as NPY_MAGIC, NpyError, parse_header
from fastread.s3 import S3Options, is_url, take_options as take_s3_options
from fastread.source import FileRanges

__all__ = ["FeatureStore", "device_include_dir", "device_header", "BACKENDS"]

BACKENDS = ("auto", "host", "proxy", "xnvme-cuda")
#: The hot-row cache's admission policy, in words (fastread_device.cuh, "Hot rows").
ADMISSION_RULE = ("rows read on their own (row fetches) are counted in a count-min sketch "
                  "behind a doorkeeper (a row's first request only sets its bit), with a "
                  "cached row's first hit after it went in or was swept; both are halved "
                  "(the doorkeeper emptied) every 10 x slots fetched rows. While the hot-row "
                  "cache (a quarter of cache_bytes, 8-way sets) has room, every fetched row "
                  "goes into a free way after the gather; then a row counted twice or more "
                  "goes in over the least frequent way not hit since the last sweep, and only "
                  "when it is counted more often (TinyLFU); a row seen once never replaces "
                  "one. FASTREAD_GATHER_ADMIT=off turns it off")
DEVICE_BACKENDS = ("proxy", "xnvme-cuda")
MIN_PAGE, MAX_PAGE = 4 << 10, 1 << 20
_NPY_PROBE = 64 << 10  # enough for any header np.load accepts


def device_include_dir():
    """The directory holding ``fastread_device.cuh``, for users' own kernels
    (``cupy.RawModule(code=..., options=("-I" + device_include_dir(),))``),
    which read rows through a store's :attr:`FeatureStore.device_view`.

    The copy installed with fastread (``fastread/include``); where a build
    installed none, the header compiled into the library, written once to
    ``$FASTREAD_CACHE_DIR/include`` (default ``~/.cache/fastread/include``)."""
    installed = resources.files("fastread") / "include"
    if (installed / "fastread_device.cuh").is_file():
        return str(installed)
    src = device_header().encode()
    base = os.environ.get("FASTREAD_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastread")
    d = os.path.join(base, "include")
    path = os.path.join(d, "fastread_device.cuh")
    try:
        with open(path, "rb") as f:
            if f.read() == src:
                return d
    except OSError:
        pass
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(src)
    os.replace(tmp, path)  # atomic: concurrent users see the old or the new file whole
    return d


def device_header():
    """The source of ``fastread_device.cuh`` compiled into the library."""
    return _gather.device_header()


def _is_power_of_two(v):
    return v > 0 and v & (v - 1) == 0


def _region_size(path):
    """Bytes in a regular file or block device; errors name the path."""
    try:
        fd, size = _open_region(path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "feature file not found", path) from None
    except SpecialFileError as e:
        raise ValueError(f"feature store {path!r} is neither a regular file nor a block "
                         f"device ({e.kind})") from None
    os.close(fd)
    return size


def _object_size(url, s3):
    """Bytes in the object ``url`` (from a listing of its key: no HEAD in
    the s3 client); errors name the URL."""
    from fastread.s3 import list_objects, split_url

    _, key = split_url(url)
    if not key:
        raise ValueError(f"feature store {url!r}: an s3:// store is one object; give its key")
    for obj in list_objects(url, s3):
        if obj.key == key:
            return obj.size
    raise FileNotFoundError(errno.ENOENT, "feature object not found", url)


def _pread(path, n, offset, s3=None):
    if is_url(path):
        # The .npy header probe of an object: one ranged GET.
        from fastread.image import _url_ranges
        return _url_ranges(path, [offset], [n], s3, f"feature store {path!r}")[0] if n else b""
    fd, _ = open_fd(path, block_devices=True, blocking=False)   # pread ignores O_NONBLOCK
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


def _int(value, what, minimum=0):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class FeatureStore:
    """Rows of an array in a file, a ``.npy`` file, a packed-image sample or
    a block device, gathered by id (see the module's text).

    ``path``: the file or device, or a :class:`fastread.PackedImage` (any
    :class:`fastread.source.FileRanges`; then ``sample=`` picks the sample
    by index or name; a path with ``sample=`` is opened as a packed image,
    ``index=`` naming its index file).
    ``dtype``/``shape``: required for raw data (``shape`` may be None for
    1-D data, or start with -1 to count the rows from the size); optional for
    ``.npy`` data, and checked against the header if given. ``offset``: bytes
    before row 0 (within the sample, for a packed image).

    ``backend``, ``cache_bytes``, ``page_bytes``, ``host_bytes`` (an int,
    ``"auto"``, or a size such as ``"8G"``), ``hot_ids``, ``ring_entries``,
    ``timeout_ms``: the device path (see :mod:`fastread._gather_defaults`
    for their defaults). ``engine``, ``o_direct`` (None: where offsets are
    aligned), ``queue_depth``, ``threads``, ``engine_args`` and the xNVMe
    options (``xnvme_be``, ...): host-side reads. ``device_id``: the GPU
    (None: ``FASTREAD_DEVICE_ID`` if a GPU is usable, else host only; -1:
    host only, CUDA never loaded).

    Thread-safe: gathers from several threads are correct (they run one at a
    time). :meth:`close` while gathers run in other threads refuses new ones
    (ValueError) and frees the store once the running gather has returned
    (see ``_gather.Store``); a gather the core cancels raises ``OSError``
    (``errno.ECANCELED``).
    """

    def __init__(self, path, dtype=None, shape=None, *, offset=0, engine=None, backend=None,
                 cache_bytes=None, page_bytes=None, host_bytes=None, hot_ids=None,
                 device_id=None, sample=None, index=None, o_direct=None, queue_depth=None,
                 threads=None, engine_args=None, ring_entries=None, timeout_ms=None,
                 kernel_cache_dir=None, nvrtc_path=None, **engine_options):
        self._store = None
        self._auto_note = None  # why backend "auto" settled for the host backend
        # S3 options (s3= or flat keywords) for an s3:// store.
        s3 = take_s3_options(engine_options).pop("s3", None)
        self.s3 = S3Options.coerce(s3) if s3 is not None else None
        self._args = dict(path=path, dtype=dtype, shape=shape, offset=offset, engine=engine,
                          backend=backend, cache_bytes=cache_bytes, page_bytes=page_bytes,
                          host_bytes=host_bytes, hot_ids=hot_ids, device_id=device_id,
                          sample=sample, index=index, o_direct=o_direct,
                          queue_depth=queue_depth, threads=threads, engine_args=engine_args,
                          ring_entries=ring_entries, timeout_ms=timeout_ms,
                          kernel_cache_dir=kernel_cache_dir, nvrtc_path=nvrtc_path,
                          s3=self.s3, **engine_options)
        file_path, base, size, what = self._source(path, sample, index)
        self.path = file_path
        offset = _int(offset, "offset")
        self._layout(file_path, base, size, offset, what, dtype, shape)
        backend = self._backend(backend)
        if is_url(file_path):
            # Rows of an object are ranged GETs through the s3 engine, which
            # the host backend issues; the device backends' host threads
            # read a local file (mappings, RWF_NOWAIT).
            if backend in DEVICE_BACKENDS:
                raise ValueError(f"feature store {what}: backend {backend!r} reads local files; "
                                 "an s3:// object is read by backend='host'")
            backend = "host"
        self.device_id, self._no_gpu = self._device(device_id, backend)
        page, device_ok = self._page(page_bytes, backend)
        if backend == "auto" and not device_ok:
            backend = "host"
        cfg = self._config(engine, backend, cache_bytes, page, host_bytes, hot_ids, o_direct,
                           queue_depth, threads, engine_args, ring_entries, timeout_ms,
                           kernel_cache_dir, engine_options)
        if nvrtc_path is None and not os.environ.get("FASTREAD_NVRTC") and backend != "host":
            nvrtc_path = G.nvrtc_wheel_dir()  # pip's nvidia-cuda-nvrtc, if that is all there is
        if nvrtc_path is not None:
            cfg["nvrtc_path"] = os.fspath(nvrtc_path)
        try:
            self._store = _gather.Store(file_path, self.offset, self.rows, self.row_bytes, **cfg)
        except OSError as e:
            if e.errno == errno.ENOENT and os.path.exists(file_path):
                # Not the data: something the device path loads (NVRTC), named in the message.
                raise RuntimeError(f"feature store {what}: {e.strerror or e}") from None
            raise type(e)(e.errno, f"feature store {what}: {e.strerror or e}") from None
        except (ValueError, RuntimeError, MemoryError) as e:
            raise type(e)(f"feature store {what}: {e}") from None
        self.backend = self._store.backend
        #: Why backend "auto" runs the host backend here with a GPU (None: it did not).
        self.backend_note = self._auto_note or self._store.backend_reason or None
        #: Where the gather kernel came from ("" without a device path).
        self.kernel_source = self._store.kernel_source

    # -- opening ----------------------------------------------------------------

    def _source(self, path, sample, index):
        """(file path, base offset, bytes available from there, name for errors)."""
        if isinstance(path, FileRanges) or sample is not None:
            img = path if isinstance(path, FileRanges) else PackedImage(path, index=index,
                                                                         s3=self.s3)
            if self.s3 is None and getattr(img, "s3", None) is not None:
                self.s3 = img.s3   # the options its index was read with
            if sample is None:
                raise ValueError(f"a packed image ({img.path!r}) needs sample= (an index or a "
                                 "name) to say which sample holds the array")
            if isinstance(sample, str):
                try:
                    i = img.names.index(sample)
                except ValueError:
                    raise KeyError(f"packed image {img.path!r} has no sample {sample!r}") from None
            else:
                i = _int(sample, "sample")
                if i >= len(img):
                    raise IndexError(f"sample {i} is out of range for packed image {img.path!r} "
                                     f"of {len(img)} samples")
            self.sample = img.names[i]
            return (img.path, int(img.offsets[i]), int(img.lengths[i]),
                    repr(img.sample_name(i)))
        if index is not None:
            raise TypeError("index= names a packed image's index: give sample= too")
        self.sample = None
        p = os.fspath(path)
        if isinstance(p, bytes):
            p = os.fsdecode(p)
        if is_url(p):
            return p, 0, _object_size(p, self.s3), repr(p)
        return p, 0, _region_size(p), repr(p)

    def _layout(self, path, base, size, offset, what, dtype, shape):
        """Sets dtype, shape, rows, row_bytes, offset (absolute) and npy."""
        head = (_pread(path, min(_NPY_PROBE, size), base, self.s3)
                if size >= len(NPY_MAGIC) else b"")
        self.npy = offset == 0 and head[:len(NPY_MAGIC)] == NPY_MAGIC
        if self.npy:
            try:
                hdr = parse_header(head, path=what.strip("'"))
            except NpyError as e:
                raise ValueError(f"feature store {what}: {e.what}") from None
            if hdr.fortran_order and len(hdr.shape) > 1:
                raise ValueError(f"feature store {what}: the .npy array is in Fortran order, so "
                                 "its rows are not contiguous (save it in C order)")
            if len(hdr.shape) == 0:
                raise ValueError(f"feature store {what}: the .npy array is 0-d; rows need at "
                                 "least one dimension")
            if dtype is not None and np.dtype(dtype) != hdr.dtype:
                raise TypeError(f"feature store {what}: dtype={np.dtype(dtype)} given, the .npy "
                                f"header says {hdr.dtype}")
            if shape is not None:
                want = tuple(shape) if not isinstance(shape, int) else (shape,)
                if len(want) != len(hdr.shape) or any(
                        w not in (-1, None, h) for w, h in zip(want, hdr.shape)):
                    raise ValueError(f"feature store {what}: shape={want} given, the .npy "
                                     f"header says {hdr.shape}")
            dtype, shape, offset = hdr.dtype, hdr.shape, hdr.data_offset
        elif dtype is None:
            if str(path).endswith(".npy") and offset == 0:   # the file's fault, not the call's
                raise ValueError(f"feature store {what}: not a .npy file (it starts with "
                                 f"{bytes(head[:len(NPY_MAGIC)])!r}, not {NPY_MAGIC!r}); raw "
                                 "data needs dtype= (and shape=)")
            raise TypeError(f"feature store {what}: raw data needs dtype= (and shape=; only "
                            ".npy data carries its own)")
        try:
            self.dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"feature store {what}: dtype={dtype!r}: {e}") from None
        if self.dtype.hasobject or self.dtype.itemsize == 0:
            # From a .npy header: the file's fault (ValueError), else the caller's.
            raise (ValueError if self.npy else TypeError)(
                f"feature store {what}: dtype {self.dtype} cannot be stored raw")
        if offset > size:
            raise ValueError(f"feature store {what}: offset {offset} is past its end "
                             f"({size} bytes)")
        avail = size - offset
        if shape is None:
            shape = (-1,)
        elif isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        shape = tuple(shape)
        if not shape:
            raise ValueError(f"feature store {what}: shape must have at least one dimension")
        # Named by the store: a shape read from a .npy header is not the caller's.
        row_shape = tuple(_int(d, f"feature store {what}: shape[{i + 1}]", 1)
                          for i, d in enumerate(shape[1:]))
        row_bytes = self.dtype.itemsize * math.prod(row_shape)
        rows = shape[0]
        if rows in (-1, None):
            rows = avail // row_bytes
        else:
            rows = _int(rows, f"feature store {what}: shape[0]", 1)
        rows = _int(rows, f"feature store {what}: shape[0]")
        need = rows * row_bytes
        if need > avail:
            raise ValueError(f"feature store {what} is too short for shape {(rows,) + row_shape} "
                             f"of {self.dtype}: {need} bytes needed from offset {offset}, "
                             f"it has {avail}")
        self.shape = (rows,) + row_shape
        self.row_shape = row_shape
        self.rows = rows
        self.row_bytes = row_bytes
        self.offset = base + offset

    def _backend(self, backend):
        if backend is None:
            backend = G.get("backend")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; backends: {', '.join(BACKENDS)}"
                             + (f" (from {G.env_var('backend')})"
                                if os.environ.get(G.env_var("backend")) == backend else ""))
        return backend

    def _device(self, device_id, backend):
        """(device id or -1, why there is no GPU or None)."""
        if device_id == -1:
            if backend in DEVICE_BACKENDS:
                raise ValueError(f"backend {backend!r} runs on a GPU; device_id=-1 asks for none")
            return -1, "the store was opened with device_id=-1 (host only)"
        explicit = device_id is not None
        d = _defaults.get("device_id") if device_id is None else _int(device_id, "device_id")
        ok, why = _core.gpu_probe(d)
        if ok:
            return d, None
        why = f"no usable CUDA device {d}: {why}"
        if explicit or backend in DEVICE_BACKENDS:
            what = f"device_id={d}" if explicit else f"backend {backend!r}"
            raise RuntimeError(f"feature store {self.path!r}: {what} needs a GPU; {why}")
        return -1, why

    def _page(self, page_bytes, backend):
        """(cache page size, whether the device path can use it); the
        second is False only for backend "auto" when no page fits the row."""
        explicit = page_bytes is not None
        page = G.parse_bytes(page_bytes, "page_bytes") if explicit else G.get("page_bytes")
        what = "page_bytes" if explicit else G.env_var("page_bytes")
        if not _is_power_of_two(page) or not MIN_PAGE <= page <= MAX_PAGE:
            raise ValueError(f"{what}={page}: a cache page must be a power of two from "
                             f"{MIN_PAGE} to {MAX_PAGE} bytes")
        if self.device_id < 0 or backend == "host":
            return page, True
        if page % self.row_bytes == 0:
            return page, True
        # A larger page may hold the row whole.
        fits = _is_power_of_two(self.row_bytes) and self.row_bytes <= MAX_PAGE
        if fits and not explicit:
            return max(page, self.row_bytes), True
        if backend == "auto" and not explicit:
            self._auto_note = (f"rows of {self.row_bytes} bytes fit no cache page (a power of "
                               f"two, {MIN_PAGE}..{MAX_PAGE} bytes, that the row size divides)")
            return page, False
        raise ValueError(f"feature store {self.path!r}: {what}={page} is not a multiple of the "
                         f"row size ({self.row_bytes} bytes: {self.row_shape} of {self.dtype}); "
                         + ("use a page the row divides, or " if fits else "")
                         + "use backend='host'")

    def _config(self, engine, backend, cache_bytes, page, host_bytes, hot_ids, o_direct,
                queue_depth, threads, engine_args, ring_entries, timeout_ms, cache_dir,
                engine_options):
        from fastread.engine import XNVME_OPTIONS, _fold_xnvme, resolve

        from fastread.engine import URL_ENGINES, for_paths
        from fastread.s3 import engine_args_for

        if engine is None:
            engine = G.get("engine")
        # 'auto' over an s3:// object is the s3 engine (engine.for_paths).
        engine = for_paths(engine, self.path)
        engine = resolve(None if engine == "auto" else engine)
        if self.s3 is not None and engine not in URL_ENGINES:
            raise TypeError(f"feature store {self.path!r}: S3 options apply only to s3:// "
                            f"objects (engine 's3'), not to engine {engine!r}")
        unknown = sorted(set(engine_options) - set(XNVME_OPTIONS))
        if unknown:
            raise TypeError(f"FeatureStore got unknown option(s) "
                            f"{', '.join(map(repr, unknown))}")
        if engine_args is None:
            engine_args = _defaults.get("engine_args")
        if not isinstance(engine_args, str):
            raise ValueError(f"engine_args must be a string, got {engine_args!r}")
        engine_args = _fold_xnvme(engine, {k: v for k, v in engine_options.items()
                                           if v is not None}, engine_args)
        if self.s3 is not None:
            engine_args = engine_args_for(engine_args, self.s3)
        if o_direct is None:
            o_direct = G.get("o_direct")
        o_direct = -1 if o_direct == "auto" else int(bool(o_direct))
        cache = G.get("cache_bytes") if cache_bytes is None else G.parse_bytes(cache_bytes,
                                                                               "cache_bytes")
        if cache and cache < page:
            raise ValueError(f"cache_bytes={cache} holds not one page of {page} bytes")
        if host_bytes is None:
            host_bytes = G.get("host_bytes")
        elif not (isinstance(host_bytes, str) and host_bytes.strip().lower() == "auto"):
            host_bytes = G.parse_bytes(host_bytes, "host_bytes")
        if isinstance(host_bytes, str):
            host_bytes = _gather.HOST_BYTES_AUTO
        hot = None
        if hot_ids is not None:
            hot = D.as_ids(hot_ids).host_int64()
            bad = np.flatnonzero((hot < 0) | (hot >= self.rows))
            if len(bad):
                raise IndexError(f"hot_ids[{bad[0]}] = {hot[bad[0]]} is out of range for "
                                 f"{self.rows} rows of {self.path!r}")
        ring = G.get("ring_entries") if ring_entries is None else _int(ring_entries,
                                                                        "ring_entries")
        if ring and not _is_power_of_two(ring):
            raise ValueError(f"ring_entries={ring} must be a power of two (or 0: the default)")
        timeout = G.get("timeout_ms") if timeout_ms is None else _int(timeout_ms, "timeout_ms", 1)
        qd = G.get("queue_depth") if queue_depth is None else _int(queue_depth, "queue_depth")
        th = G.get("threads") if threads is None else _int(threads, "threads")
        if cache_dir is None:
            cache_dir = G.get("cache_dir") or None
        self.engine = engine
        self.page_bytes = page
        return dict(backend=backend, engine=engine, engine_args=engine_args, o_direct=o_direct,
                    queue_depth=qd, threads=th, device_id=self.device_id, cache_bytes=cache,
                    page_bytes=page, host_bytes=host_bytes, hot_ids=hot,
                    ring_entries=ring, timeout_ms=timeout, cache_dir=cache_dir)

    # -- gathers ----------------------------------------------------------------

    def gather(self, ids, *, device=None, out=None, stream=None):
        """Rows ``ids`` in input order, of shape ``ids.shape + row_shape``.

        ``ids``: int32/int64, as a CUDA tensor (torch, CuPy, or anything with
        ``__cuda_array_interface__`` or DLPack), a NumPy array, a host torch
        tensor, or a list. Duplicated and unsorted ids are fine; an id
        outside ``[0, rows)`` raises IndexError naming the first such id
        and its position.

        ``device``: "cuda" (or "cuda:N", the store's GPU), "cpu", or None
        (where the ids are). Rows come back as the ids' library: torch in,
        torch out; CuPy in, CuPy out; NumPy or list ids give NumPy on the
        CPU and, on the GPU, torch if it is installed, else CuPy. Host rows
        for torch ids are a torch CPU tensor.

        ``out``: where to put them (shape, dtype, device and C order are
        checked); it is returned. ``stream``: the CUDA stream the work is
        ordered on (a torch or CuPy stream, or a CUstream address); default:
        the current stream of the ids' library (torch's for torch tensors).
        The call returns once the rows are there.
        """
        store = self._live()
        ids = D.as_ids(ids)
        kind, index = D.parse_device(device, ids)
        shape = ids.shape + self.row_shape
        if kind == "cpu":
            return self._gather_host(store, ids, shape, out)
        return self._gather_device(store, ids, shape, index, out, stream)

    def _gather_host(self, store, ids, shape, out):
        flat = ids.host_int64()
        rows = (np.empty(shape, self.dtype) if out is None
                else D.check_host_out(out, shape, self.dtype))
        if flat.size:
            try:
                store.gather_host(flat, rows.reshape(-1).view(np.uint8))
            except IndexError as e:
                raise self._index_error(D.Ids(flat, "numpy", None, flat.dtype, ids.shape),
                                        e) from None
        if out is not None:
            return out
        if ids.lib == "torch":
            import torch
            return torch.from_numpy(rows)
        return rows

    def _gather_device(self, store, ids, shape, index, out, stream):
        if self.device_id < 0:
            raise RuntimeError(f"feature store {self.path!r} cannot gather to a GPU: "
                               f"{self._no_gpu}")
        dev = self.device_id
        # The ids' own GPU first: with device=None the index is taken from
        # the ids, and "device='cuda:1' asked for" would name an argument the
        # caller never gave (test_ids_on_another_gpu, 2 GPUs).
        for what, d in (("ids on GPU {}", ids.device), ("device='cuda:{}' asked for", index)):
            if d is not None and d != dev:
                raise ValueError(f"{what.format(d)}, but feature store {self.path!r} serves "
                                 f"GPU {dev} (device_id={dev})")
        if out is not None:
            out_ptr, out_lib = D.check_device_out(out, shape, self.dtype, dev)
        D.check_native(self.dtype)
        lib = ids.lib if ids.lib in ("torch", "cupy") else (
            out_lib if out is not None and out_lib != "cai" else D.default_gpu_lib())
        if lib is None:
            raise RuntimeError("device='cuda' needs torch or CuPy to hold the rows; neither "
                               "is installed")
        handle = D.stream_handle(stream)
        with D.on_stream(lib, dev, stream, handle):
            if handle is None:
                handle = D.current_stream(lib, dev)
            if ids.device is None:
                ids = D.upload(ids, lib, dev)
            rows = D.empty(lib, shape, self.dtype, dev) if out is None else out
            if out is None:
                out_ptr = D._data_ptr(rows, lib)
            if ids.size:
                try:
                    store.gather_device(ids.ptr, ids.dtype.itemsize, ids.size, out_ptr, handle)
                except IndexError as e:
                    raise self._index_error(ids, e) from None
        return rows

    def _index_error(self, ids, e):
        bad = D.first_bad(ids, self.rows)
        if bad is None:  # the core's position, where our own scan finds none
            pos = getattr(e, "position", None)
            return IndexError(f"{e} (position {pos}) in feature store {self.path!r}")
        pos, value = bad
        where = f"position {pos}"
        if len(ids.shape) > 1:
            where += f" (index {tuple(int(i) for i in np.unravel_index(pos, ids.shape))})"
        return IndexError(f"id {value} at {where} is out of range for the {self.rows} rows "
                          f"of feature store {self.path!r}")

    # -- state ------------------------------------------------------------------

    def _live(self):
        if self._store is None or self._store.closed:
            raise ValueError(f"feature store {self.path!r} is closed")
        return self._store

    def stats(self):
        """Where the rows of every gather so far came from: ``hits`` (rows
        from the HBM cache), ``misses`` (pages brought into it),
        ``coalesced`` (requests merged into another), ``host_tier_rows``,
        ``direct_rows`` (rows read from storage on their own, past the cache:
        sparse batches over arrays larger than the cache, see
        ``FASTREAD_GATHER_FETCH``), ``storage_reads`` (read requests to
        storage), ``mapped_reads`` (of those, copied by the proxy from a
        read-only mapping of a file the page cache held), ``bytes_read``,
        ``evictions``, ``gathers``, ``rows``, and ``tiers``: rows served by
        each tier (device_cache, host_tier, storage).

        Hot rows (see docs/gathers.md): ``row_hits`` (rows served from the
        hot-row cache, counted in ``tiers["device_cache"]``), ``admitted``
        (rows let in), ``admission`` (the policy, in words). Backend "auto"
        picks a path per gather: ``host_routed`` (gathers run on the host
        path), ``route`` (where the last gather with CUDA ids ran, and why;
        "" before one) and ``route_rule`` (the rule, in words)."""
        store = self._live()
        st = store.stats()
        out = {"gathers": st["gathers"], "rows": st["rows"], "hits": st["cache_hits"],
               "misses": st["cache_misses"], "coalesced": st["coalesced"],
               "host_tier_rows": st["host_tier_rows"], "direct_rows": st["direct_rows"],
               "storage_reads": st["storage_reads"], "mapped_reads": st["mapped_reads"],
               "bytes_read": st["bytes_read"], "evictions": st["evictions"],
               "row_hits": st["row_hits"], "admitted": st["admitted"],
               "host_routed": st["host_routed"]}
        hbm = out["hits"] + out["row_hits"]
        out["tiers"] = {"device_cache": hbm, "host_tier": out["host_tier_rows"],
                        "storage": out["rows"] - hbm - out["host_tier_rows"]}
        out["route"] = store.route()
        out["route_rule"] = _gather.route_rule()
        out["admission"] = ADMISSION_RULE
        return out

    def memory(self):
        """Bytes held, by part (device_cache, device_meta, host_tier, rings,
        staging, host_buffers), and their total."""
        m = dict(self._live().memory())
        m["total"] = sum(m.values())
        return m

    @property
    def device_view(self):
        """Device address of the store's ``fr_dev_store`` for users' kernels
        (``#include <fastread_device.cuh>``; see :func:`device_include_dir`);
        0 without a device path. Valid until :meth:`close`."""
        return self._live().device_view()

    @property
    def closed(self):
        return self._store is None or self._store.closed

    def close(self):
        """Frees the store; a gather running in another thread is cancelled."""
        if self._store is not None:
            self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self):
        return self.rows

    def __reduce__(self):
        # A DataLoader worker gets its own store over the same data.
        return (_reopen, (self._args,))

    def __repr__(self):
        state = "closed" if self.closed else f"backend {self.backend!r}"
        src = self.path if self.sample is None else f"{self.path}[{self.sample}]"
        return (f"FeatureStore({src!r}, {self.dtype}, {self.shape}, offset {self.offset}, "
                f"{state})")


def _reopen(args):
    args = dict(args)
    return FeatureStore(args.pop("path"), args.pop("dtype"), args.pop("shape"), **args)
