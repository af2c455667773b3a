"""Byte ranges of several files as one sample source.

Record formats keep their samples in many large files (CIFAR-10's six batch
files, WebDataset and Squirrel shards): every sample is a byte range of one
of them. :class:`MultiFileRanges` reads them all through ONE native reader
over a table (``fr_reader_open_table``): the columns file id (u32), offset
and length (u64) are handed to the C core as they are (borrowed, not
copied), a batch is one native submission whatever files it touches, and
the reader's workers read its ranges with the GIL released, each through an
LRU of at most its share of ``max_open_files`` descriptors. Threads: the
workers and their engine's helpers; descriptors: ``max_open_files``; both
whatever the number of shards (10,000 shards read under ``ulimit -n 256``).
"""
import collections.abc
import os

import numpy as np

from fastread import _core
from fastread._defaults import max_open_files as _max_open_files
from fastread.source import FileRanges, HostBatch, SampleSource

__all__ = ["MultiFileRanges", "MultiBatch"]


class MultiBatch(HostBatch):
    """A batch read from several files, in the order the batch was submitted;
    the part of each file is a :class:`fastread.Batch` kept alive by the
    arrays made from it. Offers what :class:`fastread.Reader` uses of a
    Batch (``indices``, ``failures``, ``arrays``, ``lengths``, ``release``)."""

    _samples = "samples of several files"

    def __init__(self, parts, positions, indices):
        super().__init__(indices)      # the submitted global indices
        self._parts = parts            # [Batch]
        self._positions = positions    # [int64 array]: where part j's samples go

    def failures(self):
        out = []
        for part, pos in zip(self._parts, self._positions):
            out.extend((int(pos[i]), err) for i, err in part.failures())
        return sorted(out)

    def lengths(self):
        out = np.empty(len(self._indices), np.int64)
        for part, pos in zip(self._parts, self._positions):
            out[pos] = part.lengths()
        return out

    def arrays(self):
        out = [None] * len(self._indices)
        for part, pos in zip(self._parts, self._positions):
            for p, a in zip(pos.tolist(), part.arrays()):
                out[p] = a
        return out

    @property
    def nbytes(self):
        return sum(p.nbytes for p in self._parts)

    def release(self):
        for p in self._parts:
            p.release()
        self.released = True


class MultiFileRanges(SampleSource):
    """Samples that are byte ranges of several files: ``files`` (each a
    :class:`fastread.FileRanges`), numbered file after file. ``names`` are
    ``<path>[<name in the file>]``; labels are the files' labels.

    Read with one native reader for every file (see the module's
    documentation). ``max_open_files`` (None: FASTREAD_MAX_OPEN_FILES, else
    min(256, RLIMIT_NOFILE / 4), for engine="io_uring" every file, each
    worker's, where they are at most RLIMIT_NOFILE / 2; see
    :func:`fastread._defaults.max_open_files`) bounds the descriptors it keeps open; set it on the source or pass
    ``Reader(..., max_open_files=)``. Host delivery only: ``device="gpu"``
    readers need the single-file :class:`fastread.FileRanges`.
    """

    reads_ranges = True
    max_open_files = None
    _table = None  # (file ids u32, offsets u64, lengths u64), made on first open

    def __init__(self, files):
        files = list(files)
        for f in files:
            if not isinstance(f, FileRanges):
                raise TypeError(f"MultiFileRanges takes FileRanges, got {type(f).__name__}")
        self._set_files(files)

    @classmethod
    def from_columns(cls, paths, file_ids, offsets, lengths, *, labels=None, names=None,
                     file_names=None):
        """Samples given as columns, one entry per sample: sample ``i`` is
        bytes ``[offsets[i], offsets[i] + lengths[i])`` of file
        ``paths[file_ids[i]]``. ``labels`` (default: the samples' numbers),
        ``names`` (a sequence of each sample's name in its file; default its
        number there) and ``file_names`` (how errors name each file; default
        ``paths``). The columns a native indexer builds (WebDataset,
        Squirrel) go in as they are; subclasses call :meth:`_set_columns`."""
        self = cls.__new__(cls)
        self._set_columns(paths, file_ids, offsets, lengths, labels=labels, names=names,
                          file_names=file_names)
        return self

    def _set_columns(self, paths, file_ids, offsets, lengths, *, labels=None, names=None,
                     file_names=None):
        """:meth:`from_columns`'s work, for subclasses' ``__init__``."""
        paths = [os.fspath(p) for p in paths]
        file_names = paths if file_names is None else [str(s) for s in file_names]
        if len(file_names) != len(paths):
            raise ValueError(f"{len(file_names)} file names for {len(paths)} files")
        file_ids = np.asarray(file_ids)
        n = len(file_ids)
        if file_ids.ndim != 1 or (n and file_ids.dtype.kind not in "iu"):
            raise ValueError(f"file_ids must be a 1-D integer array, got {file_ids.dtype} of "
                             f"shape {file_ids.shape}")
        if n and (file_ids.min() < 0 or file_ids.max() >= len(paths)):
            raise ValueError(f"file_ids must be in 0..{len(paths) - 1} (one per path)")
        offsets, lengths = np.asarray(offsets), np.asarray(lengths)
        if offsets.shape != (n,) or lengths.shape != (n,):
            raise ValueError(f"offsets {offsets.shape} and lengths {lengths.shape} must have "
                             f"one entry per sample ({n})")
        if names is not None and len(names) != n:
            raise ValueError(f"{len(names)} names for {n} samples")
        # Samples numbered file after file (what every format builds): each
        # file's samples are one slice of the columns.
        if n and (np.diff(file_ids.astype(np.int64)) < 0).any():
            raise ValueError("file_ids must not decrease (samples numbered file after file)")
        bounds = np.searchsorted(file_ids, np.arange(len(paths) + 1), side="left")
        # The native table: the columns as given where their types fit (a
        # memory-mapped index is read in place), converted once otherwise.
        table = (np.ascontiguousarray(file_ids, dtype=np.uint32),
                 np.ascontiguousarray(offsets, dtype=np.uint64),
                 np.ascontiguousarray(lengths, dtype=np.uint64))
        files = []
        for f, (path, shown) in enumerate(zip(paths, file_names)):
            a, b = int(bounds[f]), int(bounds[f + 1])
            part = _NamedRanges(path, offsets[a:b], lengths[a:b],
                                names=None if names is None else list(names[a:b]))
            part.shown = shown
            files.append(part)
        self._set_files(files)
        self._table = table
        self.labels = (np.arange(n, dtype=np.int32) if labels is None
                       else np.asarray(labels, dtype=np.int32))
        if self.labels.shape != (n,):
            raise ValueError(f"{self.labels.shape} labels for {n} samples")

    def _set_files(self, files):
        self.files = files
        self._table = None
        counts = np.array([len(f) for f in self.files], np.int64)
        self.starts = np.r_[0, np.cumsum(counts)].astype(np.int64)
        n = int(self.starts[-1])
        self.file_index = np.repeat(np.arange(len(self.files), dtype=np.int64), counts)
        self.local_index = np.arange(n, dtype=np.int64) - self.starts[self.file_index]
        self.names = _Names(self.files, self.starts)
        self.labels = (np.concatenate([f.labels for f in self.files]) if self.files
                       else np.zeros(0, np.int32))
        self._sizes = (np.concatenate([f.lengths for f in self.files]) if self.files
                       else np.zeros(0, np.int64))

    @property
    def sizes(self):
        return self._sizes

    def __repr__(self):
        return f"{type(self).__name__}({len(self.files)} files, {len(self)} ranges)"

    def locate(self, i):
        """(file number, sample number inside that file) of sample ``i``."""
        return int(self.file_index[i]), int(self.local_index[i])

    def sample_name(self, i):
        f, j = self.locate(i)
        return self.files[f].sample_name(j)

    def check_options(self, options):
        if options.get("device_output"):
            raise ValueError(f"{self!r}: samples of several files are delivered in host memory "
                             "only (device='cpu'); copy batches to the GPU after the reader")
        for f in self.files:
            f.check_options(options)

    def native_table(self):
        """The columns the native reader reads: (file ids as uint32, offsets
        and lengths as uint64), one entry a sample."""
        if self._table is None:
            if len(self.files) > 1 << 32:
                raise ValueError(f"{self!r}: at most 2**32 files")
            self._table = (self.file_index.astype(np.uint32),
                           np.concatenate([f.offsets for f in self.files]).astype(np.uint64),
                           self._sizes.astype(np.uint64))
        return self._table

    def open_native(self, engine, options, *, prefetch, workers):
        if not self.files:
            raise ValueError(f"{self!r} has no files to read")
        file_ids, offsets, lengths = self.native_table()
        return _core.NativeReader([f.path for f in self.files], engine, prefetch=prefetch,
                                  workers=workers, file_ids=file_ids, offsets=offsets,
                                  lengths=lengths,
                                  max_open_files=_max_open_files(self.max_open_files, engine,
                                                                 len(self.files), workers),
                                  **options)

    def read_batch(self, context, indices):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        files = self.file_index[idx]
        parts, positions = [], []
        for f in np.unique(files).tolist():
            pos = np.flatnonzero(files == f)
            parts.append(self.files[f].read_batch(context, self.local_index[idx[pos]]))
            positions.append(pos)
        return MultiBatch(parts, positions, idx)


class _NamedRanges(FileRanges):
    """One file's ranges of :meth:`MultiFileRanges.from_columns`: errors
    name the file as ``shown`` (the shard as the user gave it)."""

    shown = None

    def sample_name(self, i):
        return f"{self.shown if self.shown is not None else self.path}[{self.names[i]}]"


class _Names(collections.abc.Sequence):
    """``names`` of a MultiFileRanges without one string per sample up front."""

    def __init__(self, files, starts):
        self._files, self._starts = files, starts

    def __len__(self):
        return int(self._starts[-1])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        f = int(np.searchsorted(self._starts, i, side="right") - 1)
        return self._files[f].sample_name(i - int(self._starts[f]))

