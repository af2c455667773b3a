"""The Parquet ranges index in the node-local index cache
(fastread.formats._parquet_index_cache, issue 40): a second Reader over the
same files reads no image column chunk for its ranged row groups and gives
the same bytes; a rewritten file is indexed again; a damaged, truncated or
out-of-range entry is ignored; a file cut after its index was cached fails
its samples, named; ``index_cache=False`` writes nothing. Skipped, naming
why, where the native shim is not built."""
import os
import time

import numpy as np
import pytest

import fastread
from fastread.formats import Parquet, _parquet_index_cache, _parquet_native

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

_MOD, _WHY = _parquet_native.status()
pytestmark = pytest.mark.skipif(_MOD is None, reason=f"native Parquet route: {_WHY}")


def values(n, seed=0, hi=3000, nulls=()):
    rng = np.random.default_rng(seed)
    out = [rng.integers(0, 256, int(rng.integers(1, hi)), dtype=np.uint8).tobytes()
           for _ in range(n)]
    for i in nulls:
        out[i] = None
    return out


def write(path, vals, age=100, row_group_size=25, **kw):
    """``vals`` as an uncompressed PLAIN image column, its mtime ``age``
    seconds back (an older file than RACY_NS: cacheable)."""
    kw.setdefault("compression", "none")
    kw.setdefault("use_dictionary", False)
    pq.write_table(pa.table({"image": pa.array(vals, pa.binary()),
                             "label": pa.array(np.arange(len(vals)) % 3, pa.int64())}),
                   str(path), row_group_size=row_group_size, **kw)
    t = time.time() - age
    os.utime(path, (t, t))


def epoch(path, cache, **kw):
    src = Parquet(str(path), index_cache=cache, missing="empty", **kw)
    with fastread.Reader(source=src, batch_size=8) as r:
        out = [a.tobytes() for arrays, _ in r for a in arrays]
        stats = r.stats()
    return out, stats


def entries(cache):
    return sorted(n for n in os.listdir(cache) if n.endswith(".frpq")) \
        if os.path.isdir(cache) else []


def test_second_reader_reads_no_chunk_and_the_same_bytes(tmp_path):
    vals = values(100, seed=1, nulls=(7, 60))
    path = tmp_path / "a.parquet"
    write(path, vals)
    cache = str(tmp_path / "cache")
    want = [v or b"" for v in vals]
    first, s1 = epoch(path, cache)
    assert first == want
    assert s1["row_groups_ranged"] == 4 and s1["row_group_chunks_read"] == 4
    assert s1["row_groups_index_cached"] == 0 and s1["index_cache_written"] == 1
    assert len(entries(cache)) == 1
    # 16 B a row (offset and length) plus the header.
    size = os.path.getsize(os.path.join(cache, entries(cache)[0]))
    assert 16 * 100 < size < 16 * 100 + 1024
    second, s2 = epoch(path, cache)
    assert second == want
    assert s2["row_group_chunks_read"] == 0 and s2["row_groups_index_cached"] == 4
    assert s2["row_groups_ranged"] == 0 and s2["index_cache_written"] == 0
    # Shuffled, with the cached ranges: the same rows.
    src = Parquet(str(path), index_cache=cache, missing="empty")
    with fastread.Reader(source=src, batch_size=8, random_shuffle=True, seed=5) as r:
        got = [a.tobytes() for arrays, _ in r for a in arrays]
        assert r.stats()["row_group_chunks_read"] == 0
    assert sorted(got) == sorted(want)
    # A null is still a failed sample under missing="error", named.
    with fastread.Reader(source=Parquet(str(path), index_cache=cache), batch_size=8) as r:
        with pytest.raises(fastread.ReadError, match=r"row group 0, row 7\].*null"):
            for _ in r:
                pass


def test_a_rewritten_file_is_indexed_again(tmp_path):
    path = tmp_path / "a.parquet"
    cache = str(tmp_path / "cache")
    old = values(80, seed=2)
    write(path, old, age=200)
    assert epoch(path, cache)[0] == old
    new = values(90, seed=3, hi=5000)
    write(path, new, age=100, row_group_size=30)
    got, stats = epoch(path, cache)
    assert got == new
    assert stats["row_groups_index_cached"] == 0 and stats["row_group_chunks_read"] == 3
    assert len(entries(cache)) == 2      # the old one is another name, never read
    got, stats = epoch(path, cache)
    assert got == new and stats["row_groups_index_cached"] == 3
    # Same size and content, another mtime: another identity, not trusted.
    t = time.time() - 50
    os.utime(path, (t, t))
    got, stats = epoch(path, cache)
    assert got == new and stats["row_groups_index_cached"] == 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_ignored_and_rebuilt(tmp_path, damage):
    vals = values(60, seed=4)
    path = tmp_path / "a.parquet"
    write(path, vals)
    cache = str(tmp_path / "cache")
    epoch(path, cache)
    (name,) = entries(cache)
    entry = os.path.join(cache, name)
    raw = bytearray(open(entry, "rb").read())
    if damage == "truncate":
        raw = raw[:len(raw) - 9]
    elif damage == "flip":
        raw[-20] ^= 0xFF                 # a range's byte: the CRC no longer matches
    elif damage == "empty":
        raw = b""
    else:
        raw = os.urandom(len(raw))
    with open(entry, "wb") as f:
        f.write(raw)
    got, stats = epoch(path, cache)
    assert got == vals
    assert stats["row_groups_index_cached"] == 0 and stats["index_cache_ignored"] == 1
    assert stats["row_group_chunks_read"] == 3 and stats["index_cache_written"] == 1
    got, stats = epoch(path, cache)      # rewritten whole: trusted again
    assert got == vals and stats["row_groups_index_cached"] == 3


def test_an_entry_whose_ranges_leave_the_chunk_is_not_trusted(tmp_path):
    vals = values(50, seed=5)
    path = tmp_path / "a.parquet"
    write(path, vals)
    cache = str(tmp_path / "cache")
    epoch(path, cache)
    src = Parquet(str(path), index_cache=cache)
    meta = src.metas[0]
    key = _parquet_index_cache._key(meta, src._image_leaf, src._index_identity[0])
    entry = _parquet_index_cache.entry_path(cache, key)
    ranged, plain = _parquet_index_cache.read_entry(entry, key, meta)
    assert sorted(ranged) == [0, 1] and not plain
    # A well-formed entry (CRC right) whose range runs past its chunk, and
    # one whose row counts are not the footer's.
    b, ln = ranged[1]
    bad = dict(ranged)
    bad[1] = (b, ln + int(meta.size))
    _parquet_index_cache.write_entry(entry, key, meta.rows, bad, plain)
    with pytest.raises(ValueError, match="outside"):
        _parquet_index_cache.read_entry(entry, key, meta)
    got, stats = epoch(path, cache)
    assert got == vals and stats["index_cache_ignored"] == 1
    _parquet_index_cache.write_entry(entry, key, [25, 24], {0: ranged[0]}, plain)
    with pytest.raises(ValueError, match="row counts"):
        _parquet_index_cache.read_entry(entry, key, meta)
    # CRC right, the header not an object; longer than any entry of the file.
    import struct
    import zlib
    hb = b"[1, 2]"
    with open(entry, "wb") as f:
        f.write(struct.pack("<8sIIQ8x", _parquet_index_cache.MAGIC, len(hb), zlib.crc32(hb),
                            0) + hb)
    with pytest.raises(ValueError, match="header"):
        _parquet_index_cache.read_entry(entry, key, meta)
    with open(entry, "wb") as f:
        f.write(b"\0" * (2 << 20))
    with pytest.raises(ValueError, match="longer"):
        _parquet_index_cache.read_entry(entry, key, meta)
    got, stats = epoch(path, cache)
    assert got == vals and stats["index_cache_ignored"] == 1


def test_a_file_cut_after_its_index_was_cached_fails_its_samples_named(tmp_path):
    vals = values(60, seed=8, hi=20000)
    path = tmp_path / "r.parquet"
    write(path, vals, row_group_size=20)
    cache = str(tmp_path / "cache")
    epoch(path, cache)
    # The source built (footer read, identity taken), then the file cut:
    # the entry, opened at the first row group, is not the file's any more.
    src = Parquet(str(path), index_cache=cache)
    cut = pq.read_metadata(str(path)).row_group(2).column(0).data_page_offset + 100
    with open(path, "r+b") as f:
        f.truncate(cut)
    with fastread.Reader(source=src, batch_size=20) as r:
        it = iter(r)
        assert [a.tobytes() for a in next(it)[0]] == vals[:20]
        named = f"{path}\\[row group \\d, row \\d+\\].*(truncated|shrank|No data)"
        with pytest.raises(fastread.ReadError, match=named):
            for arrays, _ in it:
                for a in arrays:
                    assert a.tobytes() in vals
        stats = r.stats()
    assert stats["row_groups_index_cached"] == 0 and stats["index_cache_written"] == 0


def test_cached_ranges_then_the_file_cut_fail_named_not_wrong_bytes(tmp_path):
    vals = values(60, seed=9, hi=20000)
    path = tmp_path / "r.parquet"
    write(path, vals, row_group_size=20)
    cache = str(tmp_path / "cache")
    epoch(path, cache)
    src = Parquet(str(path), index_cache=cache)
    cut = pq.read_metadata(str(path)).row_group(2).column(0).data_page_offset + 100
    with fastread.Reader(source=src, batch_size=20) as r:
        # An epoch from the cached ranges (no chunk read), then the file cut:
        # the next epoch's rows past the cut fail, named, none wrong.
        assert [a.tobytes() for arrays, _ in r for a in arrays] == vals
        assert r.stats()["row_groups_index_cached"] == 3
        with open(path, "r+b") as f:
            f.truncate(cut)
        got = []
        with pytest.raises(fastread.ReadError,
                           match=f"{path}\\[row group 2, row \\d+\\].*(shrank|No data)"):
            for arrays, _ in r:
                got += [a.tobytes() for a in arrays]
        assert got == vals[:len(got)]
        assert r.stats()["row_group_chunks_read"] == 0


def test_index_cache_false_writes_nothing(tmp_path, monkeypatch):
    vals = values(40, seed=6)
    path = tmp_path / "a.parquet"
    write(path, vals)
    home = tmp_path / "home"
    monkeypatch.setenv("FASTREAD_CACHE_DIR", str(home))
    monkeypatch.delenv("FASTREAD_INDEX_CACHE_DIR", raising=False)
    got, stats = epoch(path, False)
    assert got == vals and stats["index_cache_written"] == 0
    assert not home.exists()
    # The default (None): the node-local cache under FASTREAD_CACHE_DIR.
    got, stats = epoch(path, None)
    assert got == vals and stats["index_cache_written"] == 1
    assert len(entries(str(home / "index"))) == 1


def test_a_racy_file_is_not_cached(tmp_path):
    vals = values(40, seed=7)
    path = tmp_path / "a.parquet"
    write(path, vals, age=0)
    cache = str(tmp_path / "cache")
    got, stats = epoch(path, cache)
    assert got == vals and stats["index_cache_written"] == 0 and not entries(cache)


def test_dictionary_row_groups_are_cached_as_not_rangeable(tmp_path):
    pool = values(5, seed=10)
    vals = [pool[i % 5] for i in range(60)]
    path = tmp_path / "d.parquet"
    write(path, vals, use_dictionary=True)
    cache = str(tmp_path / "cache")
    got, stats = epoch(path, cache)
    assert got == vals and stats["row_groups_ranged"] == 0
    assert stats["index_cache_written"] == 1
    got, stats = epoch(path, cache)      # today's route, the entry not rewritten
    assert got == vals and stats["row_group_chunks_read"] == 3
    assert stats["row_groups_index_cached"] == 0 and stats["index_cache_written"] == 0


def test_prune_keeps_the_most_recent_entries(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(5):
        p = cache / f"pq-{i:032x}.frpq"
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
    (cache / "pq-old.frpq.1.2.tmp").write_bytes(b"x")
    os.utime(cache / "pq-old.frpq.1.2.tmp", (1000, 1000))
    (cache / "wds-keep.fridx").write_bytes(b"x")
    _parquet_index_cache.prune(str(cache), keep=2)
    assert sorted(os.listdir(cache)) == [f"pq-{3:032x}.frpq", f"pq-{4:032x}.frpq",
                                         "wds-keep.fridx"]
