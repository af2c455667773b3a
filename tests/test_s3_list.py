"""ListObjectsV2 walks in C (csrc/engines/s3/s3_list.c) against a real S3
server (SeaweedFS): the same objects, sizes, ETags and order as the
Python walk, many listings in flight on one connection pool, 503s and
resets retried, a page cut short never half kept, errors naming the URL.
Skips naming libexpat where the build has none."""
import os

import pytest

import fastread
from fastread import s3 as fs3

from conftest import skip_unless

BUCKET = "list-c"
KEYS = ["a b.jpg", "plus+sign.jpg", "pct%41.jpg", "amp&lt;.jpg", "ü€.jpg", "q?x=1.jpg"]


def opts(srv, endpoint=None):
    return fastread.S3Options(endpoint_url=endpoint or srv.endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key)


@pytest.fixture(autouse=True)
def native_only():
    if fs3._s3 is None or not fs3._s3.list_native():
        skip_unless("s3-list", "this build lists in Python: libexpat was not found when it "
                               "was built (apt install libexpat1-dev)")


@pytest.fixture(scope="module")
def objects(s3_server):
    """~1,500 objects: 12 folders of 100, one of 250 (past a 1,000-key page
    together with its subfolder), odd keys, an empty object, a marker."""
    s3_server.make_bucket(BUCKET)
    jobs = []
    for c in range(12):
        jobs += [(f"t/c{c:02d}/{i:04d}.jpg", b"x" * (i % 7)) for i in range(100)]
    jobs += [(f"t/big/{i:04d}.jpg", b"y") for i in range(1100)]
    jobs += [(f"t/big/sub/{i}.jpg", b"z") for i in range(5)]
    jobs += [(f"t/odd/{k}", k.encode()) for k in KEYS]
    jobs += [("t/empty/", b""), ("t/top.jpg", b"")]
    s3_server.client().put_object(Bucket=BUCKET, Key="t/zero.jpg", Body=b"")
    from concurrent.futures import ThreadPoolExecutor
    c = s3_server.client()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: c.put_object(Bucket=BUCKET, Key=kv[0], Body=kv[1]), jobs))
    return len(jobs) + 1


def both(fn):
    """fn() with listings parsed in C, then in Python."""
    try:
        fs3.NATIVE_LISTING = True
        a = fn()
        fs3.NATIVE_LISTING = False
        b = fn()
    finally:
        fs3.NATIVE_LISTING = True
    return a, b


def test_the_same_listing_as_python(s3_server, objects):
    o = opts(s3_server)
    url = f"s3://{BUCKET}/t"
    for workers in (1, 8):
        c, py = both(lambda: fs3.list_objects(url, o, workers=workers))
        assert len(c) == objects
        assert c == py            # keys, sizes, ETags, S3's order
    keys = {x.key for x in c}
    assert {f"t/odd/{k}" for k in KEYS} <= keys and "t/big/sub/4.jpg" in keys
    assert {x.key: x.size for x in c}["t/c01/0006.jpg"] == 6
    assert all(x.etag.startswith('"') for x in c)
    c, py = both(lambda: fastread.scan(url, s3=o))
    assert c[0] == py[0] and (c[1] == py[1]).all()
    assert c[0].versions == py[0].versions
    assert len(c[0]) == 12 * 100 + 1100 + len(KEYS)  # t/top.jpg, t/zero.jpg: no class
    # A prefix that is not a folder, and nothing under it.
    c, py = both(lambda: fs3.list_objects(url + "/c0", o, workers=4))
    assert c == py and len(c) == 1000
    assert fs3.list_objects(url + "/nothing/", o, workers=4) == []


def test_listings_in_flight_at_once_and_retried(s3_server, s3_proxy, objects):
    o = opts(s3_server, s3_proxy.endpoint)
    url = f"s3://{BUCKET}/t"
    want = fs3.list_objects(url, opts(s3_server), workers=1)
    s3_proxy.delay_ms = 20
    is_list = lambda method, target: "list-type=2" in target
    s3_proxy.fail("slowdown", times=2, match=is_list)
    s3_proxy.fail("reset", times=1, match=is_list)
    s3_proxy.fail("truncate", times=1, match=is_list, keep=300)
    got = fs3.list_objects(url, o, workers=8)
    assert got == want    # nothing lost or doubled by the retries
    assert s3_proxy.inflight()["max"] > 1
    s3_proxy.fail("slowdown", times=1, match=is_list)
    keys, sizes, etags, left, stats = fs3._s3.list_tree(o.engine_args(), BUCKET, "t/", True,
                                                        -1, 8)
    assert len(sizes) == len(want) and left == []
    assert stats["inflight_max"] > 1 and stats["retries"] == 1
    assert stats["requests"] == 1 + 1 + 16 + 1   # a retry, t/, 16 folders, big/'s 2nd page
    keys, sizes, etags, left, stats = fs3._s3.list_tree(o.engine_args(), BUCKET, "t/", True,
                                                        1, 8)
    # max_depth=1: the folders under t/ seen, not listed; only t/'s own objects.
    assert sorted(left) == sorted(f"t/{d}/" for d in
                                  [f"c{c:02d}" for c in range(12)] + ["big", "odd", "empty"])
    assert len(sizes) == len(keys[1]) - 1 == 2   # t/top.jpg and t/zero.jpg


def test_errors_name_the_url(s3_server, s3_proxy, objects):
    o = opts(s3_server)
    url = "s3://no-such-bucket-c/x/"
    for workers in (1, 4):
        with pytest.raises(OSError) as e:
            fs3.list_objects(url, o, workers=workers)
        assert url in str(e.value) and "NoSuchBucket" in str(e.value)
        assert s3_server.secret_key not in str(e.value)
    # A 403 that is not retried, and retries running out.
    op = fastread.S3Options.coerce(opts(s3_server, s3_proxy.endpoint), retries=1)
    s3_proxy.fail("status", times=1, status=403, code="AccessDenied")
    with pytest.raises(OSError) as e:
        fs3.list_objects(f"s3://{BUCKET}/t/", op, workers=4)
    assert "AccessDenied" in str(e.value) and f"s3://{BUCKET}/t/" in str(e.value)
    s3_proxy.fail("slowdown", times=10)
    with pytest.raises(OSError) as e:
        fs3.list_objects(f"s3://{BUCKET}/t/", op, workers=4)
    assert "503" in str(e.value)


def list_requests(proxy):
    return sum(1 for method, target, *_ in proxy.log if "list-type=2" in target)


@pytest.mark.parametrize("parser", ["c", "python"])
def test_a_kept_listing_is_reused_while_fresh(s3_server, s3_proxy, objects, tmp_path, parser,
                                              monkeypatch):
    monkeypatch.setattr(fs3, "NATIVE_LISTING", parser == "c")
    o = opts(s3_server, s3_proxy.endpoint)
    url = f"s3://{BUCKET}/t"
    cache = tmp_path / "cache"
    want = fastread.scan(url, s3=o)
    n0 = list_requests(s3_proxy)
    first = fastread.scan(url, s3=o, listing_cache=cache)
    n1 = list_requests(s3_proxy)
    again = fastread.scan(url, s3=o, listing_cache=cache)
    assert list_requests(s3_proxy) == n1 > n0      # the second: no request at all
    for got in (first, again):
        assert got[0] == want[0] and (got[1] == want[1]).all()
        assert got[0].versions == want[0].versions
    # Too old (max age 0: never reused), or unreadable: listed again.
    fastread.scan(url, s3=o, listing_cache=cache, listing_max_age_s=0)
    assert list_requests(s3_proxy) > n1
    (kept,) = [p for p in (cache / "listings").iterdir() if p.suffix == ".npz"]
    kept.write_bytes(b"not a listing")
    n2 = list_requests(s3_proxy)
    assert fastread.scan(url, s3=o, listing_cache=cache)[0] == want[0]
    assert list_requests(s3_proxy) > n2
    # An object added is seen once the kept listing is older than the age allowed.
    s3_server.put(BUCKET, "t/c00/new.jpg", b"n")
    try:
        assert len(fastread.scan(url, s3=o, listing_cache=cache)[0]) == len(want[0])
        import time
        time.sleep(1.1)
        assert len(fastread.scan(url, s3=o, listing_cache=cache,
                                 listing_max_age_s=1)[0]) == len(want[0]) + 1
    finally:
        s3_server.client().delete_object(Bucket=BUCKET, Key="t/c00/new.jpg")
