"""Batches of samples, sharded and shuffled, read ahead on a native thread."""
import collections
import os
import threading
import weakref

import numpy as np

from fastread import _defaults
from fastread._core import ORDER_TABLE_MAX
from fastread.dense import dense_batch, dense_layout
from fastread.engine import EngineOptions, warn_if_few_fds
from fastread.errors import ReadError
from fastread.files import raise_failures, s3_detail
from fastread.image import PackedImage
from fastread.sampling import (EpochOrder, check_flag, check_global_batch, check_shard_args,
                               check_shuffle, elastic_resume, elastic_state)
from fastread.s3 import take_options as take_s3_options
from fastread.source import FileList, check_source, open_native_reader


#: Where a reader delivers its batches: host memory or GPU memory.
DEVICES = ("cpu", "gpu")


def check_device(device):
    """``device`` if it is one of :data:`DEVICES`, else ValueError: the one
    parser of the readers' ``device=`` argument. :class:`Reader` and each
    DALI reader's entry point call it once; what they call gets the result."""
    if device not in DEVICES:
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    return device


class Reader:
    """Iterates over ``(arrays, labels)`` batches, one epoch per ``iter()``.

    ``arrays`` is a list of uint8 NumPy arrays (the files' bytes), ``labels``
    an int32 array. Samples, labels and shards are those of DALI's
    ``fn.readers.file`` for the same arguments; with ``random_shuffle`` every
    rank draws the same permutation for a given ``seed`` and epoch, a new one
    each epoch, and takes its shard of it. ``stick_to_shard=False`` moves
    each rank to the next shard every epoch, as DALI's readers do by default.
    ``shuffle_buffer=N`` shuffles instead through a buffer of N samples read
    in order (:func:`fastread.sampling.epoch_indices`), like DALI's
    ``initial_fill``: cheaper for formats of many shards, less random.
    ``random_shuffle="block"`` permutes blocks of ``shuffle_block``
    consecutive samples and the samples within windows of
    ``shuffle_window`` blocks (:func:`fastread.sampling.check_shuffle`):
    runs of neighbouring samples (a shard's range, one large read in object
    storage) at any size, where a full shuffle reads each sample alone.
    The order is computed a batch at a time (``fr_order``: no N-element
    array), and an epoch's batches are queued only as far ahead as
    ``prefetch`` reads them: a shuffled epoch of 10^8 samples starts in
    the time of its first batch.

    Elastic sharding (``global_batch_size=G``): every epoch's order of the
    whole data set (by ``seed`` and epoch, whatever the world size) is cut
    into global batches of G samples, and rank ``shard_id`` of
    ``num_shards`` reads slice ``shard_id`` of each, batches of
    ``G // num_shards`` samples (``batch_size`` may be left out; G must be a
    multiple of ``num_shards``). ``state_dict()`` (the epoch and the global
    batches consumed) then resumes at any world size that divides G, with
    every sample of the epoch not yet read read once; with neither
    ``pad_last_batch`` nor ``drop_last`` and a partial last global batch of
    R samples, at most R ranks (:func:`fastread.sampling.elastic_world_sizes`;
    :func:`fastread.sampling.elastic_indices`; docs/elastic.md).

    ``workers`` native threads (each with its own engine context) read up to
    ``prefetch`` batches ahead, delivered in order. By default a
    batch's memory is reused only after every array of it is gone, so arrays
    are never overwritten while reachable; ``ring_depth=N`` instead caps
    memory at ``N + prefetch + workers`` batches: a batch's arrays stay valid until
    N more batches have been returned, after which their bytes may change.

    The samples: ``file_root`` / ``file_list`` / ``files`` (+ ``labels``) /
    ``file_filters`` as in ``fn.readers.file``; or ``image=`` (a path or a
    :class:`fastread.PackedImage`; ``index=`` names its index if not
    ``<image>.index``), the samples of a packed image read with block-level
    range reads (``o_direct=True`` for O_DIRECT), with the same epochs,
    shards and shuffles as the directory that was packed; or ``source=``,
    any :class:`fastread.SampleSource` (a :class:`fastread.FileList`, a
    packed image, :class:`fastread.FileRanges`, or one of your own).

    Engine options: ``options=`` (a :class:`fastread.EngineOptions` or a
    mapping of option names) and/or the options as keyword arguments
    (``queue_depth=``, ``o_direct=``, ...); unset ones come from
    :mod:`fastread._defaults` (environment variables).

    ``device="gpu"`` delivers every batch in GPU memory (``device_id``, else
    FASTREAD_DEVICE_ID): the native worker copies the batch's contiguous,
    page-locked arena to the device in one copy and finishes it before the
    batch is handed out; ``arrays`` are then :class:`fastread.DeviceArray`
    objects (``__cuda_array_interface__``: CuPy, PyTorch and DALI take them
    without a copy). The ``cufile`` engine reads into GPU memory itself.
    ``device_id`` with ``device="cpu"`` pins the host arenas only, for
    copies the caller makes.

    ``dense=True`` yields each batch's samples as one array
    ``(N, ...)`` instead of a list: the arena as the engine wrote it, no
    per-sample objects (:mod:`fastread.dense`); with ``device="gpu"`` one
    :class:`fastread.DeviceArray` over the batch's device buffer. The shape is a decoded packed
    image's one sample shape (``fastread pack --decode --crop``), else
    ``(nbytes,)`` for samples of one byte size; ``dense=(d0, d1, ...)``
    gives the bytes that shape. A sample of another size raises ValueError
    naming it.
    """

    def __init__(self, file_root=None, *, file_list=None, files=None, labels=None,
                 file_filters=None, image=None, index=None, source=None, batch_size=None,
                 shard_id=0, num_shards=1, random_shuffle=False, seed=0, pad_last_batch=False,
                 drop_last=False, stick_to_shard=True, prefetch=None, workers=None,
                 engine="auto", ring_depth=None, device="cpu", options=None, shuffle_buffer=0,
                 global_batch_size=None, dense=False, shuffle_block=None, shuffle_window=None,
                 max_open_files=None, **engine_options):
        if global_batch_size is not None:
            shard_id, num_shards = check_shard_args(shard_id, num_shards)
            local = check_global_batch(global_batch_size, num_shards)
            if batch_size is not None and batch_size != local:
                raise ValueError(f"batch_size={batch_size!r} does not match global_batch_size="
                                 f"{global_batch_size} over num_shards={num_shards} ranks "
                                 f"(each rank reads {local}): leave batch_size out")
            if not stick_to_shard:
                raise ValueError("stick_to_shard=False does not apply with global_batch_size "
                                 "(elastic sharding: each epoch's global order is new, and every "
                                 "rank takes its slice of each global batch)")
            batch_size = local
        elif batch_size is None:
            batch_size = 64
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if pad_last_batch and drop_last:
            raise ValueError("pad_last_batch and drop_last exclude each other")
        for name, flag in (("pad_last_batch", pad_last_batch),
                           ("drop_last", drop_last), ("stick_to_shard", stick_to_shard)):
            check_flag(name, flag)
        self.shuffle_mode, self.shuffle_block, self.shuffle_window = check_shuffle(
            random_shuffle, shuffle_block, shuffle_window, option="random_shuffle")
        if ring_depth is not None and (not isinstance(ring_depth, int) or
                                       isinstance(ring_depth, bool) or ring_depth < 1):
            raise ValueError(f"ring_depth must be None or an integer >= 1, got {ring_depth!r}")
        check_device(device)
        # S3 options as flat keywords too (endpoint_url=, ...), as fastread.s3 takes them.
        opts = EngineOptions.coerce(options, **take_s3_options(engine_options))
        if device == "gpu":
            opts = opts.replace(device_output=True)
        self.source = _source(file_root, file_list=file_list, files=files, labels=labels,
                              file_filters=file_filters, image=image, index=index, source=source,
                              s3=opts.s3)
        self.labels = check_source(self.source)
        if max_open_files is not None:
            # Sources of ranges of many files (MultiFileRanges: WebDataset,
            # Squirrel, CIFAR) keep at most this many descriptors open.
            if not hasattr(self.source, "max_open_files"):
                raise TypeError(f"max_open_files applies to sources of ranges of many files "
                                f"(WebDataset, Squirrel, ...), not {self.source!r}")
            self.source.max_open_files = max_open_files
        self.dense = dense_layout(self.source, dense)
        # Names of the samples (paths, or names inside an image), for len() and errors.
        self.paths = self.source.names
        self.batch_size = batch_size
        self.shard_id, self.num_shards = shard_id, num_shards
        self.random_shuffle, self.seed = self.shuffle_mode is not None, seed
        if not isinstance(shuffle_buffer, int) or isinstance(shuffle_buffer, bool) or \
                shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be an integer >= 0, got {shuffle_buffer!r}")
        self.shuffle_buffer = shuffle_buffer
        if shuffle_buffer and self.shuffle_mode == "block":
            raise ValueError("shuffle_buffer and random_shuffle='block' exclude each other: "
                             "choose one way to keep a batch's samples near each other")
        self.pad_last_batch, self.drop_last = bool(pad_last_batch), bool(drop_last)
        self.stick_to_shard = bool(stick_to_shard)
        self.global_batch_size = None if global_batch_size is None else int(global_batch_size)
        self.ring_depth = ring_depth
        self.device = device
        # Validates shard_id/num_shards before any thread starts.
        self._epoch_order(0)
        self.options = opts
        opened = open_native_reader(self.source, engine, opts, prefetch=prefetch, workers=workers,
                                    in_order=not self.random_shuffle or self.shuffle_buffer > 0)
        # Batches queued ahead of the one being taken: what the native
        # reader reads ahead (prefetch) and its workers hold, and one more.
        self._ahead = (_defaults.get("prefetch") if prefetch is None else prefetch) + \
            opened.workers + 1
        if not self.source.reads_ranges:
            warn_if_few_fds(opened.workers, batch_size)
        self.engine, self.workers, self._native = opened.engine, opened.workers, opened.native
        if self.dense is not None:
            self._native.set_dense(True)
        self.device_id = opened.options["device_id"]
        self._ring = collections.deque()
        self._held = []  # a batch taken from the native reader, not yet returned (_next_batch)
        self.epoch = 0
        self._start_batch = 0
        # [epoch, batches taken] of the epoch last started by iter() (None:
        # none since set_epoch): what state_dict() reports.
        self._position = None
        # The epoch being iterated: its iterator's token and the thread that
        # started it; _pending: the native reader holds batches of an epoch
        # not read to its end (the next iter() must reset it).
        self._active = None
        self._owner = None
        self._pending = False
        # Held around every call into the native reader; never waited for by
        # an iteration (a second thread gets RuntimeError), only by close().
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._forked = False
        _LIVE.add(self)

    # -- sizes ---------------------------------------------------------------
    def _epoch_shard(self, epoch):
        """The shard read in ``epoch``: ``shard_id``, or with
        ``stick_to_shard=False`` the next one each epoch (DALI's readers)."""
        return self.shard_id if self.stick_to_shard else (self.shard_id + epoch) % self.num_shards

    def _epoch_order(self, epoch, shuffle=None, start_batch=0):
        """The indices read in ``epoch`` from batch ``start_batch`` on (a
        lazy :class:`fastread.sampling.EpochOrder`). ``shuffle=False``
        gives the same length without drawing the order (for sizes only)."""
        shuffle = self.shuffle_mode or False if shuffle is None else shuffle
        block = dict(shuffle_block=self.shuffle_block or None,
                     shuffle_window=self.shuffle_window or None) if shuffle == "block" else {}
        if self.global_batch_size is not None:
            return EpochOrder(len(self.paths), global_batch_size=self.global_batch_size,
                              shard_id=self.shard_id, num_shards=self.num_shards,
                              shuffle=shuffle, seed=self.seed, epoch=epoch,
                              pad_last_batch=self.pad_last_batch, drop_last=self.drop_last,
                              shuffle_buffer=self.shuffle_buffer, start_batch=start_batch,
                              **block)
        return EpochOrder(len(self.paths), shard_id=self._epoch_shard(epoch),
                          num_shards=self.num_shards, shuffle=shuffle, seed=self.seed,
                          epoch=epoch, pad_last_batch=self.pad_last_batch,
                          batch_size=self.batch_size, drop_last=self.drop_last,
                          shuffle_buffer=self.shuffle_buffer, start_batch=start_batch, **block)

    def epoch_samples(self, epoch):
        """Samples this shard yields in ``epoch`` (padding included). With
        ``stick_to_shard=False`` epochs read different shards, which may
        differ by one sample."""
        return len(self._epoch_order(epoch, shuffle=False))

    def epoch_batches(self, epoch):
        """Batches this shard yields in ``epoch`` (see :meth:`epoch_samples`)."""
        n = self.epoch_samples(epoch)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _current_epoch(self):
        # The epoch last started by iter(), else the one the next iter() reads.
        return self._position[0] if self._position is not None else self.epoch

    def __len__(self):
        """Batches in the current epoch of this shard: the epoch last
        started by iter(), else (before any, or after set_epoch) the one the
        next iter() reads. Epochs may differ by a batch with
        ``stick_to_shard=False``: :meth:`epoch_batches` gives any epoch's."""
        return self.epoch_batches(self._current_epoch())

    @property
    def num_samples(self):
        """Samples this shard yields in the current epoch (as :meth:`__len__`
        chooses it; padding included)."""
        return self.epoch_samples(self._current_epoch())

    def set_epoch(self, epoch, start_batch=0):
        """Chooses the epoch the next iter() reads (its shuffle and shard),
        starting at batch ``start_batch`` of it (to resume mid-epoch)."""
        for name, v in (("epoch", epoch), ("start_batch", start_batch)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        batches = self.epoch_batches(int(epoch))
        if start_batch > batches:
            raise ValueError(f"start_batch={start_batch} is past the end of epoch {epoch} "
                             f"({batches} batches)")
        self.epoch = int(epoch)
        self._start_batch = int(start_batch)
        self._position = None

    # -- resumable position --------------------------------------------------
    def position(self):
        """``(epoch, batches)``: where the next batch delivered comes from
        (batch ``batches`` of ``epoch``; a finished epoch is ``(e + 1, 0)``).
        Batches that failed (ReadError) count as delivered."""
        if self._position is None:
            return self.epoch, self._start_batch
        epoch, taken = self._position
        return (epoch + 1, 0) if taken >= self.epoch_batches(epoch) else (epoch, taken)

    def state_dict(self, epoch=None, batches=None):
        """The reader's position (:meth:`position`, or ``epoch`` /
        ``batches`` given, e.g. the batches a pipeline reading ahead of the
        training loop has really delivered) as a plain dict for
        :meth:`load_state_dict`. Elastic (``global_batch_size``): the epoch
        and the samples of its global order consumed by all ranks, which
        a reader at another world size resumes
        (:func:`fastread.sampling.elastic_state`); otherwise the epoch and
        batches of this shard, which only a reader of the same shard
        layout resumes."""
        at_epoch, at_batch = self.position()
        epoch = at_epoch if epoch is None else epoch
        batches = at_batch if batches is None else batches
        for name, v in (("epoch", epoch), ("batches", batches)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.global_batch_size is not None:
            return elastic_state(epoch=epoch, batches=batches, **self._elastic_args())
        state = {"epoch": int(epoch), "batches_delivered": int(batches),
                 "num_samples": len(self.paths), "batch_size": self.batch_size,
                 "seed": self.seed,
                 "shuffle": "block" if self.shuffle_mode == "block" else self.random_shuffle,
                 "shard_id": self.shard_id, "num_shards": self.num_shards,
                 "order": _PLAIN_ORDER_VERSION}
        if self.shuffle_mode == "block":
            state["shuffle_block"], state["shuffle_window"] = self.shuffle_block, \
                self.shuffle_window
        return state

    def load_state_dict(self, state):
        """Continues from ``state`` (:meth:`state_dict`): the next iter()
        reads the rest of its epoch. ValueError if it was taken by a reader
        whose order differs (another data set, seed, shuffle; elastic: global
        batch or tail policy; otherwise: batch size or shard layout)."""
        self.set_epoch(*self.resume_position(state))

    #: What a plain (not elastic) state_dict must match to be resumed here.
    _PLAIN_STATE_KEYS = ("num_samples", "batch_size", "seed", "shuffle", "shard_id",
                         "num_shards")

    def resume_position(self, state, *, owner="reader", optional=()):
        """``(epoch, batches)`` that ``state`` (:meth:`state_dict`, or a
        loader's built on this reader) continues from, checked against this
        reader's order; ValueError naming the first argument that differs.
        ``owner`` names what took the state in messages; ``optional``: keys
        a plain state may lack (taken before they were recorded), accepted
        as unknown. The one check of plain states: the torch loaders call
        it too."""
        if self.global_batch_size is not None:
            return elastic_resume(state, **self._elastic_args())
        if not isinstance(state, dict):
            raise ValueError(f"state_dict must be a dict (a {owner}'s state_dict()), got "
                             f"{type(state).__name__}")
        if "elastic" in state:
            raise ValueError(f"state_dict was taken by an elastic {owner} (global_batch_size="
                             f"{state.get('global_batch_size')!r}): give this {owner} the "
                             "same global_batch_size to resume it")
        mine = self.state_dict(0, 0)
        for key in self._PLAIN_STATE_KEYS + ("shuffle_block", "shuffle_window"):
            if key in optional and key not in state:
                continue
            if state.get(key) != mine.get(key):
                raise ValueError(f"state_dict was taken with {key}={state.get(key)!r}, this "
                                 f"{owner} has {key}={mine.get(key)!r}")
        if state.get("order", 1) < _PLAIN_ORDER_VERSION and self.random_shuffle and \
                not self.shuffle_buffer and len(self.paths) > ORDER_TABLE_MAX:
            raise ValueError(f"state_dict was taken by an earlier fastread, whose shuffled order "
                             f"of {len(self.paths)} samples (more than {ORDER_TABLE_MAX}) "
                             f"this version no longer draws: resuming it would read other "
                             f"samples; start the epoch afresh (set_epoch)")
        return state["epoch"], state["batches_delivered"]

    def _elastic_args(self):
        block = dict(shuffle_block=self.shuffle_block,
                     shuffle_window=self.shuffle_window) if self.shuffle_mode == "block" else {}
        return dict(num_samples=len(self.paths), global_batch_size=self.global_batch_size,
                    seed=self.seed, shuffle=self.shuffle_mode or False,
                    shuffle_buffer=self.shuffle_buffer if self.random_shuffle else 0,
                    pad_last_batch=self.pad_last_batch, drop_last=self.drop_last, **block)

    # -- iteration -----------------------------------------------------------
    # Contract: a Reader serves one iteration at a time. A new iter() from the
    # thread that started the current epoch ends that epoch (its iterator
    # stops); iter() from another thread while an epoch is unfinished, and any
    # two calls that overlap in time from different threads, raise
    # RuntimeError: give each thread its own Reader (e.g. its own shard).
    # Handing an iterator to another thread and using it there is fine.
    def _check_open(self):
        if self._forked:
            raise RuntimeError(f"this Reader was opened in process {self._pid} and cannot be used "
                               f"after fork() (pid {os.getpid()}): its native threads stay in the "
                               "parent; build a new Reader in the child")
        if self._native is None:
            raise ValueError("reader is closed")

    def _enter(self, what):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(f"Reader.{what} called while another thread is using this Reader: "
                               "a Reader is iterated by one thread at a time (give each thread "
                               "its own Reader, e.g. its own shard_id)")
        try:
            self._check_open()
        except BaseException:
            self._lock.release()
            raise

    def __iter__(self):
        self._enter("__iter__()")
        try:
            if self._active is not None and self._owner != threading.get_ident():
                raise RuntimeError("Reader.__iter__() called while another thread is iterating "
                                   "this Reader (its epoch is unfinished): a Reader is iterated "
                                   "by one thread at a time (give each thread its own Reader, "
                                   "e.g. its own shard_id)")
            if self._pending:
                self._native.reset()  # abandon the unfinished epoch's read-ahead
                self._held.clear()
                self._pending = False
            order = self._epoch_order(self.epoch, start_batch=self._start_batch)
            self._position = [self.epoch, self._start_batch]
            self.epoch += 1
            self._start_batch = 0
            feed = _Feed(order, self.batch_size)
            try:
                feed.top_up(self._native, self._ahead)
            finally:
                self._pending = True
            token = object()
            self._active, self._owner = token, threading.get_ident()
        finally:
            self._lock.release()
        return self._iterate(token, feed)

    def _iterate(self, token, feed):
        return _Epoch(self, token, feed)

    def _took_batch(self, token):
        if self._active is token and self._position is not None:
            self._position[1] += 1

    def _next_batch(self):
        """The next batch's (arrays, labels), its batch left in _held for the
        caller to drop once nothing can interrupt it any more (_Epoch).

        The batch is in _held from the native call that takes it (next_into,
        where the native reader has it) until then: a KeyboardInterrupt in
        between (while its arrays are made) leaves it for the next call
        rather than losing it."""
        held = self._held
        if not held:
            take = getattr(self._native, "next_into", None)
            if take is not None:
                got = take(held)
            else:
                batch = self._native.next()
                got = batch is not None
                if got:
                    held.append(batch)
            if not got:  # cannot happen while the contract above holds
                raise RuntimeError("Reader: no batch queued (the epoch was reset by another "
                                   "caller)")
        batch = held[0]
        idx = batch.indices()
        try:
            raise_failures(batch, lambda i: self.source.sample_name(int(idx[i])),
                           paths=isinstance(self.source, FileList),
                           # Objects only: a range sample's name (shard.tar[key])
                           # is no object, and reading it said "404 NoSuchKey".
                           detail_of=(lambda url: s3_detail(self.options, url))
                           if self.engine == "s3" and isinstance(self.source, FileList)
                           else getattr(self.source, "failure_detail", None))
        except ReadError:
            held.clear()  # a failed batch is used up
            raise
        if self.dense is not None:
            arrays = dense_batch(batch, self.dense, lambda i: self.source.sample_name(int(idx[i])),
                                 self.device_id if self.device == "gpu" else None)
        elif self.device == "gpu":
            arrays = batch.device_arrays(self.device_id)
        else:
            arrays = batch.arrays()
        own = getattr(self.source, "batch_labels", None)
        labels = own(batch, idx) if own is not None else self.labels[idx]
        if self.ring_depth is not None:
            if not self._ring or self._ring[-1] is not batch:
                self._ring.append(batch)
            while len(self._ring) > self.ring_depth:
                self._ring.popleft().release()
        return arrays, labels

    def stats(self):
        """Counters summed over the reader's native threads, as of their last
        finished batch: the object cache's (``cache_hits``, ``cache_misses``,
        ``cache_damaged``, ``cache_bytes_written``, ``cache_write_errors``,
        ``cache_evictions``, ``cache_waits``: see ``cache_dir``), the s3
        engine's ``s3_requests`` and ``s3_bytes`` (0 where the engine has no
        such counter), the cql engine's ``cql_requests``, ``cql_retries``,
        ``cql_bytes`` and ``cql_inflight_max`` (each thread's peak of
        requests in flight, summed), and ``file_calls`` (batches read).
        Empty once closed."""
        with self._lock:
            return {} if self._native is None else self._native.stats()

    # -- lifetime ------------------------------------------------------------
    def close(self):
        """Stops the native threads (waiting for a batch another thread is
        reading). Arrays already returned stay valid; closing twice is fine."""
        with self._lock:
            if self._native is not None:
                self._native.close()
                self._native = None
            self._ring.clear()
            self._held.clear()
            self._active, self._owner, self._pending = None, None, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def memory(self):
        """What this reader holds: ``batches`` allocated by its pool so far
        (at most prefetch + workers + the ones the caller holds), their idle
        arena bytes (``idle_bytes``, ``idle_device_bytes``), and the engine's
        own buffers beyond the arenas, summed over the native threads as of
        their last batch: ``engine_buffer_bytes`` now and
        ``engine_buffer_bytes_max`` at most (the s3 engine: per request in
        flight its libcurl receive buffer, plus the first bytes of objects
        of unknown size until a batch is laid out; 0 for file engines). All
        of it is bounded by the options, not by the data set: flat from epoch
        to epoch. Sources with an index of their own (WebDataset) add it:
        ``index_bytes`` (its columns and numbering, which do grow with the
        data set; those mapped from an index file count in full) and the
        rest of what ``source.index_bytes()`` says."""
        self._check_open()
        # Sources served from memory (formats.in_memory) have no engine.
        stat = getattr(self._native, "stat", lambda key: 0)
        out = {"batches": self._native.pool_batches(), "idle_bytes": self._native.pool_idle_bytes(),
               "idle_device_bytes": self._native.pool_idle_device_bytes(),
               "engine_buffer_bytes": max(0, stat("s3_buffer_bytes")),
               "engine_buffer_bytes_max": max(0, stat("s3_buffer_bytes_max"))}
        index_bytes = getattr(self.source, "index_bytes", None)
        if index_bytes is not None:
            out.update(index_bytes())
        return out


class _Feed:
    """An epoch's batches, queued on the native reader as they are needed:
    at most ``ahead`` beyond the batches taken, each computed from the lazy
    order when it is queued."""

    def __init__(self, order, batch_size):
        self.order, self.batch_size = order, batch_size
        self.count = -(-len(order) // batch_size)
        self.submitted = 0

    def top_up(self, native, ahead, taken=0):
        while self.submitted < self.count and self.submitted - taken < ahead:
            native.submit(self.order.slice(self.submitted * self.batch_size, self.batch_size))
            self.submitted += 1


class _Epoch:
    """One epoch's iterator. A batch that fails raises ReadError and the
    epoch goes on: the next ``next()`` returns the following batch. Dropping
    the iterator (or reading it to its end) ends the epoch."""

    def __init__(self, reader, token, feed):
        self._reader, self._token, self._feed = reader, token, feed
        self._left = feed.count

    def __iter__(self):
        return self

    def __next__(self):
        r = self._reader
        if r is None:
            raise StopIteration
        r._enter("__next__()")
        try:
            if r._active is not self._token:  # a newer iter() in this thread
                self._finish(False)
                raise StopIteration
            if self._left == 0:
                self._finish(True)
                raise StopIteration
            # Native readers count the batches they hand out (``taken``);
            # sources with their own (e.g. several files') may not.
            taken = getattr(r._native, "taken", None)
            try:
                # Queue what the read-ahead needs beyond the batch taken now.
                self._feed.top_up(r._native, r._ahead, self._feed.count - self._left)
                out = r._next_batch()
            except BaseException:
                # A batch that failed is used up; a signal (KeyboardInterrupt)
                # while waiting for one, or while its arrays are made, leaves
                # it queued (or held) for the next call.
                if not r._held and (taken is None or
                                    (r._native is not None and r._native.taken != taken)):
                    self._left -= 1
                    r._took_batch(self._token)
                raise
        except BaseException:
            r._lock.release()
            raise
        # A signal is seen by Python only at a call (or a loop's jump): the
        # batch stays held across this last call, and leaves _held by a
        # statement that makes none, right before it is returned (a
        # KeyboardInterrupt at the release returns it on the next call).
        # The position (state_dict) counts it by statements too.
        r._lock.release()
        del r._held[0]
        self._left -= 1
        position = r._position
        if r._active is self._token and position is not None:
            position[1] += 1
        return out

    def _finish(self, complete):
        r, self._reader = self._reader, None
        if r is not None and r._active is self._token:
            if complete:
                r._pending = False
            r._active, r._owner = None, None

    def __del__(self):
        # Also when dropped before the epoch's end: another thread may then
        # start one (the next iter() resets what is still read ahead).
        r = self._reader
        if r is not None and r._active is self._token:
            r._active, r._owner = None, None


#: Version of the order a plain state_dict resumes (2: fr_order; before,
#: a Fisher-Yates table at every size, the same up to ORDER_TABLE_MAX).
_PLAIN_ORDER_VERSION = 2

# Readers alive in this process. A fork()ed child gets a copy of each whose
# native threads do not exist there: the child marks them unusable and keeps
# their native halves forever (closing one would join threads that are not
# there). The child builds its own Readers.
_LIVE = weakref.WeakSet()
_FORKED_NATIVE = []


def _after_fork_in_child():
    for r in list(_LIVE):
        if r._native is not None:
            _FORKED_NATIVE.append(r._native)
            r._native = None
            r._forked = True
        r._lock = threading.Lock()  # it may have been held by a parent thread
        # Batches held for ring_depth go back to a pool whose lock a parent
        # thread may have held at fork(): keep them too.
        _FORKED_NATIVE.append(r._ring)
        r._ring = collections.deque()
        _FORKED_NATIVE.append(r._held)
        r._held = []
        r._active, r._owner, r._pending = None, None, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _source(file_root, *, file_list, files, labels, file_filters, image, index, source, s3=None):
    """The SampleSource that Reader's sample arguments name (exactly one
    way: a tree or list of files, an image, or a source)."""
    given = [name for name, v in (("source", source), ("image", image)) if v is not None]
    files_given = [name for name, v in (("file_root", file_root), ("file_list", file_list),
                                        ("files", files)) if v is not None]
    if len(given) + bool(files_given) > 1:
        raise ValueError(f"{' and '.join(given + files_given)} exclude each other: choose the "
                         "samples one way (files, image= or source=)")
    if index is not None and image is None:
        raise ValueError("index= applies only with image=")
    if (labels is not None or file_filters is not None) and not files_given:
        raise ValueError("labels= and file_filters= apply only with file_root, file_list or files")
    if source is not None:
        return source
    if image is not None:
        return image if isinstance(image, PackedImage) else PackedImage(image, index, s3=s3)
    return FileList.scan(file_root, file_filters=file_filters, file_list=file_list, files=files,
                         labels=labels, s3=s3)
