"""Ray Data datasets read by fastread's native engines (``pip install fastread[ray]``).

Each function returns a :class:`ray.data.Dataset` whose read tasks each read
one batch of samples in one native call (:func:`fastread.read_files`, range
reads of a packed image, a record shard), rather than one file per task as
``ray.data.read_binary_files`` does:

- :func:`read_files`: a class-per-directory tree (local or an ``s3://``
  prefix, listed by :func:`fastread.scan`), or a list of paths or URLs;
  columns ``bytes``, ``label``, ``path``.
- :func:`read_image`: the samples of a packed image
  (:class:`fastread.PackedImage`), by ranges of sample numbers; the same
  columns, ``path`` the sample's name in the image.
- :func:`read_webdataset`, :func:`read_squirrel`: record shards, one task
  per shard.
- :func:`read_parquet`: Parquet / Arrow files (the Hugging Face layouts),
  one task per file, one block per row group as Arrow decoded it.

With ``decode=True`` the samples are decoded on Ray's CPU workers (Pillow,
RGB) and the column ``image`` (uint8, HWC) replaces ``bytes``; without it
the bytes go on, for DALI or nvImageCodec to decode on the GPU.

Listing (and opening a packed image's index) happens on the driver, so a
bad root, prefix or index raises there at once; a sample that fails to read
fails its task, and Ray raises that on the driver when the dataset is
consumed, naming the path (the task's :class:`fastread.ReadError`).

This package imports without Ray; the functions raise ImportError naming
``pip install fastread[ray]`` when Ray Data is missing.
"""

__all__ = ["read_files", "read_image", "read_webdataset", "read_squirrel", "read_parquet",
           "ray_reason"]

INSTALL = "pip install fastread[ray]"


def ray_reason():
    """None where Ray Data imports, else why not (for ``fastread info`` and
    the tests' skip reason)."""
    try:
        import ray.data  # noqa: F401
    except ImportError as e:
        missing = getattr(e, "name", None) or ""
        if missing.split(".")[0] in ("ray", "pyarrow", "pandas"):
            return f"Ray Data is not installed ({e}): {INSTALL}"
        return f"Ray Data is installed but cannot be imported: {e}"
    return None


def _datasource():
    why = ray_reason()
    if why is not None:
        raise ImportError(f"fastread.ray needs Ray Data: {why}", name="ray")
    from fastread.ray import datasource
    return datasource


def read_files(source, *, file_filters=None, labels=None, shuffle=False, seed=None,
               batch_size=None, decode=False, engine="auto", options=None, s3=None,
               ray_remote_args=None, **engine_options):
    """A Ray Dataset of whole files, one native :func:`fastread.read_files`
    call per read task.

    ``source``: a directory (one subdirectory per class, as
    :func:`fastread.scan` lists it, with ``file_filters``), an
    ``s3://bucket/prefix`` of the same shape, or a list of paths or
    ``s3://`` URLs (``labels``: theirs, default their positions). Columns:
    ``bytes`` (the file's bytes), ``label`` (int32, :func:`fastread.scan`'s),
    ``path``; with ``decode=True``, ``image`` (uint8 HWC, RGB) instead of
    ``bytes``.

    ``batch_size`` files per read task (one block each, one native call):
    None (the default) sizes them to Ray's blocks, as few tasks as blocks of
    ``DataContext.target_max_block_size`` (128 MiB) at the files' mean size
    hold (each Ray task costs tens of milliseconds however little it reads;
    a task's native read uses every CPU of its node); with ``decode=True``,
    256 (or fewer, one task per CPU). The bytes column is the engine's
    buffer as read (no copy in the task before Ray's put). ``shuffle``: the
    files are permuted (``seed``; None draws one) before they are cut into
    tasks. Engine: ``engine``, ``options`` (a :class:`fastread.EngineOptions`
    or mapping) and keyword options, as :func:`fastread.read_files` takes
    them; ``s3``: how to reach the bucket (:class:`fastread.S3Options` or a
    mapping), used for the listing and the reads. ``ray_remote_args``: for
    the read tasks (``num_cpus``, ``memory``, ...), as
    ``ray.data.read_datasource`` takes them.
    """
    ds = _datasource()
    return ds.read(ds.FilesDatasource(source, file_filters=file_filters, labels=labels,
                                      shuffle=shuffle, seed=seed, batch_size=batch_size,
                                      decode=decode, engine=engine, options=options, s3=s3,
                                      engine_options=engine_options),
                   ray_remote_args)


def read_image(image, *, index=None, shuffle=False, seed=None, batch_size=None, decode=False,
               engine="auto", options=None, s3=None, ray_remote_args=None, **engine_options):
    """A Ray Dataset of a packed image's samples (``image``: a path, an
    ``s3://`` URL or a :class:`fastread.PackedImage`; ``index`` and ``s3`` as
    PackedImage takes them). Each read task reads ``batch_size`` samples,
    a range of sample numbers (or of the permutation, with ``shuffle``), in
    one native range read, back to back in the block's buffer (None: sized
    as :func:`read_files` sizes them, from the index's sample sizes).
    Columns as :func:`read_files`'s; ``path`` is the sample's name (its
    path relative to the packed root)."""
    ds = _datasource()
    return ds.read(ds.ImageDatasource(image, index=index, shuffle=shuffle, seed=seed,
                                      batch_size=batch_size, decode=decode, engine=engine,
                                      options=options, s3=s3, engine_options=engine_options),
                   ray_remote_args)


def read_webdataset(shards, ext, *, batch_size=256, missing_component_behavior="empty",
                    case_sensitive_extensions=True, cache_dir=None, engine="auto",
                    options=None, s3=None, ray_remote_args=None, **engine_options):
    """A Ray Dataset of WebDataset tar shards (``shards``: a list of paths or
    ``s3://`` URLs, one path, a directory of ``*.tar``/``*.tar.gz``/``*.tgz``
    files, or a glob), one read task per shard: the task indexes its shard
    (:class:`fastread.WebDataset`) and reads its samples in native range
    reads of ``batch_size``. Columns: one per ``ext`` entry (that
    component's bytes; empty where missing), ``key`` (the sample's key) and
    ``path`` (the shard)."""
    ds = _datasource()
    return ds.read(ds.WebDatasetDatasource(
        shards, ext, batch_size=batch_size, missing_component_behavior=missing_component_behavior,
        case_sensitive_extensions=case_sensitive_extensions, cache_dir=cache_dir, engine=engine,
        options=options, s3=s3, engine_options=engine_options), ray_remote_args)


def read_squirrel(url=None, keys=("image", "label"), *, shards=None, batch_size=256,
                  cache_dir=None, engine="auto", options=None, ray_remote_args=None,
                  **engine_options):
    """A Ray Dataset of a squirrel MessagePack store (``url``, a directory of
    shards, or ``shards=`` paths), one read task per shard
    (:class:`fastread.SquirrelStore` over it). Columns: one per key (arrays
    with their stored dtype and shape; plain values as they are) and
    ``path`` (the shard)."""
    ds = _datasource()
    return ds.read(ds.SquirrelDatasource(url, keys, shards=shards, batch_size=batch_size,
                                         cache_dir=cache_dir, engine=engine, options=options,
                                         engine_options=engine_options),
                   ray_remote_args)


def read_parquet(paths, *, image="image", label="label", columns=None, split=None,
                 engine="auto", options=None, s3=None, ray_remote_args=None, **engine_options):
    """A Ray Dataset of the rows of Parquet / Arrow files (``paths`` as
    :class:`fastread.formats.Parquet` takes them: files, a Hub-style or
    ``save_to_disk`` directory, an ``s3://`` prefix; ``split`` picks a
    split), one read task per file: the task reads each row group's column
    chunks as byte ranges with fastread's engine and Arrow decodes them;
    one block per row group. Columns: ``bytes`` (the image values, as Arrow
    decoded them: no copy before Ray's), ``label`` (int32) and
    ``columns``."""
    ds = _datasource()
    return ds.read(ds.ParquetDatasource(paths, image=image, label=label, columns=columns,
                                        split=split, engine=engine, options=options, s3=s3,
                                        engine_options=engine_options), ray_remote_args)
