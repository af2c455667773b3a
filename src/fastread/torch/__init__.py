"""PyTorch loaders: batches as torch tensors.

- :mod:`fastread.torch.images`: :class:`ImageLoader`, image trees (what
  :func:`fastread.scan` lists) read by fastread and decoded by DALI.
- :mod:`fastread.torch.records`: :class:`Cifar10Loader`,
  :class:`WebDatasetLoader`, :class:`SquirrelLoader` and
  :func:`augment_batch`, the record formats read by fastread's native
  readers (no DALI needed).

::

    from fastread.torch import ImageLoader

    loader = ImageLoader("/data/train", batch_size=256, device="cuda", random_shuffle=True)
    for epoch in range(90):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...

Shards come from torchrun's environment (RANK, WORLD_SIZE; LOCAL_RANK picks
the GPU) unless given; ``state_dict()`` taken mid-epoch and loaded into a
new loader resumes with exactly the samples that epoch had not delivered.
Importing this package does not import torch: the loaders do when built.
"""
from fastread.torch.images import IMAGENET_MEAN, IMAGENET_STD, ImageLoader
from fastread.torch.records import (CIFAR10_MEAN, CIFAR10_STD, Cifar10Loader, SquirrelLoader,
                                    WebDatasetLoader, augment_batch)

__all__ = ["ImageLoader", "IMAGENET_MEAN", "IMAGENET_STD", "Cifar10Loader", "WebDatasetLoader",
           "SquirrelLoader", "CIFAR10_MEAN", "CIFAR10_STD", "augment_batch"]
