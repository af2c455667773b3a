"""Parquet files and Arrow IPC files (the Hugging Face layouts) as a sample
source.

A sample is one row: sample ``i`` is row ``i`` of the files in the order
given (a directory's files sorted by path). Its bytes are the value of the
``image`` column: a binary column, or the Hugging Face ``Image`` feature's
struct ``{bytes, path}`` (its ``bytes`` field is read, ``path`` never is).
Its label is the ``label`` column's integer (a null label is -1, as the
Hub's unlabelled test splits have it); class names come from the
``huggingface`` schema metadata's ``ClassLabel`` where the file carries it
(:attr:`Parquet.classes`).

How a Parquet file is read:

- **Footers** once, when the source is built: the last 64 KiB of every file
  read by fastread's engine (ranges of local files, ranged GETs for
  ``s3://`` objects; the files of a directory a few at a time on
  ``FOOTER_THREADS`` threads), the footer longer than that read again whole,
  and parsed by Apache Arrow (``pyarrow.parquet.read_metadata``). The
  label column of every row group is read then too (one range read per
  file for all its row groups' label chunks), so labels are known up front.
- **Row groups** when a batch needs them: the column chunks of the image
  column (and of ``columns``) are byte ranges given by the footer, read by
  the engine (many in flight; the s3 engine splits each into ``part_size``
  ranged GETs) and handed to Arrow's C++ Parquet library: decompression
  (Snappy, Zstd, Gzip, LZ4, none) and decoding (plain, dictionary, delta)
  are Arrow's, with the GIL released. Where the native shim is built
  (:mod:`._parquet_native`: Arrow's page and column readers over the
  engine's buffer, linked from C++) it decodes the image column chunk;
  else pyarrow's reader does (``ParquetReader.read_row_group`` over the
  bytes fastread read, with the footer already parsed, through a Python
  file object that hands out zero-copy views of the engine's buffers).
- **Samples** are zero-copy uint8 views: of the chunk where Arrow's decoder
  left the value there (an uncompressed PLAIN column; a Reader keeps such a
  row group as its values' file ranges and reads each batch's rows by
  range), of one buffer the shim copied the values into (compressed pages,
  dictionaries), or of the decoded binary column's value buffer (pyarrow's
  route); a view keeps its buffer alive. A null value (or a null
  struct) is a failed sample whose error names the file, the row group and
  the row (``missing="error"``), or an empty array (``missing="empty"``).

Arrow IPC files (``.arrow``: a ``datasets`` ``save_to_disk`` directory or
cache) are memory-mapped and their record batches are the "row groups":
samples are views of the map, nothing is read until a page is touched.

**Decoded row groups are cached** (:class:`~fastread.formats._parquet_cache._RowGroupCache`), least recently
used first out, within ``cache_bytes`` of decoded bytes (default
:data:`DEFAULT_CACHE_BYTES`); a batch in flight also holds the row groups its
samples come from. What that costs depends on the order:

- in file order (no shuffle, or ``shuffle_buffer`` of the Reader: the
  row-group-aware shuffle), every row group is read and decoded once per
  epoch and the cache needs to hold only the ``prefetch`` batches ahead
  (it keeps the 4 row groups used last whatever ``cache_bytes`` says);
  where the data set decoded (:meth:`Parquet.decoded_bytes`) is beyond
  ``cache_bytes``, a row group goes once all its rows were asked for, and
  its pages serve the next decode;
- a global shuffle (``random_shuffle`` without a buffer) touches about
  ``min(batch_size, row groups)`` row groups per batch: with the decoded
  image column within ``cache_bytes`` each is still read once per epoch;
  beyond it, a batch reads up to ``batch_size`` whole row groups for
  ``batch_size`` rows (read amplification of the rows per row group), and
  a batch holds those row groups while it lives. Use ``shuffle_buffer`` for
  data sets larger than memory.

Memory: ``cache_bytes`` + the row groups held by the ``prefetch`` batches
ahead + per sample 13 B of index (file, row group, row, label); at 10^8
samples that index is 1.3 GB, at 10^4 130 KB. Threads: ``workers`` loader
threads with one engine context each; descriptors: the engine's (bounded
per context), none per file held open.
"""
import concurrent.futures as _futures
import json
import os
import re
import threading

import numpy as np

from fastread._safe_open import open_file
from fastread.engine import EngineOptions, cached_context
from fastread.formats.cifar import FormatError
from fastread.s3 import S3Options, is_url
from fastread.source import ArraysBatch, SampleSource
from fastread.formats._parquet_cache import _RowGroupCache
from fastread.formats._parquet_meta import (_FileMeta, _chunk_ranges, _decode, _pa,  # noqa: F401
                                            _read_footers, _read_labels, FOOTER_GUESS,
                                            FOOTER_THREADS)

__all__ = ["Parquet", "ParquetBatch", "split_of", "write_image_parquet", "DEFAULT_CACHE_BYTES", "MISSING"]

#: Decoded bytes of row groups kept by one source's reader (LRU).
DEFAULT_CACHE_BYTES = 4 << 30
#: How a null image value is given: a failed sample, or an empty array.
MISSING = ("error", "empty")
_SPLIT_RE = re.compile(r"^(?P<name>.+?)-\d{5}-of-\d{5}(?:[-.][^/]*)?$")
_EXTS = (".parquet", ".arrow")
_ENODATA = 61
_EIO = 5


def split_of(path):
    """The split a data file belongs to by its name, as the Hub names them:
    ``train-00000-of-00002.parquet`` (and ``...-of-00002-<hash>.parquet``)
    is ``train``; a ``datasets`` cache file ``name-train-00000-of-00001.arrow``
    is ``train``; a ``save_to_disk`` file ``train/data-00000-of-00001.arrow``
    and a converted ``config/train/0000.parquet`` take their folder's name.
    None where the name says nothing."""
    parts = path.replace("\\", "/").rstrip("/").split("/")
    base = parts[-1]
    for ext in _EXTS:
        if base.endswith(ext):
            base = base[:-len(ext)]
    m = _SPLIT_RE.match(base)
    name = m.group("name").rsplit("-", 1)[-1] if m else None
    if name in (None, "data") and len(parts) > 1 and parts[-2] not in ("", "data"):
        return parts[-2]
    return name


def _list_files(paths, s3):
    """(files, sizes or None each) for what the user gave: files, directories
    (every .parquet / .arrow below, sorted) or s3:// prefixes."""
    out, sizes = [], []
    for p in paths:
        if is_url(p):
            from fastread.s3 import list_objects
            if p.endswith(_EXTS):
                objs = [o for o in list_objects(p, s3) if p.endswith("/" + o.key)]
                if not objs:
                    raise FileNotFoundError(f"{p}: no such object")
                out.append(p)
                sizes.append(objs[0].size)
                continue
            base = p.rstrip("/") + "/"
            bucket = p[len("s3://"):].split("/", 1)[0]
            found = [o for o in list_objects(base, s3) if o.key.endswith(_EXTS)]
            if not found:
                raise FileNotFoundError(f"{p}: no .parquet or .arrow objects under the prefix")
            for o in sorted(found, key=lambda o: o.key):
                out.append(f"s3://{bucket}/{o.key}")
                sizes.append(o.size)
        elif os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found += [os.path.join(root, f) for f in files if f.endswith(_EXTS)]
            if not found:
                raise FileNotFoundError(f"{p}: no .parquet or .arrow files in the directory")
            found.sort()
            out += found
            sizes += [None] * len(found)
        else:
            out.append(p)
            sizes.append(None)
    return out, sizes


def _dataset_dict_files(root, split):
    """The .arrow files of a ``datasets`` save_to_disk directory: a
    DatasetDict (``dataset_dict.json``: ``split`` chosen, or the only one)
    or a Dataset (``state.json``), in the order its state lists them."""
    dd = os.path.join(root, "dataset_dict.json")
    if os.path.isfile(dd):
        with open_file(dd) as f:
            splits = json.load(f).get("splits", [])
        if split is None:
            if len(splits) != 1:
                raise ValueError(f"{root}: a DatasetDict of splits {splits}: choose one "
                                 "with split=")
            split = splits[0]
        if split not in splits:
            raise ValueError(f"{root}: no split {split!r} (it has {splits})")
        return _dataset_dict_files(os.path.join(root, split), None)[0], split
    state = os.path.join(root, "state.json")
    with open_file(state) as f:
        files = [d["filename"] for d in json.load(f).get("_data_files", [])]
    if not files:
        raise FormatError(state, None, "lists no _data_files")
    return [os.path.join(root, name) for name in files], split


class Parquet(SampleSource):
    """The rows of Parquet files (and Arrow IPC ``.arrow`` files) as samples
    (see the module's documentation for how they are read).

    ``paths``: a file, a directory (every ``.parquet`` / ``.arrow`` file
    below it; a ``datasets`` ``save_to_disk`` directory by its
    ``dataset_dict.json`` / ``state.json``), an ``s3://`` prefix or object,
    or a list of those. ``split``: keep only the files of that split
    (:func:`split_of`: ``data/train-00000-of-00002.parquet`` is ``train``).
    ``image``: the column of the sample bytes (binary, large binary, or a
    struct with a ``bytes`` field). ``label``: the integer label column
    (None, or the default ``"label"`` absent: labels are the sample
    numbers). ``columns``: more columns read with each row group, for
    :meth:`table`. ``missing``: what a null image value gives ("error": a
    failed sample naming file, row group and row; "empty": an empty array).
    ``cache_bytes``: the decoded row groups a reader keeps. ``ranged``
    (native route, local files): a Reader keeps an uncompressed row group
    as its values' file ranges and reads rows by range (True; None: the
    default, ``_parquet_native.RANGED``), or holds the chunk (False: later
    epochs from memory). ``index_cache``: where a Reader keeps those
    ranges between processes (:mod:`._parquet_index_cache`; None: the
    node-local index cache WebDataset uses, ``$FASTREAD_CACHE_DIR``; a
    directory; False: none). ``s3``: an
    :class:`fastread.S3Options` (or mapping) for ``s3://`` paths.
    """

    reads_ranges = True

    def __init__(self, paths, image="image", label="label", columns=None, split=None, *,
                 missing="error", cache_bytes=None, s3=None, ranged=None, index_cache=None):
        pa = _pa()
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        given = [os.fspath(p) for p in paths]
        if not given:
            raise ValueError("Parquet needs at least one path")
        if missing not in MISSING:
            raise ValueError(f"missing must be one of {MISSING}, got {missing!r}")
        self.missing = missing
        self.s3 = S3Options.coerce(s3) if s3 is not None else None
        self.cache_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else int(cache_bytes)
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes!r}")
        self.image, self.label_column = image, label
        self.columns = list(columns or [])
        self.split = split
        self._ranged_arg = ranged
        self.index_cache = index_cache
        files, sizes = [], []
        for p in given:
            if not is_url(p) and os.path.isdir(p) and (
                    os.path.isfile(os.path.join(p, "dataset_dict.json"))
                    or os.path.isfile(os.path.join(p, "state.json"))):
                got, self.split = _dataset_dict_files(p, split)
                files += got
                sizes += [None] * len(got)
            else:
                f, s = _list_files([p], self.s3)
                if split is not None:
                    keep = [i for i, name in enumerate(f) if split_of(name) == split]
                    if not keep:
                        found = sorted({str(split_of(name)) for name in f})
                        raise FileNotFoundError(f"{p}: no files of split {split!r} "
                                                f"(splits found: {', '.join(found)})")
                    f, s = [f[i] for i in keep], [s[i] for i in keep]
                files += f
                sizes += s
        urls = [p for p in files if is_url(p)]
        if urls and len(urls) != len(files):
            raise ValueError("Parquet files must all be s3:// URLs or all local paths (one "
                             f"reader reads them with one engine): got {urls[0]!r} and "
                             f"{next(p for p in files if not is_url(p))!r}")
        if any(p.endswith(".arrow") for p in urls):
            raise ValueError(f"Arrow IPC files are memory-mapped, so local only: {urls[0]!r}")
        self.paths = files
        self.metas = _read_footers(files, sizes, self.s3)
        self._resolve_columns(pa)
        self._build_index(pa)
        self._setup_native()

    def _setup_native(self):
        """The native route per file (formats._parquet_native): Arrow's C++
        reader over the engine's buffer, values as views of it. ``native_why``:
        None where every Parquet file takes it, else why (not) for the first
        that does not."""
        from fastread.formats import _parquet_native
        self.native_why = None
        # Whether a Reader keeps uncompressed row groups as file ranges
        # (_parquet_native.RANGED, as it is when the source is built; local files).
        want = _parquet_native.RANGED if self._ranged_arg is None else self._ranged_arg
        self.ranged = bool(want) and not any(is_url(p) for p in self.paths)
        remote = any(is_url(p) for p in self.paths)
        for m in self.metas:
            if m.kind != "parquet":
                continue
            if self.columns:
                why = "columns= asks for Arrow tables"
            elif remote:
                # No file ranges for objects (a second pass of GETs), and held
                # views of the engine's arenas measured slower than pyarrow's
                # copy on the 2-core VM (docs/parquet.md): not measured on S3.
                why = "s3:// objects are decoded by pyarrow's route"
            else:
                m.native, m.native_column, why = _parquet_native.footer_for(m, self._image_leaf)
            if why is not None and self.native_why is None:
                self.native_why = f"{m.path}: {why}"
        from fastread.formats._parquet_index_cache import identities
        self._index_identity = identities(self)    # after the footers were read

    # -- the index -------------------------------------------------------------
    def _resolve_columns(self, pa):
        first = self.metas[0]
        schema = first.schema
        if self.image not in schema.names:
            raise ValueError(f"{first.path}: no image column {self.image!r} (columns: "
                             f"{', '.join(schema.names)})")
        t = schema.field(self.image).type
        if pa.types.is_struct(t):
            if t.get_field_index("bytes") < 0:
                raise ValueError(f"{first.path}: image column {self.image!r} is a struct "
                                 f"without a 'bytes' field ({t})")
            self._image_leaf, self._image_struct = f"{self.image}.bytes", True
            value_type = t.field("bytes").type
        else:
            self._image_leaf, self._image_struct = self.image, False
            value_type = t
        if not (pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type)
                or pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
            raise ValueError(f"{first.path}: image column {self.image!r} holds {value_type}, "
                             "not binary values")
        if self.label_column is not None and self.label_column not in schema.names:
            if self.label_column != "label":
                raise ValueError(f"{first.path}: no label column {self.label_column!r} "
                                 f"(columns: {', '.join(schema.names)})")
            self.label_column = None
        for c in self.columns:
            if c not in schema.names:
                raise ValueError(f"{first.path}: no column {c!r} (columns: "
                                 f"{', '.join(schema.names)})")
        self.classes = _class_names(schema, self.label_column)
        for m in self.metas[1:]:
            for c in [self.image] + ([self.label_column] if self.label_column else []) \
                    + self.columns:
                if c not in m.schema.names:
                    raise ValueError(f"{m.path}: no column {c!r}, which {first.path} has "
                                     "(files of one source share their columns)")
        self._leaves = [self._image_leaf] + self.columns
        for m in self.metas:
            if m.kind == "parquet":
                m.chunks = [_chunk_ranges(m, g, self._leaves_of(m)) for g in range(len(m.rows))]

    def _leaves_of(self, meta):
        """Leaf column paths read for the image column and ``columns``."""
        names = [meta.metadata.schema.column(i).path for i in
                 range(meta.metadata.num_columns)]
        out = []
        for c in self._leaves:
            out += [n for n in names if n == c or n.startswith(c + ".")]
        return out

    def _build_index(self, pa):
        counts = [sum(m.rows) for m in self.metas]
        n = int(sum(counts))
        self.file_index = np.repeat(np.arange(len(self.metas), dtype=np.int32), counts)
        groups, rows = [], []
        for m in self.metas:
            for g, r in enumerate(m.rows):
                groups.append(np.full(r, g, np.int32))
                rows.append(np.arange(r, dtype=np.int32))
        self.group_index = np.concatenate(groups) if groups else np.zeros(0, np.int32)
        self.row_index = np.concatenate(rows) if rows else np.zeros(0, np.int32)
        if self.label_column is None:
            self.labels = np.arange(n, dtype=np.int32)
        else:
            self.labels = np.concatenate([_read_labels(m, self.label_column, self.s3)
                                          for m in self.metas]) if n else np.zeros(0, np.int32)
        # Where each file's samples start (sample -> file is file_index).
        self.file_starts = np.r_[0, np.cumsum(counts)].astype(np.int64)
        self._names = None

    # -- SampleSource ------------------------------------------------------------
    @property
    def names(self):
        """One name per sample (``file[row group g, row r]``), made on first
        use (a list of strings costs ~100 B per sample)."""
        if self._names is None:
            self._names = _Names(self)
        return self._names

    def __len__(self):
        return len(self.file_index)

    @property
    def path(self):
        """The first file (the engine is chosen by it: s3 for s3:// URLs)."""
        return self.paths[0]

    def __repr__(self):
        return (f"Parquet({len(self.paths)} files, {len(self)} rows, image={self.image!r}, "
                f"label={self.label_column!r})")

    def sample_name(self, i):
        f, g, r = int(self.file_index[i]), int(self.group_index[i]), int(self.row_index[i])
        what = "record batch" if self.metas[f].kind == "arrow" else "row group"
        return f"{self.paths[f]}[{what} {g}, row {r}]"

    def check_options(self, options):
        if options.get("o_direct"):
            raise ValueError("Parquet column chunks are not aligned: O_DIRECT cannot read "
                             f"{self.paths[0]!r} (choose o_direct=False)")

    def open_native(self, engine, options, *, prefetch, workers):
        return _ParquetNative(self, engine, options, prefetch, workers)

    def read_batch(self, context, indices):
        loader = _Loader(self, context.engine, None, context=context)
        cache = _RowGroupCache(loader, self.cache_bytes, executor=None)
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        return _cut(self, idx, cache.wanted(self, idx))

    def decoded_bytes(self):
        """About what every row group decoded takes: the footers' uncompressed
        size of the columns read (Parquet), the record batches' size (Arrow
        IPC, views of the map); a row group a Reader keeps as file ranges
        (:attr:`ranged`, an uncompressed image chunk) 16 B a row. What the
        row-group cache compares with its budget to know whether a later
        epoch can be served from it."""
        total = 0
        for m in self.metas:
            if m.kind == "arrow":
                total += sum(b.nbytes for b in m.arrow_batches)
                continue
            leaves = set(self._leaves_of(m))
            for g in range(len(m.rows)):
                if self.ranged and m.native is not None and _native_for(m, g):
                    total += 16 * m.rows[g]
                    continue
                rg = m.metadata.row_group(g)
                total += sum(int(rg.column(c).total_uncompressed_size)
                             for c in range(rg.num_columns)
                             if rg.column(c).path_in_schema in leaves)
        return total

    def groups_of(self, indices):
        """The (file, row group) pairs samples ``indices`` come from, in the
        order they are first met."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        keys = self.file_index[idx].astype(np.int64) << 32 | self.group_index[idx]
        return [(int(k >> 32), int(k & 0xFFFFFFFF)) for k in dict.fromkeys(keys.tolist())]

    def _context(self, engine, options, engine_options):
        from fastread.source import check_engine_for, with_source_s3
        opts = EngineOptions.coerce(options, **engine_options)
        name = check_engine_for(self, engine)
        return cached_context(name, with_source_s3(self, opts, name))

    def row_group(self, file, group, engine="auto", options=None, **engine_options):
        """Row group ``group`` of file number ``file`` as a pyarrow Table as
        Arrow decoded it: column ``bytes`` (the image values, nulls kept),
        ``label`` (int32) and ``columns``; the bytes stay Arrow's buffers
        (no copy). Raises FormatError naming the file and row group where it
        cannot be read."""
        pa = _pa()
        ctx = self._context(engine, options, engine_options)
        rg = _Loader(self, ctx.engine, None, context=ctx).load(file, group, table=True)
        if rg.error is not None:
            raise FormatError(self.paths[file], None, rg.error[1])
        col = rg.table.column(self.image)
        if self._image_struct:
            import pyarrow.compute as pc
            col = pa.chunked_array([c.field("bytes") if not c.null_count else
                                    pc.if_else(c.is_valid(), c.field("bytes"), None)
                                    for c in col.chunks], col.type.field("bytes").type)
        lo = int(self.file_starts[file]) + sum(self.metas[file].rows[:group])
        labels = self.labels[lo:lo + self.metas[file].rows[group]]
        out = {"bytes": col, "label": pa.array(labels)}
        for c in self.columns:
            out[c] = rg.table.column(c)
        return pa.table(out)

    def table(self, indices, engine="auto", options=None, **engine_options):
        """The rows ``indices`` of the image column and ``columns`` as a
        pyarrow Table (the image column as read: the struct for HF images)."""
        pa = _pa()
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        ctx = self._context(engine, options, engine_options)
        loader = _Loader(self, ctx.engine, None, context=ctx)
        tables = []
        for i in idx.tolist():
            f, g, r = int(self.file_index[i]), int(self.group_index[i]), int(self.row_index[i])
            tables.append(loader.load(f, g, table=True).table.slice(r, 1))
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables)


class _Names:
    """Sample names on demand: a sequence of ``len`` strings."""

    def __init__(self, source):
        self._source = source

    def __len__(self):
        return len(self._source)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._source.sample_name(i % n)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _class_names(schema, label):
    """ClassLabel names of ``label`` from the ``huggingface`` schema
    metadata (as ``datasets`` writes it), else None."""
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if raw is None or label is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    feats = (info.get("info") or {}).get("features") or {}
    feat = feats.get(label) or {}
    if feat.get("_type") == "ClassLabel" and isinstance(feat.get("names"), list):
        return [str(x) for x in feat["names"]]
    return None


class _RowGroup:
    """One decoded row group: the Arrow table (kept alive by every view),
    and per chunk of the image column (row start, values, begin, end, valid,
    side, in_side: value j is values[begin[j]:end[j]], or side[...] where
    in_side[j]). table is None where the native route decoded it."""
    __slots__ = ("table", "parts", "nbytes", "error", "ranged")

    def __init__(self, table, parts, nbytes, error=None):
        self.table, self.parts, self.nbytes, self.error = table, parts, nbytes, error
        self.ranged = False    # parts give file offsets (values None): read per batch


def _image_parts(source, column):
    """(row start, uint8 values, offsets, valid or None) per chunk of the
    image column of a decoded row group."""
    pa = _pa()
    out = []
    start = 0
    for arr in column.chunks:
        valid = None
        if source._image_struct:
            parent_valid = arr.is_valid() if arr.null_count else None
            arr = arr.field("bytes")
            if parent_valid is not None:
                valid = parent_valid.to_numpy(zero_copy_only=False)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], np.int64 if large else np.int32)[
            arr.offset:arr.offset + len(arr) + 1] if len(arr) else np.zeros(1, np.int64)
        values = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size \
            else np.zeros(0, np.uint8)
        if arr.null_count:
            v = arr.is_valid().to_numpy(zero_copy_only=False)
            valid = v if valid is None else valid & v
        out.append((start, values, offsets[:-1], offsets[1:], valid, None, None))
        start += len(arr)
    return out


class _Loader:
    """Loads row groups: the column chunks read by an engine context (one
    per thread: a context is used by one thread at a time) and decoded by
    Arrow. Errors are kept in the row group (its samples fail), not raised."""

    def __init__(self, source, engine, options, context=None, ranged=False):
        self.source, self.engine, self.options = source, engine, options
        self._context = context
        # ranged: a row group whose values all lie in its chunk (uncompressed
        # PLAIN) is kept as their file ranges, the chunk let go (formats._parquet_native).
        self.ranged = bool(ranged) and source.ranged
        self._local = threading.local()
        self._all = []                 # every context opened, closed by close()
        self._all_lock = threading.Lock()
        self.stats = {}
        self.native_loads = 0      # row groups decoded through the shim
        self.ranged_loads = 0      # ... of them kept as file ranges
        self.native_copied = 0     # values it copied (not views of the chunk)
        self.chunk_reads = 0       # row groups whose column chunks were read
        self.index = None          # a _parquet_index_cache.RangesIndex: ranges kept on disk

    def _ctx(self):
        if self._context is not None:
            return self._context
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            from fastread import _core
            ctx = self._local.ctx = _core.Context(self.engine, **self.options)
            with self._all_lock:
                self._all.append(ctx)
        return ctx

    def close(self):
        with self._all_lock:
            for ctx in self._all:
                ctx.close()
            self._all = []

    def load(self, f, g, table=False):
        """Row group ``g`` of file ``f``: its samples' values (``table``: as an
        Arrow table too, pyarrow's route)."""
        src = self.source
        meta = src.metas[f]
        if meta.kind == "arrow":
            batch = meta.arrow_batches[g]
            pa = _pa()
            table = pa.Table.from_batches([batch]).select([src.image] + src.columns)
            return _RowGroup(table, _image_parts(src, table.column(src.image)), 0)
        offs, lens = meta.chunks[g]
        if self.ranged and meta.native is not None and not table and _native_for(meta, g):
            hit = self.index.lookup(f, g) if self.index is not None else None
            if hit is not None and hit != "plain":   # the cached ranges: no chunk read
                begin, end, valid = hit
                rg = _RowGroup(None, [(0, None, begin, end, valid, None, None)], 16 * len(begin))
                rg.ranged = True
                return rg
            from fastread.formats import _parquet_native
            if _parquet_native.INDEX_BY_MAP:
                mapped = _parquet_native.mapped_chunk(meta, offs, lens)
                if mapped is not None:
                    return self._load_native(meta, g, mapped)
        ctx = self._ctx()
        batch = ctx.read_ranges(meta.path, offs, lens)
        with self._all_lock:
            self.chunk_reads += 1
        if ctx is not self._context:
            self.stats = ctx.stats()
        fails = batch.failures()
        if fails:
            i, err = fails[0]
            said = ctx.sample_error(i) or os.strerror(err)
            return _RowGroup(None, None, 0, (err, f"reading row group {g} (column chunk of "
                                                  f"{lens[i]} bytes at {offs[i]}): {said}"))
        arrays = batch.arrays()
        for i, a in enumerate(arrays):
            if len(a) != lens[i]:
                return _RowGroup(None, None, 0, (_ENODATA, f"row group {g}: {len(a)} of "
                                                 f"{lens[i]} bytes at {offs[i]} (truncated "
                                                 "file)"))
        if meta.native is not None and not table and _native_for(meta, g):
            rg = self._load_native(meta, g, arrays[0])
            if self.index is not None and self.ranged and rg.error is None:
                if rg.ranged:
                    _s, _v, begin, end, valid, _side, _in = rg.parts[0]
                    self.index.record(f, g, begin, end, valid)
                else:
                    self.index.record_plain(f, g)
            return rg
        pa = _pa()
        try:
            table = _decode(meta, g, src._leaves_of(meta), list(zip(offs.tolist(), arrays)))
            parts = _image_parts(src, table.column(src.image))
        except (OSError, pa.ArrowException, ValueError) as e:
            return _RowGroup(None, None, 0, (_EIO, f"row group {g}: Arrow cannot decode it "
                                                   f"({e})"))
        return _RowGroup(table, parts, table.nbytes)

    def _load_native(self, meta, g, chunk):
        """The image column chunk (the only one read: no ``columns``) decoded
        by Arrow's C++ reader through the shim; values views of ``chunk``
        where Arrow leaves them there (formats._parquet_native)."""
        from fastread.formats import _parquet_native
        rg = meta.metadata.row_group(g)
        col = rg.column(meta.native_column)
        try:
            values, begin, end, valid, side, in_side, copied = _parquet_native.decode(
                meta.native, meta.native_column, g, chunk, meta.rows[g],
                int(col.total_uncompressed_size))
        except (OSError, ValueError, NotImplementedError, MemoryError) as e:
            return _RowGroup(None, None, 0, (_EIO, f"row group {g}: Arrow cannot decode it "
                                                   f"({e})"))
        with self._all_lock:
            self.native_loads += 1
            self.native_copied += copied
        if self.ranged and side is None and values is chunk:
            # Every value is a range of the file: keep the ranges (16 B a row),
            # read them per batch; the chunk's arena goes back to its pool.
            with self._all_lock:
                self.ranged_loads += 1
            at = int(meta.chunks[g][0][0])
            rg = _RowGroup(None, [(0, None, begin + at, end + at, valid, None, None)],
                           begin.nbytes + end.nbytes)
            rg.ranged = True
            return rg
        nbytes = values.nbytes + (side.nbytes if side is not None else 0)
        return _RowGroup(None, [(0, values, begin, end, valid, side, in_side)], nbytes)


def _native_for(meta, g):
    """Whether row group ``g``'s image chunk takes the native route: an
    uncompressed one (views or file ranges); a compressed one only with
    ``_parquet_native.COMPRESSED`` (its values are copied either way)."""
    from fastread.formats import _parquet_native
    if _parquet_native.COMPRESSED:
        return True
    col = meta.metadata.row_group(g).column(meta.native_column)
    return col.compression == "UNCOMPRESSED"


def _cut(source, idx, groups, wait=None, ctx=None):
    """The batch of samples ``idx`` as views of their decoded row groups
    (``groups``: {(file, group): future}); the rows of ranged row groups
    read as byte ranges of their files by ``ctx``."""
    loaded = {}
    for key, fut in groups.items():
        if wait is not None:
            wait(fut)
        try:
            loaded[key] = fut.result()
        except Exception as e:  # a loader bug: its samples fail, named
            loaded[key] = _RowGroup(None, None, 0, (_EIO, f"row group {key[1]}: {e}"))
    files, grps, rows = (source.file_index[idx], source.group_index[idx],
                         source.row_index[idx])
    if loaded and ctx is not None and all(rg.error is None and rg.ranged
                                          for rg in loaded.values()):
        from fastread.formats._parquet_native import cut_ranged
        arrays, failures, why = cut_ranged(source, idx, files, grps, rows, loaded, ctx)
        return ParquetBatch(idx, arrays, failures, list(loaded.values()), why)
    empty = np.zeros(0, np.uint8)
    arrays, failures, keep = [], [], []
    why = {}   # batch position -> what failed, kept by the batch (no shared state)
    ranged = {}   # file -> [(batch position, offset, length, row group, row)]
    for i, (f, g, r) in enumerate(zip(files.tolist(), grps.tolist(), rows.tolist())):
        rg = loaded[(f, g)]
        if rg.error is not None:
            failures.append((i, rg.error[0]))
            why[i] = f"{source.paths[f]}: {rg.error[1]}"
            arrays.append(empty)
            continue
        for start, values, begin, end, valid, side, in_side in reversed(rg.parts):
            if r >= start:
                break
        j = r - start
        if valid is not None and not valid[j]:
            if source.missing == "error":
                failures.append((i, _ENODATA))
                why[i] = f"null {source.image!r} value"
            arrays.append(empty)
            continue
        if rg.ranged:
            ranged.setdefault(f, []).append((i, int(begin[j]), int(end[j] - begin[j]), g, r))
            arrays.append(empty)
            continue
        buf = side if in_side is not None and in_side[j] else values
        arrays.append(buf[begin[j]:end[j]])
    if ranged:
        from fastread.formats._parquet_native import read_ranged
        read_ranged(source, ctx, ranged, arrays, failures, why)
        failures.sort()
    for key in groups:
        keep.append(loaded[key])
    return ParquetBatch(idx, arrays, failures, keep, why)


class ParquetBatch(ArraysBatch):
    """A batch of rows: each sample a view of its row group's decoded value
    buffer (the row groups, ``keep``, stay alive while a view does)."""

    _samples = "rows of Parquet files"

    def __init__(self, indices, arrays, failures, keep=(), why=None):
        super().__init__(indices, arrays, failures, keep)
        self._why = why or {}

    def failure_detail(self, i):
        """Why sample ``i`` of the batch failed (file, row group, what), or
        None: raise_failures asks the batch, so no reader shares the words."""
        return self._why.get(i)


class _ParquetNative:
    """The NativeReader calls Reader makes, served by row-group loads on
    ``workers`` threads: a submitted batch's row groups are asked of the
    cache as soon as the batch is within ``prefetch`` batches of the next
    one handed out (so that many loads are in flight), and next() cuts the
    batch from them once they are loaded."""

    def __init__(self, source, engine, options, prefetch, workers):
        import collections
        self.engine = str(engine)
        self.size = len(source)
        self.taken = 0
        self.auto_fallback = 0
        self._source = source
        self._prefetch = max(1, int(prefetch))
        # A load is mostly Arrow decoding (CPU, the GIL released): one
        # thread per CPU (at most 8), more if the Reader asked for more
        # workers; the reader's default of one per 2 CPUs left half the
        # cores idle (2-core VM: 1,872 img/s shuffled with one thread).
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        self.threads = max(1, int(workers), min(8, cpus))
        self._ahead = 2 * self.threads   # row-group loads in flight beyond the window
        self._pool = _futures.ThreadPoolExecutor(self.threads,
                                                 thread_name_prefix="fastread-parquet")
        self._loader = _Loader(source, self.engine, options, ranged=True)
        if self._loader.ranged:
            from fastread.formats._parquet_index_cache import for_reader
            self._loader.index = for_reader(source, _native_for)   # None: not cached
        # Where row groups may be kept as file ranges, each batch's rows are
        # read on these threads (a load never waits behind a batch's read).
        self._fetch = None
        if self._loader.ranged and any(m.native is not None for m in source.metas):
            self._fetch = _futures.ThreadPoolExecutor(self.threads,
                                                      thread_name_prefix="fastread-parquet-rows")
        self._cache = _RowGroupCache(self._loader, source.cache_bytes, self._pool,
                                     rows=lambda key: source.metas[key[0]].rows[key[1]],
                                     spill=source.decoded_bytes() > source.cache_bytes)
        self._queue = collections.deque()   # [indices, groups or None]
        self._lock = threading.Lock()

    def submit(self, indices):
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"sample index out of range 0..{self.size - 1}")
        with self._lock:
            self._queue.append([idx, None])
            self._schedule()

    #: Queued batches looked through for row groups to load ahead.
    AHEAD_SCAN = 1024

    def _schedule(self):
        """Asks for the row groups of the ``prefetch`` batches next in line,
        then of later ones while fewer than ``_ahead`` loads are pending:
        reading in file order, a row group spans many batches, so the window
        alone would keep one load in flight and the decoding threads idle."""
        for k, item in enumerate(self._queue):
            if k >= self.AHEAD_SCAN:
                break
            if item[1] is not None:
                continue
            if k >= self._prefetch and self._cache.pending() >= self._ahead:
                break
            item[1] = self._cache.wanted(self._source, item[0])
        if self._fetch is not None:
            for k, item in enumerate(self._queue):
                if k >= self._prefetch:
                    break
                if item[1] is not None and len(item) == 2:
                    item.append(self._fetch.submit(self._cut_here, item[0], item[1]))

    def _cut_here(self, idx, groups):
        """A batch cut on a fetch thread, ranged rows read by its context."""
        return _cut(self._source, idx, groups, ctx=self._loader._ctx())

    def next(self):
        with self._lock:
            if not self._queue:
                return None
            item = self._queue[0]
            if item[1] is None:
                item[1] = self._cache.wanted(self._source, item[0])
        # Waits in steps so that a signal (KeyboardInterrupt) gets through;
        # the batch stays queued until it is cut.
        if self._fetch is not None:
            with self._lock:
                if len(item) == 2:
                    item.append(self._fetch.submit(self._cut_here, item[0], item[1]))
            _wait(item[2])
            batch = item[2].result()
        else:
            batch = _cut(self._source, item[0], item[1], wait=_wait)
        with self._lock:
            if self._queue and self._queue[0] is item:
                self._queue.popleft()
            self.taken += 1
            self._schedule()
        return batch

    def stats(self):
        out = dict(self._loader.stats)
        out["row_group_loads"] = self._cache.loads
        out["row_groups_native"] = self._loader.native_loads
        out["values_copied_native"] = self._loader.native_copied
        out["row_groups_ranged"] = self._loader.ranged_loads
        out["row_group_bytes_cached"] = self._cache.held()
        out["row_group_chunks_read"] = self._loader.chunk_reads
        from fastread.formats._parquet_index_cache import stats
        out.update(stats(self._loader.index))
        return out

    def reset(self):
        with self._lock:
            self._queue.clear()

    def close(self):
        with self._lock:
            self._queue.clear()
        if self._fetch is not None:
            self._fetch.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._cache.clear()
        if self._loader.index is not None:
            self._loader.index.close()
        self._loader.close()

    @property
    def pending(self):
        return len(self._queue)

    def pool_batches(self):
        return 0

    def pool_idle_bytes(self):
        return 0

    def pool_idle_device_bytes(self):
        return 0


def _wait(fut):
    while True:
        try:
            fut.result(timeout=0.1)
            return
        except _futures.TimeoutError:
            continue
        except Exception:
            return


# Written here so that tests and benchmarks make what this module reads.
from fastread.formats.parquet_write import SOURCE_NOTE, write_image_parquet  # noqa: E402,F401
