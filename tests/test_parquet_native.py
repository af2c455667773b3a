"""The Parquet source's native route (fastread.formats._parquet_native, issue
40): row groups decoded by Arrow's C++ Parquet library through the shim, the
values views of the engine's chunk where Arrow leaves them there. Every case
reads the same files by both routes and wants the same bytes: uncompressed,
Snappy, Zstd, Gzip; plain, dictionary and delta encodings; nulls of the leaf
and of the HF struct; several row groups and files; large values; multi-page
chunks. Skipped, naming why, where the shim is not built or cannot be used."""
import gc

import numpy as np
import pytest

import fastread
from fastread.formats import FormatError, Parquet, _parquet_native

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

_MOD, _WHY = _parquet_native.status()
pytestmark = pytest.mark.skipif(_MOD is None, reason=f"native Parquet route: {_WHY}")


def rows(path, native, missing="error", ranged=True, **kw):
    """Every row of ``path`` by one route (a Reader in file order), with the
    source and the Reader's stats."""
    kept = _parquet_native.ENABLED, _parquet_native.RANGED, _parquet_native.COMPRESSED
    # Compressed chunks through the shim too (by default they take pyarrow's
    # route): the same bytes either way is what is tested.
    _parquet_native.ENABLED, _parquet_native.RANGED, _parquet_native.COMPRESSED = \
        native, ranged, True
    try:
        src = Parquet(path, missing=missing, **kw)
        out = []
        with fastread.Reader(source=src, batch_size=7) as r:
            for arrays, _labels in r:
                out += [a.tobytes() for a in arrays]
            stats = r.stats()
    finally:
        _parquet_native.ENABLED, _parquet_native.RANGED, _parquet_native.COMPRESSED = kept
    return out, src, stats


def both(path, **kw):
    nat, src, stats = rows(path, True, **kw)
    held, _, held_stats = rows(path, True, ranged=False, **kw)
    ref, ref_src, ref_stats = rows(path, False, **kw)
    assert src.native_why is None, src.native_why
    assert ref_stats["row_groups_native"] == 0 and "ENABLED" in ref_src.native_why
    assert stats["row_groups_native"] == stats["row_group_loads"] > 0
    # Ranged where nothing was copied (every value a range of the file).
    assert (stats["row_groups_ranged"] > 0) == (stats["values_copied_native"] == 0)
    assert held_stats["row_groups_ranged"] == 0
    assert nat == ref == held
    return nat, stats


def owner(a):
    """The first object below a NumPy view that is not an ndarray."""
    while isinstance(a, np.ndarray):
        a = a.base
    return a


def values(n, seed=0, hi=3000, nulls=()):
    rng = np.random.default_rng(seed)
    out = [rng.integers(0, 256, int(rng.integers(0, hi)), dtype=np.uint8).tobytes()
           for _ in range(n)]
    for i in nulls:
        out[i] = None
    return out


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip"])
@pytest.mark.parametrize("dictionary", [False, True])
def test_codecs_and_encodings_equal_pyarrow(tmp_path, compression, dictionary):
    rng = np.random.default_rng(5)
    pool = values(9, seed=1)
    vals = [pool[int(i)] for i in rng.integers(0, 9, 120)]
    path = str(tmp_path / "t.parquet")
    # Small pages: chunks of many pages (the page buffer reused between them).
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}), path, row_group_size=50,
                   compression=compression, use_dictionary=dictionary, data_page_size=4096)
    got, stats = both(path)
    assert got == vals
    if compression == "none" and not dictionary:
        assert stats["values_copied_native"] == 0        # views of the chunk
    else:
        assert stats["values_copied_native"] == len(vals)


def test_uncompressed_values_are_views_of_the_engine_buffer(tmp_path):
    vals = values(40, seed=2)
    path = str(tmp_path / "v.parquet")
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}), path, row_group_size=16,
                   compression="none", use_dictionary=False)
    _parquet_native.ENABLED = True
    src = Parquet(path)
    arrays = src.read(np.arange(len(vals)))
    # A view of the engine's batch (its arena), not an Arrow buffer or a copy.
    assert all(type(owner(a)).__name__ == "Batch" for a in arrays if len(a))
    snappy = str(tmp_path / "s.parquet")
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}), snappy, row_group_size=16,
                   compression="snappy", use_dictionary=False)
    assert type(owner(Parquet(snappy).read([0])[0])).__name__ != "_Side"   # pyarrow's route
    _parquet_native.COMPRESSED = True
    try:
        copied = Parquet(snappy).read(np.arange(len(vals)))
    finally:
        _parquet_native.COMPRESSED = False
    assert all(type(owner(a)).__name__ == "_Side" for a in copied if len(a))
    del src
    gc.collect()
    # The views keep their buffers alive after the source and reader are gone.
    assert [a.tobytes() for a in arrays] == vals == [a.tobytes() for a in copied]


def test_nulls_of_the_leaf_and_of_the_struct(tmp_path):
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    vals = values(30, seed=3)
    items = [{"bytes": v, "path": str(i)} for i, v in enumerate(vals)]
    items[4] = None                                  # the struct null
    items[11] = {"bytes": None, "path": "x"}         # the leaf null
    path = str(tmp_path / "n.parquet")
    for comp in ("none", "snappy"):
        pq.write_table(pa.table({"image": pa.array(items, struct)}), path, row_group_size=8,
                       compression=comp, use_dictionary=False)
        got, _ = both(path, missing="empty")
        want = [b"" if i in (4, 11) else v for i, v in enumerate(vals)]
        assert got == want
        src = Parquet(path)
        assert src.native_why is None
        for row in (4, 11):
            with pytest.raises(fastread.ReadError) as e:
                src.read([row])
            g, r = divmod(row, 8)
            assert f"{path}[row group {g}, row {r}]" in str(e.value) and "null" in str(e.value)
    top = str(tmp_path / "top.parquet")
    pq.write_table(pa.table({"image": pa.array(values(10, nulls=(0, 9)), pa.binary())}), top,
                   compression="none", use_dictionary=False)
    got, _ = both(top, missing="empty")
    assert got[0] == got[9] == b""


def test_required_string_large_and_delta_columns(tmp_path):
    vals = values(25, seed=4)
    big = np.random.default_rng(9).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    vals[3] = big
    schema = pa.schema([pa.field("image", pa.binary(), nullable=False)])
    req = str(tmp_path / "req.parquet")
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}, schema=schema), req,
                   compression="none", use_dictionary=False, row_group_size=10)
    got, stats = both(req)
    assert got == vals and stats["values_copied_native"] == 0
    large = str(tmp_path / "large.parquet")
    pq.write_table(pa.table({"image": pa.array(vals, pa.large_binary())}), large,
                   compression="none", use_dictionary=False, row_group_size=10)
    assert both(large)[0] == vals
    text = str(tmp_path / "text.parquet")
    words = [f"word {i} " * i for i in range(30)]
    pq.write_table(pa.table({"image": pa.array(words, pa.string())}), text,
                   compression="zstd", row_group_size=12)
    assert both(text)[0] == [w.encode() for w in words]
    for enc in ("DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"):
        delta = str(tmp_path / f"{enc}.parquet")
        pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}), delta,
                       use_dictionary=False, column_encoding={"image": enc},
                       compression="none", row_group_size=10)
        assert both(delta)[0] == vals


def test_several_files_and_row_groups_hub_layout(tmp_path):
    from fastread.datasets import make_imagenet_like
    from fastread.formats.parquet import write_image_parquet
    root = str(tmp_path / "jpegs")
    make_imagenet_like(root, classes=3, per_class=9, width=64, height=48, mean_kb=3,
                       progress=False, workers=1)
    paths, _ = fastread.scan(root)
    data = []
    for p in paths:
        with open(p, "rb") as f:
            data.append(f.read())
    for comp in ("snappy", {"image.bytes": "none", "image.path": "snappy", "label": "snappy"}):
        out = str(tmp_path / ("hub-" + ("snappy" if comp == "snappy" else "none")))
        write_image_parquet(root, out, rows_per_group=5, files=3, compression=comp)
        got, _ = both(out)
        assert got == data
        # A shuffled Reader over several files gives every row once.
        src = Parquet(out)
        with fastread.Reader(source=src, batch_size=4, random_shuffle=True, seed=1) as r:
            seen = [a.tobytes() for arrays, _ in r for a in arrays]
        assert sorted(seen) == sorted(data)


def test_a_damaged_chunk_fails_its_samples_naming_file_and_row_group(tmp_path):
    vals = [bytes([i]) * 500 for i in range(20)]
    path = tmp_path / "dmg.parquet"
    pq.write_table(pa.table({"image": vals}), str(path), row_group_size=10,
                   compression="none", use_dictionary=False)
    col = pq.read_metadata(str(path)).row_group(1).column(0)
    raw = bytearray(path.read_bytes())
    start = col.data_page_offset
    raw[start:start + 16] = b"\xff" * 16           # the page header
    path.write_bytes(bytes(raw))
    src = Parquet(str(path))
    assert src.native_why is None
    assert [a.tobytes() for a in src.read(range(10))] == vals[:10]
    with pytest.raises(fastread.ReadError, match=f"{path}\\[row group 1, row 0\\].*Arrow"):
        src.read([10])
    with pytest.raises(FormatError, match=f"{path}.*row group 1"):
        src.row_group(0, 1)


def test_ranged_rows_shuffled_and_a_shrunk_file_named(tmp_path):
    vals = values(60, seed=8, hi=20000)
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}), str(path),
                   row_group_size=20, compression="none", use_dictionary=False)
    src = Parquet(str(path))
    assert src.ranged and not Parquet(str(path), ranged=False).ranged
    with fastread.Reader(source=src, batch_size=8, random_shuffle=True, seed=4) as r:
        got = [a.tobytes() for e in range(2) for arrays, _ in r for a in arrays]
        stats = r.stats()
    # Two epochs, every row group indexed once and kept as 16 B a row.
    assert sorted(got) == sorted(vals * 2) and stats["row_groups_ranged"] == 3
    assert stats["row_group_loads"] == 3 and stats["row_group_bytes_cached"] == 60 * 16
    assert src.decoded_bytes() == 60 * 16          # the index is what the cache holds
    # The file cut after it was indexed: the rows past the cut fail, named.
    cut = pq.read_metadata(str(path)).row_group(2).column(0).data_page_offset + 100
    with fastread.Reader(source=Parquet(str(path)), batch_size=20) as r:
        assert [a.tobytes() for arrays, _ in r for a in arrays] == vals
        assert r.stats()["row_groups_ranged"] == 3
        with open(path, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(fastread.ReadError,
                           match=f"{path}\\[row group 2, row \\d+\\].*(shrank|No data)"):
            for _ in r:
                pass


def test_where_the_route_is_not_taken_it_says_why(tmp_path, monkeypatch):
    path = str(tmp_path / "c.parquet")
    vals = values(12, seed=6)
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary()), "extra": list(range(12))}),
                   path, compression="none", use_dictionary=False)
    src = Parquet(path, columns=["extra"])
    assert "columns=" in src.native_why
    assert [a.tobytes() for a in src.read(range(12))] == vals
    monkeypatch.setenv("FASTREAD_PARQUET_NATIVE", "0")
    assert "FASTREAD_PARQUET_NATIVE=0" in Parquet(path).native_why
    monkeypatch.delenv("FASTREAD_PARQUET_NATIVE")
    # A pyarrow other than the Arrow the shim was built against: not used.
    _parquet_native._probe.cache_clear()
    monkeypatch.setattr(pa, "cpp_version", "0.0.1")
    try:
        mod, why = _parquet_native.status()
        assert mod is None and "rebuild" in why and _MOD.ARROW_VERSION in why
        assert [a.tobytes() for a in Parquet(path).read(range(12))] == vals
    finally:
        monkeypatch.undo()
        _parquet_native._probe.cache_clear()
    assert _parquet_native.status()[0] is not None


def test_info_names_the_route():
    from fastread.cli.info import collect
    q = collect()["parquet"]
    assert q["native"] is True and q["native_reason"] is None


def test_write_image_parquet_writes_the_image_bytes_uncompressed(tmp_path):
    from fastread.datasets import make_imagenet_like
    from fastread.formats.parquet import write_image_parquet
    root = str(tmp_path / "jpegs")
    make_imagenet_like(root, classes=2, per_class=3, width=32, height=24, mean_kb=2,
                       progress=False, workers=1)
    out = write_image_parquet(root, str(tmp_path / "hub"), rows_per_group=4)
    rg = pq.read_metadata(out[0]).row_group(0)
    codecs = {rg.column(c).path_in_schema: rg.column(c).compression for c in range(rg.num_columns)}
    assert codecs == {"image.bytes": "UNCOMPRESSED", "image.path": "SNAPPY", "label": "SNAPPY"}
    with fastread.Reader(source=Parquet(str(tmp_path / "hub")), batch_size=4) as r:
        list(r)
        assert r.stats()["row_groups_ranged"] == 2


def test_index_by_map_gives_the_same_rows(tmp_path, monkeypatch):
    vals = values(50, seed=11, hi=9000, nulls=(7,))
    path = str(tmp_path / "m.parquet")
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary())}), path, row_group_size=16,
                   compression="none", use_dictionary=False)
    monkeypatch.setattr(_parquet_native, "INDEX_BY_MAP", True)
    src = Parquet(path, missing="empty")
    with fastread.Reader(source=src, batch_size=6, random_shuffle=True, seed=2) as r:
        got = sorted(a.tobytes() for arrays, _ in r for a in arrays)
        assert r.stats()["row_groups_ranged"] == 4
    assert got == sorted(v or b"" for v in vals)
