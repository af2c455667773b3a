"""Record formats as sample sources: datasets whose samples live inside a
few large files rather than one file each.

- :mod:`fastread.formats.cifar`: CIFAR-10, binary and Python-pickle
  layouts (:class:`Cifar10`), samples as byte ranges of the batch files.
- :mod:`fastread.formats.webdataset`: WebDataset tar shards
  (:class:`WebDataset`), one byte range per sample, components as views.
- :mod:`fastread.formats.squirrel`: squirrel-core MessagePack stores
  (:class:`SquirrelStore`), one byte range per sample, arrays as views.
- :mod:`fastread.formats.parquet`: Parquet files and Arrow IPC files, the
  Hugging Face layouts (:class:`Parquet`), one row a sample, column chunks
  read as byte ranges and decoded by Apache Arrow, values as views.
- :mod:`fastread.formats._multi`: :class:`MultiFileRanges`, byte ranges of
  several files read with one native range reader per file.
- :mod:`fastread.formats.in_memory`: :class:`InMemory`, any source of
  fixed-size records read once and held in memory, batches gathered from it.
- PyTorch iterators over all three: :mod:`fastread.torch` (``records``).

Every source here is a :class:`fastread.SampleSource`: give it to
:class:`fastread.Reader` (``source=``) for epochs, shards and shuffles over
all samples of all files. Malformed input raises :class:`FormatError`
naming the file and the byte offset.
"""
from fastread.formats._multi import MultiBatch, MultiFileRanges
from fastread.formats.cifar import Cifar10, FormatError, to_chw, to_hwc
from fastread.formats.in_memory import InMemory
from fastread.formats.parquet import Parquet
from fastread.formats.squirrel import SquirrelStore
from fastread.formats.webdataset import WebDataset

__all__ = ["Cifar10", "FormatError", "InMemory", "MultiBatch", "MultiFileRanges", "Parquet",
           "SquirrelStore",
           "WebDataset", "to_chw", "to_hwc"]
