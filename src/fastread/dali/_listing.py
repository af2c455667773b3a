"""The binary listing that ``fn.fastread.readers.file`` maps instead of a
``files=`` argument of N strings and ``labels=`` of N ints
(``file_index=``, dali_plugin/mapped_file_list.h).

A DALI argument list costs a Python string per file and a copy in the
pipeline's spec (a 10^7-file tree: gigabytes and a minute to build); the
listing is the :class:`fastread.PathTable`'s columns and the labels written
once, back to back, by array writes (no Python object per file), into the
node-local index cache (:func:`fastread.formats._index_files.cache_dir`)
under a name hashed from its contents, so the same file list reuses its
entry. The header line holds that hash: the operator refuses a listing
replaced since the pipeline was defined (another header or size), and
``fr_reader_open_tree`` checks the offsets and directory ids in one walk.

Layout (little-endian, each column 8-aligned; mapped_file_list.h reads it):
a 64-byte header (``FRLIST1 <count> <dirs> <key>\\n``, zero padded),
``dir_offsets`` uint64 x (dirs + 1), ``name_offsets`` uint64 x (count + 1),
``dir_ids`` uint32 x count, ``labels`` int32 x count, then the directory
prefixes' bytes and the names' bytes, ending the file.
"""
import hashlib
import os

import numpy as np

from fastread.formats._index_files import cache_dir, cache_prune, cache_touch
from fastread.names import PathTable

MAGIC = b"FRLIST1"
HEAD_BYTES = 64
SUFFIX = ".frlist"
#: Files below which readers.file passes files= (a short list costs nothing
#: and needs no cache entry); tests lower it to read both ways.
MIN_FILES = 4096


def _pad8(n):
    return b"\0" * (-n % 8)


def _columns(table, labels):
    """The listing's columns after its header, in file order (arrays whose
    buffers are written as they are)."""
    def u64(offsets):
        offs = np.ascontiguousarray(offsets)
        return offs.view(np.uint64) if offs.dtype == np.int64 else offs.astype(np.uint64)

    n = len(table)
    ids = np.ascontiguousarray(table.dir_ids, dtype=np.uint32)
    labs = np.ascontiguousarray(labels, dtype=np.int32)
    return [u64(table.dirs.offsets), u64(table.names.offsets), ids, _pad8(4 * n), labs,
            _pad8(4 * n), np.ascontiguousarray(table.dirs.blob),
            np.ascontiguousarray(table.names.blob)]


def listing_args(paths, labels, *, directory=None):
    """The operator's ``file_index`` arguments for files ``paths`` (a
    PathTable or a sequence of paths) with int32 ``labels``: the listing's
    path (written now unless the cache holds it), its header line, counts
    and size. None where the index cache is off (``FASTREAD_INDEX_CACHE_DIR=off``):
    the caller passes ``files=`` then."""
    directory = cache_dir(directory)
    if directory is None:
        return None
    table = paths if isinstance(paths, PathTable) else PathTable.from_paths(paths)
    table.check("fastread.dali.readers.file's file list")
    n, d = len(table), len(table.dirs)
    cols = _columns(table, labels)
    h = hashlib.sha256(b"%d %d " % (n, d))
    for c in cols:
        h.update(memoryview(c).cast("B") if not isinstance(c, bytes) else c)
    key = h.hexdigest()[:24]
    head = b"%s %d %d %s\n" % (MAGIC, n, d, key.encode())
    if len(head) > HEAD_BYTES:
        raise ValueError(f"fastread.dali.readers.file: {n} files in {d} directories are more "
                         "than a listing's header holds")
    size = HEAD_BYTES + sum(memoryview(c).nbytes if not isinstance(c, bytes) else len(c)
                            for c in cols)
    path = os.path.join(directory, f"files-{key}{SUFFIX}")
    if not _kept(path, head, size):
        _write(path, directory, head, cols, size)
        cache_prune(directory)
    else:
        cache_touch(path)
    return dict(file_index=path, index_head=head.decode("ascii"), index_count=n, index_dirs=d,
                index_bytes=size)


def _kept(path, head, size):
    """Whether the cache entry ``path`` is this listing (its header and size:
    the name is the contents' hash)."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size == size and f.read(len(head)) == head
    except FileNotFoundError:
        return False


def _write(path, directory, head, cols, size):
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(head.ljust(HEAD_BYTES, b"\0"))
            for c in cols:
                f.write(c if isinstance(c, bytes) else memoryview(c).cast("B"))
            if f.tell() != size:
                raise OSError(f"fastread.dali.readers.file: listing {tmp!r}: wrote {f.tell()} "
                              f"bytes, {size} expected")
        # Whole or absent: readers of the same list on this node may race.
        os.replace(tmp, path)
    except OSError as e:
        raise OSError(f"fastread.dali.readers.file: cannot write the file listing {path!r} "
                      f"(the index cache, FASTREAD_INDEX_CACHE_DIR): {e}") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
