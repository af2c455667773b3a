"""Decoded packs with DALI's decoder (``pack(decode=True, decoder="dali")``,
``--decoder dali``; issue 33): the same samples, order, labels, shapes and
index as the Pillow path, pixels within a tolerance of it, bad files named
or skipped per sample, and the choice of decoder refused where it cannot
run.

Tolerance (DALI against Pillow, uint8): the two resamplers differ. Both are
antialiased linear filters with pixel-centre alignment, but they weigh and
round differently (DALI computes in float, Pillow in fixed point with 8-bit
rounding between the horizontal and the vertical pass) and handle the
image borders differently. The JPEG decoding itself agrees: at the
source size (no resize) the two packs were identical here (both
libjpeg-turbo, islow IDCT, fancy upsampling). Measured on these
noise-textured synthetic images (every pixel an edge): mean absolute
difference per image at most 0.27 levels; the worst single value 8 levels,
in downscaling, always within 2 pixels of an image's edge; away from that
frame never more than 1 level (rounding). On 2,000 ImageNet-like JPEGs of
the bench tree (bench/decoded/pack_decoders.py): mean 0.135, worst image
0.17, largest 14 (on 100 of them: every difference above 4 in the frame,
1 at most inside). Bounds here: mean <= 1.0 per image, max <= 32, and
<= 2 inside the frame. A wrong orientation, crop anchor, colour conversion
or filter family breaks them by far (checked below: a crop one pixel off
alone gives a mean above 5 on every image). On the GPU (nvJPEG's IDCT and
chroma upsampling, GPU resize) the bounds are wider (mean <= 2.0, max <=
48, no bound inside the frame) and unmeasured: those tests have not run on
a GPU yet.
"""
import io
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("nvidia.dali", reason="DALI is not installed")

import fastread  # noqa: E402
from fastread.cli import main as cli_main  # noqa: E402
from fastread.datasets import make_imagenet_like  # noqa: E402
from fastread.decode import (  # noqa: E402
    Preprocess, _dali_gpus, choose_decoder, preprocess_file)
from fastread.decode_dali import IN_FLIGHT, DaliDecoder, upright_size  # noqa: E402
from fastread.image import ImageError  # noqa: E402
from conftest import assert_pack_interrupts_cleanly, corrupt_class_tree  # noqa: E402

MEAN_CPU, MAX_CPU, INNER_CPU = 1.0, 32, 2
MEAN_GPU, MAX_GPU = 2.0, 48

_gpus = _dali_gpus()
needs_gpu = pytest.mark.skipif(not _gpus[1], reason=f"no CUDA GPU for DALI: {_gpus[2]}")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """4 classes of small JPEGs of varying sizes plus, in the first classes,
    a grey PNG, an RGBA PNG, a palette PNG, a CMYK JPEG and an EXIF-rotated
    JPEG, so modes and orientations vary."""
    root = tmp_path_factory.mktemp("dali") / "train"
    make_imagenet_like(root, classes=4, per_class=6, width=96, height=72, mean_kb=4,
                       workers=1, progress=False)
    cls = classes(root)
    rng = np.random.default_rng(0)
    px = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    Image.fromarray(px[..., 0], "L").save(root / cls[0] / "gray.png")
    Image.fromarray(np.dstack([px, px[..., :1]]), "RGBA").save(root / cls[1] / "rgba.png")
    Image.fromarray(px).convert("P").save(root / cls[1] / "pal.png")
    Image.fromarray(px).convert("CMYK").save(root / cls[2] / "cmyk.jpg", quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6   # rotate 90: width and height swap
    Image.fromarray(px).save(root / cls[3] / "rot.jpg", quality=95, exif=exif)
    return str(root)


def classes(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def pack_both(tree, tmp_path, device="cpu", **kw):
    """The tree packed by Pillow and by DALI with the same options."""
    a = fastread.pack(tree, str(tmp_path / "pillow.img"), decode=True, decoder="pillow",
                      decode_workers=0, progress=False, **kw)
    b = fastread.pack(tree, str(tmp_path / "dali.img"), decode=True, decoder="dali",
                      decode_device=device, batch_size=5, decode_workers=2, progress=False,
                      **kw)
    return a, b


def pixels(img):
    return [img.pixels(a, i) for i, a in enumerate(img.read(np.arange(len(img))))]


def compare(a, b, mean_bound, max_bound, inner_bound=None):
    """Same names, labels, shapes; pixels within the bounds (``inner_bound``:
    the largest difference away from the 2-pixel frame of each image, where
    the resamplers' border handling does not reach). Returns the per-image
    means, the largest difference and the largest inside the frame."""
    assert b.names == a.names and len(b) == len(a) > 0
    np.testing.assert_array_equal(b.labels, a.labels)
    np.testing.assert_array_equal(b.shapes, a.shapes)
    means, worst, inner = [], 0, 0
    for i, (x, y) in enumerate(zip(pixels(a), pixels(b))):
        assert x.shape == y.shape == tuple(a.shapes[i])
        d = np.abs(x.astype(np.int16) - y.astype(np.int16))
        means.append(float(d.mean()))
        worst = max(worst, int(d.max()))
        if d.shape[0] > 4 and d.shape[1] > 4:
            inner = max(inner, int(d[2:-2, 2:-2].max()))
    assert max(means) <= mean_bound and worst <= max_bound, (max(means), worst, a.names)
    if inner_bound is not None:
        assert inner <= inner_bound, (inner, a.names)
    return means, worst, inner


@pytest.mark.parametrize("opts", [
    dict(resize=40, crop=32),      # downscale, crop
    dict(resize=40),               # downscale, shapes vary
    dict(resize=150, crop=140),    # upscale, crop
    dict(resize=150),              # upscale
    dict(max_side=64),             # shrinks the large, keeps the small
    dict(),                        # source size
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "source-size")
def test_pixels_and_shapes_match_the_pillow_path(tree, tmp_path, opts):
    a, b = pack_both(tree, tmp_path, **opts)
    compare(a, b, MEAN_CPU, MAX_CPU, INNER_CPU)
    assert b.preprocess["decoder"] == "dali-cpu" and a.preprocess["decoder"] == "pillow"
    assert {k: v for k, v in b.preprocess.items() if not k.startswith("decode")} == \
        {k: v for k, v in a.preprocess.items() if not k.startswith("decode")}
    assert b.preprocess["decoded_by_pillow"] == []   # every file here is DALI's to decode
    if "crop" in opts:
        assert b.sample_shape == (opts["crop"], opts["crop"], 3)
    assert fastread.verify(b) == []


def test_tolerance_catches_a_shifted_crop(tree, tmp_path):
    """The bound is tight enough to see a crop one pixel off."""
    a, _ = pack_both(tree, tmp_path, resize=40, crop=32)
    pre = Preprocess(resize=40)
    worst = []
    for i, x in enumerate(pixels(a)):
        with Image.open(os.path.join(tree, a.names[i])) as im:
            from PIL import ImageOps
            im = ImageOps.exif_transpose(im).convert("RGB")
            im = im.resize(pre.target_size(*im.size), Image.BILINEAR)
        w, h = im.size
        left, top = int(round((w - 32) / 2.0)) + 1, int(round((h - 32) / 2.0))
        y = np.asarray(im.crop((left, top, left + 32, top + 32)))
        worst.append(np.abs(x.astype(int) - y).mean())
    assert min(worst) > 5 * MEAN_CPU


def test_exif_rotated_jpeg_is_upright(tree, tmp_path):
    a, b = pack_both(tree, tmp_path, resize=40)
    i = b.names.index(next(n for n in b.names if n.endswith("rot.jpg")))
    assert tuple(b.shapes[i]) == (int(40 * 70 / 50), 40, 3)   # 70 wide, 50 high, turned
    with open(os.path.join(tree, b.names[i]), "rb") as f:
        assert upright_size(f.read()) == (50, 70)
    x, y = a.pixels(a.read([i])[0], i), b.pixels(b.read([i])[0], i)
    assert np.abs(x.astype(int) - y).mean() <= MEAN_CPU


def test_modes_become_rgb(tree, tmp_path):
    """Grey, RGBA (alpha dropped), palette and CMYK sources: three channels,
    as Pillow's convert("RGB") gives them."""
    a, b = pack_both(tree, tmp_path, resize=40, crop=32)
    for name in ("gray.png", "rgba.png", "pal.png", "cmyk.jpg"):
        i = next(j for j, n in enumerate(b.names) if n.endswith(name))
        x, y = a.pixels(a.read([i])[0], i), b.pixels(b.read([i])[0], i)
        assert y.shape == (32, 32, 3)
        assert np.abs(x.astype(int) - y).mean() <= MEAN_CPU, name
    gray = b.names.index(next(n for n in b.names if n.endswith("gray.png")))
    g = b.pixels(b.read([gray])[0], gray)
    assert (g[..., 0] == g[..., 1]).all() and (g[..., 1] == g[..., 2]).all()


def test_jpeg_encoding(tree, tmp_path):
    """--encode jpeg: the re-encoded DALI pixels decode to within the JPEG
    tolerance of the Pillow path's (q90 costs ~6 levels on these images)."""
    a, b = pack_both(tree, tmp_path, resize=40, crop=32, encode="jpeg", quality=90)
    assert b.encoding == "jpeg" and b.preprocess["quality"] == 90
    np.testing.assert_array_equal(b.shapes, a.shapes)
    for x, y in zip(a.read(np.arange(len(a))), b.read(np.arange(len(b)))):
        px = np.asarray(Image.open(io.BytesIO(x.tobytes())).convert("RGB")).astype(int)
        py = np.asarray(Image.open(io.BytesIO(y.tobytes())).convert("RGB")).astype(int)
        assert np.abs(px - py).mean() < 8
    assert fastread.verify(b) == []


def test_a_format_dali_lacks_is_decoded_by_pillow_and_listed(tree, tmp_path):
    """GIF: nvImageCodec has no decoder for it; Pillow decodes it instead
    (the same file set as the Pillow path) and the index lists it."""
    root = tmp_path / "t"
    shutil.copytree(tree, root)
    cls = classes(root)[0]
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).convert("P").save(
        root / cls / "anim.gif")
    a, b = pack_both(str(root), tmp_path, resize=40, crop=32,
                     file_filters=["*.jpg", "*.jpeg", "*.png", "*.gif"])
    assert b.preprocess["decoded_by_pillow"] == [os.path.join(cls, "anim.gif")]
    compare(a, b, MEAN_CPU, MAX_CPU, INNER_CPU)
    i = b.names.index(os.path.join(cls, "anim.gif"))
    assert a.pixels(a.read([i])[0], i).tobytes() == b.pixels(b.read([i])[0], i).tobytes()


def test_cli_says_which_files_pillow_decoded(tree, tmp_path, capsys):
    """A GIF named .png (scan's default filters take it; DALI knows images
    by their bytes and has no GIF decoder): decoded by Pillow, and the
    summary says so."""
    root = tmp_path / "t"
    shutil.copytree(tree, root)
    cls = classes(root)[2]
    Image.fromarray(np.full((20, 30, 3), 77, np.uint8)).convert("P").save(
        root / cls / "gif.png", format="GIF")
    out = str(tmp_path / "c.img")
    assert cli_main(["pack", str(root), out, "--decode", "--resize", "40", "--quiet",
                     "--decoder", "dali", "--decode-device", "cpu"]) == 0
    printed = capsys.readouterr().out
    name = os.path.join(cls, "gif.png")
    assert f"1 file(s) DALI could not decode were decoded by Pillow " \
           f"(index: preprocess['decoded_by_pillow']), e.g. {name}" in printed
    img = fastread.PackedImage(out)
    assert img.preprocess["decoded_by_pillow"] == [name]
    i = img.names.index(name)
    data, shape = preprocess_file(str(root / name), Preprocess(resize=40))
    assert img.pixels(img.read([i])[0], i).tobytes() == data and shape == (40, 60, 3)


def test_corrupt_file_fails_naming_it_and_leaves_nothing(tree, tmp_path):
    root = str(tmp_path / "bad")
    victim, _ = corrupt_class_tree(tree, root)
    out = tmp_path / "out" / "bad.img"
    out.parent.mkdir()
    with pytest.raises(ImageError, match="cannot decode") as e:
        fastread.pack(root, str(out), decode=True, decoder="dali", decode_device="cpu",
                      resize=40, batch_size=5, progress=False)
    assert os.path.join(root, victim) in str(e.value) and "--skip-bad" in str(e.value)
    assert os.listdir(out.parent) == []


def test_skip_bad_keeps_the_good_files_of_a_failed_batch(tree, tmp_path, capsys):
    root = str(tmp_path / "bad")
    victim, junk = corrupt_class_tree(tree, root)
    out = str(tmp_path / "skip.img")
    assert cli_main(["pack", root, out, "--decode", "--resize", "40", "--crop", "32",
                     "--skip-bad", "--quiet", "--decoder", "dali", "--decode-device", "cpu",
                     "--batch-size", "5"]) == 0
    printed = capsys.readouterr().out
    assert f"SKIPPED {victim}:" in printed and f"SKIPPED {junk}:" in printed
    assert "decoder: dali-cpu (asked for: decoder='dali', decode_device='cpu')" in printed
    img = fastread.PackedImage(out)
    assert [name for name, _ in img.skipped] == [victim, junk]
    # The same files, order, labels and verdicts as the Pillow path.
    ref = fastread.pack(root, str(tmp_path / "ref.img"), decode=True, decoder="pillow",
                        resize=40, crop=32, skip_bad=True, decode_workers=0, progress=False)
    assert [n for n, _ in ref.skipped] == [n for n, _ in img.skipped]
    assert [why for _, why in ref.skipped] == [why for _, why in img.skipped]
    compare(ref, img, MEAN_CPU, MAX_CPU, INNER_CPU)
    assert img.preprocess["decoded_by_pillow"] == []
    assert fastread.verify(img) == []
    assert cli_main(["verify", out, "--quiet"]) == 0


@pytest.mark.parametrize("batch_size", [7, 2], ids=["one-batch", "runs-behind-it"])
def test_failed_batch_runs_again_sample_by_sample(tree, monkeypatch, batch_size):
    """DALI fails the whole batch on one bad file and its pipeline is
    unusable after; the decoder builds it again and decodes the batch one
    sample at a time: the good samples come out as in a batch without the
    bad one (the same decoder: identical bytes). With small batches the
    runs scheduled behind the failed one (DEPTH at once) run again on the
    new pipeline, in order. The bad file is a truncated file let through
    the check that keeps truncated JPEGs from DALI (see
    test_truncated_jpegs_are_left_to_pillow)."""
    import fastread.decode_dali as dd

    monkeypatch.setattr(dd, "jpeg_is_truncated", lambda data: False)
    paths = fastread.scan(tree)[0][:6]
    pre = Preprocess(resize=40, crop=32)
    good = DaliDecoder(pre, batch_size=6, threads=2)
    clean = [item for chunk in good.batches(paths) for item in chunk]
    assert good.pipelines_built == 1 and all(why is None for _, _, why in clean)

    bad_dir = os.path.dirname(paths[0])
    junk = os.path.join(os.path.dirname(bad_dir), "junk-outside-the-tree.jpg")
    try:
        with open(paths[0], "rb") as f:
            data = f.read()
        with open(junk, "wb") as f:   # a whole header (DALI gets it), half the scan
            f.write(data[:len(data) // 2])
        mixed = paths[:3] + [junk] + paths[3:]
        dec = DaliDecoder(pre, batch_size=batch_size, threads=2)
        items = [item for chunk in dec.batches(mixed) for item in chunk]
    finally:
        os.unlink(junk)
    assert items[3][0] is None and items[3][2]   # why, Pillow's words
    kept = items[:3] + items[4:]
    assert [bytes(memoryview(d).cast("B")) for d, _, _ in kept] == \
        [bytes(memoryview(d).cast("B")) for d, _, _ in clean]
    assert dec.pipelines_built >= 2 and dec.by_pillow == []


def test_truncated_jpegs_are_left_to_pillow(tree, tmp_path):
    """A JPEG cut short (no end-of-image marker after its scan) never
    reaches DALI: the GPU's decoders return its missing rows as pixels
    without an error (issue 39: on an H200 the truncated file of
    test_gpu_skip_bad_keeps_the_good_files was stored, not skipped), so
    Pillow decides, and refuses it, as the Pillow path does."""
    from fastread.decode_dali import jpeg_is_truncated

    paths = [p for p in fastread.scan(tree)[0] if p.endswith(".JPEG")]
    with open(paths[0], "rb") as f:
        data = f.read()
    assert not jpeg_is_truncated(data)
    assert not jpeg_is_truncated(data + b"trailing bytes after the end")   # kept by Pillow too
    assert jpeg_is_truncated(data[:len(data) // 2])
    assert jpeg_is_truncated(data[:-2])
    assert not jpeg_is_truncated(b"\x89PNG\r\n\x1a\n not a JPEG")
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[:len(data) // 2])
    dec = DaliDecoder(Preprocess(resize=40), batch_size=4, threads=2)
    items = [item for chunk in dec.batches(paths[1:3] + [str(cut)] + paths[3:5]) for item in chunk]
    assert dec.pipelines_built == 1   # no failed run
    assert items[2][0] is None and "truncated" in items[2][2]
    assert all(why is None for _, _, why in items[:2] + items[3:])


def test_plain_jpeg_sizes_are_pillows(tree):
    """The parser's fast header walk (no Pillow) gives Pillow's size for
    plain JPEGs, and steps aside (None: Pillow's parser decides) for any
    JPEG whose orientation, format or frame Pillow would read otherwise."""
    from PIL import ImageOps
    from fastread.decode_dali import _plain_jpeg_size

    def jpeg(im, **kw):
        buf = io.BytesIO()
        im.save(buf, "JPEG", **kw)
        return buf.getvalue()

    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 53, 3), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    plain = [jpeg(rgb), jpeg(rgb, progressive=True), jpeg(rgb.convert("L")),
             jpeg(rgb, subsampling=0), jpeg(rgb, icc_profile=b"\0" * 200)]
    plain += [open(p, "rb").read() for p in fastread.scan(tree)[0] if p.endswith(".JPEG")][:8]
    for data in plain:
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "JPEG" and im.getexif().get(0x0112, 1) == 1
            assert _plain_jpeg_size(data) == im.size
            assert upright_size(data) == ImageOps.exif_transpose(im).size
    others = [jpeg(rgb, exif=exif.tobytes()),                      # EXIF orientation
              jpeg(rgb.convert("CMYK")),                          # 4 components
              jpeg(rgb)[:20],                                     # no start of scan
              b"\xff\xd8\xff\xe0\x00\xff" + jpeg(rgb)[6:],          # a segment past the end
              jpeg(rgb)[:2] + b"\xff\xff" + jpeg(rgb)[2:],           # a fill byte
              b"\x89PNG\r\n\x1a\n not a JPEG", b""]
    for data in others:
        assert _plain_jpeg_size(data) is None
    assert upright_size(others[0]) == (37, 53)   # turned, by Pillow's parser


def test_dali_decoder_says_where_its_time_went(tree):
    """DaliDecoder.seconds: each step's time over a call of batches() (what
    bench/decoded/pack_decoders.py prints)."""
    paths = fastread.scan(tree)[0]
    dec = DaliDecoder(Preprocess(resize=40, crop=32), device="cpu", batch_size=5, threads=2)
    assert sum(len(b) for b in dec.batches(paths)) == len(paths)
    assert set(dec.seconds) == {"read", "parse", "feed", "wait", "store"}
    assert all(v >= 0 for v in dec.seconds.values()) and dec.seconds["wait"] > 0


def test_a_device_failure_fails_the_pack_not_the_files(tree, tmp_path, monkeypatch):
    """An error of DALI's device (CUDA, memory) is no file's fault: the
    pack fails saying so, instead of handing every file to Pillow."""
    def broken(self, n):
        raise RuntimeError("Critical error in pipeline:\nCUDA error: out of memory")

    monkeypatch.setattr(DaliDecoder, "_take", broken)
    out = tmp_path / "o" / "x.img"
    out.parent.mkdir()
    with pytest.raises(OSError, match="pipeline failed, not on a file: CUDA error"):
        fastread.pack(tree, str(out), decode=True, decoder="dali", decode_device="cpu",
                      resize=40, skip_bad=True, progress=False)
    assert os.listdir(out.parent) == []


def test_a_pipeline_that_cannot_be_built_fails_the_pack(tree, tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("[/opt/dali/pipeline.cc:42] Assert failed\nno device 7")

    monkeypatch.setattr(DaliDecoder, "_build", broken)
    with pytest.raises(OSError, match=r"pipeline \(CPU\) cannot be built: no device 7"):
        fastread.pack(tree, str(tmp_path / "x.img"), decode=True, decoder="dali",
                      decode_device="cpu", resize=40, skip_bad=True, progress=False)
    assert not (tmp_path / "x.img").exists()


def test_interrupted_pack_leaves_nothing(tree, tmp_path):
    """SIGINT between batches of the DALI path: KeyboardInterrupt, the
    reader stopped, no image, index or temporary file left."""
    out = tmp_path / "out"
    out.mkdir()
    assert_pack_interrupts_cleanly(tree, out, 'decoder="dali", decode_device="cpu", batch_size=4')


def test_unreadable_file_is_named(tree, tmp_path):
    """A file the engine cannot read (here a dangling link) fails its
    sample only: named, or skipped and listed."""
    root = tmp_path / "t"
    shutil.copytree(tree, root)
    cls = classes(root)[0]
    os.symlink(str(tmp_path / "nowhere.jpg"), root / cls / "gone.jpg")
    paths = fastread.scan(str(root))[0]
    if not any(p.endswith("gone.jpg") for p in paths):
        pytest.skip("scan leaves dangling links out here")
    img = fastread.pack(str(root), str(tmp_path / "u.img"), decode=True, decoder="dali",
                        decode_device="cpu", resize=40, batch_size=4, skip_bad=True,
                        progress=False)
    assert [n for n, _ in img.skipped] == [os.path.join(cls, "gone.jpg")]
    assert len(img) == len(paths) - 1


def test_decoding_streams_a_bounded_window(tree):
    """Memory stays bounded: while the first batch is consumed, the paths
    handed to the reader reach at most a few batches ahead."""
    class Probe(list):
        reached = 0

        def __getitem__(self, key):
            if isinstance(key, slice):
                Probe.reached = max(Probe.reached, min(key.stop, len(self)))
            return super().__getitem__(key)

    paths = Probe(fastread.scan(tree)[0])
    assert len(paths) >= 2 * (IN_FLIGHT + 1 + 1) + 2
    dec = DaliDecoder(Preprocess(resize=16), batch_size=2, threads=1, prefetch=1, workers=1)
    gen = dec.batches(paths)
    first = next(gen)
    assert len(first) == 2 and all(why is None for _, _, why in first)
    # IN_FLIGHT batches past the reader (the first, yielded, the
    # pipeline's and the one being parsed) + those read ahead (prefetch +
    # workers - 1 = 1), + 1 of slack for the reader's timing.
    assert Probe.reached <= 2 * (IN_FLIGHT + 1 + 1) < len(paths)
    rest = [item for chunk in gen for item in chunk]
    assert len(first) + len(rest) == len(paths)


# -- the choice ---------------------------------------------------------------

def test_choice_here_and_its_record(tree, tmp_path, capsys):
    """auto: Pillow here (no GPU; and DALI on the GPU is not the default
    until measured there); the pack's summary and index say which and why."""
    out = str(tmp_path / "auto.img")
    assert cli_main(["pack", tree, out, "--decode", "--resize", "40", "--crop", "32",
                     "--quiet", "--decode-workers", "1"]) == 0
    printed = capsys.readouterr().out
    img = fastread.PackedImage(out)
    want = choose_decoder("auto").label   # pillow here; the GPU's once AUTO_USES_DALI_GPU
    assert img.preprocess["decoder"] == want and img.preprocess["decoder_why"].startswith("auto")
    assert f"decoder: {want} (auto" in printed
    doc = json.loads(open(img.index_path, "rb").read().split(b"\n", 1)[1])
    assert doc["preprocess"]["decoder"] == want


@pytest.mark.parametrize("gpus", [1, 0])
def test_auto_takes_the_gpu_once_the_rule_says_so(monkeypatch, gpus):
    """AUTO_USES_DALI_GPU, the one switch: auto is DALI on the GPU where
    DALI sees one, Pillow where not (saying why), and Pillow everywhere
    while the switch is off."""
    import nvidia.dali.backend as backend
    import fastread.decode as dec

    monkeypatch.setattr(dec, "_dali_gpus", lambda: (backend, gpus, None if gpus else "no GPU"))
    monkeypatch.setattr(dec, "AUTO_USES_DALI_GPU", True)
    got = choose_decoder("auto")
    assert got.label == ("dali-mixed" if gpus else "pillow")
    assert got.why.startswith("auto") and (gpus or "no GPU" in got.why)
    assert choose_decoder("auto", "cpu").label == "pillow"
    monkeypatch.setattr(dec, "AUTO_USES_DALI_GPU", False)
    assert choose_decoder("auto").label == "pillow"


def test_info_says_the_default_decoder(capsys):
    assert cli_main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    want = choose_decoder("auto")
    assert data["pack_decoder"] == {"auto": want.label, "why": want.why}
    assert cli_main(["info"]) == 0
    assert f"decoder {want.label} ({want.why})" in capsys.readouterr().out


@pytest.mark.parametrize("decoder, device, match", [
    ("pillow", "gpu", "decode_device='gpu' .* needs decoder='dali'"),
    ("nvjpeg", None, "decoder must be one of auto, pillow, dali"),
    ("dali", "tpu", "decode_device must be one of cpu, gpu"),
])
def test_bad_combinations_are_refused(tree, tmp_path, decoder, device, match):
    out = tmp_path / "x.img"
    with pytest.raises(ValueError, match=match):
        fastread.pack(tree, str(out), decode=True, resize=32, decoder=decoder,
                      decode_device=device)
    assert not out.exists()


def test_gpu_refused_without_a_gpu(tree, tmp_path, capsys):
    if _gpus[1]:
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "x.img"
    for decoder in ("dali", "auto"):
        with pytest.raises(ValueError, match="decode_device='gpu'.*sees no CUDA GPU"):
            fastread.pack(tree, str(out), decode=True, resize=32, decoder=decoder,
                          decode_device="gpu")
    assert cli_main(["pack", tree, str(out), "--decode", "--resize", "32",
                     "--decode-device", "gpu"]) == 1
    assert "--decode-device gpu" in capsys.readouterr().err
    assert not out.exists()


def test_dali_refused_without_dali(tree, tmp_path, monkeypatch):
    """decoder='dali' where DALI cannot be imported: refused naming the
    option and the package; auto falls back to Pillow, saying why."""
    import sys

    monkeypatch.setitem(sys.modules, "nvidia.dali.backend", None)   # import fails
    with pytest.raises(ValueError, match="decoder='dali' .*needs NVIDIA DALI.*not installed"):
        fastread.pack(tree, str(tmp_path / "x.img"), decode=True, resize=32, decoder="dali")
    assert not (tmp_path / "x.img").exists()
    assert choose_decoder("auto").label == "pillow"
    with pytest.raises(ValueError, match="decoder='auto', decode_device='gpu' .*needs NVIDIA DALI"):
        choose_decoder("auto", "gpu")


def test_dali_threads_must_be_positive(tree, tmp_path):
    """decode_workers=0 means 'in this process' for Pillow; DALI needs
    threads: refused naming the option the caller passed."""
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=r"decode_workers \(DALI's threads.* 'dali-cpu'"):
            fastread.pack(tree, str(tmp_path / "x.img"), decode=True, resize=32,
                          decoder="dali", decode_device="cpu", decode_workers=bad)
    assert not (tmp_path / "x.img").exists()


def test_gpu_decoder_arguments_follow_the_options(monkeypatch):
    """The mixed decoder's arguments: libjpeg's chroma upsampling unless told
    otherwise (the module's FANCY_UPSAMPLING, what pack() takes), the hardware
    share as given; bad values are refused; the CPU decoder gets neither."""
    from fastread import decode_dali

    pre = Preprocess(resize=32)
    args = DaliDecoder(pre, device="gpu").decoder_args()
    assert args == dict(device="mixed", jpeg_fancy_upsampling=True,
                        hw_decoder_load=decode_dali.HW_DECODER_LOAD)
    args = DaliDecoder(pre, device="gpu", fancy_upsampling=False, hw_decoder_load=0).decoder_args()
    assert args["jpeg_fancy_upsampling"] is False and args["hw_decoder_load"] == 0.0
    monkeypatch.setattr(decode_dali, "FANCY_UPSAMPLING", False)
    assert DaliDecoder(pre, device="gpu").decoder_args()["jpeg_fancy_upsampling"] is False
    assert DaliDecoder(pre, device="cpu").decoder_args() == dict(device="cpu")
    with pytest.raises(ValueError, match="fancy_upsampling must be True or False"):
        DaliDecoder(pre, device="gpu", fancy_upsampling=1)


def test_gpu_huffman_threshold_goes_to_the_mixed_decoder(monkeypatch):
    """hybrid_huffman_threshold: left to DALI unless given (the argument or
    the module's HYBRID_HUFFMAN_THRESHOLD, what pack() takes); 0 sends every
    image's Huffman decoding to the GPU; bad values are refused."""
    from fastread import decode_dali

    pre = Preprocess(resize=32)
    assert "hybrid_huffman_threshold" not in DaliDecoder(pre, device="gpu").decoder_args()
    args = DaliDecoder(pre, device="gpu", hybrid_huffman_threshold=0).decoder_args()
    assert args["hybrid_huffman_threshold"] == 0
    monkeypatch.setattr(decode_dali, "HYBRID_HUFFMAN_THRESHOLD", 250000)
    assert DaliDecoder(pre, device="gpu").decoder_args()["hybrid_huffman_threshold"] == 250000
    assert DaliDecoder(pre, device="cpu").decoder_args() == dict(device="cpu")
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="hybrid_huffman_threshold must be None or an "
                                             "integer >= 0"):
            DaliDecoder(pre, device="gpu", hybrid_huffman_threshold=bad)


def test_decoder_options_need_decode(tree, tmp_path, capsys):
    with pytest.raises(ValueError, match="decoder, decode_device apply only with decode=True"):
        fastread.pack(tree, str(tmp_path / "x.img"), decoder="dali", decode_device="cpu")
    with pytest.raises(SystemExit) as e:
        cli_main(["pack", tree, str(tmp_path / "x.img"), "--decoder", "dali"])
    assert e.value.code == 2 and "--decoder apply only with --decode" in capsys.readouterr().err
    assert not (tmp_path / "x.img").exists()


# -- GPU (device="mixed"): skipped without a CUDA GPU ------------------------------

@needs_gpu
@pytest.mark.parametrize("opts", [dict(resize=40, crop=32), dict(resize=150),
                                  dict(max_side=64)],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_gpu_pixels_and_shapes_match_the_pillow_path(tree, tmp_path, opts):
    a, b = pack_both(tree, tmp_path, device="gpu", **opts)
    assert b.preprocess["decoder"] == "dali-mixed"
    compare(a, b, MEAN_GPU, MAX_GPU)
    assert fastread.verify(b) == []


@needs_gpu
def test_gpu_skip_bad_keeps_the_good_files(tree, tmp_path):
    root = str(tmp_path / "bad")
    victim, junk = corrupt_class_tree(tree, root)
    img = fastread.pack(root, str(tmp_path / "g.img"), decode=True, decoder="dali",
                        decode_device="gpu", resize=40, crop=32, batch_size=5,
                        skip_bad=True, progress=False)
    assert [n for n, _ in img.skipped] == [victim, junk]
    ref = fastread.pack(root, str(tmp_path / "ref.img"), decode=True, decoder="pillow",
                        resize=40, crop=32, skip_bad=True, decode_workers=0, progress=False)
    compare(ref, img, MEAN_GPU, MAX_GPU)


@needs_gpu
def test_gpu_when_auto_is_told_the_gpu(tree, tmp_path):
    from fastread.decode import AUTO_USES_DALI_GPU
    assert choose_decoder("auto").label == ("dali-mixed" if AUTO_USES_DALI_GPU else "pillow")
    img = fastread.pack(tree, str(tmp_path / "a.img"), decode=True, resize=40, crop=32,
                        decode_device="gpu", progress=False)
    assert img.preprocess["decoder"] == "dali-mixed"
