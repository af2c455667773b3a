"""Baselines for bench_gather_gpu's table (run on the GPU machine): numpy
memmap fancy indexing (what users write today) warm and cold, and CuPy's
arr[ids] on an array already in HBM. Same file layout and id distribution
as bench_gather_gpu (200k rows x 512 B after a 4096-byte header)."""
import os
import sys
import time

import numpy as np

path = sys.argv[1]
ROWS, ROW, OFF = 200000, 512, 4096
rng = np.random.default_rng(1)


def mm():
    return np.memmap(path, dtype=np.uint8, mode="r", offset=OFF, shape=(ROWS, ROW))


def drop():
    # Pages mapped by a live memmap are not dropped: callers hold none.
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


for n in (100_000, 1_000_000):
    ids = rng.integers(0, ROWS, n)
    m = mm()
    np.asarray(m[ids])  # warm
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.asarray(m[ids])
        ts.append(time.perf_counter() - t0)
    del m
    t = sorted(ts)[2]
    print(f"memmap warm, {n} ids: {t*1e3:.2f} ms, {n/t/1e6:.2f} M rows/s", flush=True)
    ts = []
    for _ in range(3):
        drop()
        m = mm()
        t0 = time.perf_counter()
        np.asarray(m[ids])
        ts.append(time.perf_counter() - t0)
        del m
    t = sorted(ts)[1]
    print(f"memmap cold, {n} ids: {t*1e3:.2f} ms, {n/t/1e6:.3f} M rows/s", flush=True)
try:
    import cupy as cp

    a = cp.asarray(np.asarray(mm()))
    ids = cp.asarray(rng.integers(0, ROWS, 1_000_000))
    a[ids]
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(9):
        s.record()
        a[ids]
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e-3)
    t = sorted(ts)[4]
    print(f"cupy arr[ids] in HBM, 1M ids: {t*1e3:.3f} ms, {1e6/t/1e6:.0f} M rows/s", flush=True)
except Exception as exc:  # noqa: BLE001 - a baseline only
    print(f"cupy baseline skipped: {exc}")
