"""Packed images with the binary index (version 3): the same samples as the
JSON index, columns mapped in place, corruption found at open or by verify,
and an index of 10^6 samples opening without paging its columns in."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastread
from fastread import image as im
from fastread import image_index as ii
from fastread.names import NameTable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench", "scale"))
import generate  # noqa: E402  (bench/scale/generate.py)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    rng = np.random.default_rng(3)
    for c in range(3):
        d = root / f"class{c}"
        d.mkdir()
        for j in range(7):
            (d / f"s{j}.jpg").write_bytes(rng.bytes(int(rng.integers(0, 5000))))
    # a name that is not UTF-8 (surrogateescape round trip)
    (root / "class1" / os.fsdecode(b"odd\xff.jpg")).write_bytes(b"odd bytes")
    return root


@pytest.fixture(scope="module")
def both(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs")
    js = im.pack(tree, out / "j.img", index_format="json", progress=False)
    bi = im.pack(tree, out / "b.img", index_format="binary", progress=False)
    return js, bi


def test_binary_index_holds_what_the_json_one_does(both):
    js, bi = both
    assert bi.version == ii.INDEX_VERSION_BINARY and js.version == ii.INDEX_VERSION
    assert isinstance(bi.names, NameTable) and isinstance(js.names, list)
    assert list(bi.names) == js.names and bi.names == js.names
    for col in ("labels", "lengths", "checksums"):
        np.testing.assert_array_equal(getattr(bi, col), getattr(js, col))
    assert bi.index_verified   # small: every column's CRC checked at open
    assert not bi.offsets.flags.writeable   # a view of the mapped file, not a copy


def test_reader_reads_the_same_bytes_through_either_index(both):
    js, bi = both
    got = {}
    for img in both:
        r = fastread.Reader(source=img, batch_size=5)
        got[img.version] = [(bytes(a), int(lab)) for arrays, labels in r
                            for a, lab in zip(arrays, labels.tolist())]
    assert got[ii.INDEX_VERSION] == got[ii.INDEX_VERSION_BINARY]
    assert im.verify(bi) == []


def test_auto_format_picks_json_below_the_threshold(tree, tmp_path):
    img = im.pack(tree, tmp_path / "a.img", progress=False)
    assert img.version == ii.INDEX_VERSION
    with pytest.raises(ValueError, match="index_format"):
        im.pack(tree, tmp_path / "x.img", index_format="xml", progress=False)


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def _column_start(index, name):
    raw = open(index, "rb").read(1 << 16)
    nl = raw.index(b"\n")
    length = int(raw[:nl].split()[2])
    meta_end = nl + 1 + length
    import json
    meta = json.loads(raw[nl + 1:meta_end])
    return -(-meta_end // 64) * 64 + meta["columns"][name][0]


@pytest.mark.parametrize("column", ["offsets", "labels", "names", "name_offsets"])
def test_a_damaged_column_is_refused_at_open(both, tmp_path, column):
    _, bi = both
    dst = tmp_path / "copy.index"
    dst.write_bytes(open(bi.index_path, "rb").read())
    _flip(dst, _column_start(dst, column))
    with pytest.raises(im.ImageError, match=rf"copy.index.*{column} column"):
        im.PackedImage(bi.path, index=dst)


def test_a_large_index_defers_its_column_check_to_verify(both, tmp_path, monkeypatch):
    _, bi = both
    dst = tmp_path / "copy.index"
    dst.write_bytes(open(bi.index_path, "rb").read())
    _flip(dst, _column_start(dst, "checksums"))
    monkeypatch.setattr(ii, "VERIFY_BELOW", 0)   # as if the columns were GBs
    img = im.PackedImage(bi.path, index=dst)
    assert not img.index_verified
    with pytest.raises(im.ImageError, match=r"copy.index.*checksums column"):
        im.verify(img)


@pytest.mark.parametrize("how", ["truncate", "append", "meta"])
def test_truncated_appended_or_damaged_meta_is_refused(both, tmp_path, how):
    _, bi = both
    raw = open(bi.index_path, "rb").read()
    dst = tmp_path / "bad.index"
    if how == "truncate":
        dst.write_bytes(raw[:-3])
        match = "truncated or appended"
    elif how == "append":
        dst.write_bytes(raw + b"\0")
        match = "truncated or appended"
    else:
        dst.write_bytes(raw)
        _flip(dst, raw.index(b"\n") + 5)
        match = "CRC-32 of its body"
    with pytest.raises(im.ImageError, match=rf"bad.index.*{match}"):
        im.PackedImage(bi.path, index=dst)


def test_name_table_is_a_sequence_of_str():
    names = ["a", "bb", "", os.fsdecode(b"\xfe\xff"), "ccc"]
    t = NameTable.from_names(names)
    assert len(t) == 5 and t[1] == "bb" and t[-1] == "ccc" and t[2] == ""
    assert t[1:4] == names[1:4] and list(t) == names
    assert t.index("ccc") == 4 and t.index(names[3]) == 3 and "zz" not in t
    with pytest.raises(IndexError):
        t[5]
    with pytest.raises(ValueError):
        t.index("zz")
    with pytest.raises(TypeError):
        t["a"]
    with pytest.raises(ValueError, match="decrease"):
        NameTable(b"abc", np.array([0, 2, 1, 3])).check("table")


def test_a_million_sample_index_opens_without_reading_its_columns(tmp_path):
    n = 1_000_000
    # The scale benchmark's own sparse image (bench/scale/generate.py), with a
    # binary index made without a Python object per sample.
    path = generate.make_image(str(tmp_path), n, sparse=True, index_format="binary")
    per = -(-n // generate.folders_for(n))
    # In a child: its RSS says what opening pages in (the parent holds the
    # columns it wrote). VERIFY_BELOW=0: what an index over 256 MiB does.
    code = textwrap.dedent(f"""
        import numpy as np
        from fastread import image as im, image_index as ii
        def rss():
            return int([l for l in open('/proc/self/status')
                        if l.startswith('VmRSS')][0].split()[1]) * 1024
        ii.VERIFY_BELOW = 0
        before = rss()
        img = im.PackedImage({str(path)!r})
        grown = rss() - before
        assert len(img) == {n} and not img.index_verified
        assert img.names[123456] == {f"{123456 // per:04d}/00123456.jpg"!r}
        assert int(img.labels[-1]) == {(n - 1) // per}
        print(grown)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    grown = int(out.stdout.split()[-1])
    # 32 MB of columns and 17 MB of names; opening touches a few pages of them.
    assert grown < 4 << 20, f"opening grew RSS by {grown} bytes"
