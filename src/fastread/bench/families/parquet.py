"""Modes over a Parquet data set in the Hugging Face layout (issue 40).
DATA is a directory of ``data/<split>-NNNNN-of-NNNNN.parquet`` files with
an image struct column ``{bytes, path}`` and an integer ``label`` column,
as the Hub keeps image sets: ``fastread make-dataset DIR --format parquet``
writes the 20,000-JPEG tree that way (row groups of 1,000 rows), or
:func:`fastread.formats.parquet.write_image_parquet` any class tree. Each
step is a batch of the image column's bytes (with ``--decode``, decoded by
DALI where the mode runs DALI).

==============================  ============================================
``parquet-reader``              ``fastread.Reader(source=Parquet(DATA),
                                random_shuffle=True)``: column chunks read
                                as ranges by fastread's engine, decoded by
                                Arrow, rows as views
``parquet-reader-fileorder``    the same Reader in file order (no shuffle):
                                the order of ``parquet-pyarrow-dali``
``parquet-reader-buffer``       the same Reader with ``shuffle_buffer=``
                                :data:`SHUFFLE_BUFFER` (the row-group-aware
                                shuffle: row groups read in file order)
``parquet-dali-fastread``       ``fastread.dali.readers.parquet(paths=DATA,
                                random_shuffle=True)`` in DALI
``parquet-datasets``            ``datasets.load_dataset("parquet")``
                                (images undecoded) ``.with_format("torch")``
                                in a ``DataLoader(num_workers=2,
                                shuffle=True)``: the Python baseline
``parquet-pyarrow-dali``        ``pq.ParquetFile.iter_batches`` feeding
                                DALI's ``fn.external_source`` (what DALI
                                users write today)
``parquet-ray``                 Ray Data ``read_parquet(DATA)
                                .iter_batches()``
``parquet-litdata``             LitData's ``StreamingDataset`` over its own
                                converted format (``litdata.optimize`` of
                                the rows, made once in ``DATA/.litdata``)
                                in a ``StreamingDataLoader(num_workers=2,
                                shuffle=True)``
``parquet-files-ceiling``       ``fastread.Reader`` over the same JPEGs as
                                files (the tree the Parquet was written
                                from, where its note names it): the ceiling
==============================  ============================================
"""
import json
import os

import numpy as np

from fastread.bench.registry import Dataset, Mode, add_dataset_kind, default_engine

NAME = "parquet"
ORDER = 65
CPU = ("cpu",)
#: Samples of the shuffle buffer of ``parquet-reader-buffer``: 4 row groups
#: of the 1,000-row data set (DALI's ``initial_fill`` default is 1,024).
SHUFFLE_BUFFER = 4096

add_dataset_kind("parquet", "a Hugging Face-style directory of Parquet files (data/*.parquet)")


def _files(path):
    data = os.path.join(path, "data")
    where = data if os.path.isdir(data) else path
    return sorted(os.path.join(where, n) for n in os.listdir(where) if n.endswith(".parquet"))


def detect(path):
    if not os.path.isdir(path):
        return None
    files = _files(path)
    if not files:
        return None
    from fastread.bench.registry import BenchError
    from fastread.formats import FormatError, Parquet
    try:
        src = Parquet(path)
    except (FormatError, ValueError, OSError) as e:
        raise BenchError(str(e)) from None
    nbytes = sum(int(m.metadata.row_group(g).column(c).total_uncompressed_size)
                 for m in src.metas for g in range(len(m.rows))
                 for c in range(m.metadata.num_columns)
                 if m.metadata.row_group(g).column(c).path_in_schema == src._image_leaf)
    return Dataset(root=path, primary="parquet", kinds=("parquet",), paths=files,
                   samples=len(src), nbytes=nbytes)


def source_tree(path):
    """The JPEG tree the data set was written from (its note), or None."""
    from fastread.formats.parquet import SOURCE_NOTE
    try:
        with open(os.path.join(path, SOURCE_NOTE)) as f:
            root = json.load(f).get("file_root")
    except (OSError, ValueError):
        return None
    return root if root and os.path.isdir(root) else None


def modes(env):
    auto = default_engine(env)
    yield Mode("parquet-reader", NAME, "parquet",
               f"fastread.Reader(source=Parquet(DATA), random_shuffle=True, engine={auto!r})",
               "fastread's Parquet source: column chunks read as ranges, Arrow decodes, "
               "rows as views", engine=auto, check=_check_engine, build=_build_reader,
               default=CPU)
    # The same order as the peers that do not shuffle (pyarrow's
    # iter_batches, Ray): compared with them, not with a global shuffle.
    yield Mode("parquet-reader-fileorder", NAME, "parquet",
               f"fastread.Reader(source=Parquet(DATA), random_shuffle=False, engine={auto!r})",
               "fastread's Parquet source in file order (as pyarrow's iter_batches reads)",
               engine=auto, check=_check_engine, build=_build_reader_fileorder, default=CPU)
    yield Mode("parquet-reader-buffer", NAME, "parquet",
               f"fastread.Reader(source=Parquet(DATA), random_shuffle=True, "
               f"shuffle_buffer={SHUFFLE_BUFFER}, engine={auto!r})",
               "fastread's Parquet source with the row-group-aware shuffle (a buffer over "
               "rows read in file order)", engine=auto, check=_check_engine,
               build=_build_reader_buffer, default=CPU)
    yield Mode("parquet-dali-fastread", NAME, "parquet",
               "fastread.dali.readers.parquet(paths=DATA, random_shuffle=True)",
               "fastread's Parquet reader in a DALI pipeline", engine=auto,
               check=_check_dali, build=_build_dali_fastread, dali=True, default=CPU)
    yield Mode("parquet-datasets", NAME, "parquet",
               "datasets.load_dataset('parquet') + with_format('torch') + "
               "DataLoader(num_workers=2, shuffle=True)",
               "Hugging Face datasets in a DataLoader: the Python baseline",
               check=_check_datasets, build=_build_datasets, role="baseline", default=CPU)
    yield Mode("parquet-pyarrow-dali", NAME, "parquet",
               "pyarrow ParquetFile.iter_batches -> fn.external_source",
               "pyarrow batches fed to DALI in Python (what DALI users write today)",
               check=_check_dali_plain, build=_build_pyarrow_dali, role="python", dali=True,
               default=CPU)
    yield Mode("parquet-ray", NAME, "parquet", "ray.data.read_parquet(DATA).iter_batches()",
               "Ray Data's Parquet reader", check=_check_ray, build=_build_ray,
               role="python", default=CPU)
    yield Mode("parquet-litdata", NAME, "parquet",
               "litdata.StreamingDataset(<DATA converted by litdata.optimize>) + "
               "StreamingDataLoader(num_workers=2, shuffle=True)",
               "LitData on its own converted format (the conversion made once, untimed)",
               check=_check_litdata, build=_build_litdata, role="python", default=CPU)
    yield Mode("parquet-files-ceiling", NAME, "parquet",
               f"fastread.Reader(file_root=<the JPEG tree>, random_shuffle=True, "
               f"engine={auto!r})",
               "the same JPEGs read as files by fastread: the ceiling for bytes",
               engine=auto, check=_check_ceiling, build=_build_ceiling, role="reference",
               default=CPU)


# -- checks ----------------------------------------------------------------------

def _check_engine(mode, cfg):
    from fastread.bench.environment import try_import
    _pa, why = try_import("pyarrow.parquet")
    if why:
        return f"pyarrow {why}"
    if cfg.device == "gpu":
        return "bytes stay in host memory here: --device cpu"
    return cfg.env.engine_error(mode.engine) if mode.engine else None


def _check_dali(mode, cfg):
    return _check_engine(mode, cfg) or cfg.env.dali_error_for(fastread_reader=True)


def _check_dali_plain(mode, cfg):
    return _check_engine(mode, cfg) or cfg.env.dali_error_for(fastread_reader=False)


def _check_datasets(mode, cfg):
    from fastread.bench.environment import try_import
    for module in ("datasets", "torch"):
        _m, why = try_import(module)
        if why:
            return f"{module} {why}"
    return "--decode is DALI's here" if cfg.decode else _check_engine(mode, cfg)


def _check_ray(mode, cfg):
    from fastread.ray import ray_reason
    return ray_reason() or ("--decode is DALI's here" if cfg.decode else
                            _check_engine(mode, cfg))


def _check_litdata(mode, cfg):
    from fastread.bench.environment import try_import
    for module in ("litdata", "torch"):
        _m, why = try_import(module)
        if why:
            return f"{module} {why} (pip install litdata)"
    return "--decode is DALI's here" if cfg.decode else _check_engine(mode, cfg)


def _check_ceiling(mode, cfg):
    if cfg.dataset is not None and source_tree(cfg.data_dir) is None:
        return "the data set's note names no JPEG tree (write it with write_image_parquet)"
    return _check_engine(mode, cfg)


# -- builds ------------------------------------------------------------------------

class _BytesRunner:
    """Batches of an iterator factory of lists of byte strings (or of
    (samples, bytes, batch) triples), epoch after epoch; the previous batch
    kept referenced until the next call."""

    def __init__(self, epoch, closer=None):
        self._epoch, self._closer = epoch, closer
        self._it, self._keep = epoch(), None

    def next(self):
        try:
            arrays = next(self._it)
        except StopIteration:
            self._it = self._epoch()
            arrays = next(self._it)
        if isinstance(arrays, tuple):
            samples, nbytes, self._keep = arrays
            return samples, nbytes
        self._keep = arrays
        return len(arrays), sum(len(a) for a in arrays)

    def close(self):
        self._keep = self._it = None
        if self._closer is not None:
            self._closer()


def _build_reader(mode, cfg, **order):
    import fastread
    from fastread.bench.runners import ReaderRunner
    from fastread.formats import Parquet
    order = order or {"random_shuffle": True}
    return ReaderRunner(fastread.Reader(source=Parquet(cfg.data_dir), batch_size=cfg.batch_size,
                                        engine=mode.engine, **order, **cfg.engine_options))


def _build_reader_fileorder(mode, cfg):
    return _build_reader(mode, cfg, random_shuffle=False)


def _build_reader_buffer(mode, cfg):
    return _build_reader(mode, cfg, random_shuffle=True, shuffle_buffer=SHUFFLE_BUFFER)


def _build_ceiling(mode, cfg):
    import fastread
    from fastread.bench.runners import ReaderRunner
    return ReaderRunner(fastread.Reader(source_tree(cfg.data_dir), batch_size=cfg.batch_size,
                                        random_shuffle=True, engine=mode.engine,
                                        **cfg.engine_options))


def _build_dali_fastread(mode, cfg):
    from fastread.bench.runners import DaliRunner

    def reader():
        from fastread.dali import readers
        return readers.parquet(paths=cfg.data_dir, random_shuffle=True, engine=mode.engine,
                               **cfg.engine_options)
    return DaliRunner(cfg, reader)


class _ArrowBatches:
    """pyarrow's iter_batches over every file, each batch's image bytes as
    NumPy arrays (one per row: what an external source over pyarrow does),
    an epoch at a time (StopIteration at its end)."""

    def __init__(self, paths, batch_size):
        self.paths, self.batch_size = paths, batch_size
        self._it = None

    def _rows(self):
        import pyarrow.parquet as pq
        for p in self.paths:
            for b in pq.ParquetFile(p).iter_batches(batch_size=self.batch_size,
                                                    columns=["image", "label"]):
                yield b

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._it = self._rows()
        try:
            b = next(self._it)
        except StopIteration:
            self._it = None
            raise
        images = b.column("image").field("bytes")
        data = [np.frombuffer(v, np.uint8) for v in images.to_pylist()]
        labels = b.column("label").to_numpy().astype(np.int32).reshape(-1, 1)
        return data, labels


def _build_pyarrow_dali(mode, cfg):
    from fastread.bench.runners import DaliRunner

    def reader():
        from nvidia.dali import fn
        # Batches of pyarrow's own size (the last of each file short): DALI
        # takes any batch up to the pipeline's.
        return fn.external_source(source=_ArrowBatches(cfg.paths, cfg.batch_size),
                                  num_outputs=2, batch=True, cycle=False)
    return DaliRunner(cfg, reader)


def _datasets_collate(rows):
    return [r["image"]["bytes"] for r in rows]


def _build_datasets(mode, cfg):
    import datasets
    from torch.utils.data import DataLoader
    ds = datasets.load_dataset("parquet", data_files={"train": cfg.paths}, split="train")
    ds = ds.cast_column("image", datasets.Image(decode=False)).with_format("torch")
    workers = 2
    # Forked workers, as the mode was first measured with: LitData's
    # optimize (parquet-litdata, in the same process) leaves spawn the
    # default, which would make this peer start its workers anew.
    loader = DataLoader(ds, batch_size=cfg.batch_size, shuffle=True, num_workers=workers,
                        collate_fn=_datasets_collate, persistent_workers=True,
                        multiprocessing_context="fork")
    return _BytesRunner(lambda: iter(loader))


def _build_ray(mode, cfg):
    import ray
    import ray.data
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.read_parquet(cfg.paths, columns=["image", "label"])

    def epoch():
        # The batch's bytes as Ray hands them over (an Arrow column), not
        # converted: the cheapest a consumer of Ray's batches can get them.
        for b in ds.iter_batches(batch_size=cfg.batch_size, batch_format="pyarrow"):
            images = b.column("image").combine_chunks().field("bytes")
            yield len(images), int(images.buffers()[2].size), b
    return _BytesRunner(epoch)


#: Where the LitData row keeps its conversion of DATA (hidden: the Parquet
#: listing skips dot folders).
LITDATA_DIR = ".litdata"


def _litdata_rows(item):
    """One Parquet row group as LitData samples (run by litdata.optimize's
    workers): {"image": the JPEG's bytes, "label": int}."""
    import pyarrow.parquet as pq
    path, group = item
    t = pq.ParquetFile(path).read_row_group(group, columns=["image", "label"])
    images = t.column("image").combine_chunks().field("bytes").to_pylist()
    for data, label in zip(images, t.column("label").to_pylist()):
        yield {"image": data, "label": int(label)}


def _litdata_collate(rows):
    """A batch's image bytes as LitData hands them over (its workers are
    spawned: a module-level function)."""
    return [r["image"] for r in rows]


def litdata_dir(cfg):
    """DATA converted to LitData's format, made on first use (untimed: the
    conversion is what a LitData user does once)."""
    out = os.path.join(cfg.data_dir, LITDATA_DIR)
    if os.path.isfile(os.path.join(out, "index.json")):
        return out
    import litdata
    import pyarrow.parquet as pq
    inputs = [(p, g) for p in cfg.paths for g in range(pq.ParquetFile(p).num_row_groups)]
    litdata.optimize(fn=_litdata_rows, inputs=inputs, output_dir=out, chunk_bytes="64MB",
                     num_workers=2, reorder_files=False, verbose=False)
    return out


def _build_litdata(mode, cfg):
    from litdata import StreamingDataLoader, StreamingDataset
    ds = StreamingDataset(litdata_dir(cfg), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=cfg.batch_size, num_workers=2,
                                 collate_fn=_litdata_collate)
    return _BytesRunner(lambda: iter(loader))
