"""A synthetic Squirrel MessagePack store, written by squirrel-core itself.

:func:`make_squirrel` writes ``samples`` samples ``{"image": uint8 array of
shape, "label": int}`` in shards of ``per_shard`` with squirrel-core's
``SquirrelStore(url, serializer=MessagepackSerializer()).set(shard,
key=...)``, so the files are real Squirrel stores (``shard_00000.gz`` ..;
gzip'd MessagePack, arrays by msgpack_numpy). The default is the Squirrel +
DALI tutorial's Imagenette-like store: 10,000 samples of (3, 300, 300) in
shards of 1,000. Images are smooth seeded noise (real images compress;
pure noise would not). Reusable like the other generators.
"""
from __future__ import annotations

import os

import numpy as np

from fastread.datasets._shared import MARKER_NAME, DatasetInfo, reuse_marked, check_int, write_json

__all__ = ["make_squirrel"]

_VERSION = 1


def _image(rng, shape):
    c, h, w = shape
    small = rng.integers(0, 256, size=(c, max(1, h // 10), max(1, w // 10)), dtype=np.uint8)
    img = np.repeat(np.repeat(small, -(-h // small.shape[1]), axis=1), -(-w // small.shape[2]),
                    axis=2)[:, :h, :w]
    return np.ascontiguousarray(img + rng.integers(0, 8, size=shape, dtype=np.uint8))


def _write_shard(root, s, n, shape, classes, seed):
    """Shard ``s`` of the store: its own seeded draws, so shards can be
    written in any order, by any process."""
    from squirrel.serialization import MessagepackSerializer
    from squirrel.store import SquirrelStore

    rng = np.random.default_rng([seed, 0x5A1, s])
    shard = [{"image": _image(rng, shape), "label": int(rng.integers(0, classes))}
             for _ in range(n)]
    SquirrelStore(root, serializer=MessagepackSerializer()).set(shard, key=f"shard_{s:05d}")


def make_squirrel(root, *, samples=10_000, per_shard=1000, shape=(3, 300, 300), classes=10,
                  seed=0, progress=False, workers=None) -> DatasetInfo:
    """Writes (or reuses) a squirrel MessagePack store under ``root`` with
    squirrel-core's writer (``pip install squirrel-core``). ``workers``
    processes write shards in parallel (default: one per CPU, at most one
    per shard): squirrel-core's gzip'd writer takes ~18 s a shard of 1,000
    (3, 300, 300) samples on one core."""
    import concurrent.futures

    from squirrel.store import SquirrelStore  # noqa: F401 (fail early, with the real import error)

    root = os.path.abspath(os.fspath(root))
    samples = check_int("samples", samples, 1)
    per_shard = check_int("per_shard", per_shard, 1)
    shape = tuple(int(d) for d in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be (C, H, W) of positive ints, got {shape!r}")
    params = {"format": "squirrel", "version": _VERSION, "samples": samples,
              "per_shard": per_shard, "shape": list(shape), "classes": int(classes),
              "seed": int(seed)}
    marker = os.path.join(root, MARKER_NAME)
    done = reuse_marked(root, params, stale=lambda name: name.endswith(".gz"))
    if done is not None:
        return done
    nshards = -(-samples // per_shard)
    workers = min(nshards, os.cpu_count() or 1) if workers is None else \
        check_int("workers", workers, 1)
    os.makedirs(root, exist_ok=True)
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=nshards, unit="shard", desc="squirrel")
        except ImportError:
            pass
    jobs = [(root, s, min(per_shard, samples - s * per_shard), shape, int(classes), int(seed))
            for s in range(nshards)]
    if workers == 1:
        for job in jobs:
            _write_shard(*job)
            if bar is not None:
                bar.update(1)
    else:
        with concurrent.futures.ProcessPoolExecutor(workers) as pool:
            for done_shard in concurrent.futures.as_completed(
                    [pool.submit(_write_shard, *job) for job in jobs]):
                done_shard.result()  # a shard that failed raises here
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    total = sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root)
                if n.endswith(".gz"))
    info = DatasetInfo(root=root, classes=int(classes), per_class=0, files=samples,
                       total_bytes=total, mean_bytes=total / samples)
    write_json(marker, {"params": params, "info": info.__dict__})
    return info
