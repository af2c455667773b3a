"""fastread.formats.Parquet over real files made by pyarrow and by the
`datasets` package: rows equal to the JPEG tree they were written from,
several files and row groups, every codec and encoding, nulls, large
values, truncated and corrupt files named, ClassLabel names, the Hub and
save_to_disk layouts, Reader shuffles and shards, and S3 (SeaweedFS)."""
import json
import os

import numpy as np
import pytest

import fastread
from fastread.datasets import make_imagenet_like
from fastread.formats import FormatError, Parquet
from fastread.formats.parquet import split_of, write_image_parquet

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(autouse=True)
def _own_index_cache(tmp_path, monkeypatch):
    """Readers' ranges indexes (formats._parquet_index_cache) in the test's
    directory, not the user's ~/.cache (files made by a module fixture are
    older than RACY_NS by the time a later test reads them)."""
    monkeypatch.setenv("FASTREAD_INDEX_CACHE_DIR", str(tmp_path / "index-cache"))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A small JPEG tree: (root, paths, labels, bytes)."""
    root = str(tmp_path_factory.mktemp("pq-tree") / "jpegs")
    make_imagenet_like(root, classes=3, per_class=11, width=72, height=56, mean_kb=3,
                       progress=False, workers=1)
    paths, labels = fastread.scan(root)
    data = []
    for p in paths:
        with open(p, "rb") as f:
            data.append(f.read())
    return root, paths, labels, data


@pytest.fixture(scope="module")
def hub(tree, tmp_path_factory):
    """The tree as a Hub-style directory: 2 files of row groups of 7 rows."""
    out = str(tmp_path_factory.mktemp("pq-hub"))
    write_image_parquet(tree[0], out, rows_per_group=7, files=2)
    return out


def class_dirs(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def all_rows(src, **kw):
    return [a.tobytes() for a in src.read(np.arange(len(src)), **kw)]


def test_rows_and_labels_equal_the_jpeg_tree(tree, hub):
    root, paths, labels, data = tree
    src = Parquet(hub)
    assert len(src) == len(paths) and len(src.paths) == 2
    assert all_rows(src) == data
    assert np.array_equal(src.labels, labels)
    assert src.classes == class_dirs(root)
    # Row groups of 7 rows: sample 9 is row 2 of group 1 of the first file.
    assert src.sample_name(9) == f"{src.paths[0]}[row group 1, row 2]"


def test_views_keep_the_decoded_buffer_alive(hub, tree):
    src = Parquet(hub)
    arrays = src.read([3, 20])
    assert arrays[0].base is not None and not arrays[0].flags.owndata
    del src
    import gc
    gc.collect()
    assert arrays[0].tobytes() == tree[3][3] and arrays[1].tobytes() == tree[3][20]


def test_reader_shuffles_shards_and_resumes(hub, tree):
    data = tree[3]
    src = Parquet(hub, cache_bytes=1)   # no cache: every batch loads what it needs
    got, labs = [], []
    with fastread.Reader(source=src, batch_size=5, random_shuffle=True, seed=3) as r:
        for arrays, labels in r:
            got += [a.tobytes() for a in arrays]
            labs += labels.tolist()
    assert sorted(got) == sorted(data) and got != data
    assert sorted(zip(got, labs)) == sorted(zip(data, tree[2].tolist()))
    # Two shards cover every row once.
    parts = []
    for shard in range(2):
        with fastread.Reader(source=src, batch_size=4, shard_id=shard, num_shards=2) as r:
            parts += [a.tobytes() for arrays, _ in r for a in arrays]
    assert sorted(parts) == sorted(data)
    # Resume mid-epoch from state_dict: the rest of the same order.
    with fastread.Reader(source=src, batch_size=4, random_shuffle=True, seed=5) as r:
        it = iter(r)
        first = [a.tobytes() for a in next(it)[0]]
        state = r.state_dict()
        rest = [a.tobytes() for arrays, _ in it for a in arrays]
    with fastread.Reader(source=src, batch_size=4, random_shuffle=True, seed=5) as r:
        r.load_state_dict(state)
        again = [a.tobytes() for arrays, _ in r for a in arrays]
    assert again == rest and sorted(first + rest) == sorted(data)


def test_shuffle_buffer_reads_each_row_group_once(hub, tree):
    src = Parquet(hub, cache_bytes=1)
    with fastread.Reader(source=src, batch_size=4, random_shuffle=True, shuffle_buffer=8,
                         seed=1) as r:
        got = [a.tobytes() for arrays, _ in r for a in arrays]
        loads = r.stats()["row_group_loads"]
    assert sorted(got) == sorted(tree[3])
    groups = sum(len(m.rows) for m in src.metas)
    assert loads == groups   # each row group once, though the cache holds ~nothing


@pytest.mark.parametrize("fits", [True, False])
def test_file_order_keeps_row_groups_only_when_the_set_fits(hub, tree, fits):
    # The set decoded within cache_bytes: the second epoch comes from the
    # cache. Beyond it: each row group goes once read through (its pages
    # reused by the next decode), loaded again the next epoch.
    # ranged=False: row groups held decoded (the native route's file ranges,
    # 16 B a row, are tested in test_parquet_native.py).
    probe = Parquet(hub, ranged=False)
    size = probe.decoded_bytes()   # the footers' estimate: values, lengths, page headers
    values = sum(len(d) for d in tree[3])
    assert values < size < 2 * values
    src = Parquet(hub, cache_bytes=size if fits else size // 2, ranged=False)
    groups = sum(len(m.rows) for m in src.metas)
    with fastread.Reader(source=src, batch_size=4, random_shuffle=False) as r:
        for epoch in range(2):
            got = [a.tobytes() for arrays, _ in r for a in arrays]
            assert got == tree[3]
        stats = r.stats()
    assert stats["row_group_loads"] == (groups if fits else 2 * groups)
    if fits:
        assert stats["row_group_bytes_cached"] >= values
    else:   # at most the batches in flight's: a few row groups, not half the set
        assert stats["row_group_bytes_cached"] <= values // 4


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip", "lz4"])
@pytest.mark.parametrize("dictionary", [False, True])
def test_codecs_and_encodings(tmp_path, compression, dictionary):
    rng = np.random.default_rng(7)
    # Repeated values so that dictionary encoding has something to do.
    pool = [rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
            for _ in range(9)]
    values = [pool[int(i)] for i in rng.integers(0, 9, 100)]
    labels = rng.integers(0, 5, 100)
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"label": labels, "image": pa.array(values, pa.binary())}), path,
                   row_group_size=30, compression=compression, use_dictionary=dictionary,
                   data_page_size=2048)
    md = pq.read_metadata(path)
    col = md.row_group(0).column(1)
    assert (col.compression.lower() == ("uncompressed" if compression == "none" else
                                       compression))
    assert ("RLE_DICTIONARY" in col.encodings or "PLAIN_DICTIONARY" in col.encodings) \
        == dictionary
    src = Parquet(path)
    assert all_rows(src) == values
    assert np.array_equal(src.labels, labels) and src.classes is None


def test_delta_and_large_binary_values(tmp_path):
    big = np.random.default_rng(1).integers(0, 256, 24 << 20, dtype=np.uint8).tobytes()
    values = [b"a", big, b"", b"xyz" * 1000]
    path = str(tmp_path / "large.parquet")
    pq.write_table(pa.table({"image": pa.array(values, pa.large_binary())}), path,
                   row_group_size=2, use_dictionary=False,
                   column_encoding={"image": "DELTA_BYTE_ARRAY"}, compression="zstd")
    src = Parquet(path)
    assert src.label_column is None and np.array_equal(src.labels, np.arange(4))
    got = src.read([1, 0, 3, 2])
    assert [g.tobytes() for g in got] == [big, b"a", b"xyz" * 1000, b""]
    path2 = str(tmp_path / "plain.parquet")
    pq.write_table(pa.table({"image": pa.array(values, pa.large_binary())}), path2,
                   use_dictionary=False, compression="none")
    assert all_rows(Parquet(path2)) == values


def test_nulls_fail_naming_file_row_group_and_row(tmp_path):
    t = pa.table({"image": pa.array([{"bytes": b"ok", "path": "a"}, None,
                                     {"bytes": None, "path": "c"}, {"bytes": b"d", "path": "d"}],
                                    pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                  "label": pa.array([1, None, 2, 3], pa.int64())})
    path = str(tmp_path / "nulls.parquet")
    pq.write_table(t, path, row_group_size=2)
    src = Parquet(path)
    assert src.labels.tolist() == [1, -1, 2, 3]
    assert src.read([0])[0].tobytes() == b"ok"
    with pytest.raises(fastread.ReadError) as e:
        src.read([0, 1])
    assert f"{path}[row group 0, row 1]" in str(e.value)
    with pytest.raises(fastread.ReadError) as e:
        with fastread.Reader(source=src, batch_size=4) as r:
            list(r)
    assert f"{path}[row group 0, row 1]" in str(e.value) and "null" in str(e.value)
    assert src.read([3])[0].tobytes() == b"d"
    with pytest.raises(fastread.ReadError, match=r"row group 1, row 0"):
        src.read([2])
    empty = Parquet(path, missing="empty")
    assert [a.tobytes() for a in empty.read([0, 1, 2, 3])] == [b"ok", b"", b"", b"d"]


def test_truncated_and_corrupt_files_are_named(tmp_path, hub):
    good = Parquet(hub).paths[0]
    with open(good, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(FormatError, match=f"{cut}.*(truncated|not a Parquet)"):
        Parquet(str(cut))
    # The footer intact but the data shortened: the footer's chunks lie outside.
    n = int.from_bytes(data[-8:-4], "little")
    short = tmp_path / "short.parquet"
    short.write_bytes(data[:4] + data[len(data) - 8 - n:])
    with pytest.raises(FormatError, match=f"{short}.*(outside|truncated)"):
        Parquet(str(short))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(data[:len(data) - 8 - n] + b"\x07" * n + data[-8:])
    with pytest.raises(FormatError, match=f"{bad}.*corrupt"):
        Parquet(str(bad))
    huge = tmp_path / "huge.parquet"
    huge.write_bytes(data[:-8] + (1 << 30).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(FormatError, match=f"{huge}.*footer length"):
        Parquet(str(huge))
    text = tmp_path / "text.parquet"
    text.write_bytes(b"hello, not parquet at all")
    with pytest.raises(FormatError, match=f"{text}.*not a Parquet"):
        Parquet(str(text))
    with pytest.raises(FileNotFoundError, match="absent.parquet"):
        Parquet(str(tmp_path / "absent.parquet"))
    # A FIFO where a data file should be is refused by name, never waited on.
    for name in ("fifo.parquet", "fifo.arrow"):
        os.mkfifo(tmp_path / name)
        with pytest.raises((FormatError, OSError), match=name):
            Parquet(str(tmp_path / name))


def test_a_damaged_column_chunk_fails_its_samples(tmp_path):
    values = [bytes([i]) * 500 for i in range(20)]
    path = tmp_path / "dmg.parquet"
    pq.write_table(pa.table({"image": values}), str(path), row_group_size=10,
                   compression="snappy", use_dictionary=False)
    md = pq.read_metadata(str(path))
    col = md.row_group(1).column(0)
    raw = bytearray(path.read_bytes())
    start = col.data_page_offset
    raw[start:start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    path.write_bytes(bytes(raw))
    src = Parquet(str(path))
    assert [a.tobytes() for a in src.read(range(10))] == values[:10]
    with pytest.raises(fastread.ReadError, match=f"{path}\\[row group 1, row 0\\]"):
        src.read([10])


def test_column_checks(hub, tmp_path):
    with pytest.raises(ValueError, match="no image column 'img'"):
        Parquet(hub, image="img")
    with pytest.raises(ValueError, match="no label column 'cls'"):
        Parquet(hub, label="cls")
    with pytest.raises(ValueError, match="holds int64, not binary"):
        Parquet(hub, image="label")
    src = Parquet(hub, columns=["label"])
    t = src.table([4, 30])
    assert t.column("label").to_pylist() == src.labels[[4, 30]].tolist()


def test_hub_layout_splits(tree, tmp_path):
    root = str(tmp_path / "ds")
    write_image_parquet(tree[0], root, split="train", rows_per_group=10, files=2)
    write_image_parquet(tree[0], root, split="test", rows_per_group=10, files=1)
    assert split_of("data/train-00000-of-00002.parquet") == "train"
    assert split_of("data/validation-00001-of-00004-6f2a.parquet") == "validation"
    assert split_of("cache/parquet-test-00000-of-00001.arrow") == "test"
    assert split_of("ds/train/data-00000-of-00001.arrow") == "train"
    assert split_of("plain_text/test/0000.parquet") == "test"
    train = Parquet(root, split="train")
    test = Parquet(root, split="test")
    assert len(train.paths) == 2 and len(test.paths) == 1
    assert all_rows(train) == tree[3] == all_rows(test)
    assert len(Parquet(root)) == 2 * len(tree[3])
    with pytest.raises(FileNotFoundError, match="no files of split 'dev'.*test, train"):
        Parquet(root, split="dev")


def test_files_made_by_datasets(tree, tmp_path):
    datasets = pytest.importorskip("datasets")
    root, paths, labels, data = tree
    names = class_dirs(root)
    feats = datasets.Features({"image": datasets.Image(),
                               "label": datasets.ClassLabel(names=names)})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": d, "path": None} for d in data],
                                     "label": labels.tolist()}, features=feats)
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    ds.to_parquet(str(hub / "train-00000-of-00001.parquet"), batch_size=10)
    src = Parquet(str(tmp_path / "hub"), split="train")
    assert all_rows(src) == data and np.array_equal(src.labels, labels)
    assert src.classes == names
    # save_to_disk: Arrow IPC files, memory-mapped; a DatasetDict picks by split.
    dd = datasets.DatasetDict({"train": ds, "test": ds.select(range(5))})
    dd.save_to_disk(str(tmp_path / "saved"), max_shard_size="40KB")
    saved = Parquet(str(tmp_path / "saved"), split="train")
    assert saved.paths[0].endswith(".arrow") and len(saved.paths) > 1
    assert all_rows(saved) == data and np.array_equal(saved.labels, labels)
    assert saved.classes == names
    assert all_rows(Parquet(str(tmp_path / "saved"), split="test")) == data[:5]
    with pytest.raises(ValueError, match="choose one with split="):
        Parquet(str(tmp_path / "saved"))
    one = Parquet(str(tmp_path / "saved" / "test"))
    assert len(one) == 5
    with fastread.Reader(source=saved, batch_size=6, random_shuffle=True) as r:
        got = [a.tobytes() for arrays, _ in r for a in arrays]
    assert sorted(got) == sorted(data)
    # load_dataset reads what write_image_parquet writes, with the same names.
    mine = tmp_path / "mine"
    write_image_parquet(root, str(mine), rows_per_group=8)
    back = datasets.load_dataset("parquet", data_dir=str(mine / "data"), split="train")
    assert back.features["label"].names == names
    assert [r["bytes"] for r in back.with_format("arrow")["image"].to_pylist()] == data


S3_BUCKET = "parquet"


def s3_opts(srv, endpoint=None):
    return fastread.S3Options(endpoint_url=endpoint or srv.endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key)


def test_s3_prefix_equals_local(s3_engine, s3_server, hub, tree):
    s3_server.make_bucket(S3_BUCKET)
    s3_server.upload_tree(hub, S3_BUCKET, "hub")
    o = s3_opts(s3_server)
    src = Parquet(f"s3://{S3_BUCKET}/hub", split="train", s3=o)
    assert src.paths[0].startswith(f"s3://{S3_BUCKET}/hub/data/train-00000-of-00002")
    assert all_rows(src) == tree[3] and np.array_equal(src.labels, tree[2])
    assert src.classes == Parquet(hub).classes
    with fastread.Reader(source=src, batch_size=7, random_shuffle=True, seed=4) as r:
        got = [a.tobytes() for arrays, _ in r for a in arrays]
        assert r.stats()["s3_requests"] > 0
    assert sorted(got) == sorted(tree[3])
    one = Parquet(src.paths[1], s3=o)
    assert len(one) == len(src) - int(src.file_starts[1])
    with pytest.raises(FileNotFoundError, match="no .parquet"):
        Parquet(f"s3://{S3_BUCKET}/nothing-here", s3=o)
    # A truncated object is named by its URL.
    with open(Parquet(hub).paths[0], "rb") as f:
        data = f.read()
    s3_server.put(S3_BUCKET, "bad/cut.parquet", data[:len(data) // 3])
    with pytest.raises(FormatError, match=f"s3://{S3_BUCKET}/bad/cut.parquet"):
        Parquet(f"s3://{S3_BUCKET}/bad", s3=o)


def test_write_image_parquet_metadata(hub):
    md = pq.read_metadata(os.path.join(hub, "data", "train-00000-of-00002.parquet"))
    info = json.loads(md.schema.to_arrow_schema().metadata[b"huggingface"])
    assert info["info"]["features"]["image"] == {"_type": "Image"}
    assert md.num_row_groups == 3 and md.row_group(0).num_rows == 7


def test_dali_reader_gives_the_rows_and_decodes(hub, tree):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from nvidia.dali import fn, pipeline_def
    from fastread.dali import readers

    @pipeline_def(batch_size=8, num_threads=1, device_id=None)
    def pipe(shuffle):
        data, label = readers.parquet(paths=hub, split="train", random_shuffle=shuffle, seed=2,
                                      epoch_end="stop", name="pq")
        return data, label, fn.decoders.image(data, device="cpu")

    for shuffle in (False, True):
        p = pipe(shuffle)
        p.build()
        got, labs = [], []
        try:
            while True:
                data, label, img = p.run()
                for k in range(len(data)):
                    got.append(np.array(data[k]).tobytes())
                    labs.append(int(np.array(label[k])[0]))
                    assert np.array(img[k]).ndim == 3 and np.array(img[k]).shape[2] == 3
        except StopIteration:
            pass
        pairs = list(zip(tree[3], tree[2].tolist()))
        assert (sorted(zip(got, labs)) == sorted(pairs)) and ((list(zip(got, labs)) == pairs)
                                                               != shuffle)


def test_image_loader_over_parquet(hub, tree):
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali", reason="ImageLoader decodes with DALI")
    from fastread.torch import ImageLoader
    loader = ImageLoader(parquet=hub, batch_size=8, size=32, num_threads=1)
    labels, shapes = [], set()
    for img, lab in loader:
        shapes.add(tuple(img.shape[1:]))
        labels += lab.tolist()
    assert sorted(labels) == sorted(tree[2].tolist()) and shapes == {(3, 32, 32)}
    raw = ImageLoader(parquet=Parquet(hub), batch_size=10, decode=False)
    got = [bytes(x.numpy()) for imgs, _ in raw for x in imgs]
    assert got == tree[3]
    with pytest.raises(ValueError, match="give parquet= or a tree"):
        ImageLoader(tree[0], parquet=hub, batch_size=4)


def test_ray_read_parquet(hub, tree):
    from fastread.ray import ray_reason
    if ray_reason() is not None:
        pytest.skip(ray_reason())
    import ray
    import ray.data
    import fastread.ray as fray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = fray.read_parquet(hub, split="train")
        rows = ds.take_all()
        assert [r["bytes"] for r in rows] == tree[3]
        assert [r["label"] for r in rows] == tree[2].tolist()
        with pytest.raises(ValueError, match="no image column 'pixels'"):
            fray.read_parquet(hub, image="pixels")
    finally:
        ray.shutdown()


def test_populate_write_keeps_the_bytes_and_refuses_read_only():
    """The pre-faulting of a row group's decode memory (_prefault) faults
    pages in without changing them: what a buffer holds stays; a read-only
    buffer is refused (the advice populates for writing)."""
    from fastread import _core
    import errno as _errno
    buf = bytearray(os.urandom(3 * 4096 + 123))
    before = bytes(buf)
    assert _core.populate_write(buf) in (0, _errno.EINVAL)
    assert bytes(buf) == before
    assert _core.populate_write(bytearray()) == 0
    with pytest.raises((TypeError, ValueError, BufferError)):
        _core.populate_write(b"read only")


def test_prefault_then_decode_gives_the_same_rows(hub):
    """A row group decoded after _prefault (jemalloc's pool) equals pyarrow's
    own reading of it."""
    from fastread.formats import _parquet_meta as meta_mod
    src = Parquet(hub)
    m = src.metas[0]
    pool = meta_mod.decode_pool()
    meta_mod._prefault(m, 0, src._leaves_of(m), pool)
    with fastread.Reader(source=src, batch_size=64) as r:
        images, _labels = next(iter(r))
    want = []
    for path in src.paths:
        col = pq.read_table(path, columns=["image"]).column("image").combine_chunks()
        want += col.field("bytes").to_pylist()
    assert len(images) == min(64, len(want))
    assert [bytes(a) for a in images] == want[:len(images)]
