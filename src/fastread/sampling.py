"""Which samples a shard reads in an epoch: DALI's shard boundaries
(:func:`shard_range`), an epoch's indices (:func:`epoch_indices`: shuffled
by the core's permutation or shuffle buffer, padded, last batch dropped),
and the checks of the sharding arguments every reader takes.

Elastic sharding (:func:`elastic_indices`, ``global_batch_size=`` on the
readers): one order of the whole data set per ``(seed, epoch)``
(:func:`global_order`), cut into global batches of a fixed size; rank ``r``
of ``W`` takes slice ``r`` of each, so the order and the global batches do
not depend on the world size, and a position (:func:`elastic_state`: global
batches consumed) taken at one world size resumes at another.

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

__all__ = ["shard_range", "epoch_indices", "check_shard_args", "check_flag", "global_order",
           "check_global_batch", "elastic_indices", "elastic_batches", "elastic_epoch_samples",
           "elastic_state", "elastic_resume", "elastic_world_sizes"]



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


# -- elastic sharding ---------------------------------------------------------
# The one owner of the elastic order. Everything that reads elastically (the
# Reader, the torch loaders, the DALI readers' external source) asks these
# functions for its indices and its resumable position.

ELASTIC_STATE_VERSION = 1


def _check_epoch_args(seed, epoch):
    seed = _as_int(seed, "seed")
    epoch = _as_int(epoch, "epoch")
    if seed < 0:
        raise ValueError(f"``seed`` must be >= 0, got {seed}")
    if seed >= 1 << 64:
        raise ValueError(f"``seed`` must be below 2**64, got {seed}")
    if epoch < 0:
        raise ValueError(f"``epoch`` must be >= 0, got {epoch}")
    return seed, epoch


def global_order(num_samples: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0,
                 shuffle_buffer: int = 0) -> np.ndarray:
    """The order of the whole data set in ``epoch``, the same whatever the
    number of ranks: scan order without ``shuffle``; with it the core's
    permutation for ``(seed, epoch)`` (``fr_permutation``, the one
    :func:`epoch_indices` slices), or with ``shuffle_buffer=N`` the whole
    set in order through a shuffle buffer of N (``fr_buffer_shuffle``)."""
    num_samples = _as_int(num_samples, "num_samples")
    if num_samples < 0:
        raise ValueError(f"``num_samples`` must be >= 0, got {num_samples}")
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    seed, epoch = _check_epoch_args(seed, epoch)
    shuffle_buffer = _as_int(shuffle_buffer, "shuffle_buffer")
    if shuffle_buffer < 0:
        raise ValueError(f"``shuffle_buffer`` must be >= 0, got {shuffle_buffer}")
    if shuffle_buffer:
        return buffer_shuffle(seed, epoch, np.arange(num_samples, dtype=np.int64),
                              shuffle_buffer)
    return permutation(seed, epoch, num_samples)


def check_global_batch(global_batch_size, num_shards) -> int:
    """The per-rank batch size, ``global_batch_size // num_shards``;
    ValueError naming ``global_batch_size`` unless it is an integer >= 1
    that ``num_shards`` (the world size) divides: every rank takes an equal
    slice of each global batch, so a world size that does not divide it
    cannot read that global order."""
    g = _as_int(global_batch_size, "global_batch_size")
    num_shards = _as_int(num_shards, "num_shards")
    if g < 1:
        raise ValueError(f"``global_batch_size`` must be >= 1, got {g}")
    if num_shards < 1:
        raise ValueError(f"``num_shards`` must be >= 1, got {num_shards}")
    if g % num_shards:
        raise ValueError(f"``global_batch_size``={g} is not divisible by the world size "
                         f"(num_shards={num_shards}): elastic sharding gives every rank an equal "
                         f"slice of each global batch; choose a global_batch_size that is a "
                         f"multiple of every world size you will run at (or run at a world size "
                         f"that divides {g})")
    return g // num_shards


def _tail_policy(pad_last_batch, drop_last):
    if pad_last_batch and drop_last:
        raise ValueError("``pad_last_batch`` and ``drop_last`` exclude each other")
    return "pad" if pad_last_batch else "drop" if drop_last else "partial"


def elastic_epoch_samples(num_samples: int, global_batch_size: int, *,
                          pad_last_batch: bool = False, drop_last: bool = False) -> int:
    """Samples (padding included) all ranks together read in one elastic
    epoch: ``num_samples``, rounded up to whole global batches with
    ``pad_last_batch``, down with ``drop_last``. Independent of the world
    size."""
    n, g = _as_int(num_samples, "num_samples"), _as_int(global_batch_size, "global_batch_size")
    tail = _tail_policy(pad_last_batch, drop_last)
    if tail == "pad":
        return -(-n // g) * g
    if tail == "drop":
        return n // g * g
    return n


def elastic_batches(num_samples: int, global_batch_size: int, *, pad_last_batch: bool = False,
                    drop_last: bool = False) -> int:
    """Global batches in one elastic epoch: also the number of batches every
    rank reads, whatever the world size."""
    total = elastic_epoch_samples(num_samples, global_batch_size,
                                  pad_last_batch=pad_last_batch, drop_last=drop_last)
    return -(-total // _as_int(global_batch_size, "global_batch_size"))


def _partial_tail_problem(n: int, g: int, num_shards: int, tail: str) -> Optional[str]:
    """Why ``num_shards`` ranks cannot split the partial last global batch
    (neither pad nor drop: ``n % g`` samples, fewer than the ranks), or
    None. The one owner of that rule (:func:`elastic_indices`,
    :func:`elastic_world_sizes`)."""
    left = n % g
    if tail != "partial" or not 0 < left < num_shards:
        return None
    return (f"elastic sharding: the epoch's last global batch holds {left} of {n} samples "
            f"(global_batch_size={g}), fewer than the {num_shards} ranks, so a rank would get "
            f"an empty last batch and the ranks would read different numbers of batches; "
            f"choose pad_last_batch=True (repeat the last sample up to a whole global batch) "
            f"or drop_last=True (drop the partial global batch), or run at most {left} ranks")


def elastic_world_sizes(num_samples: int, global_batch_size: int, *,
                        pad_last_batch: bool = False, drop_last: bool = False) -> list:
    """The world sizes (``num_shards``) that can read this elastic epoch,
    and so resume each other's :func:`elastic_state`: the divisors of
    ``global_batch_size``; with neither ``pad_last_batch`` nor
    ``drop_last`` and a partial last global batch of ``R = num_samples %
    global_batch_size`` samples, only those up to ``R`` (every rank needs
    a sample of it). 50 samples in global batches of 12 without a tail
    policy: ``[1, 2]``, not 3, 4, 6 or 12."""
    n = _as_int(num_samples, "num_samples")
    g = check_global_batch(global_batch_size, 1)
    tail = _tail_policy(pad_last_batch, drop_last)
    if n < 1 or (tail == "drop" and n < g):
        return []  # no epoch to read at any world size (elastic_indices refuses)
    return [w for w in range(1, g + 1)
            if g % w == 0 and _partial_tail_problem(n, g, w, tail) is None]


def elastic_indices(num_samples: int, *, global_batch_size: int, shard_id: int = 0,
                    num_shards: int = 1, shuffle: bool = False, seed: int = 0, epoch: int = 0,
                    pad_last_batch: bool = False, drop_last: bool = False,
                    shuffle_buffer: int = 0, start_batch: int = 0) -> np.ndarray:
    """Indices rank ``shard_id`` of ``num_shards`` reads in ``epoch`` under
    elastic sharding, from global batch ``start_batch`` on.

    The epoch's :func:`global_order` is cut into global batches of
    ``global_batch_size`` samples; every rank reads one batch of
    ``global_batch_size // num_shards`` samples per global batch, its
    contiguous slice ``shard_id`` of it. Global batch ``k`` therefore holds
    the same samples at every world size, and rank batch ``k`` is always
    a slice of global batch ``k``: a run resumed at another world size from
    global batch ``k`` reads every sample of the epoch not yet read, once.

    The last global batch, when ``num_samples`` is not a multiple of
    ``global_batch_size`` (``R`` samples left over):

    * ``pad_last_batch``: the order is padded by repeating its last sample up
      to whole global batches (DALI's ``pad_last_batch``: the sample
      repeated, so every batch has the same size on every rank);
    * ``drop_last``: the partial global batch is dropped (the same ``R``
      samples on every rank, whatever the world size);
    * neither: its ``R`` samples are split between the ranks as
      :func:`shard_range` splits a data set (sizes differ by at most one).
      If ``R < num_shards`` a rank would get an empty last batch, and ranks
      would then disagree on the number of batches (collectives of a DDP
      step would hang): ValueError naming ``pad_last_batch`` and
      ``drop_last``. So without a tail policy only world sizes up to ``R``
      read (and resume) the epoch: :func:`elastic_world_sizes`.

    Returns an ``np.int64`` array (every rank's batch for global batches
    ``start_batch..`` in turn).
    """
    shard_id, num_shards = check_shard_args(shard_id, num_shards)
    local = check_global_batch(global_batch_size, num_shards)
    g = local * num_shards
    n = _as_int(num_samples, "num_samples")
    if n < 1:
        raise ValueError(f"``num_samples`` must be >= 1 for elastic sharding, got {n}")
    tail = _tail_policy(pad_last_batch, drop_last)
    total = elastic_epoch_samples(n, g, pad_last_batch=pad_last_batch, drop_last=drop_last)
    batches = -(-total // g)
    start_batch = _as_int(start_batch, "start_batch")
    if not 0 <= start_batch <= batches:
        raise ValueError(f"``start_batch`` must be in [0, {batches}] (global batches of the "
                         f"epoch), got {start_batch}")
    problem = _partial_tail_problem(n, g, num_shards, tail)
    if problem:
        raise ValueError(problem)
    if tail == "drop" and batches == 0:
        raise ValueError(f"elastic sharding with drop_last: {n} samples do not fill one global "
                         f"batch of {g}")
    order = global_order(n, shuffle=shuffle, seed=seed, epoch=epoch,
                         shuffle_buffer=shuffle_buffer)
    if tail == "pad" and total > n:
        order = np.concatenate([order, np.full(total - n, order[-1], dtype=np.int64)])
    full = total // g  # whole global batches
    whole = order[:full * g].reshape(full, num_shards, local)[start_batch:, shard_id]
    parts = [whole.reshape(-1)]
    if total > full * g and start_batch <= full:
        rest = order[full * g:total]
        lo, hi = len(rest) * shard_id // num_shards, len(rest) * (shard_id + 1) // num_shards
        parts.append(rest[lo:hi])
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.int64)


def elastic_state(*, num_samples: int, global_batch_size: int, seed: int, shuffle: bool,
                  epoch: int, batches: int, pad_last_batch: bool = False,
                  drop_last: bool = False, shuffle_buffer: int = 0) -> dict:
    """The resumable position of an elastic reader after ``batches`` global
    batches of ``epoch``: a plain dict (for ``torch.save`` / JSON) that
    :func:`elastic_resume` reads back at any world size that reads the
    epoch (:func:`elastic_world_sizes`: those dividing
    ``global_batch_size``, and without ``pad_last_batch`` or ``drop_last``
    at most the partial last global batch's samples). ``samples_consumed`` counts samples of the
    epoch's global order consumed by all ranks together (padding included).
    """
    total = elastic_epoch_samples(num_samples, global_batch_size,
                                  pad_last_batch=pad_last_batch, drop_last=drop_last)
    return {"elastic": ELASTIC_STATE_VERSION, "num_samples": int(num_samples),
            "global_batch_size": int(global_batch_size), "seed": int(seed),
            "shuffle": bool(shuffle), "shuffle_buffer": int(shuffle_buffer),
            "pad_last_batch": bool(pad_last_batch), "drop_last": bool(drop_last),
            "epoch": int(epoch),
            "samples_consumed": min(int(batches) * int(global_batch_size), total)}


def elastic_resume(state, **mine) -> Tuple[int, int]:
    """``(epoch, global batches consumed)`` of an :func:`elastic_state`
    dict, checked against this reader's own arguments ``mine`` (the keys of
    :func:`elastic_state` but ``epoch`` and ``batches``): ValueError naming
    the first that differs (another data set, global batch, seed, shuffle
    or tail policy would not continue the same global order), or saying
    the state is not an elastic one."""
    if not isinstance(state, dict) or state.get("elastic") != ELASTIC_STATE_VERSION:
        raise ValueError("not an elastic state_dict (taken without global_batch_size=, or by "
                         "another version): it cannot resume an elastic reader; got "
                         f"{state!r}")
    ref = elastic_state(epoch=0, batches=0, **mine)
    for key in ("num_samples", "global_batch_size", "seed", "shuffle", "shuffle_buffer",
                "pad_last_batch", "drop_last"):
        if state.get(key) != ref[key]:
            raise ValueError(f"state_dict was taken with {key}={state.get(key)!r}, this reader "
                             f"has {key}={ref[key]!r}: it would not continue the same global "
                             f"order")
    epoch = _as_int(state["epoch"], "epoch")
    consumed = _as_int(state["samples_consumed"], "samples_consumed")
    if epoch < 0:
        raise ValueError(f"state_dict's epoch must be >= 0, got {epoch}")
    g = ref["global_batch_size"]
    total = elastic_epoch_samples(ref["num_samples"], g, pad_last_batch=ref["pad_last_batch"],
                                  drop_last=ref["drop_last"])
    batches = -(-consumed // g)
    if not 0 <= consumed <= total or min(batches * g, total) != consumed:
        raise ValueError(f"state_dict's samples_consumed={consumed} is not at a global batch "
                         f"boundary of an epoch of {total} samples in global batches of {g}")
    return epoch, batches
