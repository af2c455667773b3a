"""``fastread.dali.readers.image``: the samples of a packed image
(``fastread pack``) into a DALI pipeline, read with block-level range reads.

Sharding, shuffling, epochs and the last batch behave exactly as in
:func:`fastread.dali.readers.file` for the directory that was packed (the
same :class:`fastread.Reader` does the work), and so does GPU output:
``device="gpu"`` with a host engine (one copy per batch from the pinned
arena) or with ``engine="cufile"``, which reads the ranges straight into GPU
memory (the GDS-like path).

``decoded=True`` reads a decoded pack (``fastread pack --decode``, raw
pixels): each sample comes out as its uint8 HWC array (layout ``"HWC"``),
ready for DALI's augmentation with no decoder. The native operator gets the
shapes from the index (``npy_*`` arguments, as readers.numpy does; for a
local binary index, from the index it maps itself: ``image_index=``), and a
batch of samples of one shape is one block handed to DALI without a copy;
with ``device="gpu"`` the operator itself writes each batch into DALI's GPU
output (one copy per batch from its page-locked arena, on DALI's stream:
``dali_plugin/upload_ring.c``), so DALI's GPU augmentation follows with no
host step between. The external source feeds DALI one array ``(N, H, W,
C)`` per batch where the samples have one shape (``Reader(dense=True)``),
else one view per sample.
"""
import numpy as np

from fastread.dali.sources import BatchSource, gpu_batch
from fastread.dali._common import check_epoch_end, reader_outputs
from fastread.dali._native import native_reader, use_native
from fastread.image import PackedImage
from fastread.reader import check_device
from fastread.s3 import take_options as take_s3_options
from fastread.source import FileRanges


#: The native operator's DALI backend for decoded images on the GPU: "mixed",
#: so that each batch's copy to the GPU runs on DALI's mixed stream while the
#: GPU operators after it (random_resized_crop, crop_mirror_normalize) work
#: on the batch before; as a "gpu" operator the copy queues between their
#: kernels on one stream. On an H200, 160 px, batch 256, DALI's augmentation
#: after it: 152k img/s mixed, 142k gpu (docs/results/gpu-h200-20261203b).
GPU_OUTPUT_STAGE = "mixed"


def image(*, image, index=None, shard_id=0, num_shards=1, random_shuffle=False,
          shuffle_after_epoch=False, seed=-1, pad_last_batch=False, stick_to_shard=False,
          prefetch_queue_depth=1, name=None, last_batch_policy=None, engine="auto",
          device="cpu", no_copy=False, device_id=None, epoch_end="roll", native=None,
          decoded=False, **kwargs):
    """Like ``readers.file`` but over a packed image: returns ``(data, labels)``.

    ``image`` is the image's path (or a :class:`fastread.PackedImage`),
    ``index`` its index if not ``<image>.index``. Either may be an
    ``s3://bucket/key`` URL: the index and the samples are read by ranged
    GETs (the s3 engine), the bucket reached with ``s3=`` or the same options
    as keywords (``endpoint_url=``, ...), else the AWS environment. Extra keyword arguments are
    engine options (``o_direct=True`` for O_DIRECT, ``queue_depth``, ...).
    ``epoch_end`` and ``name``: as for readers.file (rolling epochs by
    default, ``reader_name=name`` for the DALI iterators).

    ``native``: None (the native operator, ``fn.fastread.readers.file`` with
    ``image=`` and the samples' byte ranges from the index, where it serves
    the call and the plugin loads; else an external source), True (the
    operator, or ValueError / RuntimeError saying why not) or False (the
    external source). ``engine="cufile"`` and ``epoch_end="stop"`` always
    take the external source. The image and its index are opened and checked
    when the pipeline is defined either way.

    ``decoded=True``: the image is a decoded pack of raw pixels (``fastread
    pack --decode``); each sample is its uint8 HWC array (see the module's
    documentation), on the GPU with ``device="gpu"`` (written there by the
    native operator). ValueError for an image of the files' bytes or of
    re-encoded JPEGs (decode those with ``fn.decoders.image``).
    """
    check_epoch_end(epoch_end)
    device = check_device(device)
    if not isinstance(decoded, bool):
        raise ValueError(f"decoded must be True or False, got {decoded!r}")
    # S3 options (s3= or flat keywords) for an s3:// image: they reach its
    # index here and the engine reading its samples (either path).
    s3 = take_s3_options(kwargs).get("s3")
    img = _open(image, index, s3) if decoded else None
    if decoded:
        _check_decoded(img)
    if use_native("fastread.dali.readers.image", native, epoch_end, device, device_id,
                  last_batch_policy, engine, kwargs, ranges=True):
        data, labels = native_reader(
            img if img is not None else _open(image, index, s3), shard_id=shard_id, num_shards=num_shards,
            random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
            pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
            prefetch_queue_depth=prefetch_queue_depth, name=name, engine=engine, device=device,
            device_id=device_id, kwargs=kwargs, what="fastread.dali.readers.image",
            layout_args=_layout_args(img) if decoded else None,
            gpu_stage=GPU_OUTPUT_STAGE if decoded else "gpu")
        if decoded:
            # The operator's arrays carry no layout: "HWC" for DALI's image
            # operators, as the external source gives (reshape relabels the
            # same memory, on the CPU and the GPU alike).
            from nvidia.dali import fn
            data = fn.reshape(data, layout="HWC")
        return data, labels
    make_batch_source = layout = None
    if decoded:
        layout = ["HWC", ""]
        if img.sample_shape is not None and device == "cpu":
            kwargs["dense"] = True   # one (N, H, W, C) array per batch
            make_batch_source = lambda reader, gpu: _DenseSource(reader)  # noqa: E731
        else:
            make_batch_source = lambda reader, gpu: _PixelSource(reader, img, gpu)  # noqa: E731
    return reader_outputs(
        "image", lambda: (img if "dense" in kwargs else _by_index(img)) if decoded
        else _open(image, index, s3),
        shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
        pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
        prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device=device, no_copy=no_copy,
        device_id=device_id, kwargs=kwargs, epoch_end=epoch_end,
        make_batch_source=make_batch_source, layout=layout)


def _check_decoded(img):
    if img.encoding != "raw":
        what = ("the source files' bytes" if img.encoding == "file"
                else f"{img.encoding} images (decode them with fn.decoders.image)")
        raise ValueError(f"readers.image(decoded=True): image {img.path!r} holds {what}, not "
                         "raw pixels: pack it with `fastread pack --decode` (--encode raw)")


def _layout_args(img):
    """The operator's npy_* arguments for a decoded image: each range one
    whole HWC array (data offset 0) of the index's shape. For a local
    binary index the operator reads the shapes from the index it maps
    (image_index=): no list per sample here."""
    from nvidia.dali import types
    args = dict(npy_ndim=3, npy_dtype=types.to_dali_type(img.dtype))
    layout = img.mapped_layout
    if layout is not None and "shapes" in layout["columns"]:
        return args
    return dict(args, npy_data_offsets=[0] * len(img),
                npy_shapes=[int(x) for x in img.shapes.reshape(-1).tolist()])


class _DenseSource(BatchSource):
    """Dense batches as DALI takes them: the (N, H, W, C) array itself where
    it is contiguous (buffered reads); O_DIRECT's slot-strided array as one
    view per sample (DALI refuses strided batches), still without a copy."""

    def __next__(self):
        arrays, labels = super().__next__()
        if isinstance(arrays, np.ndarray) and not arrays.flags.c_contiguous:
            arrays = list(arrays)
        return arrays, labels


class _PixelSource(BatchSource):
    """A decoded image's samples as their HWC arrays, one view per sample
    (samples of several shapes, or GPU batches). The reader reads the
    image's ranges with the samples' indices as labels (:func:`_by_index`),
    which give each sample's shape and its true label."""

    def __init__(self, reader, img, gpu):
        super().__init__(reader)
        self.img = img
        self.gpu = gpu
        self.device_id = reader.device_id
        self._labels = img.labels.reshape(-1, 1)
        self._shapes = [tuple(s) for s in img.shapes.tolist()]
        self._typestr = img.dtype.str
        self._itemsize = img.dtype.itemsize
        if gpu:
            import cupy
            self._cupy = cupy

    def __next__(self):
        arrays, ids = super().__next__()
        ids = ids.ravel()
        out = []
        for a, i in zip(arrays, ids.tolist()):
            shape = self._shapes[i]
            if self.gpu:
                out.append(a.view(0, shape, self._typestr, self._itemsize))
            else:
                out.append(a.view(self.img.dtype).reshape(shape))
        labels = self._labels[ids]
        if self.gpu:   # both outputs of a GPU external source in GPU memory
            with self._cupy.cuda.Device(self.device_id):
                return gpu_batch(out, self.device_id), self._cupy.asarray(labels)
        return out, labels


def _by_index(img):
    """The image's samples with their indices as labels (for _PixelSource)."""
    ranges = FileRanges(img.path, img.offsets, img.lengths, np.arange(len(img)), img.names)
    ranges.s3 = img.s3   # an s3:// image's samples come from the bucket its index came from
    return ranges


def _open(image, index, s3):
    return image if isinstance(image, PackedImage) else PackedImage(image, index, s3=s3)
