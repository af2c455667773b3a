"""WebDataset tar shards as a sample source.

A shard is a POSIX tar file (``.tar``, or ``.tar.gz`` / ``.tgz``); a sample
is the run of consecutive members that share a *key* -- the member's path up
to the first dot of its base name -- and each member is one *component*,
named by its extension (the rest of the base name): ``n01/img_7.jpg`` and
``n01/img_7.cls`` are components ``jpg`` and ``cls`` of sample
``n01/img_7``. That is the webdataset library's grouping
(``base_plus_ext`` + ``group_by_keys``): only regular files count, names
``__*__`` at the top level are shard metadata and skipped, a key seen again
after another key starts a new sample, and a component twice in one sample
is an error.

Index: every shard's headers are parsed once, when the source is built
(:func:`index_tar`; plain Python over an ``mmap``, strict: a header whose
checksum does not match, a truncated member, a shard that is not a tar all
raise :class:`fastread.formats.FormatError` naming the shard and the byte
offset -- Python's ``tarfile`` ends the archive silently at a bad header
after the first). The members of one sample are consecutive in the tar, so
a sample is read as *one byte range* spanning them (their headers and
padding included) and each component is a zero-copy view of it.

Gzip'd shards cannot be read as ranges: each is decompressed once, with
zlib, into ``cache_dir`` (a plain tar beside the others, reused while the
shard is unchanged), and read as ranges from there. The cache is bounded
(``cache_bytes``; :mod:`fastread.formats._cache` says how), and so is each
decompression (:mod:`fastread.formats._gzip`: memory per step, the total
``max_inflated``, and the tar's own headers followed as they are inflated).

Shards in S3 (``s3://bucket/key.tar`` URLs, read by the s3 engine): each
is indexed from its bytes, streamed once when the source is built (a few
shards per native call, so memory stays bounded), and then read one of two
ways (``s3_read``): ``"ranges"``, every sample a ranged GET of its members
(any order: a global shuffle), or ``"whole"``, every shard a streamed
object cut into its samples in memory (shard order: no shuffle, or the
shuffle buffer). ``None`` picks by the order, from what was measured on
SeaweedFS (see :data:`S3_READ_RULE`). Gzip'd shards in S3 are refused.

Shuffling: the index makes every sample addressable, so
:class:`fastread.Reader` shuffles over all samples of all shards (one
permutation per epoch, as for files), not shard order plus a buffer as
streaming loaders must.
"""
import collections.abc
import mmap
import os
import time
import warnings
import zlib

import numpy as np

from fastread._safe_open import open_file

from fastread.engine import EngineOptions, cached_context
from fastread.files import raise_failures
from fastread.formats import _cache, _gzip, _index_files, _s3_tar
from fastread.formats._index_files import split_name
from fastread.formats._multi import MultiFileRanges, _Names
from fastread.formats._wds_whole import _WholeShards
from fastread.formats.cifar import FormatError
from fastread.s3 import S3Options, is_url
from fastread.source import FileRanges

__all__ = ["WebDataset", "TarMember", "index_tar", "split_name", "group_members",
           "MISSING_BEHAVIORS", "INDEXERS"]

MISSING_BEHAVIORS = ("empty", "skip", "error")
#: How shards without an index file are indexed: in the C core (several at
#: once, the GIL released) or by the Python reference code (index_tar).
INDEXERS = ("native", "python")
_BLOCK = 512


class TarMember(tuple):
    """(name, data offset, size) of one regular file in a tar."""
    __slots__ = ()

    def __new__(cls, name, offset, size, header):
        return tuple.__new__(cls, (name, offset, size, header))

    name = property(lambda self: self[0])
    offset = property(lambda self: self[1])
    size = property(lambda self: self[2])
    header = property(lambda self: self[3])   # offset of the member's first header


def _octal(field, shard, at, what):
    """A tar numeric field: octal text, or GNU base-256 (high bit set)."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] & 0x40:
            raise FormatError(shard, at, f"negative {what} in the tar header")
        return value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise FormatError(shard, at, f"tar header {what} {text[:20]!r} is not an octal "
                                     "number") from None


def _pax_records(data, shard, at):
    out = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            break
        sp = data.find(b" ", pos)
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise FormatError(shard, at, "malformed pax extended header") from None
        if sp < 0 or length <= 0 or pos + length > len(data):
            raise FormatError(shard, at, "malformed pax extended header")
        rec = data[sp + 1:pos + length - 1]
        k, _, v = rec.partition(b"=")
        out[k.decode("utf-8", "replace")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def index_tar(buf, shard):
    """The regular files of a tar held in ``buf`` (bytes or mmap) as a list
    of :class:`TarMember`; ``shard`` names it in errors. Raises FormatError
    naming the shard and the byte offset for anything that is not a
    well-formed tar."""
    n = len(buf)
    if n == 0:
        raise FormatError(shard, 0, "empty file (not a tar archive)")
    out = []
    pos = 0
    long_name = None
    pax = {}
    while True:
        if pos + _BLOCK > n:
            if pos == n and pos > 0:
                return out   # no end-of-archive blocks: accepted, as tar does
            raise FormatError(shard, pos, f"truncated tar header ({n - pos} of 512 bytes)")
        header = buf[pos:pos + _BLOCK]
        if header.count(0) == _BLOCK:
            return out       # end of archive
        try:
            stored = _octal(header[148:156], shard, pos, "checksum")
        except FormatError as e:
            if pos:
                raise
            raise FormatError(shard, 0, "not a tar archive (its first header's "
                                        f"{str(e).rsplit(': ', 1)[-1]})") from None
        computed = sum(header[:148]) + 8 * 32 + sum(header[156:])
        if stored != computed:
            what = ("not a tar archive" if pos == 0 else "tar header checksum error")
            raise FormatError(shard, pos, f"{what} (header checksum {stored} stored, "
                                          f"{computed} computed)")
        size = _octal(header[124:136], shard, pos, "size")
        kind = header[156:157]
        data = pos + _BLOCK
        end = data + size
        if end > n:
            raise FormatError(shard, pos, f"member data runs past the end of the shard "
                                          f"({size} bytes from {data}, shard is {n} bytes): "
                                          "truncated")
        if kind == b"L":          # GNU long name of the next member
            long_name = bytes(buf[data:end]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind == b"x":        # pax header of the next member
            pax = _pax_records(bytes(buf[data:end]), shard, pos)
        elif kind in (b"0", b"\0", b"7"):
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise FormatError(shard, pos, f"pax size {pax['size']!r}") from None
                end = data + size
                if end > n:
                    raise FormatError(shard, pos, "member data runs past the end of the shard: "
                                                  "truncated")
            if long_name is not None:
                name = long_name
            elif "path" in pax:
                name = pax["path"]
            else:
                name = header[:100].split(b"\0", 1)[0]
                prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
                name = (prefix + b"/" + name if prefix else name).decode("utf-8",
                                                                         "surrogateescape")
            out.append(TarMember(name, data, size, pos))
            long_name, pax = None, {}
        else:                      # directories, links, devices, global pax: no data files
            long_name, pax = None, {}
        pos = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK


class _TarBound:
    """What a tar can need, checked while it is inflated (the ``bound`` of
    :func:`fastread.formats._gzip.gunzip_to`): headers are followed where
    their declared sizes place them, and the first byte the archive cannot
    hold fails at once (FormatError naming the shard and the inflated
    offset): a header that is none, a member declared past ``limit``, more
    than :attr:`TAIL` bytes after the end-of-archive block. The rest of what
    index_tar checks it leaves to index_tar."""

    #: Bytes a tar may carry past its end-of-archive block: the zero
    #: padding to a record (10240 bytes by default; 1 MiB at tar -b 2048).
    TAIL = 1 << 20
    #: The largest pax header whose records are read for a ``size``.
    PAX_MAX = 1 << 20

    def __init__(self, shard, limit):
        self.shard, self.limit = shard, limit
        self.seen = 0          # inflated bytes fed
        self.at = 0            # where the next header (or pax data) starts
        self.need = _BLOCK     # bytes needed there
        self.pax_at = None     # the pax header whose data is needed, if any
        self.pax_size = None   # the next member's size, from a pax header
        self.end = None        # the end-of-archive block, once met
        self.held = bytearray()   # inflated bytes from `at` on, while fewer than `need`

    def feed(self, data):
        start, self.seen = self.seen, self.seen + len(data)
        if self.end is None and self.seen > self.at:
            self.held += memoryview(data)[max(0, self.at - start):]
            while self.end is None and len(self.held) >= self.need:
                was = self.at
                self._step(bytes(self.held[:self.need]))
                del self.held[:self.at - was]   # all of it when `at` lies past what is held
        if self.end is not None and self.seen - self.end > self.TAIL:
            raise FormatError(self.shard, self.end, "the inflated stream goes on past the end "
                              f"of its tar archive (more than {self.TAIL} bytes after the "
                              "end-of-archive block): a decompression bomb, or data appended "
                              "to the archive")

    def _step(self, block):
        pos = self.at
        if self.pax_at is not None:     # a pax header's data: the next member's size
            size = _pax_records(block, self.shard, self.pax_at).get("size")
            try:
                self.pax_size = None if size is None else int(size)
            except ValueError:
                raise FormatError(self.shard, self.pax_at, f"pax size {size!r}") from None
            self.at, self.need, self.pax_at = pos + _round_block(len(block)), _BLOCK, None
            return
        if block.count(0) == _BLOCK:
            self.end = pos
            return
        try:
            stored = _octal(block[148:156], self.shard, pos, "checksum")
        except FormatError as e:   # worded as index_tar words it
            if pos:
                raise
            raise FormatError(self.shard, 0, "not a tar archive (its first header's "
                                             f"{str(e).rsplit(': ', 1)[-1]})") from None
        computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
        if stored != computed:
            what = "not a tar archive" if pos == 0 else "tar header checksum error"
            raise FormatError(self.shard, pos, f"{what} (header checksum {stored} stored, "
                                               f"{computed} computed)")
        size = _octal(block[124:136], self.shard, pos, "size")
        kind = block[156:157]
        if kind in (b"0", b"\0", b"7") and self.pax_size is not None:
            size = self.pax_size
        if kind != b"L":
            self.pax_size = None
        data = pos + _BLOCK
        if data + size > self.limit:
            raise FormatError(self.shard, pos, f"a member declares {size} bytes from byte "
                              f"{data}: more than the {self.limit} bytes the shard may inflate "
                              "to (max_inflated)")
        if kind == b"x" and size > self.PAX_MAX:
            self.at = _NOWHERE   # a pax header too long to read: index_tar judges the rest
        elif kind == b"x" and size:
            self.at, self.need, self.pax_at = data, size, pos
        else:
            self.at = data + _round_block(size)


_NOWHERE = 1 << 80   # an offset no stream reaches


def _round_block(size):
    return (size + _BLOCK - 1) // _BLOCK * _BLOCK


def _plain_tar(path, cache_dir, limit):
    """The path of a plain tar holding shard ``path``: itself, or its
    decompressed copy in ``cache_dir`` (made once per shard version, within
    ``limit`` bytes and what the tar's headers declare)."""
    if not path.endswith((".gz", ".tgz")):
        return path
    return _cache.cached_copy(path, cache_dir, ".tar", lambda p, dest: _gzip.gunzip_to(
        p, dest, limit=limit, bound=_TarBound(p, limit)))


class _Shard(FileRanges):
    """A shard's samples as byte ranges of its (plain) tar; errors name the
    shard as the user gave it. Built over an index's columns (views: no
    copy, no object per sample; names decoded from the key blob when asked)."""

    def __init__(self, shard, tar_path, offsets, lengths, keys):
        self.path = os.fspath(tar_path)
        self.offsets = np.asarray(offsets, np.int64)
        # uint32 lengths (a version-3 index's) stay views: widened, every
        # shard's slice would be a copy (800 MB at 10^8 samples).
        lengths = np.asarray(lengths)
        self.lengths = lengths if lengths.dtype == np.uint32 else np.asarray(lengths, np.int64)
        self.names = keys
        # One zero for every sample (a read-only view, not an array of them).
        self.labels = np.broadcast_to(np.int32(0), (len(self.offsets),))
        self.shard = shard

    def sample_name(self, i):
        return f"{self.shard}[{self.names[i]}]"


class _LocalIndex:
    """Samples' numbers inside their shards, computed for the samples asked
    (``local_index[idx]``) from the shard numbers and the shards' first
    sample numbers, instead of a column of 4-8 bytes a sample. A shard
    number that does not hold the sample (a damaged index file) is a
    FormatError naming the index."""

    nbytes = 0

    def __init__(self, starts, file_ids, where):
        self._starts, self._files, self._where = starts, file_ids, where

    def __len__(self):
        return int(self._starts[-1])

    def __getitem__(self, idx):
        scalar = np.ndim(idx) == 0
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        f = np.asarray(self._files[idx], dtype=np.int64)
        nshards = len(self._starts) - 1
        fc = np.minimum(f, nshards - 1)
        bad = (f >= nshards) | (idx < self._starts[fc]) | (idx >= self._starts[fc + 1])
        if bad.any():
            raise FormatError(self._where or "index", 0, f"damaged index: sample "
                                                        f"{int(idx[bad.argmax()])} is not in "
                                                        f"its shard ({int(f[bad.argmax()])})")
        out = idx - self._starts[f]
        return int(out[0]) if scalar else out


class _Keys(collections.abc.Sequence):
    """Sample keys of one shard, from an index's key blob (decoded per access)."""

    def __init__(self, index, first, n):
        self._index, self._first, self._n = index, first, n

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._index.key(self._first + i)

    def __eq__(self, other):
        """Equal to any sequence of the same keys (a list of str, as FileRanges.names)."""
        if not isinstance(other, collections.abc.Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None


#: Shards of s3:// URLs indexed per native call: each is read whole to be
#: indexed, so this bounds the memory indexing takes (8 shards of 16 MB).
S3_INDEX_GROUP = 8

S3_READS = ("ranges", "whole")

#: s3_read=None: "whole" where the Reader goes through the shards in order
#: (no random_shuffle, or a shuffle_buffer), "ranges" for a global shuffle,
#: which whole shards cannot serve (every batch would touch most shards).
#: Measured on SeaweedFS on loopback (2 shared cores, 8 shards of 16 MB,
#: ~100 KB samples, batch 64; bench/s3/s3_webdataset.py, medians of 3 rounds):
#: whole 3289 samples/s, ranges in order 738, ranges shuffled 483. Whole
#: shards cost two ranged GETs of 8 MiB each; ranges one GET per sample,
#: whose per-request cost (a filer lookup and a response each) dominates.
S3_READ_RULE = "whole in shard order, ranges for a global shuffle"


class _Slices:
    """An array's bytes as index_tar reads a buffer: len() and slices as
    bytes (copies of a header or a long name each, not of the shard)."""

    def __init__(self, array):
        self._view = memoryview(array)

    def __len__(self):
        return len(self._view)

    def __getitem__(self, key):
        return self._view[key].tobytes()


def _index_objects(urls, s3):
    """``{url: (members, size)}`` of tar shards in S3: each object read
    whole (streamed once, in parts, by the s3 engine) and its headers
    parsed from memory, ``S3_INDEX_GROUP`` shards per call."""
    out = {}
    ctx = cached_context("s3", EngineOptions(s3=s3))
    for at in range(0, len(urls), S3_INDEX_GROUP):
        group = urls[at:at + S3_INDEX_GROUP]
        batch = ctx.read(group)
        raise_failures(batch, lambda i: group[i], context=ctx)
        for url, data in zip(group, batch.arrays()):
            if len(data) == 0:
                raise FormatError(url, 0, "empty object (not a tar archive)")
            out[url] = (index_tar(_Slices(data), url), len(data))
        del data
        batch.release()
    return out


#: Threads the native indexer runs on (at most; and at most the CPUs usable).
_INDEX_THREADS = 4


def _python_part(shard, members, wanted, fold, source):
    """One shard's columns grouped by the Python reference code."""
    before = source.skipped
    starts, ends, keys, offs, lens = source._group(shard, members, wanted, fold)
    skipped, source.skipped = source.skipped - before, before
    enc = [k.encode("utf-8", "surrogateescape") for k in keys]
    key_off = np.zeros(len(enc) + 1, np.uint64)
    if enc:
        key_off[1:] = np.cumsum([len(k) for k in enc])
    return {"start": starts, "length": ends - starts, "comp_off": offs, "comp_len": lens,
            "keys": b"".join(enc), "key_off": key_off, "skipped": skipped}


def group_members(shard, names, name_off, data_off, sizes, ext, *,
                  missing_component_behavior="empty", case_sensitive_extensions=True,
                  grouping="webdataset", header_off=None):
    """Groups one shard's tar members into WebDataset samples, natively,
    exactly as :class:`WebDataset` groups a local shard: ``names`` (bytes,
    every member's name one after another), ``name_off`` (uint64, members
    + 1 entries: name i is ``names[name_off[i]:name_off[i+1]]``),
    ``data_off`` and ``sizes`` (uint64 per member: where its data starts in
    the shard, its length), ``header_off`` (where its header starts;
    default ``data_off - 512``, only used in error messages). The other
    arguments are WebDataset's. Returns the columns: a dict of ``start``,
    ``length`` (uint64 per sample), ``comp_off`` (int64 (samples, len(ext)),
    from the sample's start, -1: missing), ``comp_len``, ``keys`` +
    ``key_off`` (the keys as one blob) and ``skipped``. Raises FormatError
    naming ``shard`` as WebDataset does. (The S3 header walk hands its
    members here.)"""
    import types

    from fastread import _formats

    ext = [ext] if isinstance(ext, str) else list(ext)
    fold = (lambda x: x) if case_sensitive_extensions else str.lower
    wanted = {}
    for k, entry in enumerate(ext):
        for alt in str(entry).split(";"):
            wanted.setdefault(fold(alt.strip()), k)
    if missing_component_behavior not in MISSING_BEHAVIORS:
        raise ValueError(f"missing_component_behavior must be one of {MISSING_BEHAVIORS}, "
                         f"got {missing_component_behavior!r}")
    out = None
    if case_sensitive_extensions or all(w.isascii() for w in wanted):
        enc = [(w.encode("utf-8", "surrogateescape"), j) for w, j in wanted.items()]
        out = _formats.group_members(names, name_off, data_off, sizes, len(ext), enc,
                                     not case_sensitive_extensions, grouping == "dali",
                                     MISSING_BEHAVIORS.index(missing_component_behavior), True)
    if out is not None:
        return out
    no = np.asarray(name_off).tolist()
    do, sz = np.asarray(data_off).tolist(), np.asarray(sizes).tolist()
    ho = [d - _BLOCK for d in do] if header_off is None else np.asarray(header_off).tolist()
    blob = bytes(names)
    members = [TarMember(blob[no[i]:no[i + 1]].decode("utf-8", "surrogateescape"), do[i], sz[i],
                         ho[i]) for i in range(len(do))]
    ns = types.SimpleNamespace(ext=ext, grouping=grouping, skipped=0,
                               missing_component_behavior=missing_component_behavior)
    ns._group = types.MethodType(WebDataset._group, ns)
    return _python_part(shard, members, wanted, fold, ns)


def _members_part(shard, members, source):
    """Columns of one shard from its members (names, name_off, data_off, sizes)."""
    return group_members(shard, *members, source.ext,
                         missing_component_behavior=source.missing_component_behavior,
                         case_sensitive_extensions=source.case_sensitive,
                         grouping=source.grouping)


def _as_dtype(a, signed, unsigned):
    """``a`` as ``unsigned``: a view where it is ``signed`` and contiguous
    (the values are non-negative), else a copy."""
    a = np.asarray(a)
    if a.dtype == signed and a.flags.c_contiguous:
        return a.view(unsigned)
    return np.ascontiguousarray(a, dtype=unsigned)


class WebDataset(MultiFileRanges):
    """The samples of WebDataset tar shards ``paths`` (plain or gzip'd; see
    the module's documentation), with the components ``ext`` (a list; each
    entry one extension or several alternatives separated by ``;``, as in
    DALI's ``fn.readers.webdataset``).

    ``missing_component_behavior`` (DALI's): ``"empty"`` gives a missing
    component as an empty array, ``"skip"`` drops samples lacking one
    (``skipped`` counts them), ``"error"`` raises FormatError naming the
    shard, the sample's key and its offset. ``case_sensitive_extensions``
    (default True, as DALI; the webdataset library lower-cases). Each
    sample is one byte range; :meth:`components` cuts a batch into one list
    of views per ``ext`` entry. Labels are the samples' numbers.

    ``grouping="dali"`` groups as DALI's reader does where it differs from
    the webdataset library: ``__*__`` members are not skipped, a name with
    no extension is a sample of its own (with no components), and a sample
    with none of the ``ext`` components is kept (empty) rather than dropped.

    ``max_inflated`` (bytes, or a size such as ``"64GiB"``; None:
    ``$FASTREAD_FORMATS_MAX_INFLATED``, else 16 GiB): the most a gzip'd
    shard may inflate to (:mod:`fastread.formats._gzip`).

    Shards may be ``s3://`` URLs (all of them, or none): ``s3`` (an
    :class:`fastread.S3Options` or a mapping; None: the environment) reaches
    the bucket, and ``s3_read`` says how samples are read ("ranges",
    "whole" or None: see the module's documentation).
    """

    def __init__(self, paths, ext, missing_component_behavior="empty",
                 case_sensitive_extensions=True, cache_dir=None, grouping="webdataset",
                 cache_bytes=None, s3=None, s3_read=None, max_inflated=None, index_paths=None,
                 index_cache=None, indexer="native"):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ValueError("WebDataset needs at least one shard path")
        urls = [p for p in self.paths if is_url(p)]
        if urls and len(urls) != len(self.paths):
            raise ValueError(f"WebDataset shards must all be s3:// URLs or all local paths "
                             f"(one reader reads them with one engine): got {urls[0]!r} and "
                             f"{next(p for p in self.paths if not is_url(p))!r}")
        if s3_read not in (None,) + S3_READS:
            raise ValueError(f"s3_read must be None (by the reading order), 'ranges' or "
                             f"'whole', got {s3_read!r}")
        self.s3 = S3Options.coerce(s3) if s3 is not None else None
        self.s3_read = s3_read
        gz = [u for u in urls if u.endswith((".gz", ".tgz"))]
        if gz:
            raise ValueError(f"gzip'd shards cannot be read from S3 by ranges: {gz[0]!r} "
                             "(decompress the shards before uploading them)")
        indexed = _s3_tar.index_objects(urls, self.s3, index_tar, TarMember) if urls else {}
        if isinstance(ext, str):
            ext = [ext]
        self.ext = list(ext)
        if not self.ext:
            raise ValueError("ext must name at least one component")
        if missing_component_behavior not in MISSING_BEHAVIORS:
            raise ValueError(f"missing_component_behavior must be one of {MISSING_BEHAVIORS}, "
                             f"got {missing_component_behavior!r}")
        self.missing_component_behavior = missing_component_behavior
        if grouping not in ("webdataset", "dali"):
            raise ValueError(f"grouping must be 'webdataset' or 'dali', got {grouping!r}")
        self.grouping = grouping
        self.case_sensitive = bool(case_sensitive_extensions)
        fold = (lambda s: s) if self.case_sensitive else str.lower
        wanted = {}
        for k, entry in enumerate(self.ext):
            for alt in str(entry).split(";"):
                wanted.setdefault(fold(alt.strip()), k)
        self.cache_dir = cache_dir = _cache.cache_dir_for("webdataset", cache_dir)
        limit = _cache.cache_bytes(cache_bytes)
        inflated = _gzip.max_inflated(max_inflated)
        self.skipped = 0
        if indexer not in INDEXERS:
            raise ValueError(f"indexer must be one of {INDEXERS}, got {indexer!r}")
        self.indexer = indexer
        self._wanted, self._fold = wanted, fold
        self.spec = {"ext": self.ext, "case_sensitive": self.case_sensitive,
                     "grouping": self.grouping, "missing": self.missing_component_behavior}
        #: Where the index came from: "built" (native or python), "cache",
        #: "index_paths" or "beside" (files next to the shards).
        self.index_origin = None
        if urls and index_paths is not None:
            raise ValueError("index_paths are read for local shards only: s3:// shards are "
                             "indexed from their headers")
        if urls:
            tars = list(self.paths)
            parts = [_python_part(u, indexed[u][0], wanted, fold, self) for u in urls]
            index = _index_files.WdsIndex.from_parts(
                self.spec, [{"path": u, "size": indexed[u][1], "mtime_ns": 0} for u in urls],
                parts)
            self._tar_sizes = [indexed[u][1] for u in urls]
            self.index_origin = "built"
        else:
            tars = [_plain_tar(path, cache_dir, inflated) for path in self.paths]
            index = self._local_index(tars, index_paths, index_cache)
            self._tar_sizes = [int(r["size"]) if t == p else os.path.getsize(t)
                               for t, p, r in zip(tars, self.paths, index.shards)]
        self.skipped = index.skipped
        self.index = index
        first, _ends = index.shard_bounds()
        shards = [_Shard(path, tar, index.start[a:a + n], index.length[a:a + n],
                         _Keys(index, a, n))
                  for path, tar, a, n in zip(self.paths, tars, first.tolist(),
                                             index.counts.tolist())]
        if any(t != p for t, p in zip(tars, self.paths)):
            _cache.prune(cache_dir, limit, keep=[t for t, p in zip(tars, self.paths) if t != p])
        self._set_index_columns(shards, index)
        self._empty = np.zeros(0, np.uint8)

    def _set_index_columns(self, shards, index):
        """MultiFileRanges' per-sample columns as the index's own (views of
        it, mapped from a .fridx file or not): the shard numbers (uint32,
        the native reader's file column), the sizes (uint32 or uint64, its lengths),
        the labels; the number of a sample inside its shard is computed per
        batch (:class:`_LocalIndex`), not kept. Nothing here reads a
        column: a 10^8-sample index opens without paging it in."""
        self.files = shards
        self._table = None
        self.starts = np.r_[0, np.cumsum(index.counts)].astype(np.int64)
        self.file_index = index.file_ids
        self.local_index = _LocalIndex(self.starts, self.file_index, index.source)
        self.names = _Names(self.files, self.starts)
        # The native table's lengths: a view of the index's (uint32 where
        # it fits, read in place by fr_reader_open_table32; int64 viewed as
        # uint64).
        self._sizes = (index.length if index.length.dtype == np.uint32
                       else _as_dtype(index.length, np.int64, np.uint64))
        self.labels = index.labels
        # Per component: its length (uint32 where it fits) here, where it
        # starts in its sample in the index (tar blocks where they fit);
        # component_ranges picks a batch's in one NumPy call each.
        self.component_lengths = index.comp_len

    @property
    def component_offsets(self):
        """Every sample's component offsets in bytes from its start (int64
        (samples, len(ext)), -1: missing), decoded from the index (which
        keeps them in tar blocks where they fit): a copy, for inspection;
        reading uses :meth:`component_ranges`."""
        return self.index.comp_offsets()

    def batch_labels(self, batch, indices):
        """A batch's labels: the samples' numbers (the Reader asks for these
        rather than gathering the labels column)."""
        return np.asarray(indices, dtype=np.int64).astype(np.int32)

    def _local_index(self, tars, index_paths, index_cache):
        """The index of local shards: from ``index_paths`` (stale or for
        another spec: refused), else the node-local cache, else files beside
        the shards (stale ones ignored), else built (and cached)."""
        spec, paths = self.spec, self.paths
        if index_paths is not None:
            self.index_origin = "index_paths"
            return _index_files.load_index_paths(index_paths, paths, tars, spec,
                                                   self._members_part)
        stats = [_index_files.identity(p) for p in paths]
        directory = _index_files.cache_dir(index_cache)
        entry = None
        if directory is not None:
            entry = _index_files.cache_path(directory, spec,
                                            [(p, sz, mt) for p, (sz, mt) in zip(paths, stats)])
            if os.path.exists(entry):
                try:
                    index = _index_files.open_fridx(entry)
                    index.check_spec(spec, entry)
                    index.check_fresh(paths, entry)
                    self.index_origin = "cache"
                    _index_files.cache_touch(entry)
                    return index
                except (FormatError, OSError):
                    pass   # a damaged or raced entry: rebuilt below, and replaced
        index = _index_files.beside_index(paths, tars, spec, self._members_part)
        if index is not None:
            self.index_origin = "beside"
        else:
            index = self._build_index(paths, tars, stats)
            self.index_origin = "built"
        # A shard modified in the last RACY_NS may be modified again within
        # the file system's timestamp granularity (a few ms) with the same
        # size: its identity would not change, so it is not cached (git's
        # "racy" rule); the index is built again next time.
        racy = time.time_ns() - _index_files.RACY_NS
        if entry is not None and all(mt < racy for _sz, mt in stats):
            try:
                os.makedirs(directory, exist_ok=True)
                index.write(entry)
                _index_files.cache_prune(directory)
            except OSError as e:
                warnings.warn(f"fastread: the WebDataset index of {len(paths)} shards could "
                              f"not be cached in {directory!r} ({e}); it is rebuilt next time",
                              RuntimeWarning, stacklevel=4)
        return index

    def _members_part(self, shard, members):
        return _members_part(shard, members, self)

    def _build_index(self, paths, tars, stats):
        """Indexes the shards' tars: in the C core (a few threads, the GIL
        released) unless ``indexer="python"``; a shard the C core does not
        finish (any error, or a case it leaves to the reference code) is
        redone by the Python reference code, which raises its worded
        FormatError for a bad shard."""
        wanted, fold = self._wanted, self._fold
        native = self.indexer == "native" and (self.case_sensitive or all(
            w.isascii() for w in wanted))
        results = [None] * len(tars)
        if native:
            from fastread import _formats

            enc = [(w.encode("utf-8", "surrogateescape"), j) for w, j in wanted.items()]
            threads = min(len(tars), _INDEX_THREADS, len(os.sched_getaffinity(0)) or 1)
            results = _formats.index_files(
                tars, len(self.ext), enc, not self.case_sensitive, self.grouping == "dali",
                MISSING_BEHAVIORS.index(self.missing_component_behavior), True, threads)
        parts = []
        for path, tar, res in zip(paths, tars, results):
            if isinstance(res, dict):
                parts.append(res)
                continue
            with open_file(tar) as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise FormatError(path, 0, "empty file (not a tar archive)")
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    members = index_tar(m, path)
            parts.append(_python_part(path, members, wanted, fold, self))
        shards = [{"path": p, "size": sz, "mtime_ns": mt} for p, (sz, mt) in zip(paths, stats)]
        return _index_files.WdsIndex.from_parts(self.spec, shards, parts)

    def _group(self, shard, members, wanted, fold):
        """Samples of one shard: (start, end, key, component offsets
        relative to start, lengths) with -1 for missing components."""
        k = len(self.ext)
        dali = self.grouping == "dali"
        starts, ends, keys, offs, lens = [], [], [], [], []
        cur_key, cur, first, last, seen = None, None, 0, 0, set()

        def close():
            if cur_key is None:
                return
            missing = [j for j in range(k) if cur[j] is None]
            if not seen and not dali:   # nothing wanted: the webdataset library drops it
                return
            if missing and self.missing_component_behavior == "skip":
                self.skipped += 1
                return
            if missing and self.missing_component_behavior == "error":
                raise FormatError(shard, first, f"sample {cur_key!r} has no component "
                                                f"{self.ext[missing[0]]!r} (it has "
                                                f"{', '.join(sorted(seen))})")
            starts.append(first)
            ends.append(last)
            keys.append(cur_key)
            offs.append([-1 if c is None else c[0] - first for c in cur])
            lens.append([0 if c is None else c[1] for c in cur])

        for m in members:
            name = m.name
            if not dali and "/" not in name and name.startswith("__") and name.endswith("__"):
                continue
            parts = split_name(name)
            if parts is None:
                if not dali:
                    continue
                parts = (name, None)
            key, e = parts
            if key != cur_key:
                close()
                cur_key, cur, first, seen = key, [None] * k, m.offset, set()
            if e is None:
                last = m.offset + m.size
                continue
            if e in seen:
                raise FormatError(shard, m.header, f"sample {key!r} has component {e!r} twice "
                                                   "(duplicate file name in the shard?)")
            seen.add(e)
            j = wanted.get(fold(e))
            if j is not None and cur[j] is None:
                cur[j] = (m.offset, m.size)
            last = m.offset + m.size
        close()
        to = lambda v, shape: np.array(v, np.int64).reshape(shape)  # noqa: E731
        return (to(starts, -1), to(ends, -1), keys, to(offs, (-1, k)), to(lens, (-1, k)))

    def __repr__(self):
        return f"WebDataset({len(self.paths)} shards, {len(self)} samples, ext={self.ext})"

    @property
    def in_s3(self):
        return is_url(self.paths[0])

    def s3_read_for(self, in_order):
        """How this source's s3:// shards are read by a reader that goes
        through them in order (``in_order``) or not: ``s3_read``, or by
        :data:`S3_READ_RULE`; None for local shards."""
        if not self.in_s3:
            return None
        if self.s3_read is not None:
            return self.s3_read
        return "whole" if in_order else "ranges"

    def reading_in_order(self, in_order):
        """Told by a Reader just before it opens its native reader: whether
        it goes through the samples in order (open_native_reader)."""
        self._in_order = in_order

    def open_native(self, engine, options, *, prefetch, workers):
        # Whole shards only for a reader going through them in order (see
        # S3_READ_RULE); one that did not say is taken as shuffling.
        if self.s3_read_for(getattr(self, "_in_order", False)) == "whole":
            return _WholeShards(self, engine, options, prefetch)
        return super().open_native(engine, options, prefetch=prefetch, workers=workers)

    def component_ranges(self, indices):
        """Where each ``ext`` component lies in the samples ``indices``: one
        ``(starts, ends)`` pair of int64 arrays per entry, offsets into each
        sample's bytes (start -1: the component is missing)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        offs = self.index.comp_offsets(idx)
        lens = self.component_lengths[idx].astype(np.int64)
        ends = np.where(offs < 0, -1, offs + lens)
        return [(offs[:, j], ends[:, j]) for j in range(offs.shape[1])]

    def native_table(self):
        """The native reader's columns as views of the index's own (its
        shard numbers, the samples' starts and lengths, mapped or not): a
        reader over 10^8 samples copies nothing (MultiFileRanges' default
        builds 20 bytes a sample of copies)."""
        if self._table is None:
            self._table = (_as_dtype(self.index.file_ids, np.int32, np.uint32),
                           _as_dtype(self.index.start, np.int64, np.uint64),
                           self._sizes)
        return self._table

    def index_bytes(self):
        """Bytes the index takes: its columns (those mapped from an index
        file count in full, though only the pages used are read: see
        ``index_resident`` for the mapped case) and ``index_bytes_per_sample``,
        what each sample costs of them beyond its name (docs/scale.md)."""
        own = self.index.nbytes
        # Columns of the native reader's table that are copies, not views.
        own_cols = (self.index.file_ids, self.index.length)   # the index's, not copies
        multi = sum(int(c.nbytes) for c in (self._table or ()) if c.base is None
                    and not any(c is o for o in own_cols))
        return {"index_bytes": own + multi, "index_columns_bytes": own,
                "index_numbering_bytes": multi,
                "index_bytes_per_sample": self.index.bytes_per_sample(),
                "index_mapped": self.index.source is not None and self.index._keep is not None,
                "index_samples": len(self)}

    NATIVE_INDEX_MAGIC = b"FRWDSIX1"

    def native_index(self):
        """The index as bytes for fastread's native DALI operator
        (``dali_plugin/fastread_webdataset.cc`` documents the format): per
        shard the tar read and its size, per sample its shard and each
        component's offset in the tar (-1: missing) and length, the names,
        and a CRC-32 of it all."""
        k = len(self.ext)
        # The sizes the shards had when indexed (an s3:// shard has no local size).
        shard_sizes = np.array(self._tar_sizes, "<u8")
        starts = np.concatenate([f.offsets for f in self.files]) if self.files \
            else np.zeros(0, np.int64)
        rel = self.component_offsets
        comps = np.empty((len(self), k, 2), "<i8")
        comps[:, :, 0] = np.where(rel < 0, -1, rel + starts[:, None])
        comps[:, :, 1] = np.where(rel < 0, 0, self.component_lengths)
        names = ([f.path for f in self.files] + [f.shard for f in self.files]
                 + [f.names[j] for f in self.files for j in range(len(f))])
        strings = b"".join(os.fsencode(s) + b"\0" for s in names)
        parts = [self.NATIVE_INDEX_MAGIC,
                 np.array([len(self.files), len(self), k, len(strings)], "<u8").tobytes(),
                 shard_sizes.tobytes(), np.asarray(self.file_index).astype("<i8").tobytes(),
                 comps.tobytes(),
                 strings]
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        return b"".join(parts) + np.array([crc, 0], "<u4").tobytes()

    def write_native_index(self, path):
        """Writes :meth:`native_index` to ``path`` (atomically)."""
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(self.native_index())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def components(self, arrays, indices):
        """The batch's samples (``arrays``, read for sample numbers
        ``indices``) cut into components: one list of uint8 views per
        ``ext`` entry (an empty array where a component is missing)."""
        empty = self._empty
        outs = []
        for starts, ends in self.component_ranges(indices):
            outs.append([a[b:e] if b >= 0 else empty
                         for a, b, e in zip(arrays, starts.tolist(), ends.tolist())])
        return outs
