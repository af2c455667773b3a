"""CIFAR-10 as a sample source: fixed-size records of a few batch files.

Two layouts, both as the CIFAR-10 distribution ships them
(https://www.cs.toronto.edu/~kriz/cifar.html):

- binary (``cifar-10-batches-bin/``): ``data_batch_1.bin`` ..
  ``data_batch_5.bin`` (train) and ``test_batch.bin`` (test), each a run of
  3073-byte records: one label byte (0..9), then the 32x32 image as three
  1024-byte planes (red, green, blue), rows top to bottom.
- Python pickle (``cifar-10-batches-py/``): ``data_batch_1`` .. ``_5`` and
  ``test_batch``, each a pickled dict with ``data`` (a 10000 x 3072 uint8
  array, the same planes per row) and ``labels``. The array's raw bytes sit
  in the pickle stream as one block (the ``BINSTRING`` of the original
  Python 2 files, ``BINBYTES`` / ``BINBYTES8`` / ``BYTEARRAY8`` of
  protocols 3 to 5): its offset is found once with :mod:`pickletools` and
  the images are read as ranges of it, exactly like the binary records.

A sample is the 3072 image bytes of one record (CHW planes), read as a byte
range with the native range reader; labels are read once when the source is
built. :func:`to_hwc` turns a batch into the ``(N, 32, 32, 3)`` uint8 HWC
array that ``torchvision.datasets.CIFAR10`` and DALI pipelines use.
"""
import io
import os
import pickle
import pickletools
import reprlib

import numpy as np

from fastread._safe_open import open_file
from fastread.formats._multi import MultiFileRanges
from fastread.source import FileRanges

__all__ = ["Cifar10", "FormatError", "cifar10_files", "to_chw", "to_hwc", "IMAGE_BYTES", "RECORD_BYTES",
           "CLASSES"]

IMAGE_BYTES = 3 * 32 * 32
RECORD_BYTES = 1 + IMAGE_BYTES
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")
TRAIN_BIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_BIN = ("test_batch.bin",)
TRAIN_PY = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_PY = ("test_batch",)
BIN_DIR = "cifar-10-batches-bin"
PY_DIR = "cifar-10-batches-py"


class FormatError(ValueError):
    """A record file that does not hold what its format says; the message
    names the file and the byte offset where it goes wrong."""

    def __init__(self, path, offset, what):
        self.path, self.offset = path, offset
        where = f"{path}" if offset is None else f"{path} at byte {offset}"
        super().__init__(f"{where}: {what}")


def cifar10_files(root, train=True):
    """``(layout, paths)`` of the CIFAR-10 batch files under ``root``: the
    binary layout (``layout='bin'``) if its files are there, else the pickle
    layout (``'py'``). ``root`` may be the batches directory itself or its
    parent (where the archive was unpacked). FileNotFoundError says what was
    looked for."""
    root = os.fspath(root)
    tried = []
    for layout, sub, names in (("bin", BIN_DIR, TRAIN_BIN if train else TEST_BIN),
                               ("py", PY_DIR, TRAIN_PY if train else TEST_PY)):
        for d in (root, os.path.join(root, sub)):
            paths = [os.path.join(d, n) for n in names]
            if all(os.path.isfile(p) for p in paths):
                return layout, paths
            tried.append(os.path.join(d, names[0]))
    raise FileNotFoundError(f"no CIFAR-10 {'train' if train else 'test'} batches under {root!r} "
                            f"(looked for {', '.join(tried)} and the other batch files)")


def _binary_file(path):
    """A FileRanges over the image bytes of one binary batch file."""
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise FormatError(path, 0, "empty file (a CIFAR-10 binary batch holds 3073-byte "
                              "records)")
        n, rest = divmod(size, RECORD_BYTES)
        if rest:
            raise FormatError(path, n * RECORD_BYTES,
                              f"{size} bytes is not a multiple of the {RECORD_BYTES}-byte "
                              f"record size: {rest} bytes of a truncated record follow {n} "
                              "whole ones")
        # The labels, one strided read of the descriptor checked as a file.
        records = np.memmap(f, np.uint8, "r", shape=(n, RECORD_BYTES))
        labels = np.array(records[:, 0])
        del records
    bad = np.flatnonzero(labels > 9)
    if len(bad):
        i = int(bad[0])
        raise FormatError(path, i * RECORD_BYTES,
                          f"record {i} has label {int(labels[i])} (CIFAR-10 labels are 0..9); "
                          f"{len(bad)} records have one out of range")
    offsets = np.arange(n, dtype=np.int64) * RECORD_BYTES + 1
    return FileRanges(path, offsets, np.full(n, IMAGE_BYTES, np.int64), labels=labels)


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles what CIFAR batches hold (dicts, lists, strings, numbers and
    NumPy arrays) and refuses any other global: a batch file from elsewhere
    cannot run code when it is indexed."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
                ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 "
                                         "batch (only NumPy arrays)")
        return super().find_class(module, name)


# Opcodes that carry a block of raw bytes, with the size of their length field.
_RAW_OPCODES = {"BINSTRING": 4, "BINBYTES": 4, "BINBYTES8": 8, "BYTEARRAY8": 8,
                "SHORT_BINSTRING": 1, "SHORT_BINBYTES": 1}


def _pickle_file(path):
    """A FileRanges over the image rows of one pickled batch: the pickle is
    loaded once (for the labels and to check the array), its data block
    located in the stream and read as ranges."""
    with open_file(path) as f:
        blob = f.read()
    if not blob:
        raise FormatError(path, 0, "empty file (a CIFAR-10 Python batch is a pickled dict)")
    try:
        entry = _SafeUnpickler(io.BytesIO(blob), encoding="latin1").load()
    except Exception as e:  # pickle raises many kinds for corrupt input
        raise FormatError(path, None, f"not a readable pickle: {type(e).__name__}: {e}") from None
    if not isinstance(entry, dict):
        raise FormatError(path, None, f"the pickle holds a {type(entry).__name__}, not a dict")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    if "data" not in entry or "labels" not in entry:
        # reprlib: a key may be anything a pickle builds (nested 100,000 deep)
        keys = sorted(reprlib.repr(k) for k in entry)
        raise FormatError(path, None, f"the pickled dict has keys {reprlib.repr(keys)}; "
                          "CIFAR-10 batches have 'data' and 'labels'")
    data = entry["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != IMAGE_BYTES or not data.flags.c_contiguous:
        raise FormatError(path, None, "'data' is not a C-ordered N x 3072 uint8 array: "
                          f"{type(data).__name__} {getattr(data, 'dtype', '')} "
                          f"{getattr(data, 'shape', '')}")
    n = data.shape[0]
    try:
        labels = np.asarray(entry["labels"])
    except (ValueError, TypeError, RecursionError, MemoryError) as e:   # a ragged or deep list
        raise FormatError(path, None, f"'labels' is no array of integers: {e}") from None
    if labels.shape != (n,) or labels.dtype.kind not in "iu" or \
            (n and (labels.min() < 0 or labels.max() > 9)):
        raise FormatError(path, None, f"'labels' must be {n} integers 0..9, got "
                          f"{labels.dtype} of shape {labels.shape}")
    start = None
    for op, arg, pos in pickletools.genops(io.BytesIO(blob)):
        if op.name in _RAW_OPCODES and isinstance(arg, (bytes, bytearray, str)) \
                and len(arg) == n * IMAGE_BYTES:
            start = pos + 1 + _RAW_OPCODES[op.name]
            break
    if start is None or blob[start:start + n * IMAGE_BYTES] != data.tobytes():
        raise FormatError(path, None, "the image array is not stored as one raw block in the "
                          "pickle stream (pickled with protocol 0..2 by Python 3?); "
                          "re-save it with protocol 3 or newer, or convert to the binary layout")
    offsets = start + np.arange(n, dtype=np.int64) * IMAGE_BYTES
    return FileRanges(path, offsets, np.full(n, IMAGE_BYTES, np.int64),
                      labels=labels.astype(np.int32))


class Cifar10(MultiFileRanges):
    """The CIFAR-10 train (``train=True``: 50,000 images in five files) or
    test (10,000) set under ``root``, binary or pickle layout (see
    :func:`cifar10_files`), as a :class:`fastread.SampleSource`: each sample
    is one image's 3072 bytes (CHW planes) read as a byte range, labels are
    the records' labels. Pass it to :class:`fastread.Reader` (``source=``)
    for epochs, shards and shuffles; :func:`to_hwc` makes a batch an HWC
    array. Raises :class:`FormatError` naming the file and offset for a
    record file of the wrong size or a label out of range."""

    def __init__(self, root, train=True, files=None):
        if files is None:
            self.layout, paths = cifar10_files(root, train)
        else:
            paths = [os.fspath(p) for p in files]
            self.layout = "bin" if all(p.endswith(".bin") for p in paths) else "py"
        self.root, self.train, self.paths = os.fspath(root) if root else None, train, paths
        parse = _binary_file if self.layout == "bin" else _pickle_file
        super().__init__([parse(p) for p in paths])

    def __repr__(self):
        return (f"Cifar10({self.root!r}, train={self.train}, layout={self.layout!r}, "
                f"{len(self)} images)")


def to_chw(arrays, out=None):
    """The batch's images (a list of 3072-byte records) as one
    ``(N, 3, 32, 32)`` uint8 array: the records' own CHW planes, gathered
    in one copy (into ``out`` if given)."""
    n = len(arrays)
    if out is not None and (out.shape != (n, 3, 32, 32) or out.dtype != np.uint8
                            or not out.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous ({n}, 3, 32, 32) uint8 array, got "
                         f"{out.dtype} {out.shape}")
    sizes = sum(a.size for a in arrays)
    if sizes != n * IMAGE_BYTES:
        raise ValueError(f"{n} CIFAR-10 images should be {n * IMAGE_BYTES} bytes, got {sizes}")
    if out is None:
        out = np.empty((n, 3, 32, 32), np.uint8)
    if n:
        np.concatenate(arrays, out=out.reshape(-1))
    return out


def to_hwc(arrays, out=None, scratch=None):
    """The batch's images (a list of 3072-byte CHW records) as one
    ``(N, 32, 32, 3)`` uint8 array in HWC order (into ``out`` if given;
    the records are gathered into ``scratch``, a ``(N, 3, 32, 32)`` array,
    if given, else a new one). The planes are interleaved with ``np.stack``
    (6x faster than a copy of the transposed view, NumPy's strided path for
    uint8)."""
    chw = to_chw(arrays, out=scratch)
    return np.stack([chw[:, 0], chw[:, 1], chw[:, 2]], axis=-1, out=out)
