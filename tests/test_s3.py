"""The s3 engine against a real S3 server (SeaweedFS, tests/s3_server.py):
exact bytes of thousands of objects (empty ones, multi-part ones), keys that
need encoding, listings past one page, scans equal to local ones, byte
ranges, errors that name the URL and S3's code without a secret, unsigned
requests, credentials from the environment and the AWS files."""
import errno
import os
import random

import numpy as np
import pytest

import fastread
from fastread import s3 as fs3

pytestmark = pytest.mark.usefixtures("s3_engine")


def opts(srv, **extra):
    """S3Options reaching the test server (or `endpoint_url`: a proxy in
    front of it) with its credentials."""
    extra.setdefault("endpoint_url", srv.endpoint)
    return fastread.S3Options(region=srv.region, access_key_id=srv.access_key,
                              secret_access_key=srv.secret_key, **extra)


def rand_bytes(rng, n):
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


@pytest.fixture(scope="module")
def many(s3_server):
    """2,000 small objects (empty ones among them) and a few of several MiB,
    in bucket 'many' under 'set/'. {key: bytes}."""
    bucket = s3_server.make_bucket("many")
    rng = random.Random(7)
    data = {}
    for i in range(2000):
        size = 0 if i % 97 == 0 else rng.randrange(1, 6000)
        data[f"set/{i:05d}.bin"] = rand_bytes(rng, size)
    for i, size in enumerate((3 << 20, (5 << 20) + 12345, 1 << 20)):
        data[f"set/big{i}.bin"] = rand_bytes(rng, size)
    import concurrent.futures
    c = s3_server.client()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: c.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                      data.items()))
    return data


def test_engine_is_listed_with_libcurl():
    version, why = fastread.engine.s3_version()
    assert why is None and version.startswith("libcurl ")
    # Not True: it reads no local file (the generic engine tests skip it).
    said = f"{fastread.engine.URL_ONLY['s3']}: {version}"
    assert fastread.engines()["s3"] == fastread.EngineStatus(files=said, ranges=said)
    assert fastread.engine.resolve("s3") == "s3"
    from fastread.cli import info
    data = info.collect()
    assert data["s3"]["libcurl"] == version
    assert any(line.lstrip().startswith("s3") and "available for s3:// URLs only" in line
               for line in info.format_engines(data, width=200))
    # auto never picks s3 for local files
    assert fastread.engine.resolve("auto") != "s3"
    assert fastread.engine.for_paths("auto", "s3://b/k") == "s3"
    assert fastread.engine.for_paths("auto", "/local/k") == "auto"
    assert fastread.engine.for_paths("psync", "s3://b/k") == "psync"


def test_exact_bytes_of_thousands(s3_server, many):
    keys = sorted(many)
    urls = [f"s3://many/{k}" for k in keys]
    o = opts(s3_server, part_size=256 << 10)  # the big objects in many parts
    ctx = fastread.open_context("s3", s3=o)
    for round_ in range(2):  # sizes unknown, then remembered (straight into the arena)
        batch = ctx.read(urls)
        assert batch.failures() == []
        arrays = batch.arrays()
        for k, a in zip(keys, arrays):
            assert a.tobytes() == many[k], (round_, k)
    # The second read knew every size (remembered: a mean of a few KiB a
    # file) and went straight into the arena.
    assert ctx.stat("remembered_calls") == 1
    assert ctx.stat("s3_bytes") == 2 * sum(map(len, many.values()))
    # Large objects' sizes are remembered too: the next read of them skips
    # the probes (2 requests for a 3 MiB object in parts of 2 MiB, not 3).
    big = [u for u in urls if "big" in u]
    ctx2 = fastread.open_context("s3", s3=opts(s3_server, part_size=2 << 20))
    ctx2.read(big)
    first = ctx2.stat("s3_requests")
    batch = ctx2.read(big)
    assert [a.tobytes() for a in batch.arrays()] == [many[u[len("s3://many/"):]] for u in big]
    assert ctx2.stat("remembered_calls") == 1
    assert ctx2.stat("s3_requests") - first == sum(-(-len(many[u[len("s3://many/"):]]) // (2 << 20))
                                                   for u in big)
    # Connections are kept: far fewer than requests.
    assert ctx.stat("s3_connections") <= ctx.stat("inflight")
    assert ctx.stat("s3_requests") > 2 * len(urls)
    assert 1 < ctx.stat("s3_inflight_max") <= ctx.stat("inflight")
    # read_files with engine auto picks s3 for URLs.
    got = fastread.read_files(urls[:300], s3=o)
    assert [a.tobytes() for a in got] == [many[k] for k in keys[:300]]
    # Options as a mapping: the same cached context (its connections) each call.
    as_dict = o.given()
    fastread.read_files(urls[:2], s3=as_dict)
    from fastread import engine
    cached = engine._local.contexts  # read_files()'s per-thread contexts (engine.cached_context)
    n = len(cached)
    fastread.read_files(urls[2:4], s3=dict(as_dict))
    assert len(cached) == n


def test_known_sizes_and_a_size_that_changed(s3_server):
    s3_server.make_bucket("change")
    url_a = s3_server.put("change", "a.bin", b"a" * 1000)
    url_b = s3_server.put("change", "b.bin", b"")
    ctx = fastread.open_context("s3", s3=opts(s3_server))
    assert [a.tobytes() for a in ctx.read([url_a, url_b]).arrays()] == [b"a" * 1000, b""]
    # Hints as the sizes were; the objects changed since.
    s3_server.put("change", "a.bin", b"A" * 1500)
    s3_server.put("change", "b.bin", b"now")
    batch = ctx.read([url_a, url_b], sizes=[1000, 0])
    assert [a.tobytes() for a in batch.arrays()] == [b"A" * 1500, b"now"]
    assert ctx.stat("s3_repairs") == 2
    # Right hints: read straight into place, nothing repaired.
    batch = ctx.read([url_a, url_b], sizes=[1500, 3])
    assert [a.tobytes() for a in batch.arrays()] == [b"A" * 1500, b"now"]
    assert ctx.stat("s3_repairs") == 2
    # Some sizes known, some not (-1), one wrong: every byte right, one repair.
    url_c = s3_server.put("change", "c.bin", b"c" * 70000)
    for dense_sizes in ([1500, -1, -1], [-1, 3, 70000], [1500, 2, -1]):
        batch = ctx.read([url_a, url_b, url_c], sizes=dense_sizes)
        assert [a.tobytes() for a in batch.arrays()] == [b"A" * 1500, b"now", b"c" * 70000]
    assert ctx.stat("s3_repairs") == 3


KEYS = ["with space.jpg", "ünïcödé/日本語.jpg", "plus+sign.jpg", "pct%20literal.jpg",
        "tilde~_-.jpg", "q?uestion#hash.jpg", "semi;colon=eq&.jpg"]


def test_keys_that_need_encoding(s3_server):
    bucket = s3_server.make_bucket("keys")
    for i, k in enumerate(KEYS):
        s3_server.put(bucket, f"enc/{k}", k.encode() * (i + 1))
    urls = [f"s3://keys/enc/{k}" for k in KEYS]
    got = fastread.read_files(urls, s3=opts(s3_server))
    assert [a.tobytes() for a in got] == [k.encode() * (i + 1) for i, k in enumerate(KEYS)]
    listed = fs3.list_objects("s3://keys/enc/", opts(s3_server))
    assert sorted(o.key for o in listed) == sorted(f"enc/{k}" for k in KEYS)
    assert {o.key: o.size for o in listed}[f"enc/{KEYS[1]}"] == 2 * len(KEYS[1].encode())


def test_listing_past_one_page(s3_server, many):
    listed = fs3.list_objects("s3://many/set/", opts(s3_server))
    assert [o.key for o in listed] == sorted(many, key=lambda k: k.encode())
    assert {o.key: o.size for o in listed} == {k: len(v) for k, v in many.items()}
    assert fs3.list_objects("s3://many/nothing-here/", opts(s3_server)) == []
    with pytest.raises(OSError) as e:
        fs3.list_objects("s3://no-such-bucket-x/", opts(s3_server))
    assert e.value.errno == errno.ENOENT and "NoSuchBucket" in str(e.value)


def make_tree(root, rng):
    """A class-per-directory tree with what scan must skip: files in the
    root, a deeper directory, names the filters refuse, an empty class."""
    files = {}
    for cls in ("dog", "Cat", "bird ü", "ant"):
        os.makedirs(os.path.join(root, cls))
        for j in range(rng.randrange(2, 6)):
            name = f"{cls[:2]}_{j}{rng.choice(['.jpg', '.JPEG', '.png', '.txt'])}"
            files[f"{cls}/{name}"] = rand_bytes(rng, rng.randrange(0, 3000))
    os.makedirs(os.path.join(root, "dog", "deeper"))
    files["dog/deeper/skip.jpg"] = b"deep"
    files["root.jpg"] = b"root"
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(root, "empty"))  # a class on disk; on S3 only with a marker
    return files


def test_scan_and_reader_match_local(s3_server, tmp_path):
    rng = random.Random(3)
    local = str(tmp_path / "tree")
    os.makedirs(local)
    files = make_tree(local, rng)
    s3_server.upload_tree(local, "tree", "data")
    s3_server.put("tree", "data/empty/", b"")  # the folder marker an empty class leaves on S3
    o = opts(s3_server)
    lpaths, llabels = fastread.scan(local)
    spaths, slabels = fastread.scan("s3://tree/data", s3=o)
    assert [p[len(local):] for p in lpaths] == [p[len("s3://tree/data"):] for p in spaths]
    assert np.array_equal(llabels, slabels)
    # Filters and dir_filters act the same.
    for kw in ({"file_filters": ["*.png"]}, {"dir_filters": ["[bd]*"]}):
        lp, ll = fastread.scan(local, **kw)
        sp, sl = fastread.scan("s3://tree/data/", s3=o, **kw)
        assert [p[len(local):] for p in lp] == [p[len("s3://tree/data"):] for p in sp]
        assert np.array_equal(ll, sl)
    # A Reader over the URL reads the same samples and labels as one over disk.
    def epoch(reader):
        out = []
        for arrays, labels in reader:
            out += [(a.tobytes(), int(lab)) for a, lab in zip(arrays, labels)]
        return out
    with fastread.Reader("s3://tree/data", batch_size=5, s3=o) as r:
        assert r.engine == "s3"
        remote = epoch(r)
    with fastread.Reader(local, batch_size=5) as r:
        assert epoch(r) == remote
    # And one over a list of URLs, shuffled.
    with fastread.Reader(files=spaths, labels=slabels, batch_size=4, random_shuffle=True,
                         seed=1, s3=o, workers=2) as r:
        assert sorted(epoch(r)) == sorted(remote)


def test_byte_ranges(s3_server):
    rng = random.Random(5)
    blob = rand_bytes(rng, 700_000)
    url = s3_server.put(s3_server.make_bucket("ranges"), "img.bin", blob)
    ctx = fastread.open_context("s3", s3=opts(s3_server, part_size=64 << 10))
    offsets = [0, 1, 65535, 100_000, 699_999, 0, 123]
    lengths = [10, 65536, 200_001, 1, 1, 700_000, 0]
    batch = ctx.read_ranges(url, offsets, lengths)
    assert batch.failures() == []
    for o, n, a in zip(offsets, lengths, batch.arrays()):
        assert a.tobytes() == blob[o:o + n]
    # Past the end: an error of that range, never short data.
    batch = ctx.read_ranges(url, [699_990, 800_000, 5], [20, 5, 5])
    assert dict(batch.failures()) == {0: errno.ENODATA, 1: errno.ENODATA}
    assert "700000 bytes" in ctx.sample_error(0) and "416" in ctx.sample_error(1)
    assert batch.arrays()[2].tobytes() == blob[5:10]


def test_wrong_secret_names_403_not_the_secret(s3_server):
    secret = "WRONG-secret-value-42"
    bad = fastread.S3Options(endpoint_url=s3_server.endpoint, access_key_id=s3_server.access_key,
                             secret_access_key=secret)
    s3_server.make_bucket("many")
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files(["s3://many/set/00001.bin"], s3=bad)
    msg = str(e.value)
    assert e.value.errno == errno.EACCES and "403" in msg and "SignatureDoesNotMatch" in msg
    assert "s3://many/set/00001.bin" in msg and secret not in msg
    with pytest.raises(OSError) as e:
        fs3.list_objects("s3://many/", bad)
    assert "403" in str(e.value) and secret not in str(e.value)
    # No repr shows a secret.
    assert secret not in repr(bad) and secret not in str(bad)
    eo = fastread.EngineOptions(s3=bad, engine_args=f"secret_access_key={secret},region=x")
    assert secret not in repr(eo) and "region=x" in repr(eo)
    # A value the engine refuses is not echoed either.
    with pytest.raises(ValueError) as e:
        fastread.open_context("s3", engine_args=f"secret_access_key={'S' * 300},access_key_id=a")
    assert "SSSS" not in str(e.value) and "secret_access_key" in str(e.value)


def test_missing_object_names_the_url(s3_server, many):
    urls = ["s3://many/set/00002.bin", "s3://many/set/missing.bin"]
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files(urls, s3=opts(s3_server))
    assert e.value.errno == errno.ENOENT and e.value.filename == urls[1]
    assert "s3://many/set/missing.bin" in str(e.value) and "404 NoSuchKey" in str(e.value)
    # A Reader's native threads keep no message: it asks again, and says as much.
    with fastread.Reader(files=urls, batch_size=2, s3=opts(s3_server)) as r:
        with pytest.raises(fastread.ReadError) as e:
            list(r)
    assert e.value.errno == errno.ENOENT and "404 NoSuchKey" in str(e.value)


def test_dead_server_fails_within_the_deadline():
    import time
    o = fastread.S3Options(endpoint_url="http://127.0.0.1:1", unsigned=True, retries=2,
                           deadline_ms=5000)
    t0 = time.monotonic()
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files(["s3://b/k"], s3=o)
    assert e.value.errno == errno.ECONNREFUSED and time.monotonic() - t0 < 5
    assert "s3://b/k" in str(e.value)


def test_put_object_round_trip(s3_server):
    o = opts(s3_server)
    s3_server.make_bucket("puts")
    data = bytes(range(256)) * 1000
    fs3.put_object("s3://puts/dir/ü x+y.bin", data, o)
    assert fastread.read_files(["s3://puts/dir/ü x+y.bin"], s3=o)[0].tobytes() == data
    assert s3_server.client().get_object(Bucket="puts", Key="dir/ü x+y.bin")["Body"].read() == data


def test_unsigned_requests(s3_server, tmp_path):
    s3_server.make_bucket("many")
    o = fastread.S3Options(endpoint_url=s3_server.endpoint, unsigned=True)
    # The test server takes signed requests only: an anonymous one is refused.
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files(["s3://many/set/00003.bin"], s3=o)
    assert e.value.errno == errno.EACCES and "403" in str(e.value)
    # A server that lets anonymous users read a bucket serves it unsigned.
    import s3_server as s3s

    class Public(s3s.SeaweedFS):
        def _write_identities(self):
            import json
            path = os.path.join(self.workdir, "ids.json")
            with open(path, "w") as f:
                json.dump({"identities": [
                    {"name": "fastread",
                     "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                     "actions": ["Admin", "Read", "Write", "List"]},
                    {"name": "anonymous", "actions": ["Read:public", "List:public"]}]}, f)
            return path

    with Public(str(tmp_path / "public")) as pub:
        pub.make_bucket("public")
        url = pub.put("public", "a b.bin", b"open data")
        anon = fastread.S3Options(endpoint_url=pub.endpoint, unsigned=True)
        assert fastread.read_files([url], s3=anon)[0].tobytes() == b"open data"
        assert [x.key for x in fs3.list_objects("s3://public/", anon)] == ["a b.bin"]


def _without_aws_env(monkeypatch, home):
    for var in list(os.environ):
        if var.startswith("AWS_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(home))


def test_credentials_from_the_environment(s3_server, many, monkeypatch, tmp_path):
    _without_aws_env(monkeypatch, tmp_path)
    with pytest.raises(OSError) as e:
        fastread.open_context("s3")
    assert e.value.errno == errno.EACCES and "no credentials" in str(e.value)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    ctx = fastread.open_context("s3")
    assert ctx.read(["s3://many/set/00004.bin"]).arrays()[0].tobytes() == many["set/00004.bin"]
    assert ctx.stat("path_style") == 1
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    batch = fastread.open_context("s3").read(["s3://many/set/00004.bin"])
    assert batch.failures() == [(0, errno.EACCES)]


def test_credentials_from_a_profile(s3_server, many, monkeypatch, tmp_path):
    _without_aws_env(monkeypatch, tmp_path)
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "config").write_text(f"[default]\nregion = eu-north-1\n\n[profile train]\n"
                                f"region = {s3_server.region}\nendpoint_url = {s3_server.endpoint}\n")
    (aws / "credentials").write_text(f"[default]\naws_access_key_id = nobody\n"
                                     f"aws_secret_access_key = nothing\n\n[train]\n"
                                     f"aws_access_key_id = {s3_server.access_key}\n"
                                     f"aws_secret_access_key = {s3_server.secret_key}\n")
    want = many["set/00005.bin"]
    # ~/.aws (HOME) with AWS_PROFILE ...
    monkeypatch.setenv("AWS_PROFILE", "train")
    assert fastread.open_context("s3").read(["s3://many/set/00005.bin"]).arrays()[0].tobytes() \
        == want
    monkeypatch.delenv("AWS_PROFILE")
    # ... or the files named by the variables, and profile= as an option.
    moved = tmp_path / "elsewhere"
    (aws).rename(moved)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(moved / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(moved / "credentials"))
    got = fastread.read_files(["s3://many/set/00005.bin"], s3=fastread.S3Options(profile="train"))
    assert got[0].tobytes() == want
    assert [o.key for o in fs3.list_objects("s3://many/set/0000", profile="train")][:2] == \
        ["set/00000.bin", "set/00001.bin"]
    with pytest.raises(ValueError) as e:
        fastread.open_context("s3", s3=fastread.S3Options(profile="absent"))
    assert "'absent'" in str(e.value)


@pytest.fixture
def proxy(s3_server):
    """A fault-injecting proxy (tests/s3_proxy.py) in front of the real server."""
    import s3_proxy
    with s3_proxy.FaultProxy(s3_server.endpoint) as p:
        yield p


def test_retries_through_faults(s3_server, many, proxy):
    """5xx answers, resets, cut bodies and stalls are retried, with
    backoff, until the bytes are whole; 4xx answers are not retried."""
    keys = ["set/00010.bin", "set/00011.bin", "set/big0.bin"]
    urls = [f"s3://many/{k}" for k in keys]
    want = [many[k] for k in keys]
    o = fastread.S3Options(endpoint_url=proxy.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key, low_speed_time_s=1,
                           part_size=1 << 20)
    ctx = fastread.open_context("s3", s3=o)
    proxy.fail("slowdown", times=3, match="00010")
    proxy.fail("reset", times=2, match="00011")
    proxy.fail("truncate", times=2, match="big0", keep=1000)
    proxy.fail("stall", times=1, match="big0", seconds=8, after_bytes=100)
    batch = ctx.read(urls)
    assert batch.failures() == []
    assert [a.tobytes() for a in batch.arrays()] == want
    assert (proxy.counts["slowdown"], proxy.counts["reset"], proxy.counts["truncate"],
            proxy.counts["stall"]) == (3, 2, 2, 1)
    # Each fault cost a retry with backoff, except that libcurl itself
    # retries a request once on a kept connection reset before an answer.
    assert 7 <= ctx.stat("s3_retries") <= 8
    # A cut body with no retries left is an error, never short data.
    strict = fastread.open_context("s3", s3=o.__class__.coerce(o, retries=0))
    proxy.fail("truncate", times=1, match="00010", keep=10)
    batch = strict.read(urls[:1])
    assert batch.failures() == [(0, errno.EIO)]
    assert "s3://many/set/00010.bin" in strict.sample_error(0)
    # 4xx: the server's verdict stands at once.
    before = ctx.stat("s3_requests")
    proxy.fail("status", times=1, match="00011", status=403, code="AccessDenied")
    batch = ctx.read(urls[1:2])
    assert batch.failures() == [(0, errno.EACCES)] and ctx.stat("s3_requests") == before + 1
    assert "403 AccessDenied" in ctx.sample_error(0)
    # 5xx past the retries: an error naming the status.
    proxy.fail("status", times=10, match="00011", status=500, code="InternalError")
    batch = strict.read(urls[1:2])
    assert batch.failures() == [(0, errno.EIO)] and "500 InternalError" in strict.sample_error(0)


def test_throttling_until_the_deadline_names_the_throttling(s3_server, many, proxy):
    """Every answer a slow 503 SlowDown: the last retry starts with less
    time left than an answer takes and gets none. The error still names the
    server's answer (503 SlowDown), not a timeout, for the engine and for
    the client (listings, uploads) alike."""
    o = fastread.S3Options(endpoint_url=proxy.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key, retries=20,
                           deadline_ms=2000)
    # Answers at 0.8 s; backoffs of 50-100 then 100-200 ms: the third
    # attempt starts at 1.75-1.9 s and runs into the 2 s deadline.
    proxy.delay_ms = 800
    proxy.fail("slowdown", times=100)
    ctx = fastread.open_context("s3", s3=o)
    batch = ctx.read(["s3://many/set/00010.bin"])
    assert len(batch.failures()) == 1
    assert "503 SlowDown" in ctx.sample_error(0), ctx.sample_error(0)
    assert "s3://many/set/00010.bin" in ctx.sample_error(0)
    ctx.close()
    with pytest.raises(OSError) as e:
        fs3.list_objects("s3://many/set/", o)
    assert "503 SlowDown" in str(e.value) and "s3://many/set/" in str(e.value), str(e.value)
    assert proxy.counts["slowdown"] >= 4


def test_server_killed_mid_epoch_errs_within_the_deadline_and_reads_after_restart(s3_server):
    """The store dies between two batches of an epoch: the next batch fails
    with an error naming the URL within its deadline (no hang), and once the
    server is back the same Reader reads whole, exact epochs again."""
    import time
    s3_server.make_bucket("dies")
    rng = random.Random(11)
    want = {}
    for c in ("a", "b"):
        for i in range(16):
            url = s3_server.put("dies", f"t/{c}/{i:02d}.jpg", rand_bytes(rng, 20_000 + i))
            want[url] = None
    o = opts(s3_server, retries=2, deadline_ms=3000, connect_timeout_ms=500)
    reader = fastread.Reader("s3://dies/t", batch_size=8, s3=o, workers=1, prefetch=1)
    try:
        it = iter(reader)
        next(it)                      # the epoch has begun
        s3_server.kill()
        t0 = time.monotonic()
        with pytest.raises(fastread.ReadError) as err:
            for _ in it:              # batches read ahead before the kill may still come
                pass
        assert time.monotonic() - t0 < 30, "the dead server was waited on past its deadline"
        assert "s3://dies/t/" in str(err.value)
    finally:
        s3_server.restart()           # later tests share the server
    for _ in range(2):
        got = 0
        for arrays, _labels in reader:
            got += len(arrays)
        assert got == len(want)


def test_sigint_while_a_request_stalls_interrupts_promptly(s3_server, s3_proxy):
    """A Reader whose request to the store stalls (the proxy holds the
    response back for 60 s): SIGINT reaches Python at once, not when the
    request's deadline ends."""
    from conftest import assert_sigint_interrupts
    s3_server.make_bucket("stalls")
    for i in range(4):
        s3_server.put("stalls", f"t/c/{i}.jpg", bytes([i]) * 5000)
    s3_proxy.fail("stall", times=10, match="stalls/t/c/2.jpg", seconds=60)
    env = dict(os.environ, AWS_ENDPOINT_URL=s3_proxy.endpoint, AWS_REGION=s3_server.region,
               AWS_ACCESS_KEY_ID=s3_server.access_key, AWS_SECRET_ACCESS_KEY=s3_server.secret_key)
    assert_sigint_interrupts(
        'fastread.Reader("s3://stalls/t", batch_size=1, prefetch=1, workers=1, '
        's3=fastread.S3Options(deadline_ms=120000, low_speed_time_s=120))', env, settle_s=2.0)


def test_close_cancels_a_stalled_request_at_once(s3_server, s3_proxy):
    """Closing a Reader whose read-ahead waits on a stalled request (the
    proxy holds the answer 60 s, the request's own limits are 120 s) returns
    at once: the reader cancels the batches it drops (fr_ctx_cancel), it
    does not wait out their deadline. A new epoch after a stall does too."""
    import time
    s3_server.make_bucket("cancels")
    for i in range(6):
        s3_server.put("cancels", f"t/c/{i}.jpg", bytes([i]) * 5000)
    o = opts(s3_server, endpoint_url=s3_proxy.endpoint, deadline_ms=120000,
             low_speed_time_s=120, retries=1)
    s3_proxy.fail("stall", times=100, match="cancels/t/c/3.jpg", seconds=60)
    for action in ("new epoch", "close"):
        reader = fastread.Reader("s3://cancels/t", batch_size=1, prefetch=2, workers=1, s3=o)
        try:
            it = iter(reader)
            for _ in range(3):
                next(it)                    # objects 0-2; the worker now waits on 3
            deadline = time.monotonic() + 10
            while not any("3.jpg" in t for _m, t, a, _s in s3_proxy.log if a == "stall"):
                assert time.monotonic() < deadline, "the read-ahead never reached the stall"
                time.sleep(0.05)
            t0 = time.monotonic()
            if action == "close":
                reader.close()
            else:
                s3_proxy.clear()            # the new epoch's reads answer
                got = sum(len(a) for a, _l in reader)
                assert got == 6
            took = time.monotonic() - t0
            assert took < 10, f"{action} waited {took:.1f} s on a stalled request"
        finally:
            reader.close()
        s3_proxy.fail("stall", times=100, match="cancels/t/c/3.jpg", seconds=60)
    s3_proxy.clear()


def test_reader_memory_is_bounded_and_flat_over_20_epochs(s3_server, many):
    """Reader.memory() over 20 epochs of 403 objects (three of several
    MiB): the pool's batches, the engine's buffers and the process's
    resident memory do not grow after the first epochs."""
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    o = opts(s3_server, inflight=32)
    keys = sorted(many)
    urls = [f"s3://many/{k}" for k in keys[:400] + [k for k in keys if "big" in k]]
    with fastread.Reader(files=urls, batch_size=64, s3=o, workers=2, prefetch=2) as reader:
        seen = []
        for epoch in range(20):
            n = sum(len(arrays) for arrays, _labels in reader)
            assert n == len(urls)
            seen.append((reader.memory(), rss()))
    mem2, rss2 = seen[2]
    for epoch, (mem, r) in enumerate(seen[3:], 3):
        # The pool: what the threads may read ahead (prefetch + workers)
        # and the one batch the caller holds, however many epochs.
        assert mem["batches"] <= 2 + 2 + 1, (epoch, mem)
        assert mem["engine_buffer_bytes_max"] == mem2["engine_buffer_bytes_max"], (epoch, mem, mem2)
        assert 0 < mem["engine_buffer_bytes"] <= mem["engine_buffer_bytes_max"]
        assert r - rss2 < 32 << 20, f"resident memory grew {(r - rss2) >> 20} MiB by epoch {epoch}"
    # The bound docs/s3.md states, per worker: a receive buffer (and the
    # transfer's own few KiB) per request in flight, plus the first bytes of
    # a batch's objects of unknown size (min(part_size, 1 MiB) each).
    assert mem2["engine_buffer_bytes_max"] <= 2 * (32 * ((64 << 10) + (16 << 10)) + 64 * (1 << 20))
