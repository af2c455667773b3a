"""Decoding once, at pack time: the preprocessing of ``fastread pack
--decode`` (:func:`fastread.pack` with ``decode=True``).

Two decoders do it, with one meaning (:class:`Preprocess`):
:func:`choose_decoder` is the one place that picks between them. Pillow
(here) on the CPU with all cores; or DALI's ``fn.decoders.image``
(nvImageCodec), on the GPU where one is present (:mod:`fastread.decode_dali`).

With Pillow, each source image is decoded, turned upright by its EXIF
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
import itertools
import os
from typing import NamedTuple

import numpy as np

from fastread._safe_open import open_file

__all__ = ["DecoderChoice", "Preprocess", "choose_decoder", "preprocess_file",
           "preprocess_image", "to_rgb", "decoded_batches"]

ENCODINGS = ("raw", "jpeg")

#: ``pack(decoder=...)`` / ``--decoder``.
DECODERS = ("auto", "pillow", "dali")
#: ``pack(decode_device=...)`` / ``--decode-device`` (None: the decoder's own choice).
DECODE_DEVICES = ("cpu", "gpu")


class DecoderChoice(NamedTuple):
    """``name`` "pillow" or "dali", ``device`` "cpu" or "gpu", ``why`` a
    sentence saying why this decoder (printed by ``fastread pack`` and
    recorded in the index)."""
    name: str
    device: str
    why: str

    @property
    def label(self):
        """What the index's ``preprocess["decoder"]`` says: "pillow",
        "dali-cpu" or "dali-mixed" (DALI's name for decoding on the GPU from
        host bytes)."""
        if self.name == "pillow":
            return "pillow"
        return "dali-mixed" if self.device == "gpu" else "dali-cpu"


def _dali_gpus():
    """(DALI's module or None, number of CUDA devices DALI sees, why not)."""
    try:
        import nvidia.dali.backend as backend
    except ImportError as e:
        return None, 0, f"DALI is not installed ({e})"
    except Exception as e:   # installed but broken (a missing library): Pillow still works
        return None, 0, f"DALI does not import ({type(e).__name__}: {e})"
    try:
        n = int(backend.GetCUDADeviceCount())
    except Exception as e:   # no driver, or a broken one: DALI says why
        return backend, 0, f"DALI sees no CUDA GPU ({str(e).strip().splitlines()[0]})"
    return backend, n, None if n > 0 else "DALI sees no CUDA GPU"


#: Whether ``decoder="auto"`` packs with DALI on the GPU where DALI sees
#: one (else Pillow, the reference). The rule: True only once, on a GPU
#: machine, DALI's GPU path is right (tests/test_pack_dali.py's GPU cases
#: pass) and faster than Pillow on all that machine's cores (``bash
#: bench/gpu.sh pack-decoders`` prints both as its verdict). Not measured yet
#: on a GPU with this pipeline: False.
AUTO_USES_DALI_GPU = False


def choose_decoder(decoder="auto", device=None):
    """The decoder of a decoded pack, as a :class:`DecoderChoice`.

    ``decoder``: "pillow", "dali" or "auto"; ``device``: "cpu", "gpu" or
    None. "auto" is Pillow (the reference, and it decodes every format Pillow
    knows), or DALI on the GPU with ``device="gpu"``, or where a GPU is
    present once :data:`AUTO_USES_DALI_GPU` says so (measured there). "dali" without ``device``: the GPU
    where there is one, else DALI's CPU decoder. Combinations that cannot
    run raise ValueError naming the option."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if device is not None and device not in DECODE_DEVICES:
        raise ValueError(f"decode_device must be one of {', '.join(DECODE_DEVICES)} or None, "
                         f"got {device!r}")
    if decoder == "pillow":
        if device == "gpu":
            raise ValueError("decode_device='gpu' (--decode-device gpu) needs decoder='dali' "
                             "or 'auto': Pillow decodes on the CPU only")
        return DecoderChoice("pillow", "cpu", "asked for: decoder='pillow'")
    if decoder == "auto" and device == "cpu":
        # Not DALI's CPU decoder: no faster on 2 CPUs
        # (bench/decoded/pack_decoders.py), and Pillow is the reference.
        return DecoderChoice("pillow", "cpu", "auto on the CPU: Pillow, the reference "
                             "decoder, with a process per CPU")
    if decoder == "auto" and device is None:
        # A default must be a measured one (AUTO_USES_DALI_GPU).
        if AUTO_USES_DALI_GPU:
            backend, gpus, why_not = _dali_gpus()
            if gpus:
                return DecoderChoice("dali", "gpu", "auto: DALI on the GPU, measured right and "
                                     "faster than Pillow on all CPUs (a CUDA GPU is present)")
            return DecoderChoice("pillow", "cpu", f"auto: Pillow, with a process per CPU "
                                 f"({why_not})")
        return DecoderChoice("pillow", "cpu", "auto: Pillow, the reference decoder, with a "
                             "process per CPU (decoder='dali' decodes with DALI, on the GPU "
                             "where one is present)")
    backend, gpus, why_not = _dali_gpus()
    asked = f"decoder={decoder!r}" + (f", decode_device={device!r}" if device else "")
    if backend is None:
        raise ValueError(f"{asked} (--decoder {decoder}) needs NVIDIA DALI: {why_not}; "
                         "install nvidia-dali-cuda120 (or -cuda130), or use decoder='pillow'")
    if device == "gpu" and not gpus:
        raise ValueError(f"decode_device='gpu' (--decode-device gpu): {why_not}; use "
                         "decode_device='cpu' or decoder='pillow'")
    if device is None:
        device = "gpu" if gpus else "cpu"
        return DecoderChoice("dali", device, f"asked for: decoder={decoder!r}; "
                             + ("a CUDA GPU is present" if gpus else f"{why_not}, so its CPU "
                                "decoder"))
    return DecoderChoice("dali", device, f"asked for: {asked}")


def crop_box(w, h, crop):
    """``(left, top)`` of the center ``crop`` x ``crop`` window of a w x h
    image: torchvision's ``CenterCrop`` anchors, the one rule both decoders
    use."""
    return int(round((w - crop) / 2.0)), int(round((h - crop) / 2.0))


def encode_pixels(pixels, pre):
    """Uint8 HWC RGB ``pixels`` (a NumPy array or a PIL image) as stored:
    the array itself for ``"raw"`` (any C-contiguous buffer), JPEG bytes at
    ``pre.quality`` (Pillow's encoder) for ``"jpeg"``."""
    from PIL import Image

    if pre.encode == "raw":
        return np.ascontiguousarray(pixels, dtype=np.uint8)
    img = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels, "RGB")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=pre.quality)
    return buf.getvalue()


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

    def as_dict(self, decoder=None):
        """What the index records (``preprocess``); with ``decoder`` (a
        :class:`DecoderChoice`), which decoder and why."""
        d = {"resize": self.resize, "max_side": self.max_side, "crop": self.crop,
             "encode": self.encode, "resample": "bilinear", "mode": "RGB"}
        if self.encode == "jpeg":
            d["quality"] = self.quality
        if decoder is not None:
            d["decoder"], d["decoder_why"] = decoder.label, decoder.why
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


def to_rgb(img):
    """A decoded PIL image as RGB, deep greyscale scaled rather than
    clipped. Pillow's ``convert("RGB")`` clips 16-bit greyscale (modes
    ``I;16*``, and ``I`` as older Pillow opens 16-bit PNGs) at 255, which
    stores a depth map or a medical scan almost all white; the 8-bit value
    is ``round(v / 257)``, as DALI's decoder gives. ``I`` outside 0..65535
    and float images (``F``) have no one 8-bit meaning: ValueError."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        v = np.asarray(img)
        if img.mode == "F" or (img.mode == "I" and v.size and (v.min() < 0 or v.max() > 65535)):
            raise ValueError(f"mode {img.mode} pixels (range {v.min()}..{v.max()}) have no "
                             "8-bit RGB meaning; convert the image to 8 or 16 bits first")
        img = Image.fromarray(np.rint(v.astype(np.float32) / 257.0).astype(np.uint8), "L")
    return img.convert("RGB")


def preprocess_image(img, pre):
    """A decoded PIL image through ``pre``: an RGB PIL image."""
    from PIL import Image

    img = to_rgb(img)
    size = pre.target_size(*img.size)
    if size != img.size:
        img = img.resize(size, Image.BILINEAR)
    if pre.crop is not None:
        c = pre.crop
        w, h = img.size
        left, top = crop_box(w, h, c)
        img = img.crop((left, top, left + c, top + c))
    return img


def preprocess_file(path, pre):
    """``(payload, (H, W, C))`` for one source image (``path``: a path or a
    binary file object); the payload is bytes-like. Raises what
    Pillow raises for a file it cannot decode (OSError, ValueError, ...)."""
    from PIL import Image, ImageOps

    if isinstance(path, (str, bytes, os.PathLike)):
        # Pillow's own open() of a FIFO waits for a writer: refused here, by name.
        with open_file(path) as f:
            return preprocess_file(f, pre)
    with Image.open(path) as src:
        src.load()   # decode now: a truncated or corrupt file fails here, not later
        # EXIF orientation applied, as DALI's decoders do by default
        # (adjust_orientation=True): the pixels the image shows.
        img = preprocess_image(ImageOps.exif_transpose(src), pre)
    shape = (img.size[1], img.size[0], 3)
    if pre.encode == "raw":
        return np.asarray(img, dtype=np.uint8).tobytes(), shape
    return encode_pixels(img, pre), shape


def preprocess_one(path, pre):
    """:func:`preprocess_file` with its errors as values: ``(payload, shape,
    None)`` or ``(None, None, why)``. Errors are per sample."""
    from PIL import Image

    if path is None:   # a row without bytes (a null Parquet value)
        return None, None, "no image bytes (a null value)"
    try:
        data, shape = preprocess_file(path, pre)
        return data, shape, None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
            MemoryError) as e:   # Pillow's ways of refusing a file
        return None, None, f"{type(e).__name__}: {e}"


def _work(paths, pre):
    """A chunk in a pool process: per path ``(bytes, shape, None)`` or
    ``(None, None, why)``. Errors are per sample, never the chunk's."""
    return [preprocess_one(p, pre) for p in paths]


def decoded_batches(paths, pre, *, workers=None, chunk=16):
    """Yields, in ``paths`` order (an iterable of paths, binary file
    objects, or None for a row without bytes), one list per chunk of
    ``(bytes, shape, why)`` (``why`` is None, or why the file could not be
    decoded).
    ``workers`` processes (default: every CPU this process may use); at most
    ``2 * workers`` chunks are in flight, so memory is bounded by that many
    chunks of preprocessed images. ``workers=0`` runs in this process (for
    small sets and debugging)."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
    # Any iterable, consumed lazily (rows of a Parquet data set come as
    # they are read: at most the chunks in flight are held).
    items = iter(paths)
    chunks = iter(lambda: list(itertools.islice(items, chunk)), [])
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
