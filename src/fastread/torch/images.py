"""PyTorch over image trees: fastread reads, DALI decodes, torch tensors come
out (:class:`ImageLoader`); or over a decoded pack (``image=``), no decoder:
fastread reads the pixels into GPU memory and one fused kernel crops,
flips and normalizes each batch (:mod:`fastread.augment`).

::

    from fastread.torch import ImageLoader

    loader = ImageLoader("/data/train", batch_size=256, device="cuda", random_shuffle=True)
    # or: ImageLoader(image="/data/train-160.img", batch_size=256, device="cuda", size=160,
    #                 augment=True, random_shuffle=True)
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

import collections
import os

import numpy as np

from fastread import _core
from fastread._defaults import node_env
from fastread.augment import OUTPUT_DTYPES, RATIO, SCALE, check_crop
from fastread.image import PackedImage, is_packed_image
from fastread.sampling import check_flag
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

    ``image=`` a decoded pack of raw pixels of one shape (``fastread pack
    --decode --resize S --crop S``; a path or :class:`fastread.PackedImage`)
    instead of a tree: no decoder and no DALI. A packed image given as the
    first argument (``file_root``) is taken as ``image=``: a file with its
    index beside it (:func:`fastread.image.is_packed_image`). ``device="cuda"``: the
    reader writes each batch into GPU memory, and one fused CUDA kernel
    (:class:`fastread.augment.Augmenter`) makes the same (N, 3, size, size)
    batch from it, queued on torch's current stream. ``device="cpu"``: the
    same arithmetic in the C core (:func:`fastread.augment.augment_host`) on
    ``num_threads`` threads. A pack of encoded
    images (a plain pack of a JPEG tree, or ``--decode --encode jpeg``) is
    read by ranges and decoded by DALI as a tree is (``device="cuda"``: the
    mixed decoder, the GPU's hardware JPEG decoder where it has one).

    ``augment=True``: torchvision's RandomResizedCrop (``scale``, ``ratio``)
    to ``size`` x ``size`` and a horizontal flip with probability ``flip``
    instead of resizing the whole image. On a pack each sample's crop and
    flip follow from (``seed``, epoch, its index in the data set) alone
    (:func:`fastread.augment.crop_params`): a seed gives the same batches
    whatever the world size or batch size. On a tree (or a pack of encoded
    images) DALI draws them
    (``fn.random_resized_crop``, ``fn.random.coin_flip``).

    ``dtype``: ``"float32"`` (default) or ``"float16"``, normalized with
    ``mean`` / ``std`` (of pixels scaled to [0, 1]); ``"uint8"``: the
    resampled pixels, not normalized.

    ``file_root`` may be ``s3://bucket/prefix`` (a class tree in a bucket,
    listed as :func:`fastread.scan` lists it): the objects are read by the
    s3 engine, the bucket reached with ``s3=`` (:class:`fastread.S3Options`)
    or the same options as keywords (``endpoint_url=``, ...), else the AWS
    environment; samples, labels and shards are those of the local tree.

    ``cassandra=`` a :class:`fastread.cassandra.CassandraSource` instead of a
    tree: the rows' blobs (JPEGs) decoded by DALI as files are, their int
    labels (docs/cassandra.md).

    ``parquet=`` a :class:`fastread.formats.Parquet` (or what it opens: a
    Hub-style directory, ``save_to_disk`` directory, files, an ``s3://``
    prefix) instead of a tree: each row's image bytes decoded as files are,
    its label column as labels (docs/parquet.md).

    ``hw_decoder_load`` (``device="cuda"``): the share of images DALI's
    mixed decoder gives the GPU's hardware JPEG decoder, 0 to 1; None keeps
    DALI's default (0.65). On an H200, 1.0 decoded 224-px ImageNet-sized
    JPEGs about 1.5x as fast as the default with 8 threads, the host's
    share of decoding being what limits it.

    ``global_batch_size=G``: elastic sharding (:class:`fastread.Reader`'s):
    each rank delivers batches of ``G // WORLD_SIZE`` samples, its slice of
    each global batch of one order of the whole set per ``(seed, epoch)``,
    and ``state_dict()`` resumes at another world size (one dividing G;
    :func:`fastread.sampling.elastic_world_sizes`).
    """

    def __init__(self, file_root=None, batch_size=None, *, device="cpu", decode=True, size=224,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, file_list=None, files=None, labels=None,
                 file_filters=None, shard_id=None, num_shards=None, random_shuffle=False, seed=0,
                 drop_last=False, num_threads=4, device_id=None, prefetch_queue_depth=2,
                 engine="auto", global_batch_size=None, image=None, augment=False,
                 scale=SCALE, ratio=RATIO, flip=0.5, dtype="float32", hw_decoder_load=None,
                 cassandra=None, parquet=None, **engine_options):
        import torch  # noqa: F401  (fail early, with the real import error)

        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        check_flag("augment", augment)
        self.scale, self.ratio, self.flip = check_crop(scale, ratio, flip)
        self.dtype = _output_dtype(dtype)
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
        pack = encoded = None
        if image is None and is_packed_image(file_root):
            # ImageLoader("/data/train-160.img"): a packed image as the first
            # argument, told from a tree by its index, is image=.
            if file_list is not None or files is not None:
                raise ValueError(f"{os.fsdecode(getattr(file_root, 'path', file_root))!r} is a "
                                 "packed image: give it alone (or as image=), not with "
                                 "file_list or files")
            image, file_root = file_root, None
        elif isinstance(file_root, (str, bytes, os.PathLike)) and os.path.isfile(file_root):
            raise ValueError(f"file_root {os.fsdecode(file_root)!r} is a file, not a tree: a "
                             f"packed image is told by its index, and "
                             f"{os.fsdecode(file_root) + '.index'!r} does not exist (give "
                             "image= and index= for an index elsewhere)")
        if cassandra is not None:
            from fastread.cassandra import CassandraSource
            if not isinstance(cassandra, CassandraSource):
                raise TypeError(f"cassandra= takes a fastread.cassandra.CassandraSource, got "
                                f"{type(cassandra).__name__}")
            if image is not None or file_root is not None or file_list is not None or \
                    files is not None:
                raise ValueError("give cassandra= or a tree (file_root, file_list, files) or "
                                 "image=, not several")
            if cassandra.label_type == "blob":
                raise ValueError("ImageLoader takes int labels: label_type 'int' or 'none'")
        if parquet is not None:
            from fastread.formats.parquet import Parquet
            if not isinstance(parquet, Parquet):
                # A path, directory or s3:// prefix of Parquet / Arrow files.
                parquet = Parquet(parquet, s3=engine_options.get("s3"))
            if cassandra is not None or image is not None or file_root is not None or \
                    file_list is not None or files is not None:
                raise ValueError("give parquet= or a tree (file_root, file_list, files), "
                                 "image= or cassandra=, not several")
            cassandra = parquet   # read as rows of a source, like Cassandra's
        if image is not None and not isinstance(image, PackedImage):
            image = PackedImage(image)
        if image is not None and _holds_encoded_images(image):
            # JPEGs in a pack (a plain pack of a tree, or --decode --encode
            # jpeg): read by ranges, decoded and augmented by DALI as files are.
            encoded = image
            if file_root is not None or file_list is not None or files is not None:
                raise ValueError(f"give image={encoded.path!r} or a tree (file_root, file_list, "
                                 "files), not both")
        elif image is not None:
            pack = _pixel_pack(image)
            if not decode:
                raise ValueError(f"decode=False applies to file trees; image={pack.path!r} "
                                 "holds decoded pixels already")
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
        self.augment = bool(augment)
        self.mean, self.std = tuple(mean), tuple(std)
        self.image = pack
        self.num_threads = num_threads
        self.hw_decoder_load = hw_decoder_load
        self.device_id = device_id if device == "cuda" else None
        self.prefetch_queue_depth = prefetch_queue_depth
        # Every rank keeps its own shard; with shuffling each epoch draws one
        # permutation of the whole set, the same on every rank.
        if pack is not None:
            # Each batch one (N, H, W, 3) array in GPU memory, as the engine
            # wrote it; a batch's memory is reused only once its arrays are
            # gone, and _iter_fused keeps them until the kernel has read them.
            if device == "cuda":
                engine_options.setdefault("device_id", device_id)
            self.reader = Reader(image=pack, batch_size=batch_size, shard_id=shard_id,
                                 num_shards=num_shards, random_shuffle=random_shuffle, seed=seed,
                                 drop_last=drop_last, stick_to_shard=True, engine=engine,
                                 device="gpu" if device == "cuda" else "cpu", dense=True,
                                 global_batch_size=global_batch_size, **engine_options)
        elif encoded is not None:
            self.reader = Reader(image=encoded, batch_size=batch_size, shard_id=shard_id,
                                 num_shards=num_shards, random_shuffle=random_shuffle, seed=seed,
                                 drop_last=drop_last, stick_to_shard=True, engine=engine,
                                 ring_depth=prefetch_queue_depth + 2 if decode else None,
                                 global_batch_size=global_batch_size, **engine_options)
        else:
            # A tree, or rows of Cassandra (cassandra=: their blobs decoded as files are).
            self.reader = Reader(file_root, file_list=file_list, files=files, labels=labels,
                                 source=cassandra, file_filters=file_filters,
                                 batch_size=batch_size,
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
        self._kernel = None

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
        size dividing it: :func:`fastread.sampling.elastic_world_sizes`)."""
        return self.reader.state_dict(self.epoch, self._delivered)

    def load_state_dict(self, state):
        """Continues from ``state`` (:meth:`state_dict`); ValueError if it was
        taken by a loader whose order differs (data set, batch size, seed,
        ``random_shuffle``, shards; elastic: global batch). States taken
        before ``shuffle`` was recorded load without that check."""
        self.epoch, self._start_batch = self.reader.resume_position(
            state, owner="loader", optional=("shuffle",))
        self._delivered = self._start_batch
        self._teardown()  # a built pipeline may already hold batches read ahead

    # -- iteration -----------------------------------------------------------
    def __iter__(self):
        self.reader.set_epoch(self.epoch, start_batch=self._start_batch)
        self._delivered, self._start_batch = self._start_batch, 0
        if self.image is not None:
            return self._iter_fused()
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

    def _iter_fused(self):
        import torch

        from fastread.augment import Augmenter, augment_host, crop_params

        cuda = self.device == "cuda"
        if cuda and self._kernel is None:
            self._kernel = Augmenter(self.device_id)
        reader, epoch, first = self.reader, self.epoch, self._delivered
        # The samples of each batch, as the reader reads them: the crops
        # follow the samples, not the batches.
        order = reader._epoch_order(epoch)
        height, width = self.image.sample_shape[:2]
        dev = torch.device("cuda", self.device_id) if cuda else None
        tdtype = getattr(torch, self.dtype)
        if self.dtype == "uint8":
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        else:
            mean = [m * 255 for m in self.mean]
            std = [s * 255 for s in self.std]
        # Batches whose kernel may not have run yet, with their input: the
        # reader reuses a batch's GPU memory only once its array is gone.
        queued = collections.deque()
        try:
            for k, (images, labels) in enumerate(reader, start=first):
                n = len(labels)
                start = k * self.batch_size
                if self.augment:
                    boxes, flips = crop_params(order[start:start + n], height, width,
                                               seed=reader.seed, epoch=epoch, scale=self.scale,
                                               ratio=self.ratio, flip=self.flip)
                else:
                    boxes = np.tile(np.array([0, 0, height, width], np.int32), (n, 1))
                    flips = None
                if not cuda:
                    # The same arithmetic in the C core on num_threads
                    # threads, the GIL released; done when it returns.
                    out = np.empty((n, 3, self.size, self.size), self.dtype)
                    augment_host(images, out, boxes, flips, mean=mean, std=std,
                                 threads=min(self.num_threads, 64))
                    del images
                    self._delivered += 1
                    yield torch.from_numpy(out), torch.from_numpy(labels.astype(np.int64))
                    continue
                out = torch.empty((n, 3, self.size, self.size), dtype=tdtype, device=dev)
                stream = torch.cuda.current_stream(dev)
                self._kernel(images, out, boxes, flips, mean=mean, std=std,
                             stream=stream.cuda_stream)
                done = torch.cuda.Event()
                done.record(stream)
                queued.append((done, images))
                while queued and (len(queued) > self.prefetch_queue_depth or queued[0][0].query()):
                    queued.popleft()[0].synchronize()
                labels = torch.from_numpy(labels.astype(np.int64)).to(dev, non_blocking=True)
                self._delivered += 1
                yield out, labels
        finally:
            for done, _ in queued:  # an epoch left early: its inputs outlive the kernels
                done.synchronize()
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
            mirror = 0
            if loader.augment:
                images = fn.random_resized_crop(images, size=(loader.size, loader.size),
                                                random_area=list(loader.scale),
                                                random_aspect_ratio=list(loader.ratio))
                mirror = fn.random.coin_flip(probability=loader.flip)
            else:
                images = fn.resize(images, resize_x=loader.size, resize_y=loader.size)
            if loader.dtype == "uint8":
                mean, std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
            else:
                mean = [m * 255 for m in loader.mean]
                std = [s * 255 for s in loader.std]
            images = fn.crop_mirror_normalize(
                images, dtype={"float32": types.FLOAT, "float16": types.FLOAT16,
                               "uint8": types.UINT8}[loader.dtype],
                output_layout="CHW", mirror=mirror, mean=mean, std=std)
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


def _output_dtype(dtype):
    """``dtype`` (a name or a torch dtype) as one of OUTPUT_DTYPES."""
    name = str(dtype).removeprefix("torch.")
    if name not in OUTPUT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(OUTPUT_DTYPES)} (or the torch "
                         f"dtype), got {dtype!r}")
    return name


def _holds_encoded_images(pack):
    """Whether ``pack`` (a PackedImage) holds encoded images (a plain pack's
    source files, or JPEGs re-encoded by ``pack --decode --encode jpeg``),
    which DALI decodes, rather than raw pixels."""
    return not pack.decoded or pack.encoding == "jpeg"


def _pixel_pack(image):
    """``image`` (a path or PackedImage) if it holds raw uint8 RGB pixels
    of one shape, else ValueError naming it and how to pack it."""
    pack = image if isinstance(image, PackedImage) else PackedImage(image)
    how = "pack it with fastread pack --decode --resize S --crop S (raw pixels, one shape)"
    if not pack.decoded:
        raise ValueError(f"image={pack.path!r} holds the source files' bytes, not decoded "
                         f"pixels: {how}, or give the tree as file_root")
    if pack.encoding != "raw":
        raise ValueError(f"image={pack.path!r} holds {pack.encoding!r} samples; the fused "
                         f"augmentation reads raw pixels: {how} (or read it with "
                         "fastread.dali.readers.image(decoded=True) and DALI's decoder)")
    shape = pack.sample_shape
    if shape is None:
        kinds = len({tuple(s) for s in pack.shapes.tolist()})
        raise ValueError(f"image={pack.path!r} holds images of {kinds} shapes; a batch on the "
                         f"GPU is one array of one shape: {how}")
    if len(shape) != 3 or shape[2] != 3 or np.dtype(pack.dtype) != np.uint8:
        raise ValueError(f"image={pack.path!r} holds {shape} {pack.dtype} samples; the fused "
                         "augmentation takes (H, W, 3) uint8 (RGB)")
    return pack
