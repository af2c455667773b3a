"""Training augmentation on the GPU for decoded packs: torchvision's
RandomResizedCrop, a horizontal flip and normalization, fused into one CUDA
kernel per batch (the C core's, compiled at run time with NVRTC: no torch,
CuPy or CUDA toolkit needed for it).

::

    from fastread.augment import Augmenter, crop_params

    boxes, flips = crop_params(indices, 160, 160, seed=0, epoch=3)
    Augmenter(0)(images, out, boxes, flips, mean=[123.7, 116.3, 103.5],
                 std=[58.4, 57.1, 57.4], stream=stream)

:func:`crop_params` draws each sample's crop and flip on the host from
(seed, epoch, the sample's index in the data set) alone: the same seed
gives the same crops whatever the batch size, the shards or the order.
:class:`fastread.torch.ImageLoader` (``image=`` a decoded pack) runs both
per batch on the batch the reader wrote to the GPU; docs/augment.md.
"""
import math
import os

import numpy as np

__all__ = ["Augmenter", "augment_host", "crop_params", "SCALE", "RATIO", "OUTPUT_DTYPES"]

#: torchvision's RandomResizedCrop defaults: area fraction and aspect ratio (w / h).
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
#: What the kernel writes: normalized floats, or the resampled pixels (uint8, not normalized).
OUTPUT_DTYPES = ("float32", "float16", "uint8")


def _pair(name, value):
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be two numbers (low, high), got {value!r}") from None
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {value!r}")
    return lo, hi


def check_crop(scale, ratio, flip):
    """``(scale, ratio, flip)`` checked: ValueError naming the option."""
    scale, ratio = _pair("scale", scale), _pair("ratio", ratio)
    if isinstance(flip, bool) or not isinstance(flip, (int, float)) or not 0 <= flip <= 1:
        raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
    return scale, ratio, float(flip)


def _uint(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    return int(v) & 0xFFFFFFFFFFFFFFFF


def crop_params(indices, height, width, *, seed=0, epoch=0, scale=SCALE, ratio=RATIO,
                flip=0.5):
    """The crop boxes and flips of the samples ``indices`` (their indices in
    the data set) for ``height`` x ``width`` images: ``boxes`` (n, 4) int32
    rows of (top, left, height, width), as torchvision's
    ``RandomResizedCrop.get_params`` draws them (10 tries of an area
    fraction uniform in ``scale`` and an aspect ratio log-uniform in
    ``ratio``, then the centre crop of the image's aspect clamped to
    ``ratio``), and ``flips`` (n,) bool, each True with probability
    ``flip``. A pure function of (seed, epoch, index) per sample."""
    (s0, s1), (r0, r1), flip = check_crop(scale, ratio, flip)
    for name, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    idx = np.ascontiguousarray(np.asarray(indices).reshape(-1), dtype=np.int64)
    from fastread import _augment
    boxes, flips = _augment.crop_params(idx, int(height), int(width), _uint("seed", seed),
                                        _uint("epoch", epoch), s0, s1, r0, r1, flip)
    return boxes, flips.view(np.bool_)


def _cai(obj, what):
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{what} must be a CUDA array (with __cuda_array_interface__), got "
                        f"{type(obj).__name__}")
    return cai


def _c_strides(shape, itemsize):
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _host_ai(obj, what):
    """A NumPy array's __array_interface__ (the host twin of _cai)."""
    if not isinstance(obj, np.ndarray):
        raise TypeError(f"{what} must be a NumPy array, got {type(obj).__name__}")
    if not obj.flags.writeable and what == "out":
        raise ValueError("out must be writable")
    return obj.__array_interface__


def _source_layout(images, cai=None):
    """(pointer, sample stride in bytes, n, height, width) of a (N, H, W, 3)
    uint8 CUDA array whose samples may be spaced by any stride (the reader's
    O_DIRECT slots) but whose rows and pixels are packed (``cai``: its
    array interface, when not a CUDA one)."""
    cai = _cai(images, "images") if cai is None else cai
    shape, typestr = tuple(cai["shape"]), cai["typestr"]
    if len(shape) != 4 or shape[3] != 3 or typestr != "|u1":
        raise ValueError(f"images must be (N, H, W, 3) uint8 (a batch of RGB images), got shape "
                         f"{shape} of {typestr}")
    n, h, w, _ = shape
    strides = cai.get("strides")
    stride = h * w * 3
    if strides is not None:
        if tuple(strides[1:]) != (w * 3, 3, 1):
            raise ValueError(f"images: each image's rows and pixels must be packed (strides "
                             f"(*, {w * 3}, 3, 1)), got strides {tuple(strides)}")
        stride = int(strides[0]) if n > 1 else stride
        if stride < h * w * 3:
            raise ValueError(f"images: sample stride {stride} overlaps the {h}x{w}x3 images")
    return int(cai["data"][0]), stride, n, h, w


class Augmenter:
    """The fused kernel on CUDA device ``device_id``: compiled with NVRTC on
    first use (``nvrtc_path``: a libnvrtc file or directory, else
    FASTREAD_NVRTC, pip's nvidia-cuda-nvrtc, the loader's path) and cached
    under ``cache_dir`` (else FASTREAD_CACHE_DIR, else ~/.cache/fastread).
    RuntimeError if the GPU or NVRTC is missing. ``kernel_source`` says how
    it was built."""

    def __init__(self, device_id=0, *, nvrtc_path=None, cache_dir=None):
        if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)) or \
                device_id < 0:
            raise ValueError(f"device_id must be a CUDA device number (>= 0), got {device_id!r}")
        if nvrtc_path is None and not os.environ.get("FASTREAD_NVRTC"):
            from fastread._gather_defaults import nvrtc_wheel_dir
            nvrtc_path = nvrtc_wheel_dir()  # pip's nvidia-cuda-nvrtc, if that is all there is
        from fastread import _augment
        self._kernel = _augment.Kernel(int(device_id), nvrtc_path, cache_dir)
        self.device_id = int(device_id)

    @property
    def kernel_source(self):
        return self._kernel.kernel_source

    def __call__(self, images, out, boxes, flips=None, *, mean=(0.0, 0.0, 0.0),
                 std=(1.0, 1.0, 1.0), stream=0):
        """Queues the kernel on CUDA stream ``stream`` (a ``CUstream``
        handle; 0: the legacy default stream) and returns ``out``:
        ``out[i]`` = sample ``i``'s box ``boxes[i]`` of ``images`` (N, H, W,
        3) uint8, resized bilinearly to ``out``'s (N, 3, OH, OW), mirrored
        where ``flips[i]``, then ``(pixel - mean) / std`` per channel
        (``mean``/``std`` in pixel units, 0-255) for float32 / float16
        ``out``, or rounded to uint8 for uint8 ``out`` (not normalized).
        ``images`` must stay unchanged until the stream has run the kernel."""
        args = _batch_args(_source_layout(images), _cai(out, "out"), boxes, flips, mean, std)
        if args[0]:
            self._kernel.run(*args[1:], int(stream))
        return out

def _batch_args(layout, cai, boxes, flips, mean, std):
    """The checked arguments of one batch: (n, src, stride, h, w, dst, OH,
    OW, dtype, boxes, flips, mean, std), ValueError naming what is wrong."""
    src, stride, n, h, w = layout
    shape = tuple(cai["shape"])
    dtypes = {"<f4": "float32", "<f2": "float16", "|u1": "uint8"}
    dtype = dtypes.get(cai["typestr"])
    if dtype is None:
        raise ValueError(f"out must be float32, float16 or uint8, got {cai['typestr']}")
    if len(shape) != 4 or shape[0] != n or shape[1] != 3:
        raise ValueError(f"out must be ({n}, 3, OH, OW) for {n} images, got {shape}")
    itemsize = np.dtype(dtype).itemsize
    if cai.get("strides") is not None and tuple(cai["strides"]) != _c_strides(shape, itemsize):
        raise ValueError("out must be C-contiguous")
    boxes = np.asarray(boxes)
    if boxes.dtype.kind not in "iu" or (boxes.size and (boxes.min() < 0 or
                                                      boxes.max() > np.iinfo(np.int32).max)):
        raise ValueError("boxes must be non-negative integers below 2**31 (top, left, "
                         "height, width)")
    boxes = np.ascontiguousarray(boxes, dtype=np.int32)
    if boxes.shape != (n, 4):
        raise ValueError(f"boxes must be ({n}, 4) (top, left, height, width), got "
                         f"{boxes.shape}")
    flips = np.zeros(n, np.uint8) if flips is None else \
        np.ascontiguousarray(np.asarray(flips).reshape(-1), dtype=np.uint8)
    if flips.shape != (n,):
        raise ValueError(f"flips must hold {n} values, got {flips.shape[0]}")
    for name, v in (("mean", mean), ("std", std)):
        if len(v) != 3:
            raise ValueError(f"{name} must be 3 numbers (one per channel), got {v!r}")
    return (n, src, stride, h, w, int(cai["data"][0]), shape[2], shape[3], dtype, boxes, flips,
            [float(m) for m in mean], [float(s) for s in std])


def augment_host(images, out, boxes, flips=None, *, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0),
                 threads=None):
    """:class:`Augmenter`'s kernel on the CPU, in the C core with the GIL
    released (no GPU, NVRTC or torch): ``images`` (N, H, W, 3) uint8 and
    ``out`` (N, 3, OH, OW) float32 / float16 / uint8 NumPy arrays, the same
    arithmetic in the same order. ``threads``: native threads sharing the
    batch's samples (default: one per CPU the process may use, at most 64).
    Returns ``out`` when it is written."""
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or \
            not 1 <= threads <= 64:
        raise ValueError(f"threads must be an integer in 1..64, got {threads!r}")
    args = _batch_args(_source_layout(images, _host_ai(images, "images")), _host_ai(out, "out"),
                       boxes, flips, mean, std)
    if args[0]:
        from fastread import _augment
        _augment.run_host(*args[1:], int(threads), images, out)
    return out
