"""JPEG trees: an ImageNet-like dataset of real JPEG files.

``make_imagenet_like`` writes an ImageNet-style tree of real JPEG files::

    root/
      .fastread-dataset.json          # written last; parameters + summary
      n10000000/
        n10000000_0.JPEG
        n10000000_1.JPEG
        ...
      n10000001/
        ...

The images are baseline (non-progressive) YCbCr 4:2:0 JPEGs -- the format
most of ImageNet uses and the one nvJPEG / DALI decode on the GPU fast path.
Each picture is a smooth colour field (a bicubic-upsampled grid of class-tinted
colours), a handful of flat-coloured shapes, and a seeded, spatially varying
amount of grain/texture.  Image sizes vary around ``width`` x ``height``
(about half are exactly that size, about one in five are portrait), and the
per-image texture amplitude and JPEG quality vary, so file sizes spread the way
a real dataset's do.  The global texture amplitude is calibrated on a
deterministic pilot sample so that the mean file size lands near ``mean_kb``.

The calibration has one knob (grain amplitude), so the reachable mean is
bounded: about 17-170 KB at 500x375 (it scales roughly with pixel count); a
target outside the range gives the nearest reachable mean and a
``RuntimeWarning``.  Within range the mean lands within a few percent of the
target (pilot of up to 256 images, 1.5% tolerance).

Everything is deterministic for a given ``seed`` (and generator version): each
image's random stream is seeded from ``(seed, class, index)``, the calibration
uses a fixed pilot sample, and Pillow's JPEG encoder is deterministic, so the
same parameters give byte-identical files regardless of ``workers`` -- on the
same software stack (other NumPy / Pillow / libjpeg-turbo / BLAS builds may
produce slightly different bytes).

See :mod:`fastread.datasets` for reuse and resumption.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
import warnings

import numpy as np

from fastread.datasets._shared import (
    GENERATOR_VERSION, KB, PARTIAL_NAME, DatasetInfo, check_int, check_workers, split_chunks,
    class_dir_name, atomic_write, finish, make_pool, prepare_root, run_chunks, try_reuse,
    write_json,
)

__all__ = ["make_imagenet_like"]

# JPEG quality range sampled per image (inclusive bounds).
_Q_LO, _Q_HI = 85, 95

# Bounds and starting point of the calibrated texture amplitude (pixel std).
_AMP_MIN, _AMP_MAX, _AMP_GUESS = 0.05, 300.0, 35.0

# Pilot sample for the size calibration: all images of small datasets, else
# an evenly spread n/8 (at least 64, at most 256) -- ~2% standard error.
_PILOT_MIN, _PILOT_MAX = 64, 256


def make_imagenet_like(
    root: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: int = 100,
    seed: int = 0,
    mean_kb: float = 92,
    width: int = 500,
    height: int = 375,
    workers: int | None = None,
    progress: bool = True,
) -> DatasetInfo:
    """Generate (or reuse) a synthetic ImageNet-like tree of JPEG files.

    Writes ``classes * per_class`` baseline 4:2:0 JPEGs to
    ``root/<class_dir>/<class_dir>_<j>.JPEG`` with mean file size close to
    ``mean_kb`` (1 KB = 1000 bytes) and returns a :class:`DatasetInfo`.
    Generation runs in ``workers`` processes (default ``os.cpu_count()``).
    If ``root`` already holds a complete dataset with the same parameters it
    is returned immediately.  ``root`` must be absent, empty, or a directory
    previously written by this module.
    """
    classes = check_int("classes", classes, 1)
    per_class = check_int("per_class", per_class, 1)
    seed = check_int("seed", seed, 0)
    width = check_int("width", width, 16, 16384)
    height = check_int("height", height, 16, 16384)
    workers = check_workers(workers)
    if (
        isinstance(mean_kb, bool)
        or not isinstance(mean_kb, (int, float, np.integer, np.floating))
        or not math.isfinite(mean_kb)
        or mean_kb <= 0
    ):
        raise ValueError(f"mean_kb must be a positive finite number, got {mean_kb!r}")
    mean_kb = float(mean_kb)
    if classes > 89_999_999:
        raise ValueError(f"classes must be <= 89999999, got {classes}")

    root = os.path.abspath(os.fspath(root))
    params = {
        "kind": "imagenet_like",
        "version": GENERATOR_VERSION,
        "classes": classes,
        "per_class": per_class,
        "seed": seed,
        "mean_kb": mean_kb,
        "width": width,
        "height": height,
    }
    reused = try_reuse(root, params, ".JPEG")
    if reused is not None:
        return reused
    prev = prepare_root(root, params)

    n = classes * per_class
    t0 = time.perf_counter()
    pool = None
    nworkers = min(workers, max(1, n // 16))
    if nworkers > 1:
        pool = make_pool(nworkers)
    try:
        bank = _bank_size(width, height)
        amp = prev.get("amplitude") if prev else None
        if not isinstance(amp, float):
            amp = _calibrate(pool, nworkers, seed, width, height, bank, classes, per_class, mean_kb)
        write_json(os.path.join(root, PARTIAL_NAME), {"params": params, "amplitude": amp})
        cfg = (seed, width, height, bank, amp)
        for c in range(classes):
            os.makedirs(os.path.join(root, class_dir_name(c)), exist_ok=True)
        items = [(c, j) for c in range(classes) for j in range(per_class)]
        sizes = run_chunks(pool, nworkers, _jpeg_chunk, (cfg, root), items, progress, "images")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    elapsed = time.perf_counter() - t0

    info = finish(root, params, classes, per_class, sizes, ext=".JPEG",
                  extra={"amplitude": amp})
    if progress:
        arr = np.asarray(sizes, dtype=np.float64)
        dev = 100.0 * (arr.mean() / (mean_kb * KB) - 1.0)
        print(
            f"fastread.datasets: {n} JPEGs in {root}: mean {arr.mean() / KB:.1f} KB "
            f"(target {mean_kb:g} KB, {dev:+.1f}%), sd {arr.std() / KB:.1f} KB, "
            f"p5/p50/p95 {np.percentile(arr, 5) / KB:.0f}/{np.percentile(arr, 50) / KB:.0f}/"
            f"{np.percentile(arr, 95) / KB:.0f} KB, {elapsed:.1f} s "
            f"({n / max(elapsed, 1e-9):.0f} img/s, {nworkers} worker(s))",
            file=sys.stderr,
        )
    dev = info.mean_bytes / (mean_kb * KB) - 1.0
    if abs(dev) > 0.15:
        warnings.warn(
            f"make_imagenet_like: mean file size {info.mean_bytes / KB:.1f} KB is "
            f"{100 * dev:+.0f}% off the {mean_kb:g} KB target (outside the reachable "
            f"range for {width}x{height} images?)",
            RuntimeWarning,
            stacklevel=2,
        )
    return info


_BANK_CACHE: dict = {}


def _bank_size(width: int, height: int) -> int:
    """Side of the square texture bank: 1024 (or 2048 for big images).

    Windows larger than the bank wrap around (see ``_bank_window``).
    """
    longest = math.ceil(max(width, height) * 1.3) + 2
    return 1024 if longest + 256 <= 1024 else 2048


def _bank_window(bank: np.ndarray, y0: int, x0: int, h: int, w: int) -> np.ndarray:
    size = bank.shape[0]
    if y0 + h <= size and x0 + w <= size:
        return bank[y0 : y0 + h, x0 : x0 + w]  # a view
    rows = np.arange(y0, y0 + h) % size
    cols = np.arange(x0, x0 + w) % size
    return bank[rows[:, None], cols[None, :]]


def _noise_bank(seed: int, size: int) -> np.ndarray:
    """A seeded size x size float32 texture field, unit std.

    Mix of white noise (fine grain) and box-blurred noise (softer texture);
    each image crops a random window of it, so per-image cost is a view.
    """
    key = (seed, size)
    bank = _BANK_CACHE.get(key)
    if bank is None:
        rng = np.random.default_rng([seed, 0x7E87])
        white = rng.standard_normal((size, size), dtype=np.float32)
        soft = white
        for _ in range(2):
            soft = (soft + np.roll(soft, 1, 0) + np.roll(soft, -1, 0)) * np.float32(1 / 3)
            soft = (soft + np.roll(soft, 1, 1) + np.roll(soft, -1, 1)) * np.float32(1 / 3)
        soft /= soft.std()
        bank = np.float32(0.6) * white + np.float32(0.8) * soft
        bank /= bank.std()
        bank = np.ascontiguousarray(bank, dtype=np.float32)
        _BANK_CACHE.clear()
        _BANK_CACHE[key] = bank
    return bank


def _palette(seed: int, c: int) -> np.ndarray:
    """Three base RGB colours characteristic of class c."""
    rng = np.random.default_rng([seed, c, 0x9A1E77E])
    return rng.uniform(20, 235, size=(3, 3))


def _dims(rng: np.random.Generator, width: int, height: int) -> tuple[int, int]:
    if rng.random() < 0.5:
        w, h = width, height
    else:
        s = float(np.clip(np.exp(rng.normal(0.0, 0.12)), 0.7, 1.3))
        a = float(np.clip(np.exp(rng.normal(0.0, 0.10)), 0.8, 1.25))
        w = max(16, int(round(width * s)))
        h = max(16, int(round(height * s * a)))
    if rng.random() < 0.2:
        w, h = h, w
    return w, h


def _smooth_weights(n: int, knots: int, rng: np.random.Generator) -> np.ndarray:
    """(n, knots) float32 weights that interpolate `knots` values smoothly over n pixels."""
    t = np.linspace(0.0, knots - 1.0, n, dtype=np.float32)
    t += np.float32(rng.uniform(-0.3, 0.3))
    d = t[:, None] - np.arange(knots, dtype=np.float32)[None, :]
    w = np.exp(np.float32(-0.5 / 0.6**2) * d * d)
    w /= w.sum(axis=1, keepdims=True)
    return w


def _matmul_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b computed in row blocks small enough that OpenBLAS stays single-threaded.

    Worker processes each own a core; a multi-threaded GEMM here would
    oversubscribe the CPUs (measured: 2.5x slower overall on 2 cores).
    """
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), dtype=np.result_type(a, b))
    rows = max(1, 200_000 // max(1, n * k))
    for i in range(0, m, rows):
        np.matmul(a[i : i + rows], b, out=out[i : i + rows])
    return out


def _render(cfg, c: int, j: int, amp: float) -> bytes:
    """Encode image (c, j) with global texture amplitude amp; returns JPEG bytes."""
    from PIL import Image, ImageDraw

    seed, width, height, bank_size, _ = cfg
    rng = np.random.default_rng([seed, c, j])
    w, h = _dims(rng, width, height)
    pal = _palette(seed, c)

    # Smooth colour field: a small grid of jittered palette colours,
    # interpolated separably (Wy @ grid @ Wx^T, planar per channel; PIL merges
    # the planes -- much cheaper than an image resize).
    gh, gw = (int(v) for v in rng.integers(2, 6, size=2))
    grid = pal[rng.integers(0, 3, size=(gh, gw))] + rng.normal(0, 30, size=(gh, gw, 3))
    grid = np.clip(grid, 0, 255).astype(np.float32).transpose(2, 0, 1)  # (3, gh, gw)
    wy = _smooth_weights(h, gh, rng)
    wx = _smooth_weights(w, gw, rng)
    field = _matmul_rows((wy @ grid).reshape(3 * h, gw), wx.T)  # (3 * h, w)
    np.clip(field, 0, 255, out=field)
    planes = field.astype(np.uint8)
    img = Image.merge("RGB", [Image.fromarray(planes[k * h : (k + 1) * h]) for k in range(3)])

    # Flat shapes (objects), mostly palette-coloured.
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 13))):
        kind = rng.random()
        if rng.random() < 0.7:
            col = pal[rng.integers(0, 3)] + rng.normal(0, 40, size=3)
        else:
            col = rng.uniform(0, 255, size=3)
        fill = tuple(int(v) for v in np.clip(col, 0, 255))
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.03, 0.3) * w, rng.uniform(0.03, 0.3) * h
        box = [cx - rx, cy - ry, cx + rx, cy + ry]
        if kind < 0.4:
            draw.ellipse(box, fill=fill)
        elif kind < 0.65:
            draw.rectangle(box, fill=fill)
        elif kind < 0.9:
            k = int(rng.integers(3, 7))
            ang = np.sort(rng.uniform(0, 2 * np.pi, size=k))
            rad = rng.uniform(0.4, 1.0, size=k)
            pts = [(float(cx + rx * r * np.cos(t)), float(cy + ry * r * np.sin(t))) for t, r in zip(ang, rad)]
            draw.polygon(pts, fill=fill)
        else:
            x2, y2 = rng.uniform(0, w), rng.uniform(0, h)
            draw.line([(cx, cy), (x2, y2)], fill=fill, width=int(rng.integers(2, 12)))

    # Texture (luma grain): a window of the bank, modulated by a smooth
    # per-region gain map (flat "sky" areas next to busy "foliage").
    complexity = float(np.exp(rng.normal(0.0, 0.35)))
    mh, mw = (int(v) for v in rng.integers(2, 6, size=2))
    gain = rng.uniform(0.05, 1.0, size=(mh, mw)).astype(np.float32)
    gain = _matmul_rows(_smooth_weights(h, mh, rng) @ gain, _smooth_weights(w, mw, rng).T)  # (h, w)
    y0 = int(rng.integers(0, max(1, bank_size - h + 1)))
    x0 = int(rng.integers(0, max(1, bank_size - w + 1)))
    tex = _bank_window(_noise_bank(seed, bank_size), y0, x0, h, w)
    if rng.random() < 0.5:
        tex = tex[:, ::-1]
    quality = int(rng.integers(_Q_LO, _Q_HI + 1))

    gain *= np.float32(amp * complexity)
    gain *= tex
    # Add the grain to each channel plane (same grain in R, G, B: luma
    # texture); planar contiguous ops are ~2x faster than broadcasting over
    # an interleaved (h, w, 3) array.
    px = np.empty((3, h, w), dtype=np.float32)
    for k, plane in enumerate(img.split()):
        px[k] = np.asarray(plane)
    px += gain
    np.clip(px, 0, 255, out=px)
    planes = px.astype(np.uint8)
    out = Image.merge("RGB", [Image.fromarray(planes[k]) for k in range(3)])

    buf = io.BytesIO()
    # Baseline (non-progressive) JPEG, YCbCr 4:2:0, standard Huffman tables.
    out.save(buf, format="JPEG", quality=quality, subsampling=2, progressive=False, optimize=False)
    return buf.getvalue()


def _jpeg_chunk(cfg, root: str | None, items) -> list[int]:
    """Worker: render items [(c, j), ...]; write them under root (None: dry run)."""
    amp = cfg[4]
    sizes = []
    pid = os.getpid()
    for c, j in items:
        if root is None:
            sizes.append(len(_render(cfg, c, j, amp)))
            continue
        d = os.path.join(root, class_dir_name(c))
        name = f"{class_dir_name(c)}_{j}.JPEG"
        path = os.path.join(d, name)
        try:
            sizes.append(os.stat(path).st_size)  # written by an interrupted earlier run
            continue
        except FileNotFoundError:
            pass
        data = _render(cfg, c, j, amp)
        atomic_write(os.path.join(d, f".{name}.{pid}.tmp"), path, data)
        sizes.append(len(data))
    return sizes


def _calibrate(pool, nworkers, seed, width, height, bank, classes, per_class, mean_kb) -> float:
    """Find the texture amplitude giving mean size ~mean_kb on a pilot sample.

    The pilot is a fixed, evenly spread subset of the dataset's own images, so
    the result is deterministic and representative.  Solves
    log(mean_size) = log(target) in log(amplitude) by safeguarded secant.
    """
    n = classes * per_class
    k = min(n, max(_PILOT_MIN, min(_PILOT_MAX, n // 8)))
    idx = sorted({i * n // k for i in range(k)})
    pilot = [(i // per_class, i % per_class) for i in idx]
    target = mean_kb * KB

    def f(amp: float) -> float:
        cfg = (seed, width, height, bank, amp)
        if pool is None:
            sizes = _jpeg_chunk(cfg, None, pilot)
        else:
            parts = split_chunks(pilot, -(-len(pilot) // nworkers))
            sizes = [s for r in pool.map(_jpeg_chunk, [cfg] * len(parts), [None] * len(parts), parts) for s in r]
        return math.log(sum(sizes) / len(sizes) / target)

    tol = math.log(1.015)
    lo_x, hi_x = math.log(_AMP_MIN), math.log(_AMP_MAX)
    x0 = math.log(_AMP_GUESS)
    f0 = f(math.exp(x0))
    if abs(f0) < tol:
        return math.exp(x0)
    # Bracket: lo has f < 0 (too small), hi has f > 0 (too big).
    blo = bhi = None
    if f0 < 0:
        blo = (x0, f0)
    else:
        bhi = (x0, f0)
    x1 = min(hi_x, max(lo_x, x0 - f0 / 0.5))  # typical d log(size) / d log(amp)
    best = (abs(f0), x0)
    for _ in range(10):
        f1 = f(math.exp(x1))
        best = min(best, (abs(f1), x1))
        if abs(f1) < tol:
            return math.exp(x1)
        if f1 < 0:
            blo = (x1, f1) if blo is None or x1 > blo[0] else blo
        else:
            bhi = (x1, f1) if bhi is None or x1 < bhi[0] else bhi
        if f1 < 0 and x1 >= hi_x - 1e-9 or f1 > 0 and x1 <= lo_x + 1e-9:
            break  # target out of reach; use the bound
        slope = (f1 - f0) / (x1 - x0) if x1 != x0 else 0.6
        if not slope > 0.05:
            slope = 0.6
        x2 = x1 - f1 / slope
        lo_b = blo[0] if blo else lo_x
        hi_b = bhi[0] if bhi else hi_x
        if not (lo_b < x2 < hi_b):
            x2 = (lo_b + hi_b) / 2 if blo and bhi else min(hi_x, max(lo_x, x2))
        x0, f0, x1 = x1, f1, x2
    return math.exp(best[1])
