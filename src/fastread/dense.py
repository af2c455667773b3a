"""Dense batch output: a batch of samples of one shape as one array
``(N, ...)``, the reader's arena viewed in place (no per-sample arrays, no
copy), for :class:`fastread.Reader` (``dense=``) and the DALI readers.

The native reader lays such batches out back to back
(``NativeReader.set_dense``), so the arena is the array; O_DIRECT keeps
every sample in an aligned slot, and the array is then strided by the slot.
Only where the samples do not lie at one stride (the object cache's hits and
misses mixed in one batch) is the batch copied into a fresh array.

Device output (``Reader(device="gpu", dense=True)``): the batch's device
buffer mirrors the arena's layout (``fr_batch.device``), so the batch is one
:class:`fastread.DeviceArray` ``(N, ...)`` over it in the same way (strided
by the slot with O_DIRECT: ``__cuda_array_interface__`` and DLPack carry
the strides).
"""
import numpy as np

__all__ = ["DenseLayout", "dense_layout", "dense_batch"]


class DenseLayout:
    """The shape and dtype of every sample of a dense reader; ``shape``
    None: ``(nbytes,)`` uint8, taken from each batch (samples of one byte
    size, e.g. fixed-size records or files)."""

    def __init__(self, shape, dtype):
        self.shape = None if shape is None else tuple(int(x) for x in shape)
        self.dtype = np.dtype(dtype)

    def __repr__(self):
        return f"DenseLayout(shape={self.shape}, dtype={self.dtype})"


def dense_layout(source, dense):
    """What ``dense`` (a Reader's argument) means for ``source``: None (off),
    or a :class:`DenseLayout`. ``True``: a decoded packed image's one sample
    shape and dtype (``fastread pack --decode --crop``; ValueError if its
    shapes differ), else samples of one byte size as ``(nbytes,)`` uint8. A
    tuple: that shape of uint8 (the bytes of every sample)."""
    if dense is None or dense is False:
        return None
    if dense is True:
        shapes = getattr(source, "shapes", None)
        if shapes is not None and getattr(source, "encoding", None) == "raw":
            shape = source.sample_shape
            if shape is None:
                kinds = len({tuple(s) for s in shapes.tolist()})
                raise ValueError(f"dense=True needs samples of one shape; {source!r} holds "
                                 f"{kinds} shapes (pack it with --crop for one, or read it "
                                 "without dense)")
            return DenseLayout(shape, source.dtype)
        return DenseLayout(None, np.uint8)
    if isinstance(dense, tuple) and dense and all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x > 0
            for x in dense):
        return DenseLayout(dense, np.uint8)
    raise ValueError(f"dense must be False, True or a shape (a tuple of positive integers), "
                     f"got {dense!r}")


def dense_batch(batch, layout, name_of, device_id=None):
    """The ``batch`` (its failures already raised) as one array
    ``(len(batch),) + shape``: a NumPy array, or with ``device_id`` a
    :class:`fastread.DeviceArray` over the batch's device buffer.
    ``name_of(i)`` names the batch's i-th sample in the error for one whose
    size does not fit."""
    lengths = batch.lengths()
    if layout.shape is None:
        nbytes = int(lengths[0]) if len(lengths) else 0
        shape = (nbytes,)
    else:
        shape = layout.shape
        nbytes = int(np.prod(shape)) * layout.dtype.itemsize
    bad = np.flatnonzero(lengths != nbytes)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"dense batch: sample {name_of(i)} has {int(lengths[i])} bytes, the "
                         f"batch's samples {nbytes} (shape {shape}, {layout.dtype}): dense "
                         "output needs samples of one size")
    if device_id is not None:
        view = batch.dense_device_view(shape, layout.dtype, device_id)
        if view is None:
            raise ValueError("dense batch: the samples do not lie one per fixed stride in the "
                             "batch's device buffer (object-cache hits and misses in one "
                             "batch); read without dense=True")
        return view
    view = batch.dense_view(shape, layout.dtype)
    if view is not None:
        return view
    # Samples not one stride apart (see the module doc): one copy.
    out = np.empty((len(lengths),) + shape, layout.dtype)
    flat = out.reshape(len(lengths), -1).view(np.uint8)
    for j, a in enumerate(batch.arrays()):
        flat[j] = a
    return out
