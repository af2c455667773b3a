"""Damaged packed images, indexes and bmaps, and fuzzed parsers.

A bit flipped anywhere in an image's header or its index fails opening with
ImageError naming the file; one flipped in a sample's bytes is found by
verify (naming the sample); truncation at any offset is an ImageError; a
malformed bmap raises ValueError naming the field. Hypothesis budgets are
small (CI has 2 cores).
"""
import json
import os
import shutil
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastread
from fastread import image as image_mod
from fastread.image import ImageError

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("corrupt")
    root = d / "tree"
    rng = np.random.default_rng(3)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(5):
            (root / f"c{c}" / f"{j}.jpg").write_bytes(
                rng.integers(0, 256, int(rng.integers(1, 6000)), dtype=np.uint8).tobytes())
    img = str(d / "good.img")
    fastread.pack(str(root), img)
    return img


class Copy:
    """A fresh copy of the good image and index per example."""

    def __init__(self, good, where):
        self.img = os.path.join(where, "x.img")
        self.index = self.img + ".index"
        shutil.copyfile(good, self.img)
        shutil.copyfile(good + ".index", self.index)

    def flip(self, path, offset, bit):
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([b ^ (1 << bit)]))

    def truncate(self, path, size):
        os.truncate(path, size)


def _where(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ex"))


@settings(max_examples=120, **SETTINGS)
@given(data=st.data())
def test_flip_in_image_header_fails_opening(packed, tmp_path_factory, data):
    c = Copy(packed, _where(tmp_path_factory))
    covered = image_mod._HEADER.size + image_mod._HEADER_CRC.size
    off = data.draw(st.integers(0, covered - 1))
    c.flip(c.img, off, data.draw(st.integers(0, 7)))
    with pytest.raises(ImageError) as e:
        fastread.PackedImage(c.img)
    assert c.img in str(e.value)


@settings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_flip_in_index_fails_opening(packed, tmp_path_factory, data):
    c = Copy(packed, _where(tmp_path_factory))
    off = data.draw(st.integers(0, os.path.getsize(c.index) - 1))
    c.flip(c.index, off, data.draw(st.integers(0, 7)))
    with pytest.raises(ImageError) as e:
        fastread.PackedImage(c.img)
    assert c.index in str(e.value)


@settings(max_examples=80, **SETTINGS)
@given(data=st.data())
def test_flip_in_a_sample_is_found_by_verify(packed, tmp_path_factory, data):
    c = Copy(packed, _where(tmp_path_factory))
    img = fastread.PackedImage(c.img)
    i = data.draw(st.integers(0, len(img) - 1))
    off = int(img.offsets[i]) + data.draw(st.integers(0, int(img.lengths[i]) - 1))
    c.flip(c.img, off, data.draw(st.integers(0, 7)))
    img = fastread.PackedImage(c.img)  # opening reads no sample bytes: it succeeds
    bad = fastread.verify(img)
    assert [name for name, _ in bad] == [img.names[i]]
    assert "checksum mismatch" in bad[0][1]


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_truncated_image_or_index_is_a_clear_error(packed, tmp_path_factory, data):
    c = Copy(packed, _where(tmp_path_factory))
    which = data.draw(st.sampled_from(["img", "index"]))
    path = c.img if which == "img" else c.index
    c.truncate(path, data.draw(st.integers(0, os.path.getsize(path) - 1)))
    with pytest.raises(ImageError) as e:
        fastread.PackedImage(c.img)
    assert path in str(e.value)
    assert ("truncated" in str(e.value)) if which == "img" else ("corrupt" in str(e.value))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) |
                    st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=8)


@settings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_index_with_valid_crc_but_malformed_fields(packed, tmp_path_factory, data):
    """A crafted index (CRC recomputed) with any field replaced: opening
    raises ImageError naming the index, or the image opens consistently."""
    c = Copy(packed, _where(tmp_path_factory))
    with open(c.index, "rb") as f:
        raw = f.read()
    doc = json.loads(raw[raw.index(b"\n") + 1:])
    key = data.draw(st.sampled_from(sorted(doc)))
    if isinstance(doc[key], list) and doc[key] and data.draw(st.booleans()):
        doc[key][data.draw(st.integers(0, len(doc[key]) - 1))] = data.draw(JSON)
    else:
        doc[key] = data.draw(JSON)
    with open(c.index, "wb") as f:
        f.write(image_mod._encode_index(doc))
    try:
        img = fastread.PackedImage(c.img)
    except ImageError as e:
        assert c.index in str(e) or c.img in str(e)
        return
    # It opened: the fields it kept must describe readable samples.
    assert len(img) == len(img.offsets) == len(img.lengths) == len(img.labels)
    for name, why in fastread.verify(img):
        assert isinstance(why, str)


def test_index_nested_too_deep_names_the_index(packed, tmp_path):
    """Issue 43: a body nested 200,000 levels deep (CRC fixed up) raised a
    bare RecursionError from json.loads."""
    c = Copy(packed, str(tmp_path))
    deep = b"[" * 200_000 + b"]" * 200_000
    head = f"{image_mod.INDEX_MAGIC} 1 {len(deep)} {zlib.crc32(deep):08x}\n".encode()
    with open(c.index, "wb") as f:
        f.write(head + deep)
    with pytest.raises(ImageError, match="nested too deep") as e:
        fastread.PackedImage(c.img)
    assert c.index in str(e.value)
    bmap = tmp_path / "deep.json"
    bmap.write_bytes(b'{"a": ' + deep + b"}")
    with pytest.raises(ValueError, match="nested too deep") as e:
        fastread.load_bmap(str(bmap))
    assert str(bmap) in str(e.value)


BMAP_OK = {"a.jpg": {"startblock": 10, "endblock": 12, "size": 9000, "lba_size": 4096,
                     "extents": [{"logical": 0, "physical": 40960, "length": 12288,
                                  "flags": []}]},
           "b.jpg": {"startblock": "20", "endblock": "0x15"}}


def test_bmap_good_loads(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(json.dumps(BMAP_OK))
    m = fastread.load_bmap(str(p))
    assert m["b.jpg"]["endblock"] == 21 and m["a.jpg"]["extents"][0]["length"] == 12288


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["a.jpg"].update(startblock="x"), "startblock"),
    (lambda d: d["a.jpg"].update(endblock=None), "endblock"),
    (lambda d: d["a.jpg"].update(startblock=-1), "startblock"),
    (lambda d: d["a.jpg"].update(size=[1]), "size"),
    (lambda d: d["a.jpg"].update(lba_size=1.5), "lba_size"),
    (lambda d: d["a.jpg"].update(extents=5), "extents"),
    (lambda d: d["a.jpg"]["extents"].append({"logical": 0}), "extent"),
    (lambda d: d["a.jpg"]["extents"][0].update(length="big"), "extent length"),
    (lambda d: d["a.jpg"]["extents"][0].update(flags=5), "flags"),
    (lambda d: d["a.jpg"].pop("startblock"), "startblock"),
    (lambda d: d.update({"c.jpg": 7}), "startblock"),
])
def test_bmap_malformed_names_the_field(tmp_path, mutate, field):
    doc = json.loads(json.dumps(BMAP_OK))
    mutate(doc)
    p = tmp_path / "b.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as e:
        fastread.load_bmap(str(p))
    assert field in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize("content", [b"", b"[1, 2]", b"\xff\xfe\x00garbage", b"{\"a\": ", b"null"])
def test_bmap_not_a_bmap(tmp_path, content):
    p = tmp_path / "b.json"
    p.write_bytes(content)
    with pytest.raises(ValueError) as e:
        fastread.load_bmap(str(p))
    assert str(p) in str(e.value)


@settings(max_examples=200, **SETTINGS)
@given(doc=st.dictionaries(st.text(max_size=5), JSON, max_size=3) |
       st.dictionaries(st.text(max_size=5),
                       st.fixed_dictionaries({"startblock": JSON, "endblock": JSON},
                                             optional={"size": JSON, "lba_size": JSON,
                                                       "extents": JSON}), max_size=3))
def test_bmap_fuzz_loads_or_raises_value_error(tmp_path_factory, doc):
    p = os.path.join(_where(tmp_path_factory), "b.json")
    with open(p, "w") as f:
        json.dump(doc, f)
    try:
        out = fastread.load_bmap(p)
    except ValueError as e:
        assert p in str(e)
        return
    for v in out.values():
        assert isinstance(v["startblock"], int) and isinstance(v["endblock"], int)


NAME = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
               min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))


@settings(max_examples=60, **SETTINGS)
@given(names=st.lists(NAME, min_size=1, max_size=6, unique=True),
       exts=st.lists(st.sampled_from([".jpg", ".JPG", ".png", ".txt", ""]), min_size=6,
                     max_size=6))
def test_scan_fuzz_matches_the_listing(tmp_path_factory, names, exts):
    """scan() of a tree with arbitrary file names finds exactly the files whose
    names match the (case-insensitive) default filters, sorted per class."""
    root = _where(tmp_path_factory)
    os.mkdir(os.path.join(root, "c0"))
    made = []
    for n, e in zip(names, exts):
        p = os.path.join(root, "c0", n + e)
        if os.path.exists(p):
            continue
        with open(p, "wb") as f:
            f.write(b"x")
        made.append(p)
    want = sorted(p for p in made if p.lower().endswith((".jpg", ".png")))
    if not want:
        with pytest.raises(ValueError, match="No files found"):
            fastread.scan(root)
        return
    paths, labels = fastread.scan(root)
    assert sorted(paths) == want and set(labels.tolist()) == {0}
    got = fastread.read_files(paths)
    assert all(a.tobytes() == b"x" for a in got)


@settings(max_examples=150, **SETTINGS)
@given(st.one_of(st.text(max_size=40), st.lists(st.tuples(st.text(max_size=8), JSON),
                                                 max_size=3)))
def test_engine_option_strings_fuzz(spec):
    """EngineOptions from arbitrary names/values or engine_args strings: a
    valid object or ValueError/TypeError naming what is wrong, nothing else."""
    from fastread.engine import EngineOptions
    try:
        if isinstance(spec, str):
            opts = EngineOptions(engine_args=spec)
            fastread.read_files([], engine="psync", options=opts)
        else:
            EngineOptions.coerce(dict(spec))
    except (ValueError, TypeError) as e:
        assert str(e)
