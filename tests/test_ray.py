"""fastread.ray: Ray Data datasets read by fastread's engines, on a local
Ray cluster this module starts (ray.init(num_cpus=2)) and shuts down.

What is checked: every file once with fastread.scan's labels and its exact
bytes (trees, file lists, s3:// prefixes, packed images, WebDataset and
Squirrel shards); read tasks cut to batches; streaming_split(2) disjoint
and complete; Ray Train's TorchTrainer (the example) with 2 CPU workers
trains on every sample once; errors (a missing file, a bad root, a bad
option, an undecodable image) raised on the driver naming the path.
"""
import io
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fastread
from conftest import skip_unless, write_class_tree
from fastread.ray import ray_reason

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")


def test_fastread_imports_without_ray_and_says_how_to_get_it(monkeypatch):
    # `import fastread` never imports Ray (it is an optional extra) ...
    code = "import sys, fastread, fastread.ray; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    # ... and fastread.ray, used without Ray, names the extra to install.
    for mod in ("ray", "ray.data"):
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.delitem(sys.modules, "fastread.ray.datasource", raising=False)
    with pytest.raises(ImportError, match=r"pip install fastread\[ray\]"):
        fastread.ray.read_files(["/x.jpg"])


def test_info_says_whether_ray_data_is_here(monkeypatch):
    from fastread.cli import info

    why = ray_reason()
    got = info.collect()["ray"]
    assert (got["version"] is None) == (why is not None) and got["reason"] == why
    for mod in ("ray", "ray.data"):
        monkeypatch.setitem(sys.modules, mod, None)
    got = info.collect()["ray"]
    assert got["version"] is None and "pip install fastread[ray]" in got["reason"]


def test_read_error_survives_pickling():
    # Ray ships a task's exception to the driver pickled; OSError's own
    # pickling would make the strerror the path.
    import pickle

    err = fastread.ReadError(2, "/d/c/x.jpg", [("/d/c/x.jpg", 2), ("/d/c/y.jpg", 13)], detail="")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is fastread.ReadError
    assert (back.errno, back.filename, back.failures, str(back)) == \
        (2, "/d/c/x.jpg", err.failures, str(err))


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for this module. Its workers can
    import examples/ (the TorchTrainer example's functions travel by name)."""
    skip_unless("ray", ray_reason())
    import ray
    import ray.data

    path = os.pathsep.join(p for p in (os.path.abspath(EXAMPLES), os.environ.get("PYTHONPATH"))
                           if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """4 classes (one empty: it still takes a label) of tagged files,
    0 bytes to 150 KB, and a stray file at the root scan() ignores."""
    root = tmp_path_factory.mktemp("ray") / "train"
    root, content = write_class_tree(root, [9, 0, 13, 6], seed=7, max_size=150_000, tag=True)
    with open(os.path.join(root, "stray.jpg"), "wb") as f:
        f.write(b"not a sample")
    return root, content


def rows_of(ds):
    """{path: (label, bytes)}, asserting that no path comes twice."""
    out = {}
    for r in ds.iter_rows():
        assert r["path"] not in out, f"{r['path']} read twice"
        out[r["path"]] = (int(r["label"]), bytes(r["bytes"]))
    return out


def expected(paths, labels, content):
    return {p: (int(lab), content[p]) for p, lab in zip(paths, labels)}


def test_tree_every_file_once_with_scan_labels_and_exact_bytes(ray_cluster, tree):
    root, content = tree
    paths, labels = fastread.scan(root)
    ds = fastread.ray.read_files(root, batch_size=5)
    # Read tasks are batches (28 files / 5), one block each, not one per file.
    assert ds.materialize().num_blocks() == 6
    assert set(ds.columns()) == {"bytes", "label", "path"}
    assert rows_of(ds) == expected(paths, labels, content)
    # Shuffled: the same rows, another order (the permutation of the seed).
    shuffled = fastread.ray.read_files(root, batch_size=5, shuffle=True, seed=3)
    order = [r["path"] for r in shuffled.iter_rows()]
    assert sorted(order) == sorted(paths) and order != paths
    # A file list: labels given, or their positions (scan's files= rule).
    sub = paths[::3]
    assert rows_of(fastread.ray.read_files(sub, labels=list(range(100, 100 + len(sub))))) == \
        {p: (100 + i, content[p]) for i, p in enumerate(sub)}
    assert rows_of(fastread.ray.read_files(sub, batch_size=2, engine="psync")) == \
        {p: (i, content[p]) for i, p in enumerate(sub)}


def test_auto_batch_size_fills_rays_blocks(ray_cluster, tree):
    from fastread.ray.datasource import FilesDatasource, auto_batch_size

    root, content = tree
    paths, labels = fastread.scan(root)
    want = expected(paths, labels, content)
    # The default: 28 small files fit one of Ray's blocks, so one task.
    ds = fastread.ray.read_files(root)
    assert ds.materialize().num_blocks() == 1
    assert rows_of(ds) == want
    # Blocks no larger than Ray's target block size: as many tasks as that
    # takes, evened out.
    ctx = ray_cluster.data.DataContext.get_current()
    before = ctx.target_max_block_size
    ctx.target_max_block_size = 200_000
    try:
        src = FilesDatasource(root)
        mean = np.mean([len(v) for v in content.values()])
        assert src.batch_size == auto_batch_size(paths) < 28
        assert src.batch_size * mean <= 1.2 * 200_000   # evened out: a little over
        ds = fastread.ray.read_files(root)
        assert ds.materialize().num_blocks() == -(-28 // src.batch_size) > 2
        assert rows_of(ds) == want
    finally:
        ctx.target_max_block_size = before
    assert auto_batch_size(paths, target_block_bytes=1 << 30) == 28
    one = max(paths, key=lambda p: len(content[p]))
    assert auto_batch_size([one] * 280, target_block_bytes=len(content[one]) * 100) == 94  # 3 tasks
    assert auto_batch_size(paths, target_block_bytes=1) == 1
    assert auto_batch_size([]) == 1
    # Decoded blocks are larger than the files: 256 at most, one task per CPU.
    assert auto_batch_size(paths * 100, decode=True, cpus=2) == 256
    assert auto_batch_size(paths, decode=True, cpus=2) == 14
    # Files that cannot be stat'ed count at a default size; their task names them.
    assert auto_batch_size(["/no/such/a.jpg"] * 10, target_block_bytes=1 << 20) == 5  # 8 fit
    with pytest.raises(ValueError, match="batch_size must be a positive integer or None"):
        fastread.ray.read_files(root, batch_size=0)


def test_blocks_are_the_engines_buffer_as_read(ray_cluster, tree):
    # The bytes column of a block is one buffer, files back to back, in
    # the block that reaches the driver; every engine that reads files.
    root, content = tree
    paths, _ = fastread.scan(root)
    for engine in ["auto"] + [e for e, st in fastread.engines().items() if st.files is True]:
        ds = fastread.ray.read_files(paths, batch_size=10, engine=engine)
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            col = batch.column("bytes")
            assert str(col.type) == "large_binary"
            for chunk in col.chunks:
                offsets = np.frombuffer(chunk.buffers()[1], np.int64)[
                    chunk.offset:chunk.offset + len(chunk) + 1]
                assert np.all(np.diff(offsets) == [len(content[p]) for p in
                                                   batch.column("path").to_pylist()])
        assert {p: b for p, (_, b) in rows_of(ds).items()} == {p: content[p] for p in paths}


def consume_splits(splits, batch_size):
    """[(path, bytes)] of each split, the splits consumed together on
    threads (as Ray Train's workers do: a split read alone would wait for
    the others); fails on a consumer that hangs or raises."""
    seen, errors = [[] for _ in splits], []

    def consume(i):
        try:
            for batch in splits[i].iter_batches(batch_size=batch_size, batch_format="numpy"):
                seen[i].extend(zip(batch["path"], (bytes(b) for b in batch["bytes"])))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(splits))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a streaming_split consumer hung"
    assert not errors, errors
    return seen


def test_streaming_split_is_disjoint_and_complete(ray_cluster, tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    # (ray_remote_args reach the read tasks: half a CPU each leaves room.)
    splits = fastread.ray.read_files(root, batch_size=4, ray_remote_args={"num_cpus": 0.5}) \
        .streaming_split(2, equal=False)
    seen = consume_splits(splits, batch_size=3)
    a, b = ({p for p, _ in s} for s in seen)
    assert a and b, "one split got nothing"
    assert not a & b
    assert len(seen[0]) + len(seen[1]) == len(paths) and a | b == set(paths)
    assert all(content[p] == data for p, data in seen[0] + seen[1])


def test_one_block_dataset_splits_equally(ray_cluster, tree):
    # The default sizing makes the 28-file tree one block; equal=True (Ray
    # Train's default) still gives each split half of it, disjointly.
    root, content = tree
    paths, _ = fastread.scan(root)
    ds = fastread.ray.read_files(root)
    assert ds.materialize().num_blocks() == 1
    splits = ds.streaming_split(2, equal=True)
    seen = consume_splits(splits, batch_size=5)
    assert len(seen[0]) == len(seen[1]) == 14
    assert sorted(p for p, _ in seen[0] + seen[1]) == sorted(paths)
    assert all(content[p] == data for p, data in seen[0] + seen[1])


def test_torch_trainer_example_trains_every_sample_once_on_two_cpu_workers(
        ray_cluster, tree, tmp_path):
    pytest.importorskip("torch", reason="the TorchTrainer example needs torch")
    pytest.importorskip("ray.train.torch", reason="ray[train] is not installed")
    sys.path.insert(0, os.path.abspath(EXAMPLES))
    try:
        import ray_train_torch
    finally:
        sys.path.remove(os.path.abspath(EXAMPLES))
    root, _ = tree
    paths, _ = fastread.scan(root)
    record = tmp_path / "seen"
    record.mkdir()
    ray_train_torch.run(root, workers=2, batch_size=4, storage_path=str(tmp_path / "results"),
                        record_dir=str(record))
    ranks = [(record / f"rank{r}.txt").read_text().split("\n")[:-1] for r in range(2)]
    assert all(ranks), "a worker trained on nothing"
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == sorted(paths)


def test_errors_are_raised_on_the_driver_naming_the_path(ray_cluster, tree, tmp_path):
    root, _ = tree
    paths, _ = fastread.scan(root)
    missing = os.path.join(root, "c0", "gone.jpg")
    with pytest.raises(fastread.ReadError) as e:
        fastread.ray.read_files(paths[:3] + [missing], batch_size=2).materialize()
    # Ray raises RayTaskError(ReadError): a ReadError whose message names
    # the path, with the task's own ReadError (filename, failures) as cause.
    assert missing in str(e.value)
    assert e.value.cause.filename == missing and e.value.cause.failures == [(missing, 2)]
    # Found while planning, before any task runs: a bad root, a bad option.
    with pytest.raises(FileNotFoundError, match="no/such/root"):
        fastread.ray.read_files(str(tmp_path / "no/such/root"))
    with pytest.raises(TypeError, match="no_such_option"):
        fastread.ray.read_files(root, no_such_option=1)
    with pytest.raises(ValueError, match="no_such_engine"):
        fastread.ray.read_files(root, engine="no_such_engine")
    with pytest.raises(ValueError, match="batch_size"):
        fastread.ray.read_files(root, batch_size=0)
    # Bytes that are no image, decoded: the error names the file.
    with pytest.raises(ValueError, match=r"c0/000\.jpg: cannot decode as an image"):
        fastread.ray.read_files(paths[:2], decode=True).materialize()


def test_decode_gives_rgb_hwc_uint8_as_pillow_decodes(ray_cluster, tmp_path):
    from PIL import Image

    rng = np.random.default_rng(5)
    want = {}
    for c, (fmt, mode, size) in enumerate([("JPEG", "RGB", (40, 30)), ("PNG", "L", (17, 9)),
                                           ("PNG", "RGBA", (8, 21))]):
        d = tmp_path / "img" / f"k{c}"
        d.mkdir(parents=True)
        for j in range(3):
            bands = len(mode)
            pixels = rng.integers(0, 256, (size[1], size[0], bands), np.uint8).squeeze()
            buf = io.BytesIO()
            Image.fromarray(pixels, mode).save(buf, fmt)
            p = d / f"{j}.{fmt.lower()}"
            p.write_bytes(buf.getvalue())
            want[str(p)] = (c, np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    ds = fastread.ray.read_files(str(tmp_path / "img"), batch_size=4, decode=True)
    assert set(ds.columns()) == {"image", "label", "path"}
    got = {r["path"]: (int(r["label"]), r["image"]) for r in ds.iter_rows()}
    assert got.keys() == want.keys()
    for p, (label, image) in want.items():
        assert got[p][0] == label
        assert got[p][1].dtype == np.uint8 and got[p][1].shape == image.shape
        np.testing.assert_array_equal(got[p][1], image)


def test_packed_image_samples_by_range(ray_cluster, tree, tmp_path):
    root, content = tree
    out = str(tmp_path / "train.img")
    fastread.pack(root, out, progress=False)
    img = fastread.PackedImage(out)
    ds = fastread.ray.read_image(out, batch_size=8)
    assert ds.materialize().num_blocks() == 4
    got = rows_of(ds)
    assert got == {n: (int(lab), content[os.path.join(root, n)])
                   for n, lab in zip(img.names, img.labels)}
    assert rows_of(fastread.ray.read_image(img, batch_size=8, shuffle=True, seed=1)) == got
    with pytest.raises(FileNotFoundError, match="absent.img"):
        fastread.ray.read_image(str(tmp_path / "absent.img"))
    # The default: tasks sized to Ray's blocks from the index's sizes (28
    # small samples: one task; 200 KB blocks: several, the same rows).
    ds = fastread.ray.read_image(out)
    assert ds.materialize().num_blocks() == 1 and rows_of(ds) == got
    ctx = ray_cluster.data.DataContext.get_current()
    before = ctx.target_max_block_size
    ctx.target_max_block_size = 200_000
    try:
        ds = fastread.ray.read_image(out)
        per = -(-len(img) // -(-len(img) // int(200_000 // np.mean(img.lengths))))
        assert ds.materialize().num_blocks() == -(-len(img) // per) > 2
        assert rows_of(ds) == got
    finally:
        ctx.target_max_block_size = before


def test_webdataset_shards_are_tasks(ray_cluster, tmp_path):
    from fastread.datasets import make_webdataset

    make_webdataset(str(tmp_path / "wds"), shards=3, per_shard=7, width=16, height=16)
    shards = sorted(str(p) for p in (tmp_path / "wds").glob("*.tar"))
    ref = fastread.WebDataset(shards, ["jpg", "cls"])
    idx = np.arange(len(ref))
    jpg, cls = ref.components(ref.read(idx), idx)
    want = {(ref.sample_name(i)): (bytes(jpg[i]), bytes(cls[i])) for i in idx.tolist()}
    ds = fastread.ray.read_webdataset(str(tmp_path / "wds"), ["jpg", "cls"], batch_size=3)
    assert ds.materialize().num_blocks() == 3 and set(ds.columns()) == {"jpg", "cls", "key", "path"}
    got = {f"{r['path']}[{r['key']}]": (bytes(r["jpg"]), bytes(r["cls"])) for r in ds.iter_rows()}
    assert got == want


def test_squirrel_shards_are_tasks(ray_cluster, tmp_path):
    pytest.importorskip("squirrel", reason="writing a store needs squirrel-core")
    from fastread.datasets import make_squirrel

    make_squirrel(str(tmp_path / "sq"), samples=25, per_shard=10, shape=(3, 4, 5), workers=1)
    ref = fastread.SquirrelStore(str(tmp_path / "sq"))
    idx = np.arange(len(ref))
    images, labels = ref.fields(ref.read(idx), idx)
    ds = fastread.ray.read_squirrel(str(tmp_path / "sq"), batch_size=4)
    assert ds.materialize().num_blocks() == 3
    got = sorted(((r["path"], r["image"].tobytes(), int(r["label"])) for r in ds.iter_rows()))
    want = sorted((ref.sample_name(i).rsplit("[", 1)[0], images[i].tobytes(), int(labels[i]))
                  for i in idx.tolist())
    assert got == want
    assert all(r["image"].shape == (3, 4, 5) for r in ds.take(3))


def test_s3_prefix(ray_cluster, s3_server, s3_engine, tmp_path):
    root, content = write_class_tree(tmp_path / "up", [4, 3], seed=9, max_size=40_000, tag=True)
    s3_server.make_bucket("ray")
    s3_server.upload_tree(root, "ray", "train")
    opts = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                              access_key_id=s3_server.access_key,
                              secret_access_key=s3_server.secret_key)
    urls, labels = fastread.scan("s3://ray/train", s3=opts)
    ds = fastread.ray.read_files("s3://ray/train", batch_size=3, s3=opts)
    assert rows_of(ds) == {u: (int(lab), content[os.path.join(root, u[len("s3://ray/train/"):])])
                           for u, lab in zip(urls, labels)}
    missing = "s3://ray/train/c0/absent.jpg"
    with pytest.raises(fastread.ReadError) as e:
        fastread.ray.read_files(urls[:2] + [missing], s3=opts).materialize()
    assert missing in str(e.value) and e.value.cause.filename == missing


def test_bench_family_reads_every_file_each_epoch(ray_cluster, tree):
    # The `fastread bench` family's runner on this module's cluster (it
    # starts none where one is up): epochs of the tree, batch after batch.
    from fastread.bench import environment, registry
    from fastread.bench.runners import Config

    root, content = tree
    env = environment.probe_environment()
    modes = {m.name: m for m in registry.all_modes(env) if m.family == "ray"}
    data = registry.detect_dataset(root)
    engine = registry.default_engine(env)
    cfg = Config(env=env, dataset=data, batch_size=8)
    assert modes["ray-binary"].unavailable(cfg) is None
    assert "--decode" in modes["ray-images"].unavailable(cfg)
    assert "drop --decode" in modes["ray-binary"].unavailable(Config(env=env, dataset=data,
                                                                     decode=True))
    runner = modes[f"ray-fastread-{engine}"].build(modes[f"ray-fastread-{engine}"], cfg)
    try:
        rows = [runner.next()[0] for _ in range(8)]   # 28 files: 4 batches an epoch
    finally:
        runner.close()
    assert rows == [8, 8, 8, 4] * 2


def test_s3_packed_image(ray_cluster, s3_server, s3_engine, tmp_path):
    root, content = write_class_tree(tmp_path / "img", [5, 4], seed=11, max_size=30_000, tag=True)
    out = str(tmp_path / "t.img")
    fastread.pack(root, out, progress=False)
    s3_server.make_bucket("rayimg")
    for name in (out, out + ".index"):
        with open(name, "rb") as f:
            s3_server.put("rayimg", os.path.basename(name), f.read())
    opts = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                              access_key_id=s3_server.access_key,
                              secret_access_key=s3_server.secret_key)
    img = fastread.PackedImage("s3://rayimg/t.img", s3=opts)
    got = rows_of(fastread.ray.read_image("s3://rayimg/t.img", s3=opts, batch_size=4))
    assert got == {n: (int(lab), content[os.path.join(root, n)])
                   for n, lab in zip(img.names, img.labels)}


def test_decode_scales_deep_greyscale():
    """Decoding on Ray's workers shares the packer's conversion: 16-bit
    greyscale becomes round(v / 257), not Pillow's clip at 255."""
    from PIL import Image
    from fastread.ray.datasource import decode_image

    ramp = np.tile(np.arange(0, 65536, 256, dtype=np.uint16), (4, 1))
    buf = io.BytesIO()
    Image.fromarray(ramp).save(buf, "PNG")
    px = decode_image(buf.getvalue(), "depth16.png")
    assert px.shape == (4, 256, 3) and px.dtype == np.uint8
    np.testing.assert_array_equal(px[:, :, 1], np.rint(ramp / 257.0).astype(np.uint8))


def test_binary_index_tasks_plan_name_tables(ray_cluster, tree, tmp_path):
    # A binary index's names stay a NameTable per planned task (no Python
    # string a sample at plan time); the rows are the same.
    from fastread.names import NameTable
    from fastread.ray.datasource import ImageDatasource
    root, content = tree
    out = str(tmp_path / "train.img")
    fastread.pack(root, out, progress=False, index_format="binary")
    img = fastread.PackedImage(out)
    assert isinstance(img.names, NameTable)
    src = ImageDatasource(img, batch_size=8, shuffle=True, seed=2)
    assert all(isinstance(fn.args[4], NameTable) for fn, *_ in src._tasks)
    got = rows_of(fastread.ray.read_image(img, batch_size=8, shuffle=True, seed=2))
    assert got == {n: (int(lab), content[os.path.join(root, n)])
                   for n, lab in zip(img.names, img.labels)}


def _synthetic_table(n, dirs=1000):
    """A PathTable of ``n`` files "/data/cDDDD/NNNNNNNNN.jpg" in ``dirs``
    directories, built with numpy: no Python string a file."""
    from fastread.names import NameTable, PathTable

    digits = (np.arange(n, dtype=np.int64)[:, None] // 10 ** np.arange(8, -1, -1)) % 10 + 48
    rows = np.concatenate([digits.astype(np.uint8),
                           np.broadcast_to(np.frombuffer(b".jpg", np.uint8), (n, 4))], axis=1)
    names = NameTable(rows.reshape(-1), np.arange(n + 1, dtype=np.int64) * rows.shape[1])
    prefixes = NameTable.from_names([f"/data/c{d:04d}/" for d in range(dirs)])
    return PathTable(prefixes, np.arange(n, dtype=np.int64) * dirs // n, names)


def test_files_plan_holds_no_string_a_file():
    # read_files plans in O(index): 10^6 files of a PathTable (scan(table=True)'s
    # listing) cut into shuffled tasks hold numpy columns, not a Python string
    # a file (one would be a pymalloc block of ~60 B each: 10^6 blocks).
    import sys
    import tracemalloc

    skip_unless("ray", ray_reason())
    from fastread.names import PathTable
    from fastread.ray.datasource import FilesDatasource
    from fastread.sampling import epoch_indices

    n, batch = 1_000_000, 8192
    table = _synthetic_table(n)
    labels = np.arange(n, dtype=np.int64) % 1000
    files = fastread.FileList(table, labels)
    tracemalloc.start()
    try:
        blocks = sys.getallocatedblocks()
        base = tracemalloc.get_traced_memory()[0]
        src = FilesDatasource(files, batch_size=batch, shuffle=True, seed=5)
        tasks = src.get_read_tasks(1)
        held = tracemalloc.get_traced_memory()[0] - base
        new_blocks = sys.getallocatedblocks() - blocks
    finally:
        tracemalloc.stop()
    assert len(tasks) == -(-n // batch) == 123
    # Bounds: fewer Python objects than one per 100 files (a few dozen a
    # task); bytes the names' 13 + 8 of offset, 4 of directory id and 4 of
    # label a file, and slack for the per-task objects, well under a str's ~60.
    assert new_blocks < n // 100, f"{new_blocks} new Python objects for {n} files"
    assert held < n * (13 + 16 + 8), f"{held / n:.1f} bytes a file held by the plan"
    assert all(t.metadata.input_files is None for t in tasks)
    assert sum(t.metadata.num_rows for t in tasks) == n
    # The tasks' files are the permutation's, in its order, with their labels.
    order = epoch_indices(n, shuffle=True, seed=5)
    for k in (0, 57, len(tasks) - 1):
        fn = src._tasks[k][0]
        part, labs = fn.args[0], fn.args[1]
        assert isinstance(part, PathTable) and len(part.dirs) <= 1000
        idx = order[k * batch:(k + 1) * batch]
        assert part.tolist() == [table[i] for i in idx.tolist()]
        np.testing.assert_array_equal(labs, labels[idx])
