"""The node-local object cache (cache_dir=, cache_bytes=; csrc/core/object_cache.h)
against a real S3 server (SeaweedFS) behind the counting proxy
(tests/s3_proxy.py): a first epoch fetches every object and stores it, a
second reads every one from local disk with no request at all; an object
whose size changed (a listing's sizes as hints) and an entry whose bytes
were damaged are fetched again; cache_bytes bounds the entries; two
processes reading the same objects at once through one cache fetch each
object once; the settings come from FASTREAD_OBJECT_CACHE_DIR/FASTREAD_OBJECT_CACHE_BYTES
too, and a Reader's stats() sums its threads' counters."""
import collections
import errno
import glob
import os
import random
import subprocess
import sys
import time

import pytest

import fastread

pytestmark = pytest.mark.usefixtures("s3_engine")


def opts(endpoint, srv, **extra):
    return fastread.S3Options(endpoint_url=endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key,
                              **extra)


def rand_bytes(rng, n):
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


@pytest.fixture(scope="module")
def objects(s3_server):
    """40 objects in bucket 'cached' (an empty one, one of 3 MiB read in
    parts): {url: bytes}."""
    bucket = s3_server.make_bucket("cached")
    rng = random.Random(11)
    data = {}
    for i in range(40):
        size = 0 if i == 0 else (3 << 20) + 7 if i == 1 else rng.randrange(1, 200_000)
        blob = rand_bytes(rng, size)
        data[s3_server.put(bucket, f"obj/{i:03d}.bin", blob)] = blob
    return data


def gets(proxy):
    # The settled log: the proxy records a request after relaying its
    # response, so a count taken right after a read could miss its last GETs.
    return sum(1 for m, *_ in proxy.settled_log() if m == "GET")


def read_all(ctx, urls, sizes=None):
    batch = ctx.read(urls, sizes=sizes)
    assert not batch.failures(), batch.failures()
    return [a.tobytes() for a in batch.arrays()]


def test_second_epoch_reads_no_object_over_the_network(s3_server, s3_proxy, objects, tmp_path):
    urls = list(objects)
    o = opts(s3_proxy.endpoint, s3_server, part_size=1 << 20)
    cache = str(tmp_path / "cache")
    ctx = fastread.open_context("s3", s3=o, cache_dir=cache)
    assert read_all(ctx, urls) == [objects[u] for u in urls]
    st = ctx.stats()
    assert st["cache_misses"] == len(urls) and st["cache_hits"] == 0
    assert st["cache_bytes_written"] == sum(map(len, objects.values()))
    assert st["cache_usage"] == st["cache_bytes_written"]
    first = gets(s3_proxy)
    assert first >= len(urls)
    # Epoch 2 in a fresh context (another process would do the same):
    # every object from local disk, not one request.
    ctx2 = fastread.open_context("s3", s3=o, cache_dir=cache)
    random.Random(3).shuffle(urls)
    assert read_all(ctx2, urls) == [objects[u] for u in urls]
    st = ctx2.stats()
    assert st["cache_hits"] == len(urls) and st["cache_misses"] == 0
    assert st["s3_requests"] == 0 and st["cache_bytes_written"] == 0
    assert len(s3_proxy.log) == first == gets(s3_proxy)
    # read_files takes the same options; duplicates in a list are fine.
    arrays = fastread.read_files(urls[:3] + urls[:1], s3=o, cache_dir=cache)
    assert [a.tobytes() for a in arrays] == [objects[u] for u in urls[:3] + urls[:1]]
    assert len(s3_proxy.log) == first


def test_mixed_batch_keeps_list_order_and_errors(s3_server, s3_proxy, objects, tmp_path):
    urls = list(objects)
    o = opts(s3_proxy.endpoint, s3_server)
    cache = str(tmp_path / "cache")
    ctx = fastread.open_context("s3", s3=o, cache_dir=cache)
    read_all(ctx, urls[::2])  # half cached
    missing = "s3://cached/obj/none.bin"
    mixed = urls[:10] + [missing] + urls[10:20]
    batch = ctx.read(mixed)
    fails = batch.failures()
    assert [i for i, _ in fails] == [10]
    arrays = batch.arrays()
    for i, u in enumerate(mixed):
        if u != missing:
            assert arrays[i].tobytes() == objects[u], i
    # The failed object's message survives the split of the list.
    assert "404" in ctx.sample_error(10) and missing in ctx.sample_error(10)
    st = ctx.stats()
    assert st["cache_hits"] == 10 and st["cache_misses"] == len(urls[::2]) + 11


def test_changed_object_is_fetched_again(s3_server, s3_proxy, tmp_path):
    bucket = s3_server.make_bucket("changing")
    url = s3_server.put(bucket, "a.bin", b"x" * 1000)
    o = opts(s3_proxy.endpoint, s3_server)
    cache = str(tmp_path / "cache")
    ctx = fastread.open_context("s3", s3=o, cache_dir=cache)
    assert read_all(ctx, [url]) == [b"x" * 1000]
    s3_server.put(bucket, "a.bin", b"y" * 1500)  # new bytes, same key
    listing = {f"s3://{bucket}/{obj.key}": obj.size
               for obj in fastread.s3.list_objects(f"s3://{bucket}/", s3=o)}
    before = gets(s3_proxy)
    # A listing's size differs from the entry's: stale, fetched, stored.
    assert read_all(ctx, [url], sizes=[listing[url]]) == [b"y" * 1500]
    assert gets(s3_proxy) > before and ctx.stats()["cache_misses"] == 2
    before = gets(s3_proxy)
    assert read_all(ctx, [url], sizes=[1500]) == [b"y" * 1500]
    assert read_all(fastread.open_context("s3", s3=o, cache_dir=cache), [url]) == [b"y" * 1500]
    assert gets(s3_proxy) == before


def test_object_rewritten_with_the_same_size_is_fetched_again(s3_server, s3_proxy, tmp_path):
    """An entry keeps the ETag its object came with; a Reader over the
    prefix lists the objects first and drops the entries whose ETag the
    listing contradicts, so an object rewritten in place with the same size
    (the case a size check cannot see) is fetched again, and only it."""
    bucket = s3_server.make_bucket("rewrites")
    for c in ("a", "b"):
        for i in range(3):
            s3_server.put(bucket, f"t/{c}/{i}.bin", bytes([ord(c), i]) * 500)
    o = opts(s3_proxy.endpoint, s3_server)
    cache = str(tmp_path / "cache")

    def epoch():
        with fastread.Reader(f"s3://{bucket}/t", file_filters=["*.bin"], batch_size=4, s3=o,
                             cache_dir=cache) as r:
            out = {}
            for arrays, labels in r:
                out.update((bytes(a[:2]), a.tobytes()) for a in arrays)
            return out, r.stats()

    first, st = epoch()
    assert st["cache_misses"] == 6 and len(first) == 6
    again, st = epoch()
    assert again == first and st["cache_hits"] == 6 and st["cache_misses"] == 0
    url = s3_server.put(bucket, "t/b/1.bin", b"Z" * 1000)      # same size, new bytes
    fresh = {k: v for k, v in first.items() if k != bytes([ord("b"), 1])}
    fresh[b"ZZ"] = b"Z" * 1000
    before = gets(s3_proxy)
    got, st = epoch()
    assert got == fresh, "the rewritten object was served from the old entry"
    assert st["cache_misses"] == 1 and st["cache_hits"] == 5
    gets_now = [t for m, t, *_ in s3_proxy.settled_log()[before:] if m == "GET" and "list-type" not in t]
    assert len(gets_now) == 1 and gets_now[0].endswith("/t/b/1.bin"), gets_now
    assert url.endswith("t/b/1.bin")


def test_damaged_entry_is_fetched_again(s3_server, s3_proxy, objects, tmp_path):
    urls = list(objects)[2:8]
    o = opts(s3_proxy.endpoint, s3_server)
    cache = tmp_path / "cache"
    ctx = fastread.open_context("s3", s3=o, cache_dir=str(cache))
    read_all(ctx, urls)
    datas = sorted(glob.glob(str(cache / "*" / "*.data")))
    assert len(datas) == len(urls)
    # Bit rot (same size) in one, a truncation in another.
    with open(datas[0], "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    os.truncate(datas[1], 1)
    before = gets(s3_proxy)
    ctx2 = fastread.open_context("s3", s3=o, cache_dir=str(cache))
    assert read_all(ctx2, urls) == [objects[u] for u in urls]
    st = ctx2.stats()
    assert st["cache_damaged"] == 1  # the truncated one is no entry at all: a plain miss
    assert st["cache_hits"] == len(urls) - 2 and st["cache_misses"] == 2
    assert gets(s3_proxy) == before + 2
    # Stored again: the next read is all hits.
    ctx3 = fastread.open_context("s3", s3=o, cache_dir=str(cache))
    assert read_all(ctx3, urls) == [objects[u] for u in urls]
    assert ctx3.stats()["cache_hits"] == len(urls) and gets(s3_proxy) == before + 2


def test_cache_bytes_bounds_the_entries(s3_server, s3_proxy, tmp_path):
    bucket = s3_server.make_bucket("bounded")
    rng = random.Random(5)
    data = {s3_server.put(bucket, f"{i:02d}", rand_bytes(rng, 100_000)): None for i in range(30)}
    urls = list(data)
    limit = 1_000_000
    o = opts(s3_proxy.endpoint, s3_server)
    cache = tmp_path / "cache"
    ctx = fastread.open_context("s3", s3=o, cache_dir=str(cache), cache_bytes=limit)
    for start in range(0, len(urls), 5):
        ctx.read(urls[start:start + 5])
        held = sum(os.path.getsize(p) for p in glob.glob(str(cache / "*" / "*.data")))
        assert held <= limit
    st = ctx.stats()
    assert st["cache_evictions"] >= 20 and st["cache_usage"] <= limit
    # The most recent stayed: read from the cache.
    before = gets(s3_proxy)
    ctx.read(urls[-5:])
    assert gets(s3_proxy) == before and ctx.stats()["cache_hits"] == 5
    # The oldest went: fetched again.
    ctx.read(urls[:1])
    assert gets(s3_proxy) == before + 1


CHILD = r"""
import os, sys, time, fastread
endpoint, region, key, secret, cache, go = sys.argv[1:7]
urls = sys.argv[7:]
o = fastread.S3Options(endpoint_url=endpoint, region=region, access_key_id=key,
                       secret_access_key=secret)
ctx = fastread.open_context("s3", s3=o, cache_dir=cache)
open(go + "." + str(os.getpid()), "w").close()   # ready
while not os.path.exists(go):   # both start together
    time.sleep(0.001)
batch = ctx.read(urls)
assert not batch.failures(), batch.failures()
print(ctx.stats()["cache_misses"], ctx.stats()["cache_waits"], flush=True)
"""


def test_two_processes_fetch_each_object_once(s3_server, s3_proxy, objects, tmp_path):
    urls = [u for u in objects if len(objects[u]) < (1 << 20)]
    s3_proxy.delay_ms = 30  # fetches overlap: the second process finds objects being fetched
    cache = str(tmp_path / "cache")
    go = str(tmp_path / "go")
    procs = []
    for seed in (1, 2):
        order = list(urls)
        random.Random(seed).shuffle(order)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", CHILD, s3_proxy.endpoint, s3_server.region,
             s3_server.access_key, s3_server.secret_key, cache, go] + order,
            stdout=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 60
        while len(glob.glob(go + ".*")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        open(go, "w").close()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    misses = [int(o.split()[0]) for o in outs]
    waits = [int(o.split()[1]) for o in outs]
    assert sum(misses) == len(urls)  # each object fetched by one of them
    per_key = collections.Counter(t.split("?")[0] for m, t, *_ in s3_proxy.log if m == "GET")
    assert len(per_key) == len(urls) and set(per_key.values()) == {1}, per_key
    # And the result is one complete cache.
    ctx = fastread.open_context("s3", s3=opts(s3_proxy.endpoint, s3_server), cache_dir=cache)
    assert read_all(ctx, urls) == [objects[u] for u in urls]
    assert ctx.stats()["cache_hits"] == len(urls)


def test_environment_and_reader_stats(s3_server, s3_proxy, objects, tmp_path, monkeypatch):
    urls = list(objects)[:12]
    o = opts(s3_proxy.endpoint, s3_server)
    cache = tmp_path / "envcache"
    monkeypatch.setenv("FASTREAD_OBJECT_CACHE_DIR", str(cache))
    monkeypatch.setenv("FASTREAD_OBJECT_CACHE_BYTES", str(1 << 30))
    assert fastread.EngineOptions().resolve("s3")["cache_dir"] == str(cache)
    assert fastread.EngineOptions().resolve("s3")["cache_bytes"] == 1 << 30
    with pytest.raises(ValueError, match="cache_bytes"):
        fastread.EngineOptions(cache_bytes=-1)
    for epoch in range(2):
        with fastread.Reader(files=urls, batch_size=4, s3=o, workers=2) as r:
            got = [a.tobytes() for arrays, _ in r for a in arrays]
            st = r.stats()
        assert got == [objects[u] for u in urls]
        if epoch == 0:
            assert st["cache_misses"] == len(urls) and st["s3_requests"] >= len(urls)
            first = gets(s3_proxy)
        else:
            assert st["cache_hits"] == len(urls) and st["cache_misses"] == 0
            assert st["s3_requests"] == 0 and gets(s3_proxy) == first
    assert len(glob.glob(str(cache / "*" / "*.data"))) == len(urls)


def test_entries_are_per_endpoint_and_credentials(s3_server, s3_proxy, tmp_path):
    """An entry serves only readers of the endpoint and access key id it
    was fetched with: a reader of another endpoint (here the server itself,
    not the proxy in front of it) fetches its own bytes, and one whose
    access key id the server refuses gets the server's 403, not the bytes
    another reader cached."""
    bucket = s3_server.make_bucket("scoped")
    url = s3_server.put(bucket, "k.bin", b"first" * 100)
    cache = str(tmp_path / "cache")
    via_proxy = opts(s3_proxy.endpoint, s3_server)
    ctx = fastread.open_context("s3", s3=via_proxy, cache_dir=cache)
    assert read_all(ctx, [url]) == [b"first" * 100] and ctx.stat("cache_misses") == 1
    ctx.close()
    # The same cache and endpoint: a hit.
    ctx = fastread.open_context("s3", s3=via_proxy, cache_dir=cache)
    assert read_all(ctx, [url]) == [b"first" * 100] and ctx.stat("cache_hits") == 1
    ctx.close()
    # Another endpoint: its own fetch, and its own entry.
    s3_server.put(bucket, "k.bin", b"later" * 100)
    ctx = fastread.open_context("s3", s3=opts(s3_server.endpoint, s3_server), cache_dir=cache)
    assert read_all(ctx, [url]) == [b"later" * 100]
    assert ctx.stat("cache_hits") == 0 and ctx.stat("cache_misses") == 1
    ctx.close()
    # An access key id the server does not know: its 403, no cached bytes.
    stranger = fastread.S3Options(endpoint_url=s3_proxy.endpoint, region=s3_server.region,
                                  access_key_id="STRANGER", secret_access_key="nope")
    ctx = fastread.open_context("s3", s3=stranger, cache_dir=cache)
    batch = ctx.read([url])
    assert dict(batch.failures()) == {0: errno.EACCES} and "403" in ctx.sample_error(0)
    assert ctx.stat("cache_hits") == 0
    ctx.close()
    # A listing's stale-entry check compares the entries of its own scope:
    # the proxy's entry (of "first") is stale against the listing's ETag.
    from fastread import s3 as fs3
    listing = {url: (o.etag, o.size) for o in fs3.list_objects(f"s3://{bucket}/", via_proxy)
               for url in [f"s3://{bucket}/{o.key}"]}
    args = fastread.EngineOptions(s3=via_proxy).resolve("s3")["engine_args"]
    assert fs3.drop_stale_entries(listing, cache, args) == 1
    ctx = fastread.open_context("s3", s3=via_proxy, cache_dir=cache)
    assert read_all(ctx, [url]) == [b"later" * 100] and ctx.stat("cache_misses") == 1
    ctx.close()
