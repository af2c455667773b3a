"""PyTorch iterators over the record formats: batches as torch tensors, read
by fastread's native readers (no DALI needed).

::

    from fastread.torch import Cifar10Loader

    loader = Cifar10Loader("/data/cifar10", batch_size=256, random_shuffle=True,
                           augment=True, device="cuda")
    for epoch in range(30):
        loader.set_epoch(epoch)
        for images, labels in loader:     # float32 NCHW normalized; int64 labels
            ...

Shards come from torchrun's environment (RANK, WORLD_SIZE; LOCAL_RANK picks
the GPU) unless given; ``state_dict()`` taken mid-epoch and loaded into a
new loader resumes with exactly the batches that epoch had not delivered.
"""

import numpy as np

from fastread._defaults import node_env
from fastread.formats.cifar import Cifar10, to_chw, to_hwc
from fastread.formats.in_memory import InMemory
from fastread.reader import Reader

__all__ = ["Cifar10Loader", "WebDatasetLoader", "SquirrelLoader", "CIFAR10_MEAN", "CIFAR10_STD",
           "augment_batch"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def augment_batch(images, generator=None, pad=4, mean=CIFAR10_MEAN, std=CIFAR10_STD):
    """The usual CIFAR training transform on a whole batch at once, on the
    batch's device: ``images`` uint8 NHWC -> random ``pad``-pixel crop
    (zero padding), random horizontal flip, float32 NCHW normalized by
    ``mean`` / ``std`` (fractions of 255). The random draws come from
    ``generator`` on its own device (None: the default generator of the
    images' device); crop and flip are one ``torch.gather`` of pixel indices
    built on the images' device (no per-image loop)."""
    return _augment_chw(images.permute(0, 3, 1, 2), generator, pad, mean, std)


def _augment_chw(x, generator, pad=4, mean=CIFAR10_MEAN, std=CIFAR10_STD):
    """augment_batch on a uint8 NCHW batch (a view will do)."""
    import torch

    n, c, h, w = x.shape
    dev = x.device
    gen_dev = generator.device if generator is not None else dev
    # Three small draws per batch; on a CUDA generator they never leave the
    # GPU (the index that used to be built on the CPU was n*h*w int64, 2 MB
    # for 256 images, copied to the GPU every batch).
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=gen_dev).to(dev)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=gen_dev).to(dev)
    flip = (torch.rand(n, generator=generator, device=gen_dev) < 0.5).to(dev)
    if pad:
        x = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    ph, pw = h + 2 * pad, w + 2 * pad
    across = torch.arange(w, device=dev)
    cols = ox[:, None] + torch.where(flip[:, None], (w - 1) - across, across)  # (n, w)
    rows = oy[:, None] + torch.arange(h, device=dev)  # (n, h)
    index = (rows[:, :, None] * pw + cols[:, None, :]).reshape(n, 1, h * w)
    out = torch.gather(x.reshape(n, c, ph * pw), 2, index.expand(n, c, h * w))
    scale, shift = _affine(mean, std, dev)
    return out.reshape(n, c, h, w).float().mul_(scale).sub_(shift)


_AFFINE = {}


def _affine(mean, std, device):
    """(scale, shift) with x * scale - shift == (x - 255 mean) / (255 std),
    shaped (1, 3, 1, 1), made once per device: a tensor built from a list on
    a CUDA device is a synchronous copy, which every batch used to pay."""
    import torch

    key = (tuple(mean), tuple(std), str(device))
    got = _AFFINE.get(key)
    if got is None:
        m = torch.tensor(mean, dtype=torch.float32)
        sd = torch.tensor(std, dtype=torch.float32)
        scale = 1.0 / (sd * 255)
        shift = m * 255 * scale
        got = _AFFINE[key] = (scale.view(1, -1, 1, 1).to(device), shift.view(1, -1, 1, 1).to(device))
    return got


def _normalize(images, mean=CIFAR10_MEAN, std=CIFAR10_STD):
    """uint8 NHWC -> float32 NCHW, normalized (no random parts)."""
    scale, shift = _affine(mean, std, images.device)
    return images.permute(0, 3, 1, 2).float().mul_(scale).sub_(shift)


class Cifar10Loader:
    """CIFAR-10 batches ``(images, labels)`` as torch tensors: ``images``
    uint8 NHWC ``(N, 32, 32, 3)`` (``augment=False``), or float32 NCHW after
    a random crop (4-pixel padding), a random flip and normalization
    (``augment=True``; ``normalize=True`` normalizes without the random
    parts); ``labels`` int64.

    ``in_memory=True`` (default, as torchvision's ``CIFAR10`` and
    ``fastread.dali.formats.cifar10``): the split's records are read once,
    natively (range reads of the batch files), into one uint8 tensor on the
    loader's device (150 MB for the train set; on ``device="cuda"`` GPU
    memory); each batch is then a gather of its rows and the augmentation,
    all on that device, with no per-batch host work but launching them.
    ``in_memory=False`` reads every batch as byte ranges of the files
    (:class:`fastread.Reader`) and copies it to the device (page-locked
    arenas, non-blocking).

    Reads ``root`` as :class:`fastread.formats.Cifar10` does (binary or
    pickle layout); shuffles, shards and epochs are those of
    :class:`fastread.Reader` (``fastread.sampling.epoch_indices``, the same
    order either way), and so are the augmentation draws for a given seed,
    epoch and batch number on one device (a resumed epoch augments as the
    uninterrupted one).
    """

    def __init__(self, root, batch_size=None, *, train=True, device="cpu", augment=False,
                 normalize=False, shard_id=None, num_shards=None, random_shuffle=False, seed=0,
                 drop_last=False, device_id=None, engine="auto", in_memory=True,
                 global_batch_size=None, **engine_options):
        import torch

        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if batch_size is None and global_batch_size is None:
            batch_size = 256
        node = node_env()
        if num_shards is None:
            num_shards = node["world_size"]
        if shard_id is None:
            shard_id = node["rank"]
        if device == "cuda":
            if device_id is None:
                device_id = node["local_rank"]
            if not torch.cuda.is_available():
                raise RuntimeError("Cifar10Loader(device='cuda'): no usable CUDA device; use "
                                   "device='cpu'")
            if not in_memory:
                engine_options.setdefault("pin_memory", True)
                engine_options.setdefault("device_id", device_id)
        self.device = "cpu" if device == "cpu" else f"cuda:{device_id}"
        self.augment, self.normalize = bool(augment), bool(normalize)
        self.in_memory = bool(in_memory)
        self.seed = seed
        self.source = Cifar10(root, train=train)
        # The Reader checks the arguments and gives the epochs' order in both
        # modes; in memory it reads the records once (below) and no batch.
        self.reader = Reader(source=self.source, batch_size=batch_size, shard_id=shard_id,
                             num_shards=num_shards, random_shuffle=random_shuffle, seed=seed,
                             drop_last=drop_last, stick_to_shard=True, engine=engine,
                             ring_depth=2, global_batch_size=global_batch_size, **engine_options)
        self.batch_size = self.reader.batch_size  # elastic: the rank's slice
        self._images = self._labels = None
        if self.in_memory:
            self._images, self._labels = _load_records(self.source, engine, engine_options,
                                                       self.device)
        self.epoch = 0
        self._start_batch = 0
        self._delivered = 0

    def __len__(self):
        return len(self.reader)

    def set_epoch(self, epoch):
        """The epoch (shuffle, and augmentation draws) the next iteration
        delivers, from its start."""
        self.epoch = int(epoch)
        self._start_batch = 0

    def state_dict(self):
        """Where the loader stands (elastic, with ``global_batch_size``:
        resumable at another world size dividing it, see
        :func:`fastread.sampling.elastic_world_sizes`; docs/elastic.md)."""
        return self.reader.state_dict(self.epoch, self._delivered)

    def load_state_dict(self, state):
        """Continues from ``state`` (:meth:`state_dict`); ValueError if it was
        taken by a loader whose order differs (data set, batch size, seed,
        ``random_shuffle``, shards; elastic: global batch). States taken
        before ``shuffle`` was recorded load without that check."""
        self.epoch, self._start_batch = self.reader.resume_position(
            state, owner="loader", optional=("shuffle",))

    def _generator(self):
        """A generator for the augmentation draws, on the loader's device (a
        CUDA generator keeps them on the GPU); seeded per batch by
        :meth:`_seed_batch`."""
        import torch

        return torch.Generator(device=self.device)

    def _seed_batch(self, gen, batch):
        """Seeds ``gen`` for batch number ``batch`` of this epoch: the draws
        depend on (seed, epoch, batch) only, so an epoch resumed at batch k
        augments exactly as the uninterrupted one did (one generator per
        epoch gave a resumed batch k the draws of batch 0)."""
        return gen.manual_seed(hash((self.seed, self.epoch, batch)) & 0x7FFFFFFF)

    def _finish(self, chw, gen):
        """A uint8 NCHW batch on the device -> what the loader delivers."""
        if self.augment:
            return _augment_chw(chw, gen)
        if self.normalize:
            return _normalize(chw.permute(0, 2, 3, 1))
        return chw.permute(0, 2, 3, 1).contiguous()

    def __iter__(self):
        start, self._start_batch = self._start_batch, 0
        self._delivered = start
        gen = self._generator() if self.augment else None
        batches = self._in_memory_batches(start) if self.in_memory else self._read_batches(start)
        for chw, labels in batches:
            if gen is not None:
                self._seed_batch(gen, self._delivered)
            self._delivered += 1
            yield self._finish(chw, gen), labels
        self.epoch += 1
        self._delivered = 0

    def _in_memory_batches(self, start):
        import torch

        order = self.reader._epoch_order(self.epoch)  # drop_last applied
        # One small upload an epoch; each batch is then two gathers on the device.
        order = torch.from_numpy(np.ascontiguousarray(order)).to(self.device)
        for k in range(start, -(-len(order) // self.batch_size)):
            idx = order[k * self.batch_size:(k + 1) * self.batch_size]
            yield self._images.index_select(0, idx), self._labels.index_select(0, idx)

    def _read_batches(self, start):
        import torch

        self.reader.set_epoch(self.epoch, start_batch=start)
        for arrays, labels in self.reader:
            # The records' own CHW planes: one gather on the host.
            images = torch.from_numpy(to_chw(arrays))
            labels = torch.from_numpy(labels.astype(np.int64))
            if self.device != "cpu":
                images = images.pin_memory().to(self.device, non_blocking=True)
                labels = labels.pin_memory().to(self.device, non_blocking=True)
            yield images, labels

    def close(self):
        self.reader.close()
        self._images = self._labels = None


def _load_records(source, engine, engine_options, device):
    """Every record of ``source`` (a Cifar10) as (uint8 (N, 3, 32, 32),
    int64 (N,)) tensors on ``device``: read once by
    :class:`fastread.formats.in_memory.InMemory` (native range reads in large
    batches), then one copy to the device."""
    import torch

    opts = {k: v for k, v in engine_options.items() if k not in ("pin_memory", "device_id")}
    held = InMemory(source, to_chw, engine=engine, **opts)
    labels = torch.from_numpy(np.asarray(held.labels, np.int64))
    return torch.from_numpy(held.data).to(device), labels.to(device)


class _RecordLoader:
    """Batches of a record source's samples cut into fields, as torch
    tensors (zero-copy views of fastread's buffers, valid until two more
    batches were delivered); epochs, shards and resume as Cifar10Loader."""

    def __init__(self, source, batch_size, *, shard_id=None, num_shards=None,
                 random_shuffle=False, seed=0, drop_last=False, engine="auto",
                 global_batch_size=None, **engine_options):
        import torch  # noqa: F401  (fail early, with the real import error)

        if batch_size is None and global_batch_size is None:
            batch_size = 64
        node = node_env()
        if num_shards is None:
            num_shards = node["world_size"]
        if shard_id is None:
            shard_id = node["rank"]
        self.source, self.seed = source, seed
        self.reader = Reader(source=source, batch_size=batch_size, shard_id=shard_id,
                             num_shards=num_shards, random_shuffle=random_shuffle, seed=seed,
                             drop_last=drop_last, stick_to_shard=True, engine=engine,
                             ring_depth=2, global_batch_size=global_batch_size,
                             **engine_options)
        self.batch_size = self.reader.batch_size
        self.epoch = 0
        self._start_batch = 0
        self._delivered = 0

    __len__ = Cifar10Loader.__len__
    set_epoch = Cifar10Loader.set_epoch
    state_dict = Cifar10Loader.state_dict
    load_state_dict = Cifar10Loader.load_state_dict
    close = Cifar10Loader.close

    def _cut(self, arrays, ids):
        raise NotImplementedError

    def __iter__(self):
        self.reader.set_epoch(self.epoch, start_batch=self._start_batch)
        self._delivered, self._start_batch = self._start_batch, 0
        for arrays, ids in self.reader:
            self._delivered += 1
            yield self._cut(arrays, ids)
        self.epoch += 1
        self._delivered = 0


class WebDatasetLoader(_RecordLoader):
    """WebDataset shards (:class:`fastread.formats.WebDataset`: ``paths``,
    ``ext``, ``missing_component_behavior``, ``case_sensitive_extensions``
    (default False here, as the webdataset library), ``cache_dir``,
    ``cache_bytes``) as
    batches: a tuple with one list of uint8 tensors per ``ext`` entry.
    ``paths`` may be ``s3://`` URLs: ``s3=`` or the S3 options as keywords
    reach the bucket, ``s3_read`` says how shards are read (see
    :mod:`fastread.formats.webdataset`)."""

    def __init__(self, paths, ext, batch_size=None, *, missing_component_behavior="empty",
                 case_sensitive_extensions=False, cache_dir=None, cache_bytes=None,
                 s3_read=None, **kwargs):
        from fastread.formats.webdataset import WebDataset
        from fastread.s3 import take_options
        s3 = take_options(kwargs).get("s3")   # kept for the reads too (Reader's options)
        source = WebDataset(paths, ext, missing_component_behavior=missing_component_behavior,
                            case_sensitive_extensions=case_sensitive_extensions,
                            cache_dir=cache_dir, cache_bytes=cache_bytes, s3=s3, s3_read=s3_read)
        super().__init__(source, batch_size, **kwargs)

    def _cut(self, arrays, ids):
        import torch
        return tuple([torch.from_numpy(a) for a in comp]
                     for comp in self.source.components(arrays, ids))


class SquirrelLoader(_RecordLoader):
    """A squirrel MessagePack store (:class:`fastread.formats.SquirrelStore`)
    as batches: a tuple with one entry per key, a tensor stacking the
    batch's arrays when they share a shape (``stack=True``; one copy), else
    a list of tensors (views; copies for non-native byte order). A key whose
    values are not numbers (strings, bytes, records) gives a list of Python
    values."""

    def __init__(self, url, keys=("image", "label"), batch_size=None, *, stack=True,
                 cache_dir=None, cache_bytes=None, **kwargs):
        from fastread.formats.squirrel import SquirrelStore
        self.stack = bool(stack)
        super().__init__(SquirrelStore(url, keys=keys, cache_dir=cache_dir,
                                       cache_bytes=cache_bytes), batch_size, **kwargs)

    def _cut(self, arrays, ids):
        out = []
        for key, field in zip(self.source.keys, self.source.fields(arrays, ids)):
            if not all(a.dtype.kind in "biufc" for a in field):
                # strings, bytes, records, lists: torch has no tensor for them
                out.append([a.tolist() for a in field])
            elif self.stack and len({(a.shape, a.dtype) for a in field}) == 1:
                # one copy, to native byte order where the store's is not
                out.append(_tensor(key, np.stack(field, dtype=field[0].dtype.newbyteorder("="))))
            else:
                out.append([_tensor(key, np.ascontiguousarray(a)) for a in field])
        return tuple(out)


def _tensor(key, a):
    """``a`` as a tensor (a view when its bytes are native); a store may hold
    big-endian arrays, which torch refuses."""
    import torch
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="), copy=False)
    try:
        return torch.from_numpy(a)
    except TypeError as e:   # a dtype torch lacks (float128, ...)
        raise ValueError(f"squirrel field {key!r}: {a.dtype} arrays cannot be tensors: {e}") \
            from None
