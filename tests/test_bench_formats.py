"""The bench family of the record formats: its datasets are detected and its
fastread modes deliver batches (a few steps each, on the CPU)."""
import pytest

from fastread.bench.environment import probe_environment
from fastread.bench.registry import all_modes, detect_dataset
from fastread.bench.runners import Config
from fastread.datasets.cifar10 import make_cifar10
from fastread.datasets.webdataset import make_webdataset


@pytest.fixture(scope="module")
def env():
    return probe_environment()


def _run(mode_name, path, env, steps=3, batch_size=16, **cfg):
    ds = detect_dataset(str(path))
    mode = {m.name: m for m in all_modes(env)}[mode_name]
    config = Config(env=env, dataset=ds, batch_size=batch_size, threads=2, **cfg)
    why = mode.unavailable(config)
    if why:
        pytest.skip(why)
    runner = mode.build(mode, config)
    try:
        return ds, [runner.next() for _ in range(steps)]
    finally:
        runner.close()


@pytest.mark.parametrize("mode", ["cifar-fastread-psync", "cifar-fastread-ranges",
                                  "cifar-dali-numpy", "cifar-fastread-torch"])
def test_cifar_modes(tmp_path_factory, env, mode):
    root = tmp_path_factory.getbasetemp() / "bench-cifar"
    make_cifar10(root, train_per_class=5, test_per_class=1)
    ds, steps = _run(mode, root, env)
    assert ds.primary == "cifar10" and ds.samples == 50
    # float32 CHW 32x32 images after the augmentation: 12,288 bytes each.
    assert [s for s, _ in steps] == [16, 16, 16]
    assert all(b == 16 * 3 * 32 * 32 * 4 for _, b in steps)


@pytest.mark.parametrize("mode", ["wds-fastread-psync", "wds-extsrc-auto"])
def test_webdataset_mode(tmp_path, env, mode):
    if mode.endswith("-auto"):
        from fastread.bench.registry import default_engine
        mode = mode[:-len("auto")] + default_engine(env)
    make_webdataset(tmp_path, shards=2, per_shard=10, width=16, height=16)
    ds, steps = _run(mode, tmp_path, env, steps=4, batch_size=8)
    assert ds.primary == "webdataset" and ds.samples == 20
    # Epochs roll over as in fn.readers.webdataset: the third batch's last 4
    # samples are the next epoch's first.
    assert [s for s, _ in steps] == [8, 8, 8, 8]
