"""Objects in S3 (or an S3-compatible server) as samples: ``s3://bucket/key``
URLs read by the native ``s3`` engine (csrc/engines/s3, libcurl), listings
(:func:`list_objects`, ListObjectsV2) and the options that reach a bucket
(:class:`S3Options`).

Where the settings come from is decided once, in C (so the DALI operator
behaves the same): the options given here, else the AWS environment
(``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...), else the profile's sections
of ``~/.aws/config`` and ``~/.aws/credentials``. A context reads them when
it opens: a context cached by :func:`fastread.read_files` keeps the
settings it opened with. Secrets never appear in a repr() or a message.
"""
import dataclasses
import errno as _errno
import html
import os
import re
import urllib.parse
from collections.abc import Mapping
from typing import List, NamedTuple, Optional

from fastread._safe_open import open_file

try:
    from fastread import _s3
except ImportError:  # built without libcurl: the s3 engine is absent too
    _s3 = None

SCHEME = "s3://"

#: engine_args keys whose values are secrets: never shown.
# Every engine's secret engine_args keys (s3's credentials, cql's password):
# redact_engine_args hides their values wherever engine_args are shown.
SECRET_KEYS = ("secret_access_key", "session_token", "password")

#: Why there is no s3 support in this build, when there is none.
NOT_BUILT = ("libcurl >= 7.84 was not found by pkg-config when fastread was built "
             "(install libcurl4-openssl-dev, then reinstall fastread; "
             "-Ccmake.define.FASTREAD_S3=ON makes its absence a build error)")


def is_url(path):
    """True for an ``s3://`` URL (a str)."""
    return isinstance(path, str) and path.startswith(SCHEME)


def split_url(url):
    """``(bucket, key)`` of ``s3://bucket/key`` (key may be "")."""
    if not is_url(url):
        raise ValueError(f"not an s3:// URL: {url!r}")
    if "\0" in url:
        # C would end the key at the NUL: another object (an upload would
        # overwrite it).
        raise ValueError(f"NUL character in the S3 URL {url!r}")
    bucket, _, key = url[len(SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}")
    return bucket, key


def redact_url(url):
    """``url`` for repr() and messages: any user info before its host
    (``https://KEY:SECRET@host``: credentials) replaced by ``***``."""
    if not isinstance(url, str):
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i >= 0:
            end = min(end, i)
    at = rest.rfind("@", 0, end)
    if at < 0:
        return url
    return f"{scheme}{sep}***{rest[at:]}"


def redact_engine_args(engine_args):
    """``engine_args`` with the values of secret keys replaced by ``***``
    and the user info of an endpoint too (for repr() and messages)."""
    if not engine_args:
        return engine_args
    out = []
    for item in engine_args.split(","):
        key, eq, value = item.partition("=")
        if eq and key.strip() in SECRET_KEYS:
            out.append(f"{key}=***")
        elif eq and key.strip() == "endpoint":
            out.append(f"{key}={redact_url(value)}")
        else:
            out.append(item)
    return ",".join(out)


# Python option -> (engine_args key, type). Booleans go as 0/1.
_FIELDS = {
    "endpoint_url": ("endpoint", str),
    "region": ("region", str),
    "profile": ("profile", str),
    "addressing": ("addressing", str),
    "unsigned": ("unsigned", bool),
    "verify": ("verify", bool),
    "ca_bundle": ("ca_bundle", str),
    "access_key_id": ("access_key_id", str),
    "secret_access_key": ("secret_access_key", str),
    "session_token": ("session_token", str),
    "inflight": ("inflight", int),
    "part_size": ("part_size", int),
    "retries": ("retries", int),
    "deadline_ms": ("deadline_ms", int),
    "connect_timeout_ms": ("connect_timeout_ms", int),
    "low_speed_time_s": ("low_speed_time_s", int),
}


def _shown(name, value):
    """An option's value as repr() and messages show it: no secret, no
    credentials in an endpoint's user info."""
    if _FIELDS[name][0] in SECRET_KEYS:
        return "***"
    return repr(redact_url(value) if name == "endpoint_url" else value)


@dataclasses.dataclass(frozen=True, repr=False)
class S3Options:
    """How the s3 engine reaches a bucket, as Python keywords; ``None`` (every
    default) leaves a setting to the environment and the AWS files.

    - ``endpoint_url`` (``http(s)://host[:port]``), ``region``, ``profile``,
      ``addressing`` (``"path"``, ``"virtual"`` or ``"auto"``: virtual-hosted
      for AWS, path-style for other servers), ``unsigned`` (anonymous
      requests to public buckets), ``verify`` (TLS certificate checks,
      default on), ``ca_bundle``;
    - credentials: ``access_key_id``, ``secret_access_key``,
      ``session_token`` (secrets: never shown);
    - tuning: ``inflight`` (requests in flight per context, 1..1024, default
      128), ``part_size`` (bytes per ranged GET of a large object, default
      8 MiB), ``retries`` (default 5), ``deadline_ms`` (per request, all
      attempts), ``connect_timeout_ms``, ``low_speed_time_s``.

    The C core checks the values (ranges, choices) when a context opens;
    here only types and the separator are checked.
    """

    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    profile: Optional[str] = None
    addressing: Optional[str] = None
    unsigned: Optional[bool] = None
    verify: Optional[bool] = None
    ca_bundle: Optional[str] = None
    access_key_id: Optional[str] = None
    secret_access_key: Optional[str] = None
    session_token: Optional[str] = None
    inflight: Optional[int] = None
    part_size: Optional[int] = None
    retries: Optional[int] = None
    deadline_ms: Optional[int] = None
    connect_timeout_ms: Optional[int] = None
    low_speed_time_s: Optional[int] = None

    def __post_init__(self):
        for name, (_, kind) in _FIELDS.items():
            v = getattr(self, name)
            if v is None:
                continue
            shown = "(not shown: secret)" if _FIELDS[name][0] in SECRET_KEYS else _shown(name, v)
            if kind is bool:
                if not isinstance(v, bool) and v not in (0, 1):
                    raise ValueError(f"S3 option {name} must be True or False, got {shown}")
                object.__setattr__(self, name, bool(v))
            elif kind is int:
                if not isinstance(v, int) or isinstance(v, bool):
                    raise ValueError(f"S3 option {name} must be an integer, got {shown}")
            else:
                if not isinstance(v, str):
                    raise ValueError(f"S3 option {name} must be a str, got {type(v).__name__}")
                if "," in v or "\0" in v:
                    # engine_args is "key=value,key=value": a comma would split it.
                    raise ValueError(f"S3 option {name} cannot hold ',' or NUL, got {shown}")

    @classmethod
    def coerce(cls, value=None, /, **kwargs):
        """S3Options from an S3Options, a mapping of option names, or None,
        plus keyword arguments (which win)."""
        if value is None:
            base = {}
        elif isinstance(value, S3Options):
            if not kwargs:
                return value
            base = value.given()
        elif isinstance(value, Mapping):
            base = dict(value)
        else:
            raise TypeError(f"S3 options must be an S3Options, a mapping or None, "
                            f"got {type(value).__name__}")
        merged = {**base, **{k: v for k, v in kwargs.items() if v is not None}}
        unknown = sorted(set(merged) - set(_FIELDS))
        if unknown:
            raise TypeError(f"unknown S3 option(s) {', '.join(map(repr, unknown))}; valid "
                            f"options: {', '.join(_FIELDS)}")
        return cls(**merged)

    def given(self):
        """The options set (not None), by name."""
        return {name: getattr(self, name) for name in _FIELDS if getattr(self, name) is not None}

    def engine_args(self):
        """These options as the s3 engine's ``engine_args``."""
        parts = []
        for name, v in self.given().items():
            parts.append(f"{_FIELDS[name][0]}={int(v) if isinstance(v, bool) else v}")
        return ",".join(parts)

    def __repr__(self):
        shown = ", ".join(f"{k}={_shown(k, v)}" for k, v in self.given().items())
        return f"S3Options({shown})"

    __str__ = __repr__


def take_options(kwargs):
    """Moves S3 options given as flat keyword arguments (``endpoint_url=``,
    ``access_key_id=``, ..., the names :func:`list_objects` and
    :class:`S3Options` take) out of ``kwargs`` into one ``kwargs["s3"]``
    (merged with an ``s3=`` given there; the flat ones win), so that every
    reader that takes engine options takes S3 options the way
    :mod:`fastread.s3`'s own calls do. Returns ``kwargs`` (changed in place)."""
    flat = {name: kwargs.pop(name) for name in list(kwargs) if name in _FIELDS}
    if flat or kwargs.get("s3") is not None:
        kwargs["s3"] = S3Options.coerce(kwargs.get("s3"), **flat)
    return kwargs


def engine_args_for(engine_args="", s3=None):
    """``engine_args`` with the S3 options appended (later keys win in the
    engine's parser)."""
    extra = S3Options.coerce(s3).engine_args() if s3 is not None else ""
    return ",".join(a for a in (engine_args, extra) if a)


def _require():
    if _s3 is None:
        raise RuntimeError(f"this fastread has no s3 support: {NOT_BUILT}")


def describe():
    """(True, libcurl's version and features) or (False, why s3 cannot run)."""
    if _s3 is None:
        return False, f"not built: {NOT_BUILT}"
    return _s3.describe()


class S3Object(NamedTuple):
    key: str
    size: int
    etag: str = ""   # as the listing gives it, quotes and all ("" if none)


class ListedURLs(list):
    """URLs from a listing (:func:`scan_tree`), a plain list that also
    knows each object's version as listed: ``versions[url] = (etag, size)``.
    A reader with a node-local cache drops the entries the listing
    contradicts before it reads (:func:`drop_stale_entries`)."""

    def __init__(self, urls, versions):
        super().__init__(urls)
        self.versions = versions


def drop_stale_entries(versions, cache_dir, engine_args=""):
    """Removes the entries of the node-local cache at ``cache_dir`` whose
    object ``versions`` (``{url: (etag, size)}``, from a listing) names
    another version of: another ETag, or another size. An entry keeps the
    ETag its object was fetched with, so an object rewritten in place,
    same size or not, is fetched again by the next reader that lists it.
    ``engine_args``: the s3 engine's (as a reader's options resolve them):
    entries are kept per endpoint and access key id, and only those of
    that endpoint and key are compared. Returns how many went."""
    if not versions or not cache_dir:
        return 0
    from fastread._core import drop_stale_cache_entries
    _require()
    client = _client(f"the object cache at {cache_dir}", engine_args)
    try:
        scope = client.cache_scope()
    finally:
        client.close()
    return drop_stale_cache_entries(cache_dir, ((u, e, s) for u, (e, s) in versions.items()),
                                    scope)


def _canonical_query(params):
    """A SigV4 canonical query: sorted by name, names and values
    URI-encoded (unreserved characters kept, '/' encoded)."""
    return "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                    for k, v in sorted(params.items()))


def _status_error(url, status, err):
    code = {404: _errno.ENOENT, 403: _errno.EACCES, 401: _errno.EACCES}.get(status, _errno.EIO)
    return OSError(code, f"{url}: {err or status}")


def _client(url, engine_args):
    """A client for requests about ``url``; a setting that cannot be
    resolved (no credentials, a bad option) raises naming the URL, as a
    failed request does (the C client's message names only the setting)."""
    try:
        return _s3.Client(engine_args)
    except OSError as e:
        raise OSError(e.errno, f"{url}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"{url}: {e}") from None


_CONTENTS = re.compile(rb"<Contents>(.*?)</Contents>", re.S)
_COMMON = re.compile(rb"<CommonPrefixes>\s*<Prefix>(.*?)</Prefix>", re.S)
_FIELD = {name: re.compile(rb"<" + name + rb">(.*?)</" + name + rb">", re.S)
          for name in (b"Key", b"Size", b"ETag", b"IsTruncated", b"NextContinuationToken",
                       b"EncodingType")}


def _unescape(raw):
    v = raw.decode("utf-8", "surrogateescape")
    if "&" not in v:
        return v
    v = v.replace("&quot;", '"')     # every ETag has two
    return html.unescape(v) if "&" in v else v


def _field(name, data, default=None):
    m = _FIELD[name].search(data)
    if m is None:
        return default
    v = m.group(1).decode("utf-8", "surrogateescape")
    return html.unescape(v) if "&" in v else v


def _parse_listing(body, url):
    """``(objects, common prefixes, truncated, continuation token)`` of one
    ListObjectsV2 answer. Regular expressions over the bytes rather than an
    XML tree: the answer's shape is fixed, and a tree of a 1,000-key page
    cost ~85 ms of interpreter time on the 2-core VM (the GIL: parallel
    listings would have waited on it), these a few ms. XML's character
    references are decoded; keys asked for URL-encoded are URL-decoded."""
    if b"<ListBucketResult" not in body[:1024]:
        raise OSError(_errno.EIO, f"{url}: the listing is not a ListObjectsV2 answer "
                                  f"({body[:60]!r})")
    contents_at = body.find(b"<Contents>")
    head = body if contents_at < 0 else body[:contents_at]
    tail_at = body.rfind(b"</Contents>")
    tail = b"" if tail_at < 0 else body[tail_at:]
    encoded = (_field(b"EncodingType", head) or _field(b"EncodingType", tail) or "") == "url"
    # S3 encodes keys as form data: '+' for a space, %2B for '+'.
    decode = urllib.parse.unquote_plus if encoded else (lambda k: k)
    count = body.count(b"<Contents>")
    keys, sizes, etags = (_FIELD[n].findall(body) for n in (b"Key", b"Size", b"ETag"))
    if len(keys) == len(sizes) == len(etags) == count:
        # Each field once per object (the usual answer): three scans of the
        # page, no slicing per object.
        objects = list(map(S3Object, map(decode, map(_unescape, keys)),
                           map(int, sizes), map(_unescape, etags)))
    else:   # a field missing from some object: object by object
        objects = [S3Object(decode(_field(b"Key", c, "")), int(_field(b"Size", c, "0") or 0),
                            _field(b"ETag", c, "")) for c in _CONTENTS.findall(body)]
    prefixes = []
    for p in _COMMON.findall(body):
        v = p.decode("utf-8", "surrogateescape")
        if v:
            prefixes.append(decode(html.unescape(v) if "&" in v else v))
    truncated = ((_field(b"IsTruncated", head) or _field(b"IsTruncated", tail) or "false")
                 == "true")
    token = _field(b"NextContinuationToken", head) or _field(b"NextContinuationToken", tail)
    if truncated and not token:
        raise OSError(_errno.EIO, f"{url}: a truncated listing without a "
                                  "NextContinuationToken")
    return objects, prefixes, truncated, token


def _list_pages(client, url, bucket, prefix, delimiter=None):
    """``(objects, common prefixes)`` of one ListObjectsV2 listing of
    ``prefix`` (with ``delimiter``: the keys with it after the prefix come
    back as their common prefixes instead), followed page after page (1,000
    keys each) to the end."""
    objects, prefixes = [], []
    token = None
    while True:
        params = {"list-type": "2", "encoding-type": "url", "prefix": prefix}
        if delimiter:
            params["delimiter"] = delimiter
        if token is not None:
            params["continuation-token"] = token
        status, body, err = client.request("GET", bucket, "", _canonical_query(params))
        if status != 200:
            raise _status_error(url, status, err)
        found, common, truncated, token = _parse_listing(body, url)
        objects.extend(found)
        prefixes.extend(common)
        if not truncated:
            return objects, prefixes


#: Listings in flight at once in a parallel walk (list_objects(workers=),
#: scan()): threads, each with its own connection.
LIST_WORKERS = 32


def _key_order(obj):
    # S3's order: the UTF-8 bytes of the keys.
    return obj.key.encode("utf-8", "surrogateescape")


def _walk_prefixes(url, bucket, prefix, args, workers, max_depth=None):
    """``(objects, prefixes not descended)`` under ``prefix``: the prefix
    listed with delimiter "/", then every common prefix found, in turn,
    ``workers`` listings at once (each a thread with its own connection;
    the GIL is released while a request is in flight). Common prefixes
    ``max_depth`` levels below ``prefix`` are returned, not listed (None:
    every level). A level without "/" in its keys is one listing, paged
    sequentially."""
    import concurrent.futures
    import threading

    local = threading.local()
    clients, lock = [], threading.Lock()

    def one(p):
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = _client(url, args)
            with lock:
                clients.append(c)
        return _list_pages(c, url, bucket, p, "/")

    objects, left = [], []
    base_depth = prefix.count("/")
    try:
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="s3-list") as pool:
            pending = {pool.submit(one, prefix)}
            while pending:
                done, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    found, prefixes = f.result()   # the first failure raises (naming the URL)
                    objects.extend(found)
                    for p in prefixes:
                        if max_depth is not None and p.count("/") - base_depth >= max_depth:
                            left.append(p)
                        else:
                            pending.add(pool.submit(one, p))
    finally:
        for c in clients:
            c.close()
    return objects, left


#: List in C where the build can (libexpat: fastread._s3.list_native()):
#: False makes every listing parse its pages in Python (what the
#: benchmark compares against).
NATIVE_LISTING = True


def _native():
    return NATIVE_LISTING and _s3 is not None and _s3.list_native()


def _objects_of(keys, sizes, etags):
    """S3Objects from the C listing's tables (blob, offsets)."""
    kb, ko = keys
    eb, eo = etags
    ko, eo = ko.tolist(), eo.tolist()
    return [S3Object(kb[ko[i]:ko[i + 1]].decode("utf-8", "surrogateescape"), s,
                     eb[eo[i]:eo[i + 1]].decode("utf-8", "surrogateescape"))
            for i, s in enumerate(sizes.tolist())]


def _list_native(url, bucket, prefix, args, workers, delimiter=True, max_depth=None):
    """``(keys, sizes, etags, prefixes not descended)`` of a walk in C
    (csrc/engines/s3/s3_list.c): ``workers`` listings in flight on one
    multi handle, pages parsed by libexpat as they arrive, the keys one
    blob + offsets; the GIL released throughout."""
    try:
        keys, sizes, etags, left, _ = _s3.list_tree(
            args, bucket, prefix, delimiter, -1 if max_depth is None else max_depth,
            max(1, min(workers, 1024)))
    except OSError as e:
        raise OSError(e.errno, e.strerror.replace(f"s3://{bucket}/{prefix}", url, 1)
                      if url.startswith("s3://") else f"{url}: {e.strerror}") from None
    return keys, sizes, etags, left


def list_objects(url, s3=None, *, engine_args="", workers=1, **options) -> List[S3Object]:
    """Every object under ``url`` (``s3://bucket/prefix``: keys starting
    with ``prefix``, as S3 compares them: by bytes, not by directories), in
    S3's order (UTF-8 byte order of the keys), as :class:`S3Object`\\ s.
    ``workers=1``: one ListObjectsV2 walk, followed page after page (1,000
    keys each) to the end. ``workers > 1``: the "directories" (common
    prefixes of delimiter "/") listed in parallel, ``workers`` at once, and
    the objects sorted (the same list; a prefix with no "/" below it is
    still one sequential walk). Keys are asked for URL-encoded
    (``encoding-type=url``) so that any key survives the XML, and decoded.
    ``s3``: an :class:`S3Options` (or a mapping); keyword arguments are S3
    options too. Raises OSError naming the URL and S3's error code (ENOENT
    for a missing bucket, EACCES for refused credentials)."""
    _require()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    bucket, prefix = split_url(url)
    opts = S3Options.coerce(s3, **options)
    args = engine_args_for(engine_args, opts)
    if _native():
        keys, sizes, etags, _ = _list_native(url, bucket, prefix, args, workers,
                                             delimiter=workers > 1)
        objects = _objects_of(keys, sizes, etags)
        if workers > 1:
            objects.sort(key=_key_order)
        return objects
    if workers > 1:
        objects, _ = _walk_prefixes(url, bucket, prefix, args, workers)
        objects.sort(key=_key_order)
        return objects
    client = _client(url, args)
    try:
        return _list_pages(client, url, bucket, prefix)[0]
    finally:
        client.close()


def put_object(url, data, s3=None, *, engine_args="", **options):
    """Uploads ``data`` (bytes-like) as the object ``url`` in one signed PUT
    (the body sent as UNSIGNED-PAYLOAD: its integrity rests on TLS). For
    objects up to 5 GiB (S3's single PUT limit). Raises OSError naming the
    URL and S3's error code."""
    _require()
    bucket, key = split_url(url)
    if not key:
        raise ValueError(f"no object key in {url!r}")
    client = _client(url, engine_args_for(engine_args, S3Options.coerce(s3, **options)))
    try:
        status, _, err = client.request("PUT", bucket, key, "", data)
    finally:
        client.close()
    if status != 200:
        raise _status_error(url, status, err)


def _tables(strings):
    """(blob, n + 1 uint64 offsets) of str: the C listing's layout."""
    import numpy as np
    raw = [s.encode("utf-8", "surrogateescape") for s in strings]
    off = np.zeros(len(raw) + 1, np.uint64)
    np.cumsum([len(r) for r in raw], out=off[1:])
    return b"".join(raw), off


def _tree_listing(base, bucket, prefix, args):
    """The two-level walk a class tree needs, as tables: ``(key blob, key
    offsets, sizes, etag blob, etag offsets, prefixes not descended)``."""
    import numpy as np
    # Two levels are all a class tree needs (prefix/CLASS/NAME): deeper
    # "directories" are not listed, only seen (they make their class exist,
    # as a flat listing's deeper keys do).
    if _native():
        (kb, ko), sizes, (eb, eo), deeper = _list_native(base, bucket, prefix, args,
                                                         LIST_WORKERS, max_depth=2)
        return kb, ko, sizes, eb, eo, deeper
    objects, deeper = _walk_prefixes(base, bucket, prefix, args, LIST_WORKERS, max_depth=2)
    kb, ko = _tables(o.key for o in objects)
    eb, eo = _tables(o.etag for o in objects)
    return kb, ko, np.array([o.size for o in objects], np.int64), eb, eo, deeper


#: How long a listing kept in the node-local cache is reused (seconds):
#: S3 has no cheap question "did anything under this prefix change?" (a
#: listing is the only answer), so a kept listing is fresh by its age
#: alone. Objects added or rewritten since are seen after at most this
#: long; a reader still checks every object it reads against its
#: Content-Range and ETag, so a stale listing costs missing or failing
#: samples, never wrong bytes.
LISTING_MAX_AGE_S = 300.0
_LISTING_FORMAT = 1


def _cached_listing(base, bucket, prefix, args, cache_dir, max_age_s):
    """_tree_listing, through ``cache_dir/listings/`` where a cache is
    given: a listing younger than ``max_age_s`` is read back (one file, no
    request); else listed and kept (written to a temporary name, then
    renamed: readers see whole files only). The listers of one node take
    turns on a lock per listing, so that eight ranks starting together make
    one walk and seven reads."""
    if not cache_dir or max_age_s is None or max_age_s <= 0:
        return _tree_listing(base, bucket, prefix, args)
    import fcntl
    import hashlib
    import json
    import time
    import numpy as np
    client = _client(base, args)
    try:
        scope = client.cache_scope()   # endpoint + a hash of the key id: no secret
    finally:
        client.close()
    name = hashlib.sha256(f"{scope}\0{base}\0depth2".encode("utf-8", "surrogateescape"))
    folder = os.path.join(os.fspath(cache_dir), "listings")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name.hexdigest()[:40] + ".npz")
    with open(path + ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                age = time.time() - meta["listed_at"]
                if (meta.get("format") == _LISTING_FORMAT and meta.get("url") == base and
                        meta.get("scope") == scope and 0 <= age <= max_age_s):
                    lb, lo = z["left"].tobytes(), z["loff"].tolist()
                    return (z["keys"].tobytes(), z["koff"], z["sizes"], z["etags"].tobytes(),
                            z["eoff"], [lb[lo[i]:lo[i + 1]].decode("utf-8", "surrogateescape")
                                        for i in range(len(lo) - 1)])
        except (OSError, KeyError, ValueError):
            pass   # none yet, unreadable or of another format: listed again
        listed_at = time.time()   # before the walk: its age errs on the old side
        kb, ko, sizes, eb, eo, deeper = _tree_listing(base, bucket, prefix, args)
        lb, lo = _tables(deeper)
        meta = json.dumps({"format": _LISTING_FORMAT, "url": base, "scope": scope,
                           "listed_at": listed_at}).encode()
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, meta=np.frombuffer(meta, np.uint8), keys=np.frombuffer(kb, np.uint8),
                         koff=ko, sizes=sizes, etags=np.frombuffer(eb, np.uint8), eoff=eo,
                         left=np.frombuffer(lb, np.uint8), loff=lo)
            os.replace(tmp, path)
        except OSError:
            # A cache that cannot be written costs the next run a walk, not this one.
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return kb, ko, sizes, eb, eo, deeper


def scan_tree(root, filters, dir_filters, matcher_class, case_sensitive, s3=None, *,
              cache_dir=None, max_age_s=LISTING_MAX_AGE_S):
    """``fn.readers.file``'s directory mode over ``s3://bucket/prefix``
    (:func:`fastread.scan` calls this): classes are the "directories" right
    under the prefix (keys ``prefix/CLASS/...``; a key ``prefix/CLASS/``,
    the marker consoles create for an empty folder, makes an empty class),
    samples the objects directly in a class whose names match ``filters``,
    byte-sorted as on local disk. Returns ``(paths, counts per class,
    classes)``, paths a :class:`ListedURLs` (their listed versions).
    ``cache_dir``: a node-local cache where the listing is kept and reused
    while younger than ``max_age_s`` (:data:`LISTING_MAX_AGE_S`)."""
    base = root if root.endswith("/") else root + "/"
    _require()
    bucket, prefix = split_url(base)
    args = engine_args_for("", s3)
    kb, ko, sizes, eb, eo, deeper = _cached_listing(base, bucket, prefix, args, cache_dir,
                                                    max_age_s)
    # Keys decoded here, once each, for the filters (no S3Object).
    skip = len(prefix.encode("utf-8", "surrogateescape"))
    ko, eo = ko.tolist(), eo.tolist()
    rels = [kb[ko[i] + skip:ko[i + 1]].decode("utf-8", "surrogateescape")
            for i in range(len(ko) - 1)]
    versions = lambda i: (eb[eo[i]:eo[i + 1]].decode("utf-8", "surrogateescape"),
                          int(sizes[i]))
    # Prefixes at the depth limit: never a sample (their names have a '/'),
    # but they make their class exist, as a flat listing's deeper keys do.
    rels.extend(p[len(prefix):] for p in deeper)
    matcher = matcher_class(filters, case_sensitive)
    dir_matcher = matcher_class(dir_filters, case_sensitive) if dir_filters is not None else None
    classes = {}
    listed = {}
    for i, rel in enumerate(rels):
        cls, slash, name = rel.partition("/")
        if not slash or not cls:
            continue  # an object right under the root: not a sample (as on disk)
        if dir_matcher is not None and not dir_matcher(cls):
            continue
        names = classes.setdefault(cls, [])
        if name and "/" not in name and matcher(name):
            names.append(name)
            listed[f"{base}{cls}/{name}"] = versions(i)
    order = sorted(classes, key=os.fsencode)
    paths, counts = [], []
    for cls in order:
        names = sorted(classes[cls], key=os.fsencode)
        paths.extend(f"{base}{cls}/{n}" for n in names)
        counts.append(len(names))
    return ListedURLs(paths, listed), counts, order


#: S3's limit for one PUT; larger objects need a multipart upload, which
#: upload() does not do.
MAX_PUT_BYTES = 5 << 30


def _upload_jobs(sources, dest):
    """(local path, URL, size) for every file of ``sources`` (files, and
    directories walked in sorted order) under the ``dest`` prefix. A
    directory's files keep their paths relative to it; a file goes to
    ``dest`` itself when it is the only source and ``dest`` names a key
    (no trailing '/'), else to ``dest/<its name>``."""
    bucket, prefix = split_url(dest)
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [os.fspath(s) for s in sources]
    if not sources:
        raise ValueError("nothing to upload: give at least one file or directory")
    single_key = len(sources) == 1 and os.path.isfile(sources[0]) and prefix and \
        not prefix.endswith("/")
    base = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    jobs = []
    for src in sources:
        if os.path.isdir(src):
            for root, dirs, files in os.walk(src):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(root, name)
                    rel = os.path.relpath(path, src).replace(os.sep, "/")
                    jobs.append((path, f"{SCHEME}{bucket}/{base}{rel}"))
        elif os.path.isfile(src):
            key = prefix if single_key else base + os.path.basename(src)
            jobs.append((src, f"{SCHEME}{bucket}/{key}"))
        else:
            raise FileNotFoundError(_errno.ENOENT, "nothing to upload there (no file or "
                                    "directory)", src)
    out = []
    for path, url in jobs:
        size = os.path.getsize(path)
        if size > MAX_PUT_BYTES:
            raise ValueError(f"{path!r} is {size} bytes: over S3's 5 GiB limit for one PUT "
                             f"(to {url}); multipart uploads are not supported")
        out.append((path, url, size))
    return out


#: Bytes of files upload() holds in memory at once (each PUT sends a whole
#: file from memory): with workers=16 and shards of 1 GB, reading every
#: worker's file up front needed 16 GB. A file larger than this goes alone.
UPLOAD_BUFFER_BYTES = 1 << 30


class _ByteBudget:
    """At most ``limit`` bytes taken at once (a single larger take waits
    until nothing else is held)."""

    def __init__(self, limit):
        import threading

        self.limit, self.held = limit, 0
        self.cond = threading.Condition()

    def take(self, n):
        with self.cond:
            while self.held and self.held + n > self.limit:
                self.cond.wait()
            self.held += n

    def give(self, n):
        with self.cond:
            self.held -= n
            self.cond.notify_all()


def upload(sources, dest, s3=None, *, workers=16, progress=None, engine_args="", **options):
    """Uploads files and directory trees to ``dest`` (``s3://bucket/prefix``)
    with ``workers`` PUTs in flight, each thread with its own connection
    (kept alive between its PUTs). A directory's files land under the prefix
    at their relative paths (a class tree stays one: ``fastread.scan`` and
    ``readers.file`` read it back as from disk); a single file goes to
    ``dest`` itself unless it ends with '/'. ``progress``: a tqdm bar of bytes
    on stderr (None: when stderr is a terminal). ``s3``: an
    :class:`S3Options` (or a mapping); keyword arguments are S3 options too.
    Returns ``[(url, size)]`` in upload order. Raises OSError naming the
    first URL S3 refused (and S3's code), never a secret. Files in memory at
    once: at most :data:`UPLOAD_BUFFER_BYTES` (or one larger file)."""
    import concurrent.futures
    import sys
    import threading

    _require()
    jobs = _upload_jobs(sources, dest)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    args = engine_args_for(engine_args, S3Options.coerce(s3, **options))
    local = threading.local()
    clients, lock = [], threading.Lock()

    def client():
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = _client(dest, args)
            with lock:
                clients.append(c)
        return c

    bar = None
    try:
        from tqdm import tqdm
        bar = tqdm(total=sum(j[2] for j in jobs), unit="B", unit_scale=True, file=sys.stderr,
                   desc=f"upload to {dest}", dynamic_ncols=True, leave=False,
                   disable=None if progress is None else not progress)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        pass

    budget = _ByteBudget(UPLOAD_BUFFER_BYTES)

    def one(job):
        path, url, size = job
        bucket, key = split_url(url)
        budget.take(size)
        try:
            with open_file(path) as f:   # a FIFO in the tree: refused, not waited on
                data = f.read()
            try:
                status, _, err = client().request("PUT", bucket, key, "", data)
            except OSError as e:
                raise OSError(e.errno, f"{url}: {e.strerror or e}") from None
        finally:
            budget.give(size)
        if status != 200:
            raise _status_error(url, status, err)
        if bar is not None:
            bar.update(size)
        return url, size

    try:
        with concurrent.futures.ThreadPoolExecutor(min(workers, max(1, len(jobs)))) as pool:
            return list(pool.map(one, jobs))
    finally:
        if bar is not None:
            bar.close()
        for c in clients:
            c.close()
