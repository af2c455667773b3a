"""A packed image's index header is read only in the form pack writes: a
flipped case bit in the CRC's hex ('a' -> 'A') or a sign before a number
parses to the same values with int(), so without this check such damage
opened as valid (found by test_corruption's fuzzing, 1 example in ~150)."""
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
