"""The bench family ``decoded`` (issue 33): its modes deliver augmented
batches from the JPEG tree and from each decoded pack (a few steps each, on
the CPU), say why where a pack is missing, and refuse a pack made with
other settings."""
import os

import pytest

pytest.importorskip("nvidia.dali", reason="DALI is not installed")

import fastread  # noqa: E402
from fastread.bench.environment import probe_environment  # noqa: E402
from fastread.bench.families.decoded import CROP, PACKS, pack_path  # noqa: E402
from fastread.bench.registry import BenchError, all_modes, detect_dataset  # noqa: E402
from fastread.bench.runners import Config  # noqa: E402
from fastread.datasets import make_imagenet_like  # noqa: E402


@pytest.fixture(scope="module")
def env():
    return probe_environment()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bench-decoded") / "train")
    make_imagenet_like(root, classes=2, per_class=10, width=200, height=150, mean_kb=8,
                       workers=1, progress=False)
    for name, opts in PACKS.items():
        fastread.pack(root, pack_path(root, name), decode=True, decode_workers=0,
                      progress=False, **opts)
    return root


def config(env, root, **kw):
    return Config(env=env, dataset=detect_dataset(root), batch_size=8, threads=2, **kw)


def mode(env, name):
    return {m.name: m for m in all_modes(env)}[name]


@pytest.mark.parametrize("name", ["decoded-dali-file-decode", "decoded-dali-jpeg",
                                  "decoded-dali-raw", "decoded-dali-raw-crop"])
def test_modes_deliver_augmented_batches(env, tree, name):
    m = mode(env, name)
    cfg = config(env, tree)
    why = m.unavailable(cfg)
    if why:
        pytest.skip(why)
    runner = m.build(m, cfg)
    try:
        steps = [runner.next() for _ in range(4)]   # 20 samples: crosses an epoch's end
    finally:
        runner.close()
    # float32 CHW CROP x CROP after the shared augmentation, whatever the source.
    assert steps == [(8, 8 * 3 * CROP * CROP * 4)] * 4


def test_missing_pack_says_how_to_make_it(env, tree, tmp_path):
    import shutil

    other = str(tmp_path / "train")
    shutil.copytree(tree, other)
    why = mode(env, "decoded-dali-raw-crop").unavailable(config(env, other))
    assert why is not None and "no pack at" in why
    assert "--decode --resize 160 --crop 160" in why
    assert mode(env, "decoded-dali-file-decode").unavailable(config(env, other)) is None
    assert "CPU comparison" in mode(env, "decoded-dali-raw").unavailable(
        config(env, tree, device="gpu"))


def test_pack_with_other_settings_is_refused(env, tree, tmp_path):
    import shutil

    other = str(tmp_path / "train")
    shutil.copytree(tree, other)
    fastread.pack(other, pack_path(other, "raw"), decode=True, resize=100, decode_workers=0,
                  progress=False)
    m = mode(env, "decoded-dali-raw")
    with pytest.raises(BenchError, match="was not packed with"):
        m.build(m, config(env, other))
    assert os.path.exists(pack_path(other, "raw"))
