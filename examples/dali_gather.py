"""Feature rows from storage inside a DALI pipeline: ids in, rows out on the GPU.

    python examples/dali_gather.py                    # a synthetic 1M x 128 table, GPU
    python examples/dali_gather.py --device cpu --rows 100000
    python examples/dali_gather.py --features feat.npy --batch-size 4096

The pipeline reads the training ids in shuffled batches, gathers their rows
through a FeatureStore (GPU-initiated reads with an HBM cache on a GPU), and
does some GPU work on them in DALI (here: a normalization); the DALI
iterator stops at each epoch's end. ``--check`` compares every batch with
NumPy.
"""
import argparse
import os
import tempfile
import time

import numpy as np
from nvidia.dali import fn, pipeline_def

from fastread.dali.gather import gather
from fastread.features import FeatureStore


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", help="an (N, F) .npy file (default: a synthetic one)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--workdir", default=tempfile.gettempdir())
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)

    path = args.features or os.path.join(args.workdir, f"dali-gather-{args.rows}x{args.dim}.npy")
    if not os.path.exists(path):
        a = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                      shape=(args.rows, args.dim))
        rng = np.random.default_rng(0)
        for lo in range(0, args.rows, 1 << 16):
            hi = min(args.rows, lo + (1 << 16))
            a[lo:hi] = rng.standard_normal((hi - lo, args.dim), dtype=np.float32)
        a.flush()
        del a
    gpu = args.device == "gpu"
    store = FeatureStore(path, device_id=0 if gpu else -1)
    train = np.arange(0, store.rows, 3)  # every third row is a training example
    print(f"{store}: backend {store.backend}; {len(train):,} training ids")

    @pipeline_def(batch_size=args.batch_size, num_threads=2, device_id=0 if gpu else None)
    def pipe():
        rows, ids = gather(store, train, device=args.device, random_shuffle=True, seed=0)
        return fn.normalize(rows, axes=[0]), rows, ids

    pl = pipe()
    pl.build()
    reference = np.load(path, mmap_mode="r") if args.check else None
    for epoch in range(args.epochs):
        n, t0 = 0, time.perf_counter()
        while True:
            try:
                normed, rows, ids = pl.run()
            except StopIteration:
                pl.reset()
                break
            n += len(ids)
            if reference is not None:
                r = rows.as_cpu() if gpu else rows
                i = (ids.as_cpu() if gpu else ids).as_array().reshape(-1)
                np.testing.assert_array_equal(r.as_array(), reference[i])
        dt = time.perf_counter() - t0
        print(f"epoch {epoch}: {n:,} rows in {dt:.2f} s ({n / dt / 1e6:.2f}M rows/s)")
    print(f"stats: {store.stats()}")
    del pl
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
