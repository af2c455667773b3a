"""WebDataset's s3:// shards read whole, in order (``s3_read="whole"``):
a pipeline of whole-shard GETs cut into batches (see
:data:`fastread.formats.webdataset.S3_READ_RULE`). Split from
``webdataset.py``, which opens it for a reader going through the shards
in order."""
import collections
import threading

import numpy as np

from fastread import _core
from fastread.source import ArraysBatch


class _ShardBatch(ArraysBatch):
    """A batch cut from whole shards held in memory: each sample a view of
    its shard's bytes (the shard arrays stay alive while a view does)."""

    _samples = "samples of whole shards"


class _WholeShards:
    """The NativeReader calls Reader makes, served by streaming whole
    shards: a thread takes the submitted batches in order, reads the
    shards each needs that it does not hold (one native call for all of
    them: the s3 engine fetches each in ``part_size`` ranged GETs in
    parallel, the GIL released) and cuts the samples out as views. It
    holds the shards of the batch being cut plus ``keep`` more, so reading
    in shard order fetches every shard once per epoch. It cuts at most
    ``prefetch`` batches ahead of the one next() hands out: Reader submits
    a whole epoch at once, and a cut batch pins its shards, so without the
    bound it would hold every shard of the epoch in memory (a DALI
    pipeline between epochs read the next one whole while idle). A call
    that fetches shards also fetches the next ``AHEAD_SHARDS`` shards queued
    batches will need (looking ``AHEAD_SCAN`` batches ahead), so reading in
    shard order stalls at one shard boundary in AHEAD_SHARDS + 1, with that
    many times the requests in flight (held: AHEAD_SHARDS shards more). Two:
    one (two shards a call) reached 88% of the server's ceiling at 25 ms on
    the 2-core VM, short of issue 30's 90%."""

    AHEAD_SCAN = 64
    AHEAD_SHARDS = 2

    def __init__(self, source, engine, options, prefetch, keep=2):
        from fastread import _core

        self.engine = str(engine)
        self.size = len(source)
        self.taken = 0
        self._source = source
        self._ctx = _core.Context(self.engine, **options)
        self._keep = keep
        self._prefetch = max(1, int(prefetch))
        self._shards = collections.OrderedDict()   # shard number -> uint8 array (LRU)
        self._cv = threading.Condition()
        self._todo = collections.deque()            # (generation, indices)
        self._done = {}                             # position -> batch or exception
        self._gen = 0
        self._submitted = self._next = 0            # positions, for delivery in order
        self._closed = False
        self._stats = {}                            # the context's counters, last read
        self._thread = threading.Thread(target=self._run, name="fastread-wds-whole",
                                        daemon=True)
        self._thread.start()

    def submit(self, indices):
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"sample index out of range 0..{self.size - 1}")
        with self._cv:
            self._todo.append((self._gen, self._submitted, idx))
            self._submitted += 1
            self._cv.notify_all()

    def _run(self):
        while True:
            with self._cv:
                while not self._closed and (not self._todo or
                                            self._todo[0][1] - self._next >= self._prefetch):
                    self._cv.wait()
                if self._closed:
                    return
                gen, pos, idx = self._todo.popleft()
                ahead = self._upcoming_shards(idx)
            try:
                out = self._cut(idx, ahead)
            except BaseException as e:  # handed to next(), raised there
                out = e
            with self._cv:
                if gen == self._gen:
                    self._done[pos] = out
                    self._cv.notify_all()

    def _upcoming_shards(self, idx):
        """The first AHEAD_SHARDS shards that batches queued after ``idx``
        need and ``idx`` does not (within AHEAD_SCAN batches), in order.
        Called with the lock held."""
        src = self._source
        now = set(src.file_index[idx].tolist())
        out = []
        for k, (gen, _pos, later) in enumerate(self._todo):
            if k >= self.AHEAD_SCAN or gen != self._gen or len(out) >= self.AHEAD_SHARDS:
                break
            for f in src.file_index[later].tolist():
                if f not in now and f not in out:
                    out.append(f)
                    if len(out) >= self.AHEAD_SHARDS:
                        break
        return out

    def _cut(self, idx, ahead=()):
        src = self._source
        files = src.file_index[idx]
        need = list(dict.fromkeys(files.tolist()))
        missing = [f for f in need if f not in self._shards]
        failed = {}
        if missing:
            fetch = missing + [f for f in ahead if f not in self._shards and f not in missing]
            batch = self._ctx.read([src.files[f].path for f in fetch])
            # Taken here, by the one thread that reads with the context, for
            # stats() (Reader.stats()) to hand out without touching it.
            self._stats = self._ctx.stats()
            errs = dict(batch.failures())
            for i, (f, a) in enumerate(zip(fetch, batch.arrays())):
                if i not in errs:
                    self._shards[f] = a
                elif i < len(missing):   # a read-ahead shard that failed is fetched again when needed
                    failed[f] = (errs[i], self._ctx.sample_error(i))
        for f in need:
            if f in self._shards:
                self._shards.move_to_end(f)
        # The read-ahead shards are newer than the ones left behind: LRU keeps them.
        while len(self._shards) > len(need) + self._keep + self.AHEAD_SHARDS:
            self._shards.popitem(last=False)
        arrays, failures = [], []
        local = src.local_index[idx]
        for i, (f, j) in enumerate(zip(files.tolist(), local.tolist())):
            shard = src.files[f]
            if f in failed:
                failures.append((i, failed[f][0]))
                arrays.append(np.zeros(0, np.uint8))
                continue
            start = int(shard.offsets[j])
            end = start + int(shard.lengths[j])
            data = self._shards[f]
            if end > data.size:   # the object shrank since it was indexed
                failures.append((i, 61))   # ENODATA, as a ranged read past the end
                arrays.append(np.zeros(0, np.uint8))
                continue
            arrays.append(data[start:end])
        return _ShardBatch(idx, arrays, failures)

    def next(self):
        with self._cv:
            if self._next >= self._submitted:
                return None
            while self._next not in self._done:
                self._cv.wait(0.1)
            out = self._done.pop(self._next)
            self._next += 1
            self.taken += 1
            self._cv.notify_all()   # room for the thread to cut one more
        if isinstance(out, BaseException):
            raise out
        return out

    def stats(self):
        """The context's counters (``s3_requests``, ``s3_bytes``, ...) as of
        its last read, as NativeReader.stats() gives a Reader's."""
        return dict(self._stats)

    def reset(self):
        with self._cv:
            self._gen += 1
            self._todo.clear()
            self._done.clear()
            self._next = self._submitted
            self._cv.notify_all()

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        self._shards.clear()
        self._ctx.close()

    @property
    def pending(self):
        return self._submitted - self._next

    def pool_batches(self):
        return 0

    def pool_idle_bytes(self):
        return 0

    def pool_idle_device_bytes(self):
        return 0
