"""Any source of fixed-size records, read once and held in memory: a
sample source over a cached copy of another.

Small record sets (CIFAR-10's train set is 150 MB) are cheaper to hold in
memory than to read per batch: on a 2-core machine a batch of 64 CIFAR
images read as byte ranges costs about 8-12 us of CPU per image (a native
read per file the batch touches, thread wake-ups, one array per sample,
the HWC interleave), a gather from memory about 1 us; next to DALI's
augmentation (about 37 us per image there) that difference decides
whether a pipeline keeps up with one fed from NumPy arrays in memory.

:class:`InMemory` reads every sample of a source once, with the native
engine, into one array (optionally converted, e.g. to HWC images, once),
and then serves batches as one gathered array each: ``data[indices]``, no
I/O and no per-sample objects. It is a :class:`fastread.SampleSource`, so
:class:`fastread.Reader` gives it the same epochs, shards, shuffles and
resume as any other source. Batches are arrays of shape ``(n,) +
sample_shape`` (a sequence of ``n`` samples), fresh for every batch unless
the Reader has a ``ring_depth``: then a batch's array is gathered into the
memory of a batch the Reader released (as the native readers reuse their
arenas), so that no batch allocates. A fresh 200 KB array per batch (64
CIFAR images) costs more than the gather itself: the allocator hands such
blocks back to the kernel when they are freed, and every batch then
page-faults its memory in again (measured: 5% of a DALI pipeline's CPU
time on 2 cores, in the kernel zeroing pages).

Thread safety: as :class:`fastread.Reader`'s native readers, a source's
native half is used by one thread at a time (the Reader holds its lock
around every call, ``release()`` included).
"""
import collections

import numpy as np

from fastread.source import HostBatch, SampleSource, check_source, read_in_order

__all__ = ["InMemory"]


class _GatheredBatch(HostBatch):
    """One batch gathered from memory, with what :class:`fastread.Reader`
    uses of a native Batch. ``release()`` hands its array back to
    ``recycle`` (the native half's free buffers), to be gathered into
    again."""

    _samples = "samples held in memory"

    def __init__(self, indices, data, recycle=None):
        super().__init__(indices)
        self._data = data
        self._recycle = recycle

    def failures(self):
        return []

    def lengths(self):
        return np.full(len(self._indices), self._data[0].nbytes if len(self._data) else 0,
                       np.int64)

    def arrays(self):
        return self._data

    @property
    def nbytes(self):
        return self._data.nbytes

    def release(self):
        if not self.released and self._recycle is not None:
            self._recycle(self._data)
        self.released = True


class _MemoryNative:
    """The NativeReader calls Reader makes, served from memory: submit()
    queues a batch's indices, next() gathers it (no read ahead is needed)
    into a buffer of a released batch of the same size if there is one
    (at most ``max_free`` are kept), else into a new array."""

    engine = "memory"

    def __init__(self, data, max_free=8):
        self._data = data
        # The samples as rows of bytes: np.take along axis 0 of a 2-D view
        # is NumPy's plainest row copy (any sample shape and dtype).
        self._rows = (data.reshape(len(data), -1).view(np.uint8)
                      if data.size and data.flags.c_contiguous else None)
        self._queue = collections.deque()
        self._free = []
        self._max_free = max_free
        self._allocated = 0
        self.size = len(data)
        self.taken = 0

    def submit(self, indices):
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"sample index out of range 0..{self.size - 1}")
        self._queue.append(idx)

    def next(self):
        if not self._queue:
            return None
        idx = self._queue.popleft()
        self.taken += 1
        if self._rows is None or not len(idx):
            return _GatheredBatch(idx, self._data[idx])
        out = self._buffer(len(idx))
        # mode="clip": indices were checked in submit(); NumPy buffers `out`
        # in the default mode "raise".
        self._rows.take(idx, axis=0, out=out.reshape(len(idx), -1).view(np.uint8), mode="clip")
        return _GatheredBatch(idx, out, self._recycle)

    def _buffer(self, n):
        for i, buf in enumerate(self._free):
            if len(buf) == n:
                return self._free.pop(i)
        self._allocated += 1
        return np.empty((n,) + self._data.shape[1:], self._data.dtype)

    def _recycle(self, buf):
        if len(self._free) < self._max_free:
            self._free.append(buf)

    def reset(self):
        self._queue.clear()

    def close(self):
        self._queue.clear()
        self._free.clear()

    @property
    def pending(self):
        return len(self._queue)

    def pool_batches(self):
        """Batch buffers allocated so far (as the native pools count)."""
        return self._allocated

    def pool_idle_bytes(self):
        return sum(b.nbytes for b in self._free)

    def pool_idle_device_bytes(self):
        return 0


class InMemory(SampleSource):
    """The samples of ``source`` (all of one size) read once into memory.

    ``convert(records)`` (optional) turns the ``(n, size)`` uint8 array of
    every sample into the array batches are gathered from (its first axis
    one sample each), e.g. :func:`fastread.formats.to_hwc`. Loading reads
    ``load_batch`` samples per native call with ``engine`` and the engine
    options; a sample that cannot be read raises :class:`fastread.ReadError`
    naming it. ``names``, ``labels`` and ``sample_name`` are the source's.
    Host delivery only.
    """

    def __init__(self, source, convert=None, *, engine="auto", load_batch=4096, options=None,
                 **engine_options):
        self.labels = check_source(source)
        self.source = source
        self.names = source.names
        n = len(source)
        sizes = source.sizes
        if sizes is None or (n and (sizes != sizes[0]).any()):
            raise ValueError(f"{source!r}: InMemory holds fixed-size records only "
                             "(every sample's size known and equal)")
        size = int(sizes[0]) if n else 0
        records = np.empty((n, size), np.uint8)
        pos = 0
        for arrays, _labels in read_in_order(source, load_batch, engine, options=options,
                                             **engine_options):
            k = len(arrays)
            if k:
                np.concatenate(arrays, out=records[pos:pos + k].reshape(-1))
            pos += k
        if pos != n:
            raise RuntimeError(f"{source!r}: {pos} samples read of {n}")
        self.data = convert(records) if convert is not None else records
        if len(self.data) != n:
            raise ValueError(f"convert returned {len(self.data)} samples for {n}")
        self._sizes = np.full(n, self.data[0].nbytes if n else 0, np.int64)

    @property
    def sizes(self):
        return self._sizes

    def __repr__(self):
        return f"InMemory({self.source!r}, {self.data.nbytes} bytes)"

    def sample_name(self, i):
        return self.source.sample_name(i)

    def check_options(self, options):
        if options.get("device_output"):
            raise ValueError(f"{self!r}: samples held in memory are delivered in host memory "
                             "only (device='cpu'); copy batches to the GPU after the reader")

    def open_native(self, engine, options, *, prefetch, workers):
        return _MemoryNative(self.data)

    def read_batch(self, context, indices):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return _GatheredBatch(idx, self.data[idx])
