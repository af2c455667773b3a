"""Sample names as one blob and an offsets column, not a Python string each.

A list of 10^8 names costs ~60-100 bytes a name in Python objects (and
minutes to build); :class:`NameTable` holds the names' bytes back to back
(``blob``) and ``n + 1`` offsets into it, so the cost is the names' bytes plus
8 bytes a name, and both may be memory-mapped views of an index file (a name
is decoded only when asked for). It is an immutable sequence of ``str``:
``len``, indexing (slices give lists), iteration, ``index`` and ``in`` work
as on the list it replaces.

Names are file-system names: they are stored with the file-system encoding's
``surrogateescape`` bytes (``os.fsencode``), so names that are not valid
UTF-8 round-trip.
"""
import os
from collections.abc import Sequence

import numpy as np

__all__ = ["NameTable", "PathTable"]


class NameTable(Sequence):
    """Names ``i`` = ``blob[offsets[i]:offsets[i + 1]]`` decoded.

    ``blob``: bytes-like (bytes, a memoryview, a uint8 array, an mmap);
    ``offsets``: ``n + 1`` non-decreasing integers from 0 to ``len(blob)``
    (int64 or uint64 arrays are used as they are: no copy)."""

    __slots__ = ("_blob", "_offsets", "_n")

    def __init__(self, blob, offsets):
        self._blob = np.frombuffer(blob, dtype=np.uint8) if not isinstance(
            blob, np.ndarray) else blob.reshape(-1).view(np.uint8)
        offs = np.asarray(offsets)
        if offs.ndim != 1 or not len(offs) or offs.dtype.kind not in "iu":
            raise ValueError("NameTable offsets must be a 1-D integer array of n + 1 entries")
        self._offsets = offs
        self._n = len(offs) - 1

    @classmethod
    def from_names(cls, names):
        """A table of ``names`` (an iterable of str or os.PathLike)."""
        encoded = [os.fsencode(s) for s in names]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        if encoded:
            np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    @property
    def blob(self):
        """The names' bytes, back to back (a uint8 array)."""
        return self._blob

    @property
    def offsets(self):
        """``n + 1`` offsets into :attr:`blob`."""
        return self._offsets

    @property
    def nbytes(self):
        """Bytes this table holds (blob and offsets)."""
        return int(self._blob.nbytes + self._offsets.nbytes)

    def check(self, what):
        """Raises ValueError naming ``what`` unless the offsets are
        non-decreasing from 0 to the blob's length (reads all offsets)."""
        offs = self._offsets
        if int(offs[0]) != 0 or int(offs[-1]) != len(self._blob):
            raise ValueError(f"{what}: name offsets do not span the names' bytes "
                             f"(0..{len(self._blob)})")
        if self._n and (np.diff(offs) < 0).any():
            raise ValueError(f"{what}: name offsets decrease")

    def __len__(self):
        return self._n

    def take(self, indices):
        """A NameTable of the names at ``indices`` (an integer array), in
        that order, gathered with numpy: no Python string a name (a Ray read
        task's names, say)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self._n):
            raise IndexError("NameTable.take: index out of range")
        starts = self._offsets[idx].astype(np.int64)
        lengths = self._offsets[idx + 1].astype(np.int64) - starts
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Byte j of name k comes from starts[k] + (j - offsets[k]).
        shift = np.repeat(starts - offsets[:-1], lengths)
        return NameTable(self._blob[np.arange(offsets[-1], dtype=np.int64) + shift], offsets)

    def _name(self, i):
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        return os.fsdecode(self._blob[start:end].tobytes())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._name(j) for j in range(*i.indices(self._n))]
        try:
            i = int(i.__index__())
        except AttributeError:
            raise TypeError(f"NameTable indices must be integers or slices, not "
                            f"{type(i).__name__}") from None
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("NameTable index out of range")
        return self._name(i)

    def __iter__(self):
        for i in range(self._n):
            yield self._name(i)

    def index(self, value, start=0, stop=None):
        """The first ``i`` whose name is ``value`` (a scan of the blob for
        its bytes, not a decode of every name)."""
        stop = self._n if stop is None else min(stop, self._n)
        want = os.fsencode(value)
        blob = self._blob
        # Candidates: names of the right length, then their bytes compared.
        lengths = np.diff(self._offsets[start:stop + 1])
        for j in np.flatnonzero(lengths == len(want)):
            s = int(self._offsets[start + j])
            if blob[s:s + len(want)].tobytes() == want:
                return int(start + j)
        raise ValueError(f"{value!r} is not in the names")

    def __contains__(self, value):
        try:
            self.index(value)
        except (ValueError, TypeError):
            return False
        return True

    def __eq__(self, other):
        if isinstance(other, NameTable):
            return (self._n == other._n and np.array_equal(self._offsets, other._offsets)
                    and np.array_equal(self._blob, other._blob))
        if isinstance(other, (list, tuple)):
            return len(other) == self._n and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self):
        return f"NameTable({self._n} names, {len(self._blob)} bytes)"


class PathTable(Sequence):
    """A file tree's paths as a directory table and the files' names, not a
    Python string each: path ``i`` is ``dirs[dir_ids[i]] + names[i]``
    (``dirs``: the directories' prefixes, each ending in ``/`` or empty;
    ``names``: what follows, both :class:`NameTable`; ``dir_ids``: uint32).

    10^6 files in 1,000 folders cost their base names' bytes plus 12 bytes a
    file (an offset and a directory id) instead of ~100 bytes of ``str`` and
    list slot, and :class:`fastread.NativeReader` reads the columns in place
    (fr_reader_open_tree) instead of one encoded copy of every path. Like
    :class:`NameTable` an immutable sequence of ``str`` (indexing, slices as
    lists, iteration, ``==`` with a list); :func:`fastread.scan` builds one
    with ``table=True``."""

    __slots__ = ("dirs", "dir_ids", "names")

    def __init__(self, dirs, dir_ids, names):
        ids = np.ascontiguousarray(dir_ids, dtype=np.uint32)
        if ids.ndim != 1 or len(ids) != len(names):
            raise ValueError(f"PathTable: {ids.size} directory ids for {len(names)} names")
        if len(ids) and int(ids.max()) >= len(dirs):
            raise ValueError(f"PathTable: directory id {int(ids.max())} of {len(dirs)} "
                             "directories")
        #: Directory prefixes (a NameTable), each ending in "/" or empty.
        self.dirs = dirs
        #: Each file's directory (uint32).
        self.dir_ids = ids
        #: Each file's name after its directory's prefix (a NameTable).
        self.names = names

    @classmethod
    def from_paths(cls, paths):
        """A table of ``paths`` (str or os.PathLike), each split at its last
        ``/``; paths sharing a directory share one prefix."""
        paths = paths if isinstance(paths, list) else list(paths)
        fast = _split_ascii_paths(paths)
        if fast is not None:
            return cls(*fast)
        prefixes = {}
        ids, tails = [], []
        for p in paths:
            head, sep, tail = os.fspath(p).rpartition("/")
            if "\0" in tail or "\0" in head:
                raise ValueError(f"path {p!r} holds a NUL character")
            ids.append(prefixes.setdefault(head + sep, len(prefixes)))
            tails.append(tail)
        return cls(NameTable.from_names(prefixes), np.asarray(ids, dtype=np.uint32),
                   NameTable.from_names(tails))

    @property
    def nbytes(self):
        """Bytes this table holds (both name tables and the ids)."""
        return self.dirs.nbytes + self.names.nbytes + int(self.dir_ids.nbytes)

    def check(self, what):
        """Raises ValueError naming ``what`` unless both tables' offsets are
        sound (NameTable.check)."""
        self.dirs.check(f"{what} (directories)")
        self.names.check(f"{what} (names)")

    def __len__(self):
        return len(self.names)

    def take(self, indices):
        """A PathTable of the paths at ``indices`` (an integer array), in that
        order, gathered with numpy: its directory table only the directories
        those paths use, so its size follows ``len(indices)``, not the whole
        table's (a Ray read task's files, say)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        names = self.names.take(idx)   # checks the range, as a list would
        used, ids = np.unique(self.dir_ids[idx], return_inverse=True)
        return PathTable(self.dirs.take(used), ids.reshape(-1).astype(np.uint32), names)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        name = self.names[i]  # checks i and raises as a list would
        return self.dirs[int(self.dir_ids[i])] + name

    def __iter__(self):
        dirs = [d for d in self.dirs]
        for d, name in zip(self.dir_ids.tolist(), self.names):
            yield dirs[d] + name

    def tolist(self):
        """The paths as a list of str."""
        return list(self)

    def __eq__(self, other):
        if isinstance(other, PathTable):
            return (len(self) == len(other) and
                    all(a == b for a, b in zip(self, other)))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self):
        return f"PathTable({len(self)} paths in {len(self.dirs)} directories, {self.nbytes} bytes)"


# Paths split a chunk at a time: numpy's temporaries stay a few MB whatever
# the list's length.
_SPLIT_CHUNK = 1 << 16


def _split_ascii_paths(paths):
    """``(dirs, dir_ids, names)`` of ``paths`` (a list) split at each one's
    last ``/`` with numpy, one chunk at a time, as ``PathTable.from_paths``'
    loop splits them, ~4x faster (a caller's list of 10^6 paths given to
    ``fastread.ray.read_files``): only for ``str`` paths that are ASCII (then
    a character is a byte) and hold no NUL; None otherwise, for the loop,
    which handles and names the rest."""
    prefixes = {}
    ids, blobs, name_lengths = [], [], []
    for c in range(0, len(paths), _SPLIT_CHUNK):
        part = paths[c:c + _SPLIT_CHUNK]
        try:
            joined = "".join(part)
        except TypeError:   # bytes or os.PathLike entries
            return None
        if not joined.isascii() or "\0" in joined:
            return None
        b = np.frombuffer(joined.encode("ascii"), np.uint8)
        lengths = np.fromiter(map(len, part), np.int64, len(part))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        # Each path's directory prefix: up to its last "/" (none: "").
        slashes = np.flatnonzero(b == ord("/"))
        dlen = np.zeros(len(part), np.int64)
        if len(slashes):
            k = np.searchsorted(slashes, ends) - 1
            last = slashes[np.maximum(k, 0)]
            has = (k >= 0) & (last >= starts)
            dlen[has] = last[has] - starts[has] + 1
        # Runs of paths in one directory (a listing keeps them together):
        # a path starts a new run unless its prefix has the previous one's
        # length and bytes; only a run's first path is looked up by name.
        new = np.ones(len(part), bool)
        cand = np.flatnonzero(dlen[1:] == dlen[:-1]) + 1
        new[cand[dlen[cand] == 0]] = False
        cand = cand[dlen[cand] > 0]
        if len(cand):
            seg = dlen[cand]
            seg_starts = np.zeros(len(cand), np.int64)
            np.cumsum(seg[:-1], out=seg_starts[1:])
            within = np.arange(int(seg.sum()), dtype=np.int64) - np.repeat(seg_starts, seg)
            eq = b[np.repeat(starts[cand], seg) + within] == \
                b[np.repeat(starts[cand - 1], seg) + within]
            new[cand[np.logical_and.reduceat(eq, seg_starts)]] = False
        heads = np.flatnonzero(new)
        run_ids = np.fromiter(
            (prefixes.setdefault(joined[s:s + d], len(prefixes))
             for s, d in zip(starts[heads].tolist(), dlen[heads].tolist())),
            np.int64, len(heads))
        ids.append(run_ids[np.cumsum(new) - 1])
        # The names: the bytes after each prefix (a 0/1 mask over the chunk).
        edge = np.zeros(len(b) + 1, np.int8)
        sel = dlen > 0
        edge[starts[sel]] += 1
        edge[starts[sel] + dlen[sel]] -= 1
        blobs.append(b[np.cumsum(edge[:-1], dtype=np.int8) == 0])
        name_lengths.append(lengths - dlen)
    offsets = np.zeros(len(paths) + 1, np.int64)
    if paths:
        np.cumsum(np.concatenate(name_lengths), out=offsets[1:])
    return (NameTable.from_names(prefixes),
            np.concatenate(ids).astype(np.uint32) if ids else np.zeros(0, np.uint32),
            NameTable(np.concatenate(blobs) if blobs else np.zeros(0, np.uint8), offsets))
