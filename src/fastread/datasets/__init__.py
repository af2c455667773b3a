"""Synthetic datasets for fastread benchmarks and tests: one module per
generated format, the parts they share in :mod:`fastread.datasets._shared`.

- :mod:`fastread.datasets.jpeg`: :func:`make_imagenet_like`, an ImageNet-like
  tree of real JPEG files (``root/n10000000/n10000000_0.JPEG`` ...).
- :mod:`fastread.datasets.npy`: :func:`make_npy_dataset`, the same tree of
  random ``.npy`` arrays, for raw-array benchmarks and ``readers.numpy``.

- :mod:`fastread.datasets.cifar10`, :mod:`~fastread.datasets.webdataset`,
  :mod:`~fastread.datasets.squirrel`: record formats (CIFAR-10 binary and
  pickle batches, WebDataset tar shards, Squirrel MessagePack shards written
  with squirrel-core's own writer).

Both functions are reusable: when ``root`` already holds a complete dataset
made with the same parameters (recorded in ``root/.fastread-dataset.json``,
which is written last), they return at once without touching the files.
Files are written under a temporary name and moved into place with
``os.replace``, so an interrupted run never leaves a truncated file behind; a
rerun with the same parameters resumes where it stopped.

Sizes are in SI units: ``mean_kb=92`` means 92,000 bytes.
"""

from fastread.datasets._shared import MARKER_NAME, DatasetInfo, class_dir_name
from fastread.datasets.jpeg import make_imagenet_like
from fastread.datasets.npy import make_npy_dataset
from fastread.datasets.cifar10 import make_cifar10
from fastread.datasets.squirrel import make_squirrel
from fastread.datasets.webdataset import make_webdataset

__all__ = [
    "DatasetInfo",
    "make_cifar10",
    "make_imagenet_like",
    "make_npy_dataset",
    "make_squirrel",
    "make_webdataset",
    "class_dir_name",
    "MARKER_NAME",
]
