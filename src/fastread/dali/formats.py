"""DALI readers for record formats (:mod:`fastread.formats`), built on the
same batch ``fn.external_source`` as :mod:`fastread.dali.readers`: the same
epochs, shards, shuffles, last-batch policies and engine options.

``cifar10(file_root=..., train=True)`` returns ``(images, labels)``: uint8
HWC ``(32, 32, 3)`` images (as ``torchvision.datasets.CIFAR10`` gives them)
and int32 labels of shape ``[1]``.
"""
import collections
import dataclasses

import numpy as np

from fastread._dlviews import array_view, pack_ranges, range_views
from fastread.dali._common import reader_outputs
from fastread.dali.sources import BatchSource
from fastread.dali._native import operator_args, pin_args, stream_args, take_elastic
from fastread.engine import EngineOptions, for_paths
from fastread.s3 import take_options as take_s3_options
from fastread.formats.cifar import Cifar10, to_chw, to_hwc
from fastread.formats.in_memory import InMemory
from fastread.formats.squirrel import SquirrelStore
from fastread.formats.webdataset import WebDataset
from fastread.reader import check_device

__all__ = ["cifar10", "squirrel", "webdataset"]


class _ImageSource(BatchSource):
    """A batch of CIFAR images as one array, ``(N, 32, 32, 3)`` HWC or
    ``(N, 3, 32, 32)`` CHW, and its labels: gathered from memory already in
    that layout (``in_memory``), or made from the batch's records (planes
    interleaved by :func:`fastread.formats.cifar.to_hwc`, one pass). The
    external source sets the layout (an fn.reshape after it measured 3-5%
    of the pipeline's CPU; a TensorListCPU carrying it measured no
    cheaper). (DALI's fn.transpose after the reader measured 1.5x slower on
    2 cores than to_hwc.)

    DALI copies each batch when it is fed (``no_copy=False``): on 2 cores
    the copy (200 KB at batch 64) costs less than sharing the array, which
    measured 18-25% more process CPU per image with the same augmentation
    (DALI holds a Python reference per shared batch and drops it from its
    own threads). After the copy the array may be reused at once, so
    batches made here go into one buffer per batch size, and the in-memory
    gather recycles the buffers of batches the Reader released: no batch
    allocates."""

    def __init__(self, reader, layout, in_memory):
        super().__init__(reader)
        self._in_memory = in_memory
        self._hwc = layout == "HWC"
        self._out = {}  # batch size -> the reused arrays of that many images

    def _buffers(self, n):
        """The output array for a batch of ``n`` and a CHW scratch array."""
        bufs = self._out.get(n)
        if bufs is None:
            chw = np.empty((n, 3, 32, 32), np.uint8)
            bufs = self._out[n] = (np.empty((n, 32, 32, 3), np.uint8) if self._hwc else chw, chw)
        return bufs

    def __next__(self):
        arrays, labels = super().__next__()
        if isinstance(arrays, np.ndarray):  # gathered from memory, in the output layout
            return arrays, labels
        out, chw = self._buffers(len(arrays))
        if self._in_memory:
            # Rolling epochs: a batch spliced across an epoch's end is a
            # list of images already in the output layout.
            np.stack(arrays, out=out)
        elif self._hwc:
            to_hwc(arrays, out=out, scratch=chw)
        else:
            to_chw(arrays, out=out)
        return out, labels


def _cifar_source(file_root, train, in_memory, layout, engine, kwargs):
    """The CIFAR-10 source a reader reads: the records as ranges, or held in
    memory in the output layout (loaded with the reader's engine options)."""
    source = Cifar10(file_root, train=train)
    if not in_memory:
        return source
    option_names = {f.name for f in dataclasses.fields(EngineOptions)}
    options = {k: v for k, v in kwargs.items() if k in option_names or k == "options"}
    convert = to_hwc if layout == "HWC" else to_chw
    return InMemory(source, convert, engine=engine, **options)


def cifar10(*, file_root, train=True, shard_id=0, num_shards=1, random_shuffle=False,
            shuffle_after_epoch=False, seed=-1, pad_last_batch=False, stick_to_shard=False,
            prefetch_queue_depth=1, name=None, last_batch_policy=None, engine="auto",
            device="cpu", device_id=None, output_layout="HWC", in_memory=True,
            epoch_end="stop", **kwargs):
    """The CIFAR-10 train (``train=True``, 50,000) or test images under
    ``file_root`` (the binary ``cifar-10-batches-bin`` or the Python
    ``cifar-10-batches-py`` layout, or a directory holding either); returns
    ``(images, labels)``: uint8 HWC ``32x32x3`` images and int32 labels.
    ``output_layout="CHW"`` gives the records' own ``3x32x32`` planes
    instead, without the transpose (``fn.crop_mirror_normalize`` takes
    either).

    ``in_memory=True`` (default): the images are read once by the native
    engine (about 150 MB for the train set) and held in memory in the
    output layout; each batch is one gather from there into a recycled
    buffer, which DALI copies when it is fed (measured on 2 cores: a range
    read per batch costs about 10x the CPU of the gather, see
    :mod:`fastread.formats.in_memory`). ``in_memory=False`` reads each batch's
    images as byte ranges of the batch files (one range reader per file)
    and transposes them to HWC in one NumPy pass per batch. Shuffling draws
    one permutation of all images of all files per epoch (the same on every
    rank for a given ``seed``). ``device="gpu"`` returns both outputs in GPU
    memory (DALI uploads them).

    Epochs: ``epoch_end="stop"`` (default, as this reader always did) ends
    each epoch with StopIteration, ``last_batch_policy`` choosing its last
    batch; ``epoch_end="roll"`` rolls epochs over as ``readers.file`` does
    (give the DALI iterators ``reader_name=name``). Extra
    keyword arguments are engine and Reader options, as for
    ``readers.file``. Malformed files raise
    :class:`fastread.formats.FormatError` naming the file and offset when
    the pipeline is defined.
    """
    check_device(device)
    if output_layout not in ("HWC", "CHW"):
        raise ValueError(f"output_layout must be 'HWC' or 'CHW', got {output_layout!r}")
    images, labels = reader_outputs(
        "cifar10", lambda: _cifar_source(file_root, train, in_memory, output_layout, engine,
                                         kwargs), shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
        pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
        prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device="cpu", no_copy=False,
        device_id=device_id, kwargs=kwargs,
        make_batch_source=lambda reader, gpu: _ImageSource(reader, output_layout, in_memory),
        epoch_end=epoch_end, layout=[output_layout, ""])
    if device == "gpu":
        images, labels = images.gpu(), labels.gpu()
    return images, labels


class _ComponentSource(BatchSource):
    """A batch of WebDataset samples as two outputs per component: its bytes
    and its lengths (int32, shape ``[1]``), cut to size inside the pipeline
    by ``fn.slice`` (:func:`_cut`). The reader's labels are the samples'
    numbers.

    Usually the bytes are one ``(N, longest)`` uint8 array per component,
    each row a sample's component packed at its start
    (:func:`fastread._dlviews.pack_ranges`, one native pass): DALI takes a
    uniform batch in O(1), while a list of N arrays costs it a TensorList
    sample each (on 2 cores, with decoding, about 20% of the run: DALI's
    per-sample checks build a message string for every sample). The packed
    arrays come from a ring of ``ring_depth`` sets (DALI reads a fed batch,
    without a copy, until that many more have been fed), each reused only
    once DALI has released its views, and grow as needed.

    A batch whose padding would cost more than its bytes (one component far
    longer than the others) goes as views of the samples instead
    (:func:`fastread._dlviews.range_views`, whose DLPack deleters take no
    GIL, unlike NumPy's, which made DALI's executor threads wait for the
    GIL); the ``fn.slice`` then copies them whole. Their bytes stay in place
    because the Reader reuses a batch's arena only ``ring_depth`` batches
    later, and stay mapped (even after the reader closes) while DALI holds
    any of them: each such batch's ViewBlock, which holds its arrays, is
    kept here until DALI has released its views."""

    def __init__(self, reader, source):
        super().__init__(reader)
        self.source = source
        from nvidia.dali.tensors import TensorListCPU
        self._tl = TensorListCPU
        self._held = collections.deque()   # ViewBlocks DALI may still read
        self._depth = max(1, reader.ring_depth or 1)
        # Per batch fed: ([flat bytes, lengths] per component, its ViewBlocks).
        self._sets = collections.deque()
        self._blocks = []

    def _set(self, n):
        """The buffers for the next batch: the oldest set once ring_depth
        are out and DALI has released all its views, else a new one (the
        old set then lives on in its ViewBlocks, in _held, until DALI
        releases it)."""
        sets = self._sets
        bufs = None
        if len(sets) >= self._depth:
            old, blocks = sets.popleft()
            if not any(b.in_use for b in blocks):
                bufs = old
        if bufs is None:
            bufs = [[np.empty(0, np.uint8), np.empty(0, np.int32)] for _ in self.source.ext]
        for b in bufs:
            if len(b[1]) < n:
                b[1] = np.empty(n, np.int32)
        self._blocks = []
        sets.append((bufs, self._blocks))
        return bufs

    def __next__(self):
        held = self._held
        while held and not held[0].in_use:
            held.popleft()
        arrays, ids = super().__next__()
        if not isinstance(arrays, list):
            arrays = list(arrays)
        n = len(arrays)
        bufs = self._set(n)
        out = []
        for (starts, ends), b in zip(self.source.component_ranges(ids.ravel()), bufs):
            sizes = np.where(starts >= 0, ends - starts, 0)
            width = max(1, int(sizes.max()) if n else 1)
            lengths = b[1][:n]
            if n * width <= 2 * int(sizes.sum()) + (1 << 20):
                if len(b[0]) < n * width:
                    b[0] = np.empty(max(n * width, 2 * len(b[0])), np.uint8)
                data = b[0][:n * width].reshape(n, width)
                pack_ranges(arrays, starts, ends, data, lengths)
                out.append(self._whole(data))
            else:
                views, block = range_views(arrays, starts, ends)
                held.append(block)
                out.append(self._tl.from_dlpack_list(views, "", contiguous=False))
                lengths[:] = sizes
            out.append(self._whole(lengths.reshape(n, 1)))
        return tuple(out)

    def _whole(self, array):
        """The array as a DALI batch of its rows, through DLPack: DALI frees
        a NumPy-backed batch on an executor thread that must take the GIL
        (profiled: it stalled the pipeline for most of a GIL switch
        interval per batch while the Python thread ran)."""
        view, block = array_view(array)
        self._held.append(block)
        self._blocks.append(block)
        return self._tl(view.__dlpack__(), "")


def _cut(nodes):
    """Per component, its (bytes, lengths) outputs cut to each sample's
    length: the component's bytes exactly."""
    from nvidia.dali import fn
    return tuple(fn.slice(nodes[i], 0, nodes[i + 1], axes=[0])
                 for i in range(0, len(nodes), 2))


# Engine and Reader options the native WebDataset operator takes as its own
# arguments (O_DIRECT is not among them: tar members are not aligned).
# ``s3`` (S3Options) goes to the operator folded into engine_args.
_WDS_NATIVE_OPTIONS = {"workers", "queue_depth", "threads", "register_buffers",
                       "register_files", "engine_args", "s3", "max_open_files"}


def _wds_native_obstacle(epoch_end, last_batch_policy, engine, kwargs, whole_shards=False):
    """Why the native operator cannot serve this call (None if it can)."""
    from fastread.dali._common import _DALI_ONLY_ARGS
    from fastread.engine import GPU_ENGINES, RANGE_ONLY

    if epoch_end == "stop":
        return ("epoch_end='stop' needs the external source (the operator's epochs roll over, "
                "as DALI's readers' do)")
    if last_batch_policy is not None:
        return "last_batch_policy is for epoch_end='stop'"
    if engine in GPU_ENGINES or engine in RANGE_ONLY:
        return f"engine={engine!r}: the operator reads shards into host memory"
    if whole_shards:
        return ("s3:// shards read whole (s3_read='whole', or in shard order by default): the "
                "operator reads members by ranged GETs (pass s3_read='ranges')")
    other = sorted(set(kwargs) - _WDS_NATIVE_OPTIONS - _DALI_ONLY_ARGS -
                   {"pin_memory", "shuffle_buffer", "global_batch_size",
                    "shuffle_block", "shuffle_window"})
    if other:
        return "the operator does not take " + ", ".join(other)
    return None


def _wds_use_native(native, epoch_end, last_batch_policy, engine, kwargs, whole_shards=False):
    from fastread.dali import _plugin

    if native is not None and not isinstance(native, bool):
        raise ValueError(f"native must be None (automatic), True or False, got {native!r}")
    if native is False:
        return False
    obstacle = _wds_native_obstacle(epoch_end, last_batch_policy, engine, kwargs, whole_shards)
    if native is None:
        return obstacle is None and _plugin.load()
    if obstacle is not None:
        raise ValueError(f"fastread.dali.readers.webdataset(native=True): {obstacle}")
    _plugin.require("fastread.dali.readers.webdataset(native=True)")
    return True


def _native_webdataset(source, *, shard_id, num_shards, random_shuffle, seed, pad_last_batch,
                       stick_to_shard, prefetch_queue_depth, name, engine, kwargs):
    """fn.fastread.readers.webdataset over `source` (a WebDataset): its
    index goes to the operator as a file, written here and deleted with the
    pipeline (the operator reads it when the pipeline is built)."""
    import os
    import tempfile
    import weakref

    from nvidia.dali import fn

    from fastread.engine import check_engine

    pipe, stream = stream_args("fastread.dali.readers.webdataset", shard_id=shard_id,
                               num_shards=num_shards, random_shuffle=random_shuffle, seed=seed,
                               pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
                               prefetch_queue_depth=prefetch_queue_depth)
    kwargs = take_elastic("fastread.dali.readers.webdataset", kwargs, stream, pipe)
    num_shards = stream["num_shards"]
    if len(source) < num_shards:
        raise ValueError(f"fastread.dali.readers.webdataset: {len(source)} samples (after "
                         f"missing_component_behavior={source.missing_component_behavior!r}) "
                         f"cannot make {num_shards} shards")
    # "auto" as it is (the core resolves it), except over s3:// shards: the
    # s3 engine (engine.for_paths), with the options the shards were indexed with.
    engine = check_engine(for_paths(engine, source.files[0].path))
    if kwargs.get("s3") is None and source.s3 is not None:
        kwargs = {**kwargs, "s3": source.s3}
    op_args = operator_args({k: v for k, v in kwargs.items() if k != "max_open_files"},
                            _WDS_NATIVE_OPTIONS, name)
    # Shard descriptors the operator keeps open: max_open_files=, else
    # FASTREAD_MAX_OPEN_FILES's default, clamped to RLIMIT_NOFILE's headroom
    # (fastread._defaults.max_open_files: io_uring's default holds every
    # shard where half the soft limit covers them).
    from fastread._defaults import max_open_files
    op_args["max_open_files"] = max_open_files(kwargs.get("max_open_files"), engine,
                                               len(source.files))
    if kwargs.get("shuffle_buffer"):  # webdataset(initial_fill=N, random_shuffle=True)
        op_args["initial_fill"] = kwargs["shuffle_buffer"]
    # As readers.file's operator: page-locked buffers in a pipeline with a
    # GPU, so DALI's copies to it (the mixed decoder) are DMA.
    op_args.update(pin_args(kwargs, pipe.device_id))
    fd, index = tempfile.mkstemp(prefix="fastread-wds-", suffix=".index")
    os.close(fd)
    weakref.finalize(pipe, _remove, index)
    source.write_native_index(index)
    outputs = fn.fastread.readers.webdataset(
        index=index, ext=[str(e) for e in source.ext], engine=engine, **stream, **op_args)
    return outputs


def _remove(path):
    import os
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def webdataset(*, paths, ext, index_paths=None, missing_component_behavior="empty",
               case_sensitive_extensions=True, dtypes=None, shard_id=0, num_shards=1,
               random_shuffle=False, seed=-1, pad_last_batch=False, stick_to_shard=False,
               prefetch_queue_depth=1, name=None, last_batch_policy=None, engine="auto",
               cache_dir=None, cache_bytes=None, epoch_end="roll", native=None,
               initial_fill=None, **kwargs):
    """``fn.readers.webdataset`` read by fastread: one uint8 output per
    ``ext`` entry (``"jpg;jpeg"``: alternatives), samples grouped by key as
    DALI's reader groups them (see :mod:`fastread.formats.webdataset`,
    ``grouping="dali"``), in shard order without shuffling. Unlike DALI's
    reader, pax and GNU long member names are read.

    ``missing_component_behavior`` is DALI's: ``"empty"`` (default), ``"skip"``
    or ``"error"``. Shards are indexed when the pipeline is defined:
    from ``index_paths`` where given (DALI's wds2idx files, one per shard,
    or fastread's ``.fridx``: :mod:`fastread.formats._index_files`; a stale
    one is refused), else from the node-local index cache or index files
    beside the shards, else their headers parsed natively, once;
    ``.tar.gz`` shards are decompressed once into ``cache_dir`` (bounded
    by ``cache_bytes``, as :class:`fastread.formats.WebDataset`). Shuffling
    draws one permutation of all samples of all shards per epoch, unless
    ``initial_fill=N`` is given: then, as DALI's reader does, the samples
    go in shard order through a shuffle buffer of N (``fr_buffer_shuffle``;
    DALI's default is 1024). The global permutation mixes better; the buffer
    reads each batch from a few neighbouring shards, which is faster when
    there are many small shards (a global shuffle reads nearly every sample
    from another shard). ``dtypes`` other than uint8 are not supported.

    ``native``: None (fastread's native DALI operator,
    ``fn.fastread.readers.webdataset``, where its plugin loads and it serves
    the call, else the external source), True (the operator, or ValueError /
    RuntimeError saying why not) or False (the external source). The
    operator reads each component as a byte range of its shard in native
    threads, no Python per batch, and hands DALI each output of a batch
    from one shard as one block it does not copy. The external source packs
    each batch's components into one array per component (one native copy)
    that DALI takes whole and ``fn.slice`` cuts to the samples' lengths
    (see ``_ComponentSource``).

    ``epoch_end``: ``"roll"`` (default, as DALI's readers: give the DALI
    iterators ``reader_name=name``) or ``"stop"`` (StopIteration at each
    epoch's end, ``last_batch_policy`` choosing the last batch; external
    source only). Extra keyword arguments are engine and Reader options.

    ``paths`` may be ``s3://`` URLs of shards in a bucket, reached with
    ``s3=`` (:class:`fastread.S3Options`) or the same options as keywords
    (``endpoint_url=``, ...), else the AWS environment: each shard is
    indexed once from its streamed bytes, then read whole or by member
    ranges (``s3_read``; by default whole in shard order, ranges for a
    global shuffle: :data:`fastread.formats.webdataset.S3_READ_RULE`).
    """
    from fastread.dali._common import check_epoch_end

    check_epoch_end(epoch_end)
    if dtypes is not None:
        from nvidia.dali import types
        given = dtypes if isinstance(dtypes, (list, tuple)) else [dtypes]
        if any(d not in (types.UINT8, "uint8") for d in given):
            raise ValueError("fastread.dali.formats.webdataset delivers uint8 components only")
    if initial_fill is not None:
        if not isinstance(initial_fill, int) or isinstance(initial_fill, bool) or initial_fill < 1:
            raise ValueError(f"initial_fill must be an integer >= 1, got {initial_fill!r}")
        if random_shuffle:  # without it DALI ignores initial_fill too
            kwargs["shuffle_buffer"] = initial_fill
    # S3 options (s3= or flat keywords) for s3:// shards: they reach the
    # shards when indexing here and the engine reading them (either path).
    s3 = take_s3_options(kwargs).get("s3")
    s3_read = kwargs.pop("s3_read", None)
    source = WebDataset(paths, ext, missing_component_behavior=missing_component_behavior,
                        case_sensitive_extensions=case_sensitive_extensions, cache_dir=cache_dir,
                        cache_bytes=cache_bytes, grouping="dali", s3=s3, s3_read=s3_read,
                        index_paths=index_paths)
    # The operator reads members by ranges; where s3:// shards are better
    # streamed whole (read in order: see webdataset.S3_READ_RULE) the
    # external source's reader does that, so it serves the call.
    in_order = not random_shuffle or bool(kwargs.get("shuffle_buffer"))
    whole = source.s3_read_for(in_order) == "whole"
    use_native = _wds_use_native(native, epoch_end, last_batch_policy, engine, kwargs,
                                 whole_shards=whole)
    if use_native:
        outputs = _native_webdataset(
            source, shard_id=shard_id, num_shards=num_shards, random_shuffle=random_shuffle,
            seed=seed, pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
            prefetch_queue_depth=prefetch_queue_depth, name=name, engine=engine, kwargs=kwargs)
        if not isinstance(outputs, (list, tuple)):
            return outputs
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
    nodes = reader_outputs(
        "webdataset", lambda: source, shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle, seed=seed, pad_last_batch=pad_last_batch,
        stick_to_shard=stick_to_shard, prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device="cpu", no_copy=True,
        device_id=None, kwargs=kwargs,
        make_batch_source=lambda reader, gpu: _ComponentSource(reader, source),
        num_outputs=2 * len(source.ext), epoch_end=epoch_end)
    outputs = _cut(nodes)
    return outputs[0] if len(outputs) == 1 else outputs


class _FieldSource(BatchSource):
    """A batch of squirrel samples as one output per key."""

    def __init__(self, reader, store):
        super().__init__(reader)
        self.store = store

    def __next__(self):
        arrays, ids = super().__next__()
        return tuple(self.store.fields(arrays, ids.ravel()))


def squirrel(*, url, keys=("image", "label"), shard_id=0, num_shards=1, random_shuffle=False,
             seed=-1, pad_last_batch=False, stick_to_shard=False, prefetch_queue_depth=1,
             name=None, last_batch_policy=None, engine="auto", cache_dir=None, cache_bytes=None,
             **kwargs):
    """A squirrel MessagePack store (squirrel-core's ``SquirrelStore`` with
    ``MessagepackSerializer``: a directory of ``*.gz`` shards) as DALI
    outputs, one per ``keys`` entry: arrays as the store holds them (dtype
    and shape), plain values (labels) as arrays. Samples in the store's key
    order, then shard order (what squirrel-core's ``get_iter()`` yields);
    ``random_shuffle`` draws one permutation of all samples per epoch.
    Shards are decompressed once into ``cache_dir`` (bounded by
    ``cache_bytes``) and indexed; each
    sample is then one byte range read by the native engine and each array
    a view of it."""
    store = SquirrelStore(url, keys=keys, cache_dir=cache_dir, cache_bytes=cache_bytes)
    return reader_outputs(
        "squirrel", lambda: store, shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle, seed=seed, pad_last_batch=pad_last_batch,
        stick_to_shard=stick_to_shard, prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device="cpu", no_copy=True,
        device_id=None, kwargs=kwargs,
        make_batch_source=lambda reader, gpu: _FieldSource(reader, store),
        num_outputs=len(store.keys))
