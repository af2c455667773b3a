"""``fastread.dali.readers.cassandra``: cassandra-dali-plugin's
``fn.crs4.cassandra`` as a fastread reader. The same arguments and outputs
(the raw blob as UINT8, the label as INT32 ``[1]`` or its blob), with
fastread's epochs, shards (exact: no overlap, no padding by repetition
unless ``pad_last_batch``), shuffles, checkpoints, ``reader_meta`` and
elastic resume, and ``device="gpu"`` (which the plugin lacks).

Where fastread's DALI plugin loads, the reader is its native operator
``fn.fastread.readers.cassandra`` (dali_plugin/fastread_cassandra.cc: the
cql engine's key reader on native threads, no Python per batch, the
password passed by reference so that ``pipe.serialize()`` never holds it).
Elsewhere, or for what the operator does not do (``epoch_end="stop"``,
``last_batch_policy``, blob labels on the GPU, engine options it does not
take: ``native_obstacle`` says which), a :class:`fastread.Reader` over a
:class:`fastread.cassandra.CassandraSource` feeds the batch external source
every fastread reader shares. ``native=True`` insists on the operator,
``native=False`` never uses it.

The plugin's tuning knobs of its own thread pools (``comm_threads``,
``copy_threads``, ``wait_threads``, ``ooo``, ``slow_start``, ``blocking``)
have no counterpart here and are accepted and ignored; docs/cassandra.md
maps every argument.
"""
from fastread.cassandra import CassandraSource
from fastread.dali import _native
from fastread.dali._common import _DALI_ONLY_ARGS, reader_outputs
from fastread.dali.sources import BatchSource, GpuBatchSource
from fastread.reader import check_device

__all__ = ["cassandra"]

# fn.crs4.cassandra's arguments with no meaning for this reader.
_IGNORED = ("comm_threads", "copy_threads", "wait_threads", "ooo", "slow_start", "blocking",
            "cloud_config", "ssl_own_certificate", "ssl_own_key", "ssl_own_key_pass")


# Reader options the operator takes itself (the rest go to the external source).
_NATIVE_KEYS = {"workers", "pin_memory", "global_batch_size", "shuffle_block", "shuffle_window"}
# CassandraSource's engine options, which the operator gets in its engine_args.
_SOURCE_KEYS = ("consistency", "inflight", "timeout_ms", "deadline_ms", "retries",
                "ssl_verify", "ssl_host")


def native_obstacle(label_type, epoch_end, device, device_id, last_batch_policy, kwargs):
    """Why fn.fastread.readers.cassandra cannot serve this call (None if it can)."""
    if device == "gpu" and label_type == "blob":
        return "label_type='blob' on the GPU (labels of any length are read on the CPU)"
    other = sorted(set(kwargs) - _NATIVE_KEYS - _DALI_ONLY_ARGS)
    if other:
        return "the operator does not take " + ", ".join(other)
    return _native.obstacle(epoch_end, device, device_id, last_batch_policy, None,
                            {k: v for k, v in kwargs.items() if k != "workers"})


def _native_cassandra(source, *, shard_id, num_shards, shuffle, seed, pad_last_batch,
                      prefetch, name, device, kwargs):
    """fn.fastread.readers.cassandra over `source` (a CassandraSource)."""
    import uuid as _uuid

    from nvidia.dali import fn

    what = "fastread.dali.readers.cassandra"
    pipe, stream = _native.stream_args(what, shard_id=shard_id, num_shards=num_shards,
                                       random_shuffle=shuffle, seed=seed,
                                       pad_last_batch=pad_last_batch, stick_to_shard=True,
                                       prefetch_queue_depth=prefetch)
    kwargs = _native.take_elastic(what, kwargs, stream, pipe)
    op_args = {"engine_args": _native._secrets_by_reference(source.engine_args())}
    op_args.update(_native.workers_and_name(kwargs, name))
    if device == "gpu":
        op_args["device"] = "gpu"
    else:
        op_args.update(_native.pin_args(kwargs, pipe.device_id))
    if source.label_type == "none":
        op_args["labels"] = source.labels.tolist()
    uuids = [str(_uuid.UUID(bytes=row.tobytes())) for row in source.ids]
    data, label = fn.fastread.readers.cassandra(table=source.table, uuids=uuids,
                                                label_type=source.label_type, **stream,
                                                **op_args)
    return data, label


class _BlobLabels(BatchSource):
    """label_type='blob': labels are a list of arrays, not int32."""

    def __next__(self):
        if self.roll:
            raise ValueError("readers.cassandra: label_type='blob' needs epoch_end='stop'")
        return self._epoch_batch()


def cassandra(*, table, source_uuids, cassandra_ips=("127.0.0.1",), cassandra_port=9042,
              label_col="label", label_type="int", data_col="data", id_col="id",
              username=None, password=None, use_ssl=False, ssl_certificate=None,
              shard_id=0, num_shards=1, shuffle_every_epoch=False, seed=1234,
              prefetch_buffers=2, io_threads=None, name=None, device="cpu", device_id=None,
              pad_last_batch=False, epoch_end=None, last_batch_policy=None,
              labels=None, native=None, **kwargs):
    """``(data, label)`` of the rows of ``source_uuids`` (uuid strings,
    ``uuid.UUID``, a (n, 16) table, or an id file's path) in ``table``, as
    ``fn.crs4.cassandra`` gives them. ``io_threads``: connections per node
    (each with many requests in flight); ``prefetch_buffers``: batches read
    ahead. Extra keyword arguments are Reader and engine options
    (``workers``, ``deadline_ms`` ... as CassandraSource takes them).
    ``native``: None uses fn.fastread.readers.cassandra where it can serve
    the call and the plugin loads; True insists (ValueError / RuntimeError
    saying why not); False always reads through the external source."""
    check_device(device)
    if epoch_end is None:  # DALI's readers' rolling epochs; blobs cannot be spliced
        epoch_end = "stop" if label_type == "blob" else "roll"
    for k in _IGNORED:
        kwargs.pop(k, None)
    source_keys = {k: kwargs.pop(k) for k in _SOURCE_KEYS if k in kwargs}
    if isinstance(source_uuids, str):
        from fastread.cassandra import read_id_file
        source_uuids, file_labels = read_id_file(source_uuids)
        if labels is None and label_type == "none":
            labels = file_labels
    hosts = [cassandra_ips] if isinstance(cassandra_ips, str) else list(cassandra_ips)

    def open_source():
        return CassandraSource(table, source_uuids, hosts=hosts, port=cassandra_port,
                               data_col=data_col, label_col=label_col, id_col=id_col,
                               label_type=label_type, username=username, password=password,
                               ssl=bool(use_ssl), ssl_ca=ssl_certificate,
                               connections=io_threads, labels=labels, **source_keys)

    if _native.use_native("fastread.dali.readers.cassandra", native, epoch_end, device,
                          device_id, last_batch_policy, None, kwargs,
                          extra_obstacle=lambda: native_obstacle(
                              label_type, epoch_end, device, device_id, last_batch_policy,
                              kwargs)):
        return _native_cassandra(open_source(), shard_id=shard_id, num_shards=num_shards,
                                 shuffle=bool(shuffle_every_epoch), seed=seed,
                                 pad_last_batch=pad_last_batch,
                                 prefetch=max(1, int(prefetch_buffers)), name=name,
                                 device=device, kwargs=kwargs)

    def batches(reader, gpu):
        if label_type == "blob":
            return _BlobLabels(reader)
        return GpuBatchSource(reader, reader.device_id) if gpu else BatchSource(reader)

    data, label = reader_outputs(
        "cassandra", open_source, shard_id=shard_id, num_shards=num_shards,
        random_shuffle=bool(shuffle_every_epoch), seed=seed, pad_last_batch=pad_last_batch,
        stick_to_shard=True, prefetch_queue_depth=max(1, int(prefetch_buffers)), name=name,
        last_batch_policy=last_batch_policy, engine="cql", device=device, no_copy=False,
        device_id=device_id, kwargs=kwargs, make_batch_source=batches, epoch_end=epoch_end)
    return data, label

