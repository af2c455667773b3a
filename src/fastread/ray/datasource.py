"""Ray Data datasources over fastread's sources (see :mod:`fastread.ray`).

The driver lists the samples (or the shards) and cuts them into read tasks;
each task reads its batch in one native call and returns one block (a
pyarrow Table). A task's function is a module-level function bound with
:func:`functools.partial`, so what travels to the workers is the batch's
paths or ranges and the engine options, never the whole listing.
"""
import functools
import glob
import inspect
import io
import os

import numpy as np
import pyarrow as pa
import ray.data
from ray.data.block import BlockAccessor, BlockMetadata

import fastread
from fastread.engine import EngineOptions, check_engine
from fastread.files import read_files_packed
from fastread.names import NameTable, PathTable
from fastread.formats.parquet import Parquet
from fastread.formats.squirrel import store_shards
from fastread.s3 import S3Options, is_url
from fastread.sampling import epoch_indices
from fastread.source import FileRanges, check_engine_for

__all__ = ["FilesDatasource", "ImageDatasource", "WebDatasetDatasource", "SquirrelDatasource",
           "ParquetDatasource",
           "read"]

# The column types of read_files()/read_image() blocks. large_binary: one
# block's bytes may pass 2 GiB (256 samples of 8 MiB), which binary's
# 32-bit offsets cannot hold.
_BYTES = pa.large_binary()


def read(datasource, ray_remote_args=None):
    """``ray.data.read_datasource`` over ``datasource``: one read task per
    batch as the datasource cut them (``override_num_blocks``: Ray would
    otherwise merge or split them to its own idea of parallelism)."""
    # override_num_blocks is parallelism's name since Ray 2.10.
    key = "override_num_blocks" if "override_num_blocks" in _READ_PARAMS else "parallelism"
    kwargs = {key: datasource.num_tasks}
    # Remote arguments read_datasource names (num_cpus, memory, ...) go by
    # name: Ray 2.60 deprecates its ray_remote_args dict, which older ones
    # need for everything (and this one still for the rest).
    rest = {}
    for name, value in (ray_remote_args or {}).items():
        if name in _READ_PARAMS and name not in ("datasource", "ray_remote_args"):
            kwargs[name] = value
        else:
            rest[name] = value
    if rest:
        kwargs["ray_remote_args"] = rest
    return ray.data.read_datasource(datasource, **kwargs)


# -- Ray API differences between versions ------------------------------------------

_META_PARAMS = frozenset(inspect.signature(BlockMetadata).parameters)
_TASK_PARAMS = frozenset(inspect.signature(ray.data.ReadTask.__init__).parameters)
_READ_PARAMS = frozenset(inspect.signature(ray.data.read_datasource).parameters)


def _read_task(read_fn, num_rows, size_bytes, input_files, per_task_row_limit=None):
    """A ReadTask with its metadata, in the shape this Ray takes: the schema
    moved from BlockMetadata to ReadTask (2.44+), exec_stats became
    required, per_task_row_limit came later."""
    meta = {"num_rows": num_rows, "size_bytes": size_bytes, "input_files": input_files,
            "exec_stats": None, "schema": None}
    meta = BlockMetadata(**{k: v for k, v in meta.items() if k in _META_PARAMS})
    kwargs = {}
    if per_task_row_limit is not None and "per_task_row_limit" in _TASK_PARAMS:
        kwargs["per_task_row_limit"] = per_task_row_limit
    return ray.data.ReadTask(read_fn, meta, **kwargs)


# -- blocks ---------------------------------------------------------------------

def _binary_column(arrays):
    """A large_binary Arrow array of the samples' bytes: one copy into one
    buffer, offsets from the lengths (no Python bytes object per sample)."""
    lengths = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.concatenate(arrays) if arrays else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(_BYTES, len(arrays),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _packed_column(data, offsets):
    """A large_binary Arrow array over ``data`` and ``offsets``
    (:func:`fastread.files.read_files_packed`) as they are: no copy, the
    array keeping the engine's arena alive through ``data``."""
    return pa.Array.from_buffers(_BYTES, len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def decode_image(data, name):
    """One sample's bytes decoded by Pillow as RGB, uint8 HWC; ValueError
    naming the sample if they are no image Pillow can read."""
    from PIL import Image, UnidentifiedImageError

    from fastread.decode import to_rgb

    try:
        with Image.open(io.BytesIO(data)) as im:
            # to_rgb returns an RGB image as it is (convert() would copy it).
            return np.asarray(to_rgb(im))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"{name}: cannot decode as an image ({e})") from None


def _columns(data_column, labels, names):
    return pa.table({"bytes": data_column,
                     "label": pa.array(np.asarray(labels, np.int32)),
                     "path": pa.array(list(names), pa.string())})


def _block(arrays, labels, names, decode):
    if decode:
        images = [decode_image(a, n) for a, n in zip(arrays, names)]
        return BlockAccessor.batch_to_block({
            "image": images, "label": np.asarray(labels, np.int32),
            "path": np.asarray(names, dtype=object)})
    return _columns(_binary_column(arrays), labels, names)


def _engine_args(engine, options, s3, engine_options):
    """(engine, EngineOptions) checked on the driver, where a bad option
    raises at once, naming it; what the tasks pass to fastread."""
    opts = EngineOptions.coerce(options, **dict(engine_options))
    if s3 is not None:
        opts = opts.replace(s3=S3Options.coerce(s3))
    check_engine(engine)
    return engine, opts


def _check_batch_size(batch_size, auto=False):
    if auto and batch_size is None:
        return
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer{' or None' if auto else ''}, "
                         f"got {batch_size!r}")


# What auto-sizing takes a file of unknown size (an s3:// URL) to be.
_UNKNOWN_FILE_SIZE = 128 << 10
# The most files auto-sizing gives one task: each travels in the task's
# arguments and takes a descriptor while it is read.
_AUTO_MAX_FILES = 16384
# With decode=True a block holds decoded images, several times the files'
# bytes, and decoding, not Ray's cost per task, sets the pace.
_AUTO_DECODE_FILES = 256


def _cluster_cpus():
    """The CPUs of the Ray cluster the dataset will run on: the connected
    one's, else this machine's (read_datasource starts a local one)."""
    if ray.is_initialized():
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return os.cpu_count() or 1


def _mean_file_size(paths, sample=64):
    """The mean size of up to ``sample`` files spread over ``paths``
    (stat'ed; s3:// URLs and files that cannot be stat'ed count as
    _UNKNOWN_FILE_SIZE): a few stats on the driver, not one per file."""
    if not paths:
        return _UNKNOWN_FILE_SIZE
    step = max(1, len(paths) // sample)
    sizes = []
    for p in paths[::step][:sample]:
        try:
            sizes.append(_UNKNOWN_FILE_SIZE if is_url(p) else os.stat(p).st_size)
        except OSError:
            sizes.append(_UNKNOWN_FILE_SIZE)   # its task will raise, naming it
    return sum(sizes) / len(sizes)


def auto_batch_size(paths, decode=False, cpus=None, target_block_bytes=None,
                    mean_size=None):
    """Files per read task where ``batch_size=None``.

    As few tasks as Ray's blocks allow: each a block of up to
    ``DataContext.target_max_block_size`` (128 MiB; larger ones Ray cuts
    again) at the files' mean size, evened out over the tasks that makes.
    A Ray read task costs a fixed ~25-30 ms of scheduling and bookkeeping
    however little it reads (2 cores: 20 tasks of empty blocks take 0.5 s a
    pass, 200 take 3.5 s), and Ray 2.60 runs an execution's tasks one at a
    time until it has learned the cluster's resources, about a second in:
    a pass over a few hundred MB never gets past that, so more tasks than
    blocks only add their fixed cost. The CPUs are used inside a task: its
    native read has one ring or thread per CPU (up to 16). With
    ``decode=True``, 256 files (or fewer, one task per CPU): Pillow decodes
    one image at a time per task, so the tasks are what run in parallel,
    and a decoded block is several times the files' bytes.
    """
    n = len(paths)
    if n == 0:
        return 1
    if decode:
        cpus = _cluster_cpus() if cpus is None else cpus
        return max(1, min(_AUTO_DECODE_FILES, -(-n // cpus)))
    if target_block_bytes is None:
        target_block_bytes = ray.data.DataContext.get_current().target_max_block_size \
            or (128 << 20)
    if mean_size is None:
        mean_size = _mean_file_size(paths)
    fit = int(target_block_bytes // max(1.0, mean_size))
    per = max(1, min(fit, _AUTO_MAX_FILES))
    tasks = -(-n // per)
    return -(-n // tasks)


def _batches(n, batch_size, shuffle, seed):
    """Lists of sample numbers, one per read task: in order, or cut from a
    permutation drawn from ``seed`` (fastread's own, the one the Reader and
    the DALI operators draw)."""
    _check_batch_size(batch_size)
    if shuffle:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        order = epoch_indices(n, shuffle=True, seed=int(seed))
    else:
        order = np.arange(n, dtype=np.int64)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


class _Batched(ray.data.Datasource):
    """A datasource whose tasks are fixed up front (``self._tasks``: one
    (read_fn, num_rows, size_bytes, input_files) per task)."""

    @property
    def num_tasks(self):
        return max(1, len(self._tasks))

    def estimate_inmemory_data_size(self):
        sizes = [t[2] for t in self._tasks]
        return None if any(s is None for s in sizes) else int(sum(sizes))

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None, **_):
        # ``parallelism`` is Ray's hint; the batches are ours (read tasks
        # sized to batches, each one native call), so it is not followed.
        return [_read_task(fn, rows, size, files, per_task_row_limit)
                for fn, rows, size, files in self._tasks]


# -- whole files ----------------------------------------------------------------------

def _read_file_batch(paths, labels, decode, engine, opts):
    # A PathTable planned (FilesDatasource): the task's path strings now, in
    # the task, not held by the driver's plan.
    paths = paths.tolist() if isinstance(paths, PathTable) else list(paths)
    if decode:
        return [_block(fastread.read_files(paths, engine, opts), labels, paths, True)]
    # The files back to back in the engine's arena, which the block's
    # bytes column is, as it is: Ray's put into its object store is then
    # the one copy a task makes (a column gathered from per-file arrays
    # was a second, costing about as much as the reads).
    data, offsets = read_files_packed(paths, engine, opts)
    return [_columns(_packed_column(data, offsets), labels, paths)]


def _path_table(paths):
    """``paths`` as a :class:`PathTable` (as it is when it is one)."""
    return paths if isinstance(paths, PathTable) else PathTable.from_paths(paths)


class FilesDatasource(_Batched):
    """Whole files (see :func:`fastread.ray.read_files`).

    Planned in O(index): the listing is a :class:`PathTable` (a local tree
    scanned with ``table=True``; a list of paths or an s3:// listing turned
    into one), and each task carries its files as ``PathTable.take`` of it
    (numpy columns: the names' bytes, 8 B of offset and 4 B of directory id a
    file, and only the directories it uses), not a Python string a file; the
    task makes its path strings when it runs. ``input_files`` is None: Ray
    2.60 uses it only for ``Dataset.input_files()`` and for the aggregate
    metadata ``count()`` and ``schema()`` build, which concatenates every
    task's list into one (O(N) strings again), and it pickles it into each
    task's ``ray.put``; the estimate of blocks it might feed comes from the
    task count (``num_outputs``) here."""

    def __init__(self, source, *, file_filters=None, labels=None, shuffle=False, seed=None,
                 batch_size=None, decode=False, engine="auto", options=None, s3=None,
                 engine_options=None):
        self._engine, self._opts = _engine_args(engine, options, s3, engine_options or {})
        _check_batch_size(batch_size, auto=True)
        if isinstance(source, fastread.FileList):
            paths, labs = _path_table(source.paths), np.asarray(source.labels, np.int32)
        elif isinstance(source, (str, bytes, os.PathLike)):
            if labels is not None:
                raise ValueError("labels= goes with a list of paths; a directory's labels are "
                                 "its class subdirectories'")
            # table=True: a local tree's listing as columns; an s3:// one
            # stays a list of URLs (its versions, unused here), made a table.
            paths, labs = fastread.scan(source, file_filters=file_filters, s3=s3, table=True)
            paths = _path_table(paths)
        else:
            paths, labs = fastread.scan(None, files=list(source), labels=labels, table=True)
        self.paths, self.labels = paths, np.asarray(labs, np.int32)
        self._source = source
        if batch_size is None:
            batch_size = auto_batch_size(paths, decode)
        self.batch_size = batch_size
        self._tasks = []
        for idx in _batches(len(paths), batch_size, shuffle, seed):
            fn = functools.partial(_read_file_batch, paths.take(idx), self.labels[idx],
                                   bool(decode), self._engine, self._opts)
            self._tasks.append((fn, len(idx), None, None))

    def get_name(self):
        return "fastread.read_files"

    def __repr__(self):
        return f"FilesDatasource({len(self.paths)} files, {len(self._tasks)} tasks)"


# -- packed images -------------------------------------------------------------------

def _read_range_batch(path, offsets, lengths, labels, names, decode, engine, opts):
    names = list(names)   # a NameTable planned (ImageDatasource): strings now, in the task
    part = FileRanges(path, offsets, lengths, labels, names)
    if decode:
        return [_block(part.read(np.arange(len(part)), engine, opts), labels, names, True)]
    # As _read_file_batch: the ranges back to back, the block's column.
    data, offs = part.read_packed(np.arange(len(part)), engine, opts)
    return [_columns(_packed_column(data, offs), labels, names)]


class ImageDatasource(_Batched):
    """A packed image's samples (see :func:`fastread.ray.read_image`)."""

    def __init__(self, image, *, index=None, shuffle=False, seed=None, batch_size=None,
                 decode=False, engine="auto", options=None, s3=None, engine_options=None):
        _check_batch_size(batch_size, auto=True)
        if not isinstance(image, fastread.PackedImage):
            image = fastread.PackedImage(image, index, s3=s3)
        if s3 is None:
            s3 = image.s3
        self._engine, self._opts = _engine_args(engine, options, s3, engine_options or {})
        image.check_options(self._opts.resolve(self._engine_name(image)))
        self.image = image
        if batch_size is None:
            # The samples' sizes are the index's: their mean, exactly.
            batch_size = auto_batch_size(image.names, decode, mean_size=(
                float(np.mean(image.lengths)) if len(image) else 0.0))
        self.batch_size = batch_size
        self._tasks = []
        for idx in _batches(len(image), batch_size, shuffle, seed):
            # A binary index's names: a NameTable of the task's (numpy), not a
            # Python string a sample held by every planned task.
            names = (image.names.take(idx) if isinstance(image.names, NameTable)
                     else [image.names[i] for i in idx.tolist()])
            fn = functools.partial(_read_range_batch, image.path, image.offsets[idx],
                                   image.lengths[idx], image.labels[idx], names, bool(decode),
                                   self._engine, self._opts)
            self._tasks.append((fn, len(idx), int(image.lengths[idx].sum()), (image.path,)))

    def _engine_name(self, image):
        return check_engine_for(image, self._engine)

    def get_name(self):
        return "fastread.read_image"

    def __repr__(self):
        return f"ImageDatasource({self.image!r}, {len(self._tasks)} tasks)"


# -- record shards -------------------------------------------------------------------

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def _shard_list(shards):
    """The shards a WebDataset read takes: a list as given; one string: a
    directory (its tar files, sorted), a glob, or one shard."""
    if isinstance(shards, (str, os.PathLike)):
        one = os.fspath(shards)
        if not is_url(one) and os.path.isdir(one):
            found = sorted(os.path.join(one, n) for n in os.listdir(one)
                           if n.endswith(_TAR_SUFFIXES))
            if not found:
                raise FileNotFoundError(f"no tar shards ({', '.join(_TAR_SUFFIXES)}) in {one!r}")
            return found
        if not is_url(one) and glob.has_magic(one):
            found = sorted(glob.glob(one))
            if not found:
                raise FileNotFoundError(f"no shards match {one!r}")
            return found
        return [one]
    out = [os.fspath(s) for s in shards]
    if not out:
        raise ValueError("read_webdataset needs at least one shard")
    return out


def _shard_size(path):
    if is_url(path):
        return None
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"shard {path!r} does not exist") from None


def _chunks(n, batch_size):
    return [np.arange(i, min(n, i + batch_size), dtype=np.int64) for i in range(0, n, batch_size)]


def _read_wds_shard(shard, ext, batch_size, wds_args, engine, opts):
    src = fastread.WebDataset([shard], ext, **wds_args)
    keys = src.files[0].names if src.files else []
    for idx in _chunks(len(src), batch_size):
        arrays = src.read(idx, engine, opts)
        cols = {str(e): _binary_column(c) for e, c in zip(src.ext, src.components(arrays, idx))}
        cols["key"] = pa.array([keys[i] for i in idx.tolist()], pa.string())
        cols["path"] = pa.array([shard] * len(idx), pa.string())
        yield pa.table(cols)


class WebDatasetDatasource(_Batched):
    """WebDataset tar shards, one task each (see
    :func:`fastread.ray.read_webdataset`)."""

    def __init__(self, shards, ext, *, batch_size=256, missing_component_behavior="empty",
                 case_sensitive_extensions=True, cache_dir=None, engine="auto", options=None,
                 s3=None, engine_options=None):
        self._engine, self._opts = _engine_args(engine, options, s3, engine_options or {})
        _batches(0, batch_size, False, None)   # checks batch_size
        self.shards = _shard_list(shards)
        ext = [ext] if isinstance(ext, str) else list(ext)
        if not ext:
            raise ValueError("ext must name at least one component")
        names = {str(e) for e in ext}
        if names & {"key", "path"} or len(names) != len(ext):
            raise ValueError(f"ext entries must be distinct and not 'key' or 'path' (the "
                             f"other columns), got {ext!r}")
        args = {"missing_component_behavior": missing_component_behavior,
                "case_sensitive_extensions": case_sensitive_extensions,
                "cache_dir": cache_dir, "s3": self._opts.s3}
        self._tasks = [(functools.partial(_read_wds_shard, s, ext, batch_size, args,
                                          self._engine, self._opts),
                        None, _shard_size(s), (s,)) for s in self.shards]

    def get_name(self):
        return "fastread.read_webdataset"


def _squirrel_column(values):
    if values and all(isinstance(v, np.ndarray) and v.ndim for v in values) \
            and len({(v.dtype, v.shape) for v in values}) == 1:
        return np.stack(values)
    if values and all(isinstance(v, np.ndarray) and v.ndim == 0 for v in values):
        return np.array([v.item() for v in values])
    return values


def _read_squirrel_shard(shard, keys, batch_size, cache_dir, engine, opts):
    src = fastread.SquirrelStore(keys=keys, shards=[shard], cache_dir=cache_dir)
    for idx in _chunks(len(src), batch_size):
        arrays = src.read(idx, engine, opts)
        cols = {k: _squirrel_column(v) for k, v in zip(src.keys, src.fields(arrays, idx))}
        cols["path"] = np.array([shard] * len(idx), dtype=object)
        yield BlockAccessor.batch_to_block(cols)


class SquirrelDatasource(_Batched):
    """A squirrel MessagePack store, one task per shard (see
    :func:`fastread.ray.read_squirrel`)."""

    def __init__(self, url=None, keys=("image", "label"), *, shards=None, batch_size=256,
                 cache_dir=None, engine="auto", options=None, engine_options=None):
        self._engine, self._opts = _engine_args(engine, options, None, engine_options or {})
        _batches(0, batch_size, False, None)
        if shards is None:
            if url is None:
                raise ValueError("read_squirrel needs a store url or shards=")
            shards = store_shards(url)
        self.shards = [os.fspath(s) for s in shards]
        if not self.shards:
            raise ValueError(f"squirrel store {url!r} has no shards")
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        if not keys or "path" in keys:
            raise ValueError(f"keys must name at least one field, and not 'path' (the shard "
                             f"column), got {keys!r}")
        self._tasks = [(functools.partial(_read_squirrel_shard, s, keys, batch_size, cache_dir,
                                          self._engine, self._opts),
                        None, _shard_size(s), (s,)) for s in self.shards]

    def get_name(self):
        return "fastread.read_squirrel"


def _read_parquet_file(path, args, engine, opts):
    src = Parquet([path], **args)
    for g in range(len(src.metas[0].rows)):
        yield src.row_group(0, g, engine, opts)


class ParquetDatasource(_Batched):
    """Parquet / Arrow files, one task per file, one block per row group as
    Arrow decoded it (see :func:`fastread.ray.read_parquet`)."""

    def __init__(self, paths, *, image="image", label="label", columns=None, split=None,
                 engine="auto", options=None, s3=None, engine_options=None):
        self._engine, self._opts = _engine_args(engine, options, s3, engine_options or {})
        # Opened on the driver: files listed, footers checked, a bad path or
        # column named at once.
        src = Parquet(paths, image=image, label=label, columns=columns, split=split,
                      s3=self._opts.s3)
        self.paths = src.paths
        args = {"image": image, "label": src.label_column, "columns": columns,
                "s3": self._opts.s3}
        self._tasks = [(functools.partial(_read_parquet_file, p, args, self._engine, self._opts),
                        int(sum(m.rows)), int(m.size), (p,))
                       for p, m in zip(src.paths, src.metas)]

    def get_name(self):
        return "fastread.read_parquet"
