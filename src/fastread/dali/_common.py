"""What the fastread DALI readers share: turning a :class:`fastread.Reader`
into the outputs of a batch ``fn.external_source`` (last-batch policies,
DALI's prefetch depth, CPU and GPU batch sources).

Private: ``readers.py``, ``_image.py``, ``_numpy.py`` and ``formats.py``
import it; it imports none of them. What DALI pulls the batches from is
public, in :mod:`fastread.dali.sources`.
"""
import weakref

from fastread import _defaults
from fastread.sampling import check_flag, check_shard_args, check_shuffle
from fastread.dali.sources import BatchSource, GpuBatchSource
from fastread.reader import Reader

# fn.readers.file arguments that tune DALI's own reader and mean nothing here.
_DALI_ONLY_ARGS = {
    "dont_use_mmap", "read_ahead", "initial_fill", "lazy_init", "skip_cached_images",
    "tensor_init_bytes", "bytes_per_sample_hint", "preserve", "seed_hint",
}
_POLICIES = ("PARTIAL", "DROP", "FILL")


def _policy_name(policy):
    if policy is None:
        return "PARTIAL"
    name = getattr(policy, "name", policy)
    name = str(name).upper()
    if name not in _POLICIES:
        raise ValueError(f"last_batch_policy must be one of {', '.join(_POLICIES)}, got {policy!r}")
    return name


def _queue_depth(pipe):
    depth = getattr(pipe, "prefetch_queue_depth", 2)
    if isinstance(depth, dict):
        return int(depth.get("cpu_size", 2)) + int(depth.get("gpu_size", 2))
    return int(depth)


EPOCH_ENDS = ("roll", "stop")


def check_epoch_end(epoch_end):
    if epoch_end not in EPOCH_ENDS:
        raise ValueError(f"epoch_end must be 'roll' (DALI's readers: epochs roll over, use "
                         f"reader_name= with the DALI iterators) or 'stop' (StopIteration at "
                         f"each epoch's end), got {epoch_end!r}")
    return epoch_end


def reader_outputs(reader_name, open_samples, *, shard_id, num_shards, random_shuffle, seed,
                   pad_last_batch, stick_to_shard, prefetch_queue_depth, name,
                   last_batch_policy, engine, device, no_copy, device_id, kwargs,
                   make_batch_source=None, num_outputs=2, epoch_end="stop", layout=None):
    """The outputs of a fastread reader in the current pipeline: the part
    the readers share. `open_samples()` returns the fastread.SampleSource to
    read (called once the pipeline is known to exist);
    `make_batch_source(reader, gpu)`, if given, makes what DALI pulls from
    (default: data and labels). `epoch_end`: "stop" (StopIteration at each
    epoch's end, `last_batch_policy` chooses the last batch) or "roll"
    (DALI's readers' epochs; the iterators get `reader_name=name`).
    `layout`: DALI's layout of the outputs (a string, or one per output),
    set by the external source itself (an fn.reshape after it costs a
    pass over the batch). `device`: as the entry point checked it
    (fastread.reader.check_device)."""
    from nvidia.dali.pipeline import Pipeline

    for arg in _DALI_ONLY_ARGS & set(kwargs):
        kwargs.pop(arg)
    shard_id, num_shards = check_shard_args(shard_id, num_shards)
    # The Reader checks "block"'s options (shuffle_block=, shuffle_window= in kwargs).
    shuffle_mode, _, _ = check_shuffle(random_shuffle, kwargs.get("shuffle_block"),
                                       kwargs.get("shuffle_window"), option="random_shuffle")
    for flag, value in (("pad_last_batch", pad_last_batch), ("stick_to_shard", stick_to_shard)):
        check_flag(flag, value)
    pipe = Pipeline.current()
    if pipe is None:
        raise RuntimeError(f"fastread.dali.readers.{reader_name} must be called inside a DALI "
                           "pipeline definition (@pipeline_def or `with pipe:`)")
    roll = check_epoch_end(epoch_end) == "roll"
    if roll and last_batch_policy is not None:
        raise ValueError(f"fastread.dali.readers.{reader_name}: last_batch_policy is for "
                         "epoch_end='stop'; with rolling epochs (the default) give it to the DALI "
                         "iterator, with reader_name= this reader's name (and pad_last_batch "
                         "here for FILL)")
    policy = _policy_name(last_batch_policy)
    if pad_last_batch and policy == "PARTIAL":
        policy = "FILL"
    if kwargs.get("global_batch_size") is not None:
        check_elastic(f"fastread.dali.readers.{reader_name}", kwargs["global_batch_size"],
                      num_shards, pipe, roll, policy == "FILL")
        stick_to_shard = True
    if not isinstance(prefetch_queue_depth, int) or prefetch_queue_depth < 1:
        raise ValueError(f"prefetch_queue_depth must be an integer >= 1, got {prefetch_queue_depth!r}")
    gpu = device == "gpu"
    device_id = pipe.device_id if device_id is None else device_id
    if gpu and device_id is None:
        raise ValueError("device='gpu' needs a pipeline with a device_id (or device_id=)")
    if device_id is not None:
        kwargs["device_id"] = device_id
    reader = Reader(
        source=open_samples(), batch_size=pipe.max_batch_size, shard_id=shard_id,
        num_shards=num_shards,
        random_shuffle=shuffle_mode or False, seed=0 if seed is None or seed < 0 else seed,
        pad_last_batch=policy == "FILL", drop_last=policy == "DROP",
        stick_to_shard=stick_to_shard,
        prefetch=max(prefetch_queue_depth, _defaults.get("prefetch")),
        # DALI may read a fed batch until `depth` more iterations have run
        # (rolling: plus the batch whose tail was carried into the next one).
        ring_depth=_queue_depth(pipe) + 2 + roll, engine=engine, device=device, **kwargs)
    if make_batch_source is not None:
        batches = make_batch_source(reader, gpu)
    else:
        batches = GpuBatchSource(reader, device_id) if gpu else BatchSource(reader)
    batches.roll = roll
    reader.rolls = roll
    return _attach(pipe, reader, name, batches, no_copy=True if gpu else no_copy,
                   device=device, num_outputs=num_outputs, layout=layout)


def check_elastic(what, global_batch_size, num_shards, pipe, roll, pad):
    """Elastic sharding (global_batch_size=) in a DALI pipeline, either
    path: a pipeline batch size that is the rank's slice of the global
    batch, and with rolling epochs (DALI's readers' and the operator's)
    pad_last_batch, so that every batch is a whole slice of one global batch
    (a partial last global batch would be filled from the next epoch).
    With rolling epochs, reader_meta reports the padded elastic epoch, which
    the DALI iterators count right with last_batch_policy FILL."""
    from fastread.sampling import check_global_batch

    if roll and not pad:
        raise ValueError(f"{what}: global_batch_size (elastic sharding) with rolling epochs "
                         "(epoch_end='roll') needs pad_last_batch=True (a partial last global "
                         "batch would be filled from the next epoch); or use epoch_end='stop' "
                         "and choose the last batch with last_batch_policy")
    local = check_global_batch(global_batch_size, num_shards)
    if pipe.max_batch_size != local:
        raise ValueError(f"{what}: the pipeline's batch_size ({pipe.max_batch_size}) must be "
                         f"global_batch_size={global_batch_size} / num_shards={num_shards} = "
                         f"{local}, the rank's slice of each global batch")


def _attach(pipe, reader, name, source, no_copy, device="cpu", num_outputs=2, layout=None):
    """The DataNodes of a batch external source pulling from `source`;
    `reader` is kept on the pipeline so it lives as long as it. A source
    with a ``cuda_stream`` has its GPU data ready in that stream's order."""
    from nvidia.dali import fn

    # DALI copies a GPU batch that is not one contiguous allocation even with
    # no_copy; use_copy_kernel makes that one batched kernel instead of a
    # cudaMemcpyAsync per sample (~1 ms of host time at batch 256).
    nodes = fn.external_source(
        source=source, num_outputs=num_outputs, batch=True, no_copy=bool(no_copy), cycle=False,
        device=device, cuda_stream=getattr(source, "cuda_stream", None),
        use_copy_kernel=device == "gpu", **({} if layout is None else {"layout": layout}))
    # DALI refuses a name on a multi-output external source; the name stays
    # on the reader (for epoch_size and messages).
    reader.name = name
    readers = getattr(pipe, "_fastread_readers", None)
    if readers is None:
        readers = []
        pipe._fastread_readers = readers
        _serve_reader_meta(pipe)
    if name is not None and any(r.name == name for r in readers):
        raise ValueError(f"two fastread readers named {name!r} in one pipeline")
    readers.append(reader)
    return nodes[0] if num_outputs == 1 else tuple(nodes)


def reader_meta(reader):
    """DALI's reader metadata (``pipe.reader_meta(name)``) for a rolling
    fastread reader: what the DALI iterators' ``reader_name=`` needs."""
    n = len(reader.paths)
    shards = reader.num_shards
    if reader.global_batch_size is not None:  # elastic: whole global batches (check_elastic)
        padded = -(-n // reader.global_batch_size) * reader.global_batch_size
    else:
        padded = -(-n // shards) * shards if reader.pad_last_batch else n
    return {"epoch_size": n,
            "epoch_size_padded": padded,
            "number_of_shards": shards, "shard_id": reader.shard_id,
            "pad_last_batch": bool(reader.pad_last_batch),
            "stick_to_shard": bool(reader.stick_to_shard)}


def _serve_reader_meta(pipe):
    """Makes ``pipe.reader_meta`` answer for the pipeline's named rolling
    fastread readers too (an external source is no DALI reader, so DALI's
    backend does not know them), so ``DALIGenericIterator(reader_name=...)``
    works as with fn.readers.file. The pipeline is held weakly."""
    pipe_ref = weakref.ref(pipe)
    dali_meta = type(pipe).reader_meta

    def meta(name=None):
        p = pipe_ref()
        ours = {r.name: reader_meta(r) for r in getattr(p, "_fastread_readers", [])
                if r.name is not None and getattr(r, "rolls", False)}
        if name is not None:
            return ours[name] if name in ours else dali_meta(p, name)
        merged = dict(dali_meta(p))
        merged.update(ours)
        return merged

    pipe.reader_meta = meta
