"""Decoded packs (``fastread pack --decode``, issue 33): pixels, shapes,
labels and order, bad inputs, atomicity, integrity, and the index versions.

Pixel tolerance: the pack runs :func:`fastread.decode.preprocess_file`; its
output is compared exactly with that function (the same code path) and with
a reference written here from plain Pillow calls (open, EXIF orientation, RGB, resize to
torchvision's ``Resize(S)`` size with the antialiased bilinear filter,
center crop as torchvision's ``CenterCrop``), which must also match exactly:
the same library on the same decoded pixels. Re-encoded JPEG is compared
with the raw pixels within a mean absolute error of 3 levels at quality 90.
"""
import json
import os
import zlib

import numpy as np
import pytest
from PIL import Image

import fastread
from conftest import assert_pack_interrupts_cleanly, corrupt_class_tree
from fastread.cli import main as cli_main
from fastread.datasets import make_imagenet_like
from fastread.decode import Preprocess, preprocess_file
from fastread.image import ImageError


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """3 classes of small JPEGs of varying sizes, plus a grayscale PNG and an
    RGBA PNG (converted to RGB), so shapes and modes vary."""
    root = tmp_path_factory.mktemp("decoded") / "train"
    make_imagenet_like(root, classes=3, per_class=5, width=96, height=72, mean_kb=4,
                       workers=1, progress=False)
    cls = sorted(d for d in os.listdir(root) if os.path.isdir(root / d))
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (50, 40), dtype=np.uint8), "L").save(
        root / cls[0] / "gray.png")
    Image.fromarray(rng.integers(0, 256, (30, 70, 4), dtype=np.uint8), "RGBA").save(
        root / cls[1] / "rgba.png")
    return str(root)


def reference(path, resize=None, crop=None):
    """Plain Pillow: torchvision's Resize(resize) + CenterCrop(crop) on a PIL image."""
    from PIL import ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
    w, h = im.size
    if resize is not None:
        if w <= h:
            size = (resize, int(resize * h / w))
        else:
            size = (int(resize * w / h), resize)
        im = im.resize(size, Image.BILINEAR)
    if crop is not None:
        w, h = im.size
        top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
        im = im.crop((left, top, left + crop, top + crop))
    return np.asarray(im)


def stored(img):
    arrays = img.read(np.arange(len(img)))
    return [img.pixels(a, i) for i, a in enumerate(arrays)]


@pytest.fixture(scope="module")
def cropped(tree, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("packs") / "crop.img")
    return fastread.pack(tree, out, decode=True, resize=40, crop=32, decode_workers=2,
                         progress=False)


@pytest.fixture(scope="module")
def varied(tree, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("packs") / "var.img")
    return fastread.pack(tree, out, decode=True, resize=40, decode_workers=0, progress=False)


def test_pixels_match_pillow_reference_and_the_pack_code_path(tree, cropped):
    root = cropped.file_root
    assert len(cropped) == 17 and cropped.encoding == "raw" and cropped.dtype == np.uint8
    pre = Preprocess(resize=40, crop=32)
    for i, a in enumerate(stored(cropped)):
        path = os.path.join(root, cropped.names[i])
        assert a.shape == (32, 32, 3)
        data, shape = preprocess_file(path, pre)
        assert shape == (32, 32, 3) and a.tobytes() == data
        np.testing.assert_array_equal(a, reference(path, resize=40, crop=32))


def test_index_records_dtype_and_varying_shapes_without_crop(tree, varied):
    assert varied.sample_shape is None   # shapes differ without --crop
    assert varied.version == 2 and varied.preprocess["resize"] == 40
    shapes = {tuple(s) for s in varied.shapes.tolist()}
    assert len(shapes) > 1
    for i, a in enumerate(stored(varied)):
        assert a.shape == tuple(varied.shapes[i]) and a.dtype == np.uint8
        assert min(a.shape[:2]) == 40 and a.shape[2] == 3
        np.testing.assert_array_equal(
            a, reference(os.path.join(tree, varied.names[i]), resize=40))
    doc = json.loads(open(varied.index_path, "rb").read().split(b"\n", 1)[1])
    assert doc["dtype"] == "uint8" and doc["encoding"] == "raw"
    assert doc["shapes"] == varied.shapes.tolist()


def test_max_side_shrinks_only_large_images(tree, tmp_path):
    img = fastread.pack(tree, str(tmp_path / "m.img"), decode=True, max_side=64,
                        decode_workers=0, progress=False)
    for i, name in enumerate(img.names):
        with Image.open(os.path.join(tree, name)) as src:
            w, h = src.size
        got_h, got_w, _ = img.shapes[i]
        if max(w, h) <= 64:
            assert (got_w, got_h) == (w, h)     # never enlarged
        else:
            assert max(got_w, got_h) == 64
            assert abs(got_w / got_h - w / h) < 0.05


def test_labels_and_order_equal_the_jpeg_pack(tree, cropped, tmp_path):
    plain = fastread.pack(tree, str(tmp_path / "plain.img"), progress=False)
    assert plain.version == 1 and not plain.decoded and plain.shapes is None
    assert cropped.names == plain.names
    np.testing.assert_array_equal(cropped.labels, plain.labels)


def jpeg_error(tree, raw, tmp_path, quality):
    """Mean absolute error over the set of a JPEG pack at ``quality`` against
    the raw pixels ``raw`` (the same preprocessing)."""
    import io

    img = fastread.pack(tree, str(tmp_path / f"q{quality}.img"), decode=True, resize=40,
                        crop=32, encode="jpeg", quality=quality, decode_workers=0,
                        progress=False)
    assert img.encoding == "jpeg" and img.preprocess["quality"] == quality
    errors = []
    for i, data in enumerate(img.read(np.arange(len(img)))):
        px = np.asarray(Image.open(io.BytesIO(data.tobytes())).convert("RGB"))
        assert px.shape == tuple(img.shapes[i]) == raw[i].shape
        errors.append(np.abs(px.astype(int) - raw[i]).mean())
    with pytest.raises(ValueError, match="not raw"):
        img.pixels(data, 0)
    return float(np.mean(errors))


def test_jpeg_encoding_loses_what_its_quality_says(tree, cropped, tmp_path):
    """Re-encoding costs pixels (Pillow's JPEG, 4:2:0 chroma as FFCV's
    OpenCV default): on these noise-textured synthetic images q90 is within
    8 levels on average (measured 5.7), q100 closer, q50 further."""
    raw = stored(cropped)
    e50, e90, e100 = (jpeg_error(tree, raw, tmp_path, q) for q in (50, 90, 100))
    assert e100 < e90 < e50 and e90 < 8


def test_corrupt_input_fails_naming_the_file_and_leaves_no_image(tree, tmp_path):
    root = str(tmp_path / "bad")
    victim, _junk = corrupt_class_tree(tree, root)
    out = tmp_path / "out" / "bad.img"
    out.parent.mkdir()
    with pytest.raises(ImageError, match="cannot decode") as e:
        fastread.pack(root, str(out), decode=True, resize=40, decode_workers=2,
                      progress=False)
    assert os.path.join(root, victim) in str(e.value) and "--skip-bad" in str(e.value)
    assert os.listdir(out.parent) == []    # no image, no index, no temporary file


def test_skip_bad_leaves_out_and_lists_bad_files(tree, tmp_path, capsys):
    root = str(tmp_path / "bad")
    victim, junk = corrupt_class_tree(tree, root)
    out = str(tmp_path / "skip.img")
    assert cli_main(["pack", root, out, "--decode", "--resize", "40", "--crop", "32",
                     "--skip-bad", "--quiet", "--decode-workers", "2"]) == 0
    printed = capsys.readouterr()
    assert f"SKIPPED {victim}:" in printed.out and f"SKIPPED {junk}:" in printed.out
    img = fastread.PackedImage(out)
    assert [name for name, _ in img.skipped] == [victim, junk]
    plain = fastread.pack(root, str(tmp_path / "plain.img"), progress=False)
    keep = [i for i, n in enumerate(plain.names) if n not in (victim, junk)]
    assert img.names == [plain.names[i] for i in keep]
    np.testing.assert_array_equal(img.labels, plain.labels[keep])
    assert fastread.verify(img) == []


def test_deep_greyscale_is_scaled_not_clipped(tmp_path):
    """16-bit greyscale (a depth map, a scan) is stored as round(v / 257),
    as DALI's decoder gives (Pillow's convert("RGB") clipped it at 255:
    almost all white); a float image has no 8-bit meaning and is named."""
    root = tmp_path / "deep"
    (root / "a").mkdir(parents=True)
    ramp = np.tile(np.arange(0, 65536, 256, dtype=np.uint16), (8, 1))   # 8 x 256
    Image.fromarray(ramp).save(root / "a" / "depth16.png")
    Image.fromarray(np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8), "F").save(
        root / "a" / "float.tiff")
    img = fastread.pack(str(root), str(tmp_path / "d.img"), decode=True, skip_bad=True,
                        decode_workers=0, progress=False)
    assert img.names == ["a/depth16.png"]
    (px,) = stored(img)
    want = np.rint(ramp / 257.0).astype(np.uint8)
    for c in range(3):
        np.testing.assert_array_equal(px[:, :, c], want)
    assert [n for n, _ in img.skipped] == ["a/float.tiff"]
    assert "mode F pixels" in img.skipped[0][1]


def test_verify_passes_and_finds_a_flipped_byte(cropped, tmp_path):
    import shutil

    out = str(tmp_path / "c.img")
    shutil.copy(cropped.path, out)
    shutil.copy(cropped.index_path, out + ".index")
    assert fastread.verify(out) == []
    img = fastread.PackedImage(out)
    with open(out, "r+b") as f:
        pos = int(img.offsets[3]) + 100
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))
    bad = fastread.verify(out)
    assert [name for name, _ in bad] == [img.names[3]] and "checksum" in bad[0][1]
    assert cli_main(["verify", out, "--quiet"]) == 1


def rewrite_index(path, change):
    raw = open(path, "rb").read()
    head, body = raw.split(b"\n", 1)
    doc = json.loads(body)
    change(doc)
    body = json.dumps(doc).encode()
    parts = head.split(b" ")
    open(path, "wb").write(b" ".join([parts[0], str(doc["version"]).encode(),
                                      str(len(body)).encode(),
                                      f"{zlib.crc32(body):08x}".encode()]) + b"\n" + body)


def test_index_versions(cropped, tmp_path):
    import shutil

    out = str(tmp_path / "v.img")
    shutil.copy(cropped.path, out)
    shutil.copy(cropped.index_path, out + ".index")
    assert open(out + ".index", "rb").read().startswith(b"FASTREAD-INDEX 2 ")
    # A version this fastread does not know (3, the binary index, now it does).
    rewrite_index(out + ".index", lambda d: d.update(version=4))
    with pytest.raises(ImageError, match="format version 4; this fastread reads versions 1, 2, 3"):
        fastread.PackedImage(out)
    # Pixels in a version 1 index: refused (an old fastread would serve them as files).
    rewrite_index(out + ".index", lambda d: d.update(version=1))
    with pytest.raises(ImageError, match="encoding 'raw' in a version 1 index"):
        fastread.PackedImage(out)
    rewrite_index(out + ".index", lambda d: d.update(version=2, shapes=d["shapes"][:-1]))
    with pytest.raises(ImageError, match="one \\[H, W, C\\]"):
        fastread.PackedImage(out)
    shutil.copy(cropped.index_path, out + ".index")
    rewrite_index(out + ".index", lambda d: d["shapes"].__setitem__(0, [32, 31, 3]))
    with pytest.raises(ImageError, match="needs another number"):
        fastread.PackedImage(out)


def test_old_version_1_index_still_reads(tree, tmp_path):
    """A plain pack's index is version 1, byte for byte the old format: no
    field of version 2 in it, and it opens as the files' bytes."""
    img = fastread.pack(tree, str(tmp_path / "p.img"), progress=False)
    raw = open(img.index_path, "rb").read()
    assert raw.startswith(b"FASTREAD-INDEX 1 ")
    doc = json.loads(raw.split(b"\n", 1)[1])
    assert not {"encoding", "dtype", "shapes", "preprocess", "skipped"} & set(doc)
    again = fastread.PackedImage(img.path)
    assert again.encoding == "file" and again.sample_shape is None
    first = again.read([0])[0].tobytes()
    assert first == open(os.path.join(tree, again.names[0]), "rb").read()


@pytest.mark.parametrize("kwargs, match", [
    (dict(resize=32, max_side=64), "exclude each other"),
    (dict(crop=32), "needs resize >= crop"),
    (dict(resize=16, crop=32), "needs resize >= crop"),
    (dict(resize=32, encode="png"), "encode must be"),
    (dict(resize=32, encode="jpeg", quality=101), "quality"),
    (dict(resize=0), "resize must be a positive integer"),
])
def test_bad_preprocess_options(tree, tmp_path, kwargs, match):
    out = tmp_path / "x.img"
    with pytest.raises(ValueError, match=match):
        fastread.pack(tree, str(out), decode=True, **kwargs)
    assert not out.exists()


def test_decode_options_need_decode(tree, tmp_path, capsys):
    with pytest.raises(ValueError, match="apply only with decode=True"):
        fastread.pack(tree, str(tmp_path / "x.img"), resize=32)
    with pytest.raises(SystemExit) as e:
        cli_main(["pack", tree, str(tmp_path / "x.img"), "--resize", "32"])
    assert e.value.code == 2 and "apply only with --decode" in capsys.readouterr().err
    assert not (tmp_path / "x.img").exists()


def test_exif_orientation_is_applied(tmp_path):
    """A JPEG tagged 'rotate 90' (EXIF orientation 6) is stored upright, as
    DALI's decoders show it (adjust_orientation=True by default)."""
    (tmp_path / "t" / "c").mkdir(parents=True)
    rng = np.random.default_rng(2)
    px = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(px).save(tmp_path / "t" / "c" / "r.jpg", quality=95, exif=exif)
    img = fastread.pack(str(tmp_path / "t"), str(tmp_path / "o.img"), decode=True,
                        decode_workers=0, progress=False)
    assert tuple(img.shapes[0]) == (60, 40, 3)   # width and height swapped
    with Image.open(tmp_path / "t" / "c" / "r.jpg") as im:
        want = np.asarray(im.convert("RGB").transpose(Image.ROTATE_270))
    np.testing.assert_array_equal(img.pixels(img.read([0])[0], 0), want)


class _Probe(list):
    """A list of paths that records how far into it slices have reached."""
    reached = 0

    def __getitem__(self, key):
        if isinstance(key, slice):
            _Probe.reached = max(_Probe.reached, min(key.stop, len(self)))
            return list(super().__getitem__(key))
        return super().__getitem__(key)


@pytest.mark.parametrize("workers", [0, 2])
def test_decoding_streams_a_bounded_window(tree, workers):
    """Memory stays bounded: while the first chunk is consumed, at most
    2 * workers chunks (one with workers=0) have been handed to the pool."""
    from fastread.decode import decoded_batches

    paths = _Probe(fastread.scan(tree)[0])
    _Probe.reached = 0
    gen = decoded_batches(paths, Preprocess(resize=16), workers=workers, chunk=2)
    first = next(gen)
    assert len(first) == 2 and all(why is None for _, _, why in first)
    assert _Probe.reached <= 2 * max(2 * workers, 1) < len(paths)
    rest = [item for chunk in gen for item in chunk]
    assert len(first) + len(rest) == len(paths)


PACK_SCRIPT = """\
import sys, threading, time
import fastread
from fastread.datasets._shared import make_pool

threading.Thread(target=time.sleep, args=(30,), daemon=True).start()   # not single-threaded
{body}
"""
PACK_BODY = """\
with make_pool(2) as pool:
    print("pool", type(pool).__name__)
img = fastread.pack(sys.argv[1], sys.argv[2], decode=True, resize=40, crop=32,
                    decode_workers=2, progress=False)
print("packed", len(img))
"""


@pytest.mark.parametrize("guard, pool", [("none", "ThreadPoolExecutor"),
                                         ("around", "ProcessPoolExecutor"),
                                         ("below", "ThreadPoolExecutor")])
def test_scripts_with_threads_pack_with_or_without_a_main_guard(tree, cropped, tmp_path,
                                                                 guard, pool):
    """A script that runs other threads gets workers that cannot hang on a
    lock held at fork: a forkserver's processes where its workers would not
    run the call again (inside a main guard), else threads (a forkserver's
    workers ran the pack again, and the pool broke): no guard, or one
    further down that does not hold the call."""
    import subprocess
    import sys
    import textwrap

    body = {"none": PACK_BODY,
            "around": "if __name__ == \"__main__\":\n" + textwrap.indent(PACK_BODY, "    "),
            "below": PACK_BODY + "\nif __name__ == \"__main__\":\n    print(\"done\")\n"}[guard]
    script = tmp_path / "pack_script.py"
    script.write_text(PACK_SCRIPT.format(body=body))
    out = tmp_path / "s.img"
    r = subprocess.run([sys.executable, str(script), tree, str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"pool {pool}" in r.stdout and f"packed {len(cropped)}" in r.stdout
    got = fastread.PackedImage(str(out))
    assert got.names == cropped.names
    for a, b in zip(stored(got), stored(cropped)):
        np.testing.assert_array_equal(a, b)


def test_interrupted_pack_leaves_nothing(tree, tmp_path):
    """SIGINT while the decoding pool works: KeyboardInterrupt, the pool's
    processes gone, no image, index or temporary file left. The child comes
    from conftest.interruptible_child: run from a background job (`nohup
    bash scripts/test.sh &`) a plain child started with SIGINT ignored and
    slept through it."""
    out = tmp_path / "out"
    out.mkdir()
    assert_pack_interrupts_cleanly(tree, out, "decode_workers=2")


@pytest.mark.parametrize("change", [
    lambda d: d.update(skipped=[1, 2]),
    lambda d: d.update(skipped=[["a"]]),
    lambda d: d.update(preprocess=[]),
    lambda d: d.update(dtype="object"),
    lambda d: d.update(dtype=[1]),
    lambda d: d.update(dtype="no such type"),
    lambda d: d.update(encoding=7),
    lambda d: d.update(encoding="png"),
    lambda d: d.update(shapes=[[0, 1, 3]] * len(d["shapes"])),
    lambda d: d.pop("shapes"),
], ids=["skipped-ints", "skipped-short", "preprocess-list", "dtype-object", "dtype-list",
        "dtype-unknown", "encoding-int", "encoding-unknown", "shape-zero", "no-shapes"])
def test_malformed_version_2_fields_are_named(cropped, tmp_path, change):
    import shutil

    out = str(tmp_path / "m.img")
    shutil.copy(cropped.path, out)
    shutil.copy(cropped.index_path, out + ".index")
    rewrite_index(out + ".index", change)
    with pytest.raises(ImageError) as e:
        fastread.PackedImage(out)
    assert out + ".index" in str(e.value)
