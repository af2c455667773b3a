"""fastread: native batch reads of training samples for DALI and PyTorch.

The per-sample work (open, read, close; many I/Os in flight) happens in a C
core with the GIL released. This package adapts it:

- :func:`read_files` reads a list of files into NumPy arrays in one call;
  :func:`read_batches` reads an iterable of such lists ahead on native threads.
- :func:`scan` indexes a dataset exactly as DALI's ``fn.readers.file`` does.
- :class:`Reader` iterates over sharded, shuffled batches read ahead on a
  native thread, from a sample source (:class:`SampleSource`: a
  :class:`FileList`, a :class:`PackedImage`, :class:`FileRanges`, or one of
  your own), with engine options in one :class:`EngineOptions`.
- :class:`PackedImage` / :func:`pack` / :func:`verify`: a dataset packed into
  one image with aligned samples, read with block-level range reads.
- :func:`build_bmap` / :func:`load_bmap`: extent maps of files in place (FIEMAP).
- ``fastread.dali`` and ``fastread.torch`` plug that into training loops.
"""
from fastread._core import Batch, Context, DeviceArray, NativeReader
from fastread.engine import EngineOptions, EngineStatus, engines, open_context
from fastread.errors import ReadError
from fastread.features import FeatureStore
from fastread.batches import BatchIterator, read_batches
from fastread.files import read_files
from fastread.formats import Cifar10, FormatError, MultiFileRanges, SquirrelStore, WebDataset
from fastread.bmap import build_bmap, load_bmap
from fastread.image import ImageError, PackedImage, pack, verify
from fastread.index import scan
from fastread.names import NameTable, PathTable
from fastread.reader import Reader
from fastread.s3 import S3Options
from fastread.source import FileList, FileRanges, SampleSource

__version__ = "0.1.0"

__all__ = [
    "Batch", "BatchIterator", "Cifar10", "Context", "DeviceArray", "FeatureStore", "FormatError", "MultiFileRanges",
    "SquirrelStore", "WebDataset", "EngineOptions", "EngineStatus", "FileList", "FileRanges", "ImageError",
    "NativeReader", "PackedImage", "ReadError", "Reader", "S3Options", "SampleSource", "build_bmap", "engines", "load_bmap", "open_context", "pack", "read_batches", "read_files", "scan", "verify",
    "NameTable", "PathTable", "__version__",
]
