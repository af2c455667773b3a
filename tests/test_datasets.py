"""Tests for fastread.datasets (synthetic dataset generators)."""

import hashlib
import io
import json
import os

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
pytest.importorskip("tqdm")
from PIL import Image, JpegImagePlugin  # noqa: E402

from fastread.datasets import (  # noqa: E402
    MARKER_NAME,
    DatasetInfo,
    class_dir_name,
    make_imagenet_like,
    make_npy_dataset,
)


def tree_digest(root):
    """{relative path: sha256} of every non-hidden file under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


SMALL = dict(classes=2, per_class=6, width=160, height=120, mean_kb=12, progress=False)


@pytest.fixture(scope="module")
def band_tree(tmp_path_factory):
    """3 classes x 20 default-sized images: the size-band sample."""
    root = tmp_path_factory.mktemp("band") / "ds"
    info = make_imagenet_like(root, classes=3, per_class=20, seed=3, progress=False)
    return root, info


def test_layout_counts_and_info(band_tree):
    root, info = band_tree
    assert isinstance(info, DatasetInfo)
    assert info.root == os.path.abspath(root)
    assert (info.classes, info.per_class, info.files) == (3, 20, 60)
    dirs = sorted(d for d in os.listdir(root) if not d.startswith("."))
    assert dirs == [class_dir_name(c) for c in range(3)] == ["n10000000", "n10000001", "n10000002"]
    total = 0
    for d in dirs:
        names = sorted(os.listdir(root / d))
        assert names == sorted(f"{d}_{j}.JPEG" for j in range(20))
        total += sum(os.path.getsize(root / d / n) for n in names)
    assert info.total_bytes == total
    assert info.mean_bytes == pytest.approx(total / 60)
    assert len(info.paths()) == 60 and info.paths()[1].endswith("n10000000_1.JPEG")
    assert (root / MARKER_NAME).is_file()
    assert not any(n.endswith(".tmp") for _, _, fs in os.walk(root) for n in fs)


def test_mean_size_in_band_with_spread(band_tree):
    root, info = band_tree
    sizes = np.array([os.path.getsize(p) for p in info.paths()])
    assert 0.85 * 92_000 <= sizes.mean() <= 1.15 * 92_000, sizes.mean()
    # A realistic spread, not one size for all.
    assert sizes.std() / sizes.mean() > 0.1
    assert sizes.min() < 0.8 * sizes.mean() < sizes.max() * 0.8


def test_files_are_baseline_420_jpegs(band_tree):
    root, info = band_tree
    dims = set()
    for p in info.paths():
        with Image.open(p) as im:
            assert im.format == "JPEG"
            assert im.mode == "RGB"
            assert not im.info.get("progressive") and not im.info.get("progression")
            assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0
            im.load()  # full decode
            dims.add(im.size)
            arr = np.asarray(im)
        with open(p, "rb") as f:
            data = f.read()
        assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
        assert b"\xff\xc0" in data  # SOF0: baseline DCT
        assert b"\xff\xc2" not in data  # no SOF2 (progressive)
        # Natural-ish content: not flat, not saturated white noise.
        assert 10 < arr.std() < 100
    assert (500, 375) in dims and len(dims) > 3
    assert all(250 <= min(d) and max(d) <= 700 for d in dims)


def test_deterministic_same_seed_and_workers(tmp_path):
    # 32 images: enough for the 2-worker run to really use a process pool.
    kw = dict(SMALL, per_class=16)
    a = make_imagenet_like(tmp_path / "a", seed=7, workers=1, **kw)
    b = make_imagenet_like(tmp_path / "b", seed=7, workers=2, **kw)
    da, db = tree_digest(tmp_path / "a"), tree_digest(tmp_path / "b")
    assert len(da) == 32 and da == db
    assert (a.total_bytes, a.files) == (b.total_bytes, b.files)


def test_different_seed_differs(tmp_path):
    make_imagenet_like(tmp_path / "a", seed=1, workers=1, **SMALL)
    make_imagenet_like(tmp_path / "b", seed=2, workers=1, **SMALL)
    da, db = tree_digest(tmp_path / "a"), tree_digest(tmp_path / "b")
    assert da.keys() == db.keys()
    assert all(da[k] != db[k] for k in da)


def test_images_differ_within_dataset(tmp_path):
    make_imagenet_like(tmp_path / "a", seed=0, workers=1, **SMALL)
    digests = list(tree_digest(tmp_path / "a").values())
    assert len(set(digests)) == len(digests)


def test_marker_reuse_and_regeneration(tmp_path):
    root = tmp_path / "ds"
    info = make_imagenet_like(root, seed=5, workers=1, **SMALL)
    marker = json.loads((root / MARKER_NAME).read_text())
    assert marker["params"]["seed"] == 5 and marker["files"] == 12
    victim = root / class_dir_name(0) / f"{class_dir_name(0)}_0.JPEG"
    mtime = victim.stat().st_mtime_ns

    # Same parameters: returned from the marker, nothing rewritten.
    again = make_imagenet_like(root, seed=5, workers=1, **SMALL)
    assert again == info
    assert victim.stat().st_mtime_ns == mtime

    # A missing file is noticed and restored with identical bytes.
    before = tree_digest(root)
    victim.unlink()
    restored = make_imagenet_like(root, seed=5, workers=1, **SMALL)
    assert tree_digest(root) == before and restored == info

    # Different parameters: regenerated, and stale files/classes removed.
    smaller = dict(SMALL, classes=1, per_class=3)
    info2 = make_imagenet_like(root, seed=5, workers=1, **smaller)
    assert info2.files == 3
    assert sorted(tree_digest(root)) == [
        os.path.join(class_dir_name(0), f"{class_dir_name(0)}_{j}.JPEG") for j in range(3)
    ]
    assert json.loads((root / MARKER_NAME).read_text())["params"]["per_class"] == 3


def test_interrupted_run_resumes(tmp_path):
    ref = tmp_path / "ref"
    make_imagenet_like(ref, seed=9, workers=1, **SMALL)
    root = tmp_path / "ds"
    make_imagenet_like(root, seed=9, workers=1, **SMALL)
    # Simulate a crash: marker never written, some files missing, a temp left.
    os.replace(root / MARKER_NAME, root / ".fastread-dataset.partial.json")
    (root / class_dir_name(1) / f"{class_dir_name(1)}_4.JPEG").unlink()
    (root / class_dir_name(1) / f".{class_dir_name(1)}_4.JPEG.123.tmp").write_bytes(b"junk")
    make_imagenet_like(root, seed=9, workers=1, **SMALL)
    assert tree_digest(root) == tree_digest(ref)
    assert not (root / ".fastread-dataset.partial.json").exists()
    assert not list((root / class_dir_name(1)).glob(".*.tmp"))


def test_refuses_foreign_nonempty_root(tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(FileExistsError):
        make_imagenet_like(tmp_path, **SMALL)
    assert (tmp_path / "mine.txt").read_text() == "precious"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(classes=0), "classes"),
        (dict(classes=2.5), "classes"),
        (dict(per_class=0), "per_class"),
        (dict(per_class=-3), "per_class"),
        (dict(seed=-1), "seed"),
        (dict(mean_kb=0), "mean_kb"),
        (dict(mean_kb=float("nan")), "mean_kb"),
        (dict(width=0), "width"),
        (dict(height=True), "height"),
        (dict(workers=0), "workers"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_imagenet_like(tmp_path / "x", progress=False, **kwargs)
    assert not (tmp_path / "x").exists()


def test_npy_dataset(tmp_path):
    root = tmp_path / "npy"
    info = make_npy_dataset(root, count=7, shape=(4, 5), dtype="float32", seed=1, classes=3, progress=False)
    assert (info.classes, info.per_class, info.files) == (3, 3, 7)
    counts = [len(os.listdir(root / class_dir_name(c))) for c in range(3)]
    assert counts == [3, 2, 2]
    arr = np.load(root / class_dir_name(0) / f"{class_dir_name(0)}_0.npy")
    assert arr.shape == (4, 5) and arr.dtype == np.float32
    assert info.total_bytes == sum(os.path.getsize(p) for p in info.paths())
    # deterministic + reuse
    root2 = tmp_path / "npy2"
    make_npy_dataset(root2, count=7, shape=(4, 5), dtype="float32", seed=1, classes=3, progress=False)
    assert tree_digest(root) == tree_digest(root2)
    assert make_npy_dataset(root, count=7, shape=(4, 5), dtype="float32", seed=1, classes=3) == info
    u8 = make_npy_dataset(tmp_path / "u8", count=2, shape=16, seed=0, classes=1, progress=False)
    a = np.load(os.path.join(u8.root, class_dir_name(0), f"{class_dir_name(0)}_1.npy"))
    assert a.dtype == np.uint8 and a.shape == (16,)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(count=0, shape=(2,)), "count"),
        (dict(count=2, shape=(2,), classes=3), "classes"),
        (dict(count=2, shape=(-1,), classes=1), "shape"),
        (dict(count=2, shape=(2,), dtype="object", classes=1), "dtype"),
        (dict(count=2, shape=(2,), dtype="not-a-dtype", classes=1), "dtype"),
    ],
)
def test_npy_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_npy_dataset(tmp_path / "x", progress=False, **kwargs)


def test_decodes_from_bytes_like_a_loader(band_tree):
    # Loaders hand the raw bytes to the decoder; make sure that path works too.
    _, info = band_tree
    with open(info.paths()[-1], "rb") as f:
        im = Image.open(io.BytesIO(f.read()))
        im.load()
    assert im.mode == "RGB"


def test_workers_start_safely_beside_native_threads(tmp_path):
    # Forking beside running threads can deadlock the children; with native
    # reader threads alive the generator must still finish, with the same bytes.
    import fastread

    small = dict(classes=2, per_class=3, seed=5, mean_kb=8, width=96, height=72, progress=False)
    alone = make_imagenet_like(str(tmp_path / "alone"), workers=1, **small)
    with fastread.Reader(str(tmp_path / "alone"), batch_size=2, workers=2) as r:
        next(iter(r))
        beside = make_imagenet_like(str(tmp_path / "beside"), workers=2, **small)
    for a, b in zip(sorted(alone.paths()), sorted(beside.paths())):
        assert open(a, "rb").read() == open(b, "rb").read()


# -- make_npy_dataset: per_class, default shape, nbytes, threads ----------------------
def test_npy_per_class_default_shape(tmp_path):
    info = make_npy_dataset(tmp_path / "d", classes=2, per_class=3, seed=2, progress=False)
    assert (info.classes, info.per_class, info.files) == (2, 3, 6)
    for c in range(2):
        d = class_dir_name(c)
        assert sorted(os.listdir(tmp_path / "d" / d)) == [f"{d}_{j}.npy" for j in range(3)]
    a = np.load(info.paths()[4])
    assert a.shape == (3, 224, 224) and a.dtype == np.uint8
    assert 100 < a.mean() < 155 and a.min() == 0 and a.max() == 255  # uniform bytes
    assert info.total_bytes == 6 * (128 + 3 * 224 * 224)
    # per_class=P is the same dataset as count=classes*P: reused, not rewritten.
    again = make_npy_dataset(tmp_path / "d", classes=2, count=6, shape=(3, 224, 224), seed=2,
                             progress=False)
    assert again == info


def test_npy_nbytes_gives_1d_arrays_of_exactly_that_data(tmp_path):
    n = (1 << 20) + 8
    info = make_npy_dataset(tmp_path / "b", classes=1, per_class=2, nbytes=n, dtype="<f8",
                            progress=False)
    a = np.load(info.paths()[1])
    assert a.shape == (n // 8,) and a.dtype == np.dtype("<f8") and a.nbytes == n
    assert os.path.getsize(info.paths()[1]) == n + 128
    assert 0.9 < a.std() < 1.1  # standard normal
    # The same arrays as spelled with shape: identical bytes.
    make_npy_dataset(tmp_path / "s", classes=1, per_class=2, shape=(n // 8,), dtype="<f8",
                     progress=False)
    assert tree_digest(tmp_path / "b") == tree_digest(tmp_path / "s")


def test_npy_threads_do_not_change_bytes(tmp_path):
    kw = dict(classes=3, per_class=40, shape=(5, 7), dtype=">i4", seed=11, progress=False)
    one = make_npy_dataset(tmp_path / "one", workers=1, **kw)
    many = make_npy_dataset(tmp_path / "many", workers=4, **kw)
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "many")
    assert one.total_bytes == many.total_bytes and one.files == 120
    a = np.load(one.paths()[7])
    assert a.dtype == np.dtype(">i4") and a.shape == (5, 7)
    assert len({tuple(np.load(p).ravel()[:4]) for p in one.paths()}) == 120  # all differ
    assert not any(n.endswith(".tmp") for _, _, fs in os.walk(tmp_path) for n in fs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(classes=2), "per_class"),                       # neither per_class nor count
        (dict(classes=2, per_class=2, count=4), "per_class"),  # both
        (dict(classes=2, per_class=0), "per_class"),
        (dict(classes=1, per_class=1, nbytes=8, shape=(8,)), "nbytes"),
        (dict(classes=1, per_class=1, nbytes=6, dtype="float32"), "nbytes"),
        (dict(classes=1, per_class=1, nbytes=-1), "nbytes"),
        (dict(classes=1, per_class=1, workers=0), "workers"),
    ],
)
def test_npy_bad_size_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_npy_dataset(tmp_path / "x", progress=False, **kwargs)
    assert not (tmp_path / "x").exists()
