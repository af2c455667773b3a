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

Orders are lazy (:class:`EpochOrder` over the core's ``fr_order``): a
batch's indices are computed when it is asked for, so a shuffled epoch of
10^8 samples starts without an N-element array (:func:`epoch_indices` and
:func:`elastic_indices` return the whole array, for small sets and tests).
``shuffle="block"`` (``shuffle_block``, ``shuffle_window``) trades some
randomness for locality: see :func:`check_shuffle`.

Pure arithmetic over sample counts: :mod:`fastread.index` lists the samples
(``scan``), this module orders and splits them. Below every reader (the
Python :class:`fastread.Reader`, the DALI readers' external source, the
PyTorch loaders), so the native DALI operators' order (the core's
``fr_permutation`` / ``fr_buffer_shuffle``) is the same on every path.
"""
import operator
from typing import Optional, Tuple

import numpy as np

from fastread._core import ORDER_TABLE_MAX, Order, buffer_shuffle

__all__ = ["shard_range", "epoch_indices", "check_shard_args", "check_flag", "global_order",
           "check_shuffle", "EpochOrder", "SHUFFLE_MODES", "DEFAULT_SHUFFLE_BLOCK",
           "DEFAULT_SHUFFLE_WINDOW",
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


#: What ``shuffle=`` names besides True/False: ``"full"`` (True: every
#: sample anywhere in the epoch) and ``"block"``.
SHUFFLE_MODES = ("full", "block")
#: Block shuffle's defaults: blocks of 256 consecutive samples, windows of
#: 64 blocks (16,384 samples a window).
DEFAULT_SHUFFLE_BLOCK = 256
DEFAULT_SHUFFLE_WINDOW = 64


def check_shuffle(shuffle, shuffle_block=None, shuffle_window=None, *,
                  option: str = "shuffle") -> Tuple[Optional[str], int, int]:
    """``(mode, block, window)`` of a reader's shuffle arguments: mode None
    (no shuffle: ``shuffle`` False), ``"full"`` (True or ``"full"``) or
    ``"block"``; block and window are ``shuffle_block`` /
    ``shuffle_window`` (defaults :data:`DEFAULT_SHUFFLE_BLOCK`,
    :data:`DEFAULT_SHUFFLE_WINDOW`) in block mode, else 0. TypeError naming
    the option (``option`` names the shuffle flag: ``random_shuffle`` on the
    readers) for another ``shuffle``; ValueError naming ``shuffle_block`` /
    ``shuffle_window`` for a bad one, or one given without block mode.

    What each costs, per rank, whatever N: ``"full"`` holds an order of at
    most 512 KiB (a table up to 65,536 samples, a keyed Feistel bijection of
    ~200 bytes beyond) and reads every sample of a batch from anywhere (one
    ranged read each: in object storage one GET a sample). ``"block"``
    permutes blocks of ``shuffle_block`` consecutive samples and the samples
    within each window of ``shuffle_window`` blocks: a window's
    ``shuffle_block * shuffle_window`` samples are whole blocks, so a
    reader reads runs of ``shuffle_block`` neighbouring samples (a shard's
    range, one large GET) instead of one sample a run; a batch draws from
    one or two windows rather than the whole data set. Memory as ``"full"``
    over N / ``shuffle_block`` blocks."""
    if shuffle is None or shuffle is False or (isinstance(shuffle, (int, np.integer))
                                               and not isinstance(shuffle, bool) and shuffle == 0):
        mode = None
    elif shuffle is True or isinstance(shuffle, np.bool_) or (
            isinstance(shuffle, (int, np.integer)) and shuffle == 1):
        mode = "full" if bool(shuffle) else None
    elif isinstance(shuffle, str) and shuffle in SHUFFLE_MODES:
        mode = shuffle
    else:
        # TypeError, as check_flag's for the flag this was before "block".
        raise TypeError(f"{option} must be True, False, 'full' or 'block', got {shuffle!r}")
    if mode != "block":
        for name, v in (("shuffle_block", shuffle_block), ("shuffle_window", shuffle_window)):
            if v is not None:
                raise ValueError(f"``{name}`` applies only with {option}='block', got "
                                 f"{option}={shuffle!r}")
        return mode, 0, 0
    block = DEFAULT_SHUFFLE_BLOCK if shuffle_block is None else _as_int(shuffle_block,
                                                                        "shuffle_block")
    window = DEFAULT_SHUFFLE_WINDOW if shuffle_window is None else _as_int(shuffle_window,
                                                                           "shuffle_window")
    if block < 1:
        raise ValueError(f"``shuffle_block`` must be >= 1 (samples a block), got {block}")
    if window < 1:
        raise ValueError(f"``shuffle_window`` must be >= 1 (blocks a window), got {window}")
    if block * window >= 1 << 62:
        raise ValueError(f"``shuffle_block`` x ``shuffle_window`` ({block} x {window}) is too "
                         f"large")
    return mode, block, window


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


def _check_seed_epoch(seed, epoch):
    seed = _as_int(seed, "seed")
    epoch = _as_int(epoch, "epoch")
    if seed < 0:
        raise ValueError(f"``seed`` must be >= 0, got {seed}")
    if epoch < 0:
        raise ValueError(f"``epoch`` must be >= 0, got {epoch}")
    if seed >= 1 << 64:
        raise ValueError(f"``seed`` must be below 2**64, got {seed}")
    return seed, epoch


class _GlobalOrder:
    """The order of all ``n`` samples in one epoch, per position: scan
    order, the core's ``fr_order`` (full or block) or, with a shuffle buffer
    over ``[lo, hi)``, that range through the buffer (the one order held
    whole: a buffer's draw is sequential, so it costs ``hi - lo`` int64s)."""

    def __init__(self, n, mode, seed, epoch, block=0, window=0, shuffle_buffer=0, lo=0, hi=None):
        self.n = n
        self._lo = lo
        self._order = self._buffered = None
        if mode is not None and shuffle_buffer:
            hi = n if hi is None else hi
            self._buffered = buffer_shuffle(seed, epoch, np.arange(lo, hi, dtype=np.int64),
                                            shuffle_buffer)
        elif mode is not None:
            self._order = Order(seed, epoch, n, mode, block, window)

    def take(self, positions: np.ndarray) -> np.ndarray:
        if self._order is not None:
            return self._order.take(positions)
        if self._buffered is not None:
            return self._buffered[positions - self._lo]
        return positions.astype(np.int64, copy=True)

    def memory(self) -> int:
        if self._order is not None:
            return self._order.memory()
        return 0 if self._buffered is None else self._buffered.nbytes


class EpochOrder:
    """The indices (into :func:`scan` order) one rank reads in one epoch,
    computed per slice: :meth:`slice` (and :meth:`batch`) cost what they
    return, so the first batch of a 10^8-sample epoch needs no O(N) work
    (except with ``shuffle_buffer``, whose draw is sequential: O(shard)).

    Per-rank sharding (``global_batch_size=None``): :func:`epoch_indices`'s
    rules; elastic sharding (``global_batch_size=G``): :func:`elastic_indices`'s,
    from global batch ``start_batch`` on. Every rank computes the same
    global order from ``(seed, epoch)`` alone, so nothing is exchanged.
    ``shuffle``: False, True / ``"full"`` or ``"block"`` (with
    ``shuffle_block``, ``shuffle_window``: :func:`check_shuffle`)."""

    def __init__(self, num_samples: int, *, shard_id: int = 0, num_shards: int = 1,
                 shuffle=False, seed: int = 0, epoch: int = 0, pad_last_batch: bool = False,
                 batch_size: Optional[int] = None, drop_last: bool = False,
                 shuffle_buffer: int = 0, shuffle_block=None, shuffle_window=None,
                 global_batch_size: Optional[int] = None, start_batch: int = 0):
        mode, block, window = check_shuffle(shuffle, shuffle_block, shuffle_window)
        shuffle_buffer = _as_int(shuffle_buffer, "shuffle_buffer")
        if shuffle_buffer < 0:
            raise ValueError(f"``shuffle_buffer`` must be >= 0, got {shuffle_buffer}")
        if shuffle_buffer and mode == "block":
            raise ValueError("``shuffle_buffer`` and shuffle='block' exclude each other: choose "
                             "one way to keep a batch's samples near each other")
        if mode is not None:
            seed, epoch = _check_seed_epoch(seed, epoch)
        self.mode = mode
        if global_batch_size is None:
            self._init_sharded(num_samples, shard_id, num_shards, pad_last_batch, batch_size,
                               drop_last, start_batch)
            lo, hi = self._start, self._end
        else:
            self._init_elastic(num_samples, global_batch_size, shard_id, num_shards,
                               pad_last_batch, drop_last, start_batch)
            lo, hi = 0, self.num_samples
        self._order = _GlobalOrder(self.num_samples, mode, seed, epoch, block, window,
                                   shuffle_buffer, lo, hi)

    def _init_sharded(self, num_samples, shard_id, num_shards, pad_last_batch, batch_size,
                      drop_last, start_batch):
        start, end = shard_range(num_samples, shard_id, num_shards)
        n = _as_int(num_samples, "num_samples")
        num_shards = _as_int(num_shards, "num_shards")
        if batch_size is not None:
            batch_size = _as_int(batch_size, "batch_size")
            if batch_size < 1:
                raise ValueError(f"``batch_size`` must be >= 1, got {batch_size}")
        elif drop_last:
            raise ValueError("``drop_last`` requires ``batch_size``")
        length = end - start
        if pad_last_batch:
            target = -(-n // num_shards)
            if batch_size is not None and not drop_last:
                target = -(-target // batch_size) * batch_size
            length = max(length, target)
        if drop_last:
            length = length // batch_size * batch_size
        start_batch = _as_int(start_batch, "start_batch")
        skip = start_batch * (batch_size or 0)
        if start_batch < 0 or (start_batch and batch_size is None) or skip > length:
            raise ValueError(f"``start_batch`` must be in [0, batches of the epoch], got "
                             f"{start_batch}")
        self.num_samples, self.batch_size = n, batch_size
        self._start, self._end, self._skip, self._len = start, end, skip, length - skip
        self._elastic = None

    def _init_elastic(self, num_samples, global_batch_size, shard_id, num_shards,
                      pad_last_batch, drop_last, start_batch):
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
            raise ValueError(f"elastic sharding with drop_last: {n} samples do not fill one "
                             f"global batch of {g}")
        full = total // g  # whole global batches
        whole = max(0, full - start_batch) * local
        rest_lo = rest_hi = 0
        if total > full * g and start_batch <= full:
            rest = total - full * g
            rest_lo = rest * shard_id // num_shards
            rest_hi = rest * (shard_id + 1) // num_shards
        self.num_samples, self.batch_size = n, local
        self._elastic = (g, local, shard_id, full, start_batch, whole, rest_lo)
        self._len = whole + rest_hi - rest_lo

    def __len__(self) -> int:
        """Indices this rank reads (from ``start_batch`` on, padding included)."""
        return self._len

    def _positions(self, first: int, count: int) -> np.ndarray:
        """Positions in the epoch's global order of this rank's indices
        ``first .. first + count - 1`` (padding: the last sample's)."""
        p = np.arange(first, first + count, dtype=np.int64)
        if self._elastic is None:
            # The shard's range; padding repeats its last sample.
            return np.minimum(p + self._skip, self._end - self._start - 1) + self._start
        g, local, shard_id, full, start_batch, whole, rest_lo = self._elastic
        k = p // local + start_batch
        pos = k * g + shard_id * local + p % local
        in_rest = p >= whole
        if in_rest.any():
            pos[in_rest] = full * g + rest_lo + (p[in_rest] - whole)
        return np.minimum(pos, self.num_samples - 1)  # padding: the order's last sample

    def slice(self, first: int, count: int) -> np.ndarray:
        """This rank's indices ``first .. first + count - 1`` (clipped to
        the epoch's end): an int64 array."""
        first, count = int(first), int(count)
        if first < 0 or count < 0:
            raise ValueError(f"slice({first}, {count}): first and count must be >= 0")
        count = max(0, min(count, self._len - first))
        return self._order.take(self._positions(first, count))

    def batches(self, batch_size: Optional[int] = None) -> int:
        """Batches of ``batch_size`` (default: the order's own) in this epoch."""
        b = batch_size or self.batch_size
        if not b:
            raise ValueError("batches() needs a batch_size")
        return -(-self._len // b)

    def batch(self, k: int, batch_size: Optional[int] = None) -> np.ndarray:
        """Batch ``k`` (counted from ``start_batch``) of ``batch_size``
        (default: the order's own) indices; the last one may be shorter."""
        b = batch_size or self.batch_size
        if not b:
            raise ValueError("batch() needs a batch_size")
        return self.slice(k * b, b)

    def __getitem__(self, key):
        """``order[a:b]`` (a new int64 array, computed for those positions
        alone) or ``order[i]``: the order read as the array it stands for."""
        if isinstance(key, slice):
            start, stop, step = key.indices(self._len)
            if step != 1:
                return self.to_array()[key]
            return self.slice(start, max(0, stop - start))
        i = operator.index(key)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {key} of an epoch order of {self._len}")
        return int(self.slice(i, 1)[0])

    def __array__(self, dtype=None, copy=None):
        arr = self.to_array()
        return arr if dtype is None else arr.astype(dtype)

    def to_array(self) -> np.ndarray:
        """The whole epoch's indices (O(N): for small sets and tests)."""
        return np.ascontiguousarray(self.slice(0, self._len), dtype=np.int64)

    def memory(self) -> int:
        """Bytes the order holds: at most 512 KiB, whatever N (but with
        ``shuffle_buffer``: 8 bytes a sample of the buffered range)."""
        return self._order.memory()


def epoch_indices(num_samples: int, *, shard_id: int = 0, num_shards: int = 1,
                  shuffle=False, seed: int = 0, epoch: int = 0,
                  pad_last_batch: bool = False, batch_size: Optional[int] = None,
                  drop_last: bool = False, shuffle_buffer: int = 0, shuffle_block=None,
                  shuffle_window=None) -> np.ndarray:
    """Indices (into :func:`scan` order) that shard ``shard_id`` reads in ``epoch``
    (the whole :class:`EpochOrder`, as an array).

    * Without ``shuffle``: the shard's contiguous range :func:`shard_range`,
      i.e. the samples DALI's reader with the same ``shard_id``/``num_shards``
      yields in its first epoch (every epoch: like DALI with
      ``stick_to_shard=True``; DALI's default instead moves each reader to the
      next shard every epoch).
    * With ``shuffle`` (True or ``"full"``): one global order per ``(seed,
      epoch)``, ``fastread._core.Order(seed, epoch, num_samples)`` (the core's
      ``fr_order``, which the native DALI operators draw too, so the
      order does not depend on which path reads), identical on every rank,
      sliced with :func:`shard_range`.  Shards therefore partition the
      dataset in every epoch, and each epoch has a different permutation
      (the idea of DALI's ``shuffle_after_epoch``; the random stream itself
      differs from DALI's). ``shuffle="block"``: the same with the core's
      block order (:func:`check_shuffle`: ``shuffle_block``,
      ``shuffle_window``).
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
    return EpochOrder(num_samples, shard_id=shard_id, num_shards=num_shards, shuffle=shuffle,
                      seed=seed, epoch=epoch, pad_last_batch=pad_last_batch,
                      batch_size=batch_size, drop_last=drop_last, shuffle_buffer=shuffle_buffer,
                      shuffle_block=shuffle_block, shuffle_window=shuffle_window).to_array()


# -- elastic sharding ---------------------------------------------------------
# The one owner of the elastic order. Everything that reads elastically (the
# Reader, the torch loaders, the DALI readers' external source) asks these
# functions for its indices and its resumable position.

#: 2: the order past FR_ORDER_TABLE_MAX samples is the core's bijection
#: (version 1 drew a Fisher-Yates table at every size); block shuffles.
ELASTIC_STATE_VERSION = 2
#: Orders of version 1 that version 2 draws the same: unshuffled, or
#: shuffled over at most this many samples (fr_order's table).
_V1_SAME_ORDER_MAX = ORDER_TABLE_MAX


def global_order(num_samples: int, *, shuffle=False, seed: int = 0, epoch: int = 0,
                 shuffle_buffer: int = 0, shuffle_block=None, shuffle_window=None) -> np.ndarray:
    """The order of the whole data set in ``epoch``, the same whatever the
    number of ranks, as an array (O(N): :class:`EpochOrder` is the lazy
    form): scan order without ``shuffle``; with it the core's order for
    ``(seed, epoch)`` (``fr_order``, full or block: the one
    :func:`epoch_indices` slices), or with ``shuffle_buffer=N`` the whole
    set in order through a shuffle buffer of N (``fr_buffer_shuffle``)."""
    num_samples = _as_int(num_samples, "num_samples")
    if num_samples < 0:
        raise ValueError(f"``num_samples`` must be >= 0, got {num_samples}")
    if num_samples == 0:
        check_shuffle(shuffle, shuffle_block, shuffle_window)
        return np.arange(0, dtype=np.int64)
    return EpochOrder(num_samples, shuffle=shuffle, seed=seed, epoch=epoch,
                      shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block,
                      shuffle_window=shuffle_window).to_array()


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
                    shuffle_buffer: int = 0, start_batch: int = 0, shuffle_block=None,
                    shuffle_window=None) -> np.ndarray:
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
    return EpochOrder(num_samples, global_batch_size=global_batch_size, shard_id=shard_id,
                      num_shards=num_shards, shuffle=shuffle, seed=seed, epoch=epoch,
                      pad_last_batch=pad_last_batch, drop_last=drop_last,
                      shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block,
                      shuffle_window=shuffle_window, start_batch=start_batch).to_array()


def elastic_state(*, num_samples: int, global_batch_size: int, seed: int, shuffle,
                  epoch: int, batches: int, pad_last_batch: bool = False,
                  drop_last: bool = False, shuffle_buffer: int = 0, shuffle_block=None,
                  shuffle_window=None) -> dict:
    """The resumable position of an elastic reader after ``batches`` global
    batches of ``epoch``: a plain dict (for ``torch.save`` / JSON) that
    :func:`elastic_resume` reads back at any world size that reads the
    epoch (:func:`elastic_world_sizes`: those dividing
    ``global_batch_size``, and without ``pad_last_batch`` or ``drop_last``
    at most the partial last global batch's samples). ``samples_consumed`` counts samples of the
    epoch's global order consumed by all ranks together (padding included).
    A few hundred bytes whatever the data set: the order is recomputed from
    ``(seed, epoch)``, never stored. ``shuffle``: True / False, or
    ``"block"`` with its ``shuffle_block`` and ``shuffle_window``.
    """
    mode, block, window = check_shuffle(shuffle, shuffle_block, shuffle_window)
    total = elastic_epoch_samples(num_samples, global_batch_size,
                                  pad_last_batch=pad_last_batch, drop_last=drop_last)
    state = {"elastic": ELASTIC_STATE_VERSION, "num_samples": int(num_samples),
             "global_batch_size": int(global_batch_size), "seed": int(seed),
             "shuffle": "block" if mode == "block" else mode == "full",
             "shuffle_buffer": int(shuffle_buffer),
             "pad_last_batch": bool(pad_last_batch), "drop_last": bool(drop_last),
             "epoch": int(epoch),
             "samples_consumed": min(int(batches) * int(global_batch_size), total)}
    if mode == "block":
        state["shuffle_block"], state["shuffle_window"] = block, window
    return state


def elastic_resume(state, **mine) -> Tuple[int, int]:
    """``(epoch, global batches consumed)`` of an :func:`elastic_state`
    dict, checked against this reader's own arguments ``mine`` (the keys of
    :func:`elastic_state` but ``epoch`` and ``batches``): ValueError naming
    the first that differs (another data set, global batch, seed, shuffle
    or tail policy would not continue the same global order), or saying
    the state is not an elastic one."""
    if not isinstance(state, dict) or state.get("elastic") not in (1, ELASTIC_STATE_VERSION):
        raise ValueError("not an elastic state_dict (taken without global_batch_size=, or by "
                         "another version): it cannot resume an elastic reader; got "
                         f"{state!r}")
    ref = elastic_state(epoch=0, batches=0, **mine)
    if state["elastic"] == 1 and state.get("shuffle") and \
            not state.get("shuffle_buffer") and ref["num_samples"] > _V1_SAME_ORDER_MAX:
        raise ValueError(f"state_dict was taken by fastread's elastic state version 1, whose "
                         f"shuffled order of {ref['num_samples']} samples (more than "
                         f"{_V1_SAME_ORDER_MAX}) this version no longer draws: resuming it "
                         f"would read other samples; start the epoch afresh (set_epoch)")
    for key in ("num_samples", "global_batch_size", "seed", "shuffle", "shuffle_buffer",
                "pad_last_batch", "drop_last", "shuffle_block", "shuffle_window"):
        if state.get(key) != ref.get(key):
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
