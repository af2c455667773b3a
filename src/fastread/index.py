"""Dataset indexing with the exact semantics of DALI's ``fn.readers.file``.

This module is pure Python (numpy, plus libc's ``fnmatch`` through
:mod:`ctypes`) and has no dependency on DALI or on the rest of
:mod:`fastread`.  It provides :func:`scan`: the ``(paths, labels)`` sample
list exactly as DALI 2.4's ``fn.readers.file`` builds it, from a
class-per-subdirectory tree (``file_root``), from a ``file_list`` text file,
or from explicit ``files``/``labels``.  Which of those samples a shard reads
in an epoch is :mod:`fastread.sampling`'s (``shard_range``,
``epoch_indices``); both are re-exported here for older imports.

DALI semantics reproduced by :func:`scan` (DALI 2.4.0, verified both by reading
``dali/operators/reader/loader/discover_files.cc``, ``file_label_loader.h``,
``filesystem.cc``, ``loader.h``/``loader.cc`` and by experiment against the
installed ``nvidia-dali-cuda120`` 2.4.0):

Directory mode (``file_root`` without ``file_list``/``files``):

* Every *first-level* entry of ``file_root`` whose ``stat()`` (symlinks
  followed) says "directory" is a class.  Class directories are sorted by the
  byte values of their names (``std::sort`` on ``std::string``; e.g. ``"B"`` <
  ``"a_"`` < ``"aa"`` < ``"b"``) and the label of a class is its index in that
  sorted list.  Directories without any matching file (even completely empty
  ones) still consume a label index.  A dangling symlink directly under
  ``file_root`` is an error (DALI ``stat()``-s every root entry).
* Only files *directly* inside a class directory are samples: deeper
  subdirectories are not traversed and files directly in ``file_root`` are
  ignored.  An entry is a candidate if ``readdir`` reports it as a regular
  file or a symlink (symlinks are *not* resolved: a dangling symlink or a
  symlink to a directory whose name matches a filter is listed, and fails
  later when read).  Directories, FIFOs, sockets and devices are skipped.
* A name is kept if glibc ``fnmatch(filter, name, flags)`` accepts it for at
  least one of ``file_filters`` (default and custom ones alike), with
  ``flags = FNM_CASEFOLD`` unless ``case_sensitive_filter=True`` (then ``0``).
  No ``FNM_PERIOD``: ``*`` also matches a leading dot, so hidden files are
  included.  This module calls the very same libc ``fnmatch`` through
  :mod:`ctypes`, with the name's on-disk bytes (``os.fsencode``, so names
  that are not valid UTF-8 are matched byte-wise as in DALI) and the filter's
  UTF-8 bytes (what DALI receives from Python).  Matching depends on the
  process's ``LC_CTYPE`` locale: Python sets it from the environment at
  startup (``C``/``POSIX`` is coerced to ``C.UTF-8``), and DALI running in the
  same process sees the same locale.  In a UTF-8 locale, names are matched
  per character and ``FNM_CASEFOLD`` folds with ``towlower``, so
  ``"x.tİf"`` matches ``"*.tif"``.
* Within a class, names are sorted by their bytes; the final order is class by
  class, then file name.  Each sample path is ``join(file_root, class, name)``
  using DALI's ``join_path`` (no normalisation: ``file_root="/d/"`` gives
  ``"/d/c/x.jpg"``, ``file_root="/d//"`` gives ``"/d//c/x.jpg"``).

``file_list`` mode: one ``<path> <label>`` per line, parsed from the end of the
line: trailing ASCII whitespace is skipped, the label is the trailing run of
decimal digits (no sign), and the file name is everything before the
whitespace that precedes the label, so names may contain spaces (and even a
leading space).  Blank lines are skipped; there are no comments (``#x 1`` is
file ``#x``).  Labels are converted like C ``atoi`` (wrapping to int32).  Paths
are joined to ``file_root`` if given, otherwise to the part of the
``file_list`` path before its last ``/`` (with none, or for ``/list.txt``,
paths stay relative to the current directory).  Absolute paths are kept.
Files are not checked for existence and ``file_filters`` is ignored.

``files`` mode: ``files`` joined to ``file_root`` (if given), labels from
``labels`` or, without it, the position in ``files``.

Difference from DALI (documented approximation): on filesystems that do not
report ``d_type`` (``DT_UNKNOWN``) DALI keeps every matching name, while this
module still excludes directories and special files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import sys
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from fastread._safe_open import open_file
from fastread.names import NameTable, PathTable

__all__ = [
    "DALI_DEFAULT_FILTERS",
    "scan",
    "shard_range",
    "epoch_indices",
]

# Shards and epochs live in fastread.sampling; these names stay importable
# from here (fastread.index.epoch_indices was their home).
from fastread.sampling import epoch_indices, shard_range  # noqa: E402,F401

#: Default ``file_filters`` of DALI 2.4 ``fn.readers.file``
#: (schema default ``kKnownExtensionsGlob``).  Matched case-insensitively.
DALI_DEFAULT_FILTERS: Tuple[str, ...] = (
    "*.jpg", "*.jpeg", "*.png", "*.bmp", "*.tif", "*.tiff", "*.pnm", "*.ppm",
    "*.pgm", "*.pbm", "*.jp2", "*.webp", "*.flac", "*.ogg", "*.wav",
)

# DALI reads list lines with ``std::istream::getline`` into a 16 KiB buffer:
# a line of 16384 or more characters makes the stream fail.
_MAX_LIST_LINE = (16 << 10) - 1
_C_SPACE = b" \t\n\v\f\r"
_LONG_MAX = (1 << 63) - 1

PathArg = Union[str, "os.PathLike[str]", bytes]


# ----------------------------------------------------------------------------
# file name filters: glibc fnmatch(3), called through ctypes
# ----------------------------------------------------------------------------

# DALI calls ``fnmatch(filter, d_name, case_sensitive_filter ? 0 : FNM_CASEFOLD)``.
# The symbols are looked up in the process's global namespace, i.e. the same
# libc ``fnmatch`` that DALI's shared library binds to.  No ``argtypes``: every
# argument is bytes (``char *``) or a small int (``int``), which ctypes' default
# conversions pass correctly, and declaring them makes each call ~3x slower.
try:
    _libc = ctypes.CDLL(None)
    _fnmatch = _libc.fnmatch
except (OSError, AttributeError):  # pragma: no cover - libc not in the global namespace
    _libc = ctypes.CDLL(ctypes.util.find_library("c"))
    _fnmatch = _libc.fnmatch
_FNM_CASEFOLD = 1 << 4  # <fnmatch.h>
_GLOB_SPECIAL = frozenset("*?[\\\0")
_FS_ENCODING = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def _ascii_casefold_is_plain() -> bool:
    """True if ``FNM_CASEFOLD`` folds ASCII like ``str.lower`` in the current
    locale (glibc folds with ``tolower`` in single-byte and ``towlower`` in
    multibyte locales; e.g. ``tr_TR.UTF-8`` maps ``I`` to dotless ``ı``)."""
    return all(_libc.tolower(c) == _libc.towlower(c) == ord(chr(c).lower())
               for c in range(128))


class _Matcher:
    """``name`` matches if glibc ``fnmatch(pattern, name, flags) == 0`` for any
    pattern, exactly as in DALI.

    Fast path (no ctypes call): an ASCII name against an ASCII pattern
    ``"*" + literal`` (literal without ``* ? [ \\`` or NUL).  Without
    ``FNM_PERIOD``/``FNM_PATHNAME`` the ``*`` matches any prefix (leading dots
    included) and a literal matches character by character after folding both
    sides, so fnmatch is ``fold(name).endswith(fold(literal))``; that is
    ``str.lower`` (ASCII folding on ASCII input) when the locale folds ASCII
    plainly, which is checked when the matcher is built.  Everything else,
    including every non-ASCII or non-UTF-8 name, is passed to ``fnmatch``.
    """

    def __init__(self, patterns: Sequence[str], case_sensitive: bool):
        self.flags = 0 if case_sensitive else _FNM_CASEFOLD
        self.fold = str if case_sensitive else str.lower
        fast = case_sensitive or _ascii_casefold_is_plain()
        suffixes, self.slow, self.all = [], [], []
        for p in dict.fromkeys(patterns):
            b = p.encode("utf-8", "surrogateescape")  # what pybind11 hands DALI
            self.all.append(b)
            if fast and p[:1] == "*" and p.isascii() and _GLOB_SPECIAL.isdisjoint(p[1:]):
                suffixes.append(self.fold(p[1:]))
            else:
                self.slow.append(b)
        self.suffixes = tuple(suffixes)

    def __call__(self, name: str) -> bool:
        ascii_ = name.isascii()
        if ascii_ and self.fold(name).endswith(self.suffixes):
            return True
        b = name.encode(*_FS_ENCODING)  # os.fsencode: the bytes readdir returned
        for p in self.slow if ascii_ else self.all:
            if _fnmatch(p, b, self.flags) == 0:
                return True
        return False


# ----------------------------------------------------------------------------
# scan
# ----------------------------------------------------------------------------

def _join_path(dir_: str, path: str) -> str:
    """DALI ``filesystem::join_path``: prepend dir to relative paths."""
    if not dir_:
        return path
    if not path:
        return dir_
    if path[0] == "/":
        return path
    if dir_[-1] == "/":
        return dir_ + path
    return dir_ + "/" + path


def _to_str(p: PathArg, what: str) -> str:
    try:
        p = os.fspath(p)
    except TypeError:
        raise TypeError(f"{what} must be a path (str or os.PathLike), got {type(p).__name__}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    return p


def _byte_sorted(names: List[str]) -> List[str]:
    # std::sort on std::string == byte order; for valid UTF-8 this equals
    # code point order, but names with invalid bytes (surrogate escapes) differ.
    if all(n.isascii() for n in names):
        return sorted(names)
    return sorted(names, key=os.fsencode)


def _check_filters(filters, option: str) -> List[str]:
    if isinstance(filters, (str, bytes)):
        filters = [filters]
    try:
        filters = list(filters)
    except TypeError:
        raise TypeError(f"``{option}`` must be a glob pattern or a list of them, got "
                        f"{type(filters).__name__}") from None
    filters = [_to_str(f, option) if not isinstance(f, str) else f for f in filters]
    if not filters:
        raise ValueError(f"``{option}`` list cannot be empty")
    return filters


def _list_classes(root: str, dir_matcher: Optional[_Matcher]) -> List[str]:
    try:
        it = os.scandir(root)
    except FileNotFoundError:
        raise FileNotFoundError(f"file_root {root!r} does not exist") from None
    except NotADirectoryError:
        raise NotADirectoryError(f"file_root {root!r} is not a directory") from None
    subdirs = []
    with it:
        for e in it:
            if e.is_symlink():
                # DALI stat()s every root entry and fails if it cannot.
                try:
                    is_dir = stat.S_ISDIR(os.stat(e.path).st_mode)
                except OSError as exc:
                    raise FileNotFoundError(
                        f"Could not access {_join_path(root, e.name)!r} during directory "
                        f"traversal of file_root {root!r}: {exc.strerror}") from None
            else:
                is_dir = e.is_dir()
            if is_dir and (dir_matcher is None or dir_matcher(e.name)):
                subdirs.append(e.name)
    return _byte_sorted(subdirs)


def _list_files(dirpath: str, matcher: _Matcher) -> List[str]:
    fold, suffixes = matcher.fold, matcher.suffixes
    with os.scandir(dirpath) as it:
        out = [name for e in it
               # the matcher's fast path inlined: most names take it
               if ((name := e.name).isascii() and fold(name).endswith(suffixes)
                   or matcher(name))
               and (e.is_file(follow_symlinks=False) or e.is_symlink())]
    return _byte_sorted(out)


def _walk_tree(root: str, filters: List[str], dir_filters: Optional[List[str]],
               case_sensitive: bool):
    """``(prefix, names)`` per class directory, in label order: the one walk
    behind both of scan()'s outputs (a list, or a PathTable)."""
    matcher = _Matcher(filters, case_sensitive)
    dir_matcher = _Matcher(dir_filters, case_sensitive) if dir_filters is not None else None
    for cls in _list_classes(root, dir_matcher):
        prefix = _join_path(root, cls) + "/"
        yield prefix, _list_files(prefix[:-1], matcher)


def _scan_tree(root: str, filters: List[str], dir_filters: Optional[List[str]],
               case_sensitive: bool, table: bool):
    paths: List[str] = []
    prefixes, counts, blobs, lengths = [], [], [], []
    for prefix, names in _walk_tree(root, filters, dir_filters, case_sensitive):
        counts.append(len(names))
        if table:
            # Each directory's names packed as they come: no str per path
            # outlives its directory's listing.
            prefixes.append(prefix)
            joined = "".join(names)
            if joined.isascii():  # O(1) in CPython; then a byte is a character
                blobs.append(joined.encode("ascii"))
                lens = map(len, names)
            else:
                encoded = [os.fsencode(n) for n in names]
                blobs.append(b"".join(encoded))
                lens = map(len, encoded)
            lengths.append(np.fromiter(lens, dtype=np.int64, count=len(names)))
        else:
            paths.extend([prefix + n for n in names])
    labels = np.repeat(np.arange(len(counts), dtype=np.int32), np.asarray(counts, dtype=np.int64))
    if not table:
        return paths, labels
    # One directory a class: a file's directory id is its label.
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    if len(labels):
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    return PathTable(NameTable.from_names(prefixes), labels.astype(np.uint32),
                     NameTable(b"".join(blobs), offsets)), labels


def _atoi(digits: bytes) -> int:
    v = min(int(digits), _LONG_MAX)  # strtol clamps, then (int) truncates
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def scan_numpy(file_root: PathArg, file_filter="*.npy", *,
               case_sensitive_filter: bool = False) -> List[str]:
    """The files DALI's ``fn.readers.numpy`` finds under ``file_root``: those
    directly in it (as ``root/./name``, as DALI names them) and those in its
    immediate subdirectories, matching ``file_filter``, in byte order of
    their relative paths."""
    root = _to_str(file_root, "file_root")
    matcher = _Matcher(_check_filters(file_filter, "file_filter"), case_sensitive_filter)
    rel = ["./" + n for n in _list_files(root, matcher)]
    for sub in _list_classes(root, None):
        rel.extend(f"{sub}/{n}" for n in _list_files(_join_path(root, sub), matcher))
    return [_join_path(root, r) for r in _byte_sorted(rel)]


def _parse_file_list(file_list: str, root: str):
    try:
        with open_file(file_list) as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"file_list {file_list!r} does not exist") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    paths: List[str] = []
    labels: List[int] = []
    for lineno, line in enumerate(lines, 1):
        if len(line) > _MAX_LIST_LINE:
            raise ValueError(f"file_list {file_list!r}, line {lineno}: line is longer than "
                             f"{_MAX_LIST_LINE} bytes")
        nul = line.find(b"\0")
        if nul >= 0:
            line = line[:nul]
        i = len(line) - 1
        while i >= 0 and line[i] in _C_SPACE:
            i -= 1
        if i < 0:
            continue  # blank line
        label_end = i + 1
        while i >= 0 and 48 <= line[i] <= 57:
            i -= 1
        label_start = i + 1
        while i >= 0 and line[i] in _C_SPACE:
            i -= 1
        name_end = i + 1
        if not (0 < name_end < label_start and label_end > label_start):
            raise ValueError(
                f"file_list {file_list!r}, line {lineno}: expected a file name followed "
                f"by whitespace and a non-negative integer label, got {os.fsdecode(line)!r}")
        paths.append(_join_path(root, os.fsdecode(line[:name_end])))
        labels.append(_atoi(line[label_start:label_end]))
    if not paths:
        raise ValueError(f"file_list {file_list!r} contains no samples")
    return paths, np.asarray(labels, dtype=np.int32)


def scan(file_root: Optional[PathArg],
         file_filters: Optional[Sequence[str]] = None,
         file_list: Optional[PathArg] = None,
         *,
         files: Optional[Sequence[PathArg]] = None,
         labels: Optional[Sequence[int]] = None,
         dir_filters: Optional[Sequence[str]] = None,
         case_sensitive_filter: bool = False,
         s3=None, listing_cache=None,
         listing_max_age_s: Optional[float] = None,
         table: bool = False) -> Tuple[Sequence[str], np.ndarray]:
    """List samples exactly as DALI's ``fn.readers.file`` does (before shuffling
    and sharding).

    Args:
        file_root: Dataset directory (one subdirectory per class), or the base
            that ``file_list``/``files`` paths are relative to.  May be ``None``
            with ``file_list`` or ``files``.
        file_filters: Glob patterns for file names in directory mode;
            ``None`` means :data:`DALI_DEFAULT_FILTERS`.  Ignored with
            ``file_list``/``files`` (as in DALI).
        file_list: Text file with ``<path> <label>`` lines (see module doc).
        files: Explicit list of paths (DALI's ``files=``); mutually exclusive
            with ``file_list``.
        labels: Labels for ``files`` (DALI's ``labels=``); default: positions.
        dir_filters: Optional glob patterns selecting class directories.
        case_sensitive_filter: Match filters case-sensitively (DALI default
            ``False``).
        s3: For a ``file_root`` that is an ``s3://bucket/prefix`` URL, how to
            reach the bucket (a :class:`fastread.s3.S3Options` or a mapping;
            default: the AWS environment and files). The tree is listed
            (ListObjectsV2) and read like one on disk: "directories" right
            under the prefix are the classes, objects directly in them the
            samples, with the same filters, order and labels.
        listing_cache: For an ``s3://`` root, a node-local cache directory
            (a reader's ``cache_dir``) where the listing is kept and reused
            while it is younger than ``listing_max_age_s`` (default
            ``fastread.s3.LISTING_MAX_AGE_S``, 300 s; 0: never reused): S3
            cannot say cheaply whether a prefix changed, so freshness is
            the listing's age. The ranks of a node take turns on a lock:
            one lists, the others read its listing.
        table: Return the paths as a :class:`fastread.PathTable` (one
            directory table, the names as one blob and offsets: ~12 bytes a
            file beyond its name instead of a ``str``), which
            :class:`fastread.FileList` and the native reader take as it is.
            An ``s3://`` listing stays a list (its objects' versions ride
            on it).

    Returns:
        ``(paths, labels)``: the paths exactly as DALI opens them (the DALI
        ``join_path`` of ``file_root`` and the relative path) and an
        ``np.int32`` array of labels, in DALI's (unshuffled) sample order.

    Raises:
        FileNotFoundError: ``file_root`` (directory mode) or ``file_list``
            does not exist, or a root entry is a dangling symlink.
        NotADirectoryError: ``file_root`` is not a directory (directory mode).
        ValueError: no samples found (message names the root and filters),
            a malformed ``file_list`` line (names file and line), or
            inconsistent arguments.
    """
    if files is not None and file_list is not None:
        raise ValueError("File paths can be provided through ``files`` or ``file_list`` "
                         "but not both")
    if labels is not None and files is None:
        raise ValueError("``labels`` is valid only when file paths are provided as ``files``")
    if file_root is None and files is None and file_list is None:
        raise ValueError("``file_root`` is required when not using ``files`` or ``file_list``")
    if file_filters is not None:
        file_filters = _check_filters(file_filters, "file_filters")
    if dir_filters is not None:
        dir_filters = _check_filters(dir_filters, "dir_filters")
    root = _to_str(file_root, "file_root") if file_root is not None else None

    if files is not None:
        if isinstance(files, (str, bytes, os.PathLike)):
            raise TypeError(f"``files`` must be a list of paths, got one path {files!r}")
        files = [_to_str(f, "files") for f in files]
        if not files:
            raise ValueError("``files`` specified an empty list")
        if labels is not None:
            labels = np.asarray(labels)
            if labels.ndim != 1 or len(labels) != len(files):
                raise ValueError(f"Provided {labels.size} labels for {len(files)} files")
            lab = labels.astype(np.int32)
        else:
            lab = np.arange(len(files), dtype=np.int32)
        joined = [_join_path(root or "", f) for f in files]
        return (PathTable.from_paths(joined) if table else joined), lab

    if file_list is not None:
        file_list = _to_str(file_list, "file_list")
        if not file_list:
            raise ValueError("``file_list`` argument cannot be empty")
        if root is None:
            idx = file_list.rfind("/")
            root = file_list[:idx] if idx >= 0 else ""
        paths, lab = _parse_file_list(file_list, root)
        return (PathTable.from_paths(paths) if table else paths), lab

    filters = list(DALI_DEFAULT_FILTERS) if file_filters is None else file_filters
    if root.startswith("s3://"):
        # Imported here: listing a bucket needs the s3 client, a plain scan
        # of a local tree does not.
        from fastread import s3 as _s3
        age = _s3.LISTING_MAX_AGE_S if listing_max_age_s is None else listing_max_age_s
        paths, counts, _ = _s3.scan_tree(root, filters, dir_filters, _Matcher,
                                        bool(case_sensitive_filter), s3,
                                        cache_dir=listing_cache, max_age_s=age)
        lab = np.repeat(np.arange(len(counts), dtype=np.int32), np.asarray(counts, dtype=np.int64))
    else:
        paths, lab = _scan_tree(root, filters, dir_filters, bool(case_sensitive_filter), table)
    # An s3:// listing's paths are a ListedURLs (a list with each object's
    # listed version), which FileList keeps for the node-local cache.
    if not paths:
        extra = f" and dir_filters {dir_filters!r}" if dir_filters is not None else ""
        raise ValueError(f"No files found in class subdirectories of file_root {root!r} "
                         f"matching file_filters {filters!r}{extra}")
    return paths, lab
