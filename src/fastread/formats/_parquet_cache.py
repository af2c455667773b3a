"""The row-group cache of a Parquet source's reader (:class:`fastread.formats.parquet.Parquet`):
decoded row groups (or a ranged one's index) kept least recently used first
out within a budget of decoded bytes, loads shared by the batches that wait
on them. Split out of parquet.py, which reads and cuts; this keeps."""
import collections
import concurrent.futures as _futures
import threading

import numpy as np

__all__ = ["_RowGroupCache"]


class _RowGroupCache:
    """Row groups being loaded or loaded, by (file, group): futures, the
    least recently used loaded ones dropped past ``budget`` decoded bytes
    (a batch holding one keeps it alive all the same). Row groups whose
    every row has been asked for since they were loaded go first: with a
    shuffle buffer a sample may linger in the buffer while many later row
    groups are read, and its row group must still be there when it comes
    out. The KEEP_RECENT most recently used stay whatever the budget:
    reading in file order (a shuffle buffer) then loads every row group
    once, even where one row group is larger than the budget."""

    KEEP_RECENT = 4

    def __init__(self, loader, budget, executor, rows=None, spill=False):
        self.loader, self.budget, self.executor = loader, budget, executor
        self._entries = collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.loads = 0
        # rows[(file, group)]: the group's row count; _asked: rows asked for
        # since the entry was made (a whole epoch asks each row once).
        self._rows = rows
        self._asked = {}
        # spill: the data set's decoded size is beyond the budget, so a row
        # group read through will not be asked for again before it would be
        # evicted (the next epoch's order meets it after the budget's worth
        # of others): it goes as soon as it is read through, and the next
        # decode reuses its pages (jemalloc's dirty extents) instead of
        # filling the budget with fresh ones first. In file order with the
        # budget at 1 GiB of the 20k set's 1.8 GB this was 300k page faults
        # an epoch (1.5 GB of RSS) for no later hit (docs/parquet.md).
        self.spill = bool(spill)

    def get(self, key):
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                return fut
            self.loads += 1
            if self.executor is None:
                fut = _futures.Future()
                fut.set_result(self.loader.load(*key))
            else:
                fut = self.executor.submit(self.loader.load, *key)
            self._entries[key] = fut
        fut.add_done_callback(lambda done: self._loaded(key, done))
        return fut

    def _loaded(self, key, fut):
        with self._lock:
            if self._entries.get(key) is not fut:
                return
            if fut.exception() is not None or fut.result().error is not None:
                del self._entries[key]   # tried again when next needed
                self._asked.pop(key, None)
                return
            self._held += fut.result().nbytes
            self._evict()

    def _read_through(self, key):
        rows = self._rows(key) if self._rows is not None else None
        return rows is not None and self._asked.get(key, 0) >= rows

    def _drop(self, key):
        fut = self._entries.pop(key)
        self._asked.pop(key, None)
        if fut.exception() is None:
            self._held -= fut.result().nbytes

    def _evict(self):
        """Past the budget: the loaded row groups read through first (least
        recently used first), then the least recently used, keeping the
        KEEP_RECENT most recent; with ``spill``, every loaded row group
        read through, whatever the budget."""
        if self.spill:
            for old in [k for k, f in self._entries.items() if f.done() and self._read_through(k)]:
                self._drop(old)
        if self._held > self.budget:
            for old in [k for k, f in self._entries.items() if f.done() and self._read_through(k)]:
                if self._held <= self.budget or len(self._entries) <= self.KEEP_RECENT:
                    return
                self._drop(old)
        while self._held > self.budget and len(self._entries) > self.KEEP_RECENT:
            old, oldest = next(iter(self._entries.items()))
            if not oldest.done():
                break
            self._drop(old)

    def held(self):
        """Decoded bytes of the loaded row groups kept."""
        with self._lock:
            return self._held

    def pending(self):
        """Loads asked for and not finished."""
        with self._lock:
            return sum(1 for f in self._entries.values() if not f.done())

    def wanted(self, source, idx):
        """{(file, group): future} for the row groups of samples ``idx``."""
        out = {key: self.get(key) for key in source.groups_of(idx)}
        if self._rows is not None and len(idx):
            keys, counts = np.unique(source.file_index[idx].astype(np.int64) << 32
                                     | source.group_index[idx], return_counts=True)
            with self._lock:
                for k, c in zip(keys.tolist(), counts.tolist()):
                    key = (k >> 32, k & 0xFFFFFFFF)
                    if key in self._entries:
                        self._asked[key] = self._asked.get(key, 0) + c
                self._evict()
        return out

    def clear(self):
        with self._lock:
            self._entries.clear()
            self._asked.clear()
            self._held = 0
