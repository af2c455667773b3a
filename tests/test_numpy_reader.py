"""fastread.dali.readers.numpy against DALI's fn.readers.numpy (CPU-only
DALI here; GPU output is compared in test_gpu.py)."""
import os

import numpy as np
import pytest

pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed")
from nvidia.dali import fn, pipeline_def  # noqa: E402

from fastread.dali import readers  # noqa: E402
from fastread.npy import NpyError  # noqa: E402


@pytest.fixture(scope="module")
def npy_tree(disk_tmp):
    """Arrays in the root and in subdirectories, C and Fortran order, one
    ndim, shapes and values that differ per file, a non-matching file."""
    root = os.path.join(disk_tmp, "npy-tree")
    rng = np.random.default_rng(5)
    for d in ("", "b", "a"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
        for j in range(4):
            a = rng.standard_normal((2 + j, 3, 1 + j % 3)).astype(np.float32)
            if j == 2:
                a = np.asfortranarray(a)
            np.save(os.path.join(root, d, f"{d or 'top'}{j}.npy"), a)
    with open(os.path.join(root, "a", "notes.txt"), "w") as f:
        f.write("not an array")
    os.makedirs(os.path.join(root, "a", "deeper"))
    np.save(os.path.join(root, "a", "deeper", "skipped.npy"), np.zeros((1, 1, 1), np.float32))
    return root


def outputs(reader_fn, batches, batch_size=3):
    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None)
    def pipe():
        return reader_fn()
    p = pipe()
    p.build()
    got = []
    for _ in range(batches):
        (out,) = p.run()
        got.append([np.array(out[i]) for i in range(len(out))])
    return got


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_same_arrays_in_the_same_order_as_dali(npy_tree, engine):
    want = outputs(lambda: fn.readers.numpy(file_root=npy_tree, file_filter="*.npy"), 4)
    got = outputs(lambda: readers.numpy(file_root=npy_tree, engine=engine), 4)
    for wb, gb in zip(want, got):
        assert len(wb) == len(gb)
        for w, g in zip(wb, gb):
            assert w.dtype == g.dtype and w.shape == g.shape
            assert g.flags["C_CONTIGUOUS"] and np.array_equal(w, g)


def test_files_argument_and_shards(npy_tree):
    files = sorted(os.path.relpath(os.path.join(d, f), npy_tree)
                   for d, _, fs in os.walk(npy_tree) for f in fs if f.endswith(".npy"))
    want = outputs(lambda: fn.readers.numpy(file_root=npy_tree, files=files, shard_id=1,
                                            num_shards=2), 2)
    got = outputs(lambda: readers.numpy(file_root=npy_tree, files=files, shard_id=1,
                                        num_shards=2), 2)
    assert all(np.array_equal(w, g) for wb, gb in zip(want, got) for w, g in zip(wb, gb))


def test_shuffled_epoch_holds_every_array_once(npy_tree):
    want = [a for b in outputs(lambda: fn.readers.numpy(file_root=npy_tree), 4) for a in b]
    got = [a for b in outputs(lambda: readers.numpy(file_root=npy_tree, random_shuffle=True,
                                                    seed=3), 4) for a in b]
    key = lambda a: (a.shape, a.tobytes())  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, want))
    assert [key(a) for a in got] != [key(a) for a in want]


def test_bad_input_is_named(npy_tree, disk_tmp):
    with pytest.raises(TypeError, match="roi_start"):
        outputs(lambda: readers.numpy(file_root=npy_tree, roi_start=[0]), 1)
    bad = os.path.join(disk_tmp, "npy-bad")
    os.makedirs(bad, exist_ok=True)
    with open(os.path.join(bad, "x.npy"), "wb") as f:
        f.write(b"\x93NUMPY garbage")
    with pytest.raises(NpyError, match="x.npy"):
        outputs(lambda: readers.numpy(file_root=bad), 1)
    with pytest.raises(ValueError, match="no files matching"):
        outputs(lambda: readers.numpy(file_root=os.path.join(npy_tree, "a", "deeper", "..", "..",
                                                             "a"), file_filter="*.none"), 1)


needs_plugin = pytest.mark.skipif(
    not __import__("fastread.dali._plugin", fromlist=["load"]).load(),
    reason="fastread's DALI plugin is not built here")


@pytest.fixture(scope="module")
def c_trees(disk_tmp):
    """C-ordered trees the native operator serves: float32 3-D arrays of
    varying shapes, int16 2-D arrays, and 0-d uint8 scalars."""
    roots = {}
    rng = np.random.default_rng(11)
    for name, make in (
            ("f32", lambda j: rng.standard_normal((1 + j % 3, 4, 2 + j)).astype(np.float32)),
            ("i16", lambda j: rng.integers(-900, 900, (3 + j, 5)).astype(np.int16)),
            ("u8", lambda j: np.array(j * 7, np.uint8))):
        root = roots[name] = os.path.join(disk_tmp, f"npy-c-{name}")
        os.makedirs(root, exist_ok=True)
        for j in range(7):
            np.save(os.path.join(root, f"{j:02d}.npy"), make(j))
    return roots


@needs_plugin
@pytest.mark.parametrize("kind", ["f32", "i16", "u8"])
def test_native_operator_gives_dalis_arrays(c_trees, kind):
    # Two epochs of batches of 3 over 7 files: the operator's epochs roll
    # over as fn.readers.numpy's do, batch for batch.
    root = c_trees[kind]
    want = outputs(lambda: fn.readers.numpy(file_root=root), 5)
    for native in (True, False):
        got = outputs(lambda: readers.numpy(file_root=root, native=native), 5)
        for wb, gb in zip(want, got):
            assert len(wb) == len(gb)
            for w, g in zip(wb, gb):
                assert w.dtype == g.dtype and w.shape == g.shape and np.array_equal(w, g)


@needs_plugin
def test_native_operator_shards_and_shuffles(c_trees):
    root = c_trees["f32"]
    kw = dict(file_root=root, shard_id=1, num_shards=2)
    want = outputs(lambda: fn.readers.numpy(**kw), 4)
    got = outputs(lambda: readers.numpy(native=True, **kw), 4)
    assert all(np.array_equal(w, g) for wb, gb in zip(want, got) for w, g in zip(wb, gb))
    # Shuffled: an epoch (7 files, batches of 7) holds every array once, in
    # another order.
    key = lambda a: (a.shape, a.tobytes())  # noqa: E731
    plain = [key(a) for a in outputs(lambda: fn.readers.numpy(file_root=root), 1, 7)[0]]
    shuffled = [key(a) for a in outputs(lambda: readers.numpy(file_root=root, native=True,
                                                              random_shuffle=True, seed=3), 1, 7)[0]]
    assert sorted(shuffled) == sorted(plain) and shuffled != plain


@needs_plugin
def test_native_refusals_name_the_reason(npy_tree, tmp_path):
    # npy_tree holds Fortran-ordered files: the external source transposes them.
    with pytest.raises(ValueError, match="Fortran-ordered"):
        outputs(lambda: readers.numpy(file_root=npy_tree, native=True), 1)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    np.save(mixed / "a.npy", np.zeros((2, 2), np.float32))
    np.save(mixed / "b.npy", np.zeros((2, 2), np.float64))
    with pytest.raises(ValueError, match="2 dtypes"):
        outputs(lambda: readers.numpy(file_root=str(mixed), native=True), 1)
    with pytest.raises(ValueError, match="epoch_end='stop'"):
        outputs(lambda: readers.numpy(file_root=str(mixed), native=True, epoch_end="stop"), 1)


@needs_plugin
def test_native_operator_names_a_file_that_changed(disk_tmp):
    # Headers are read once, at definition: a file rewritten with another
    # shape afterwards fails its batch in pipe.run(), naming the file,
    # instead of handing out bytes under the old shape.
    root = os.path.join(disk_tmp, "npy-changing")
    os.makedirs(root, exist_ok=True)
    for j in range(4):
        np.save(os.path.join(root, f"{j}.npy"), np.full((3, 3), j, np.float32))

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return readers.numpy(file_root=root, native=True, prefetch_queue_depth=1)
    p = pipe()
    p.build()
    np.save(os.path.join(root, "3.npy"), np.full((5, 3), 3, np.float32))
    with pytest.raises(RuntimeError, match=r"3\.npy.*the file changed"):
        for _ in range(6):
            p.run()
