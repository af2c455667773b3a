"""fastread.torch.ImageLoader on CPU: shapes, epochs, torchrun env, resume."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed: the loader decodes with DALI")

from fastread.datasets import make_imagenet_like  # noqa: E402
from fastread.torch import ImageLoader  # noqa: E402
from conftest import assert_state_records_shuffle  # noqa: E402


@pytest.fixture(scope="module")
def jpegs(disk_tmp):
    root = os.path.join(disk_tmp, "torch-jpegs")
    make_imagenet_like(root, classes=3, per_class=7, seed=1, mean_kb=8, width=96, height=72,
                       workers=1, progress=False)
    return root  # 21 images


def labels_of(loader):
    return [int(x) for _, labels in loader for x in labels]


def test_decoded_batches(jpegs):
    loader = ImageLoader(jpegs, batch_size=8, size=32, num_threads=2)
    shapes = [(tuple(img.shape), img.dtype, lab.dtype) for img, lab in loader]
    assert len(loader) == 3 == len(shapes)
    assert shapes[0] == ((8, 3, 32, 32), torch.float32, torch.int64)
    assert shapes[-1][0] == (5, 3, 32, 32)
    assert labels_of(loader) == [0] * 7 + [1] * 7 + [2] * 7  # second epoch, in order


def test_bytes_mode_is_zero_copy_views(jpegs):
    loader = ImageLoader(jpegs, batch_size=10, decode=False)
    images, labels = next(iter(loader))
    assert isinstance(images, list) and images[0].dtype == torch.uint8
    with open(loader.reader.paths[0], "rb") as f:
        assert bytes(images[0].numpy()) == f.read()


@pytest.mark.parametrize("decode", [False, True])
def test_resume_mid_epoch_delivers_exactly_the_rest(jpegs, decode):
    kw = dict(batch_size=4, random_shuffle=True, seed=9, decode=decode, size=16)
    full = ImageLoader(jpegs, **kw)
    full.set_epoch(2)
    want = labels_of(full)

    first = ImageLoader(jpegs, **kw)
    first.set_epoch(2)
    got = []
    it = iter(first)
    for _ in range(2):
        got.extend(int(x) for x in next(it)[1])
    state = first.state_dict()
    assert state["epoch"] == 2 and state["batches_delivered"] == 2

    second = ImageLoader(jpegs, **kw)
    second.load_state_dict(state)
    got.extend(labels_of(second))
    assert got == want
    assert second.epoch == 3


def test_shards_from_torchrun_env(jpegs, monkeypatch):
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = ImageLoader(jpegs, batch_size=4, decode=False)
        assert loader.reader.shard_id == rank and loader.reader.num_shards == 2
        seen.extend(bytes(x.numpy()) for imgs, _ in loader for x in imgs)
    assert len(seen) == 21 and len(set(seen)) == 21


def test_state_from_another_setup_is_refused(jpegs):
    a = ImageLoader(jpegs, batch_size=4, decode=False)
    b = ImageLoader(jpegs, batch_size=5, decode=False)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict(a.state_dict())


def test_bad_device(jpegs):
    with pytest.raises(ValueError, match="device"):
        ImageLoader(jpegs, device="tpu")
    with pytest.raises(ValueError, match="RANK"):
        os.environ["RANK"] = "zero"
        try:
            ImageLoader(jpegs)
        finally:
            del os.environ["RANK"]


@pytest.mark.parametrize("load", [-0.1, 1.5, "1", True])
def test_bad_hw_decoder_load_is_refused_naming_it(jpegs, load):
    with pytest.raises(ValueError, match="hw_decoder_load"):
        ImageLoader(jpegs, batch_size=8, hw_decoder_load=load)


def test_hw_decoder_load_reaches_the_cpu_pipeline_harmlessly(jpegs):
    # Only the mixed (GPU) decoder takes it; on the CPU the batches are the same.
    plain = ImageLoader(jpegs, batch_size=8, size=32, num_threads=2)
    loaded = ImageLoader(jpegs, batch_size=8, size=32, num_threads=2, hw_decoder_load=1.0)
    assert labels_of(plain) == labels_of(loaded)


def test_labels_are_dali_labels(jpegs):
    import fastread
    _, labels = fastread.scan(jpegs)
    loader = ImageLoader(jpegs, batch_size=21, decode=False)
    assert labels_of(loader) == labels.astype(np.int64).tolist()


def test_cuda_without_a_gpu_fails_at_construction(jpegs, monkeypatch):
    from fastread import _core
    usable, why = _core.gpu_probe(0)
    if usable:
        pytest.skip("a CUDA device is usable here")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for decode in (True, False):
        with pytest.raises(RuntimeError, match="CUDA device 0 is not usable here") as e:
            ImageLoader(jpegs, batch_size=4, device="cuda", decode=decode)
        assert why in str(e.value) and "device='cpu'" in str(e.value)
    monkeypatch.setenv("LOCAL_RANK", "3")  # torchrun's choice of GPU is the one named
    with pytest.raises(RuntimeError, match="CUDA device 3"):
        ImageLoader(jpegs, batch_size=4, device="cuda")
    with pytest.raises(ValueError, match="device_id"):
        ImageLoader(jpegs, batch_size=4, device="cuda", device_id=-1)


def test_state_records_random_shuffle(jpegs):
    # A shuffled state resumed unshuffled (or the reverse) would deliver
    # another order's rest: some samples twice, others never.
    shuffled = ImageLoader(jpegs, batch_size=4, decode=False, random_shuffle=True, seed=9)
    plain = ImageLoader(jpegs, batch_size=4, decode=False, seed=9)
    assert_state_records_shuffle(shuffled, plain)
    assert len(labels_of(plain)) == 21 - 4
