"""Tar shards in S3 indexed from their headers only, many shards at once.

Today's alternative streams every byte of every shard to find its headers
(a 10 TB set reads 10 TB before its first batch). Here each shard is walked
by ranged GETs: a tar header (``window`` bytes, 512 by default), then a
jump over the member's data to the next header; a GNU long name (``L``) or
a pax header (``x``) is fetched with the header that follows it, in one
request. The parse is the caller's own (``parse_tar``: WebDataset's
``index_tar``, given an object whose slices are fetched on demand), so the
index is exactly that of a full read, with the same errors (FormatError
naming the URL and the byte offset: a truncated object, a non-tar, a bad
checksum); a failed request raises OSError naming the URL and the bytes.

Where an index file lies beside a shard (``SHARD.idx``, DALI's wds2idx
text, version 1.2), only that file is fetched (:func:`parse_wds2idx`: a
minimal reader of what DALI's tool writes; index files are helper
``index``'s, whose reader should replace it at merge).

Concurrency: ``workers`` threads (default :data:`WORKERS`), each with its
own connection (an S3 client of the s3 engine's C core, the GIL released
during every request), each walking one shard at a time: a shard's walk is
sequential (every header says where the next one is), so the time is about
(members per shard) x (round trip) x (shards / workers). Threads and
connections: ``workers``, whatever the shard count; memory: one window per
thread plus the members found.
"""
import concurrent.futures
import errno as _errno
import threading

import numpy as np

from fastread.formats.cifar import FormatError
from fastread.s3 import S3Options, _client, _require, engine_args_for, split_url

#: Threads (and connections) walking shards at once.
WORKERS = 64

#: Bytes asked for at each header: one tar block. A larger window parses
#: the headers of small members that follow without another request, at the
#: price of the member bytes fetched with them.
HEADER_WINDOW = 512

#: Shards of at most this many bytes are fetched whole, in one GET, instead
#: of walked header by header: a walk costs a round trip per member, one
#: request sequentially after another within a shard, so for small shards
#: (1 MB of 100 KB members: 21 requests) one GET of the object is both
#: fewer requests and sooner (measured: docs/benchmarks.md, S3 scale), and
#: the bytes fetched to index it are then the shard's. 0: always walk.
WHOLE_BELOW = 4 << 20

#: The index file looked for beside a shard: SHARD + this.
INDEX_SUFFIX = ".idx"

_BLOCK = 512


class ShardMembers:
    """One shard's regular members as columns: ``names`` (a list of str),
    ``offsets`` (their data), ``sizes``, ``headers`` (offset of each member's
    first header; for an index file, the block before the data), int64 arrays;
    ``size`` the object's bytes (-1 where only an index file was read),
    ``source`` "headers" or "index file", ``requests`` and ``bytes_fetched``
    the requests made and bytes received for it."""

    __slots__ = ("url", "names", "offsets", "sizes", "headers", "size", "source", "requests",
                 "bytes_fetched")

    def __init__(self, url, names, offsets, sizes, headers, size, source, requests,
                 bytes_fetched):
        self.url, self.names, self.size, self.source = url, names, size, source
        self.offsets = np.asarray(offsets, np.int64)
        self.sizes = np.asarray(sizes, np.int64)
        self.headers = np.asarray(headers, np.int64)
        self.requests, self.bytes_fetched = requests, bytes_fetched

    def __len__(self):
        return len(self.names)

    def __repr__(self):
        return (f"ShardMembers({self.url!r}, {len(self)} members from its {self.source}, "
                f"{self.requests} requests, {self.bytes_fetched} bytes)")


class _RangedObject:
    """An S3 object as ``index_tar`` reads a buffer: ``len()`` is its size
    and a slice fetches the bytes it spans (with a ranged GET, unless the
    last response holds them). Every slice ``index_tar`` takes is a header
    (512 bytes) or a long name / pax record: the member data between them
    is never fetched."""

    def __init__(self, client, url, window):
        self.client, self.url, self.window = client, url, window
        self.bucket, self.key = split_url(url)
        self.requests = 0
        self.bytes_fetched = 0
        self.buf, self.at = b"", 0
        self.size = None
        self._fetch(0, max(window, _BLOCK))
        if self.size is None:
            raise OSError(_errno.EIO, f"{url}: the server gave no object size (Content-Range)")

    def _fetch(self, start, length):
        self.requests += 1
        before = self.client.bytes_received
        try:
            status, body, total, err = self.client.get_range(self.bucket, self.key, start, length)
        except OSError as e:
            raise OSError(e.errno, f"{self.url} (bytes {start}-{start + length - 1}): "
                                   f"{e.strerror or e}") from None
        # The client's count: every attempt's body, error answers included.
        self.bytes_fetched += self.client.bytes_received - before
        if status == 416 and start == 0:
            # An empty object: S3 refuses any range of it.
            self.size = 0 if total in (None, 0) else total
            self.buf, self.at = b"", 0
            return
        if status not in (200, 206):
            code = {404: _errno.ENOENT, 403: _errno.EACCES, 401: _errno.EACCES}.get(status,
                                                                                   _errno.EIO)
            raise OSError(code, f"{self.url} (bytes {start}-{start + length - 1}): "
                                f"{err or status}")
        if self.size is not None and total != self.size:
            raise OSError(_errno.ESTALE, f"{self.url}: the object changed while its headers "
                                         f"were read ({self.size} bytes, then {total})")
        self.size = total
        self.buf, self.at = body, start

    def __len__(self):
        return self.size

    def __getitem__(self, key):
        start, stop = key.start, min(key.stop, self.size)
        if start >= stop:
            return b""
        if not (self.at <= start and stop <= self.at + len(self.buf)):
            length = stop - start
            if length != _BLOCK:
                # A long name or pax record: fetch the header after it too.
                length = (length + _BLOCK - 1) // _BLOCK * _BLOCK + _BLOCK
            self._fetch(start, max(length, self.window))
        return self.buf[start - self.at:stop - self.at]


def parse_wds2idx(text, url):
    """``[(name, offset, size)]`` of the members listed by a DALI wds2idx
    index file (version 1.2: a line ``v1.2 SAMPLES``, then per sample its
    components as ``EXT OFFSET SIZE NAME`` quadruples; OFFSET is the data's).
    ``url`` names the file in errors. A minimal reader: helper ``index``
    owns index files; its reader should replace this one."""
    lines = text.decode("utf-8", "surrogateescape").splitlines()
    if not lines:
        raise FormatError(url, 0, "empty index file")
    head = lines[0].split()
    if len(head) != 2 or head[0] != "v1.2":
        raise FormatError(url, 0, f"not a wds2idx v1.2 index file (first line {lines[0][:40]!r}"
                                  "; write it with DALI's wds2idx)")
    try:
        samples = int(head[1])
    except ValueError:
        raise FormatError(url, 0, f"sample count {head[1][:20]!r} is not a number") from None
    body = [ln for ln in lines[1:] if ln.strip()]
    if len(body) != samples:
        raise FormatError(url, 0, f"says {samples} samples, lists {len(body)}")
    out = []
    for no, line in enumerate(body, 1):
        parts = line.split()
        if not parts or len(parts) % 4:
            raise FormatError(url, None, f"line {no + 1}: not EXT OFFSET SIZE NAME quadruples")
        for j in range(0, len(parts), 4):
            try:
                offset, size = int(parts[j + 1]), int(parts[j + 2])
            except ValueError:
                raise FormatError(url, None, f"line {no + 1}: offset or size is not a "
                                             "number") from None
            if offset < _BLOCK or offset % _BLOCK or size < 0:
                raise FormatError(url, None, f"line {no + 1}: offset {offset} / size {size} "
                                             "cannot be a tar member's")
            out.append((parts[j + 3], offset, size))
    return out


def _index_file(client, url):
    """The members listed by ``url``'s index file, or None where it has none
    (404). Raises OSError for any other failure (naming the index's URL)."""
    idx = url + INDEX_SUFFIX
    bucket, key = split_url(idx)
    before = client.bytes_received
    try:
        status, body, err = client.request("GET", bucket, key)
    except OSError as e:
        raise OSError(e.errno, f"{idx}: {e.strerror or e}") from None
    fetched = client.bytes_received - before
    if status == 404:
        return None, 1, fetched
    if status != 200:
        code = {403: _errno.EACCES, 401: _errno.EACCES}.get(status, _errno.EIO)
        raise OSError(code, f"{idx}: {err or status}")
    return parse_wds2idx(body, idx), 1, fetched


def walk_shard(client, url, parse_tar, window=HEADER_WINDOW, index_files=True,
               whole_below=WHOLE_BELOW):
    """One shard's :class:`ShardMembers`, from its index file where
    ``index_files`` and there is one, else from its headers (``parse_tar``
    over the object fetched range by range), or from the whole object where
    it is at most ``whole_below`` bytes (source "whole object"). ``client``:
    a :class:`fastread._s3.Client`."""
    requests = fetched = 0
    if index_files:
        listed, requests, fetched = _index_file(client, url)
        if listed is not None:
            return ShardMembers(url, [m[0] for m in listed], [m[1] for m in listed],
                                [m[2] for m in listed], [m[1] - _BLOCK for m in listed], -1,
                                "index file",
                                requests, fetched)
    obj = _RangedObject(client, url, window)
    if obj.size == 0:
        raise FormatError(url, 0, "empty object (not a tar archive)")
    source = "headers"
    if obj.size <= whole_below:
        source = "whole object"
        if len(obj.buf) < obj.size:
            obj._fetch(0, obj.size)
    members = parse_tar(obj, url)
    return ShardMembers(url, [m[0] for m in members], [m[1] for m in members],
                        [m[2] for m in members], [m[3] for m in members], obj.size, source,
                        requests + obj.requests, fetched + obj.bytes_fetched)


def walk_shards(urls, parse_tar, s3=None, *, engine_args="", workers=WORKERS,
                window=HEADER_WINDOW, index_files=True, whole_below=WHOLE_BELOW):
    """``[ShardMembers]`` of every shard of ``urls`` (in their order), up to
    ``workers`` shards at once (threads, each with its own connection).
    The first error raises (FormatError or OSError naming the URL); the
    shards not started by then are not walked."""
    _require()
    urls = list(urls)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not isinstance(window, int) or isinstance(window, bool) or window < _BLOCK:
        raise ValueError(f"window must be an integer >= {_BLOCK} bytes, got {window!r}")
    if not isinstance(whole_below, int) or isinstance(whole_below, bool) or whole_below < 0:
        raise ValueError(f"whole_below must be an integer >= 0 bytes, got {whole_below!r}")
    if not urls:
        return []
    args = engine_args_for(engine_args, S3Options.coerce(s3) if s3 is not None else None)
    local = threading.local()
    clients, lock = [], threading.Lock()
    failed = threading.Event()

    def one(url):
        if failed.is_set():
            return None
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = _client(url, args)
            with lock:
                clients.append(c)
        try:
            return walk_shard(c, url, parse_tar, window, index_files, whole_below)
        except BaseException:
            failed.set()
            raise

    try:
        with concurrent.futures.ThreadPoolExecutor(min(workers, len(urls)),
                                                   thread_name_prefix="s3-tar") as pool:
            return list(pool.map(one, urls))
    finally:
        for c in clients:
            c.close()


def members_for_grouping(shard, member):
    """A shard's members as today's WebDataset grouping takes them (a list
    of ``member(name, offset, size, header)``). The one place to point at
    helper ``index``'s columnar grouping when it lands (it can take the
    arrays of :class:`ShardMembers` as they are)."""
    return [member(n, int(o), int(s), int(h)) for n, o, s, h in
            zip(shard.names, shard.offsets, shard.sizes, shard.headers)]


def index_objects(urls, s3, parse_tar, member, **walk):
    """``{url: (members, size)}`` of tar shards in S3, as WebDataset's S3
    path takes them, from headers or index files (:func:`walk_shards`;
    ``walk``: its keywords). ``size`` is the object's (the sum of the
    members' ends where only an index file was read)."""
    out = {}
    for shard in walk_shards(urls, parse_tar, s3, **walk):
        members = members_for_grouping(shard, member)
        size = shard.size if shard.size >= 0 else int(
            max((o + s for o, s in zip(shard.offsets, shard.sizes)), default=0))
        out[shard.url] = (members, size)
    return out
