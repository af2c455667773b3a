"""The native DALI operator (``fn.fastread.readers.file``) behind the
readers: whether it can serve a call, and the call itself.

``readers.file`` gives it files as bytes; ``readers.numpy`` gives it the
arrays' layout too (``npy_*`` arguments, from headers parsed once at
definition), so that each sample comes out as its array, with no Python per
batch; ``readers.image`` gives it a packed image and its samples' byte
ranges (``image``, ``range_offsets``, ``range_lengths``, from the index),
or, for a local version-3 binary index, the index itself (``image_index``
and its layout: the operator maps it, no list per sample). Where the operator cannot serve a call (``obstacle``), the readers
fall back to their external sources, or raise with the reason when
``native=True``.
"""
import re
import secrets

from fastread import _defaults
from fastread.dali import _listing, _plugin
from fastread.dali._common import _DALI_ONLY_ARGS, check_elastic
from fastread.engine import (GPU_ENGINES, RANGE_ONLY, URL_ENGINES, EngineOptions, check_engine,
                             check_option, for_paths)
from fastread.s3 import SECRET_KEYS, engine_args_for

# Engine and Reader options the operator takes as its own arguments.
# ``s3`` (S3Options) goes to it folded into engine_args: the s3 engine
# resolves its settings in C from engine_args and the environment, so the
# operator reaches a bucket as Python's readers do.
NATIVE_OPTIONS = {"workers", "queue_depth", "threads", "o_direct", "direct_alignment",
                  "register_buffers", "register_files", "engine_args", "s3"}


def obstacle(epoch_end, device, device_id, last_batch_policy, engine, kwargs, ranges=False):
    """Why the operator cannot serve this call (None if it can). `ranges`:
    the samples are byte ranges of an image, which range-only engines read."""
    if epoch_end == "stop":
        return ("epoch_end='stop' needs the external source (the operator's epochs roll over, "
                "as DALI's readers' do)")
    if last_batch_policy is not None:
        return "last_batch_policy is for epoch_end='stop'"
    if device == "gpu":
        from nvidia.dali.pipeline import Pipeline
        pipe = Pipeline.current()
        pipe_device = None if pipe is None else pipe.device_id
        if pipe_device is None:
            return ("device='gpu' in a pipeline without a device_id (the operator's GPU outputs "
                    "are on the pipeline's device)")
        if device_id is not None and device_id != pipe_device:
            return (f"device_id={device_id} is not the pipeline's device ({pipe_device}), where "
                    "the operator's GPU outputs are")
        if kwargs.get("pin_memory") is False:
            return "pin_memory=False: the GPU operator copies from page-locked memory"
    if engine in GPU_ENGINES:
        return f"engine={engine!r}: the operator reads into host memory"
    if engine in RANGE_ONLY and not ranges:
        return f"engine={engine!r} reads byte ranges of an image, not files"
    other = sorted(set(kwargs) - NATIVE_OPTIONS - _DALI_ONLY_ARGS -
                   {"pin_memory", "global_batch_size", "shuffle_block", "shuffle_window"})
    if other:
        return "the operator does not take " + ", ".join(other)
    return None


def use_native(what, native, epoch_end, device, device_id, last_batch_policy, engine, kwargs,
               extra_obstacle=None, ranges=False):
    """Whether `what` (a reader's name, for messages) runs the operator:
    native=None where it can serve the call and the plugin loads; True
    insists (ValueError / RuntimeError saying why not); False never."""
    if native is not None and not isinstance(native, bool):
        raise ValueError(f"native must be None (automatic), True or False, got {native!r}")
    if native is False:
        return False
    why = obstacle(epoch_end, device, device_id, last_batch_policy, engine, kwargs, ranges)
    why = why or (extra_obstacle() if extra_obstacle else None)
    if native is None:
        return why is None and _plugin.load()
    if why is not None:
        raise ValueError(f"{what}(native=True): {why}")
    _plugin.require(f"{what}(native=True)")
    return True


_SECRET_ARG = re.compile(r"(?:^|,)\s*(?:" + "|".join(SECRET_KEYS) + r")\s*=")


def _secrets_by_reference(engine_args):
    """``engine_args`` for an operator: as they are, or, where they hold a
    secret (S3 credentials given explicitly), a reference to them kept in
    this process by the plugin (dali_plugin/engine_args_ref.h), since DALI
    writes operator arguments into ``pipe.serialize()`` whole."""
    if not _SECRET_ARG.search(engine_args):
        return engine_args
    token = secrets.token_hex(16)
    _plugin.register_engine_args(token, engine_args)
    return f"fastread_engine_args_ref={token}"


def workers_and_name(kwargs, name):
    """The operator arguments `workers` (checked: an integer in 1..64, as
    the operators' own bound) and `name`, where given."""
    out = {}
    workers = kwargs.get("workers")
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise ValueError(f"workers must be an integer in 1..64, got {workers!r}")
        out["workers"] = workers
    if name is not None:
        out["name"] = name
    return out


def operator_args(kwargs, options, name):
    """The engine and Reader options among `kwargs` that an operator takes
    (`options`), checked as the external source checks them (ValueError /
    TypeError naming the option), and the reader's name."""
    given = {k: v for k, v in kwargs.items() if k in options and k != "workers"}
    op_args = {k: v for k, v in EngineOptions.coerce(**given)._given().items() if k in given}
    s3 = op_args.pop("s3", None)
    if s3 is not None:
        op_args["engine_args"] = engine_args_for(op_args.get("engine_args", ""), s3)
    if "engine_args" in op_args:
        op_args["engine_args"] = _secrets_by_reference(op_args["engine_args"])
    op_args.update(workers_and_name(kwargs, name))
    return op_args


def pin_args(kwargs, pipe_device):
    """The operators' pin_device argument for host outputs: the pipeline's
    device, unless pin_memory=False / FASTREAD_PIN_MEMORY=0 or no device."""
    pin = kwargs.get("pin_memory")
    pin = (check_option("pin_memory", _defaults.get("pin_memory"), from_env=True)
           if pin is None else check_option("pin_memory", pin))
    return {"pin_device": int(pipe_device)} if pin and pipe_device is not None else {}


def stream_args(what, *, shard_id, num_shards, random_shuffle, seed, pad_last_batch,
                stick_to_shard, prefetch_queue_depth):
    """The current pipeline and DALI's reader arguments for an operator, checked
    as the external source checks them (errors naming the argument)."""
    from nvidia.dali.pipeline import Pipeline

    from fastread.sampling import check_flag, check_shard_args, check_shuffle

    pipe = Pipeline.current()
    if pipe is None:
        raise RuntimeError(f"{what} must be called inside a DALI pipeline "
                           "definition (@pipeline_def or `with pipe:`)")
    shard_id, num_shards = check_shard_args(shard_id, num_shards)
    # "block" is checked with its options by take_elastic (they are kwargs).
    mode, _, _ = check_shuffle(random_shuffle, option="random_shuffle")
    for flag, value in (("pad_last_batch", pad_last_batch), ("stick_to_shard", stick_to_shard)):
        check_flag(flag, value)
    if not isinstance(prefetch_queue_depth, int) or prefetch_queue_depth < 1:
        raise ValueError(f"prefetch_queue_depth must be an integer >= 1, got {prefetch_queue_depth!r}")
    return pipe, dict(shard_id=shard_id, num_shards=num_shards,
                      random_shuffle=mode is not None, seed=-1 if seed is None else int(seed),
                      **({"shuffle_block": 0} if mode == "block" else {}),
                      pad_last_batch=bool(pad_last_batch), stick_to_shard=bool(stick_to_shard),
                      prefetch_queue_depth=prefetch_queue_depth)


def take_elastic(what, kwargs, stream, pipe):
    """`kwargs` without ``global_batch_size``, which goes (checked) into the
    operator's `stream` arguments: elastic sharding, whose checkpoints
    resume at another num_shards (plugin_common.h ElasticOrder: the order
    of fastread.sampling.elastic_indices, the external source's)."""
    from fastread.sampling import check_shuffle

    kwargs = dict(kwargs)
    # random_shuffle="block" (stream_args marks it) with its options: the
    # operator's shuffle_block / shuffle_window (0: a full shuffle).
    block, window = kwargs.pop("shuffle_block", None), kwargs.pop("shuffle_window", None)
    _, block, window = check_shuffle(
        "block" if "shuffle_block" in stream else stream["random_shuffle"], block, window,
        option="random_shuffle")
    if block:
        stream.update(shuffle_block=block, shuffle_window=window)
    global_batch_size = kwargs.pop("global_batch_size", None)
    if global_batch_size is not None:
        check_elastic(what, global_batch_size, stream["num_shards"], pipe, True,
                      stream["pad_last_batch"])
        stream.update(global_batch_size=int(global_batch_size), stick_to_shard=True)
    return kwargs


def native_reader(samples, *, shard_id, num_shards, random_shuffle, seed, pad_last_batch,
                  stick_to_shard, prefetch_queue_depth, name, engine, device, device_id, kwargs,
                  what="fastread.dali.readers.file", layout_args=None, gpu_stage="gpu"):
    """fn.fastread.readers.file over `samples`: (data, labels); `device` as
    the entry point checked it (fastread.reader.check_device). A FileList
    goes as files= and labels=, or, from _listing.MIN_FILES local files on,
    as a binary listing the operator maps (file_index=); a FileRanges (a packed image) as image=,
    its byte ranges and its samples' names and labels.
    `layout_args`: the operator's npy_* arguments (readers.numpy).
    `gpu_stage`: with device="gpu", the operator's DALI backend: "gpu", or
    "mixed" (its copies on DALI's mixed stream, overlapping the GPU
    operators that follow: see dali_plugin/fastread_reader.cc)."""
    from nvidia.dali import fn

    pipe, stream = stream_args(what, shard_id=shard_id, num_shards=num_shards,
                               random_shuffle=random_shuffle, seed=seed,
                               pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
                               prefetch_queue_depth=prefetch_queue_depth)
    kwargs = take_elastic(what, kwargs, stream, pipe)
    pipe_device = pipe.device_id
    # Checked here as for the external source: ValueError / TypeError naming
    # the engine or option, before DALI builds anything. "auto" reaches the
    # operator as it is, and the core resolves it (fr_engine_auto), except
    # over s3:// samples: the s3 engine (engine.for_paths decides it for
    # every reader; the core's own 'auto' means io_uring or psync).
    names = samples.names
    if kwargs.get("s3") is None and getattr(samples, "s3", None) is not None:
        kwargs = {**kwargs, "s3": samples.s3}   # the options its index was read with
    engine = for_paths(engine, samples.path if samples.reads_ranges else
                       (names[0] if names else None))
    engine = check_engine(engine)
    if kwargs.get("s3") is not None and engine not in URL_ENGINES:
        raise TypeError(f"{what}: S3 options apply only to s3:// samples (engine 's3'), "
                        f"not to engine {engine!r}")
    op_args = operator_args(kwargs, NATIVE_OPTIONS, name)
    # In a pipeline with a GPU the operator's buffers are page-locked through
    # that device (unless pin_memory=False / FASTREAD_PIN_MEMORY=0), so that
    # DALI's copies of its zero-copy outputs to the GPU are DMA from them, as
    # from the CPU outputs DALI allocates itself there. The GPU operator
    # always pins them, through the pipeline's device (its own device_id).
    if device == "gpu":
        if gpu_stage not in ("gpu", "mixed"):
            raise ValueError(f"{what}: gpu_stage must be 'gpu' or 'mixed', got {gpu_stage!r}")
        op_args["device"] = gpu_stage
    else:
        op_args.update(pin_args(kwargs, pipe_device))
    # The mapped index serves unless the layout came as lists (npy_shapes:
    # readers.numpy's headers, a decoded pack's JSON index).
    layout = getattr(samples, "mapped_layout", None)
    if layout_args is not None and "npy_shapes" in layout_args:
        layout = None
    if samples.reads_ranges:
        # O_DIRECT needs aligned offsets: refused here as by the external
        # source (the operator checks again, by sample name).
        samples.check_options(op_args)
        op_args["image"] = samples.path
        if layout is not None:
            # A local binary index: the operator maps it (image_index=), so
            # no argument holds a value per sample (10^8 samples build a
            # pipeline in the time of the index's header).
            op_args.update(index_args(layout, shapes=layout_args is not None))
            data, labels = fn.fastread.readers.file(engine=engine, **stream, **op_args,
                                                    **(layout_args or {}))
            return data, labels
        op_args.update(range_offsets=samples.offsets.tolist(),
                       range_lengths=samples.lengths.tolist())
        names = samples.names
    else:
        names = samples.paths
        # A long local list goes as a listing the operator maps (file_index=):
        # no argument of N strings; s3:// URLs and short lists stay files=.
        if (layout_args is None and engine not in URL_ENGINES and
                len(names) >= _listing.MIN_FILES):
            listed = _listing.listing_args(names, samples.labels)
            if listed is not None:
                data, labels = fn.fastread.readers.file(engine=engine, **stream, **op_args,
                                                        **listed)
                return data, labels
    data, labels = fn.fastread.readers.file(
        # DALI's arguments are lists: a NameTable (a binary index's names) or
        # the default numbers of ranges become one here.
        files=names if isinstance(names, list) else list(names), labels=samples.labels.tolist(), engine=engine, **stream, **op_args,
        **(layout_args or {}))
    return data, labels


#: The mapped index's columns in the order of the operator's index_columns.
_INDEX_COLUMNS = ("offsets", "lengths", "labels", "name_offsets", "names")


def index_args(layout, shapes=False):
    """The operator's image_index arguments from a PackedImage's
    ``mapped_layout`` (image_index.py): the index, its header line, count,
    size, and where its columns lie (with ``shapes``, a decoded pack's
    shapes column last)."""
    cols = layout["columns"]
    names = _INDEX_COLUMNS + (("shapes",) if shapes else ())
    return dict(image_index=layout["path"], index_head=layout["head"],
                index_count=int(layout["count"]), index_bytes=int(layout["bytes"]),
                index_columns=[int(cols[c][0]) for c in names],
                index_names_bytes=int(cols["names"][1]))
