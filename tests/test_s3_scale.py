"""S3 at scale against a real S3 server (SeaweedFS, tests/s3_server.py):
tar shards indexed from their headers only (ranged GETs, a jump over each
member: formats/_s3_tar.py), or from an index file beside them (only the
index fetched), and listings walked by common prefixes in parallel
(list_objects(workers=), scan()). Bytes are counted by the s3 client's
counter and requests by the test proxy."""
import io
import os
import subprocess
import shutil
import tarfile

import numpy as np
import pytest

import fastread
from fastread.formats import FormatError, WebDataset
from fastread.formats import _s3_tar
from fastread.formats.webdataset import TarMember, index_tar
from fastread import s3 as fs3

pytestmark = pytest.mark.usefixtures("s3_engine")

BUCKET = "scale-s3"


def opts(srv, endpoint=None):
    return fastread.S3Options(endpoint_url=endpoint or srv.endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key)


def add(tar, name, data, **kw):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data))


def tricky_tar(fmt):
    """A tar of ``fmt`` (GNU: long names as 'L' members; PAX: 'x' headers)
    with long names, empty members, a directory, many small members and
    some large ones."""
    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for i in range(150):
            key = f"dir/{'deep-' * 30}{i:04d}" if i % 7 == 0 else f"dir/s{i:04d}"
            add(tar, key + ".jpg", rng.bytes(int(rng.integers(0, 3000)) if i % 10 else 90_000))
            add(tar, key + ".cls", str(i).encode())
            if i % 13 == 0:
                add(tar, key + ".json", b"")       # an empty member
        if fmt == tarfile.PAX_FORMAT:
            # A name that fits ustar with a pax record anyway (non-ASCII).
            add(tar, "dir/caf\u00e9.jpg", b"x" * 700, pax_headers={"comment": "hi"})
    return buf.getvalue()


@pytest.fixture(scope="module")
def bucket(s3_server):
    s3_server.make_bucket(BUCKET)
    return BUCKET


def walk(url, o, **kw):
    # Header walks even of the small objects these tests make.
    kw.setdefault("whole_below", 0)
    return _s3_tar.walk_shards([url], index_tar, o, **kw)[0]


def test_small_shards_are_fetched_whole(s3_server, s3_proxy, bucket):
    """At most whole_below bytes: one GET of the object (after the first
    window), the same index as the walk's; above it, the walk."""
    data = tricky_tar(tarfile.GNU_FORMAT)
    url = s3_server.put(bucket, "whole/gnu.tar", data)
    before = len(s3_proxy.log)
    got = walk(url, opts(s3_server, s3_proxy.endpoint), whole_below=len(data), index_files=False)
    assert got.source == "whole object"
    assert got.requests == len(s3_proxy.settled_log()[before:]) == 2
    walked = walk(url, opts(s3_server), whole_below=len(data) - 1)
    assert walked.source == "headers" and walked.requests > 2
    assert got.names == walked.names and got.offsets.tolist() == walked.offsets.tolist()
    with pytest.raises(ValueError, match="whole_below"):
        walk(url, opts(s3_server), whole_below=-1)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_header_walk_equals_the_full_read(s3_server, bucket, fmt):
    data = tricky_tar(fmt)
    url = s3_server.put(bucket, f"tricky/{fmt}.tar", data)
    full = index_tar(data, url)
    got = walk(url, opts(s3_server))
    assert got.source == "headers" and got.size == len(data)
    assert got.names == [m.name for m in full]
    assert got.offsets.tolist() == [m.offset for m in full]
    assert got.sizes.tolist() == [m.size for m in full]
    assert got.headers.tolist() == [m.header for m in full]
    assert any(len(n) > 100 for n in got.names)          # long names were there
    assert (got.sizes == 0).any()
    # Members' data is skipped: fewer bytes than the shard, a request per
    # member (plus one per long-name / pax member).
    assert got.bytes_fetched < len(data) // 4
    assert got.requests <= 2 * len(full) + 2
    # Larger windows: the same index, fewer requests.
    wide = walk(url, opts(s3_server), window=8192)
    assert wide.names == got.names and wide.offsets.tolist() == got.offsets.tolist()
    assert wide.requests < got.requests


def test_header_walk_fetches_headers_only(s3_server, s3_proxy, bucket):
    """Large members: one 512-byte GET per member; the proxy sees exactly
    the requests the walk counts, and the client's byte counter stays
    within one block per member."""
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(40):
            add(tar, f"s{i:03d}.bin", rng.bytes(100_000 + i))
    data = buf.getvalue()
    url = s3_server.put(bucket, "big/members.tar", data)
    before = len(s3_proxy.log)
    got = walk(url, opts(s3_server, s3_proxy.endpoint), index_files=False)
    log = s3_proxy.settled_log()[before:]
    assert len(got) == 40
    assert len(log) == got.requests == 41           # 40 headers + the end-of-archive block
    assert all(target.startswith(f"/{bucket}/big/members.tar") for _, target, _, _ in log)
    assert got.bytes_fetched <= 41 * 512
    assert got.bytes_fetched <= len(data) / 150     # under 1% of the shard


def test_webdataset_over_headers_equals_the_local_shards(s3_server, bucket, disk_tmp):
    data = tricky_tar(tarfile.GNU_FORMAT)
    path = os.path.join(disk_tmp, "tricky-gnu.tar")
    with open(path, "wb") as f:
        f.write(data)
    url = s3_server.put(bucket, "wds-tricky/a.tar", data)
    local = WebDataset([path], ["jpg", "cls;json"])
    ours = WebDataset([url], ["jpg", "cls;json"], s3=opts(s3_server))
    assert len(ours) == len(local) > 100
    np.testing.assert_array_equal(ours.component_offsets, local.component_offsets)
    np.testing.assert_array_equal(ours.component_lengths, local.component_lengths)
    assert ours.files[0].names == local.files[0].names
    r = fastread.Reader(source=ours, batch_size=16)
    try:
        got = [bytes(a) for arrays, _ in r for a in arrays]
    finally:
        r.close()
    rl = fastread.Reader(source=local, batch_size=16)
    try:
        want = [bytes(a) for arrays, _ in rl for a in arrays]
    finally:
        rl.close()
    assert got == want


@pytest.mark.skipif(shutil.which("wds2idx") is None or shutil.which("tar") is None,
                    reason="DALI's wds2idx (pip install nvidia-dali) and GNU tar make the "
                           "index files")
def test_index_file_only_the_index_is_fetched(s3_server, s3_proxy, bucket, disk_tmp):
    from fastread.datasets import make_webdataset
    root = os.path.join(disk_tmp, "scale-idx")
    make_webdataset(root, shards=3, per_shard=11, width=40, height=30, seed=5)
    paths = sorted(os.path.join(root, p) for p in os.listdir(root) if p.endswith(".tar"))
    urls = []
    for p in paths:
        subprocess.run(["wds2idx", p, p + ".idx"], check=True, capture_output=True)
        name = os.path.basename(p)
        with open(p, "rb") as f:
            urls.append(s3_server.put(bucket, f"idx/{name}", f.read()))
        with open(p + ".idx", "rb") as f:
            s3_server.put(bucket, f"idx/{name}.idx", f.read())
    o = opts(s3_server, s3_proxy.endpoint)
    before = len(s3_proxy.log)
    walked = _s3_tar.walk_shards(urls, index_tar, o)
    log = s3_proxy.log[before:]
    assert [w.source for w in walked] == ["index file"] * 3
    assert sorted(t for _, t, _, _ in log) == sorted(f"/{bucket}/idx/{os.path.basename(p)}.idx"
                                                      for p in paths)
    for w, p in zip(walked, paths):
        with open(p, "rb") as f:
            full = index_tar(f.read(), p)
        assert w.names == [m.name for m in full]
        assert w.offsets.tolist() == [m.offset for m in full]
        assert w.sizes.tolist() == [m.size for m in full]
    local = WebDataset(paths, ["jpg", "cls"])
    ours = WebDataset(urls, ["jpg", "cls"], s3=o)
    np.testing.assert_array_equal(ours.component_offsets, local.component_offsets)
    np.testing.assert_array_equal(ours.component_lengths, local.component_lengths)


def test_bad_index_file_is_named(s3_server, bucket):
    url = f"s3://{bucket}/badidx/a.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        add(tar, "a.jpg", b"abc")
    s3_server.put(bucket, "badidx/a.tar", buf.getvalue())
    s3_server.put(bucket, "badidx/a.tar.idx", b"v9 1\njpg 512 3 a.jpg\n")
    with pytest.raises(FormatError, match="badidx/a.tar.idx.*wds2idx v1.2"):
        walk(url, opts(s3_server))
    # Without index files: the headers.
    assert walk(url, opts(s3_server), index_files=False).names == ["a.jpg"]


def test_errors_name_the_url_and_offset(s3_server, bucket):
    o = opts(s3_server)
    data = tricky_tar(tarfile.GNU_FORMAT)
    cases = {
        "cut-member.tar": data[:600_000 // 2 + 100],   # inside some member's data
        "cut-header.tar": data[:512 * 3 + 100],        # inside a header
        "notatar.tar": b"hello world" * 200,
        "empty.tar": b"",
    }
    for name, body in cases.items():
        url = s3_server.put(bucket, f"bad/{name}", body)
        with pytest.raises(FormatError) as e:
            walk(url, o)
        assert url in str(e.value), name
        if name != "empty.tar":
            assert e.value.offset is not None
    with pytest.raises(FormatError, match="truncated"):
        walk(f"s3://{bucket}/bad/cut-member.tar", o)
    missing = f"s3://{bucket}/bad/missing.tar"
    with pytest.raises(OSError) as e:
        walk(missing, o)
    assert missing in str(e.value) and s3_server.secret_key not in str(e.value)
    with pytest.raises(FileNotFoundError):
        walk(missing, o)
    with pytest.raises(ValueError, match="window"):
        _s3_tar.walk_shards([missing], index_tar, o, window=100)


def test_walk_of_many_shards_keeps_their_order(s3_server, bucket):
    urls = []
    for i in range(24):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for j in range(i % 5 + 1):
                add(tar, f"k{i}_{j}.bin", bytes([i]) * (j * 1000))
        urls.append(s3_server.put(bucket, f"many/{i:03d}.tar", buf.getvalue()))
    got = _s3_tar.walk_shards(urls, index_tar, opts(s3_server), workers=5)
    assert [g.url for g in got] == urls
    assert [len(g) for g in got] == [i % 5 + 1 for i in range(24)]
    indexed = _s3_tar.index_objects(urls, opts(s3_server), index_tar, TarMember, workers=3)
    assert list(indexed) == urls
    assert all(isinstance(m, TarMember) for m in indexed[urls[3]][0])


# ------------------------------------------------------------------ listing

@pytest.fixture(scope="module")
def tree(s3_server, bucket, disk_tmp):
    """~2,300 objects under s3://scale-s3/tree/: a class tree (30 classes,
    some with subfolders, one of 1,100 objects: more than a page), keys with
    spaces, '+' and non-ASCII, an empty-class marker, objects at the root."""
    root = os.path.join(disk_tmp, "scale-tree")
    n = 0
    for c in range(30):
        cls = f"class {c:02d}" if c % 9 == 0 else f"c{c:02d}+x" if c % 11 == 0 else f"c{c:02d}"
        count = 1100 if c == 4 else 35
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for i in range(count):
            name = f"\u00e9t\u00e9-{i}.jpg" if i % 17 == 0 else f"{i:05d}.jpg"
            with open(os.path.join(root, cls, name), "wb") as f:
                f.write(b"x" * (i % 3))
            n += 1
        if c % 4 == 0:
            sub = os.path.join(root, cls, "sub", "deeper")
            os.makedirs(sub, exist_ok=True)
            for i in range(20):
                with open(os.path.join(sub, f"{i}.jpg"), "wb") as f:
                    f.write(b"y")
                n += 1
    with open(os.path.join(root, "top.jpg"), "wb") as f:
        f.write(b"z")
    n += 1
    o = opts(s3_server)
    fs3.upload(root, f"s3://{bucket}/tree/", o, workers=16, progress=False)
    s3_server.put(bucket, "tree/empty-class/", b"")
    return root, f"s3://{bucket}/tree", o, n + 1


def test_parallel_listing_equals_the_sequential_walk(tree, s3_server, s3_proxy):
    root, url, o, n = tree
    seq = fs3.list_objects(url, o)
    assert len(seq) == n
    o_proxy = opts(s3_server, s3_proxy.endpoint)
    s3_proxy.delay_ms = 20
    par = fs3.list_objects(url, o_proxy, workers=8)
    assert par == seq                       # same objects, same (S3's) order
    assert s3_proxy.inflight()["max"] > 1   # listings were in flight at once
    # A prefix that is not a folder (keys compared as bytes), and a flat one.
    assert fs3.list_objects(url + "/c0", o, workers=4) == fs3.list_objects(url + "/c0", o)
    flat = fs3.list_objects(url + "/c04/", o, workers=4)
    assert flat == fs3.list_objects(url + "/c04/", o) and len(flat) > 1000
    with pytest.raises(ValueError, match="workers"):
        fs3.list_objects(url, o, workers=0)


def test_scan_lists_in_parallel_and_equals_the_local_tree(tree):
    root, url, o, _ = tree
    paths, labels = fastread.scan(url, s3=o)
    lpaths, llabels = fastread.scan(root)
    assert [p[len(url) + 1:] for p in paths] == [os.path.relpath(p, root) for p in lpaths]
    classes = sorted({p[len(url) + 1:].split("/")[0] for p in paths}, key=os.fsencode)
    assert len(classes) == 30
    # The empty class's marker sorts after every other class: the same labels.
    np.testing.assert_array_equal(labels, llabels)
    assert set(paths.versions) == set(paths)


def test_listing_errors_name_the_url(s3_server):
    o = opts(s3_server)
    url = "s3://no-such-bucket-here/x/"
    with pytest.raises(OSError) as e:
        fs3.list_objects(url, o, workers=4)
    assert url in str(e.value) and s3_server.secret_key not in str(e.value)
    with pytest.raises(OSError) as e:
        fastread.scan(url, s3=o)
    assert "no-such-bucket-here" in str(e.value)
