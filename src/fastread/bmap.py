"""Extent maps of files in place on a mounted file system (``bmap.json``).

:func:`build_bmap` asks the file system where each sample's bytes lie, with
the ``FS_IOC_FIEMAP`` ioctl (``FIEMAP_FLAG_SYNC``, so data still in the page
cache is allocated first), and lists *every* extent of every file.

The format is a superset of the seed's ``bmap.json``: one top-level key per
file, ``<basename of FILE_ROOT>/<class>/<file>`` (``train/<class>/<file>``
for a root named ``train``), whose value has the seed's ``startblock`` and
``endblock``, plus::

    "size":       the file's size in bytes
    "lba_size":   bytes per block of startblock/endblock (default 512)
    "device":     "MAJOR:MINOR" of the file system's block device
    "contiguous": true if the extents cover the whole file (no hole, also
                  none at its end) in one run of blocks
    "extents":    [{"logical", "physical", "length" (bytes),
                    "startblock", "endblock" (LBAs, inclusive),
                    "flags" (FIEMAP flag names)}, ...] in file order

``startblock`` is the LBA of the file's first byte and ``endblock`` the LBA
holding its last byte (inclusive), so a contiguous file is exactly blocks
``startblock..endblock``; for a file of several extents they are those of
its first and last byte and ``extents`` says where the rest lies. An empty
file has ``startblock`` 0, ``endblock`` -1 and no extents. Physical offsets
are relative to the start of the file system's block device (a partition,
if the file system is on one), as FIEMAP reports them.

A sparse file's holes have no extent: a file whose extents do not reach
its size (e.g. one written extent, then a hole to its end) is not
``contiguous``, and its ``endblock`` is that of its last extent, not of its
last byte. Extents flagged ``unwritten`` (preallocated: the blocks hold
stale data, the file reads zeros) are in :data:`UNMAPPABLE` like the
other flags whose physical blocks do not hold the file's bytes; ``fastread
bmap`` counts the files with such extents. (Before: a trailing hole still
gave ``contiguous`` true, and ``unwritten`` was not unmappable.)

:func:`load_bmap` reads both this format and the seed's files as they are
(only ``startblock``/``endblock`` per key).
"""
import errno
import fcntl
import json
import os
import struct

from fastread._safe_open import open_fd, open_file

__all__ = ["fiemap", "build_bmap", "write_bmap", "load_bmap", "FIEMAP_FLAGS"]

_FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP = struct.Struct("=QQIIII")       # fm_start, fm_length, fm_flags, mapped, count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")    # logical, physical, length, reserved64[2], flags, reserved[3]
_EXTENTS_PER_CALL = 256
_FIEMAP_EXTENT_LAST = 0x1

#: FIEMAP extent flags (linux/fiemap.h).
FIEMAP_FLAGS = {
    0x1: "last", 0x2: "unknown", 0x4: "delalloc", 0x8: "encoded", 0x80: "data_encrypted",
    0x100: "not_aligned", 0x200: "data_inline", 0x400: "data_tail", 0x800: "unwritten",
    0x1000: "merged", 0x2000: "shared",
}
#: Flags that make an extent's physical address unusable for reading raw blocks.
UNMAPPABLE = {"unknown", "delalloc", "encoded", "data_encrypted", "not_aligned",
              "data_inline", "data_tail", "unwritten"}


def _flag_names(flags):
    return [name for bit, name in FIEMAP_FLAGS.items() if flags & bit and bit != 0x1]


def fiemap(path):
    """Every extent of ``path`` as ``(logical, physical, length, flags)`` in
    bytes, in file order. Raises OSError naming the path when the file
    system has no FIEMAP (e.g. tmpfs, some network file systems)."""
    out = []
    start = 0
    fd, _ = open_fd(path)   # a FIFO or device refused by name, not waited on
    try:
        while True:
            buf = bytearray(_FIEMAP.size + _EXTENT.size * _EXTENTS_PER_CALL)
            _FIEMAP.pack_into(buf, 0, start, (1 << 64) - 1 - start, _FIEMAP_FLAG_SYNC, 0,
                              _EXTENTS_PER_CALL, 0)
            try:
                fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf)
            except OSError as e:
                why = " (this file system has no FIEMAP)" if e.errno in (
                    errno.EOPNOTSUPP, errno.ENOTTY) else ""
                raise OSError(e.errno, f"FIEMAP failed{why}: {e.strerror}", path) from None
            mapped = _FIEMAP.unpack_from(buf, 0)[3]
            last = False
            for k in range(mapped):
                logical, physical, length, _r0, _r1, flags, _a, _b, _c = _EXTENT.unpack_from(
                    buf, _FIEMAP.size + k * _EXTENT.size)
                out.append((logical, physical, length, flags))
                last = bool(flags & _FIEMAP_EXTENT_LAST)
            if mapped == 0 or last:
                break
            start = out[-1][0] + out[-1][2]
    finally:
        os.close(fd)
    return out


def _entry(path, lba_size):
    st = os.stat(path)
    size = st.st_size
    extents = []
    for logical, physical, length, flags in fiemap(path):
        # Extents are whole file-system blocks; clip the last to the file's size.
        length = min(length, max(size - logical, 0))
        if length <= 0:
            continue
        extents.append({"logical": logical, "physical": physical, "length": length,
                        "startblock": physical // lba_size,
                        "endblock": (physical + length - 1) // lba_size,
                        "flags": _flag_names(flags)})
    entry = {"startblock": 0, "endblock": -1, "size": size, "lba_size": lba_size,
             "device": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
             "contiguous": size == 0, "extents": extents}
    if extents:
        first, last = extents[0], extents[-1]
        entry["startblock"] = first["startblock"]
        entry["endblock"] = last["endblock"]
        contiguous = all(b["physical"] == a["physical"] + a["length"]
                         and b["logical"] == a["logical"] + a["length"]
                         for a, b in zip(extents, extents[1:]))
        # Holes have no extent: one at the start, between or at the end
        # (the last extent short of the size) leaves bytes off the blocks.
        entry["contiguous"] = (contiguous and first["logical"] == 0
                               and last["logical"] + last["length"] == size)
    return entry


def build_bmap(file_root, *, lba_size=512, prefix=None, file_filters=None, progress=None):
    """The extent map of every sample of ``file_root`` (fastread.scan order):
    ``{"<prefix>/<class>/<file>": entry}`` with ``prefix`` the basename of
    ``file_root`` unless given (see the module doc for an entry)."""
    from fastread.index import scan

    if not isinstance(lba_size, int) or lba_size < 1:
        raise ValueError(f"lba_size must be a positive integer, got {lba_size!r}")
    root = os.fspath(file_root)
    if prefix is None:
        prefix = os.path.basename(os.path.normpath(os.path.abspath(root)))
    paths, _labels = scan(root, file_filters=file_filters)
    bar = None
    if progress is not False:
        import sys

        from tqdm import tqdm
        bar = tqdm(total=len(paths), desc="bmap", unit="file", file=sys.stderr, leave=False,
                   disable=None if progress is None else not progress)
    out = {}
    for p in paths:
        rel = os.path.relpath(p, root)
        key = f"{prefix}/{rel}" if prefix else rel
        out[key] = _entry(p, lba_size)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return out


def check_output_dir(path):
    """Raises FileNotFoundError / NotADirectoryError naming ``path`` when
    the directory it would be written in is missing or not a directory."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        if os.path.exists(d):
            raise NotADirectoryError(errno.ENOTDIR, f"{d!r} is not a directory", path)
        raise FileNotFoundError(errno.ENOENT, f"directory {d!r} does not exist", path)


def write_bmap(bmap, path):
    """Writes a bmap as JSON, atomically (temporary name, then rename).
    A missing directory raises FileNotFoundError naming ``path`` (not the
    temporary)."""
    path = os.fspath(path)
    check_output_dir(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(bmap, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _as_int(v, key, field, path):
    if isinstance(v, bool):
        v = None
    elif isinstance(v, str):
        try:
            v = int(v.strip(), 0)
        except ValueError:
            v = None
    elif isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int):
        raise ValueError(f"bmap {path!r}: {key!r} has a {field} that is not an integer")
    return v


def load_bmap(path):
    """Reads a bmap.json -- fastread's or the seed's -- into
    ``{name: {"startblock", "endblock", "size", "lba_size", "extents", ...}}``.

    Seed files carry only ``startblock``/``endblock`` (integers or integer
    strings); their entries get ``size``, ``lba_size`` and ``extents`` None.
    Raises ValueError naming the file and key of a malformed entry."""
    path = os.fspath(path)
    with open_file(path) as f:
        try:
            doc = json.load(f)
        except ValueError as e:
            raise ValueError(f"bmap {path!r} is not valid JSON: {e}") from None
        except RecursionError:
            raise ValueError(f"bmap {path!r}: its JSON is nested too deep to parse") from None
    if not isinstance(doc, dict):
        raise ValueError(f"bmap {path!r}: expected a JSON object of files")
    out = {}
    for key, v in doc.items():
        if not isinstance(v, dict) or "startblock" not in v or "endblock" not in v:
            raise ValueError(f"bmap {path!r}: {key!r} lacks startblock/endblock")
        e = dict(v)
        e["startblock"] = _as_int(v["startblock"], key, "startblock", path)
        e["endblock"] = _as_int(v["endblock"], key, "endblock", path)
        ext = v.get("extents")
        # Over several extents the last may lie before the first on disk, so
        # the order check holds only for one run of blocks.
        if e["startblock"] < 0 or (
                e["endblock"] < e["startblock"] - 1 and not (isinstance(ext, list) and len(ext) > 1)):
            raise ValueError(f"bmap {path!r}: {key!r} has startblock {e['startblock']} and "
                             f"endblock {e['endblock']}")
        for field in ("size", "lba_size"):
            e[field] = _as_int(v[field], key, field, path) if field in v else None
        if ext is not None:
            if not isinstance(ext, list):
                raise ValueError(f"bmap {path!r}: {key!r} has extents that are not a list")
            checked = []
            for x in ext:
                if not isinstance(x, dict) or not {"logical", "physical", "length"} <= set(x):
                    raise ValueError(f"bmap {path!r}: {key!r} has an extent without "
                                     "logical/physical/length")
                y = dict(x)
                for k in ("logical", "physical", "length"):
                    y[k] = _as_int(x[k], key, f"extent {k}", path)
                flags = x.get("flags", [])
                if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
                    raise ValueError(f"bmap {path!r}: {key!r} has extent flags that are not a "
                                     "list of strings")
                y["flags"] = list(flags)
                checked.append(y)
            ext = checked
        e["extents"] = ext
        out[key] = e
    return out
