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
