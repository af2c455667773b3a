"""Drop-in replacements for DALI readers.

``readers.file`` runs fastread's native DALI operator
(``fn.fastread.readers.file``, :mod:`fastread.dali._plugin`) when the plugin
loads and the call's options are ones it serves; otherwise, and always with
``native=False``, a batch ``fn.external_source`` fed by a
:class:`fastread.Reader`. ``native=True`` insists on the operator and raises
with the reason it cannot be used.

The external source: the native reader runs ahead on its own thread; each
DALI iteration costs one Python call that hands over a batch already in
memory, without a copy (``no_copy=True``). Arrays handed to DALI are kept
unrecycled for as many iterations as DALI may still read them (its prefetch
queue and a margin). The operator: native threads read ahead and DALI gets
views of their batches (no copy, no Python per iteration); with
``device="gpu"`` the operator itself outputs GPU memory (``device="gpu"`` in
DALI's graph), one asynchronous copy of each batch's bytes from its
page-locked arena on the operator's stream.

Epochs (``epoch_end``):

- ``"roll"`` (the default), as DALI's own readers: the pipeline never ends;
  without ``pad_last_batch`` a batch that crosses an epoch's end is filled
  from the next epoch, with it every shard is padded (its last sample
  repeated) to equal shards and whole batches. The DALI iterators find the
  epoch's end from the reader: give the reader a ``name`` and the iterator
  ``reader_name=`` that name (and choose its ``last_batch_policy`` there).
  Both paths give fn.readers.file's samples, batch for batch.
- ``"stop"``: the source raises ``StopIteration`` at the end of each epoch
  (external source only), so ``DALIGenericIterator`` with the default
  ``size=-1`` stops there and ``reset()`` starts the next epoch (a new
  shuffle, and the next shard unless ``stick_to_shard``); every epoch starts
  at its first sample, and ``last_batch_policy`` (``"PARTIAL"``, ``"DROP"``
  or ``"FILL"``, or DALI's ``LastBatchPolicy`` values) chooses the last
  batch, matching what the iterators do with ``fn.readers.file`` and
  ``pad_last_batch=True``.
"""
from fastread.dali._common import check_epoch_end, reader_outputs
from fastread.dali._native import native_reader, use_native
from fastread.dali._image import image
from fastread.dali._numpy import numpy
from fastread.reader import check_device
from fastread.s3 import take_options as take_s3_options
from fastread.source import FileList

__all__ = ["file", "image", "numpy", "epoch_size", "state_dict", "load_state_dict"]


def file(*, file_root=None, file_list=None, files=None, labels=None, file_filters=None,
         shard_id=0, num_shards=1, random_shuffle=False, shuffle_after_epoch=False, seed=-1,
         pad_last_batch=False, stick_to_shard=False, prefetch_queue_depth=1, name=None,
         case_sensitive_filter=False, dir_filters=None, last_batch_policy=None,
         engine="auto", device="cpu", no_copy=False, device_id=None, epoch_end="roll",
         native=None, **kwargs):
    """``fn.readers.file`` read by fastread; returns ``(data, labels)``.

    Same arguments and, without shuffling, the same samples in the same order
    with the same labels (labels are int32 of shape ``[1]``). Shuffling
    (``random_shuffle`` or ``shuffle_after_epoch``) draws one permutation of
    the whole data set per epoch, identical on every rank for a given
    ``seed`` (``-1`` means 0, so ranks agree), so each epoch holds every
    sample exactly once. Extra keyword arguments are engine options
    (``queue_depth``, ``threads``, ``o_direct``, ...) and Reader options
    (``workers``).

    ``file_root`` may be ``s3://bucket/prefix`` (and ``files`` /
    ``file_list`` entries ``s3://`` URLs), as with DALI's own reader: the
    same classes, samples, labels, shards and epochs, read by the s3
    engine. The bucket is reached with ``s3=`` (a :class:`fastread.S3Options`
    or a mapping) and/or the same options as flat keywords
    (``endpoint_url=``, ``region=``, ``access_key_id=``, ...), else the AWS
    environment and files, as DALI does (``AWS_ENDPOINT_URL``, ...). The
    native operator gets explicit options in its ``engine_args`` (so a
    serialized pipeline holds them: prefer the environment for secrets).

    ``native``: None (the operator where it serves the call, else the
    external source), True (the operator, or ValueError / RuntimeError saying
    why not) or False (the external source). ``epoch_end``: ``"roll"`` or
    ``"stop"`` (see the module's documentation); ``name`` is what DALI
    iterators' ``reader_name=`` refers to.

    ``device="gpu"`` delivers both outputs in GPU memory (the pipeline's
    ``device_id`` unless given). The external source: the native workers
    copy each batch from its page-locked arena to the GPU in one copy (the
    ``cufile`` engine reads into GPU memory itself), and DALI gets the
    samples without further copies; device buffers are reused only after
    DALI's prefetch queue has moved past them. The operator: GPU outputs of
    its own (on the pipeline's device; ``device_id`` must be that one), each
    batch copied from its page-locked arena in one copy on the operator's
    stream, the arena reused once the copy is done. The mixed image decoder wants
    ``device="cpu"``; inside a pipeline with a ``device_id`` the external
    source's host arenas are page-locked then too (``pin_memory=False``
    turns that off).
    """
    check_epoch_end(epoch_end)
    device = check_device(device)
    # S3 options, as s3=S3Options(...) or flat (endpoint_url=, ...): they list
    # an s3:// file_root here and reach the engine (either path) as kwargs["s3"].
    s3 = take_s3_options(kwargs).get("s3")
    if use_native("fastread.dali.readers.file", native, epoch_end, device, device_id,
                  last_batch_policy, engine, kwargs):
        return native_reader(
            FileList.scan(file_root, file_filters=file_filters, file_list=file_list, files=files,
                          labels=labels, dir_filters=dir_filters,
                          case_sensitive_filter=case_sensitive_filter, s3=s3),
            shard_id=shard_id, num_shards=num_shards,
            random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
            pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
            prefetch_queue_depth=prefetch_queue_depth, name=name, engine=engine, device=device,
            device_id=device_id, kwargs=kwargs)

    def open_samples():
        return FileList.scan(file_root, file_filters=file_filters, file_list=file_list,
                             files=files, labels=labels, dir_filters=dir_filters,
                             case_sensitive_filter=case_sensitive_filter, s3=s3)

    return reader_outputs(
        "file", open_samples,
        shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
        pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
        prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device=device, no_copy=no_copy,
        device_id=device_id, kwargs=kwargs, epoch_end=epoch_end)


def epoch_size(pipe, index=0):
    """Samples in the current epoch of the pipeline's ``index``-th fastread
    reader on this shard (padding included): the ``size=`` a DALI iterator
    would need. The current epoch is the one being read, else the next one;
    with ``stick_to_shard=False`` each epoch reads another shard, and shards
    may differ by one sample (:meth:`fastread.Reader.epoch_samples`)."""
    readers = getattr(pipe, "_fastread_readers", [])
    if not readers:
        raise ValueError("this pipeline has no fastread reader")
    return readers[index].num_samples


def _reader(pipe, index):
    readers = getattr(pipe, "_fastread_readers", [])
    if not readers:
        raise ValueError("this pipeline has no fastread reader")
    if not isinstance(index, int) or not 0 <= index < len(readers):
        raise ValueError(f"index must be in [0, {len(readers)}) (the pipeline's fastread "
                         f"readers), got {index!r}")
    return readers[index]


def state_dict(pipe, batches, index=0):
    """The position of the pipeline's ``index``-th fastread reader after
    ``batches`` batches of the epoch being read reached the training loop,
    as :meth:`fastread.Reader.state_dict` gives it (elastic with
    ``global_batch_size=``: resumable at another world size). The count is
    the caller's: DALI pulls batches ahead of the loop (its prefetch queue),
    so the reader has handed out more than were consumed.
    Load it with :func:`load_state_dict`."""
    reader = _reader(pipe, index)
    if getattr(reader, "rolls", False):
        raise ValueError("state_dict(pipe, batches) is for epoch_end='stop' readers: with rolling "
                         "epochs the source reads across epoch ends ahead of the loop; use the "
                         "native operator's checkpoints (enable_checkpointing=True, "
                         "pipe.checkpoint()), elastic with global_batch_size")
    pos = reader._position
    epoch = pos[0] if pos is not None else reader.epoch
    # The epoch's own length: without stick_to_shard epochs read other shards.
    count = reader.epoch_batches(epoch)
    if isinstance(batches, bool) or not isinstance(batches, int) or not 0 <= batches <= count:
        raise ValueError(f"batches must be an integer in [0, {count}] (the batches of this "
                         f"shard's epoch {epoch}), got {batches!r}")
    if batches == count:
        epoch, batches = epoch + 1, 0
    return reader.state_dict(epoch, batches)


def load_state_dict(pipe, state, index=0):
    """Makes the pipeline's ``index``-th fastread reader continue from
    ``state`` (:func:`state_dict`, or a :class:`fastread.Reader`'s or
    loader's of the same arguments): call it after defining the pipeline
    and before building it (DALI reads ahead from the start of the epoch
    as soon as it is built)."""
    reader = _reader(pipe, index)
    if reader._position is not None:
        raise RuntimeError("load_state_dict: the pipeline has already read from this fastread "
                           "reader (DALI reads ahead once it is built); load the state right "
                           "after defining the pipeline, before build() or an iterator")
    reader.load_state_dict(state)


# Row gathers from a FeatureStore (fastread.dali.gather), beside the file readers.
from fastread.dali.gather import gather  # noqa: E402,F401
# Record formats (fastread.dali.formats): CIFAR-10, WebDataset and Squirrel shards.
from fastread.dali.formats import cifar10, squirrel, webdataset  # noqa: E402,F401
from fastread.dali.cassandra import cassandra  # noqa: E402,F401
# Parquet / Arrow data sets (fastread.dali.parquet): the Hugging Face layouts.
from fastread.dali.parquet import parquet  # noqa: E402,F401
