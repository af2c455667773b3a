""".npy trees: ``make_npy_dataset`` writes random ``.npy`` arrays of one shape and dtype in
the same layout (``n10000000/n10000000_0.npy`` ...), for raw-array
(non-decoding) benchmarks and ``readers.numpy``.

See :mod:`fastread.datasets` for reuse and resumption.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from fastread.datasets._shared import (
    GENERATOR_VERSION, DatasetInfo, check_int, check_workers, class_dir_name, finish,
    prepare_root, run_chunks, try_reuse,
)

__all__ = ["make_npy_dataset"]


def make_npy_dataset(
    root: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: int | None = None,
    count: int | None = None,
    shape: Sequence[int] | int | None = None,
    nbytes: int | None = None,
    dtype: str | np.dtype = "uint8",
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> DatasetInfo:
    """Generate (or reuse) a tree of random ``.npy`` arrays, all of one shape and dtype.

    Files go to ``root/<class_dir>/<class_dir>_<j>.npy`` (``n10000000_0.npy``
    ..., the JPEG generator's names), written with ``np.save`` (format 1.0, a
    128-byte header for ordinary shapes).  Give the number of files as

    - ``per_class``: ``classes * per_class`` files, ``per_class`` in each; or
    - ``count``: ``count`` files dealt round-robin over ``classes``
      directories, so class ``c`` holds ``count // classes`` files plus one
      more if ``c < count % classes``; ``DatasetInfo.per_class`` is the
      largest per-class count.

    The arrays' size is either ``shape`` (default ``(3, 224, 224)``; an int
    means a 1-D array) or ``nbytes``: the array *data* is exactly ``nbytes``
    bytes, a 1-D array of shape ``(nbytes // itemsize,)`` (``nbytes`` must
    be a multiple of the dtype's itemsize), so each file is ``nbytes`` plus
    the header (128 bytes).  The two spellings make identical files.

    Contents are seeded from ``(seed, class, index)``: uniform over the full
    range for integer dtypes, standard normal for floating dtypes, fair coin
    for bool; identical for any ``workers`` (threads writing files, default
    one per CPU).
    """
    classes = check_int("classes", classes, 1)
    seed = check_int("seed", seed, 0)
    workers = check_workers(workers)
    if (per_class is None) == (count is None):
        raise ValueError("give exactly one of per_class (files per class) and count (files in all)")
    if per_class is not None:
        count = classes * check_int("per_class", per_class, 1)
    count = check_int("count", count, 1)
    if classes > count:
        raise ValueError(f"classes must be <= count ({count}), got {classes}")
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"dtype {dtype!r} is not a numpy dtype: {e}") from None
    if not (dt.kind in "biuf" and not dt.hasobject):
        raise ValueError(f"dtype must be a bool, integer or float dtype, got {dt}")
    shape = _npy_shape(shape, nbytes, dt)

    root = os.path.abspath(os.fspath(root))
    # The same parameters as before per_class / nbytes existed, so that
    # datasets made either way are reused: they hold the same bytes.
    params = {
        "kind": "npy",
        "version": GENERATOR_VERSION,
        "count": count,
        "classes": classes,
        "shape": list(shape),
        "dtype": dt.str,
        "seed": seed,
    }
    counts = _npy_counts(count, classes)
    reused = try_reuse(root, params, ".npy", counts=counts)
    if reused is not None:
        return reused
    prepare_root(root, params)
    items = []
    for c, k in enumerate(counts):
        os.makedirs(os.path.join(root, class_dir_name(c)), exist_ok=True)
        items.extend((c, j) for j in range(k))
    t0 = time.perf_counter()
    # Threads, not processes: NumPy's generators and file writes release the
    # GIL, and nothing here needs fork's isolation.
    nworkers = min(workers, max(1, count // 16))
    pool = ThreadPoolExecutor(nworkers, thread_name_prefix="fastread-npy") if nworkers > 1 else None
    try:
        sizes = run_chunks(pool, nworkers, _npy_chunk, ((seed, shape, dt.str), root), items,
                            progress, "arrays")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    elapsed = time.perf_counter() - t0
    info = finish(root, params, classes, max(counts), sizes, ext=".npy", counts=counts)
    if progress:
        print(
            f"fastread.datasets: {count} arrays of shape {shape} {dt} in {root}: "
            f"{info.total_bytes / 1e9:.3f} GB, {elapsed:.1f} s "
            f"({info.total_bytes / 1e6 / max(elapsed, 1e-9):.0f} MB/s, {nworkers} thread(s))",
            file=sys.stderr,
        )
    return info


def _npy_shape(shape, nbytes, dt: np.dtype) -> tuple:
    """The array shape from make_npy_dataset's shape or nbytes."""
    if nbytes is not None:
        if shape is not None:
            raise ValueError("give shape or nbytes, not both")
        nbytes = check_int("nbytes", nbytes, 0)
        if nbytes % dt.itemsize:
            raise ValueError(f"nbytes ({nbytes}) must be a multiple of the itemsize of {dt} "
                             f"({dt.itemsize})")
        return (nbytes // dt.itemsize,)
    if shape is None:
        return (3, 224, 224)
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        shape = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in shape):
        raise ValueError(f"shape must contain non-negative ints, got {shape!r}")
    return tuple(int(s) for s in shape)


def _npy_counts(count: int, classes: int) -> list[int]:
    return [count // classes + (c < count % classes) for c in range(classes)]


def _npy_chunk(cfg, root: str, items) -> list[int]:
    seed, shape, dtstr = cfg
    dt = np.dtype(dtstr)
    sizes = []
    pid = os.getpid()
    for c, j in items:
        rng = np.random.default_rng([seed, c, j, 0x4E9])
        if dt.kind == "b":
            a = rng.random(shape) < 0.5
        elif dt.kind in "iu":
            # Generators draw native byte order only; swap afterwards (same values).
            info = np.iinfo(dt)
            a = rng.integers(info.min, info.max, size=shape, dtype=dt.newbyteorder("="), endpoint=True)
        else:
            a = rng.standard_normal(shape).astype(dt)
        a = np.ascontiguousarray(a, dtype=dt)
        d = os.path.join(root, class_dir_name(c))
        name = f"{class_dir_name(c)}_{j}.npy"
        path = os.path.join(d, name)
        tmp = os.path.join(d, f".{name}.{pid}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, a, allow_pickle=False)
        os.replace(tmp, path)
        sizes.append(os.path.getsize(path))
    return sizes
