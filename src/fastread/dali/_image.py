"""``fastread.dali.readers.image``: the samples of a packed image
(``fastread pack``) into a DALI pipeline, read with block-level range reads.

Sharding, shuffling, epochs and the last batch behave exactly as in
:func:`fastread.dali.readers.file` for the directory that was packed (the
same :class:`fastread.Reader` does the work), and so does GPU output:
``device="gpu"`` with a host engine (one copy per batch from the pinned
arena) or with ``engine="cufile"``, which reads the ranges straight into GPU
memory (the GDS-like path).
"""
from fastread.dali._common import check_epoch_end, reader_outputs
from fastread.dali._native import native_reader, use_native
from fastread.image import PackedImage
from fastread.reader import check_device
from fastread.s3 import take_options as take_s3_options


def image(*, image, index=None, shard_id=0, num_shards=1, random_shuffle=False,
          shuffle_after_epoch=False, seed=-1, pad_last_batch=False, stick_to_shard=False,
          prefetch_queue_depth=1, name=None, last_batch_policy=None, engine="auto",
          device="cpu", no_copy=False, device_id=None, epoch_end="roll", native=None,
          **kwargs):
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
    """
    check_epoch_end(epoch_end)
    device = check_device(device)
    # S3 options (s3= or flat keywords) for an s3:// image: they reach its
    # index here and the engine reading its samples (either path).
    s3 = take_s3_options(kwargs).get("s3")
    if use_native("fastread.dali.readers.image", native, epoch_end, device, device_id,
                  last_batch_policy, engine, kwargs, ranges=True):
        return native_reader(
            _open(image, index, s3), shard_id=shard_id, num_shards=num_shards,
            random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
            pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
            prefetch_queue_depth=prefetch_queue_depth, name=name, engine=engine, device=device,
            device_id=device_id, kwargs=kwargs, what="fastread.dali.readers.image")
    return reader_outputs(
        "image", lambda: _open(image, index, s3),
        shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
        pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
        prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device=device, no_copy=no_copy,
        device_id=device_id, kwargs=kwargs, epoch_end=epoch_end)


def _open(image, index, s3):
    return image if isinstance(image, PackedImage) else PackedImage(image, index, s3=s3)
