"""The record formats' PyTorch loaders, which live in :mod:`fastread.torch`
(``fastread.torch.records``) with the image loader; importable from here
too, where they lived first."""
from fastread.torch.records import (  # noqa: F401
    CIFAR10_MEAN, CIFAR10_STD, Cifar10Loader, SquirrelLoader, WebDatasetLoader, augment_batch)
from fastread.torch.records import __all__  # noqa: F401
