"""The rows of a Parquet data set in file order, for ``fastread pack``
(:func:`fastread.image.pack` from a Parquet data set, plain or decoded):
each row's image bytes (views of the row group Arrow decoded, read by
fastread's engine: :meth:`Parquet.row_group`), its label and a name.

Names: a Hugging Face ``Image`` column carries each image's ``path``; where
the label column has ``ClassLabel`` names the name is ``<class>/<path>``
(so a data set written from a class tree, :func:`write_image_parquet`,
packs under the names the tree itself packs under), else the path alone;
a row without a path is named as the source names it
(``file[row group g, row r]``)."""
import numpy as np

from fastread.formats._parquet_meta import _chunk_ranges, _decode, _pa, _read_range

__all__ = ["is_parquet_root", "row_names", "row_blobs"]


def is_parquet_root(root):
    """Whether ``root`` (a path) is a Parquet data set rather than a tree of
    image files: a ``.parquet`` file, or a directory holding ``.parquet``
    files (directly or under ``data/``, the Hub's layout) and no class
    folders of images beside them."""
    import os
    if os.path.isfile(root):
        return root.endswith(".parquet")
    for where in (root, os.path.join(root, "data")):
        if os.path.isdir(where) and any(n.endswith(".parquet") for n in os.listdir(where)):
            return True
    return False


def _paths_of(source, f, g):
    """The ``path`` field of the image struct for row group ``g`` of file
    ``f`` (str or None each), or None where the column has no such field."""
    meta = source.metas[f]
    leaf = f"{source.image}.path"
    if not source._image_struct or meta.kind != "parquet":
        return None
    names = [meta.metadata.schema.column(i).path for i in range(meta.metadata.num_columns)]
    if leaf not in names:
        return None
    offs, lens = _chunk_ranges(meta, g, [leaf])
    pieces = [(int(o), _read_range(meta.path, int(o), int(n), source.s3))
              for o, n in zip(offs, lens)]
    col = _decode(meta, g, [leaf], pieces).column(source.image)
    out = []
    for chunk in col.chunks:
        values = chunk.field("path").to_pylist()
        if chunk.null_count:
            values = [None if not ok else v
                      for ok, v in zip(chunk.is_valid().to_pylist(), values)]
        out += values
    return out


def row_names(source):
    """One name per row of ``source`` (a :class:`Parquet`), in its order."""
    classes = source.classes
    labels = source.labels
    out = []
    i = 0
    for f, meta in enumerate(source.metas):
        for g, rows in enumerate(meta.rows):
            paths = _paths_of(source, f, g)
            for r in range(rows):
                p = paths[r] if paths is not None else None
                if not p:
                    out.append(source.sample_name(i))
                elif classes is not None and 0 <= labels[i] < len(classes):
                    out.append(f"{classes[labels[i]]}/{p}")
                else:
                    out.append(p)
                i += 1
    return out


def row_blobs(source, engine="auto", **engine_options):
    """Yields every row's image bytes in order: a uint8 view of its row
    group as Arrow decoded it (one row group held at a time), or None for
    a null value. A row group that cannot be read raises FormatError naming
    the file and the row group."""
    pa = _pa()
    for f, meta in enumerate(source.metas):
        for g in range(len(meta.rows)):
            col = source.row_group(f, g, engine=engine, **engine_options).column("bytes")
            for chunk in col.chunks:
                if not len(chunk):
                    continue
                if pa.types.is_dictionary(chunk.type):
                    chunk = chunk.dictionary_decode()
                valid = chunk.is_valid().to_numpy(zero_copy_only=False) \
                    if chunk.null_count else None
                bufs = chunk.buffers()
                large = (pa.types.is_large_binary(chunk.type)
                         or pa.types.is_large_string(chunk.type))
                offsets = np.frombuffer(bufs[1], np.int64 if large else np.int32)[
                    chunk.offset:chunk.offset + len(chunk) + 1]
                values = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None \
                    else np.zeros(0, np.uint8)
                for j in range(len(chunk)):
                    if valid is not None and not valid[j]:
                        yield None
                    else:
                        yield values[offsets[j]:offsets[j + 1]]
