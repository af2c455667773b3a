"""The record formats' decompression cache (fastread.formats._cache): copies
are reused, the directory is pruned to its bound (least recently used
first, never what the source being built needs), and bad bounds are clear
errors."""
import gzip
import io
import os
import tarfile
import time

import numpy as np
import pytest

from fastread.formats import WebDataset
from fastread.formats import _cache


def _gz_shard(path, count, seed, payload=2000):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(count):
            for ext, data in (("jpg", rng.integers(0, 256, payload, np.uint8).tobytes()),
                              ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"s{seed}_{i:04d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buf.getvalue()))
    return str(path), len(buf.getvalue())


def _copies(cache):
    return sorted(n for n in os.listdir(cache) if not n.endswith(".tmp"))


def test_copies_are_reused_and_touched(tmp_path):
    shard, _ = _gz_shard(tmp_path / "a.tar.gz", 4, 0)
    cache = tmp_path / "c"
    WebDataset([shard], ["jpg"], cache_dir=str(cache))
    (copy,) = _copies(cache)
    old = time.time() - 1000
    os.utime(cache / copy, (old, old))
    inode = os.stat(cache / copy).st_ino
    WebDataset([shard], ["jpg"], cache_dir=str(cache))
    assert _copies(cache) == [copy] and os.stat(cache / copy).st_ino == inode  # not remade
    assert os.stat(cache / copy).st_mtime > old + 900                          # used now


def test_two_threads_decompressing_one_shard_both_get_it_whole(tmp_path, monkeypatch):
    """Thread A writes its first chunk and waits while thread B decompresses
    the same shard from start to end; then A finishes. Both copies are whole
    (they shared one temporary: B truncated A's, A's rename then failed with
    FileNotFoundError, and a later start left a hole read as a short shard)."""
    import threading
    import zlib as real_zlib

    from fastread.formats import _gzip

    shard, _ = _gz_shard(tmp_path / "a.tar.gz", 600, 0, payload=4000)   # several 1 MiB reads
    dest = str(tmp_path / "copy.tar")
    a_wrote, b_done = threading.Event(), threading.Event()
    a_thread = []

    class Decomp:   # thread A pauses after its first chunk
        def __init__(self, *args):
            self._d = real_zlib.decompressobj(*args)

        def decompress(self, data, max_length=0):
            out = self._d.decompress(data, max_length)
            if threading.current_thread() is a_thread[0] and not a_wrote.is_set():
                a_wrote.set()
                assert b_done.wait(60)
            return out

        def __getattr__(self, name):
            return getattr(self._d, name)

    class Zlib:
        error, MAX_WBITS = real_zlib.error, real_zlib.MAX_WBITS
        decompressobj = Decomp

    monkeypatch.setattr(_gzip, "zlib", Zlib)
    errors = []

    def run():
        try:
            _gzip.gunzip_to(shard, dest)
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    a = threading.Thread(target=run)
    a_thread.append(a)
    a.start()
    assert a_wrote.wait(60)
    run()            # thread B: this one, start to end, while A waits
    b_done.set()
    a.join(60)
    assert errors == []
    with gzip.open(shard, "rb") as f:
        assert open(dest, "rb").read() == f.read()
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def test_prunes_least_recently_used_other_shards(tmp_path):
    shards = [_gz_shard(tmp_path / f"s{k}.tar.gz", 6, k) for k in range(4)]
    size = max(s for _p, s in shards)
    cache = tmp_path / "c"
    # Unbounded: every shard's copy stays.
    for k, (p, _s) in enumerate(shards):
        WebDataset([p], ["jpg"], cache_dir=str(cache))
        t = time.time() - 1000 + k   # s0 oldest ... s3 newest
        (c,) = [n for n in _copies(cache) if n.endswith(f"-s{k}.tar.gz.tar")]
        os.utime(cache / c, (t, t))
    assert len(_copies(cache)) == 4
    # A source of s3 and s1 with room for three copies: s0, the least recently
    # used of the others, goes; s2 stays.
    src = WebDataset([shards[3][0], shards[1][0]], ["jpg"], cache_dir=str(cache),
                     cache_bytes=3 * size)
    assert sorted(n.split("-", 1)[1] for n in _copies(cache)) == [
        "s1.tar.gz.tar", "s2.tar.gz.tar", "s3.tar.gz.tar"]
    assert len(src.read(np.arange(len(src)))) == 12   # its own copies are readable
    # A bound below what the source needs: only its copies stay.
    WebDataset([shards[0][0]], ["jpg"], cache_dir=str(cache), cache_bytes=0)
    assert [n.split("-", 1)[1] for n in _copies(cache)] == ["s0.tar.gz.tar"]


def test_bound_from_the_environment_and_foreign_files_kept(tmp_path, monkeypatch):
    shards = [_gz_shard(tmp_path / f"s{k}.tar.gz", 3, k)[0] for k in range(2)]
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "notes.txt").write_text("not a copy")
    stale = cache / ("0" * 16 + "-x.tar.123.tmp")
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = cache / ("1" * 16 + "-y.tar.456.tmp")   # maybe being written now
    fresh.write_bytes(b"half")
    WebDataset([shards[0]], ["jpg"], cache_dir=str(cache))
    monkeypatch.setenv("FASTREAD_FORMATS_CACHE_BYTES", "1KB")
    WebDataset([shards[1]], ["jpg"], cache_dir=str(cache))
    left = sorted(os.listdir(cache))
    assert "notes.txt" in left and fresh.name in left and stale.name not in left
    assert [n.split("-", 1)[1] for n in _copies(cache) if n != "notes.txt"] == ["s1.tar.gz.tar"]


def test_default_directory_follows_fastread_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTREAD_CACHE_DIR", str(tmp_path / "base"))
    shard, _ = _gz_shard(tmp_path / "a.tar.gz", 2, 0)
    src = WebDataset([shard], ["jpg"])
    assert src.cache_dir == str(tmp_path / "base" / "webdataset")
    assert len(_copies(src.cache_dir)) == 1


@pytest.mark.parametrize("value, parsed", [(0, 0), (12345, 12345), ("2KiB", 2048),
                                           ("3 MB", 3_000_000), ("1GiB", 1 << 30)])
def test_bound_parsing(value, parsed):
    assert _cache.cache_bytes(value) == parsed


@pytest.mark.parametrize("value", [-1, "lots", "5 parsecs", 1.5, True])
def test_bad_bound_names_the_argument(tmp_path, value):
    shard, _ = _gz_shard(tmp_path / "a.tar.gz", 2, 0)
    with pytest.raises(ValueError, match="cache_bytes"):
        WebDataset([shard], ["jpg"], cache_dir=str(tmp_path / "c"), cache_bytes=value)
    assert not (tmp_path / "c").exists()   # refused before any work


def test_bad_environment_bound_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTREAD_FORMATS_CACHE_BYTES", "-5")
    shard, _ = _gz_shard(tmp_path / "a.tar.gz", 2, 0)
    with pytest.raises(ValueError, match="FASTREAD_FORMATS_CACHE_BYTES"):
        WebDataset([shard], ["jpg"], cache_dir=str(tmp_path / "c"))


def test_squirrel_store_prunes_too(tmp_path):
    pytest.importorskip("msgpack")
    pytest.importorskip("msgpack_numpy")
    pytest.importorskip("squirrel", reason="squirrel-core writes the store")
    from fastread.datasets.squirrel import make_squirrel
    from fastread.formats import SquirrelStore
    store = tmp_path / "s"
    make_squirrel(str(store), samples=12, per_shard=4, shape=(3, 8, 8), seed=0)
    cache = tmp_path / "c"
    cache.mkdir()
    junk = cache / ("f" * 16 + "-old.gz.msgpack")
    junk.write_bytes(bytes(10000))
    os.utime(junk, (time.time() - 1000, time.time() - 1000))
    src = SquirrelStore(str(store), cache_dir=str(cache), cache_bytes=1)
    assert junk.name not in os.listdir(cache)
    assert len(_copies(cache)) == 3 and len(src) == 12
