"""Large-object formats in a bucket of a real S3 server (SeaweedFS,
tests/s3_server.py), read by ranged GETs: packed images
(``PackedImage("s3://...")``, ``Reader(image=...)``,
``fastread.dali.readers.image``) give exactly the samples of the local
image they were uploaded from; a truncated or foreign object is named."""
import os
import time

import numpy as np
import pytest

import fastread
from fastread.image import ImageError

pytestmark = pytest.mark.usefixtures("s3_engine")

BUCKET = "formats-s3"


def opts(srv, endpoint=None):
    return fastread.S3Options(endpoint_url=endpoint or srv.endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key)


def upload_file(srv, path, bucket, key):
    with open(path, "rb") as f:
        return srv.put(bucket, key, f.read())


@pytest.fixture(scope="module")
def packed(disk_tmp, s3_server):
    """A tree of 3 classes (sizes 0 B to 20 KiB) packed into an image,
    uploaded with its index. (local PackedImage, image URL, S3Options)."""
    root = os.path.join(disk_tmp, "s3-packed-tree")
    rng = np.random.default_rng(21)
    for c, n in enumerate((9, 14, 6)):
        d = os.path.join(root, f"c{c}")
        os.makedirs(d)
        for j in range(n):
            size = 0 if (c, j) == (1, 3) else int(rng.integers(1, 20000))
            with open(os.path.join(d, f"{j:03d}.jpg"), "wb") as f:
                f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    img = fastread.pack(root, os.path.join(disk_tmp, "s3-packed.img"), progress=False)
    s3_server.make_bucket(BUCKET)
    url = upload_file(s3_server, img.path, BUCKET, "images/train.img")
    upload_file(s3_server, img.index_path, BUCKET, "images/train.img.index")
    return img, url, opts(s3_server)


def local_bytes(img):
    with open(img.path, "rb") as f:
        data = f.read()
    return [data[o:o + n] for o, n in zip(img.offsets.tolist(), img.lengths.tolist())]


def test_index_and_samples_equal_the_local_image(packed):
    local, url, o = packed
    img = fastread.PackedImage(url, s3=o)
    assert img.index_path == url + ".index"
    assert img.names == local.names
    for field in ("labels", "offsets", "lengths", "checksums"):
        np.testing.assert_array_equal(getattr(img, field), getattr(local, field))
    assert (img.image_id, img.image_size, img.alignment) == \
        (local.image_id, local.image_size, local.alignment)
    want = local_bytes(local)
    order = np.random.default_rng(0).permutation(len(img))
    got = img.read(order)   # the options it was opened with reach the reads
    assert [a.tobytes() for a in got] == [want[i] for i in order]
    assert got[list(order).index(local.names.index("c1/003.jpg"))].size == 0


def test_index_and_image_are_read_by_ranges(packed, s3_server, s3_proxy):
    """Every GET of the index and of the image is a ranged one (206), none
    a whole-object GET; no listing is needed either."""
    local, url, _ = packed
    img = fastread.PackedImage(url, s3=opts(s3_server, s3_proxy.endpoint))
    img.read(list(range(len(img))))
    gets = [(t, status) for method, t, _, status in s3_proxy.settled_log() if method == "GET"]
    assert any(t.endswith("/train.img.index") for t, _ in gets)
    assert any(t.endswith("/train.img") for t, _ in gets)
    assert gets and all(status == 206 for _, status in gets), gets
    assert not any("list-type" in t for t, _ in gets)


@pytest.mark.parametrize("kw", [dict(), dict(random_shuffle=True, seed=4, num_shards=2,
                                             shard_id=1)], ids=["plain", "shuffled-shard"])
def test_reader_batches_equal_the_local_image(packed, kw):
    local, url, o = packed
    ours = fastread.Reader(image=url, batch_size=7, s3=o, **kw)
    want = fastread.Reader(image=local.path, batch_size=7, **kw)
    assert ours.engine == "s3"
    for _ in range(2):
        got = [([a.tobytes() for a in arrays], labels.tolist()) for arrays, labels in ours]
        exp = [([a.tobytes() for a in arrays], labels.tolist()) for arrays, labels in want]
        assert got == exp


def test_environment_and_flat_options(packed, s3_server, monkeypatch):
    local, url, o = packed
    want = [a.tobytes() for a in local.read(range(len(local)))]
    img = fastread.PackedImage(url, s3=o)
    assert [a.tobytes() for a in fastread.Reader(image=img, batch_size=100)
            .__iter__().__next__()[0]] == want
    r = fastread.Reader(image=url, batch_size=100, **o.given())
    assert [a.tobytes() for a in next(iter(r))[0]] == want
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    assert [a.tobytes() for a in fastread.PackedImage(url).read(range(len(local)))] == want


def test_truncated_missing_and_foreign_objects_are_named(packed, s3_server, disk_tmp):
    local, url, o = packed
    with open(local.path, "rb") as f:
        data = f.read()
    with open(local.index_path, "rb") as f:
        index = f.read()
    # The image cut inside its last sample.
    s3_server.put(BUCKET, "bad/cut.img", data[:-100])
    s3_server.put(BUCKET, "bad/cut.img.index", index)
    with pytest.raises(ImageError, match="truncated") as e:
        fastread.PackedImage(f"s3://{BUCKET}/bad/cut.img", s3=o)
    assert f"s3://{BUCKET}/bad/cut.img" in str(e.value)
    # No index next to the image.
    s3_server.put(BUCKET, "bad/lonely.img", data)
    with pytest.raises(FileNotFoundError) as e:
        fastread.PackedImage(f"s3://{BUCKET}/bad/lonely.img", s3=o)
    assert f"s3://{BUCKET}/bad/lonely.img.index" in str(e.value)
    # An index cut short, and one that is not an index.
    s3_server.put(BUCKET, "bad/short.img.index", index[:len(index) // 2])
    with pytest.raises(ImageError, match="truncated") as e:
        fastread.PackedImage(f"s3://{BUCKET}/bad/lonely.img",
                             index=f"s3://{BUCKET}/bad/short.img.index", s3=o)
    assert f"s3://{BUCKET}/bad/short.img.index" in str(e.value)
    s3_server.put(BUCKET, "bad/junk.index", b"hello")
    with pytest.raises(ImageError, match="not a fastread image index"):
        fastread.PackedImage(f"s3://{BUCKET}/bad/lonely.img",
                             index=f"s3://{BUCKET}/bad/junk.index", s3=o)
    # The index of another image.
    other_root = os.path.join(disk_tmp, "s3-packed-other")
    os.makedirs(os.path.join(other_root, "k"))
    with open(os.path.join(other_root, "k", "a.jpg"), "wb") as f:
        f.write(b"x" * 10)
    other = fastread.pack(other_root, os.path.join(disk_tmp, "s3-other.img"), progress=False)
    upload_file(s3_server, other.index_path, BUCKET, "bad/other.index")
    with pytest.raises(ImageError, match="does not|malformed"):
        fastread.PackedImage(url, index=f"s3://{BUCKET}/bad/other.index", s3=o)
    # A wrong secret: named by URL, the secret nowhere.
    wrong = fastread.S3Options.coerce(o, secret_access_key="wrong-secret-abc")
    with pytest.raises(OSError) as e:
        fastread.PackedImage(url, s3=wrong)
    assert url in str(e.value) and "wrong-secret-abc" not in str(e.value)
    assert s3_server.secret_key not in str(e.value)


def test_reader_error_on_a_shrunk_image_names_the_range_not_a_missing_object(
        packed, s3_server):
    """An image object cut after its index was read: the Reader's error
    names the sample, and says nothing of NoSuchKey (the detail came from
    a GET of the sample's name, image[name], which is no object)."""
    local, _url, o = packed
    with open(local.path, "rb") as f:
        data = f.read()
    with open(local.index_path, "rb") as f:
        index = f.read()
    s3_server.put(BUCKET, "bad/shrinks.img", data)
    s3_server.put(BUCKET, "bad/shrinks.img.index", index)
    img = fastread.PackedImage(f"s3://{BUCKET}/bad/shrinks.img", s3=o)
    s3_server.put(BUCKET, "bad/shrinks.img", data[:int(local.offsets[3])])
    with pytest.raises(fastread.ReadError) as e:
        for _ in fastread.Reader(image=img, batch_size=len(img), s3=o):
            pass
    assert "NoSuchKey" not in str(e.value) and "404" not in str(e.value)
    assert local.names[3] in str(e.value)


# -- fastread.dali.readers.image ---------------------------------------------------

def dali_paths():
    dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")  # noqa: F841
    from fastread.dali import _plugin
    return [False] + ([True] if _plugin.load() else [])


def dali_run(reader_fn, batch_size, iterations):
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None)
    def pipe():
        return tuple(reader_fn())

    p = pipe()
    p.build()
    out = []
    for _ in range(iterations):
        data, labels = p.run()
        out.append([(np.asarray(data.at(i)).tobytes(), int(np.asarray(labels.at(i))[0]))
                    for i in range(len(data))])
    return out


@pytest.mark.parametrize("kw", [dict(), dict(num_shards=3, shard_id=2, pad_last_batch=True),
                                dict(random_shuffle=True, seed=8)],
                         ids=["plain", "shard-pad", "shuffled"])
def test_dali_readers_image_equal_to_the_local_image(packed, kw):
    from fastread.dali import readers
    local, url, o = packed
    for native in dali_paths():
        want = dali_run(lambda: readers.image(image=local.path, native=native, **kw), 8, 9)
        got = dali_run(lambda: readers.image(image=url, native=native, s3=o, **kw), 8, 9)
        assert got == want, native
        got = dali_run(lambda: readers.image(image=url, native=native, **o.given(), **kw), 8, 2)
        assert got == want[:2], native
        img = fastread.PackedImage(url, s3=o)   # options kept by the image object
        got = dali_run(lambda: readers.image(image=img, native=native, **kw), 8, 2)
        assert got == want[:2], native


def test_dali_readers_image_object_cut_after_definition(packed, s3_server):
    """An image object replaced by a shorter one after the pipeline was
    defined fails the batch that reaches past its end, naming the sample."""
    from fastread.dali import readers
    local, _, o = packed
    with open(local.path, "rb") as f:
        data = f.read()
    for native in dali_paths():
        url = s3_server.put(BUCKET, f"cut-later/{native}.img", data)
        upload_file(s3_server, local.index_path, BUCKET, f"cut-later/{native}.img.index")

        def graph():
            return readers.image(image=url, native=native, s3=o)
        from nvidia.dali import pipeline_def

        @pipeline_def(batch_size=len(local), num_threads=2, device_id=None)
        def pipe():
            return tuple(graph())

        p = pipe()   # index read, image checked
        s3_server.put(BUCKET, f"cut-later/{native}.img", data[:local.alignment * 2])
        with pytest.raises(Exception) as e:
            p.build()
            p.run()
        assert url in str(e.value), native
        assert s3_server.secret_key not in str(e.value)


# -- WebDataset shards ---------------------------------------------------------------

@pytest.fixture(scope="module")
def shards(disk_tmp, s3_server):
    """4 WebDataset shards (jpg, cls, json; 13 samples each) on disk and in
    s3://formats-s3/wds/. (local paths, URLs, S3Options)."""
    from fastread.datasets import make_webdataset
    root = os.path.join(disk_tmp, "s3-wds")
    make_webdataset(root, shards=4, per_shard=13, width=48, height=32, seed=3)
    paths = sorted(os.path.join(root, p) for p in os.listdir(root) if p.endswith(".tar"))
    s3_server.make_bucket(BUCKET)
    urls = [upload_file(s3_server, p, BUCKET, f"wds/{os.path.basename(p)}") for p in paths]
    return paths, urls, opts(s3_server)


def reader_samples(source, **kw):
    r = fastread.Reader(source=source, batch_size=5, **kw)
    try:
        return [([a.tobytes() for a in arrays], labels.tolist()) for _ in range(2)
                for arrays, labels in r]
    finally:
        r.close()


def test_webdataset_index_equals_the_local_one(shards):
    from fastread.formats import WebDataset
    paths, urls, o = shards
    local = WebDataset(paths, ["jpg", "cls"])
    ours = WebDataset(urls, ["jpg", "cls"], s3=o)
    assert len(ours) == len(local) == 52
    np.testing.assert_array_equal(ours.component_offsets, local.component_offsets)
    np.testing.assert_array_equal(ours.component_lengths, local.component_lengths)
    assert [f.names for f in ours.files] == [f.names for f in local.files]
    assert ours.sample_name(0) == f"{urls[0]}[s000000_000000]"


@pytest.mark.parametrize("s3_read", [None, "whole", "ranges"])
@pytest.mark.parametrize("kw", [dict(), dict(random_shuffle=True, seed=2),
                                dict(random_shuffle=True, shuffle_buffer=6, seed=1),
                                dict(num_shards=3, shard_id=1, stick_to_shard=False)],
                         ids=["in-order", "shuffled", "buffer", "shards"])
def test_webdataset_reader_equals_the_local_shards(shards, s3_read, kw):
    """Every reading mode gives the local shards' samples, batch for batch
    over two epochs; None reads whole shards in order and ranges for a
    global shuffle (webdataset.S3_READ_RULE)."""
    from fastread.formats import WebDataset
    from fastread.formats.webdataset import _WholeShards
    paths, urls, o = shards
    ours = WebDataset(urls, ["jpg", "cls"], s3=o, s3_read=s3_read)
    assert reader_samples(ours, **kw) == reader_samples(WebDataset(paths, ["jpg", "cls"]), **kw)
    r = fastread.Reader(source=ours, batch_size=5, **kw)
    in_order = not kw.get("random_shuffle") or bool(kw.get("shuffle_buffer"))
    want_whole = s3_read == "whole" or (s3_read is None and in_order)
    assert isinstance(r._native, _WholeShards) == want_whole
    assert r.engine == "s3"
    r.close()


def test_whole_shards_fetch_each_shard_once_an_epoch(shards, s3_server, s3_proxy):
    """In shard order every shard is one GET an epoch (shards are smaller
    than part_size), the index one more when built; by ranges one GET per
    sample."""
    from fastread.formats import WebDataset
    paths, urls, _ = shards
    o = opts(s3_server, s3_proxy.endpoint)
    whole = WebDataset(urls, ["jpg"], s3=o, s3_read="whole")
    ranges = WebDataset(urls, ["jpg"], s3=o, s3_read="ranges")

    def gets():
        n = sum(1 for m, *_ in s3_proxy.settled_log() if m == "GET")
        s3_proxy.log.clear()
        return n

    gets()
    with fastread.Reader(source=whole, batch_size=4) as r:
        for _ in r:
            pass
        # Reader.stats() of whole shards: the context's counters (it raised
        # AttributeError before).
        stats = r.stats()
    assert gets() == len(urls)
    assert stats["s3_requests"] == len(urls)
    assert stats["s3_bytes"] == sum(os.path.getsize(p) for p in paths)
    for _ in fastread.Reader(source=ranges, batch_size=4):
        pass
    assert gets() == len(ranges)


def test_whole_shards_read_at_most_prefetch_batches_ahead(shards):
    """Reader submits a whole epoch at once; whole shards are still read
    only `prefetch` batches ahead of the consumer (a cut batch pins its
    shard: unbounded, an idle reader held the epoch's every shard)."""
    from fastread.formats import WebDataset
    from fastread.formats.webdataset import _WholeShards
    paths, urls, o = shards
    src = WebDataset(urls, ["jpg"], s3=o, s3_read="whole")
    per_shard = len(src) // len(urls)
    # batch = a shard's samples: each batch needs one shard (shards < part_size: one GET).
    with fastread.Reader(source=src, batch_size=per_shard, prefetch=1) as r:
        it = iter(r)
        next(it)
        time.sleep(1.0)   # idle: the reader may cut the next batch, no more
        # The consumer's shard and the ones read ahead with it: however
        # long the reader idles, no more.
        ahead = _WholeShards.AHEAD_SHARDS
        assert r.stats()["s3_requests"] <= 1 + ahead
        time.sleep(0.5)
        assert r.stats()["s3_requests"] <= 1 + ahead
        assert sum(1 for _ in it) == len(urls) - 1
        stats = r.stats()
    # Each call that fetches a shard fetches the next AHEAD_SHARDS along:
    # one GET per shard, whatever the timing (no shard fetched twice). The
    # number of calls is timing's: the fresh-clone CI (2 cores, loaded) once
    # saw 3 calls for 4 shards with the 4 GETs right, so it is bounded, not
    # exact: at least one call per 1 + AHEAD_SHARDS shards, at most one a shard.
    assert stats["s3_requests"] == len(urls)
    assert -(-len(urls) // (1 + ahead)) <= stats["file_calls"] <= len(urls)


def test_webdataset_errors_name_the_shard(shards, s3_server):
    from fastread.formats import FormatError, WebDataset
    paths, urls, o = shards
    with pytest.raises(OSError) as e:
        WebDataset(urls + [f"s3://{BUCKET}/wds/missing.tar"], ["jpg"], s3=o)
    assert f"s3://{BUCKET}/wds/missing.tar" in str(e.value)
    assert s3_server.secret_key not in str(e.value)
    with pytest.raises(ValueError, match="all be s3:// URLs or all local"):
        WebDataset([urls[0], paths[1]], ["jpg"], s3=o)
    with pytest.raises(ValueError, match="gzip"):
        WebDataset([f"s3://{BUCKET}/wds/x.tar.gz"], ["jpg"], s3=o)
    with pytest.raises(ValueError, match="s3_read"):
        WebDataset(urls, ["jpg"], s3=o, s3_read="stream")
    s3_server.put(BUCKET, "wds-bad/notatar.tar", b"hello world" * 100)
    with pytest.raises(FormatError) as e:
        WebDataset([f"s3://{BUCKET}/wds-bad/notatar.tar"], ["jpg"], s3=o)
    assert f"s3://{BUCKET}/wds-bad/notatar.tar" in str(e.value)
    # A shard cut after indexing: the batch that reaches past its end fails,
    # naming the sample, in both modes.
    with open(paths[0], "rb") as f:
        data = f.read()
    for mode in ("whole", "ranges"):
        url = s3_server.put(BUCKET, f"wds-bad/cut-{mode}.tar", data)
        ws = WebDataset([url], ["jpg"], s3=o, s3_read=mode)
        s3_server.put(BUCKET, f"wds-bad/cut-{mode}.tar", data[:len(data) // 2])
        with pytest.raises(OSError) as e:
            for _ in fastread.Reader(source=ws, batch_size=13):
                pass
        assert url in str(e.value), mode


@pytest.mark.parametrize("kw", [dict(), dict(random_shuffle=True, seed=5),
                                dict(num_shards=2, shard_id=1, pad_last_batch=True)],
                         ids=["plain", "shuffled", "shard-pad"])
def test_dali_readers_webdataset_equal_to_the_local_shards(shards, kw):
    from fastread.dali import readers
    paths, urls, o = shards
    for native in dali_paths():
        for s3_read in ((None, "ranges") if native else (None, "whole")):
            want = dali_run(lambda: readers.webdataset(paths=paths, ext=["jpg", "cls"],
                                                       native=native, **kw), 8, 8)
            extra = {} if s3_read is None else {"s3_read": s3_read}
            if native and s3_read is None and not kw.get("random_shuffle"):
                # In shard order whole shards are the default, which the
                # operator does not read: the external source serves it.
                with pytest.raises(ValueError, match="s3_read='ranges'"):
                    readers.webdataset(paths=urls, ext=["jpg", "cls"], native=True, s3=o, **kw)
                continue
            got = dali_run(lambda: readers.webdataset(paths=urls, ext=["jpg", "cls"],
                                                      native=native, s3=o, **extra, **kw), 8, 8)
            assert got == want, (native, s3_read)


def test_torch_webdataset_loader_over_s3_shards(shards):
    torch = pytest.importorskip("torch", reason="torch is not installed")  # noqa: F841
    from fastread.torch import WebDatasetLoader
    paths, urls, o = shards
    kw = dict(batch_size=6, random_shuffle=True, seed=3)
    ours = WebDatasetLoader(urls, ["jpg", "cls"], s3=o, **kw)
    want = WebDatasetLoader(paths, ["jpg", "cls"], **kw)
    for _ in range(2):
        got = [[[bytes(t.numpy()) for t in comp] for comp in b] for b in ours]
        exp = [[[bytes(t.numpy()) for t in comp] for comp in b] for b in want]
        assert got == exp and len(got) == 9
    flat = WebDatasetLoader(urls, ["cls"], batch_size=52, s3_read="whole", **o.given())
    assert [bytes(t.numpy()) for t in next(iter(flat))[0]] == \
        [bytes(t.numpy()) for t in next(iter(WebDatasetLoader(paths, ["cls"], batch_size=52)))[0]]
