"""Fixtures of the fastread microbenchmarks (pytest-benchmark).

Run with ``python3 -m pytest bench/engines/ --benchmark-only``. The data set is
a synthetic ImageNet-like tree (20 classes x 1000 JPEGs, ~92 KB each, seed 0)
made once with :func:`fastread.datasets.make_imagenet_like` and reused
through its marker file. Environment:

* ``FASTREAD_BENCH_DATA`` -- where the tree lives (default
  ``/var/tmp/fastread-bench/imagenet-20k``). A non-empty directory without
  fastread's marker is used as it is (a real data set, e.g. ImageNet).
* ``FASTREAD_BENCH_BATCHES`` -- batches of 64 per timed round (default 100).
* ``FASTREAD_BENCH_ROUNDS`` -- timed rounds per benchmark (default 5).
"""
import os

import pytest

import fastread
from fastread.datasets import MARKER_NAME, make_imagenet_like

DEFAULT_DATA = "/var/tmp/fastread-bench/imagenet-20k"
BATCH_SIZE = 64


def _int_env(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{name}={raw!r}: expected a positive integer") from None
    if value < 1:
        raise pytest.UsageError(f"{name}={raw!r}: expected a positive integer")
    return value


@pytest.fixture(scope="session")
def bench_data():
    """Root of the benchmark data set (made on first use, then reused)."""
    root = os.environ.get("FASTREAD_BENCH_DATA", DEFAULT_DATA)
    foreign = (os.path.isdir(root) and os.listdir(root)
               and not os.path.exists(os.path.join(root, MARKER_NAME))
               and not os.path.exists(os.path.join(root, ".fastread-dataset.partial.json")))
    if not foreign:
        make_imagenet_like(root, classes=20, per_class=1000, seed=0)
    return root


@pytest.fixture(scope="session")
def batches(bench_data):
    """FASTREAD_BENCH_BATCHES batches of 64 paths, spread over the classes
    (every k-th sample), read in this order by each timed round."""
    paths, _ = fastread.scan(bench_data)
    want = _int_env("FASTREAD_BENCH_BATCHES", 100) * BATCH_SIZE
    if len(paths) < BATCH_SIZE:
        pytest.skip(f"{bench_data} has fewer than {BATCH_SIZE} samples")
    stride = max(1, len(paths) // want)
    chosen = paths[::stride][:want]
    chosen = chosen[:len(chosen) // BATCH_SIZE * BATCH_SIZE]
    return [chosen[i:i + BATCH_SIZE] for i in range(0, len(chosen), BATCH_SIZE)]


@pytest.fixture(scope="session")
def rounds():
    return _int_env("FASTREAD_BENCH_ROUNDS", 5)
