"""fastread.torch.ImageLoader("s3://bucket/prefix") on CPU against a real S3
server (SeaweedFS, tests/s3_server.py): the same bytes, labels, decoded
pixels and shapes as the loader over the local tree the bucket came from;
shards, shuffles and resume as for a directory."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed: the loader decodes with DALI")

import fastread  # noqa: E402
from fastread.datasets import make_imagenet_like  # noqa: E402
from fastread.torch import ImageLoader  # noqa: E402

pytestmark = pytest.mark.usefixtures("s3_engine")


@pytest.fixture(scope="module")
def jpegs(disk_tmp, s3_server):
    """23 JPEGs in 3 classes on disk and in s3://torch-s3/set/. (local, url, options)."""
    root = os.path.join(disk_tmp, "s3-torch-jpegs")
    make_imagenet_like(root, classes=3, per_class=7, seed=4, mean_kb=6, width=80, height=64,
                       workers=1, progress=False)
    # Two more in the last class: batches and shards of unequal sizes.
    last = os.path.join(root, sorted(os.listdir(root))[-1])
    for i, src in enumerate(sorted(os.listdir(last))[:2]):
        with open(os.path.join(last, src), "rb") as f, \
                open(os.path.join(last, f"zz{i}.jpg"), "wb") as g:
            g.write(f.read())
    s3_server.upload_tree(root, "torch-s3", "set")
    o = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key)
    return root, "s3://torch-s3/set", o


def batches(loader):
    out = []
    for images, labels in loader:
        if isinstance(images, list):
            images = [bytes(t.numpy()) for t in images]
        else:
            images = images.numpy()
        out.append((images, labels.numpy()))
    return out


def same(a, b):
    assert len(a) == len(b)
    for (ia, la), (ib, lb) in zip(a, b):
        np.testing.assert_array_equal(la, lb)
        if isinstance(ia, list):
            assert ia == ib
        else:
            assert ia.shape == ib.shape and ia.dtype == ib.dtype
            np.testing.assert_array_equal(ia, ib)


@pytest.mark.parametrize("kw", [dict(), dict(random_shuffle=True, seed=3),
                                dict(num_shards=2, shard_id=1, drop_last=True)],
                         ids=["plain", "shuffled", "shard"])
def test_bytes_and_labels_as_for_the_local_tree(jpegs, kw):
    local, url, o = jpegs
    ours = ImageLoader(url, batch_size=5, decode=False, s3=o, **kw)
    want = ImageLoader(local, batch_size=5, decode=False, **kw)
    for epoch in range(2):
        ours.set_epoch(epoch)
        want.set_epoch(epoch)
        got = batches(ours)
        same(got, batches(want))
    # The objects' own bytes, not something equal to the local loader's by accident.
    with open(want.reader.paths[0], "rb") as f:
        first = f.read()
    ours.set_epoch(0)
    if not kw:
        assert batches(ours)[0][0][0] == first
    assert len(ours) == len(want)


def test_decoded_pixels_labels_and_shapes(jpegs):
    """The CPU decode path: DALI decodes the objects' bytes into the same
    float32 NCHW batches as from disk."""
    local, url, o = jpegs
    ours = batches(ImageLoader(url, batch_size=8, size=32, num_threads=2, s3=o))
    want = batches(ImageLoader(local, batch_size=8, size=32, num_threads=2))
    assert [b[0].shape for b in ours] == [(8, 3, 32, 32), (8, 3, 32, 32), (7, 3, 32, 32)]
    assert ours[0][0].dtype == np.float32
    same(ours, want)
    assert [int(x) for _, lab in ours for x in lab] == [0] * 7 + [1] * 7 + [2] * 9


def test_flat_options_and_environment(jpegs, s3_server, monkeypatch):
    """S3 options as flat keywords (endpoint_url=, ...), or none at all
    with the AWS environment set."""
    local, url, o = jpegs
    want = batches(ImageLoader(local, batch_size=6, decode=False))
    same(batches(ImageLoader(url, batch_size=6, decode=False, **o.given())), want)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    same(batches(ImageLoader(url, batch_size=6, decode=False)), want)


def test_resume_mid_epoch(jpegs):
    local, url, o = jpegs
    kw = dict(batch_size=4, random_shuffle=True, seed=9, decode=False, s3=o)
    full = ImageLoader(url, **kw)
    full.set_epoch(1)
    want = batches(full)
    first = ImageLoader(url, **kw)
    first.set_epoch(1)
    it = iter(first)
    got = [next(it), next(it)]
    got = [([bytes(t.numpy()) for t in i], lab.numpy()) for i, lab in got]
    second = ImageLoader(url, **kw)
    second.load_state_dict(first.state_dict())
    same(got + batches(second), want)


def test_bad_root_names_the_url(jpegs, s3_server):
    local, url, o = jpegs
    with pytest.raises(OSError) as e:
        ImageLoader("s3://no-such-bucket-torch/set", batch_size=4, s3=o)
    assert "s3://no-such-bucket-torch/set" in str(e.value)
    # A prefix with no object under it lists nothing (S3 has no directories
    # to be missing): ValueError naming it, as for a directory without samples.
    with pytest.raises(ValueError) as e:
        ImageLoader("s3://torch-s3/no-such-prefix", batch_size=4, s3=o)
    assert "s3://torch-s3/no-such-prefix" in str(e.value)
    bad = fastread.S3Options.coerce(o, secret_access_key="not-the-secret-xyz")
    with pytest.raises(OSError) as e:
        ImageLoader(url, batch_size=4, s3=bad)
    assert url in str(e.value) and "not-the-secret-xyz" not in str(e.value)
