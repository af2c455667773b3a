"""A packed image's index header is read only in the form pack writes: a
flipped case bit in the CRC's hex ('a' -> 'A') or a sign before a number
parses to the same values with int(), so without this check such damage
opened as valid (found by test_corruption's fuzzing, 1 example in ~150)."""
import os

import pytest

import fastread
from fastread.image import ImageError


@pytest.fixture()
def image(tmp_path):
    (tmp_path / "t" / "c").mkdir(parents=True)
    (tmp_path / "t" / "c" / "a.jpg").write_bytes(b"x" * 100)
    img = str(tmp_path / "i.img")
    fastread.pack(str(tmp_path / "t"), img)
    return img, img + ".index"


def rewrite_header(index, change):
    raw = open(index, "rb").read()
    nl = raw.index(b"\n")
    parts = raw[:nl].split(b" ")
    change(parts)
    open(index, "wb").write(b" ".join(parts) + raw[nl:])


@pytest.mark.parametrize("change", [
    lambda p: p.__setitem__(3, p[3].upper() if p[3] != p[3].upper() else b"+" + p[3][1:]),
    lambda p: p.__setitem__(2, b"+" + p[2]),
    lambda p: p.__setitem__(1, b"01"),
], ids=["crc-case", "length-sign", "version-zero"])
def test_header_in_another_spelling_is_corrupt(image, change):
    img, index = image
    fastread.PackedImage(img)  # the untouched image opens
    rewrite_header(index, change)
    with pytest.raises(ImageError, match="bad header line") as e:
        fastread.PackedImage(img)
    assert index in str(e.value)


def _bytes_read():
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])


def test_index_is_read_only_as_far_as_its_header_says(image, tmp_path):
    """A local index was read whole before its header line was checked:
    /dev/zero as the index took all memory, the image as its own index read
    the whole image. Now the header line comes first, a file whose size is
    not header + announced body is refused without reading the rest, and a
    non-regular file is refused unread."""
    img, index = image
    raw = open(index, "rb").read()
    nl = raw.index(b"\n")
    big = tmp_path / "big.index"
    with open(big, "wb") as f:  # the right header line, then 64 MiB of (sparse) more
        f.write(raw)
        f.truncate(64 << 20)
    before = _bytes_read()
    with pytest.raises(ImageError, match="truncated or appended to") as e:
        fastread.PackedImage(img, index=str(big))
    assert _bytes_read() - before < (1 << 20)
    assert str(big) in str(e.value)
    for bad in (raw + b"x", raw[:-1], raw[:nl + 1]):
        p = tmp_path / "bad.index"
        p.write_bytes(bad)
        with pytest.raises(ImageError, match="truncated or appended to") as e:
            fastread.PackedImage(img, index=str(p))
        assert str(p) in str(e.value)
    for other in ("/dev/zero", str(tmp_path)):
        with pytest.raises(ImageError, match="not a regular file") as e:
            fastread.PackedImage(img, index=other)
        assert other in str(e.value)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match="not a regular file"):
        fastread.PackedImage(img, index=str(fifo))  # without waiting for a writer
    with pytest.raises(ImageError, match="bad header line"):
        fastread.PackedImage(img, index=img)   # the image as its index: not read whole
    fastread.PackedImage(img, index=index)


def _rewritten(index, dst, change):
    import json

    from fastread.image import _encode_index
    raw = open(index, "rb").read()
    doc = json.loads(raw[raw.index(b"\n") + 1:])
    change(doc)
    open(dst, "wb").write(_encode_index(doc))
    return str(dst)


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(alignment=2**62, count=0, names=[], labels=[], offsets=[], lengths=[],
                        checksums=[], image_size=0), "alignment must be a power of two"),
    (lambda d: d.update(alignment=3 * 4096), "alignment must be a power of two"),
    # 2**30 * 2**30 * 16 bytes wraps to 0 in int64: the shape matched length 0.
    (lambda d: d.update(version=2, encoding="raw", dtype="uint8",
                        shapes=[[2**30, 2**30, 2**4]] * len(d["lengths"]),
                        lengths=[0] * len(d["lengths"])), "needs another number"),
    (lambda d: d.update(version=2, encoding="raw", dtype="uint16",
                        shapes=[[2**31 - 1, 2**31 - 1, 2**31 - 1]] * len(d["lengths"]),
                        lengths=[2] * len(d["lengths"])), "needs another number"),
], ids=["huge-alignment", "alignment-not-power-of-two", "shape-wraps-int64", "shape-huge"])
def test_crafted_index_values_are_refused(image, tmp_path, change, match):
    img, index = image
    bad = _rewritten(index, tmp_path / "bad.index", change)
    with pytest.raises(ImageError, match=match) as e:
        fastread.PackedImage(img, index=bad)
    assert bad in str(e.value)


def test_alignment_bound_on_pack(tmp_path):
    from fastread.image import MAX_ALIGNMENT
    with pytest.raises(ValueError, match="power of two"):
        fastread.pack(str(tmp_path), str(tmp_path / "x.img"), alignment=MAX_ALIGNMENT * 2)


def test_bytes_paths(image):
    """PackedImage(b"/path") raised TypeError (bytes + ".index")."""
    img, index = image
    a = fastread.PackedImage(os.fsencode(img))
    assert (a.path, a.index_path, len(a)) == (img, index, 1)
    b = fastread.PackedImage(os.fsencode(img), index=os.fsencode(index))
    assert b.index_path == index
    from fastread.image import index_path
    assert index_path(os.fsencode(img)) == index
