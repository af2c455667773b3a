"""Arguments checked at the API edge: every bad value (zero, negative, huge,
wrong type) raises ValueError/TypeError/IndexError naming the option, for
Reader, read_files, PackedImage.read, the DALI readers, ImageLoader,
FeatureStore and the command line (a one-line message, exit status != 0,
no traceback)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastread


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("args")
    root = d / "tree"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(6):
            (root / f"c{c}" / f"{j}.jpg").write_bytes(bytes([j]) * (10 + j))
    img = str(d / "tree.img")
    fastread.pack(str(root), img)
    feat = str(d / "feat.bin")
    np.arange(100, dtype=np.float32).tofile(feat)
    return {"root": str(root), "img": img, "feat": feat, "dir": str(d),
            "files": fastread.scan(str(root))[0]}


def _reader(**kw):
    def make(d):
        fastread.Reader(d["root"], **kw).close()
    return make


def _reader_call(method, *args):
    def call(d):
        with fastread.Reader(d["root"], batch_size=4) as r:
            getattr(r, method)(*args)
    return call


READER = [
    ("batch_size", _reader(batch_size=0), ValueError),
    ("batch_size", _reader(batch_size=-3), ValueError),
    ("batch_size", _reader(batch_size=2.5), ValueError),
    ("batch_size", _reader(batch_size="8"), ValueError),
    ("batch_size", _reader(batch_size=True), ValueError),
    ("shard_id", _reader(shard_id=-1, num_shards=2), ValueError),
    ("shard_id", _reader(shard_id=2, num_shards=2), ValueError),
    ("num_shards", _reader(num_shards=0), ValueError),
    ("num_shards", _reader(num_shards="2"), ValueError),
    ("num_shards", _reader(num_shards=10**6), ValueError),  # more shards than samples
    ("seed", _reader(seed="x", random_shuffle=True), ValueError),
    ("seed", _reader(seed=-1, random_shuffle=True), ValueError),
    ("prefetch", _reader(prefetch=0), ValueError),
    ("prefetch", _reader(prefetch=-1), ValueError),
    ("prefetch", _reader(prefetch=10**9), ValueError),
    ("prefetch", _reader(prefetch=2.0), ValueError),
    ("workers", _reader(workers=-1), ValueError),
    ("workers", _reader(workers=65), ValueError),
    ("workers", _reader(workers="2"), ValueError),
    ("ring_depth", _reader(ring_depth=0), ValueError),
    ("ring_depth", _reader(ring_depth=True), ValueError),
    ("device", _reader(device="cuda"), ValueError),
    ("queue_depth", _reader(queue_depth=0), ValueError),
    ("queue_depth", _reader(queue_depth=10**9), ValueError),
    ("threads", _reader(engine="psync", threads=-1), ValueError),
    ("direct_alignment", _reader(direct_alignment=1000), ValueError),
    ("bogus", _reader(bogus=1), TypeError),
    ("engine", _reader(engine="warp"), ValueError),
    ("engine", _reader(engine=5), ValueError),
    ("random_shuffle", _reader(random_shuffle="no"), TypeError),
    ("drop_last", _reader(drop_last=None), TypeError),
    ("pad_last_batch", _reader(pad_last_batch=2), TypeError),
    ("stick_to_shard", _reader(stick_to_shard="yes"), TypeError),
    ("file_filters", _reader(file_filters=5), TypeError),
    ("options", _reader(options=5), TypeError),
    ("file_root", lambda d: fastread.Reader(5), TypeError),
    ("files", lambda d: fastread.Reader(files=d["files"][0]), TypeError),
    ("files", lambda d: fastread.Reader(files=[]), ValueError),
    ("labels", lambda d: fastread.Reader(files=d["files"][:3], labels=[1]), ValueError),
    ("image", lambda d: fastread.Reader(d["root"], image=d["img"]), ValueError),
    ("epoch", _reader_call("set_epoch", -1), ValueError),
    ("epoch", _reader_call("set_epoch", "a"), ValueError),
    ("epoch", _reader_call("set_epoch", 1.5), ValueError),
    ("start_batch", _reader_call("set_epoch", 0, -1), ValueError),
    ("start_batch", _reader_call("set_epoch", 0, 10**6), ValueError),
]

READ_FILES = [
    ("read_files", lambda d: fastread.read_files(d["files"][0]), TypeError),
    ("read_files", lambda d: fastread.read_files(os.fsencode(d["files"][0])), TypeError),
    ("NUL", lambda d: fastread.read_files(["/tmp/a\0b"]), ValueError),
    ("int", lambda d: fastread.read_files([5]), TypeError),
    ("engine", lambda d: fastread.read_files(d["files"], engine="warp"), ValueError),
    ("queue_depth", lambda d: fastread.read_files(d["files"], queue_depth=-1), ValueError),
    ("threads", lambda d: fastread.read_files(d["files"], engine="psync", threads=10**6),
     ValueError),
    ("options", lambda d: fastread.read_files(d["files"], options=5), TypeError),
    ("o_direct", lambda d: fastread.read_files(d["files"], o_direct="maybe"), ValueError),
]

IMAGE = [
    ("out of range", lambda d: fastread.PackedImage(d["img"]).read([1000]), IndexError),
    ("out of range", lambda d: fastread.PackedImage(d["img"]).read([-1000]), IndexError),
    ("integers", lambda d: fastread.PackedImage(d["img"]).read([1.5]), TypeError),
    ("integers", lambda d: fastread.PackedImage(d["img"]).read(["a"]), TypeError),
    ("engine", lambda d: fastread.PackedImage(d["img"]).read([0], engine="x"), ValueError),
    ("queue_depth", lambda d: fastread.PackedImage(d["img"]).read([0], queue_depth=0),
     ValueError),
    ("path", lambda d: fastread.PackedImage(5), TypeError),
    ("index", lambda d: fastread.PackedImage(d["img"], index=3.0), TypeError),
    ("index", lambda d: fastread.PackedImage(d["dir"]), FileNotFoundError),
]


def _store(**kw):
    def make(d):
        args = dict(dtype="float32", shape=(10, 10), backend="host")
        args.update(kw)
        fastread.FeatureStore(d["feat"], **args).close()
    return make


def _gather(ids, **kw):
    def call(d):
        s = fastread.FeatureStore(d["feat"], dtype="float32", shape=(10, 10), backend="host")
        try:
            s.gather(ids, device="cpu", **kw)
        finally:
            s.close()
    return call


FEATURES = [
    ("dtype", _store(dtype="bogus"), TypeError),
    ("shape", _store(shape=(0,)), ValueError),
    ("too short", _store(shape=(1000, 10)), ValueError),
    ("shape[1]", _store(shape=(10, -2)), ValueError),
    ("cache_bytes", _store(cache_bytes=-1), ValueError),
    ("backend", _store(backend="x"), ValueError),
    ("offset", _store(offset=10**9), ValueError),
    ("not found", lambda d: fastread.FeatureStore(d["dir"] + "/nope.bin", dtype="f4",
                                                   shape=(1,)), FileNotFoundError),
    ("int32 or int64", _gather(np.array([1.5])), TypeError),
    ("out of range", _gather(np.array([10])), IndexError),
    ("out of range", _gather(np.array([-1])), IndexError),
]

CASES = READER + READ_FILES + IMAGE + FEATURES


@pytest.mark.parametrize("name,call,exc", CASES,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_bad_argument_names_the_option(data, name, call, exc):
    with pytest.raises(exc) as e:
        call(data)
    assert name.lower() in str(e.value).lower(), str(e.value)


def _pipeline(reader, **kw):
    pytest.importorskip("nvidia.dali")

    def run(d):
        from nvidia.dali import pipeline_def
        from fastread.dali import readers

        @pipeline_def(batch_size=4, num_threads=1, device_id=None)
        def pipe():
            if reader == "file":
                return readers.file(**{"file_root": d["root"], **kw})
            return readers.image(**{"image": d["img"], **kw})
        p = pipe()
        p.build()
    return run


DALI = [
    ("shard_id", "file", dict(shard_id=-1, num_shards=2), ValueError),
    ("num_shards", "file", dict(num_shards=0), ValueError),
    ("random_shuffle", "file", dict(random_shuffle="x"), TypeError),
    ("engine", "file", dict(engine="x"), ValueError),
    ("queue_depth", "file", dict(queue_depth=0), ValueError),
    ("last_batch_policy", "file", dict(last_batch_policy="x"), ValueError),
    ("device", "file", dict(device="x"), ValueError),
    ("prefetch_queue_depth", "file", dict(prefetch_queue_depth=0), ValueError),
    ("bogus", "file", dict(bogus=1), TypeError),
    ("shard_id", "image", dict(shard_id=3, num_shards=2), ValueError),
    ("stick_to_shard", "image", dict(stick_to_shard="x"), TypeError),
]


@pytest.mark.parametrize("name,reader,kw,exc", DALI, ids=[f"{i}-{c[0]}" for i, c in enumerate(DALI)])
def test_dali_reader_arguments(data, name, reader, kw, exc):
    run = _pipeline(reader, **kw)
    with pytest.raises(exc) as e:
        run(data)
    assert name.lower() in str(e.value).lower(), str(e.value)


LOADER = [
    ("batch_size", dict(batch_size=0), ValueError),
    ("size", dict(size=0), ValueError),
    ("size", dict(size=-5), ValueError),
    ("num_threads", dict(num_threads=0), ValueError),
    ("prefetch_queue_depth", dict(prefetch_queue_depth=0), ValueError),
    ("mean", dict(mean=[1, 2]), ValueError),
    ("std", dict(std=[1, 0, 1]), ValueError),
    ("std", dict(std="abc"), ValueError),
    ("device", dict(device="x"), ValueError),
    ("decode", dict(decode="no"), TypeError),
    ("shard_id", dict(shard_id=5, num_shards=2), ValueError),
]


@pytest.mark.parametrize("name,kw,exc", LOADER, ids=[f"{i}-{c[0]}" for i, c in enumerate(LOADER)])
def test_image_loader_arguments(data, name, kw, exc):
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali")
    from fastread.torch import ImageLoader
    args = dict(batch_size=4)
    args.update(kw)
    with pytest.raises(exc) as e:
        ImageLoader(data["root"], **args)
    assert name.lower() in str(e.value).lower(), str(e.value)


CLI = [
    [],
    ["nosuch"],
    ["pack"],
    ["pack", "{root}"],
    ["pack", "{dir}/missing", "{dir}/o.img"],
    ["pack", "{root}", "{dir}/missing/o.img"],
    ["verify"],
    ["verify", "{dir}/missing.img"],
    ["verify", "{root}/c0/0.jpg"],
    ["bmap"],
    ["bmap", "{dir}/missing", "-o", "{dir}/b.json"],
    ["bmap", "{root}", "-o", "{dir}/missing/b.json"],
    ["make-dataset"],
    ["make-dataset", "{dir}/md", "--classes", "0"],
    ["make-dataset", "{dir}/md", "--per-class", "-1"],
    ["make-dataset", "{dir}/md", "--per-class", "abc"],
    ["make-dataset", "/proc/fastread-test/md", "--classes", "1", "--per-class", "1"],
    ["bench"],
    ["bench", "{dir}/missing"],
    ["bench", "{root}", "--batchsize", "0"],
    ["bench", "{root}", "--epochs", "-1"],
    ["bench", "{root}", "--repeat", "x"],
    ["bench", "{root}", "--modes", "nosuch"],
    ["info", "--bogus"],
]


@pytest.mark.parametrize("argv", CLI, ids=[" ".join(a) or "(none)" for a in CLI])
def test_cli_bad_arguments_exit_nonzero_with_one_line(data, argv):
    args = [a.format(**data) for a in argv]
    p = subprocess.run([sys.executable, "-m", "fastread.cli", *args], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("fastread") and "error" in last, p.stderr
