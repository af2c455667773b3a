"""The Parquet source's native route (issue 40): a row group's image column
chunk, read by fastread's engine into a buffer it owns, decoded by Apache
Arrow's own C++ Parquet library (``fastread._parquet_native``, a shim built
against the pyarrow wheel's libparquet, the GIL released), its values handed
out as views of that buffer: for an uncompressed image column nothing is
copied after the engine's read (Arrow's page reader slices the chunk, its
PLAIN decoder points into the slices). Values Arrow does not leave in the
chunk (decompressed pages, whose buffer it reuses at the next page;
dictionary values, which its decoder copies) are copied once into one side
buffer per row group, in place of Arrow's copy into a BinaryArray.

Used where the shim was built (``FASTREAD_PARQUET_NATIVE``, AUTO: where
pyarrow's headers were found at build time) and the running pyarrow is the
Arrow it was built against; else the source reads through pyarrow's Python
reader as before (:func:`status` says why; ``fastread info`` shows it).
Only for the Reader's samples: ``columns=``, :meth:`Parquet.row_group` and
:meth:`Parquet.table` want Arrow tables and take pyarrow's route."""
import functools
import os

import numpy as np

#: Compressed image chunks through the shim too (their values copied once
#: into a side buffer in place of Arrow's copy into a BinaryArray): off by
#: default, as it measured the same CPU as pyarrow's route (Snappy, 90.6 MB
#: row groups: 93.3 against 92.8 ms; docs/parquet.md) with no view to gain.
COMPRESSED = False

#: Set to False (or ``FASTREAD_PARQUET_NATIVE=0`` in the environment) to read
#: every row group through pyarrow's Python reader: the before of a
#: before/after, or a way round a fault of the shim.
ENABLED = True


@functools.lru_cache(maxsize=None)
def _probe():
    try:
        import pyarrow
    except ImportError as e:
        return None, f"pyarrow does not import ({e})"
    try:
        from fastread import _parquet_native as mod
    except ImportError as e:
        return None, (f"not built (fastread._parquet_native: {e}); built where pyarrow's "
                      "headers are found at build time (FASTREAD_PARQUET_NATIVE)")
    have = str(getattr(pyarrow, "cpp_version", pyarrow.__version__))
    if mod.ARROW_VERSION != have:
        return None, (f"built against Arrow {mod.ARROW_VERSION}, but the pyarrow here is "
                      f"Arrow {have}: rebuild fastread")
    return mod, None


def status():
    """(the shim module, None) where row groups are decoded natively here,
    else (None, why not)."""
    if not ENABLED:
        return None, "switched off (fastread.formats._parquet_native.ENABLED = False)"
    if os.environ.get("FASTREAD_PARQUET_NATIVE", "").strip().lower() in ("0", "off", "false",
                                                                         "no"):
        return None, "switched off (FASTREAD_PARQUET_NATIVE=0)"
    return _probe()


def footer_for(meta, leaf):
    """The shim's parsed footer of one Parquet file and the leaf column's
    index, or (None, why not): a leaf the shim cannot read (not BYTE_ARRAY,
    repeated, encrypted) takes pyarrow's route."""
    mod, why = status()
    if mod is None:
        return None, None, why
    thrift = getattr(meta, "thrift", None)
    if thrift is None:
        return None, None, "no footer bytes kept"
    schema = meta.metadata.schema
    cols = [i for i in range(meta.metadata.num_columns) if schema.column(i).path == leaf]
    if len(cols) != 1:
        return None, None, f"no single leaf {leaf!r}"
    try:
        footer = mod.Footer(np.frombuffer(thrift, np.uint8))
        if meta.metadata.num_row_groups:
            footer.chunk_info(0, cols[0])
    except (NotImplementedError, ValueError) as e:
        return None, None, str(e)
    return footer, cols[0], None


def decode(footer, column, g, chunk, rows, uncompressed):
    """One row group's image values: (values, begin, end, valid, side,
    in_side, copied) for the Parquet source's ``_cut``: value j is
    ``values[begin[j]:end[j]]`` (``side[...]`` where ``in_side[j]``), null
    where ``valid[j]`` is False (``valid`` None: none null). ``values`` is
    the chunk (views) or, where every value was copied, the side buffer.
    Raises OSError / ValueError / NotImplementedError / MemoryError naming
    what Arrow said."""
    begin, length, side, copied = footer.read_chunk(g, column, chunk, rows, uncompressed)
    valid = None
    nulls = length < 0
    if nulls.any():
        valid = ~nulls
        length = np.where(nulls, 0, length)
        begin = np.where(nulls, 0, begin)
    in_side = None
    values = chunk
    if side is not None:
        neg = begin < 0
        begin = np.where(neg, -begin - 1, begin)
        if valid is not None:
            neg &= valid
        if copied == int(rows - (0 if valid is None else int(nulls.sum()))):
            values, side = side, None     # all copied: the chunk is not held
        else:
            in_side = neg
    return values, begin, begin + length, valid, side, in_side, copied


#: The Reader keeps a row group whose values all lie in its chunk (an
#: uncompressed PLAIN image column) as those values' file ranges (16 B a
#: row) and reads each batch's rows as byte ranges of the files, the chunk's
#: arena recycled at once; False: the chunk is kept and the rows are views
#: of it (the decoded set held in fresh memory: on the 2-core VM every held
#: byte was a page fault). Local files only (s3:// objects take pyarrow's
#: route: a second pass of ranged GETs would double the traffic).
RANGED = True

_ENODATA = 61
_EIO = 5

#: Experimental, off: a Reader's ranged route lets Arrow locate the values in
#: a read-only memory map of the chunk instead of the engine's copy of it
#: (Arrow's PLAIN decoder then touches only the pages holding length
#: prefixes and page headers); the rows themselves are still read by the
#: engine. The index pass is then no second read of every byte. A file cut
#: while mapped can raise SIGBUS, as for the .arrow files' maps.
INDEX_BY_MAP = False


def mapped_chunk(meta, offs, lens):
    """The image column chunk as a read-only uint8 view of a map of the
    file (the map kept by the view), or None where it cannot be mapped."""
    import mmap
    from fastread._safe_open import open_file
    try:
        with open_file(meta.path) as f:
            size = os.fstat(f.fileno()).st_size
            off, n = int(offs[0]), int(lens[0])
            if off + n > size:
                return None
            start = off - off % mmap.ALLOCATIONGRANULARITY
            mm = mmap.mmap(f.fileno(), off + n - start, access=mmap.ACCESS_READ, offset=start)
    except (OSError, ValueError):
        return None
    return np.frombuffer(mm, np.uint8, count=n, offset=off - start)


def _read_file_rows(ctx, path, pos, offs, lens, groups, rows, arrays, failures, why):
    """Rows of one file as byte ranges in one engine call: batch positions
    ``pos``, ranges ``offs``/``lens``, named by ``groups``/``rows``. Each row
    lands in ``arrays``; a range that fails or comes back short (the file
    shrank since it was indexed) fails its sample, named."""
    def name(k):
        return (f"{path}: reading row group {int(groups[k])}, row {int(rows[k])} "
                f"({int(lens[k])} bytes at {int(offs[k])})")
    try:
        batch = ctx.read_ranges(path, offs, lens)
    except (OSError, ValueError, MemoryError) as e:
        for k, i in enumerate(pos):
            failures.append((i, getattr(e, "errno", None) or _EIO))
            why[i] = f"{name(k)}: {e}"
        return
    bad = dict(batch.failures())
    got = batch.arrays()
    for k, i in enumerate(pos):
        a = got[k]
        if k in bad:
            failures.append((i, bad[k]))
            why[i] = f"{name(k)}: {ctx.sample_error(k) or os.strerror(bad[k])}"
        elif len(a) != lens[k]:
            failures.append((i, _ENODATA))
            why[i] = f"{name(k)}: {len(a)} bytes (the file shrank since it was indexed)"
        else:
            arrays[i] = a


def read_ranged(source, ctx, ranged, arrays, failures, why):
    """Reads the rows of ranged row groups of one batch (``ranged``: file ->
    [(batch position, offset, length, row group, row)]) as byte ranges, one
    engine call per file, into ``arrays``; a range that fails or comes back
    short fails its sample, named as the source names them."""
    if ctx is None:
        raise RuntimeError("ranged row groups need an engine context to read their rows")
    for f, items in ranged.items():
        items = [x for x in items if x[2] > 0]       # empty values: already empty arrays
        if not items:
            continue
        pos, offs, lens, groups, rows = (np.array(col, np.int64) for col in zip(*items))
        _read_file_rows(ctx, source.paths[f], pos.tolist(), offs, lens, groups, rows,
                        arrays, failures, why)


def cut_ranged(source, idx, files, grps, rows, loaded, ctx):
    """A batch whose row groups are all ranged (``_cut``'s common case with
    an uncompressed image column), the lookups done with NumPy: each row's
    file range from its row group's index, then one engine call per file.
    Returns (arrays, failures, why) in batch order."""
    n = len(idx)
    begin = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    ok = np.ones(n, bool)
    for (f, g), rg in loaded.items():
        sel = np.flatnonzero((files == f) & (grps == g))
        _start, _values, b, e, valid, _side, _in_side = rg.parts[0]
        r = rows[sel]
        begin[sel] = b[r]
        end[sel] = e[r]
        if valid is not None:
            ok[sel] = valid[r]
    empty = np.zeros(0, np.uint8)
    arrays = [empty] * n
    failures, why = [], {}
    if source.missing == "error":
        for i in np.flatnonzero(~ok).tolist():
            failures.append((i, _ENODATA))
            why[i] = f"null {source.image!r} value"
    want = ok & (end > begin)
    for f in np.unique(files[want]).tolist():
        sel = np.flatnonzero(want & (files == f))
        _read_file_rows(ctx, source.paths[f], sel.tolist(), begin[sel], end[sel] - begin[sel],
                        grps[sel], rows[sel], arrays, failures, why)
    failures.sort()
    return arrays, failures, why
