"""Bounded decompression of gzip'd shards (fastread.formats._gzip): a
decompression bomb fails naming its shard within bounded memory and time,
past max_inflated or at the first byte its format cannot hold (a tar's
headers followed as inflated, a Squirrel shard's first map); valid shards,
concatenated members and zero padding still read."""
import gzip
import io
import os
import subprocess
import sys
import tarfile
import textwrap
import time
import zlib

import numpy as np
import pytest
from conftest import write_tar

import fastread
from fastread.formats import FormatError, SquirrelStore, WebDataset
from fastread.formats import _gzip

ZEROS_MEMBER = gzip.compress(bytes(64 << 20), compresslevel=9)   # 64 MiB of zeros, ~64 KB


def bomb(path, gib=2, head=b""):
    """A gzip file of ``head`` then ``gib`` GiB of zeros, as concatenated
    members of 64 MiB each: 2 GiB in about 2 MB, made in a few ms."""
    with open(path, "wb") as f:
        if head:
            f.write(gzip.compress(head))
        for _ in range(gib * 16):
            f.write(ZEROS_MEMBER)
    return str(path)


def no_copies(cache):
    return not os.path.isdir(cache) or os.listdir(cache) == []


def test_zeros_bomb_as_a_tar_fails_at_once(tmp_path):
    # Zeros are an empty tar (its end-of-archive block) followed by 2 GiB:
    # more than the 1 MiB a tar may carry after its end.
    p = bomb(tmp_path / "bomb.tar.gz")
    cache = str(tmp_path / "cache")
    t = time.perf_counter()
    with pytest.raises(FormatError, match=r"bomb\.tar\.gz at byte 0: the inflated stream goes "
                                          r"on past the end of its tar archive") as e:
        WebDataset([p], ["jpg"], cache_dir=cache)
    assert time.perf_counter() - t < 10
    assert e.value.path == p and no_copies(cache)


def test_bomb_after_a_valid_tar_fails_past_its_end(tmp_path):
    tar = open(write_tar(tmp_path / "g.tar", [("a.jpg", b"x" * 900), ("a.cls", b"1")]),
               "rb").read()
    p = bomb(tmp_path / "b.tar.gz", gib=1, head=tar)
    with pytest.raises(FormatError, match=r"at byte 2560: the inflated stream goes on past the "
                                          r"end of its tar archive"):
        WebDataset([p], ["jpg"], cache_dir=str(tmp_path / "cache"))
    # The padding tar(1) and tarfile write after the end (to a 10240-byte record) is fine.
    ok = tmp_path / "ok.tar.gz"
    ok.write_bytes(gzip.compress(tar + bytes(20 * 512)))
    assert len(WebDataset([str(ok)], ["jpg"], cache_dir=str(tmp_path / "cache"))) == 1


def test_member_declared_past_max_inflated_fails_at_its_header(tmp_path):
    info = tarfile.TarInfo("big.jpg")
    info.size = 8 << 30          # declared, never there
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    p = tmp_path / "declared.tar.gz"
    p.write_bytes(gzip.compress(header + bytes(1 << 20)))
    with pytest.raises(FormatError, match=r"declared\.tar\.gz at byte 0: a member declares "
                                          r"8589934592 bytes from byte 512: more than the "
                                          r"1048576 bytes the shard may inflate to"):
        WebDataset([str(p)], ["jpg"], cache_dir=str(tmp_path / "cache"), max_inflated="1MiB")


def test_junk_that_is_no_tar_fails_in_its_first_step(tmp_path):
    p = tmp_path / "junk.tar.gz"
    p.write_bytes(gzip.compress(b"hello world " * (1 << 20)))   # 12 MiB of no tar
    with pytest.raises(FormatError, match=r"junk\.tar\.gz at byte 0: not a tar archive"):
        WebDataset([str(p)], ["jpg"], cache_dir=str(tmp_path / "cache"))


def test_max_inflated_bounds_a_valid_shard(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    tar = write_tar(tmp_path / "g.tar", [("a.jpg", rng.bytes(3 << 20)), ("a.cls", b"1")])
    p = tmp_path / "g.tar.gz"
    p.write_bytes(gzip.compress(open(tar, "rb").read(), compresslevel=1))
    cache = str(tmp_path / "cache")
    with pytest.raises(FormatError, match=r"g\.tar\.gz at byte \d+: .*more than (the )?2097152 "):
        WebDataset([str(p)], ["jpg"], cache_dir=cache, max_inflated=2 << 20)
    monkeypatch.setenv("FASTREAD_FORMATS_MAX_INFLATED", "2MiB")
    with pytest.raises(FormatError, match="more than (the )?2097152 "):
        WebDataset([str(p)], ["jpg"], cache_dir=cache)
    assert no_copies(cache)
    assert len(WebDataset([str(p)], ["jpg"], cache_dir=cache, max_inflated="4MiB")) == 1
    monkeypatch.setenv("FASTREAD_FORMATS_MAX_INFLATED", "lots")
    with pytest.raises(ValueError, match="FASTREAD_FORMATS_MAX_INFLATED='lots'"):
        WebDataset([str(p) + ".other.gz"], ["jpg"], cache_dir=cache)
    with pytest.raises(ValueError, match="max_inflated must be >= 0"):
        _gzip.max_inflated(-1)


def test_squirrel_bombs_fail_in_their_first_step(tmp_path):
    pytest.importorskip("msgpack")
    d = tmp_path / "store"
    d.mkdir()
    bomb(d / "a.gz")
    t = time.perf_counter()
    with pytest.raises(FormatError, match=r"a\.gz at byte 0: the inflated shard starts with "
                                          r"byte 0x00, not a MessagePack map"):
        SquirrelStore(str(d), keys=("x",), cache_dir=str(tmp_path / "cache"))
    assert time.perf_counter() - t < 10
    # A store bounded by max_inflated: valid maps, then 2 GiB more.
    import msgpack

    (d / "a.gz").unlink()
    bomb(d / "a.gz", gib=1, head=msgpack.packb({"x": 1}))
    with pytest.raises(FormatError, match=r"a\.gz at byte \d+: inflates to more than 67108864"):
        SquirrelStore(str(d), keys=("x",), cache_dir=str(tmp_path / "cache"),
                      max_inflated="64MiB")


def test_members_padding_and_steps(tmp_path):
    """Concatenated members, zero padding after the last (as gzip(1)
    accepts), and a stream whose every step is full (incompressible data
    between runs of zeros) inflate exactly; truncation anywhere fails."""
    rng = np.random.default_rng(1)
    parts = [rng.bytes(3 << 20), bytes(5 << 20), rng.bytes(100), b"", bytes(_gzip.STEP)]
    want = b"".join(parts)
    p = tmp_path / "m.gz"
    p.write_bytes(b"".join(gzip.compress(x) for x in parts) + bytes(1000))
    dest = str(tmp_path / "out")
    _gzip.gunzip_to(str(p), dest)
    assert open(dest, "rb").read() == want
    raw = zlib.compressobj(9, zlib.DEFLATED, 31)
    one = raw.compress(want) + raw.flush()
    for cut in (10, len(one) // 2, len(one) - 4):
        p.write_bytes(one[:cut])
        with pytest.raises(FormatError, match=r"m\.gz at byte \d+: (truncated|bad) gzip"):
            _gzip.gunzip_to(str(p), dest)


def test_memory_does_not_grow_with_the_compression_ratio(tmp_path):
    """A tar.gz holding one member of 256 MiB of zeros (~250 KB compressed):
    inflating it grows the process's peak RSS by a few MiB, not by the
    output of a whole read (1 MiB of such input inflates to ~1 GiB)."""
    info = tarfile.TarInfo("z.bin")
    info.size = 256 << 20
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        t.addfile(info, io.BytesIO(bytes(info.size)))
    p = tmp_path / "z.tar.gz"
    p.write_bytes(gzip.compress(tar.getvalue(), compresslevel=9))
    code = textwrap.dedent(f"""
        import resource
        from fastread.formats import WebDataset
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        src = WebDataset([{str(p)!r}], ["bin"], cache_dir={str(tmp_path / "cache")!r})
        print(len(src), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    n, grown_kib = map(int, out.stdout.split())
    assert n == 1 and grown_kib < 32 << 10, f"peak RSS grew by {grown_kib} KiB"


def test_special_file_as_a_gzip_shard_is_refused(tmp_path):
    fifo = tmp_path / "f.tar.gz"
    os.mkfifo(fifo)
    with pytest.raises(fastread.ReadError, match="a FIFO"):
        _gzip.gunzip_to(str(fifo), str(tmp_path / "out"))
