"""Decoding once, at pack time: the preprocessing of ``fastread pack
--decode`` (:func:`fastread.pack` with ``decode=True``).

Each source image is decoded with Pillow, turned upright by its EXIF
orientation, converted to RGB, resized and
optionally center-cropped (:class:`Preprocess`), then stored as raw uint8
HWC pixels or re-encoded as JPEG. The work runs in a process pool (Pillow's
decoders hold the GIL for part of their work, so threads would not use all
cores) over chunks of paths, at most a few chunks per process in flight, so
memory stays bounded whatever the data set's size.

:func:`preprocess_file` is the one code path for a sample: the pool runs it,
and tests compare against it (exact) and against a plain Pillow reference
(within a tolerance).
"""
import collections
import io
import os

import numpy as np

__all__ = ["Preprocess", "preprocess_file", "preprocess_image", "decoded_batches"]

ENCODINGS = ("raw", "jpeg")


class Preprocess:
    """What decoding at pack time does to every image.

    ``resize``: the shorter side becomes ``resize`` pixels (aspect kept; up-
    or downscaled, as torchvision's ``Resize(S)``). ``max_side``: instead,
    images whose longer side exceeds ``max_side`` shrink so that it equals
    it (aspect kept; never enlarged, as FFCV's ``max_resolution``). One of
    the two, or neither (pixels at the source resolution). ``crop``: then a
    center crop of ``crop`` x ``crop`` (needs ``resize >= crop``: every
    image is then at least that large). ``encode``: ``"raw"`` (uint8 HWC,
    no decoder needed to read) or ``"jpeg"`` at ``quality``. Resampling is
    Pillow's antialiased bilinear filter (what torchvision's ``Resize``
    does on PIL images)."""

    def __init__(self, resize=None, max_side=None, crop=None, encode="raw", quality=90):
        for name, v in (("resize", resize), ("max_side", max_side), ("crop", crop)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
        if resize is not None and max_side is not None:
            raise ValueError("resize and max_side exclude each other: choose the shorter side "
                             "(resize) or a bound on the longer one (max_side)")
        if crop is not None and (resize is None or resize < crop):
            raise ValueError(f"crop={crop} needs resize >= crop (every image's shorter side "
                             f"at least the crop), got resize={resize!r}")
        if encode not in ENCODINGS:
            raise ValueError(f"encode must be one of {', '.join(ENCODINGS)}, got {encode!r}")
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ValueError(f"quality must be an integer in 1..100, got {quality!r}")
        self.resize, self.max_side, self.crop = resize, max_side, crop
        self.encode, self.quality = encode, quality

    def as_dict(self):
        """What the index records (``preprocess``)."""
        d = {"resize": self.resize, "max_side": self.max_side, "crop": self.crop,
             "encode": self.encode, "resample": "bilinear", "mode": "RGB"}
        if self.encode == "jpeg":
            d["quality"] = self.quality
        return d

    def target_size(self, w, h):
        """(width, height) after the resize step, for a w x h source. The
        other side is truncated, as torchvision's ``Resize(S)`` and FFCV's
        ``max_resolution`` compute it."""
        if self.resize is not None:
            s = self.resize
            if w <= h:
                return s, max(1, int(s * h / w))
            return max(1, int(s * w / h)), s
        if self.max_side is not None and max(w, h) > self.max_side:
            m = self.max_side
            if w >= h:
                return m, max(1, int(m * h / w))
            return max(1, int(m * w / h)), m
        return w, h


def preprocess_image(img, pre):
    """A decoded PIL image through ``pre``: an RGB PIL image."""
    from PIL import Image

    img = img.convert("RGB")
    size = pre.target_size(*img.size)
    if size != img.size:
        img = img.resize(size, Image.BILINEAR)
    if pre.crop is not None:
        c = pre.crop
        w, h = img.size
        left, top = int(round((w - c) / 2.0)), int(round((h - c) / 2.0))
        img = img.crop((left, top, left + c, top + c))
    return img


def preprocess_file(path, pre):
    """``(payload bytes, (H, W, C))`` for one source image; raises what
    Pillow raises for a file it cannot decode (OSError, ValueError, ...)."""
    from PIL import Image, ImageOps

    with Image.open(path) as src:
        src.load()   # decode now: a truncated or corrupt file fails here, not later
        # EXIF orientation applied, as DALI's decoders do by default
        # (adjust_orientation=True): the pixels the image shows.
        img = preprocess_image(ImageOps.exif_transpose(src), pre)
    shape = (img.size[1], img.size[0], 3)
    if pre.encode == "raw":
        return np.asarray(img, dtype=np.uint8).tobytes(), shape
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=pre.quality)
    return buf.getvalue(), shape


def _work(paths, pre):
    """A chunk in a pool process: per path ``(bytes, shape, None)`` or
    ``(None, None, why)``. Errors are per sample, never the chunk's."""
    from PIL import Image

    out = []
    for p in paths:
        try:
            data, shape = preprocess_file(p, pre)
            out.append((data, shape, None))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
                MemoryError) as e:   # Pillow's ways of refusing a file
            out.append((None, None, f"{type(e).__name__}: {e}"))
    return out


def decoded_batches(paths, pre, *, workers=None, chunk=16):
    """Yields, in ``paths`` order, one list per chunk of ``(bytes, shape,
    why)`` (``why`` is None, or why the file could not be decoded).
    ``workers`` processes (default: every CPU this process may use); at most
    ``2 * workers`` chunks are in flight, so memory is bounded by that many
    chunks of preprocessed images. ``workers=0`` runs in this process (for
    small sets and debugging)."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
    chunks = (paths[i:i + chunk] for i in range(0, len(paths), chunk))
    if workers == 0:
        for c in chunks:
            yield _work(c, pre)
        return
    from fastread.datasets._shared import make_pool

    # fork where this process runs no other thread (scripts need no
    # __main__ guard), else a forkserver: the datasets' one rule for pools.
    with make_pool(workers) as pool:
        pending = collections.deque()
        try:
            for c in chunks:
                pending.append(pool.submit(_work, c, pre))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
