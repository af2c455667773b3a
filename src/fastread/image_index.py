"""The index of a packed image: reading and writing its two forms.

An index starts with one ASCII line ``FASTREAD-INDEX <version> <body bytes>
<crc32 of body, hex>``. Versions 1 and 2 (see :mod:`fastread.image`) follow
it with a JSON body holding every per-sample field as JSON lists: readable by
any tool and by older fastread, but ~150-350 bytes a sample in Python
objects and seconds per million samples to parse.

Version 3 is the same document in binary, for data sets at their real size:
the line's body is a small JSON ``meta`` (everything but the per-sample
fields, plus where each column lies and its CRC-32); after it, 64-byte
aligned, the columns ``offsets`` (int64), ``lengths`` (int64), ``labels``
(int32), ``checksums`` (uint32), the names as one blob plus ``n + 1``
``name_offsets`` (int64; :class:`fastread.names.NameTable`) and, for decoded
packs, ``shapes`` (int64, n x 3). Opening maps the file and views the columns
in place: 32 bytes a sample plus the names' bytes, paged in as read, so a
10^8-sample index opens without reading it. Columns are CRC-checked at open
when they total at most :data:`VERIFY_BELOW` bytes; a larger index has its
meta and layout checked at open, and its columns by :func:`fastread.image.verify`
(which reads everything anyway). Little-endian throughout.
"""
import errno
import json
import mmap
import os
import zlib

import numpy as np

from fastread._safe_open import open_fd
from fastread.engine import cached_context
from fastread.errors import SpecialFileError
from fastread.names import NameTable
from fastread.s3 import is_url

#: Index versions: 1, samples are the source files' bytes; 2, decoded packs
#: (encoding, dtype, shapes, preprocess, skipped); 3, either in binary
#: columns. Plain packs of fewer than BINARY_FROM samples still write 1, so
#: older fastread reads them; a decoded pack is refused there by version.
INDEX_VERSION = 1
INDEX_VERSION_DECODED = 2
INDEX_VERSION_BINARY = 3
INDEX_VERSIONS = (INDEX_VERSION, INDEX_VERSION_DECODED, INDEX_VERSION_BINARY)
INDEX_MAGIC = "FASTREAD-INDEX"
INDEX_FORMAT = "fastread-packed-image"
#: ``pack(index_format="auto")`` writes version 3 from this many samples on
#: (where the JSON forms cost hundreds of MB and seconds to open).
BINARY_FROM = 1 << 20
#: Version 3 columns up to this many bytes in all are CRC-checked at open.
VERIFY_BELOW = 256 << 20
_ALIGN = 64
#: (column, dtype, values per sample); shapes only in decoded packs.
_COLUMNS = (("offsets", "<i8", 1), ("lengths", "<i8", 1), ("labels", "<i4", 1),
            ("checksums", "<u4", 1), ("name_offsets", "<i8", None), ("names", "|u1", None),
            ("shapes", "<i8", 3))
_PER_SAMPLE = ("names", "labels", "offsets", "lengths", "checksums", "shapes")


class ImageError(ValueError):
    """A packed image or its index is unusable: truncated, corrupt, or the
    two do not belong together. The message names the file and why."""


def _round_up(v, a):
    return -(-v // a) * a


def _encode_index(doc):
    body = json.dumps(doc, separators=(",", ":")).encode()
    head = f"{INDEX_MAGIC} {doc['version']} {len(body)} {zlib.crc32(body):08x}\n".encode()
    return head + body


# The index's header line ("FASTREAD-INDEX <version> <body bytes> <crc>\n")
# fits in this many bytes (a 20-digit length and 8 hex digits included).
_INDEX_HEAD_MAX = 64


def _url_ranges(url, offsets, lengths, s3, what):
    """The byte ranges of the object ``url`` as bytes, read in one call on
    this thread's s3 context. A range the object does not hold raises
    ImageError saying ``what`` is truncated; any other failure OSError with
    the engine's words (URL, HTTP status, S3 code; never a secret)."""
    from fastread.engine import EngineOptions

    ctx = cached_context("s3", EngineOptions(s3=s3))
    batch = ctx.read_ranges(url, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64))
    failures = batch.failures()
    if failures:
        i, err = failures[0]
        said = ctx.sample_error(i) or f"{url}: {os.strerror(err)}"
        if err == errno.ENODATA:
            raise ImageError(f"{what} is truncated ({said})")
        raise OSError(err, said)
    return [a.tobytes() for a in batch.arrays()]


def _index_body_length(head):
    """``(end of the header line, body bytes it announces)`` of an index's
    first bytes, or None when they hold no header line of the right shape
    (_load_index then says what is wrong with it)."""
    nl = head.find(b"\n")
    parts = head[:nl].decode("ascii", "replace").split(" ") if nl > 0 else []
    if len(parts) != 4 or parts[0] != INDEX_MAGIC or not parts[2].isdigit():
        return None
    return nl, int(parts[2])


def _version_of(head):
    """The version a header line announces (None where it has none)."""
    nl = head.find(b"\n")
    parts = head[:nl].decode("ascii", "replace").split(" ") if nl > 0 else []
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


class _Source:
    """Where an index's bytes come from: a local regular file (mapped for
    version 3) or an s3:// object read by ranges, so an index is read like
    the image it describes. Only what the header line announces is read."""

    def __init__(self, path, s3):
        self.path, self.s3 = path, s3
        self.fd = None
        if is_url(path):
            try:
                self.head = _url_ranges(path, [0], [_INDEX_HEAD_MAX], s3, f"index {path!r}")[0]
            except ImageError:
                self.head = b""   # shorter than any index: a bad header line
            except OSError as e:
                if e.errno == errno.ENOENT:
                    raise FileNotFoundError(errno.ENOENT, "index of the packed image not "
                                            "found (pass index= if it lives elsewhere)",
                                            path) from None
                raise
            self.size = None
            return
        try:
            # Refused unread, without waiting for a FIFO's writer.
            self.fd, st = open_fd(path)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "index of the packed image not found "
                                    "(pass index= if it lives elsewhere)", path) from None
        except SpecialFileError as e:
            raise ImageError(f"index {path!r} is not a regular file ({e.kind})") from None
        self.size = st.st_size
        self.head = os.pread(self.fd, _INDEX_HEAD_MAX, 0)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self, offset, length):
        """``length`` bytes at ``offset`` (ImageError where the index ends first)."""
        if self.fd is None:
            return _url_ranges(self.path, [offset], [length], self.s3,
                               f"index {self.path!r}")[0]
        out = bytearray()
        while len(out) < length:
            chunk = os.pread(self.fd, length - len(out), offset + len(out))
            if not chunk:
                raise ImageError(f"index {self.path!r} is truncated")
            out += chunk
        return bytes(out)


def _read_json_body(src):
    """A version 1/2 index's bytes: its header line, then exactly the body
    it announces (a local file's size must be header plus body: a device or
    the image named as the index is refused without reading it)."""
    found = _index_body_length(src.head)
    if found is None:
        return src.head   # _parse_head names what is wrong with it
    nl, length = found
    if src.size is not None and nl + 1 + length != src.size:
        raise ImageError(f"index {src.path!r} is corrupt: {src.size - nl - 1} bytes of body, "
                         f"its header says {length} (truncated or appended to)")
    return src.head[:nl + 1] + src.read(nl + 1, length) if length else src.head[:nl + 1]


def _parse_head(data, path):
    """``(version, body)`` of an index's header line and the body after it,
    checked against the line's length and CRC-32."""
    nl = data.find(b"\n", 0, 200)
    parts = data[:nl].decode("ascii", "replace").split(" ") if nl > 0 else []
    if len(parts) != 4 or parts[0] != INDEX_MAGIC:
        raise ImageError(f"index {path!r} is corrupt or not a fastread image index (bad "
                         "header line)")
    try:
        version, length, crc = int(parts[1]), int(parts[2]), int(parts[3], 16)
    except ValueError:
        raise ImageError(f"index {path!r} is corrupt (bad header line)") from None
    # Only the form pack writes: int() also takes "A" for "a" in the CRC (a
    # flipped case bit) or a sign, so a damaged header could still parse.
    if parts[1:] != [str(version), str(length), f"{crc:08x}"]:
        raise ImageError(f"index {path!r} is corrupt (bad header line)")
    if version not in INDEX_VERSIONS:
        raise ImageError(f"index {path!r} has format version {version}; this fastread reads "
                         f"versions {', '.join(map(str, INDEX_VERSIONS))}")
    body = data[nl + 1:nl + 1 + length]
    if len(body) != length:
        raise ImageError(f"index {path!r} is corrupt: {len(body)} bytes of body, its header "
                         f"says {length} (truncated or appended to)")
    if zlib.crc32(body) != crc:
        raise ImageError(f"index {path!r} is corrupt (CRC-32 of its body does not match)")
    return version, body, nl + 1 + length


def _parse_doc(body, version, path):
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise ImageError(f"index {path!r} is corrupt (invalid JSON: {e})") from None
    except RecursionError:   # nested deeper than the interpreter's stack (CRC fixed up)
        raise ImageError(f"index {path!r} is corrupt (its JSON is nested too deep to "
                         "parse)") from None
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
        raise ImageError(f"index {path!r} is not a fastread image index")
    if doc.get("version", version) != version:
        raise ImageError(f"index {path!r} is corrupt: its header line says version {version}, "
                         f"its body {doc.get('version')!r}")
    return doc


def _load_index(path, s3=None):
    """The index document: a dict with the per-sample fields as JSON lists
    (versions 1, 2) or as read-only arrays viewing the mapped file and a
    :class:`NameTable` (version 3; ``doc["verified"]`` says whether the
    columns' CRCs were checked). Errors name the index."""
    src = _Source(path, s3)
    try:
        if _version_of(src.head) == INDEX_VERSION_BINARY:
            return _load_binary(src)
        data = _read_json_body(src)
        version, body, _ = _parse_head(data, path)
        return _parse_doc(body, version, path)
    finally:
        src.close()


# -- version 3: binary columns -----------------------------------------------------

def _load_binary(src):
    path = src.path
    found = _index_body_length(src.head)
    if found is None:
        raise ImageError(f"index {path!r} is corrupt (bad header line)")
    nl, length = found
    if length > 1 << 30:
        raise ImageError(f"index {path!r} is corrupt (a {length}-byte meta)")
    head = src.head[:nl + 1] + (src.read(nl + 1, length) if length else b"")
    version, body, meta_end = _parse_head(head, path)
    doc = _parse_doc(body, version, path)
    where = f"index {path!r} is malformed"
    data_start = _round_up(meta_end, _ALIGN)
    columns, data_bytes, count = doc.get("columns"), doc.get("data_bytes"), doc.get("count")
    if not isinstance(columns, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62
            for v in (data_bytes, count)):
        raise ImageError(f"{where}: no columns, data_bytes or count")
    size = data_start + data_bytes
    if src.size is not None and src.size != size:
        raise ImageError(f"index {path!r} is corrupt: {src.size} bytes, its meta describes "
                         f"{size} (truncated or appended to)")
    layout = {}
    for name, dtype, per in _COLUMNS:
        spec = columns.get(name)
        if spec is None:
            continue
        if not (isinstance(spec, list) and len(spec) == 3 and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62
                for v in spec)):
            raise ImageError(f"{where}: column {name!r} is not [offset, bytes, crc32]")
        offset, nbytes, crc = spec
        itemsize = np.dtype(dtype).itemsize
        want = None if per is None else count * per * itemsize
        if name == "name_offsets":
            want = (count + 1) * itemsize
        if offset % _ALIGN or offset + nbytes > data_bytes or nbytes % itemsize or (
                want is not None and nbytes != want):
            raise ImageError(f"{where}: column {name!r} lies outside the index or has "
                             f"{nbytes} bytes for {count} samples")
        layout[name] = (data_start + offset, nbytes, crc, dtype)
    missing = [c for c in ("offsets", "lengths", "labels", "checksums", "name_offsets", "names")
               if c not in layout]
    if missing:
        raise ImageError(f"{where}: no {missing[0]!r} column")
    if src.fd is not None:
        buf = mmap.mmap(src.fd, size, prot=mmap.PROT_READ) if size else b""
        if size and hasattr(mmap, "MADV_RANDOM"):
            # A shuffled batch touches a page of each column per sample: no
            # read-around, which would page in up to MBs per fault.
            buf.madvise(mmap.MADV_RANDOM)
    else:   # an s3:// index: its columns in one more ranged read
        buf = head + bytes(data_start - len(head)) + (
            src.read(data_start, data_bytes) if data_bytes else b"")
    verified = data_bytes <= VERIFY_BELOW
    arrays = {}
    for name, (offset, nbytes, crc, dtype) in layout.items():
        if verified and zlib.crc32(memoryview(buf)[offset:offset + nbytes]) != crc:
            raise ImageError(f"index {path!r} is corrupt (CRC-32 of its {name} column does "
                             "not match)")
        arrays[name] = np.frombuffer(buf, dtype=np.dtype(dtype),
                                     count=nbytes // np.dtype(dtype).itemsize, offset=offset)
    doc["names"] = NameTable(arrays.pop("names"), arrays.pop("name_offsets"))
    if verified:
        try:
            doc["names"].check(where)
        except ValueError as e:
            raise ImageError(str(e)) from None
    for name, arr in arrays.items():
        doc[name] = arr.reshape(count, 3) if name == "shapes" else arr
    doc["verified"] = verified
    doc["column_crcs"] = {name: spec[2] for name, spec in layout.items()}
    if src.fd is not None:
        # Where a local index's columns lie (file offsets and bytes) and its
        # header line (whose CRC covers this layout): what the native DALI
        # operator maps the index with (image_index=), no list per sample.
        doc["mapped_layout"] = {"path": path, "head": src.head[:nl + 1].decode("ascii"),
                                "bytes": size, "count": count,
                                "columns": {name: (at, nbytes)
                                            for name, (at, nbytes, _, _) in layout.items()}}
    return doc


def verify_columns(path, s3=None):
    """CRC-checks every column of a version 3 index (which opening skips
    above VERIFY_BELOW); raises ImageError naming the index and the column."""
    src = _Source(path, s3)
    try:
        if _version_of(src.head) != INDEX_VERSION_BINARY:
            return
        doc = _load_binary(src)
    finally:
        src.close()
    if doc["verified"]:
        return
    views = {"names": doc["names"].blob, "name_offsets": doc["names"].offsets}
    for name, crc in doc["column_crcs"].items():
        arr = views[name] if name in views else doc[name]
        got = 0
        flat = arr.reshape(-1).view(np.uint8)
        for start in range(0, len(flat), 64 << 20):
            got = zlib.crc32(flat[start:start + (64 << 20)], got)
        if got != crc:
            raise ImageError(f"index {path!r} is corrupt (CRC-32 of its {name} column does "
                             "not match)")


def write_index(f, doc, binary):
    """Writes ``doc`` (per-sample fields as lists or arrays) to the open
    binary file ``f``: the JSON form of its version, or version 3."""
    if not binary:
        f.write(_encode_index(doc))
        return
    n = doc["count"]
    names = doc["names"]
    table = names if isinstance(names, NameTable) else NameTable.from_names(names)
    cols = {"offsets": np.asarray(doc["offsets"], "<i8"),
            "lengths": np.asarray(doc["lengths"], "<i8"),
            "labels": np.asarray(doc["labels"], "<i4"),
            "checksums": np.asarray(doc["checksums"], "<u4"),
            "name_offsets": np.asarray(table.offsets, "<i8"),
            "names": np.asarray(table.blob, "|u1")}
    if doc.get("shapes") is not None:
        cols["shapes"] = np.asarray(doc["shapes"], "<i8").reshape(n, 3)
    meta = {k: v for k, v in doc.items() if k not in _PER_SAMPLE}
    meta["version"] = INDEX_VERSION_BINARY
    layout, pos = {}, 0
    for name, arr in cols.items():
        pos = _round_up(pos, _ALIGN)
        layout[name] = [pos, arr.nbytes, zlib.crc32(arr.reshape(-1).view(np.uint8))]
        pos += arr.nbytes
    meta.update(columns=layout, data_bytes=pos)
    body = json.dumps(meta, separators=(",", ":")).encode()
    head = f"{INDEX_MAGIC} {INDEX_VERSION_BINARY} {len(body)} {zlib.crc32(body):08x}\n".encode()
    start = _round_up(len(head) + len(body), _ALIGN)
    f.write(head + body + bytes(start - len(head) - len(body)))
    written = 0
    for name, arr in cols.items():
        gap = layout[name][0] - written
        f.write(bytes(gap))
        f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
        written += gap + arr.nbytes
