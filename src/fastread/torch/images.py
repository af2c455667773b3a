"""PyTorch over image trees: fastread reads, DALI decodes, torch tensors come
out (:class:`ImageLoader`).

::

    from fastread.torch import ImageLoader

    loader = ImageLoader("/data/train", batch_size=256, device="cuda", random_shuffle=True)
    for epoch in range(90):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...

Shards come from torchrun's environment (RANK, WORLD_SIZE; LOCAL_RANK picks
the GPU) unless given. ``state_dict()`` taken mid-epoch and loaded into a new
loader resumes with exactly the samples that epoch had not yet delivered;
with ``global_batch_size=`` (elastic sharding, docs/elastic.md) also at
another world size.
"""

import numpy as np

from fastread import _core
from fastread._defaults import node_env
from fastread.sampling import check_flag, elastic_resume
from fastread.reader import Reader

__all__ = ["ImageLoader", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _require_gpu(device_id):
    """Raises RuntimeError unless CUDA device ``device_id`` is usable. Asked
    of the driver when the loader is built: otherwise the first batch fails
    deep inside DALI's pipeline with a message about the pipeline."""
    if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
        raise ValueError(f"device_id must be a CUDA device number (>= 0), got {device_id!r}")
    ok, why = _core.gpu_probe(device_id)
    if not ok:
        raise RuntimeError(f"ImageLoader(device='cuda'): CUDA device {device_id} is not usable "
                           f"here: {why}. Use device='cpu' on a machine without a GPU.")


class ImageLoader:
    """Batches ``(images, labels)`` as torch tensors.

    With ``decode=True`` images are decoded by DALI (``device="cuda"`` uses
    the mixed GPU decoder), resized to ``size`` x ``size`` and normalized:
    float32 NCHW. With ``decode=False`` ``images`` is a list of uint8 tensors
    holding the files' bytes (zero-copy views of fastread's buffers).
    ``labels`` is an int64 tensor on the same device.

    ``file_root`` may be ``s3://bucket/prefix`` (a class tree in a bucket,
    listed as :func:`fastread.scan` lists it): the objects are read by the
    s3 engine, the bucket reached with ``s3=`` (:class:`fastread.S3Options`)
    or the same options as keywords (``endpoint_url=``, ...), else the AWS
    environment; samples, labels and shards are those of the local tree.

    ``hw_decoder_load`` (``device="cuda"``): the share of images DALI's
    mixed decoder gives the GPU's hardware JPEG decoder, 0 to 1; None keeps
    DALI's default (0.65). On an H200, 1.0 decoded 224-px ImageNet-sized
    JPEGs about 1.5x as fast as the default with 8 threads, the host's
    share of decoding being what limits it.

    ``global_batch_size=G``: elastic sharding (:class:`fastread.Reader`'s):
    each rank delivers batches of ``G // WORLD_SIZE`` samples, its slice of
    each global batch of one order of the whole set per ``(seed, epoch)``,
    and ``state_dict()`` resumes at another world size (one dividing G).
    """

    def __init__(self, file_root=None, batch_size=None, *, device="cpu", decode=True, size=224,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, file_list=None, files=None, labels=None,
                 file_filters=None, shard_id=None, num_shards=None, random_shuffle=False, seed=0,
                 drop_last=False, num_threads=4, device_id=None, prefetch_queue_depth=2,
                 engine="auto", global_batch_size=None, hw_decoder_load=None, **engine_options):
        import torch  # noqa: F401  (fail early, with the real import error)

        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        for opt, value, low in (("size", size, 1), ("num_threads", num_threads, 1),
                                ("prefetch_queue_depth", prefetch_queue_depth, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{opt} must be an integer >= {low}, got {value!r}")
        for opt, value in (("mean", mean), ("std", std)):
            try:
                ok = len(value) == 3 and all(float(v) == float(v) for v in value)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"{opt} must be 3 numbers (one per channel), got {value!r}")
        if any(float(v) == 0 for v in std):
            raise ValueError(f"std must not contain 0, got {std!r}")
        check_flag("decode", decode)
        if hw_decoder_load is not None and (isinstance(hw_decoder_load, bool) or
                                            not isinstance(hw_decoder_load, (int, float)) or
                                            not 0 <= hw_decoder_load <= 1):
            raise ValueError(f"hw_decoder_load must be a number in [0, 1] (the share of images "
                             f"the GPU's hardware JPEG decoder takes), got {hw_decoder_load!r}")
        node = node_env()
        if num_shards is None:
            num_shards = node["world_size"]
        if shard_id is None:
            shard_id = node["rank"]
        if device == "cuda" and device_id is None:
            device_id = node["local_rank"]
        if device == "cuda":
            _require_gpu(device_id)
        self.device, self.decode, self.size = device, bool(decode), int(size)
        self.mean, self.std = tuple(mean), tuple(std)
        self.num_threads = num_threads
        self.hw_decoder_load = hw_decoder_load
        self.device_id = device_id if device == "cuda" else None
        self.prefetch_queue_depth = prefetch_queue_depth
        # Every rank keeps its own shard; with shuffling each epoch draws one
        # permutation of the whole set, the same on every rank.
        self.reader = Reader(file_root, file_list=file_list, files=files, labels=labels,
                             file_filters=file_filters, batch_size=batch_size,
                             shard_id=shard_id, num_shards=num_shards,
                             random_shuffle=random_shuffle, seed=seed, drop_last=drop_last,
                             stick_to_shard=True, engine=engine,
                             ring_depth=prefetch_queue_depth + 2 if decode else None,
                             global_batch_size=global_batch_size, **engine_options)
        # The batches the loader delivers (elastic: the rank's slice).
        self.batch_size = self.reader.batch_size
        self.epoch = 0
        self._start_batch = 0
        self._delivered = 0
        self._dali = None
        self._dali_used = False

    def __len__(self):
        return len(self.reader)

    def set_epoch(self, epoch):
        """The epoch (shuffle) the next iteration delivers, from its start."""
        self.epoch = int(epoch)
        self._start_batch = 0

    def state_dict(self):
        """Where the loader stands: load it into a loader built with the same
        arguments to continue with exactly the samples not yet delivered
        (elastic: built with the same ``global_batch_size``, at any world
        size dividing it)."""
        if self.reader.global_batch_size is not None:
            return self.reader.state_dict(self.epoch, self._delivered)
        return {"epoch": self.epoch, "batches_delivered": self._delivered,
                "num_samples": len(self.reader.paths), "batch_size": self.batch_size,
                "seed": self.reader.seed, "shard_id": self.reader.shard_id,
                "num_shards": self.reader.num_shards}

    def load_state_dict(self, state):
        if self.reader.global_batch_size is not None:
            self.epoch, self._start_batch = elastic_resume(state, **self.reader._elastic_args())
            self._delivered = self._start_batch
            self._teardown()
            return
        if isinstance(state, dict) and "elastic" in state:
            raise ValueError("state_dict was taken by an elastic loader (global_batch_size="
                             f"{state.get('global_batch_size')!r}): give this loader the same "
                             "global_batch_size to resume it")
        for key in ("num_samples", "batch_size", "seed", "shard_id", "num_shards"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ValueError(f"state_dict was taken with {key}={state.get(key)!r}, "
                                 f"this loader has {key}={mine!r}")
        self.epoch = int(state["epoch"])
        self._start_batch = int(state["batches_delivered"])
        self._delivered = self._start_batch
        self._teardown()  # a built pipeline may already hold batches read ahead

    # -- iteration -----------------------------------------------------------
    def __iter__(self):
        self.reader.set_epoch(self.epoch, start_batch=self._start_batch)
        self._delivered, self._start_batch = self._start_batch, 0
        if not self.decode:
            return self._iter_bytes()
        return self._iter_dali()

    def _iter_bytes(self):
        import torch
        for arrays, labels in self.reader:
            images = [torch.from_numpy(a) for a in arrays]
            labels = torch.from_numpy(labels.astype(np.int64))
            if self.device == "cuda":
                images = [t.to(f"cuda:{self.device_id}", non_blocking=True) for t in images]
                labels = labels.to(f"cuda:{self.device_id}", non_blocking=True)
            self._delivered += 1
            yield images, labels
        self._finish_epoch()

    def _iter_dali(self):
        if self._dali is None:
            self._dali = self._build()
        elif self._dali_used:
            self._dali.reset()  # the source begins the reader's chosen epoch
        self._dali_used = True
        for out in self._dali:
            self._delivered += 1
            yield out[0]["images"], out[0]["labels"].reshape(-1).long()
        self._finish_epoch()

    def _finish_epoch(self):
        self.epoch += 1
        self._delivered = 0

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        from fastread.dali.sources import BatchSource

        reader, loader = self.reader, self

        @pipeline_def(batch_size=self.batch_size, num_threads=self.num_threads,
                      device_id=self.device_id, prefetch_queue_depth=self.prefetch_queue_depth)
        def pipe():
            data, labels = fn.external_source(source=BatchSource(reader), num_outputs=2,
                                              batch=True, cycle=False)
            gpu = loader.device == "cuda"
            # hw_decoder_load: None leaves DALI's default (0.65); on an H200 all
            # to the hardware decoder (1.0) decoded 1.5x as many 224-px images
            # a second with 8 threads (docs/benchmarks.md, several GPUs).
            hw = ({"hw_decoder_load": float(loader.hw_decoder_load)}
                  if gpu and loader.hw_decoder_load is not None else {})
            images = fn.decoders.image(data, device="mixed" if gpu else "cpu",
                                       output_type=types.RGB, **hw)
            images = fn.resize(images, resize_x=loader.size, resize_y=loader.size)
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW",
                mean=[m * 255 for m in loader.mean], std=[s * 255 for s in loader.std])
            if loader.device == "cuda":
                labels = labels.gpu()
            return images, labels

        return DALIGenericIterator([pipe()], ["images", "labels"], auto_reset=False)

    def _teardown(self):
        self._dali = None
        self._dali_used = False

    def close(self):
        self._teardown()
        self.reader.close()

