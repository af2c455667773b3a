"""Byte ranges of several files as one sample source.

Record formats keep their samples in a few large files (CIFAR-10's six batch
files, tar shards): every sample is a byte range of one of them. The native
range reader (``fr_reader_open_ranges``) reads ranges of one file, so
:class:`MultiFileRanges` opens one native reader per file and splits each
submitted batch by file: a batch costs one native submission per file it
touches (not per sample), every file's ranges are read with many I/Os in
flight and the GIL released, and the parts are put back together in the
order the batch asked for. No Python runs per sample except the final list
of views.
"""
import collections
import collections.abc
import os

import numpy as np

from fastread._defaults import reader_workers
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


class _MultiNative:
    """One NativeReader per file behind the NativeReader calls Reader makes
    (submit, next, reset, close, size, taken, pool_*).

    A batch is one native batch from each file it touches, taken in turn.
    Each part is known by its number in its file's reader (``seq``: that
    reader's ``taken`` once the part is handed out), so a part never goes to
    the wrong batch whatever was interrupted or failed before: parts of
    batches that failed or were dropped are skipped by number.

    KeyboardInterrupt (any exception a signal handler raises) loses nothing:
    while waiting for a part, or as a part arrives, the part stays queued in
    its file's reader (NativeReader.next keeps it); a part taken goes into
    the batch's own list in the same native call (NativeReader.next_into),
    and the batch leaves the queue in one step (``taken`` is counted by that
    same step). The next call finishes the batch and returns it whole. A
    part that fails (its native reader used it up) fails the whole batch:
    the call raises, ``taken`` counts the batch, and its parts still queued
    in the other files' readers are skipped when their turn comes.
    """

    def __init__(self, source, natives):
        self._file_of = source.file_index
        self._local = source.local_index
        self._natives = natives
        # Batches submitted and not yet returned, oldest first:
        # (indices, [(file, positions, seq)], [parts taken so far]).
        self._queue = collections.deque()
        # Per file: the seq (1-based number) of the last part submitted to it.
        self._seq = [n.taken for n in natives]
        self._submitted = 0   # batches queued here, ever (less those reset)
        self.size = len(source)
        self.engine = natives[0].engine if natives else None
        self.auto_fallback = natives[0].auto_fallback if natives else 0

    @property
    def taken(self):
        """Batches handed out or failed (as NativeReader.taken): the Reader
        tells a batch that failed from a wait a signal interrupted by it.
        Counted by the queue itself, so it changes in the one step that
        removes a batch."""
        return self._submitted - len(self._queue)

    def submit(self, indices):
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"sample index out of range 0..{self.size - 1}")
        files = self._file_of[idx]
        # Stable sort: within a file the batch's own order is kept.
        order = np.argsort(files, kind="stable")
        sorted_files = files[order]
        starts = np.flatnonzero(np.r_[True, sorted_files[1:] != sorted_files[:-1]]) \
            if len(idx) else np.empty(0, np.int64)
        bounds = np.r_[starts, len(idx)]
        plan = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            f = int(sorted_files[a])
            pos = order[a:b]
            self._natives[f].submit(self._local[idx[pos]])
            # Queued in that file's reader: its number there is taken, even
            # if a later file's submit fails (the part is then skipped).
            self._seq[f] += 1
            plan.append((f, pos, self._seq[f]))
        self._queue.append((idx, plan, []))
        self._submitted += 1

    def _skip_to(self, native, seq):
        """Takes and releases the parts queued in ``native`` before part
        ``seq`` (parts of batches that failed or were dropped). A signal
        while waiting leaves the rest for the next call."""
        while native.taken < seq - 1:
            before = native.taken
            try:
                part = native.next()
            except BaseException:
                if native.taken == before:  # interrupted: that part is still queued
                    raise
                continue                    # it failed: used up all the same
            if part is None:
                raise RuntimeError("a file's native reader has no part queued (reset outside "
                                   "this reader?)")
            part.release()

    def next(self):
        out = []
        return out[0] if self.next_into(out) else None

    def next_into(self, out):
        """next(), appending the batch to ``out``: True, or False when
        nothing is queued. The batch leaves the queue by a statement that
        Python checks no signal at, and goes into ``out`` by the one call
        after it (a KeyboardInterrupt at that call finds it in ``out``)."""
        if not self._queue:
            return False
        idx, plan, parts = self._queue[0]
        while len(parts) < len(plan):
            f, _pos, seq = plan[len(parts)]
            native = self._natives[f]
            self._skip_to(native, seq)
            before, had = native.taken, len(parts)
            try:
                got = native.next_into(parts)
            except BaseException:
                # The part is in `parts` from the native call that took it:
                # a KeyboardInterrupt raised as that call returned (Python
                # runs handlers after a call) finds it there, taken counted,
                # and the batch goes on next call. Taken and not in `parts`:
                # used up by a failed read, so the batch fails; its other
                # files' parts are skipped later. (Judging by `taken` alone
                # dropped a batch under a SIGINT storm: the caller then
                # waited forever for it.)
                if len(parts) == had and native.taken != before:
                    self._queue.popleft()
                    for p in parts:
                        p.release()
                raise                       # else interrupted: kept for the next call
            if not got:  # the file's reader lost its queue: ours no longer matches
                self._queue.popleft()
                raise RuntimeError(f"the native reader of file {f} has no batch queued "
                                   "(reset outside this reader?)")
        batch = MultiBatch(parts, [pos for _f, pos, _seq in plan], idx)
        del self._queue[0]
        out.append(batch)
        return True

    def _clear(self):
        for _idx, _plan, parts in self._queue:
            for p in parts:
                p.release()
        self._submitted -= len(self._queue)
        self._queue.clear()
        self._seq = [n.taken for n in self._natives]

    def reset(self):
        for n in self._natives:
            n.reset()
        self._clear()

    def close(self):
        for n in self._natives:
            n.close()
        self._queue.clear()

    @property
    def pending(self):
        return len(self._queue)

    def pool_batches(self):
        return sum(n.pool_batches() for n in self._natives)

    def pool_idle_bytes(self):
        return sum(n.pool_idle_bytes() for n in self._natives)

    def pool_idle_device_bytes(self):
        return sum(n.pool_idle_device_bytes() for n in self._natives)


class MultiFileRanges(SampleSource):
    """Samples that are byte ranges of several files: ``files`` (each a
    :class:`fastread.FileRanges`), numbered file after file. ``names`` are
    ``<path>[<name in the file>]``; labels are the files' labels.

    Read with one native range reader per file (see the module's
    documentation); ``workers`` and the engine's ``threads`` are shared out
    among the files (at least one each). Host delivery only: ``device="gpu"`` readers need the
    single-file :class:`fastread.FileRanges`.
    """

    reads_ranges = True

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
        files = []
        for f, (path, shown) in enumerate(zip(paths, file_names)):
            a, b = int(bounds[f]), int(bounds[f + 1])
            part = _NamedRanges(path, offsets[a:b], lengths[a:b],
                                names=None if names is None else list(names[a:b]))
            part.shown = shown
            files.append(part)
        self._set_files(files)
        self.labels = (np.arange(n, dtype=np.int32) if labels is None
                       else np.asarray(labels, dtype=np.int32))
        if self.labels.shape != (n,):
            raise ValueError(f"{self.labels.shape} labels for {n} samples")

    def _set_files(self, files):
        self.files = files
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

    def open_native(self, engine, options, *, prefetch, workers):
        if not self.files:
            raise ValueError(f"{self!r} has no files to read")
        per_file = max(1, reader_workers(workers) // len(self.files))
        # Each file's reader reads its share of a batch: the engine's threads
        # (io_uring rings, psync threads) are shared out too, or ten shards
        # would wake forty ring threads for a batch of 64 small samples.
        threads = options.get("threads")
        if threads:
            options = dict(options, threads=max(1, threads // len(self.files)))
        natives = []
        try:
            for f in self.files:
                natives.append(f.open_native(engine, options, prefetch=prefetch,
                                             workers=per_file))
        except BaseException:
            for n in natives:
                n.close()
            raise
        return _MultiNative(self, natives)

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

