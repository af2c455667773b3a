"""``fastread.dali.readers.image``: the samples of a packed image
(``fastread pack``) into a DALI pipeline, read with block-level range reads.

Sharding, shuffling, epochs and the last batch behave exactly as in
:func:`fastread.dali.readers.file` for the directory that was packed (the
same :class:`fastread.Reader` does the work). CPU output only for now.
"""
from fastread import _defaults
from fastread.dali.readers import (_DALI_ONLY_ARGS, _attach, _BatchSource, _policy_name,
                                   _queue_depth)
from fastread.reader import Reader


def image(*, image, index=None, shard_id=0, num_shards=1, random_shuffle=False,
          shuffle_after_epoch=False, seed=-1, pad_last_batch=False, stick_to_shard=False,
          prefetch_queue_depth=1, name=None, last_batch_policy=None, engine="auto",
          device="cpu", no_copy=False, **kwargs):
    """Like ``readers.file`` but over a packed image: returns ``(data, labels)``.

    ``image`` is the image's path (or a :class:`fastread.PackedImage`),
    ``index`` its index if not ``<image>.index``. Extra keyword arguments are
    engine options (``o_direct=True`` for O_DIRECT, ``queue_depth``, ...).
    """
    from nvidia.dali.pipeline import Pipeline

    for arg in _DALI_ONLY_ARGS & set(kwargs):
        kwargs.pop(arg)
    if device not in ("cpu",):
        raise ValueError(f"device={device!r}: readers.image supports only 'cpu' output for now")
    pipe = Pipeline.current()
    if pipe is None:
        raise RuntimeError("fastread.dali.readers.image must be called inside a DALI pipeline "
                           "definition (@pipeline_def or `with pipe:`)")
    policy = _policy_name(last_batch_policy)
    if pad_last_batch and policy == "PARTIAL":
        policy = "FILL"
    if not isinstance(prefetch_queue_depth, int) or prefetch_queue_depth < 1:
        raise ValueError(f"prefetch_queue_depth must be an integer >= 1, got {prefetch_queue_depth!r}")
    reader = Reader(
        image=image, index=index, batch_size=pipe.max_batch_size, shard_id=shard_id,
        num_shards=num_shards, random_shuffle=bool(random_shuffle or shuffle_after_epoch),
        seed=0 if seed is None or seed < 0 else seed,
        pad_last_batch=policy == "FILL", drop_last=policy == "DROP",
        stick_to_shard=stick_to_shard,
        prefetch=max(prefetch_queue_depth, _defaults.get("prefetch")),
        ring_depth=_queue_depth(pipe) + 2, engine=engine, **kwargs)
    return _attach(pipe, reader, name, _BatchSource(reader), no_copy=no_copy)
