"""``fastread.dali.readers.parquet``: the rows of Parquet files and Arrow
IPC files (the Hugging Face layouts: a Hub ``data/<split>-*.parquet``
directory, a ``datasets`` ``save_to_disk`` directory) in a DALI pipeline,
where users otherwise write an ``fn.external_source`` over ``pyarrow``.

Outputs ``(data, label)``: each row's image bytes as a UINT8 sample (a
zero-copy view of the decoded column, handed to DALI without a copy) for
DALI's decoders, and the label as INT32 ``[1]``. Read by a
:class:`fastread.Reader` over :class:`fastread.formats.Parquet` (column
chunks read as byte ranges by fastread's engine, decoded by Apache Arrow
off the GIL) and fed through the batch external source every fastread
reader shares: epochs, shards, shuffles (``initial_fill=N``: in file order
through a shuffle buffer of N, reading each row group once), checkpoints,
``reader_meta`` and elastic resume. There is no native DALI operator for
Parquet: decoding is Arrow's C++ reader, driven from Python
(docs/parquet.md says why).
"""
from fastread.dali._common import check_epoch_end, reader_outputs
from fastread.formats.parquet import Parquet
from fastread.reader import check_device
from fastread.s3 import take_options as take_s3_options

__all__ = ["parquet"]


def parquet(*, paths, image="image", label="label", split=None, missing="error",
            cache_bytes=None, shard_id=0, num_shards=1, random_shuffle=False, seed=-1,
            pad_last_batch=False, stick_to_shard=False, prefetch_queue_depth=1, name=None,
            last_batch_policy=None, engine="auto", device="cpu", device_id=None,
            epoch_end="roll", initial_fill=None, **kwargs):
    """``(data, label)`` of the rows of ``paths`` (files, directories, an
    ``s3://`` prefix: as :class:`fastread.formats.Parquet` takes them, with
    ``image``, ``label``, ``split``, ``missing``, ``cache_bytes``). The
    reader arguments are ``fn.readers.file``'s. ``s3=`` (or the S3 options
    as keywords) reaches ``s3://`` paths; other keyword arguments are Reader
    and engine options (``workers``, ``prefetch`` ...)."""
    check_device(device)
    check_epoch_end(epoch_end)
    if initial_fill is not None:
        if not isinstance(initial_fill, int) or isinstance(initial_fill, bool) or initial_fill < 1:
            raise ValueError(f"initial_fill must be an integer >= 1, got {initial_fill!r}")
        if random_shuffle:
            kwargs["shuffle_buffer"] = initial_fill
    s3 = take_s3_options(kwargs).get("s3")
    # Opened here, when the pipeline is defined: a missing file or column
    # is named at the call that gave it.
    source = Parquet(paths, image=image, label=label, split=split, missing=missing,
                     cache_bytes=cache_bytes, s3=s3)
    return reader_outputs(
        "parquet", lambda: source, shard_id=shard_id, num_shards=num_shards,
        random_shuffle=bool(random_shuffle), seed=seed, pad_last_batch=pad_last_batch,
        stick_to_shard=stick_to_shard, prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device=device, no_copy=True,
        device_id=device_id, kwargs=kwargs, epoch_end=epoch_end)
