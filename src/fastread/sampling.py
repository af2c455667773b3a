"""Which samples a shard reads in an epoch: DALI's shard boundaries
(:func:`shard_range`), an epoch's indices (:func:`epoch_indices`: shuffled
by the core's permutation or shuffle buffer, padded, last batch dropped),
and the checks of the sharding arguments every reader takes.

Pure arithmetic over sample counts: :mod:`fastread.index` lists the samples
(``scan``), this module orders and splits them. Below every reader (the
Python :class:`fastread.Reader`, the DALI readers' external source, the
PyTorch loaders), so the native DALI operators' order (the core's
``fr_permutation`` / ``fr_buffer_shuffle``) is the same on every path.
"""
import operator
from typing import Optional, Tuple

import numpy as np

from fastread._core import buffer_shuffle, permutation

__all__ = ["shard_range", "epoch_indices", "check_shard_args", "check_flag"]



def _as_int(value, option: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"``{option}`` must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"``{option}`` must be an integer, got {value!r}") from None


def check_shard_args(shard_id, num_shards) -> Tuple[int, int]:
    """``(shard_id, num_shards)`` as ints, or ValueError naming the one that
    is not an integer, not >= 1 (num_shards) or not in [0, num_shards)."""
    num_shards = _as_int(num_shards, "num_shards")
    shard_id = _as_int(shard_id, "shard_id")
    if num_shards < 1:
        raise ValueError(f"``num_shards`` must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"``shard_id`` must be in [0, num_shards={num_shards}), got {shard_id}")
    return shard_id, num_shards


def check_flag(name: str, value) -> bool:
    """``value`` as a bool; TypeError naming ``name`` unless it is a bool
    (Python or NumPy) or the integer 0 or 1."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def shard_range(num_samples: int, shard_id: int, num_shards: int) -> Tuple[int, int]:
    """``[start, end)`` of shard ``shard_id`` out of ``num_shards``.

    DALI's formula (``loader.cc``: ``start_index = size * shard_id /
    num_shards``), so shard sizes differ by at most one and the larger shards
    come last (10 samples in 3 shards: ``[0,3) [3,6) [6,10)``).  Like DALI,
    ``num_shards`` may not exceed ``num_samples``.
    """
    num_samples = _as_int(num_samples, "num_samples")
    shard_id = _as_int(shard_id, "shard_id")
    num_shards = _as_int(num_shards, "num_shards")
    if num_samples < 0:
        raise ValueError(f"``num_samples`` must be >= 0, got {num_samples}")
    if num_shards < 1:
        raise ValueError(f"``num_shards`` must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"``shard_id`` must be in [0, num_shards={num_shards}), got {shard_id}")
    if num_shards > num_samples:
        raise ValueError(f"The number of samples ({num_samples}) must be at least equal to "
                         f"``num_shards`` ({num_shards})")
    return num_samples * shard_id // num_shards, num_samples * (shard_id + 1) // num_shards


def epoch_indices(num_samples: int, *, shard_id: int = 0, num_shards: int = 1,
                  shuffle: bool = False, seed: int = 0, epoch: int = 0,
                  pad_last_batch: bool = False, batch_size: Optional[int] = None,
                  drop_last: bool = False, shuffle_buffer: int = 0) -> np.ndarray:
    """Indices (into :func:`scan` order) that shard ``shard_id`` reads in ``epoch``.

    * Without ``shuffle``: the shard's contiguous range :func:`shard_range`,
      i.e. the samples DALI's reader with the same ``shard_id``/``num_shards``
      yields in its first epoch (every epoch: like DALI with
      ``stick_to_shard=True``; DALI's default instead moves each reader to the
      next shard every epoch).
    * With ``shuffle``: one global permutation per ``(seed, epoch)``,
      ``fastread._core.permutation(seed, epoch, num_samples)`` (the core's
      ``fr_permutation``, which the native DALI operators draw too, so the
      order does not depend on which path reads), identical on every rank,
      sliced with :func:`shard_range`.  Shards therefore partition the
      dataset in every epoch, and each epoch has a different permutation
      (the idea of DALI's ``shuffle_after_epoch``; the random stream itself
      differs from DALI's).
    * With ``shuffle`` and ``shuffle_buffer=N`` (N >= 1): instead, the shard's
      contiguous range in order through a shuffle buffer of N slots
      (``fastread._core.buffer_shuffle``, the core's ``fr_buffer_shuffle``,
      which the native operators draw too): DALI's ``initial_fill`` and the
      webdataset library's ``shuffle(N)``. Each batch then draws from a
      window of about N neighbouring samples, which for a sharded format
      means a few shards instead of one range read per sample's shard.
    * ``pad_last_batch`` (DALI semantics, ``loader.h`` ``ShouldPadBatch``): the
      shard is first padded by repeating its last sample up to
      ``ceil(num_samples / num_shards)`` so all shards have equal length, then,
      if ``batch_size`` is given, further up to a multiple of ``batch_size``.
    * ``drop_last``: drop the final incomplete batch (requires ``batch_size``).
      Combined with ``pad_last_batch`` the shards are still equalised first,
      then the incomplete batch is dropped instead of padded.

    Returns an ``np.int64`` array.
    """
    start, end = shard_range(num_samples, shard_id, num_shards)
    num_samples = _as_int(num_samples, "num_samples")
    num_shards = _as_int(num_shards, "num_shards")
    if batch_size is not None:
        batch_size = _as_int(batch_size, "batch_size")
        if batch_size < 1:
            raise ValueError(f"``batch_size`` must be >= 1, got {batch_size}")
    elif drop_last:
        raise ValueError("``drop_last`` requires ``batch_size``")
    if shuffle:
        seed = _as_int(seed, "seed")
        epoch = _as_int(epoch, "epoch")
        if seed < 0:
            raise ValueError(f"``seed`` must be >= 0, got {seed}")
        if epoch < 0:
            raise ValueError(f"``epoch`` must be >= 0, got {epoch}")
        if seed >= 1 << 64:
            raise ValueError(f"``seed`` must be below 2**64, got {seed}")
        if shuffle_buffer:
            idx = buffer_shuffle(seed, epoch, np.arange(start, end, dtype=np.int64),
                                 _as_int(shuffle_buffer, "shuffle_buffer"))
        else:
            idx = permutation(seed, epoch, num_samples)[start:end]
    else:
        idx = np.arange(start, end, dtype=np.int64)
    if pad_last_batch:
        target = -(-num_samples // num_shards)
        if batch_size is not None and not drop_last:
            target = -(-target // batch_size) * batch_size
        if target > len(idx):
            idx = np.concatenate([idx, np.full(target - len(idx), idx[-1], dtype=np.int64)])
    if drop_last:
        idx = idx[: len(idx) // batch_size * batch_size]
    return idx
