"""Dense batch output (``Reader(dense=...)``, issue 33): one array (N, ...)
per batch over the reader's arena, equal to the per-sample output, in place
(a view, contiguous when buffered, strided by the aligned slot with
O_DIRECT), across epochs, shuffles and shards; samples of another size
refused naming the sample."""
import os

import numpy as np
import pytest

import fastread
from fastread.datasets import make_imagenet_like


@pytest.fixture(scope="module")
def packs(disk_tmp):
    root = os.path.join(disk_tmp, "dense_tree")
    make_imagenet_like(root, classes=3, per_class=7, width=80, height=60, mean_kb=3,
                       workers=1, progress=False)
    crop = fastread.pack(root, os.path.join(disk_tmp, "dense_crop.img"), decode=True,
                         resize=24, crop=20, decode_workers=0, progress=False)
    var = fastread.pack(root, os.path.join(disk_tmp, "dense_var.img"), decode=True,
                        resize=24, decode_workers=0, progress=False)
    return root, crop, var


def epochs(reader, n=2):
    return [(a, lab) for _ in range(n) for a, lab in reader]


def base_is_batch(a):
    """The array views memory it does not own, down to a native Batch."""
    while a is not None and type(a).__name__ != "Batch":
        if isinstance(a, np.ndarray) and a.flags.owndata:
            return False
        a = getattr(a, "base", None)   # ndarray, or as_strided's holder of one
    return a is not None


@pytest.mark.parametrize("opts", [
    dict(),
    dict(o_direct=True),
    dict(random_shuffle=True, seed=3, num_shards=2, shard_id=1),
    dict(pad_last_batch=True, num_shards=3, shard_id=2, workers=2),
], ids=["buffered", "o_direct", "shuffled-shard", "padded-workers"])
def test_dense_equals_per_sample_output(packs, opts):
    _root, img, _ = packs
    with fastread.Reader(image=img, batch_size=4, dense=True, **opts) as dense, \
            fastread.Reader(image=img, batch_size=4, **opts) as per_sample:
        got, want = epochs(dense), epochs(per_sample)
    assert len(got) == len(want) > 2
    for (a, la), (b, lb) in zip(got, want):
        assert isinstance(a, np.ndarray) and a.shape == (len(b), 20, 20, 3)
        assert a.dtype == np.uint8
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(
            a, np.stack([img.pixels(x, 0) for x in b]))
        assert base_is_batch(a)   # the arena as the engine wrote it, not a copy
        if not opts.get("o_direct"):
            assert a.flags.c_contiguous
        else:
            assert len(b) == 1 or a.strides[0] % 4096 == 0   # each sample in its aligned slot


def test_dense_array_stays_valid_while_referenced(packs):
    _root, img, _ = packs
    with fastread.Reader(image=img, batch_size=5, dense=True) as r:
        kept = [a for a, _ in epochs(r, 3)]
    want = np.stack([img.pixels(x, i) for i, x in enumerate(img.read(np.arange(len(img))))])
    flat = np.concatenate(kept)
    np.testing.assert_array_equal(flat, np.concatenate([want] * 3))


def test_dense_refuses_several_shapes(packs):
    _root, _, var = packs
    with pytest.raises(ValueError, match="one shape"):
        fastread.Reader(image=var, batch_size=4, dense=True)


def test_dense_bytes_of_fixed_size_ranges_and_files(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 12 * 30, dtype=np.uint8)
    path = tmp_path / "records.bin"
    data.tofile(path)
    src = fastread.FileRanges(str(path), np.arange(12) * 30, np.full(12, 30), np.arange(12))
    with fastread.Reader(source=src, batch_size=5, dense=True) as r:
        got = [a for a, _ in r]
    assert [a.shape for a in got] == [(5, 30), (5, 30), (2, 30)]
    np.testing.assert_array_equal(np.concatenate(got), data.reshape(12, 30))
    with fastread.Reader(source=src, batch_size=6, dense=(5, 6)) as r:
        a, _ = next(iter(r))
    np.testing.assert_array_equal(a, data[:180].reshape(6, 5, 6))
    # Files: one size each, read into one block.
    for i in range(6):
        (tmp_path / "c" / "x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "c" / "x" / f"{i}.jpg").write_bytes(bytes([i]) * 40)
    with fastread.Reader(str(tmp_path / "c"), batch_size=6, dense=True) as r:
        a, _ = next(iter(r))
    assert a.shape == (6, 40) and (a == np.arange(6)[:, None]).all() and a.flags.c_contiguous


def test_dense_sample_of_another_size_is_named(tmp_path):
    for i, n in enumerate([40, 40, 41, 40]):
        (tmp_path / "c" / "x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "c" / "x" / f"{i}.jpg").write_bytes(b"a" * n)
    with fastread.Reader(str(tmp_path / "c"), batch_size=4, dense=True) as r:
        with pytest.raises(ValueError, match=r"2\.jpg.* has 41 bytes"):
            next(iter(r))


@pytest.mark.parametrize("dense", [0, "yes", (3, 0), (2.0,)])
def test_bad_dense_argument(packs, dense):
    _root, img, _ = packs
    with pytest.raises(ValueError, match="dense must be"):
        fastread.Reader(image=img, batch_size=4, dense=dense)


def test_dense_device_batches_on_the_mock_gpu(mock_cuda_dir, packs):
    """Reader(device="gpu", dense=True), on the mock CUDA driver (device
    memory is host memory): one DeviceArray (N, H, W, C) per batch over the
    batch's device buffer, C-ordered when buffered, strided by the slot with
    O_DIRECT, its bytes (through the CUDA array interface and DLPack's
    strides) those of the host dense batches."""
    import subprocess
    import sys
    import textwrap

    _root, img, _ = packs
    code = textwrap.dedent(f"""
        import ctypes, numpy as np, fastread

        def host_copy(a):
            cai = a.__cuda_array_interface__
            shape, strides = cai["shape"], cai["strides"]
            itemsize = np.dtype(cai["typestr"]).itemsize
            span = (shape[0] - 1) * (strides[0] if strides else a.nbytes // shape[0]) + \\
                int(np.prod(shape[1:])) * itemsize
            raw = np.frombuffer(ctypes.string_at(cai["data"][0], span), np.uint8)
            return np.lib.stride_tricks.as_strided(
                raw, shape=shape, strides=strides or np.empty(shape, np.uint8).strides).copy()

        img = fastread.PackedImage({img.path!r})
        for o_direct in (False, True):
            with fastread.Reader(image=img, batch_size=4, dense=True, device="gpu",
                                 o_direct=o_direct) as gpu, \\
                    fastread.Reader(image=img, batch_size=4, dense=True) as host:
                n = 0
                for (g, gl), (h, hl) in zip(gpu, host):
                    assert isinstance(g, fastread.DeviceArray) and g.shape == h.shape
                    cai = g.__cuda_array_interface__
                    if len(h) > 1:
                        assert (cai["strides"] is None) == (not o_direct), cai["strides"]
                    np.testing.assert_array_equal(host_copy(g), h)
                    np.testing.assert_array_equal(gl, hl)
                    g.__dlpack__()   # a capsule with the strides (freed unconsumed)
                    n += len(h)
                assert n == len(img)
        print("ok")
    """)
    path = os.pathsep.join(p for p in (mock_cuda_dir, os.environ.get("LD_LIBRARY_PATH")) if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, LD_LIBRARY_PATH=path))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
