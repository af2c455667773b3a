"""Packed images: a whole dataset in one file (or block device), every sample
starting at an aligned offset, so it can be read with block-level I/O
(``O_DIRECT``, whole aligned blocks, many reads in flight).

Layout of an image (``alignment`` is 4096 unless packed otherwise)::

    [0, alignment)        header block: HEADER (magic, version, alignment,
                          sample count, image size, image id, CRC-32 of the
                          header), then zeros
    [alignment, ...)      the samples in fastread.scan order, each starting at
                          a multiple of ``alignment``, zero-padded
    image size            a multiple of ``alignment``

The index is a separate file (``<image>.index`` unless named): one ASCII
header line ``FASTREAD-INDEX <version> <body bytes> <crc32 of body, hex>``,
then a JSON body with the format version, the image id and size, the
alignment, the checksum algorithm and, per sample, name (path relative to
FILE_ROOT), label, offset, length and checksum. Index version 2 (written by
decoded packs, ``pack(decode=True)``) adds ``encoding`` (``"raw"``: uint8
pixels; ``"jpeg"``: re-encoded), ``dtype``, per-sample ``shapes`` (H, W, C),
the ``preprocess`` that made them and the source files left out
(``skipped``: name and why); version 1 (plain packs, the files' bytes) has
none of them, and both read. A damaged index fails its
CRC; an index of another image fails the image id; a truncated image fails
the size check -- each with an error that says so.

Sample checksums are CRC-32 (``zlib.crc32``, the stdlib's C implementation:
fast, and it detects corruption; it is not a defence against tampering).

Packing is atomic: the image and the index are written under temporary names
in their directories, fsync'ed, and renamed only when complete; the header
block is written last. An interrupted pack leaves no image (a block device
has its header block zeroed first, so it holds no valid-looking image until
the pack completes); a killed one (SIGTERM, SIGKILL) leaves its hidden
temporaries, which the next pack of the same image removes.
"""
import errno
import os
import re
import stat
import struct
import sys
import uuid
import zlib

import numpy as np

from fastread._safe_open import open_fd
from fastread.engine import cached_context
from fastread.errors import ReadError, SpecialFileError
from fastread.image_index import (  # noqa: F401 (the index's names, as before its module)
    BINARY_FROM, INDEX_FORMAT, INDEX_MAGIC, INDEX_VERSION, INDEX_VERSION_BINARY,
    INDEX_VERSION_DECODED, INDEX_VERSIONS, ImageError, _encode_index, _load_index, _round_up,
    _url_ranges, verify_columns, write_index)
from fastread.index import scan
from fastread.names import NameTable
from fastread.s3 import S3Options, is_url
from fastread.source import FileList, FileRanges, read_in_order

__all__ = ["PackedImage", "ImageError", "pack", "verify", "index_path", "is_packed_image"]

MAGIC = b"FRIMAGE\0"
#: The image's header block layout (unchanged by index version 2).
VERSION = 1
#: What a sample's bytes are: the source file ("file", index version 1), raw
#: pixels or a re-encoded JPEG (decoded packs).
ENCODINGS = ("file", "raw", "jpeg")
CHECKSUM = "crc32"
# magic, version, alignment, count, image_size, image id (16 bytes)
_HEADER = struct.Struct("<8sIIQQ16s")
_HEADER_CRC = struct.Struct("<I")
_BLKGETSIZE64 = 0x80081272
#: The largest alignment packed or read: far beyond any block size, and
#: small enough that a crafted index cannot make a reader allocate without
#: bound.
MAX_ALIGNMENT = 1 << 30


def index_path(image):
    """The default index of an image: ``<image>.index`` (a str, also for a
    bytes path)."""
    return os.fsdecode(image) + ".index"


def is_packed_image(path):
    """Whether ``path`` names a packed image: a :class:`PackedImage`, or a
    local file with its index beside it (``<path>.index``, as :func:`pack`
    writes it), which is how loaders that take a tree or an image as their
    first argument tell them apart. An ``s3://`` URL is a tree's prefix
    there (an image in a bucket goes by ``image=``)."""
    if isinstance(path, PackedImage):
        return True
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    path = os.fsdecode(path)
    return not path.startswith("s3://") and os.path.isfile(path) and \
        os.path.isfile(index_path(path))


def _device_size(fd):
    import fcntl

    buf = bytearray(8)
    fcntl.ioctl(fd, _BLKGETSIZE64, buf)
    return struct.unpack("<Q", buf)[0]


def _open_region(path):
    """``(fd, bytes)`` of a regular file or block device, opened for
    reading (refusing anything else by name: :mod:`fastread._safe_open`);
    the caller closes ``fd``."""
    fd, st = open_fd(path, block_devices=True)
    try:
        return fd, st.st_size if stat.S_ISREG(st.st_mode) else _device_size(fd)
    except BaseException:
        os.close(fd)
        raise


def _header_block(alignment, count, image_size, image_id):
    head = _HEADER.pack(MAGIC, VERSION, alignment, count, image_size, image_id)
    head += _HEADER_CRC.pack(zlib.crc32(head))
    return head + bytes(alignment - len(head))


def _parse_header(raw, path):
    n = _HEADER.size
    if len(raw) < n + 4 or raw[:8] != MAGIC:
        raise ImageError(f"{path!r} is not a fastread packed image (no image header; "
                         "an interrupted pack leaves none)")
    if _HEADER_CRC.unpack_from(raw, n)[0] != zlib.crc32(raw[:n]):
        raise ImageError(f"the header block of image {path!r} is corrupt (CRC mismatch)")
    magic, version, alignment, count, image_size, image_id = _HEADER.unpack_from(raw)
    if version != VERSION:
        raise ImageError(f"image {path!r} has format version {version}; this fastread reads "
                         f"version {VERSION}")
    return {"alignment": alignment, "count": count, "image_size": image_size,
            "image_id": image_id.hex()}


# -- reading ---------------------------------------------------------------------

def _field_int(doc, key, where, minimum):
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or v >= 2**63:
        raise ImageError(f"{where}: {key} must be an integer >= {minimum}, got {v!r:.60}")
    return v


def _field_array(doc, key, dtype, where):
    """doc[key] as a 1-D array of integers that fit ``dtype`` (a version 3
    index's columns are arrays of that type already: used as they are)."""
    v = doc[key]
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind != np.dtype(dtype).kind or \
                v.dtype.itemsize != np.dtype(dtype).itemsize:
            raise ImageError(f"{where}: {key} is not a column of {np.dtype(dtype)}")
        return v
    info = np.iinfo(dtype)
    if not isinstance(v, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and info.min <= x <= info.max
            for x in v):
        raise ImageError(f"{where}: {key} must be a list of integers in {info.min}..{info.max}")
    return np.asarray(v, dtype=dtype).reshape(-1)


class PackedImage(FileRanges):
    """A packed image and its index.

    ``names`` (paths relative to the packed FILE_ROOT, in fastread.scan
    order), ``labels`` (int32), ``offsets`` / ``lengths`` (int64, bytes) and
    ``checksums`` (uint32 CRC-32) describe the samples; ``len()`` counts them.
    :meth:`read` returns the samples' bytes. Opening checks that the index is
    intact, that it belongs to the image, and that the image is not
    truncated; each failure raises :class:`ImageError` (or
    ``FileNotFoundError``) naming the file.

    A packed image is a sample source (:class:`fastread.source.FileRanges`):
    ``fastread.Reader(source=img)`` or ``image=`` reads it with range reads.

    ``path`` (and ``index``) may be ``s3://bucket/key`` URLs: an image is a
    large object read by ranges, so the s3 engine reads its samples with
    ranged GETs; the index is read by ranges too (its header line, then the
    body it announces) and the image checked by two (its header block and
    its last byte: no listing). ``s3``: an :class:`fastread.S3Options` (or a
    mapping) reaching the bucket, kept for reading the samples; None leaves
    it to the environment.
    """

    def __init__(self, path, index=None, *, s3=None):
        for name, value in (("path", path), ("index", index)):
            if value is not None and not isinstance(value, (str, bytes, os.PathLike)):
                raise TypeError(f"PackedImage {name} must be a path (str or os.PathLike), "
                                f"got {type(value).__name__}")
        # str paths, also from bytes ones: messages, URLs and "<path>.index" work on str.
        self.path = os.fsdecode(path)
        self.index_path = os.fsdecode(index) if index is not None else index_path(self.path)
        # How to reach the bucket of an s3:// image or index (None: the
        # environment); the samples are then read with these options too.
        self.s3 = S3Options.coerce(s3) if s3 is not None else None
        doc = _load_index(self.index_path, self.s3)
        where = f"index {self.index_path!r} is malformed"
        try:
            self.alignment = _field_int(doc, "alignment", where, 512)
            if self.alignment > MAX_ALIGNMENT or self.alignment & (self.alignment - 1):
                raise ImageError(f"{where}: alignment must be a power of two from 512 to "
                                 f"{MAX_ALIGNMENT}, got {self.alignment}")
            self.image_size = _field_int(doc, "image_size", where, 0)
            self.image_id = doc["image_id"]
            if not isinstance(self.image_id, str):
                raise ImageError(f"{where}: image_id is not a string")
            self.checksum = doc["checksum"]
            self.names = doc["names"]
            if not isinstance(self.names, NameTable) and (not isinstance(self.names, list) or
                                                          not all(isinstance(x, str)
                                                                  for x in self.names)):
                raise ImageError(f"{where}: names is not a list of strings")
            self.labels = _field_array(doc, "labels", np.int32, where)
            self.offsets = _field_array(doc, "offsets", np.int64, where)
            self.lengths = _field_array(doc, "lengths", np.int64, where)
            self.checksums = _field_array(doc, "checksums", np.uint32, where)
            count = _field_int(doc, "count", where, 0) if "count" in doc else len(self.names)
        except KeyError as e:
            raise ImageError(f"{where}: no {e.args[0]!r} field") from None
        self.file_root = doc.get("file_root")
        #: A local version-3 index's layout (image_index.py), else None: the
        #: native DALI operator maps the index with it (readers.image).
        self.mapped_layout = doc.get("mapped_layout")
        n = len(self.names)
        if not (len(self.labels) == len(self.offsets) == len(self.lengths)
                == len(self.checksums) == n == count):
            raise ImageError(f"index {self.index_path!r} is malformed: per-sample lists differ "
                             "in length")
        if self.checksum != CHECKSUM:
            raise ImageError(f"index {self.index_path!r} uses checksum {self.checksum!r}; "
                             f"this fastread knows {CHECKSUM!r}")
        # Reading every column is what a large version 3 index skips at
        # open (doc["verified"] False): a range outside the image then fails
        # when read, and verify() checks the columns' CRCs.
        self.index_verified = doc.get("verified", True)
        if n and self.index_verified and (self.offsets.min() < self.alignment or (self.offsets % self.alignment).any()
                  or self.lengths.min() < 0 or self.lengths.max() > self.image_size
                  or self.offsets.max() > self.image_size
                  or (self.offsets + self.lengths).max() > self.image_size):
            raise ImageError(f"index {self.index_path!r} is malformed: a sample lies outside "
                             "the image or off its alignment")
        self._decoded_fields(doc, n)
        self._check_image()
        # The checks above are the image's own (with their ImageError
        # messages); FileRanges adds the range-source behaviour.
        super().__init__(self.path, self.offsets, self.lengths, self.labels, self.names,
                         checked=True)

    def _decoded_fields(self, doc, n):
        """Index version 2's fields (a version 1 index: the files' bytes)."""
        where = f"index {self.index_path!r} is malformed"
        self.version = doc.get("version", INDEX_VERSION)
        self.encoding = doc.get("encoding", "file")
        self.preprocess = doc.get("preprocess")
        skipped = doc.get("skipped", [])
        if not isinstance(self.version, int) or not isinstance(self.encoding, str) or (
                self.preprocess is not None and not isinstance(self.preprocess, dict)) or (
                not isinstance(skipped, list) or not all(
                    isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x)
                    for x in skipped)):
            raise ImageError(f"{where}: version, encoding, preprocess or skipped is not of "
                             "its type")
        self.skipped = [tuple(x) for x in skipped]
        self.dtype = None
        self.shapes = None
        if self.encoding not in ENCODINGS:
            raise ImageError(f"index {self.index_path!r}: samples encoded as {self.encoding!r}; "
                             f"this fastread knows {', '.join(ENCODINGS)}")
        if self.encoding == "file":
            return
        if self.version < INDEX_VERSION_DECODED:
            raise ImageError(f"{where}: encoding {self.encoding!r} in a version "
                             f"{self.version} index")
        try:
            self.dtype = np.dtype(doc["dtype"])
            shapes = doc["shapes"]
        except KeyError as e:
            raise ImageError(f"{where}: no {e.args[0]!r} field") from None
        except (TypeError, ValueError):
            raise ImageError(f"{where}: dtype {doc['dtype']!r:.40} is not a NumPy dtype") from None
        if self.dtype.kind not in "uif" or self.dtype.itemsize > 8:
            raise ImageError(f"{where}: dtype {self.dtype} is not a pixel type")
        if isinstance(shapes, np.ndarray):   # a version 3 column, (n, 3) int64
            if shapes.shape != (n, 3) or (doc.get("verified", True) and n and (
                    shapes.min() <= 0 or shapes.max() >= 2**31)):
                raise ImageError(f"{where}: shapes must be one [H, W, C] of positive integers "
                                 "per sample")
        elif (not isinstance(shapes, list) or len(shapes) != n or not all(
                isinstance(s, list) and len(s) == 3 and all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 < x < 2**31 for x in s)
                for s in shapes)):
            raise ImageError(f"{where}: shapes must be one [H, W, C] of positive integers per "
                             "sample")
        self.shapes = shapes if isinstance(shapes, np.ndarray) else np.asarray(
            shapes, dtype=np.int64).reshape(n, 3)
        if self.encoding == "raw" and n and doc.get("verified", True):
            # H * W * C * itemsize can wrap around int64 (2**30 * 2**30 * 16
            # is 0), and pixels() would then reshape a sample's bytes to a
            # shape they do not hold. H * W < 2**62 and C * itemsize < 2**34
            # do not: compare length / (C * itemsize) with H * W instead.
            hw = self.shapes[:, 0] * self.shapes[:, 1]
            per_pixel = self.shapes[:, 2] * self.dtype.itemsize
            wrong = (self.lengths % per_pixel != 0) | (self.lengths // per_pixel != hw)
            if wrong.any():
                i = int(np.flatnonzero(wrong)[0])
                raise ImageError(f"{where}: sample {self.names[i]!r} has "
                                 f"{int(self.lengths[i])} bytes, its shape "
                                 f"{self.shapes[i].tolist()} of {self.dtype} needs another "
                                 "number")

    @property
    def decoded(self):
        """True when the samples are pixels (raw) or re-encoded images
        (jpeg) made at pack time, not the source files' bytes."""
        return self.encoding != "file"

    @property
    def sample_shape(self):
        """The one (H, W, C) every sample has, or None (shapes differ, or
        the samples are not decoded)."""
        if self.shapes is None or not len(self.shapes):
            return None
        first = self.shapes[0]
        return tuple(int(x) for x in first) if (self.shapes == first).all() else None

    def pixels(self, data, i):
        """Sample ``i``'s bytes ``data`` (as read) viewed as its (H, W, C)
        array of ``dtype``: no copy. Raw decoded images only."""
        if self.encoding != "raw":
            raise ValueError(f"image {self.path!r} holds {self.encoding!r} samples, not raw "
                             "pixels (pack with decode=True, encode='raw')")
        return np.asarray(data).view(self.dtype).reshape(tuple(self.shapes[i]))

    def _check_image(self):
        if is_url(self.path):
            raw = self._check_object()
        else:
            try:
                fd, size = _open_region(self.path)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "packed image not found",
                                        self.path) from None
            except SpecialFileError as e:
                raise ImageError(f"image {self.path!r} is neither a regular file nor a block "
                                 f"device ({e.kind})") from None
            with open(fd, "rb") as f:
                if size < self.image_size:
                    raise ImageError(f"image {self.path!r} is truncated: {size} bytes, its "
                                     f"index {self.index_path!r} describes {self.image_size}")
                raw = f.read(_HEADER.size + _HEADER_CRC.size)
        head = _parse_header(raw, self.path)
        if head["image_id"] != self.image_id:
            raise ImageError(f"index {self.index_path!r} does not belong to image {self.path!r} "
                             f"(image id {head['image_id']}, the index is of "
                             f"{self.image_id}): pack again or pass the matching index=")
        if (head["count"], head["image_size"], head["alignment"]) != (
                len(self.names), self.image_size, self.alignment):
            raise ImageError(f"index {self.index_path!r} does not match image {self.path!r} "
                             "(sample count, size or alignment differ)")

    def _check_object(self):
        """An s3:// image: its header block and its last byte in one call of
        two ranged GETs (no listing or HEAD: an object too short for the
        index's size fails the second range). Returns the header block."""
        what = (f"image {self.path!r} (its index {self.index_path!r} describes "
                f"{self.image_size} bytes)")
        try:
            raw, _ = _url_ranges(self.path, [0, max(self.image_size, self.alignment) - 1],
                                 [_HEADER.size + _HEADER_CRC.size, 1], self.s3, what)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise FileNotFoundError(errno.ENOENT, "packed image not found",
                                        self.path) from None
            raise
        return raw

    def __len__(self):
        return len(self.names)

    def __repr__(self):
        return (f"PackedImage({self.path!r}, {len(self)} samples, {self.image_size} bytes, "
                f"alignment {self.alignment})")

    def check_options(self, options):
        """Raises ValueError if O_DIRECT reads of this image cannot be aligned."""
        if options.get("o_direct") and self.alignment % int(options.get("direct_alignment") or 4096):
            raise ValueError(f"image {self.path!r} is packed with alignment {self.alignment}, "
                             f"not a multiple of direct_alignment "
                             f"{options.get('direct_alignment')}: read it without o_direct or "
                             "pack it again with --alignment")

    #: The name this check had before images were sample sources.
    check_engine_options = check_options


# -- packing ---------------------------------------------------------------------

def _pwrite_all(fd, data, offset):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _fsync_dir(path):
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_file(a, b):
    """True when paths ``a`` and ``b`` name one file: the same absolute
    path, or (both existing) the same inode."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): different paths are different files
        return False


def _tmp_name(path):
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _check_parent(path, what):
    """Raises FileNotFoundError / NotADirectoryError naming ``path`` when
    its directory is missing or not a directory."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        if os.path.exists(d):
            raise NotADirectoryError(errno.ENOTDIR, f"the {what}'s directory {d!r} is not a "
                                     "directory", path)
        raise FileNotFoundError(errno.ENOENT, f"the {what}'s directory {d!r} does not exist",
                                path)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_stale_temporaries(path):
    """Removes the temporaries of an earlier pack to ``path`` (names made by
    _tmp_name) whose process no longer runs: a pack killed by a signal
    runs no cleanup, and leaves a full-size hidden file."""
    d, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"\.{re.escape(base)}\.tmp-([0-9]+)-[0-9a-f]{{8}}")
    try:
        entries = list(os.scandir(d))
    except OSError:
        return   # unreadable directory: creating the temporary will say so
    for e in entries:
        m = pattern.fullmatch(e.name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        try:
            if e.is_file(follow_symlinks=False):
                os.unlink(e.path)
        except FileNotFoundError:
            pass   # another pack removed it first


def _progress(total, enabled, desc):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, dynamic_ncols=True,
                disable=None if enabled is None else not enabled, leave=False)


def pack(file_root, out, *, index=None, alignment=4096, block_device=False, batch_size=256,
         engine="auto", workers=None, prefetch=None, progress=None, file_filters=None,
         on_batch=None, decode=False, resize=None, max_side=None, crop=None, encode="raw",
         quality=90, skip_bad=False, decode_workers=None, decoder="auto", decode_device=None,
         index_format="auto", split=None, **engine_options):
    """Packs the samples of ``file_root`` (fastread.scan order and labels)
    into the image ``out`` and writes its index (``<out>.index`` unless
    ``index`` is given). Returns the :class:`PackedImage`.

    Reads with the native engines, ``batch_size`` samples at a time, and
    writes each batch at once, so memory stays bounded by a few batches.
    ``block_device=True`` is required to write onto a block device (which
    must then be named explicitly, with an explicit ``index`` path); a file
    is written under a temporary name and renamed when complete.

    A pack killed by a signal (SIGTERM, SIGKILL: no cleanup runs; this
    library installs no signal handlers) leaves its temporaries, hidden
    ``.<name>.tmp-<pid>-<random>`` files next to the image and the index.
    Each pack first removes those of the same image and index whose process
    is no longer alive on this machine (so on a file system shared between
    machines, do not pack to one path from two hosts at once).
    ``index_format``: ``"json"`` (index versions 1 and 2, readable by older
    fastread), ``"binary"`` (version 3: memory-mapped columns, 32 bytes a
    sample plus names, :mod:`fastread.image_index`) or ``"auto"``, binary
    from ``BINARY_FROM`` (2^20) samples on.
    ``file_root`` may be a Parquet data set (a ``.parquet`` file or a
    directory of them, e.g. the Hub's ``data/<split>-*.parquet``; ``split``
    chooses the files of one split): its rows are packed in order, each
    row's image bytes read by fastread's engine and Arrow
    (:mod:`fastread.formats.parquet_rows`), its label from the label column
    and its name ``<class>/<path>`` from the ``ClassLabel`` names and the
    image's ``path`` field, so a set written from a class tree packs into
    the image that tree packs into. With ``decode=True`` Pillow decodes
    them (DALI's decoder here reads files). A null image value fails the
    pack naming the row (with ``decode=True`` and ``skip_bad``, it is left
    out).
    ``progress``: None shows a bar when stderr is a terminal. ``on_batch(i)``
    is called after batch ``i`` is written (for tests and progress hooks).

    ``decode=True`` decodes every image once, here, instead of storing the
    files' bytes (:mod:`fastread.decode`; ``decode_workers`` processes,
    default one per CPU): RGB, resized (``resize``: shorter side; or
    ``max_side``: longer side at most), center-cropped to ``crop`` x
    ``crop`` if given, stored as ``encode="raw"`` uint8 HWC pixels or
    ``"jpeg"`` at ``quality``; the index (version 2) records each sample's
    shape. A file that cannot be decoded fails the pack with ImageError
    naming it, or with ``skip_bad=True`` is left out and listed in the
    index (``PackedImage.skipped``).

    ``decoder``: "pillow" (a process per CPU), "dali" (DALI's
    ``fn.decoders.image``, nvImageCodec, on ``decode_device`` "gpu" or
    "cpu"; :mod:`fastread.decode_dali`) or "auto" (Pillow; DALI on the GPU
    with ``decode_device="gpu"``):
    :func:`fastread.decode.choose_decoder` decides, and the index's
    ``preprocess`` records which (``"decoder"``) and why. With DALI,
    ``batch_size`` files go through the pipeline at a time and
    ``decode_workers`` is its thread count; the files DALI cannot decode
    but Pillow can are decoded by Pillow and listed
    (``preprocess["decoded_by_pillow"]``).
    """
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 512
            or alignment > MAX_ALIGNMENT or alignment & (alignment - 1)):
        raise ValueError(f"alignment must be a power of two from 512 to {MAX_ALIGNMENT}, "
                         f"got {alignment!r}")
    pre = choice = None
    if decode:
        from fastread.decode import Preprocess, choose_decoder
        pre = Preprocess(resize=resize, max_side=max_side, crop=crop, encode=encode,
                         quality=quality)
        choice = choose_decoder(decoder, decode_device)
        if choice.name == "dali" and decode_workers is not None and (
                isinstance(decode_workers, bool) or not isinstance(decode_workers, int)
                or decode_workers < 1):
            raise ValueError(f"decode_workers (DALI's threads, --decode-workers) must be a "
                             f"positive integer with decoder {choice.label!r}, got "
                             f"{decode_workers!r} (0, decoding in this process, is Pillow's)")
    else:
        given = [k for k, v in (("resize", resize), ("max_side", max_side), ("crop", crop),
                                ("skip_bad", skip_bad or None),
                                ("decode_workers", decode_workers),
                                ("decoder", None if decoder == "auto" else decoder),
                                ("decode_device", decode_device)) if v is not None]
        if given or encode != "raw" or quality != 90:
            raise ValueError(f"{', '.join(given) or 'encode/quality'} apply only with "
                             "decode=True (--decode)")
    if index_format not in ("auto", "json", "binary"):
        raise ValueError(f"index_format must be 'auto', 'json' or 'binary', got "
                         f"{index_format!r}")
    out = os.fsdecode(out)
    root = os.fspath(file_root)
    if index is not None:
        index = os.fsdecode(index)
        # Renaming the image onto `out` and then the index onto the same
        # path would leave only the index: refuse before anything is read.
        if _same_file(out, index):
            raise ValueError(f"the index {index!r} and the image {out!r} are the same file: "
                             "name another index path (default: <image>.index)")
    is_dev = os.path.exists(out) and stat.S_ISBLK(os.stat(out).st_mode)
    if is_dev and not block_device:
        raise ValueError(f"{out!r} is a block device: pass block_device=True (--block-device) "
                         "to overwrite it")
    if block_device and not is_dev:
        raise ValueError(f"block_device=True but {out!r} is not a block device")
    if is_dev and index is None:
        raise ValueError(f"packing onto block device {out!r} needs an explicit index path")
    if index is None:
        index = index_path(out)
    if os.path.isdir(out):
        raise IsADirectoryError(errno.EISDIR, "image path is a directory", out)
    # Before the data set is read, and naming the user's paths rather than
    # the temporaries that would fail to be created there.
    _check_parent(out, "image")
    _check_parent(index, "index")
    for p in ((index,) if is_dev else (out, index)):
        _remove_stale_temporaries(p)

    rows = _parquet_rows(root, split, file_filters, choice)
    if rows is None:
        paths, labels = scan(root, file_filters=file_filters)
        names = [os.path.relpath(p, root) for p in paths]
    else:   # paths: the rows' names for messages, made on demand
        paths, labels, names = rows.names, rows.labels, rows.pack_names

    image_id = uuid.uuid4().bytes
    tmp_image = out if is_dev else _tmp_name(out)
    tmp_index = _tmp_name(index)
    fd = -1
    done = False
    batches = None
    try:
        if is_dev:
            fd = os.open(out, os.O_WRONLY | os.O_CLOEXEC)
            capacity = _device_size(fd)
            _pwrite_all(fd, bytes(alignment), 0)  # no valid header until complete
            os.fsync(fd)
        else:
            fd = os.open(tmp_image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            capacity = None
            _pwrite_all(fd, bytes(alignment), 0)
        offsets = np.empty(len(paths), dtype=np.int64)
        lengths = np.empty(len(paths), dtype=np.int64)
        sums = np.empty(len(paths), dtype=np.uint32)
        kept = np.empty(len(paths), dtype=np.int64)   # source index of each stored sample
        shapes = []
        skipped = []
        pos = alignment
        bar = _progress(len(paths), progress, f"pack {os.path.basename(out)}")
        k = 0   # samples stored
        i = 0   # source files done
        if rows is not None:
            batches = chunks = _parquet_chunks(rows, pre, batch_size, decode_workers, engine,
                                               engine_options)
        elif pre is None:
            batches = read_in_order(FileList(paths, labels), batch_size, engine, workers=workers,
                                    prefetch=prefetch, **engine_options)
            chunks = ([(a, None, None) for a in arrays] for arrays, _labels in batches)
        elif choice.name == "dali":
            from fastread.decode_dali import DaliDecoder
            dali = DaliDecoder(pre, device=choice.device, batch_size=batch_size,
                               threads=decode_workers, engine=engine, workers=workers,
                               prefetch=prefetch, **engine_options)
            batches = chunks = dali.batches(paths)
        else:
            from fastread.decode import decoded_batches
            batches = decoded_batches(paths, pre, workers=decode_workers)
            chunks = batches
        try:
            for b, items in enumerate(chunks):
                start = pos
                chunk = bytearray()
                for data, shape, why in items:
                    if why is not None:
                        if not skip_bad:
                            raise ImageError(f"cannot decode {paths[i]!r}: {why} (skip_bad=True "
                                             "/ --skip-bad leaves such files out)")
                        skipped.append((names[i], why))
                        i += 1
                        continue
                    view = memoryview(data).cast("B")
                    n = len(view)
                    offsets[k], lengths[k], sums[k] = pos, n, zlib.crc32(view)
                    kept[k] = i
                    if shape is not None:
                        shapes.append(list(shape))
                    chunk += view
                    pad = _round_up(n, alignment) - n
                    if pad:
                        chunk += bytes(pad)
                    pos += n + pad
                    k += 1
                    i += 1
                if capacity is not None and pos > capacity:
                    raise OSError(errno.ENOSPC, f"the samples need more than the device's "
                                  f"{capacity} bytes", out)
                _pwrite_all(fd, chunk, start)
                if bar is not None:
                    bar.update(len(items))
                if on_batch is not None:
                    on_batch(b)
        finally:
            batches.close()  # stops the native reader or the decoding pool now, also on an error
        if bar is not None:
            bar.close()
        image_size = max(pos, alignment)
        if not is_dev:
            os.ftruncate(fd, image_size)
        os.fsync(fd)
        _pwrite_all(fd, _header_block(alignment, k, image_size, image_id), 0)
        os.fsync(fd)
        os.close(fd)
        fd = -1

        kept = kept[:k]
        doc = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "image_id": image_id.hex(),
               "image_size": image_size, "alignment": alignment, "checksum": CHECKSUM,
               "count": k, "file_root": os.path.abspath(root),
               "names": [names[j] for j in kept], "labels": labels[kept].tolist(),
               "offsets": offsets[:k].tolist(), "lengths": lengths[:k].tolist(),
               "checksums": sums[:k].tolist()}
        if pre is not None:
            doc_pre = pre.as_dict(choice)
            if choice.name == "dali":
                doc_pre["decoded_by_pillow"] = [names[j] for j in sorted(dali.by_pillow)]
            doc.update(version=INDEX_VERSION_DECODED, encoding=pre.encode, dtype="uint8",
                       shapes=shapes, preprocess=doc_pre,
                       skipped=[list(x) for x in skipped])
        with open(tmp_index, "xb") as f:
            write_index(f, doc, binary=index_format == "binary" or (
                index_format == "auto" and k >= BINARY_FROM))
            f.flush()
            os.fsync(f.fileno())
        # The image first: until the index follows, the old index (if any)
        # names another image id and is refused.
        if not is_dev:
            os.replace(tmp_image, out)
            _fsync_dir(out)
        os.replace(tmp_index, index)
        _fsync_dir(index)
        done = True
    finally:
        if fd >= 0:
            os.close(fd)
        if not done:
            for p in ((tmp_index,) if is_dev else (tmp_image, tmp_index)):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
    return PackedImage(out, index=index)


def _parquet_rows(root, split, file_filters, choice):
    """The Parquet source ``root`` names (its ``pack_names`` set), or None
    for a tree of image files."""
    from fastread.formats.parquet_rows import is_parquet_root, row_names
    if is_url(root) or not is_parquet_root(root):
        if split is not None:
            raise ValueError(f"split= chooses files of a Parquet data set; {root!r} is not one")
        return None
    if file_filters is not None:
        raise ValueError(f"{root!r} is a Parquet data set: file_filters apply to trees of files")
    if choice is not None and choice.name == "dali":
        raise ValueError(f"packing the Parquet data set {root!r} decoded: DALI's decoder "
                         "(decoder='dali', or a GPU decode device) reads files here; choose "
                         "decoder='pillow' (--decoder pillow)")
    from fastread.formats import Parquet
    src = Parquet(root, split=split)
    src.pack_names = row_names(src)
    return src


def _parquet_chunks(src, pre, batch_size, decode_workers, engine, engine_options):
    """Lists of (payload, shape, why) for the rows of Parquet source ``src``,
    in order: the bytes as they are (``pre`` None, batch_size rows a list)
    or decoded by Pillow's processes (a null row: why says so)."""
    import io
    from fastread.formats.parquet_rows import row_blobs
    blobs = row_blobs(src, engine, **engine_options)
    if pre is not None:
        from fastread.decode import decoded_batches
        return decoded_batches((None if b is None else io.BytesIO(b) for b in blobs), pre,
                               workers=decode_workers)

    def plain():
        chunk = []
        for i, b in enumerate(blobs):
            if b is None:
                raise ValueError(f"{src.sample_name(i)}: a null {src.image!r} value: no bytes "
                                 "to pack")
            chunk.append((b, None, None))
            if len(chunk) == batch_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
    return plain()


def verify(image, index=None, *, batch_size=256, engine="auto", progress=None,
           **engine_options):
    """Reads every sample of a packed image and checks its CRC-32. Returns a
    list of ``(name, why)`` for every bad sample (empty: all good). Opening
    errors (truncated image, corrupt or mismatched index) raise."""
    img = image if isinstance(image, PackedImage) else PackedImage(image, index=index)
    if not img.index_verified:   # a large version 3 index: its columns' CRCs, then the samples
        verify_columns(img.index_path, img.s3)
    ctx = cached_context(engine, **engine_options)
    bad = []
    bar = _progress(len(img), progress, f"verify {os.path.basename(img.path)}")
    for start in range(0, len(img), batch_size):
        idx = np.arange(start, min(start + batch_size, len(img)))
        batch = img.read_batch(ctx, idx)
        failed = dict(batch.failures())
        for j, a in enumerate(batch.arrays()):
            i = int(idx[j])
            if j in failed:
                bad.append((img.names[i], f"cannot read: {ReadError(failed[j], img.path)}"))
            elif zlib.crc32(a) != int(img.checksums[i]):
                bad.append((img.names[i], f"checksum mismatch (crc32 {zlib.crc32(a):08x}, "
                                          f"index says {int(img.checksums[i]):08x})"))
        batch.release()
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    return bad
