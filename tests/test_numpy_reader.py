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


def test_same_arrays_in_the_same_order_as_dali(npy_tree):
    want = outputs(lambda: fn.readers.numpy(file_root=npy_tree, file_filter="*.npy"), 4)
    for engine in ("io_uring", "psync"):
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
