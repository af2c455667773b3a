"""CIFAR-10 (fastread.formats.cifar): both layouts against the format's
documented layout and torchvision's way of loading the pickles, readers
(Reader, DALI, torch), bad input, the generator and the CLI."""
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastread
from fastread.datasets.cifar10 import make_cifar10
from fastread.formats import Cifar10, FormatError, MultiFileRanges, to_hwc
from fastread.formats.cifar import RECORD_BYTES
from conftest import assert_state_records_shuffle


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    make_cifar10(root, train_per_class=30, test_per_class=10, seed=7)
    return str(root)


def reference_py(root, train=True):
    """What torchvision.datasets.CIFAR10 does with the pickles (its
    documented loading code, re-stated): pickle.load(encoding='latin1'),
    vstack 'data', reshape to N x 3 x 32 x 32, transpose to HWC."""
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    data, targets = [], []
    for n in names:
        with open(os.path.join(root, "cifar-10-batches-py", n), "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        data.append(entry["data"])
        targets.extend(entry["labels"] if "labels" in entry else entry["fine_labels"])
    data = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
    return data, np.array(targets)


def reference_bin(root, train=True):
    """The binary layout as documented: 1 label byte + 3072 bytes (R, G, B planes)."""
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    recs = np.concatenate([np.fromfile(os.path.join(root, "cifar-10-batches-bin", n), np.uint8)
                           .reshape(-1, RECORD_BYTES) for n in names])
    return recs[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), recs[:, 0].astype(np.int64)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("layout", ["cifar-10-batches-bin", "cifar-10-batches-py", ""])
def test_source_matches_references(cifar, layout, train):
    src = Cifar10(os.path.join(cifar, layout), train=train)
    images = to_hwc(src.read(np.arange(len(src))))
    for ref_images, ref_labels in (reference_py(cifar, train), reference_bin(cifar, train)):
        assert images.shape == ref_images.shape == (300 if train else 100, 32, 32, 3)
        np.testing.assert_array_equal(images, ref_images)
        np.testing.assert_array_equal(src.labels, ref_labels)
    assert src.layout == ("py" if layout.endswith("py") else "bin")
    assert np.bincount(src.labels).tolist() == [30 if train else 10] * 10


def test_reader_epochs_shards_shuffle(cifar):
    src = Cifar10(cifar)
    ref, ref_labels = reference_bin(cifar)
    seen = []
    for shard in range(3):
        with fastread.Reader(source=src, batch_size=32, shard_id=shard, num_shards=3,
                             random_shuffle=True, seed=3) as r:
            order = []
            for arrays, labels in r:
                imgs = to_hwc(arrays)
                order.append((imgs, labels))
            seen.append(order)
    all_imgs = np.concatenate([i for shard in seen for i, _ in shard])
    all_labels = np.concatenate([lab for shard in seen for _, lab in shard])
    assert len(all_imgs) == 300
    # Every image exactly once over the shards, with its own label.
    keys = {im.tobytes(): int(lab) for im, lab in zip(ref, ref_labels)}
    got = [im.tobytes() for im in all_imgs]
    assert sorted(got) == sorted(keys)
    assert [keys[g] for g in got] == all_labels.tolist()
    # Shuffled: not the file order.
    assert got[:32] != [im.tobytes() for im in ref[:32]]


def test_reader_in_order_batches_cross_files(cifar):
    src = Cifar10(cifar)
    ref, ref_labels = reference_bin(cifar)
    with fastread.Reader(source=src, batch_size=70) as r:  # batches straddle the files
        got = [(to_hwc(a), lab) for a, lab in r]
    np.testing.assert_array_equal(np.concatenate([g for g, _ in got]), ref)
    np.testing.assert_array_equal(np.concatenate([lab for _, lab in got]), ref_labels)
    assert src.sample_name(65).endswith("data_batch_2.bin[5]")
    assert src.names[65] == src.sample_name(65)


def test_multi_file_ranges_read_any_order(tmp_path):
    paths = []
    for k in range(3):
        p = tmp_path / f"f{k}"
        p.write_bytes(bytes(range(k * 10, k * 10 + 10)))
        paths.append(str(p))
    src = MultiFileRanges([fastread.FileRanges(p, np.arange(5) * 2, [2] * 5) for p in paths])
    assert len(src) == 15
    idx = [14, 0, 7, 7, 3]
    got = [a.tolist() for a in src.read(idx)]
    want = [[k * 10 + 2 * (i % 5), k * 10 + 2 * (i % 5) + 1] for i in idx for k in [i // 5]]
    assert got == want
    with fastread.Reader(source=src, batch_size=4, random_shuffle=True, seed=1) as r:
        flat = [tuple(a.tolist()) for arrays, _ in r for a in arrays]
    assert sorted(flat) == sorted(tuple(a.tolist()) for a in src.read(np.arange(15)))


def test_multi_file_ranges_refuses_gpu_output(cifar):
    with pytest.raises(ValueError, match="host memory only"):
        Cifar10(cifar).check_options({"device_output": True})


# -- bad input -------------------------------------------------------------------

def _bin_dir(tmp_path, sizes):
    d = tmp_path / "cifar-10-batches-bin"
    d.mkdir()
    for i, size in enumerate(sizes):
        (d / f"data_batch_{i + 1}.bin").write_bytes(bytes(size))
    return d


def test_record_size_not_a_multiple(tmp_path):
    d = _bin_dir(tmp_path, [RECORD_BYTES * 2, RECORD_BYTES * 3 + 100, RECORD_BYTES, RECORD_BYTES,
                            RECORD_BYTES])
    with pytest.raises(FormatError) as e:
        Cifar10(tmp_path)
    assert "data_batch_2.bin" in str(e.value) and f"at byte {RECORD_BYTES * 3}" in str(e.value)
    assert "100 bytes of a truncated record" in str(e.value)
    assert e.value.offset == RECORD_BYTES * 3


def test_empty_file_and_bad_label(tmp_path):
    d = _bin_dir(tmp_path, [0] + [RECORD_BYTES] * 4)
    with pytest.raises(FormatError, match=r"data_batch_1.bin at byte 0: empty"):
        Cifar10(d)
    rec = bytearray(RECORD_BYTES * 3)
    rec[2 * RECORD_BYTES] = 12
    (d / "data_batch_1.bin").write_bytes(bytes(rec))
    with pytest.raises(FormatError, match=rf"data_batch_1.bin at byte {2 * RECORD_BYTES}: "
                                          r"record 2 has label 12"):
        Cifar10(d)


def test_missing_files(tmp_path):
    _bin_dir(tmp_path, [RECORD_BYTES] * 4)
    with pytest.raises(FileNotFoundError, match="no CIFAR-10 train batches"):
        Cifar10(tmp_path)


def test_file_truncated_after_indexing_is_a_read_error(tmp_path):
    d = _bin_dir(tmp_path, [RECORD_BYTES * 4] * 5)
    src = Cifar10(d)
    os.truncate(d / "data_batch_3.bin", RECORD_BYTES * 2 + 10)
    with pytest.raises(fastread.ReadError, match=r"data_batch_3.bin\[2\]"):
        with fastread.Reader(source=src, batch_size=20) as r:
            for arrays, _ in r:
                to_hwc(arrays)


def _py_dir(tmp_path, entry, protocol=4, name="data_batch_1"):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir(exist_ok=True)
    good = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}
    for i in range(1, 6):
        (d / f"data_batch_{i}").write_bytes(pickle.dumps(good, protocol=4))
    (d / name).write_bytes(entry if isinstance(entry, bytes) else
                           pickle.dumps(entry, protocol=protocol))
    return d


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_pickle_protocols_with_raw_blocks(tmp_path, protocol):
    data = np.random.default_rng(0).integers(0, 256, (4, 3072), np.uint8)
    d = _py_dir(tmp_path, {b"data": data, b"labels": [3, 1, 4, 1]}, protocol)
    src = Cifar10(d)
    np.testing.assert_array_equal(np.stack(src.read([0, 1, 2, 3])), data)
    assert src.labels[:4].tolist() == [3, 1, 4, 1]


@pytest.mark.parametrize("entry, match", [
    (b"", "empty file"),
    (pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]})[:-40],
     "not a readable pickle"),
    (pickle.dumps([1, 2]), "holds a list"),
    (pickle.dumps({"data": os.getcwd, "labels": [0, 1]}), "posix.getcwd is not allowed"),
    (pickle.dumps({"data": np.zeros((2, 3072), np.uint8)}), "'labels'"),
    (pickle.dumps({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}), "N x 3072"),
    (pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}), "0..9"),
    (pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, protocol=2),
     "one raw block"),
])
def test_bad_pickles(tmp_path, entry, match):
    d = _py_dir(tmp_path, entry)
    with pytest.raises(FormatError, match=match) as e:
        Cifar10(d)
    assert "data_batch_1" in str(e.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=4 * RECORD_BYTES + 10), which=st.sampled_from(["bin", "py"]))
def test_fuzz_never_crashes(tmp_path_factory, blob, which):
    tmp = tmp_path_factory.mktemp("fuzz")
    if which == "bin":
        d = _bin_dir(tmp, [RECORD_BYTES] * 5)
        (d / "data_batch_4.bin").write_bytes(blob)
    else:
        d = _py_dir(tmp, blob, name="data_batch_4")
    try:
        src = Cifar10(d)
    except FormatError as e:
        assert "data_batch_4" in str(e)
        return
    imgs = to_hwc(src.read(np.arange(len(src))))
    assert imgs.shape == (len(src), 32, 32, 3)


# -- generator and CLI -------------------------------------------------------------

def test_generator_reuse_and_determinism(tmp_path):
    a = make_cifar10(tmp_path / "a", train_per_class=5, test_per_class=1, seed=1)
    mtime = os.stat(tmp_path / "a" / ".fastread-dataset.json").st_mtime_ns
    assert make_cifar10(tmp_path / "a", train_per_class=5, test_per_class=1, seed=1) == a
    assert os.stat(tmp_path / "a" / ".fastread-dataset.json").st_mtime_ns == mtime
    make_cifar10(tmp_path / "b", train_per_class=5, test_per_class=1, seed=1)
    for sub in ("cifar-10-batches-bin/data_batch_3.bin", "cifar-10-batches-py/test_batch"):
        assert (tmp_path / "a" / sub).read_bytes() == (tmp_path / "b" / sub).read_bytes()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "mine").write_text("x")
    with pytest.raises(FileExistsError):
        make_cifar10(tmp_path / "c", train_per_class=5)


CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck"]


def test_batches_meta_as_the_real_set_has_it(cifar):
    """torchvision's CIFAR10 reads the class names from batches.meta
    (pickle.load(encoding='latin1'), key 'label_names')."""
    with open(os.path.join(cifar, "cifar-10-batches-py", "batches.meta"), "rb") as f:
        meta = pickle.load(f, encoding="latin1")
    assert meta == {"label_names": CLASSES, "num_cases_per_batch": 60, "num_vis": 3072}
    with open(os.path.join(cifar, "cifar-10-batches-bin", "batches.meta.txt")) as f:
        assert f.read().split() == CLASSES


def test_generator_remakes_missing_files(tmp_path):
    """A dataset whose marker matches but which lost a file (or was made by a
    generator that did not write it) is made again when make_cifar10 reruns."""
    make_cifar10(tmp_path, train_per_class=5, test_per_class=1, seed=3)
    meta = tmp_path / "cifar-10-batches-py" / "batches.meta"
    batch = (tmp_path / "cifar-10-batches-bin" / "data_batch_2.bin").read_bytes()
    expected = meta.read_bytes()
    meta.unlink()
    make_cifar10(tmp_path, train_per_class=5, test_per_class=1, seed=3)
    assert meta.read_bytes() == expected
    assert (tmp_path / "cifar-10-batches-bin" / "data_batch_2.bin").read_bytes() == batch
    mtime = meta.stat().st_mtime_ns
    make_cifar10(tmp_path, train_per_class=5, test_per_class=1, seed=3)
    assert meta.stat().st_mtime_ns == mtime
    assert sorted(os.listdir(tmp_path / "cifar-10-batches-py")) == \
        ["batches.meta", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
         "data_batch_5", "test_batch"]


def _torchvision_or_skip():
    try:
        import torchvision  # noqa: F401  (a build for another torch raises RuntimeError)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torchvision does not import: {type(e).__name__}: {e}")


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("layout", ["", "cifar-10-batches-py"])
def test_torchvision_opens_generated_set(cifar, train, layout):
    """The bench's torchvision mode: CIFAR10 with the MD5 checks bypassed
    opens the generated directory and yields the same images, labels and
    class names as the references."""
    _torchvision_or_skip()
    from fastread.bench.families.formats import torchvision_cifar10

    ds = torchvision_cifar10(os.path.join(cifar, layout), train=train)
    ref_images, ref_labels = reference_py(cifar, train)
    np.testing.assert_array_equal(ds.data, ref_images)
    assert ds.targets == ref_labels.tolist()
    assert ds.classes == CLASSES
    image, label = ds[3]
    np.testing.assert_array_equal(np.asarray(image), ref_images[3])
    assert label == ref_labels[3]


def test_torchvision_still_needs_the_files(cifar, tmp_path):
    _torchvision_or_skip()
    from fastread.bench.families.formats import torchvision_cifar10

    with pytest.raises(RuntimeError, match="not found"):
        torchvision_cifar10(tmp_path)


def test_cli_make_dataset(tmp_path, capsys):
    from fastread.cli import main

    assert main(["make-dataset", str(tmp_path / "c"), "--format", "cifar10", "--per-class", "5",
                 "--quiet"]) == 0
    assert "CIFAR-10, 60 images" in capsys.readouterr().out
    assert len(Cifar10(tmp_path / "c")) == 50 and len(Cifar10(tmp_path / "c", train=False)) == 10
    with pytest.raises(SystemExit):
        main(["make-dataset", str(tmp_path / "d"), "--format", "cifar10", "--width", "3"])
    assert "do not apply to --format cifar10" in capsys.readouterr().err


# -- DALI and torch ----------------------------------------------------------------

@pytest.mark.parametrize("in_memory", [True, False])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_dali_reader(cifar, in_memory, layout):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from fastread.dali.formats import cifar10

    @pipeline_def(batch_size=64, num_threads=2, device_id=None)
    def pipe():
        return cifar10(file_root=cifar, train=True, random_shuffle=True, seed=5,
                       in_memory=in_memory, output_layout=layout)

    p = pipe()
    p.build()
    ref, ref_labels = reference_py(cifar)
    if layout == "CHW":
        ref = ref.transpose(0, 3, 1, 2)
    keys = {im.tobytes(): int(lab) for im, lab in zip(ref, ref_labels)}
    epochs = []
    for _epoch in range(2):
        got = []
        while True:
            try:
                images, labels = p.run()
            except StopIteration:
                p.reset()
                break
            arr = images.as_array()
            assert arr.dtype == np.uint8 and arr.shape[1:] == ref.shape[1:]
            assert images.layout() == layout
            for im, lab in zip(arr, labels.as_array().ravel()):
                assert keys[im.tobytes()] == int(lab)
                got.append(im.tobytes())
        assert sorted(got) == sorted(keys)
        epochs.append(got)
    assert epochs[0] != epochs[1]   # a new permutation each epoch
    # Both paths deliver the same order: the Reader's permutation.
    order = fastread.Reader(source=Cifar10(cifar), batch_size=64, random_shuffle=True, seed=5)
    want = [im.tobytes() for e in range(2) for arrays, _ in order
            for im in (to_hwc(arrays) if layout == "HWC" else to_hwc(arrays).transpose(0, 3, 1, 2))]
    order.close()
    assert [b for e in epochs for b in e] == want


def test_in_memory_source_matches_ranges(cifar):
    from fastread.formats.in_memory import InMemory

    src = Cifar10(cifar)
    mem = InMemory(src, to_hwc, engine="psync", threads=2, load_batch=7)
    assert len(mem) == len(src) and mem.data.shape == (300, 32, 32, 3)
    np.testing.assert_array_equal(mem.labels, src.labels)
    idx = np.array([299, 0, 17, 17, 150])
    np.testing.assert_array_equal(mem.read(idx), to_hwc(src.read(idx)))
    assert mem.sample_name(65) == src.sample_name(65)
    kw = dict(batch_size=32, random_shuffle=True, seed=3, shard_id=1, num_shards=3)
    with fastread.Reader(source=mem, **kw) as a, fastread.Reader(source=src, **kw) as b:
        for epoch in range(2):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            for (xa, la), (xb, lb) in zip(a, b, strict=True):
                np.testing.assert_array_equal(xa, to_hwc(xb))
                np.testing.assert_array_equal(la, lb)
    with pytest.raises(ValueError, match="host memory only"):
        fastread.Reader(source=mem, device="gpu")


def test_in_memory_refuses_samples_of_unequal_size(tmp_path):
    from fastread.formats.in_memory import InMemory

    p = tmp_path / "f"
    p.write_bytes(bytes(100))
    with pytest.raises(ValueError, match="fixed-size records only"):
        InMemory(fastread.FileRanges(str(p), [0, 10], [10, 20]))
    with pytest.raises(ValueError, match="fixed-size records only"):
        InMemory(fastread.FileList([str(p)]))


def test_in_memory_load_failure_names_the_sample(tmp_path):
    from fastread.formats.in_memory import InMemory

    p = tmp_path / "f"
    p.write_bytes(bytes(100))
    src = fastread.FileRanges(str(p), [0, 10], [10, 10])
    os.remove(p)
    with pytest.raises(fastread.ReadError, match=str(p)):
        InMemory(src)


def test_torch_loader_and_resume(cifar):
    torch = pytest.importorskip("torch")
    from fastread.torch import Cifar10Loader

    ref, ref_labels = reference_bin(cifar)
    loader = Cifar10Loader(cifar, batch_size=64)
    got = list(loader)
    assert all(i.dtype == torch.uint8 and lab.dtype == torch.int64 for i, lab in got)
    np.testing.assert_array_equal(torch.cat([i for i, _ in got]).numpy(), ref)
    np.testing.assert_array_equal(torch.cat([lab for _, lab in got]).numpy(), ref_labels)

    shuffled = Cifar10Loader(cifar, batch_size=64, random_shuffle=True, seed=2)
    plain = Cifar10Loader(cifar, batch_size=64, seed=2)
    assert_state_records_shuffle(shuffled, plain)
    assert sum(len(lab) for _, lab in plain) == len(shuffled.source) - 64


@pytest.mark.parametrize("in_memory", [True, False])
def test_torch_loader_resume_reproduces_augmentation(cifar, in_memory):
    torch = pytest.importorskip("torch")
    from fastread.torch import Cifar10Loader

    def loader():
        return Cifar10Loader(cifar, batch_size=32, random_shuffle=True, seed=3, augment=True,
                             in_memory=in_memory)

    full = [(x.clone(), y.clone()) for x, y in loader()]
    assert len(full) >= 5
    first = loader()
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert len(rest) == len(full) - 2
    for (xf, yf), (xr, yr) in zip(full[2:], rest):
        assert torch.equal(yf, yr) and torch.equal(xf, xr)
