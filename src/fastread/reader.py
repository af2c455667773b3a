"""Batches of samples, sharded and shuffled, read ahead on a native thread."""
import collections

from fastread import _core, _defaults
from fastread.engine import RANGE_ONLY, options, resolve
from fastread.files import raise_failures
from fastread.index import epoch_indices, scan


class Reader:
    """Iterates over ``(arrays, labels)`` batches, one epoch per ``iter()``.

    ``arrays`` is a list of uint8 NumPy arrays (the files' bytes), ``labels``
    an int32 array. Samples, labels and shards are those of DALI's
    ``fn.readers.file`` for the same arguments; with ``random_shuffle`` every
    rank draws the same permutation for a given ``seed`` and epoch, a new one
    each epoch, and takes its shard of it. ``stick_to_shard=False`` moves
    each rank to the next shard every epoch, as DALI's readers do by default.

    ``workers`` native threads (each with its own engine context) read up to
    ``prefetch`` batches ahead, delivered in order. By default a
    batch's memory is reused only after every array of it is gone, so arrays
    are never overwritten while reachable; ``ring_depth=N`` instead caps
    memory at ``N + prefetch + 1`` batches: a batch's arrays stay valid until
    N more batches have been returned, after which their bytes may change.

    ``image=`` (a path or a :class:`fastread.PackedImage`; ``index=`` names
    its index if not ``<image>.index``) reads the samples of a packed image
    instead of files, with block-level range reads (``o_direct=True`` for
    O_DIRECT); the epochs, shards and shuffles are the same as for the
    directory that was packed.

    ``device="gpu"`` delivers every batch in GPU memory (``device_id``, else
    FASTREAD_DEVICE_ID): the native worker copies the batch's contiguous,
    page-locked arena to the device in one copy and finishes it before the
    batch is handed out; ``arrays`` are then :class:`fastread.DeviceArray`
    objects (``__cuda_array_interface__``: CuPy, PyTorch and DALI take them
    without a copy). The ``cufile`` engine reads into GPU memory itself.
    ``device_id`` with ``device="cpu"`` pins the host arenas only, for
    copies the caller makes.
    """

    def __init__(self, file_root=None, *, file_list=None, files=None, labels=None,
                 file_filters=None, image=None, index=None, batch_size=64, shard_id=0,
                 num_shards=1,
                 random_shuffle=False, seed=0, pad_last_batch=False, drop_last=False,
                 stick_to_shard=True,
                 prefetch=None, workers=None, engine="auto", ring_depth=None, device="cpu",
                 **engine_options):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if pad_last_batch and drop_last:
            raise ValueError("pad_last_batch and drop_last exclude each other")
        prefetch = _defaults.get("prefetch") if prefetch is None else prefetch
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        if ring_depth is not None and (not isinstance(ring_depth, int) or ring_depth < 1):
            raise ValueError(f"ring_depth must be None or an integer >= 1, got {ring_depth!r}")
        self.image = None
        if image is not None:
            if file_root is not None or file_list is not None or files is not None:
                raise ValueError("image= excludes file_root, file_list and files")
            from fastread.image import PackedImage
            self.image = image if isinstance(image, PackedImage) else PackedImage(image, index)
            # Names of the samples (paths relative to the packed root), for len() and errors.
            self.paths, self.labels = self.image.names, self.image.labels
        else:
            if index is not None:
                raise ValueError("index= applies only with image=")
            self.paths, self.labels = scan(file_root, file_filters=file_filters,
                                           file_list=file_list, files=files, labels=labels)
        self.batch_size = batch_size
        self.shard_id, self.num_shards = shard_id, num_shards
        self.random_shuffle, self.seed = bool(random_shuffle), seed
        self.pad_last_batch, self.drop_last = bool(pad_last_batch), bool(drop_last)
        self.stick_to_shard = bool(stick_to_shard)
        self.ring_depth = ring_depth
        self.engine = resolve(engine)
        if self.image is None and self.engine in RANGE_ONLY:
            raise ValueError(f"engine {self.engine!r} reads ranges of one image or device only; "
                             f"give image= or choose a file engine (e.g. 'auto')")
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        if device == "gpu":
            engine_options["device_output"] = True
        self._engine_options = options(self.engine, **engine_options)
        self.device = device
        self.device_id = self._engine_options["device_id"]
        # Validates shard_id/num_shards now rather than at the first epoch.
        self._epoch_order(0)
        self.workers = _defaults.reader_workers(workers)
        if self.image is not None:
            self.image.check_engine_options(self._engine_options)
            self._native = _core.NativeReader(None, self.engine, prefetch=prefetch,
                                              workers=self.workers, image=self.image.path,
                                              offsets=self.image.offsets,
                                              lengths=self.image.lengths,
                                              **self._engine_options)
            self._name = self.image.sample_name
        else:
            self._native = _core.NativeReader(self.paths, self.engine, prefetch=prefetch,
                                              workers=self.workers, **self._engine_options)
            self._name = self.paths.__getitem__
        self._ring = collections.deque()
        self.epoch = 0
        self._start_batch = 0
        self._active = None

    # -- sizes ---------------------------------------------------------------
    def _epoch_order(self, epoch):
        shard = self.shard_id if self.stick_to_shard else (self.shard_id + epoch) % self.num_shards
        return epoch_indices(len(self.paths), shard_id=shard, num_shards=self.num_shards,
                             shuffle=self.random_shuffle, seed=self.seed, epoch=epoch,
                             pad_last_batch=self.pad_last_batch, batch_size=self.batch_size,
                             drop_last=self.drop_last)

    def __len__(self):
        """Batches in one epoch of this shard."""
        n = len(self._epoch_order(0))
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_samples(self):
        """Samples this shard yields per epoch (padding included)."""
        return len(self._epoch_order(0))

    def set_epoch(self, epoch, start_batch=0):
        """Chooses the epoch the next iter() reads (its shuffle and shard),
        starting at batch ``start_batch`` of it (to resume mid-epoch)."""
        if int(epoch) < 0 or int(start_batch) < 0:
            raise ValueError(f"epoch and start_batch must be >= 0, got {epoch}, {start_batch}")
        self.epoch = int(epoch)
        self._start_batch = int(start_batch)

    # -- iteration -----------------------------------------------------------
    def __iter__(self):
        if self._native is None:
            raise ValueError("reader is closed")
        if self._active is not None:
            self._native.reset()  # abandon the unfinished epoch's read-ahead
        order = self._epoch_order(self.epoch)
        self.epoch += 1
        start, self._start_batch = self._start_batch * self.batch_size, 0
        batches = [order[i:i + self.batch_size] for i in range(start, len(order), self.batch_size)]
        for idx in batches:
            self._native.submit(idx)
        self._active = object()
        return self._iterate(self._active, len(batches))

    def _iterate(self, token, count):
        for _ in range(count):
            if self._active is not token:
                return
            yield self._next_batch()
        if self._active is token:
            self._active = None

    def _next_batch(self):
        batch = self._native.next()
        idx = batch.indices()
        raise_failures(batch, lambda i: self._name(int(idx[i])))
        arrays = batch.device_arrays(self.device_id) if self.device == "gpu" else batch.arrays()
        if self.ring_depth is not None:
            self._ring.append(batch)
            while len(self._ring) > self.ring_depth:
                self._ring.popleft().release()
        return arrays, self.labels[idx]

    # -- lifetime ------------------------------------------------------------
    def close(self):
        """Stops the native thread. Arrays already returned stay valid."""
        if self._native is not None:
            self._native.close()
            self._native = None
        self._ring.clear()
        self._active = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def memory(self):
        """Batches allocated by this reader's pool so far, and idle arena bytes."""
        return {"batches": self._native.pool_batches(), "idle_bytes": self._native.pool_idle_bytes(),
                "idle_device_bytes": self._native.pool_idle_device_bytes()}
