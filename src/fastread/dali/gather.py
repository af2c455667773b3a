"""A DALI source of feature rows: ids in, rows out (GPU by default), through a
:class:`fastread.FeatureStore`.

::

    from nvidia.dali import pipeline_def
    from fastread import FeatureStore
    from fastread.dali.gather import gather

    store = FeatureStore("/data/feat.npy")

    @pipeline_def(batch_size=1024, num_threads=4, device_id=0)
    def pipe():
        rows, ids = gather(store, train_ids, random_shuffle=True, seed=0)
        return rows, ids

Every sample is one row (``store.row_shape``) and its id (int64, shape
``[1]``). ``ids`` is either

- an array of ids (NumPy, a list, torch or CuPy), read in batches of the
  pipeline's batch size, sharded (``shard_id``/``num_shards``) and
  optionally shuffled each epoch (the same permutation on every rank for a
  ``seed``); the epoch ends with the data (``last_batch_policy`` "PARTIAL"
  or "DROP"), so DALI iterators with ``size=-1`` stop there; or
- a callable returning an iterable of id batches (called once per epoch: a
  neighbour sampler, say); each batch may hold up to the pipeline's batch
  size ids (on the host or the GPU).

With ``device="gpu"`` the rows are gathered straight into GPU memory (the
store's backend: the HBM cache and GPU-initiated reads with "proxy", one
host-to-device copy with "host") on a private stream that DALI orders its
work after; DALI takes them without a copy, and each batch's memory is kept
until DALI's prefetch queue has moved past it. ``device="cpu"`` gathers to
host memory (no GPU needed).
"""
import collections

import numpy as np

_POLICIES = ("PARTIAL", "DROP")


class _IdBatches:
    """Id batches over an array: sharded, optionally shuffled per epoch."""

    def __init__(self, ids, batch_size, shard_id, num_shards, shuffle, seed, drop_last):
        from fastread import _devarrays as D

        self.ids = D.as_ids(ids).host_int64()
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id must be in 0..{num_shards - 1}, got {shard_id}")
        self.batch_size, self.shard_id, self.num_shards = batch_size, shard_id, num_shards
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def __call__(self):
        n = len(self.ids)
        order = (np.random.default_rng((self.seed, self.epoch)).permutation(n) if self.shuffle
                 else np.arange(n))
        self.epoch += 1
        lo, hi = n * self.shard_id // self.num_shards, n * (self.shard_id + 1) // self.num_shards
        mine = self.ids[order[lo:hi]]
        stop = len(mine) - len(mine) % self.batch_size if self.drop_last else len(mine)
        return (mine[i:i + self.batch_size] for i in range(0, stop, self.batch_size))


class _GatherSource:
    """What DALI pulls batches from. DALI calls iter() on a non-cycling
    source once and keeps calling next() after each reset, so the first
    next() after an epoch's StopIteration starts the next epoch."""

    def __init__(self, store, epochs, max_batch, device, device_id, keep):
        self.store, self.epochs, self.max_batch = store, epochs, max_batch
        self.gpu = device == "gpu"
        self.device_id = device_id
        self._it = None
        self._held = collections.deque(maxlen=keep)  # batches DALI may still read
        self.cuda_stream = None
        if self.gpu:
            from fastread import _devarrays as D

            self._lib = D.default_gpu_lib()
            if self._lib is None:
                raise RuntimeError("fastread.dali.gather(device='gpu') needs torch or CuPy")
            if self._lib == "torch":
                import torch
                self._stream = torch.cuda.Stream(device=device_id)
                self.cuda_stream = self._stream.cuda_stream
            else:
                import cupy
                with cupy.cuda.Device(device_id):
                    self._stream = cupy.cuda.Stream(non_blocking=True)
                self.cuda_stream = self._stream.ptr

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self.epochs())
        try:
            ids = next(self._it)
        except StopIteration:
            self._it = None
            raise
        from fastread import _devarrays as D

        ids = D.as_ids(ids)
        if len(ids.shape) != 1 or not 0 < ids.shape[0] <= self.max_batch:
            raise ValueError(f"fastread.dali.gather: an id batch must be 1-D with 1 to "
                             f"{self.max_batch} ids (the pipeline's batch size), got shape "
                             f"{ids.shape}")
        if not self.gpu:
            rows = self.store.gather(ids.array, device="cpu")
            host_ids = ids.host_int64().reshape(-1, 1)
            return np.asarray(rows), host_ids
        if self._lib == "torch":
            import torch
            with torch.cuda.stream(self._stream):
                d_ids = torch.as_tensor(ids.array, device=f"cuda:{self.device_id}")
                rows = self.store.gather(d_ids, device=f"cuda:{self.device_id}",
                                         stream=self._stream)
                out_ids = d_ids.to(torch.int64).reshape(-1, 1)
        else:
            import cupy
            with cupy.cuda.Device(self.device_id), self._stream:
                d_ids = cupy.asarray(ids.array)
                rows = self.store.gather(d_ids, device=f"cuda:{self.device_id}",
                                         stream=self._stream)
                out_ids = d_ids.astype(cupy.int64).reshape(-1, 1)
            self._stream.synchronize()
        if self._lib == "torch":
            self._stream.synchronize()  # the ids' cast and copy, too
        self._held.append((rows, out_ids))
        return rows, out_ids


def gather(store, ids, *, device="gpu", device_id=None, shard_id=0, num_shards=1,
           random_shuffle=False, seed=0, last_batch_policy="PARTIAL"):
    """``(rows, ids)`` DataNodes of the current pipeline: feature rows of
    ``store`` (a :class:`fastread.FeatureStore`) for batches of ``ids`` (see
    the module's text). ``device``: "gpu" (the pipeline's ``device_id``
    unless given; it must be the store's) or "cpu"."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    pipe = Pipeline.current()
    if pipe is None:
        raise RuntimeError("fastread.dali.gather must be called inside a DALI pipeline "
                           "definition (@pipeline_def or `with pipe:`)")
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    policy = str(getattr(last_batch_policy, "name", last_batch_policy)).upper()
    if policy not in _POLICIES:
        raise ValueError(f"last_batch_policy must be one of {', '.join(_POLICIES)}, got "
                         f"{last_batch_policy!r}")
    batch = pipe.max_batch_size
    if device == "gpu":
        device_id = pipe.device_id if device_id is None else device_id
        if device_id is None:
            raise ValueError("device='gpu' needs a pipeline with a device_id (or device_id=)")
        if store.device_id != device_id:
            raise ValueError(f"feature store {store.path!r} serves GPU {store.device_id} "
                             f"(device_id={store.device_id}); the pipeline runs on GPU {device_id}")
    if callable(ids):
        epochs = ids
    else:
        epochs = _IdBatches(ids, batch, shard_id, num_shards, random_shuffle, seed,
                            policy == "DROP")
    depth = getattr(pipe, "prefetch_queue_depth", 2)
    if isinstance(depth, dict):
        depth = int(depth.get("cpu_size", 2)) + int(depth.get("gpu_size", 2))
    source = _GatherSource(store, epochs, batch, device, device_id, keep=int(depth) + 2)
    rows, out_ids = fn.external_source(
        source=source, num_outputs=2, batch=True, cycle=False, device=device,
        no_copy=device == "gpu", cuda_stream=source.cuda_stream)
    sources = getattr(pipe, "_fastread_gather_sources", None)
    if sources is None:
        sources = pipe._fastread_gather_sources = []
    sources.append(source)  # lives as long as the pipeline
    return rows, out_ids
