"""Drop-in replacements for DALI readers, built on ``fn.external_source``.

The native reader runs ahead on its own thread; each DALI iteration costs one
Python call that hands over a batch already in memory, without a copy
(``no_copy=True``). Arrays handed to DALI are kept unrecycled for as many
iterations as DALI may still read them (its prefetch queue and a margin).

Epochs end for real: the source raises ``StopIteration`` at the end of each
epoch, so ``DALIGenericIterator`` / ``DALIClassificationIterator`` with the
default ``size=-1`` stop there, and ``reset()`` starts the next epoch (a new
shuffle, and the next shard unless ``stick_to_shard``). ``reader_name=`` is
for DALI's own readers only; choose the last-batch behaviour here instead,
with ``last_batch_policy`` (``"PARTIAL"``, ``"DROP"`` or ``"FILL"``, or
DALI's ``LastBatchPolicy`` values), which matches what the iterators do with
``fn.readers.file`` and ``pad_last_batch=True``.

One deliberate difference: every epoch starts at its first sample. DALI's
own reader without ``pad_last_batch`` streams on past an epoch's end to fill
the last batch, so its next epoch starts shifted by those samples; with
``pad_last_batch=True`` DALI behaves as fastread always does.
"""
from fastread.dali._common import reader_outputs
from fastread.dali._image import image
from fastread.dali._numpy import numpy
from fastread.source import FileList

__all__ = ["file", "image", "numpy", "epoch_size"]


def file(*, file_root=None, file_list=None, files=None, labels=None, file_filters=None,
         shard_id=0, num_shards=1, random_shuffle=False, shuffle_after_epoch=False, seed=-1,
         pad_last_batch=False, stick_to_shard=False, prefetch_queue_depth=1, name=None,
         case_sensitive_filter=False, dir_filters=None, last_batch_policy=None,
         engine="auto", device="cpu", no_copy=False, device_id=None, **kwargs):
    """``fn.readers.file`` read by fastread; returns ``(data, labels)``.

    Same arguments and, without shuffling, the same samples in the same order
    with the same labels (labels are int32 of shape ``[1]``). Shuffling
    (``random_shuffle`` or ``shuffle_after_epoch``) draws one permutation of
    the whole data set per epoch, identical on every rank for a given
    ``seed`` (``-1`` means 0, so ranks agree), so each epoch holds every
    sample exactly once. Extra keyword arguments are engine options
    (``queue_depth``, ``threads``, ``o_direct``, ...) and Reader options
    (``workers``).

    ``device="gpu"`` delivers both outputs in GPU memory (the pipeline's
    ``device_id`` unless given): the native workers copy each batch from its
    page-locked arena to the GPU in one copy (the ``cufile`` engine reads
    into GPU memory itself), and DALI gets the samples without further
    copies. Device buffers are reused only after DALI's prefetch queue has
    moved past them. The mixed image decoder wants ``device="cpu"``; inside
    a pipeline with a ``device_id`` the host arenas are page-locked then
    too (``pin_memory=False`` turns that off).
    """
    def open_samples():
        return FileList.scan(file_root, file_filters=file_filters, file_list=file_list,
                             files=files, labels=labels, dir_filters=dir_filters,
                             case_sensitive_filter=case_sensitive_filter)

    return reader_outputs(
        "file", open_samples,
        shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
        pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
        prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device=device, no_copy=no_copy,
        device_id=device_id, kwargs=kwargs)


def epoch_size(pipe, index=0):
    """Samples per epoch of the pipeline's ``index``-th fastread reader on this
    shard (padding included): the ``size=`` a DALI iterator would need."""
    readers = getattr(pipe, "_fastread_readers", [])
    if not readers:
        raise ValueError("this pipeline has no fastread reader")
    return readers[index].num_samples


# Row gathers from a FeatureStore (fastread.dali.gather), beside the file readers.
from fastread.dali.gather import gather  # noqa: E402,F401
# Record formats (fastread.dali.formats): CIFAR-10, WebDataset and Squirrel shards.
from fastread.dali.formats import cifar10, squirrel, webdataset  # noqa: E402,F401
