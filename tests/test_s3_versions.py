"""One read, one version: an S3 object rewritten (with the same size) while
its parts are in flight never comes back as a mix of two versions, whether
its size was known (size hints, sizes the context remembered) or not, and
whether it is read whole, by ranges, or through the object cache.

The rewrite is placed deterministically by a proxy local to this file: the
object's first part is forwarded to the server first; each later part waits
for it, and the first of them rewrites the object before going on, so the
later parts meet the new version on the server."""
import errno
import threading

import pytest

import fastread
from s3_proxy import FaultProxy

pytestmark = pytest.mark.usefixtures("s3_engine")

P = 64 << 10
OLD, NEW = b"A" * (3 * P), b"B" * (3 * P)


def opts(endpoint, srv, **extra):
    return fastread.S3Options(endpoint_url=endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key,
                              part_size=P, inflight=8, **extra)


class RewritingProxy(FaultProxy):
    """While armed: a GET of `path` whose Range starts past byte 0 waits
    until the one starting at byte 0 has had its answer, and the first such
    GET rewrites the object with `new` before it is forwarded."""

    def __init__(self, srv, path, new):
        super().__init__(srv)
        self.srv, self.path, self.new = srv, path, new
        self.armed = False
        self.rewrites = 0
        self._first_done = threading.Event()
        self._rewrite_lock = threading.Lock()

    def _answer(self, client, upstream, head, body, method, target, client_close):
        lower = head.lower()
        later = (self.armed and method == "GET" and target.startswith(self.path)
                 and b"range: bytes=" in lower and b"range: bytes=0-" not in lower)
        if later:
            self._first_done.wait(10.0)
            with self._rewrite_lock:
                if not self.rewrites:
                    bucket, key = self.path.lstrip("/").split("/", 1)
                    self.srv.put(bucket, key, self.new)
                    self.rewrites += 1
        result = super()._answer(client, upstream, head, body, method, target, client_close)
        if self.armed and target.startswith(self.path) and b"range: bytes=0-" in lower:
            self._first_done.set()
        return result


@pytest.fixture
def rewriting(s3_server, request):
    bucket = s3_server.make_bucket("versions")
    key = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60] + ".bin"
    url = s3_server.put(bucket, key, OLD)
    with RewritingProxy(s3_server, f"/{bucket}/{key}", NEW) as proxy:
        yield url, proxy


def one_version(data):
    assert len(data) == 3 * P
    parts = {data[k * P:(k + 1) * P] for k in range(3)}
    assert len(parts) == 1, f"a mix of versions: {[bytes(p[:1]) for p in parts]}"
    return data


@pytest.mark.parametrize("how", ["size hints", "remembered sizes", "no sizes"])
def test_object_rewritten_mid_read_is_one_version(s3_server, rewriting, how):
    url, proxy = rewriting
    ctx = fastread.open_context("s3", s3=opts(proxy.endpoint, s3_server))
    sizes = [3 * P] if how == "size hints" else None
    if how == "remembered sizes":
        assert ctx.read([url]).arrays()[0].tobytes() == OLD  # sized, and remembered
    proxy.armed = True
    batch = ctx.read([url], sizes=sizes)
    assert proxy.rewrites == 1
    if how == "no sizes":
        # Sized by its probe just now: the later parts' If-Match refuses the
        # new version, and the sample says so.
        assert dict(batch.failures()) == {0: errno.ESTALE}
        assert "another version" in ctx.sample_error(0)
    else:
        # Its size known, all parts started at once without If-Match: the
        # ETags of their answers differ, and the object is read again whole.
        assert batch.failures() == []
        assert one_version(batch.arrays()[0].tobytes()) == NEW
        assert ctx.stat("s3_repairs") == 1
    ctx.close()


def test_range_read_across_a_rewrite_fails_not_mixes(s3_server, rewriting):
    url, proxy = rewriting
    ctx = fastread.open_context("s3", s3=opts(proxy.endpoint, s3_server))
    proxy.armed = True
    batch = ctx.read_ranges(url, [0], [3 * P])
    assert proxy.rewrites == 1
    assert dict(batch.failures()) == {0: errno.ESTALE}, batch.arrays()[0].tobytes()[::P]
    assert "another version" in ctx.sample_error(0) and url in ctx.sample_error(0)
    # Read again, it is the new version, whole.
    batch = ctx.read_ranges(url, [0, P // 2], [3 * P, P])
    assert batch.failures() == []
    assert batch.arrays()[0].tobytes() == NEW and batch.arrays()[1].tobytes() == NEW[:P]
    ctx.close()


def test_object_cache_never_stores_a_mix(s3_server, rewriting, tmp_path):
    url, proxy = rewriting
    cache = str(tmp_path / "cache")
    ctx = fastread.open_context("s3", s3=opts(proxy.endpoint, s3_server), cache_dir=cache)
    proxy.armed = True
    batch = ctx.read([url], sizes=[3 * P])
    assert proxy.rewrites == 1 and batch.failures() == []
    assert one_version(batch.arrays()[0].tobytes()) == NEW
    ctx.close()
    proxy.armed = False
    # A new context reads the entry stored above from the cache.
    ctx = fastread.open_context("s3", s3=opts(proxy.endpoint, s3_server), cache_dir=cache)
    requests = proxy.counts["requests"]
    batch = ctx.read([url], sizes=[3 * P])
    assert one_version(batch.arrays()[0].tobytes()) == NEW
    assert ctx.stat("cache_hits") == 1 and proxy.counts["requests"] == requests
    ctx.close()
