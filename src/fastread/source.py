"""Sample sources: the samples a :class:`fastread.Reader` reads.

A source is a fixed list of samples numbered ``0 .. len - 1``. The Reader
decides which samples each batch holds (epochs, shards, shuffles); the source
says what the samples are and how the native core reads them. Two kinds ship:

- :class:`FileList`: whole files (what :func:`fastread.scan` lists).
- :class:`FileRanges`: byte ranges of one file or block device;
  :class:`fastread.PackedImage` is one.

What a source provides (a new one, e.g. a record format such as CIFAR
binary, Squirrel or WebDataset, subclasses :class:`SampleSource`; when its
samples are byte ranges of one file, subclass :class:`FileRanges` and only
parse the format's index):

``names``
    A sequence of ``len`` strings, one per sample: a path, or the sample's
    name inside a container. ``len(source)`` is ``len(names)``.
``labels``
    One integer label per sample (stored as int32).
``sizes``
    An int64 array of each sample's byte size where the source knows it up
    front (ranges, fixed-size records), else ``None`` (files are sized when
    read). Sizes must be >= 0 and one per sample.
``sample_name(i)``
    How errors name sample ``i`` (default ``names[i]``).
``reads_ranges``
    True if the samples are byte ranges of one file or device, so that
    range-only engines (``'xnvme'``) can read them.
``check_options(options)``
    Raises ``ValueError`` if these resolved engine options cannot read the
    source (e.g. ``O_DIRECT`` with unaligned ranges). Default: any can.
``open_native(engine, options, *, prefetch, workers)``
    A :class:`fastread.NativeReader` over exactly these samples (its sample
    ``i`` is the source's sample ``i``) for a resolved engine name and its
    resolved options (:meth:`fastread.engine.EngineOptions.resolve`).
``read_batch(context, indices)``
    Samples ``indices`` read in one call on an engine
    :class:`fastread.Context`, as a :class:`fastread.Batch`.
``read_batch_dense(context, indices)``
    The same, asking the engine to lay the samples back to back (a dense
    batch, for :meth:`SampleSource.read_packed`); default: ``read_batch``.
``batch_labels(batch, indices)`` (optional)
    The labels of a batch the native reader read, where the engine reads
    them with the samples (rows with a label column:
    :class:`fastread.cassandra.CassandraSource`); default ``labels[indices]``.
``native_engine`` (optional)
    The one engine that reads this source (``'cql'``), taken for
    ``engine='auto'``.
``default_workers`` (optional)
    Reader threads when neither the caller nor ``FASTREAD_WORKERS`` says:
    a network source's (each worker keeps one batch in flight).
``failure_detail(name)`` (optional)
    The engine's words for why sample ``name`` failed, asked again on this
    thread (a Reader's native threads keep no message).

:meth:`SampleSource.read` (one-shot reads) and :func:`read_in_order` (one
pass with read-ahead) are built on those; :func:`check_source` is what a
consumer calls before trusting a source it did not build.
"""
import abc
import os
from typing import NamedTuple

import numpy as np

from fastread import _core, _defaults
from fastread.engine import (RANGE_ONLY, URL_ENGINES, EngineOptions, cached_context, check_engine,
                             for_paths, open_engine)
from fastread.files import packed, raise_failures
from fastread.index import scan
from fastread.names import NameTable, PathTable

__all__ = ["SampleSource", "FileList", "FileRanges", "OpenedReader", "check_source",
           "open_native_reader", "read_in_order"]


class SampleSource(abc.ABC):
    """The interface every sample source implements (see the module's
    documentation for what each member means). Subclasses set ``names`` and
    ``labels`` (attributes or properties) and implement :meth:`open_native`
    and :meth:`read_batch`."""

    #: True for sources whose samples are byte ranges of one file or device.
    reads_ranges = False

    @property
    def sizes(self):
        """Byte sizes of the samples if known up front, else None."""
        return None

    def __len__(self):
        return len(self.names)

    def sample_name(self, i):
        """How errors name sample ``i``."""
        return str(self.names[i])

    def check_options(self, options):
        """Raises ValueError if the resolved engine ``options`` cannot read
        this source. Every engine option can read a plain source."""

    @abc.abstractmethod
    def open_native(self, engine, options, *, prefetch, workers):
        """A NativeReader over this source's samples (see the module doc)."""

    @abc.abstractmethod
    def read_batch(self, context, indices):
        """Samples ``indices`` (an int64 array) read in one call on ``context``."""

    def read_batch_dense(self, context, indices):
        """:meth:`read_batch` with the samples back to back, where the
        source can ask for it (see the module doc)."""
        return self.read_batch(context, indices)

    def read(self, indices, engine="auto", options=None, **engine_options):
        """The samples ``indices`` (negative ones count from the end) as a
        list of uint8 arrays, in one native call with the GIL released.
        Raises :class:`fastread.ReadError` naming the first failed sample."""
        return self._read_checked(indices, engine, options, engine_options, False).arrays()

    def read_packed(self, indices, engine="auto", options=None, **engine_options):
        """The samples ``indices`` back to back in one buffer, as
        :func:`fastread.files.read_files_packed` gives files: ``(data,
        offsets)``, sample ``indices[k]`` being
        ``data[offsets[k]:offsets[k + 1]]``; the engine's arena as read where
        the source and engine lay samples out back to back (whole files,
        ranges; not O_DIRECT), else copied into it. Errors as :meth:`read`."""
        return packed(self._read_checked(indices, engine, options, engine_options, True))

    def _read_checked(self, indices, engine, options, engine_options, dense):
        n = len(self)
        given = np.asarray(indices)
        if given.size and given.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got {given.dtype} ({indices!r:.80})")
        idx = given.astype(np.int64).reshape(-1)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"sample index out of range for {n} samples")
        idx = idx % max(n, 1)
        name = check_engine_for(self, engine)
        opts = with_source_s3(self, EngineOptions.coerce(options, **engine_options), name)
        self.check_options(opts.resolve(name))
        ctx = cached_context(name, opts)
        batch = self.read_batch_dense(ctx, idx) if dense else self.read_batch(ctx, idx)
        raise_failures(batch, lambda i: self.sample_name(int(idx[i])),
                       paths=isinstance(self, FileList), context=ctx)
        return batch


class FileList(SampleSource):
    """Samples that are whole files: ``paths`` with ``labels`` (default:
    each file's position). Sizes are not known up front: every file is sized
    when it is read."""

    def __init__(self, paths, labels=None):
        # A PathTable (scan(table=True): a directory table and one blob of
        # names) stays as it is: the native reader reads its columns in place.
        self.names = paths if isinstance(paths, PathTable) else [os.fspath(p) for p in paths]
        # {url: (etag, size)} when the paths come from an s3:// listing
        # (fastread.s3.ListedURLs): the node-local cache is checked against it.
        self.versions = getattr(paths, "versions", None)
        if labels is None:
            labels = np.arange(len(self.names))
        self.labels = _int32_labels(labels, len(self.names), f"FileList of {len(self.names)} files")

    @classmethod
    def scan(cls, file_root=None, *, file_filters=None, file_list=None, files=None, labels=None,
             dir_filters=None, case_sensitive_filter=False, s3=None):
        """The files ``fn.readers.file`` would read for these arguments
        (see :func:`fastread.scan`; ``s3``: how to list an s3:// root)."""
        paths, labels = scan(file_root, file_filters=file_filters, file_list=file_list,
                             files=files, labels=labels, dir_filters=dir_filters,
                             case_sensitive_filter=case_sensitive_filter, s3=s3, table=True)
        return cls(paths, labels)

    @property
    def paths(self):
        return self.names

    def __repr__(self):
        return f"{type(self).__name__}({len(self)} files)"

    def open_native(self, engine, options, *, prefetch, workers):
        if self.versions and options.get("cache_dir"):
            from fastread.s3 import drop_stale_entries
            drop_stale_entries(self.versions, options["cache_dir"], options.get("engine_args", ""))
        return _core.NativeReader(self.names, engine, prefetch=prefetch, workers=workers,
                                  **options)

    def read_batch(self, context, indices):
        return context.read([self.names[i] for i in indices])

    def read_batch_dense(self, context, indices):
        return context.read([self.names[i] for i in indices], dense=True)


class FileRanges(SampleSource):
    """Samples that are byte ranges ``[offsets[i], offsets[i] + lengths[i])``
    of one file or block device ``path``, read with range reads (one open
    for all of them; ``O_DIRECT`` when the offsets are aligned). ``names``
    default to the samples' numbers; errors name a sample ``path[name]``."""

    reads_ranges = True

    def __init__(self, path, offsets, lengths, labels=None, names=None, *, checked=False):
        # checked=True: the caller has checked the ranges already, or defers
        # that to the reads on purpose (a packed image's large mapped index,
        # whose columns are not paged in to open it).
        self.path = os.fspath(path)
        what = f"ranges of {self.path!r}"
        self.offsets = _int64_column(offsets, "offsets", what)
        n = len(self.offsets)
        self.lengths = _int64_column(lengths, "lengths", what, n)
        self.sizes_checked = checked
        if n and not checked and self.offsets.min() < 0:
            raise ValueError(f"{what}: offsets must be >= 0 (sample {int(self.offsets.argmin())} "
                             f"starts at {int(self.offsets.min())})")
        if n and not checked and self.lengths.min() < 0:
            raise ValueError(f"{what}: lengths must be >= 0 (sample {int(self.lengths.argmin())} "
                             f"has {int(self.lengths.min())})")
        # A NameTable (a packed image's version 3 index) stays one blob: a
        # list of 10^8 strings is what it is there to avoid.
        self.names = (_Numbers(n) if names is None else names if isinstance(names, NameTable)
                      else [str(s) for s in names])
        if len(self.names) != n:
            raise ValueError(f"{what}: {len(self.names)} names for {n} ranges")
        self.labels = _int32_labels(np.zeros(n) if labels is None else labels, n, what)

    @property
    def sizes(self):
        return self.lengths

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r}, {len(self)} ranges)"

    def sample_name(self, i):
        return f"{self.path}[{self.names[i]}]"

    def check_options(self, options):
        align = options.get("direct_alignment") or 4096
        if options.get("o_direct") and len(self) and (self.offsets % align).any():
            i = int(np.flatnonzero(self.offsets % align)[0])
            raise ValueError(f"O_DIRECT reads of {self.path!r} need offsets that are multiples "
                             f"of direct_alignment {align}; sample {self.sample_name(i)} starts "
                             f"at {int(self.offsets[i])}")

    def open_native(self, engine, options, *, prefetch, workers):
        return _core.NativeReader(None, engine, prefetch=prefetch, workers=workers,
                                  image=self.path, offsets=self.offsets, lengths=self.lengths,
                                  **options)

    def read_batch(self, context, indices):
        return context.read_ranges(self.path, self.offsets[indices], self.lengths[indices])

    def read_batch_dense(self, context, indices):
        return context.read_ranges(self.path, self.offsets[indices], self.lengths[indices],
                                   dense=True)


# -- checks ----------------------------------------------------------------------

def _int64_column(values, what, owner, n=None):
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{owner}: {what} must be integers: {e}") from None
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{owner}: {what} must be a 1-D sequence of integers, got "
                         f"{arr.dtype} of shape {arr.shape}")
    if n is not None and len(arr) != n:
        raise ValueError(f"{owner}: {len(arr)} {what} for {n} samples")
    # A read-only int64 column (a mapped index's) is used in place; a
    # writable one is copied, so the caller changing it later changes nothing here.
    return arr.astype(np.int64, copy=arr.flags.writeable)


def _int32_labels(labels, n, owner):
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"{owner}: {arr.size} labels of shape {arr.shape} for {n} samples "
                         "(one integer label per sample)")
    if arr.size and arr.dtype.kind not in "iuf":
        raise ValueError(f"{owner}: labels must be integers, got {arr.dtype}")
    if arr.size and arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
        raise ValueError(f"{owner}: labels must be integers, got fractional values")
    return arr.astype(np.int32, copy=arr.flags.writeable)   # as _int64_column


class _Numbers:
    """The default names of ranges: their numbers as str, made when asked
    (a list of n strings would be ~60 bytes a sample)."""

    __slots__ = ("_n",)

    def __init__(self, n):
        self._n = n

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [str(j) for j in range(*i.indices(self._n))]
        return str(range(self._n)[i])

    def __iter__(self):
        return (str(j) for j in range(self._n))

    def index(self, value):
        try:
            i = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a sample number") from None
        if str(i) != value or not 0 <= i < self._n:
            raise ValueError(f"{value!r} is not a sample number")
        return i


def check_source(source):
    """Checks that ``source`` keeps the SampleSource contract (one label and
    at most one size per sample, sizes >= 0); returns its labels as int32.
    Raises TypeError for an object that is not a source, ValueError naming
    the source otherwise."""
    if not isinstance(source, SampleSource):
        raise TypeError(f"source must be a fastread.SampleSource (a FileList, a PackedImage, "
                        f"FileRanges or a subclass of your own), got {type(source).__name__}")
    try:
        n = len(source.names)
    except (AttributeError, TypeError) as e:
        raise ValueError(f"source {source!r} has no sequence of sample names: {e}") from None
    labels = _int32_labels(source.labels, n, f"source {source!r}")
    sizes = source.sizes
    # An unsigned column of the right shape has nothing to check (no size
    # is negative) and is not read: a memory-mapped index of 10^8 samples
    # (WebDataset's .fridx) is not paged in to be checked.
    unsigned = (isinstance(sizes, np.ndarray) and sizes.dtype.kind == "u"
                and sizes.shape == (n,))
    # A source that checked its ranges (or defers that to the reads on
    # purpose: FileRanges(checked=True), a packed image's mapped index) is
    # not scanned again either.
    if getattr(source, "sizes_checked", False):
        unsigned = True
    if sizes is not None and not unsigned:
        sizes = _int64_column(sizes, "sizes", f"source {source!r}", n)
        if n and sizes.min() < 0:
            i = int(sizes.argmin())
            raise ValueError(f"source {source!r}: sample {source.sample_name(i)} has size "
                             f"{int(sizes[i])} (sizes must be >= 0)")
    return labels


def _engine_for(source, engine):
    """``engine``, or 's3' for 'auto' over a list of s3:// URLs or ranges of
    an s3:// object (:func:`fastread.engine.for_paths`)."""
    own = getattr(source, "native_engine", None)
    if own is not None:
        # A source that only one engine reads (CassandraSource: 'cql'):
        # that engine for 'auto' or the default; a named one is checked.
        return own if engine in ("auto", None) else engine
    if isinstance(source, FileList) and source.names:
        return for_paths(engine, source.names[0])
    if source.reads_ranges:
        # One file's ranges (a packed image), or several files' (shards).
        files = getattr(source, "files", None)
        path = files[0].path if files else getattr(source, "path", None)
        if isinstance(path, str):
            return for_paths(engine, path)
    return engine


def with_source_s3(source, options, engine):
    """``options`` (an EngineOptions) with the S3 options the source was
    opened with (a PackedImage of an s3:// object keeps those that reached
    its index), unless the caller gave some or the engine is no URL engine:
    the samples are then read from the bucket the index came from."""
    s3 = getattr(source, "s3", None)
    if s3 is None or options.s3 is not None or str(engine) not in URL_ENGINES:
        return options
    return options.replace(s3=s3)


def check_engine_for(source, engine):
    """The engine to open (:func:`fastread.engine.check_engine`: 'auto' as
    it is, for the core to resolve, except over s3:// URLs: 's3'); ValueError
    if it cannot read this source (a range-only engine on files)."""
    name = check_engine(_engine_for(source, engine))
    if name in RANGE_ONLY and not source.reads_ranges:
        raise ValueError(f"engine {name!r} reads ranges of one image or device only; "
                         f"give image= (or a FileRanges source) or choose a file engine "
                         f"(e.g. 'auto')")
    return name


class HostBatch:
    """The part of :class:`fastread.Batch` that :class:`fastread.Reader`
    uses, for batches assembled in Python (a batch of several files' parts,
    one gathered from memory): ``len``, ``indices()``, ``released``, and
    ``device_arrays()`` refusing, since their samples stay in host memory.
    Subclasses add ``failures``, ``lengths``, ``arrays``, ``nbytes`` and
    ``release``, and name their samples in ``_samples``."""

    _samples = "these samples"

    def __init__(self, indices):
        self._indices = indices
        self.released = False

    def __len__(self):
        return len(self._indices)

    def indices(self):
        return self._indices.copy()

    def device_arrays(self, device_id=0):
        raise ValueError(f"{self._samples} are delivered in host memory only")


class ArraysBatch(HostBatch):
    """A host batch of NumPy arrays already in memory (views of whole shards,
    of decoded row groups, ...), with the per-sample failures found making
    it; ``release`` drops the arrays (and ``keep``, what they are views of)."""

    def __init__(self, indices, arrays, failures, keep=()):
        super().__init__(indices)
        self._arrays = arrays
        self._failures = failures
        self._keep = keep

    def failures(self):
        return list(self._failures)

    def lengths(self):
        return np.array([a.size for a in self._arrays], np.int64)

    def arrays(self):
        return self._arrays

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self._arrays)

    def release(self):
        self._arrays = []
        self._keep = ()
        self.released = True


class OpenedReader(NamedTuple):
    """What :func:`open_native_reader` opened, and the settings it chose."""
    engine: str                 # the engine it reads with ("auto" resolved by the core)
    options: dict               # the resolved engine options
    native: "_core.NativeReader"
    workers: int                # reader threads


def open_native_reader(source, engine, options, *, prefetch=None, workers=None, in_order=None):
    """Opens ``source``'s native read-ahead reader: ``engine`` checked
    against the source ('auto' is the core's to resolve, except over s3://
    samples: 's3'), ``options`` (an EngineOptions) resolved for it,
    ``prefetch`` and ``workers`` defaulted from :mod:`fastread._defaults`.
    ``in_order``: whether the reader will go through the samples in order
    (told to a source that reads differently then: WebDataset shards in S3
    streamed whole). Returns an :class:`OpenedReader`, whose ``engine`` is
    what the reader reads with."""
    if in_order is not None and hasattr(source, "reading_in_order"):
        source.reading_in_order(bool(in_order))
    engine = _engine_for(source, engine)
    name = check_engine_for(source, engine)
    prefetch = _defaults.get("prefetch") if prefetch is None else prefetch
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 1 <= prefetch <= 4096:
        raise ValueError(f"prefetch must be an integer in 1..4096 (batches read ahead), "
                         f"got {prefetch!r}")
    if workers is None and _defaults.get("workers") == 0:
        # A source whose reads mostly wait on the network (CassandraSource)
        # says how many batches to keep in flight to cover round trips.
        workers = getattr(source, "default_workers", None)
    workers = _defaults.reader_workers(workers)

    resolved = with_source_s3(source, options, name).resolve(name)
    source.check_options(resolved)
    _, native = open_engine(name, lambda n: source.open_native(n, resolved, prefetch=prefetch,
                                                               workers=workers))
    if native.size != len(source):
        native.close()
        raise ValueError(f"source {source!r} opened a native reader over {native.size} samples "
                         f"but names {len(source)}")
    return OpenedReader(native.engine, resolved, native, workers)


def read_in_order(source, batch_size, engine="auto", *, prefetch=None, workers=None,
                  options=None, **engine_options):
    """Every sample of ``source`` once, in order: yields ``(arrays, labels)``
    per batch of ``batch_size`` (the last may be smaller), read ahead on
    native threads. Arrays stay valid while referenced. Raises
    :class:`fastread.ReadError` naming the first failed sample of a batch."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    labels = check_source(source)
    opts = EngineOptions.coerce(options, **engine_options)
    native = open_native_reader(source, engine, opts, prefetch=prefetch, workers=workers).native
    try:
        n = len(source)
        for start in range(0, n, batch_size):
            native.submit(np.arange(start, min(n, start + batch_size), dtype=np.int64))
        while True:
            batch = native.next()
            if batch is None:
                return
            idx = batch.indices()
            raise_failures(batch, lambda i: source.sample_name(int(idx[i])),
                           paths=isinstance(source, FileList))
            yield batch.arrays(), labels[idx]
    finally:
        native.close()
