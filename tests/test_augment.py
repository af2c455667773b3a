"""GPU augmentation for decoded packs (issue 33): the crop parameters drawn
on the host (torchvision's RandomResizedCrop, deterministic per seed, epoch
and sample), a NumPy reference of crop + bilinear resize + flip + normalize
(itself checked against torch's interpolate), the fused CUDA kernel against
that reference, and ImageLoader(image=) end to end and its bad options.
The GPU tests skip (with the reason) where no CUDA device is usable."""
import math
import os
import random

import numpy as np
import pytest

import fastread
from fastread import _core
from fastread.augment import Augmenter, crop_params
from fastread.datasets import make_imagenet_like
from conftest import skip_unless

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# Normalized float32 outputs agree with the float64 reference to this (about
# 1/50 of one grey level); float16 to its own rounding; uint8 to one level.
ATOL_F32 = 1e-3
ATOL_F16, RTOL_F16 = 2e-3, 1e-3


# ----------------------------------------------------------- parameters (CPU)

def torchvision_get_params(rng, height, width, scale, ratio):
    """torchvision.transforms.RandomResizedCrop.get_params, with Python's
    random in place of torch's generator (torchvision is not a dependency)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def test_params_are_a_function_of_seed_epoch_and_index():
    idx = np.arange(1000)
    b1, f1 = crop_params(idx, 160, 160, seed=7, epoch=2)
    b2, f2 = crop_params(idx, 160, 160, seed=7, epoch=2)
    assert (b1 == b2).all() and (f1 == f2).all()
    # Batch boundaries, order and shards do not matter: each sample on its own.
    parts = [crop_params(idx[i:i + 33], 160, 160, seed=7, epoch=2) for i in range(0, 1000, 33)]
    assert (np.concatenate([p[0] for p in parts]) == b1).all()
    assert (np.concatenate([p[1] for p in parts]) == f1).all()
    perm = np.random.default_rng(0).permutation(1000)
    bp, fp = crop_params(perm, 160, 160, seed=7, epoch=2)
    assert (bp == b1[perm]).all() and (fp == f1[perm]).all()
    # Another seed or epoch: other crops.
    for kw in (dict(seed=8, epoch=2), dict(seed=7, epoch=3)):
        b3, _ = crop_params(idx, 160, 160, **kw)
        assert (b3 != b1).any(axis=1).mean() > 0.9
    assert b1.dtype == np.int32 and b1.shape == (1000, 4) and f1.dtype == np.bool_


@pytest.mark.parametrize("hw", [(160, 160), (224, 224), (37, 300), (300, 41), (1, 1), (2, 9)])
def test_boxes_lie_inside_the_image(hw):
    h, w = hw
    boxes, _ = crop_params(np.arange(3000), h, w, seed=1)
    top, left, bh, bw = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (bh >= 1).all() and (bw >= 1).all()
    assert (top + bh <= h).all() and (left + bw <= w).all()


def test_scale_and_ratio_bounds_and_spread():
    h = w = 224
    scale, ratio = (0.2, 0.6), (0.5, 1.5)
    boxes, _ = crop_params(np.arange(20000), h, w, seed=3, scale=scale, ratio=ratio)
    bh, bw = boxes[:, 2].astype(float), boxes[:, 3].astype(float)
    frac = bh * bw / (h * w)
    # Rounding each side to a whole pixel moves the area by at most ~1 px per side.
    slack = (bh + bw + 1) / (h * w)
    assert (frac >= scale[0] - slack).all() and (frac <= scale[1] + slack).all()
    r = bw / bh
    assert (r >= ratio[0] * (1 - 1.5 / bh)).all() and (r <= ratio[1] * (1 + 1.5 / bw)).all()
    # The whole ranges are used, not a corner of them.
    assert frac.min() < 0.22 and frac.max() > 0.58
    assert r.min() < 0.55 and r.max() > 1.4


@pytest.mark.parametrize("hw,scale,ratio", [
    ((224, 224), (0.08, 1.0), (3 / 4, 4 / 3)),
    ((100, 300), (0.08, 1.0), (3 / 4, 4 / 3)),
    ((64, 64), (0.5, 1.0), (0.5, 2.0)),   # often out of the image: many tries
])
def test_distribution_is_torchvisions(hw, scale, ratio):
    """Same algorithm, other generator: the statistics of 20,000 draws of
    each agree to within their sampling noise."""
    h, w = hw
    n = 20000
    boxes, _ = crop_params(np.arange(n), h, w, seed=11, scale=scale, ratio=ratio)
    rng = random.Random(5)
    ref = np.array([torchvision_get_params(rng, h, w, scale, ratio) for _ in range(n)], float)
    ours = boxes.astype(float)
    for k, name in enumerate(("top", "left", "height", "width")):
        sd = max(ref[:, k].std(), 1.0)
        assert abs(ours[:, k].mean() - ref[:, k].mean()) < 5 * sd / math.sqrt(n), name
        assert abs(ours[:, k].std() - ref[:, k].std()) < 0.05 * sd + 0.5, name
    full = lambda b: ((b[:, 2] == h) & (b[:, 3] == w)).mean()  # noqa: E731
    assert abs(full(ours) - full(ref)) < 0.02


def test_fallback_is_the_centre_crop_of_the_clamped_aspect():
    # scale 1 with an aspect ratio the image does not have: every try fails.
    boxes, _ = crop_params(np.arange(50), 100, 100, seed=0, scale=(1.0, 1.0), ratio=(2.0, 3.0))
    assert (boxes == [25, 0, 50, 100]).all()      # w / h clamped to 2: h = 100 / 2
    boxes, _ = crop_params(np.arange(50), 100, 400, seed=0, scale=(1.0, 1.0), ratio=(0.5, 3.0))
    assert (boxes == [0, 50, 100, 300]).all()     # 4:1 clamped to 3:1
    boxes, _ = crop_params(np.arange(50), 90, 100, seed=0, scale=(1.5, 2.0))
    assert (boxes == [0, 0, 90, 100]).all()       # aspect inside ratio: the whole image


def test_flip_probability():
    _, f = crop_params(np.arange(20000), 32, 32, seed=2)
    assert abs(f.mean() - 0.5) < 0.015
    assert not crop_params(np.arange(100), 32, 32, flip=0)[1].any()
    assert crop_params(np.arange(100), 32, 32, flip=1)[1].all()
    _, f2 = crop_params(np.arange(20000), 32, 32, seed=2, flip=0.1)
    assert abs(f2.mean() - 0.1) < 0.01


@pytest.mark.parametrize("kw,match", [
    (dict(scale=(0, 1)), "scale"), (dict(scale=(0.5, 0.1)), "scale"),
    (dict(scale=(0.1,)), "scale"), (dict(ratio=(-1, 2)), "ratio"),
    (dict(ratio="wide"), "ratio"), (dict(flip=1.5), "flip"), (dict(flip=True), "flip"),
    (dict(seed=-1), "seed"), (dict(epoch=1.5), "epoch"),
])
def test_bad_crop_options_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        crop_params(np.arange(4), 32, 32, **kw)


@pytest.mark.parametrize("hw", [(0, 32), (32, 0), (-1, 5)])
def test_bad_image_size_is_named(hw):
    with pytest.raises(ValueError, match="height|width"):
        crop_params(np.arange(4), *hw)


# ------------------------------------------------------- the reference (CPU)

def reference(images, boxes, flips, out_hw, mean=None, std=None, dtype="float32"):
    """Crop, bilinear resize (pixel centres, align_corners=False, edges
    clamped, no antialiasing), flip and normalize, in float64: (N, 3, OH, OW)."""
    oh, ow = out_hw
    out = np.empty((len(images), 3, oh, ow))
    for i, (img, (top, left, bh, bw)) in enumerate(zip(images, boxes)):
        crop = img[top:top + bh, left:left + bw].astype(np.float64)
        fy = np.maximum((np.arange(oh) + 0.5) * (bh / oh) - 0.5, 0)
        fx = np.maximum((np.arange(ow) + 0.5) * (bw / ow) - 0.5, 0)
        y0 = np.minimum(fy.astype(int), bh - 1)
        x0 = np.minimum(fx.astype(int), bw - 1)
        y1, x1 = np.minimum(y0 + 1, bh - 1), np.minimum(x0 + 1, bw - 1)
        ly, lx = (fy - y0)[:, None, None], (fx - x0)[None, :, None]
        top_row = crop[y0][:, x0] * (1 - lx) + crop[y0][:, x1] * lx
        bot_row = crop[y1][:, x0] * (1 - lx) + crop[y1][:, x1] * lx
        v = top_row * (1 - ly) + bot_row * ly            # (OH, OW, 3)
        if flips is not None and flips[i]:
            v = v[:, ::-1]
        out[i] = v.transpose(2, 0, 1)
    if dtype == "uint8":
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    m = np.asarray(mean, float)[None, :, None, None]
    s = np.asarray(std, float)[None, :, None, None]
    return ((out - m) / s).astype(dtype)


def test_reference_is_torch_interpolate():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (6, 40, 52, 3), dtype=np.uint8)
    boxes = np.array([[0, 0, 40, 52], [3, 5, 20, 30], [10, 0, 7, 9], [0, 40, 40, 12],
                      [39, 51, 1, 1], [5, 5, 33, 41]])
    flips = np.array([0, 1, 0, 1, 0, 1], bool)
    for out_hw in ((24, 24), (64, 48), (40, 52)):
        got = reference(imgs, boxes, flips, out_hw, (0, 0, 0), (1, 1, 1), "float64")
        for i, (t, l, h, w) in enumerate(boxes):
            crop = torch.from_numpy(imgs[i, t:t + h, l:l + w].astype(np.float64))
            want = torch.nn.functional.interpolate(
                crop.permute(2, 0, 1)[None], size=out_hw, mode="bilinear",
                align_corners=False, antialias=False)[0]
            if flips[i]:
                want = want.flip(-1)
            np.testing.assert_allclose(got[i], want.numpy(), atol=1e-9)


def test_reference_normalizes_and_rounds():
    img = np.full((1, 4, 4, 3), 200, np.uint8)
    box = np.array([[0, 0, 4, 4]])
    out = reference(img, box, None, (2, 2), (100, 100, 100), (50, 25, 10))
    assert np.allclose(out[0, :, 0, 0], [2, 4, 10])
    assert (reference(img, box, None, (3, 3), dtype="uint8") == 200).all()


# ------------------------------------------------------------- the kernel (GPU)

def gpu_or_skip():
    usable, why = _core.gpu_probe(0)
    skip_unless("gpu", None if usable else f"no usable CUDA device: {why}")
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def kernel():
    gpu_or_skip()
    try:
        return Augmenter(0)
    except RuntimeError as e:
        skip_unless("gpu", f"the augmentation kernel cannot be built here: {e}")


def run_kernel(kernel, torch, imgs, boxes, flips, out_hw, dtype, mean=(0, 0, 0), std=(1, 1, 1),
               images=None):
    src = torch.from_numpy(imgs).cuda() if images is None else images
    out = torch.empty((len(imgs), 3) + tuple(out_hw), dtype=getattr(torch, dtype), device="cuda")
    kernel(src, out, boxes, flips, mean=mean, std=std,
           stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return out.cpu().numpy()


def random_batch(n, h, w, seed, out_hw=None):
    rng = np.random.default_rng(seed)
    imgs = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    boxes, flips = crop_params(np.arange(n), h, w, seed=seed)
    return imgs, boxes, flips


PIX_MEAN = [m * 255 for m in MEAN]
PIX_STD = [s * 255 for s in STD]


@pytest.mark.parametrize("hw,out_hw", [((160, 160), (160, 160)), ((64, 96), (224, 224)),
                                       ((224, 224), (112, 128)), ((5, 7), (3, 3))])
def test_kernel_float32_matches_reference(kernel, hw, out_hw):
    torch = gpu_or_skip()
    imgs, boxes, flips = random_batch(24, *hw, seed=1)
    got = run_kernel(kernel, torch, imgs, boxes, flips, out_hw, "float32", PIX_MEAN, PIX_STD)
    want = reference(imgs, boxes, flips, out_hw, PIX_MEAN, PIX_STD)
    np.testing.assert_allclose(got, want, atol=ATOL_F32, rtol=0)
    assert kernel.kernel_source


def test_kernel_float16_and_uint8(kernel):
    torch = gpu_or_skip()
    imgs, boxes, flips = random_batch(16, 80, 80, seed=2)
    got = run_kernel(kernel, torch, imgs, boxes, flips, (64, 64), "float16", PIX_MEAN, PIX_STD)
    assert got.dtype == np.float16
    want = reference(imgs, boxes, flips, (64, 64), PIX_MEAN, PIX_STD, "float64")
    np.testing.assert_allclose(got.astype(np.float64), want, atol=ATOL_F16, rtol=RTOL_F16)
    got8 = run_kernel(kernel, torch, imgs, boxes, flips, (64, 64), "uint8")
    want8 = reference(imgs, boxes, flips, (64, 64), dtype="uint8")
    diff = np.abs(got8.astype(int) - want8.astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99   # ties at .5 may round either way


def test_kernel_reads_samples_at_a_stride_and_in_chunks(kernel):
    """Samples spaced by a slot wider than the image (O_DIRECT batches),
    and more samples than one launch carries (chunks of 384)."""
    torch = gpu_or_skip()
    n, h, w, slot = 400, 12, 10, 12 * 10 * 3 + 136
    imgs, boxes, flips = random_batch(n, h, w, seed=3)
    flat = torch.zeros(n * slot, dtype=torch.uint8)
    flat.view(n, slot)[:, :h * w * 3] = torch.from_numpy(imgs.reshape(n, -1))
    strided = flat.cuda().as_strided((n, h, w, 3), (slot, w * 3, 3, 1))
    got = run_kernel(kernel, torch, imgs, boxes, flips, (9, 11), "float32", PIX_MEAN, PIX_STD,
                     images=strided)
    np.testing.assert_allclose(got, reference(imgs, boxes, flips, (9, 11), PIX_MEAN, PIX_STD),
                               atol=ATOL_F32, rtol=0)


# ------------------------------------------------------ augment_host (CPU)

@pytest.mark.parametrize("hw,out_hw", [((160, 160), (160, 160)), ((64, 96), (224, 224)),
                                       ((224, 224), (112, 128)), ((5, 7), (3, 3))])
@pytest.mark.parametrize("threads", [1, 3])
def test_host_float32_matches_reference(hw, out_hw, threads):
    from fastread.augment import augment_host
    imgs, boxes, flips = random_batch(24, *hw, seed=1)
    out = np.empty((24, 3, *out_hw), np.float32)
    assert augment_host(imgs, out, boxes, flips, mean=PIX_MEAN, std=PIX_STD,
                        threads=threads) is out
    np.testing.assert_allclose(out, reference(imgs, boxes, flips, out_hw, PIX_MEAN, PIX_STD),
                               atol=ATOL_F32, rtol=0)


def test_host_float16_uint8_and_strided_samples():
    from fastread.augment import augment_host
    imgs, boxes, flips = random_batch(16, 80, 80, seed=2)
    out16 = np.empty((16, 3, 64, 64), np.float16)
    augment_host(imgs, out16, boxes, flips, mean=PIX_MEAN, std=PIX_STD)
    want = reference(imgs, boxes, flips, (64, 64), PIX_MEAN, PIX_STD, "float64")
    np.testing.assert_allclose(out16.astype(np.float64), want, atol=ATOL_F16, rtol=RTOL_F16)
    # float16 is numpy's own rounding of the same float32 values (nearest even)
    out32 = np.empty((16, 3, 64, 64), np.float32)
    augment_host(imgs, out32, boxes, flips, mean=PIX_MEAN, std=PIX_STD)
    assert np.array_equal(out16, out32.astype(np.float16))
    out8 = np.empty((16, 3, 64, 64), np.uint8)
    augment_host(imgs, out8, boxes, flips)
    diff = np.abs(out8.astype(int) - reference(imgs, boxes, flips, (64, 64), dtype="uint8"))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    # samples spaced by a slot wider than the image (O_DIRECT batches)
    n, h, w, slot = 9, 12, 10, 12 * 10 * 3 + 136
    imgs, boxes, flips = random_batch(n, h, w, seed=3)
    flat = np.zeros((n, slot), np.uint8)
    flat[:, :h * w * 3] = imgs.reshape(n, -1)
    strided = np.lib.stride_tricks.as_strided(flat, (n, h, w, 3), (slot, w * 3, 3, 1))
    out = np.empty((n, 3, 9, 11), np.float32)
    augment_host(strided, out, boxes, flips, mean=PIX_MEAN, std=PIX_STD)
    np.testing.assert_allclose(out, reference(imgs, boxes, flips, (9, 11), PIX_MEAN, PIX_STD),
                               atol=ATOL_F32, rtol=0)


def test_host_refuses_bad_input():
    from fastread.augment import augment_host
    imgs = np.zeros((2, 8, 8, 3), np.uint8)
    out = np.empty((2, 3, 4, 4), np.float32)
    ok = np.array([[0, 0, 8, 8]] * 2)
    with pytest.raises(ValueError, match="sample 1's crop box"):
        augment_host(imgs, out, np.array([[0, 0, 8, 8], [4, 4, 8, 8]]))
    with pytest.raises(ValueError, match="sample 0's crop box"):
        augment_host(imgs, out, np.array([[2**31 - 1, 0, 1, 1], [0, 0, 8, 8]]))
    with pytest.raises(ValueError, match=r"below 2\*\*31"):
        augment_host(imgs, out, np.array([[2**33, 0, 1, 1], [0, 0, 8, 8]]))
    with pytest.raises(ValueError, match=r"out must be \(2, 3"):
        augment_host(imgs, np.empty((3, 3, 4, 4), np.float32), ok)
    with pytest.raises(ValueError, match="float32, float16 or uint8"):
        augment_host(imgs, np.empty((2, 3, 4, 4), np.float64), ok)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\) uint8"):
        augment_host(imgs.astype(np.float32), out, ok)
    with pytest.raises(ValueError, match="std"):
        augment_host(imgs, out, ok, std=(1, 0, 1))
    with pytest.raises(ValueError, match="threads"):
        augment_host(imgs, out, ok, threads=0)
    with pytest.raises(TypeError, match="NumPy array"):
        augment_host(imgs.tolist(), out, ok)


def test_kernel_refuses_bad_input(kernel):
    torch = gpu_or_skip()
    imgs = torch.zeros((2, 8, 8, 3), dtype=torch.uint8, device="cuda")
    out = torch.empty((2, 3, 4, 4), device="cuda")
    ok = np.array([[0, 0, 8, 8]] * 2)
    with pytest.raises(ValueError, match="sample 1's crop box"):
        kernel(imgs, out, np.array([[0, 0, 8, 8], [4, 4, 8, 8]]))
    # A top near 2**31 must not wrap the bounds check (it once read past the image).
    with pytest.raises(ValueError, match="sample 0's crop box"):
        kernel(imgs, out, np.array([[2**31 - 1, 0, 1, 1], [0, 0, 8, 8]]))
    with pytest.raises(ValueError, match=r"below 2\*\*31"):
        kernel(imgs, out, np.array([[2**33, 0, 1, 1], [0, 0, 8, 8]]))
    with pytest.raises(ValueError, match=r"out must be \(2, 3"):
        kernel(imgs, torch.empty((3, 3, 4, 4), device="cuda"), ok)
    with pytest.raises(ValueError, match="size 0 x 4"):
        kernel(imgs, torch.empty((2, 3, 0, 4), device="cuda"), ok)
    with pytest.raises(ValueError, match="float32, float16 or uint8"):
        kernel(imgs, torch.empty((2, 3, 4, 4), dtype=torch.float64, device="cuda"), ok)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\) uint8"):
        kernel(imgs.float(), out, ok)
    with pytest.raises(ValueError, match="mean"):
        kernel(imgs, out, ok, mean=(1, 2))
    with pytest.raises(ValueError, match="std"):
        kernel(imgs, out, ok, std=(1, 0, 1))
    with pytest.raises(TypeError, match="CUDA array"):
        kernel(imgs.cpu().numpy(), out, ok)


# ------------------------------------------------------ ImageLoader(image=)

@pytest.fixture(scope="module")
def aug_packs(disk_tmp):
    root = os.path.join(disk_tmp, "augment_tree")
    make_imagenet_like(root, classes=3, per_class=9, width=72, height=56, mean_kb=3,
                       workers=1, progress=False)
    out = {"root": root}
    out["raw"] = fastread.pack(root, os.path.join(disk_tmp, "aug_raw.img"), decode=True,
                               resize=40, crop=36, decode_workers=0, progress=False)
    out["var"] = fastread.pack(root, os.path.join(disk_tmp, "aug_var.img"), decode=True,
                               resize=40, decode_workers=0, progress=False)
    out["jpeg"] = fastread.pack(root, os.path.join(disk_tmp, "aug_jpeg.img"), decode=True,
                                resize=40, crop=36, encode="jpeg", decode_workers=0,
                                progress=False)
    out["plain"] = fastread.pack(root, os.path.join(disk_tmp, "aug_plain.img"),
                                 progress=False)
    return out


def host_pixels(pack):
    """Every sample's (H, W, 3) pixels read on the host, by data-set index."""
    with fastread.Reader(image=pack, batch_size=64, dense=True) as r:
        return np.concatenate([a for a, _ in r])


@pytest.mark.parametrize("kw,match", [
    (dict(size=0), "size"), (dict(mean=(0.5, 0.5)), "mean"), (dict(std=(1, 0, 1)), "std"),
    (dict(dtype="int32"), "dtype"), (dict(scale=(0.9, 0.1)), "scale"),
    (dict(ratio=(0, 1)), "ratio"), (dict(flip=2), "flip"), (dict(augment="yes"), "augment"),
])
def test_loader_bad_options_are_named(aug_packs, kw, match):
    from fastread.torch import ImageLoader
    with pytest.raises((ValueError, TypeError), match=match):  # a non-bool flag: TypeError
        ImageLoader(image=aug_packs["raw"].path, batch_size=4, device="cuda", **kw)


@pytest.mark.parametrize("which,match", [("var", "of [0-9]+ shapes")])
def test_loader_refuses_packs_it_cannot_read_naming_them(aug_packs, which, match):
    from fastread.torch import ImageLoader
    path = aug_packs[which].path
    with pytest.raises(ValueError, match=match) as e:
        ImageLoader(image=path, batch_size=4, device="cuda")
    assert path in str(e.value) and "--crop" in str(e.value)


def test_loader_pack_needs_decode(aug_packs):
    from fastread.torch import ImageLoader
    path = aug_packs["raw"].path
    with pytest.raises(ValueError, match="decode=False") as e:
        ImageLoader(image=path, batch_size=4, device="cpu", decode=False)
    assert path in str(e.value)


@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_cpu_loader_matches_the_reference(aug_packs, dtype):
    """device="cpu" on a raw pack: the host twin of the kernel, the same
    crops per (seed, epoch, sample), torch tensors on the CPU."""
    torch = pytest.importorskip("torch")
    from fastread.torch import ImageLoader
    pack = aug_packs["raw"]
    pixels = host_pixels(pack)
    _, labels = fastread.scan(aug_packs["root"])
    loader = ImageLoader(image=pack.path, batch_size=8, device="cpu", size=32, augment=True,
                         random_shuffle=True, seed=5, dtype=dtype, num_threads=2)
    got = loader_outputs(loader, epochs=2)
    assert len(got) == 2 * len(pixels)
    for epoch in (0, 1):
        idx = np.arange(len(pixels))
        boxes, flips = crop_params(idx, 36, 36, seed=5, epoch=epoch)
        if dtype == "uint8":
            want = reference(pixels, boxes, flips, (32, 32), dtype="uint8").astype(int)
        else:
            want = reference(pixels, boxes, flips, (32, 32), PIX_MEAN, PIX_STD, "float64")
        for i in idx:
            image, label = got[(epoch, int(i))]
            assert image.shape == (3, 32, 32) and image.dtype == np.dtype(dtype)
            if dtype == "uint8":
                assert np.abs(image.astype(int) - want[i]).max() <= 1
            else:
                tol = (ATOL_F32, 0) if dtype == "float32" else (ATOL_F16, RTOL_F16)
                np.testing.assert_allclose(image.astype(np.float64), want[i], atol=tol[0],
                                           rtol=tol[1])
            assert label == labels[i]
    assert isinstance(next(iter(loader))[0], torch.Tensor)


def loader_outputs(loader, epochs=1):
    """{sample index: (image, label)} over the loader's epoch(s), by the
    reader's order (what each batch holds)."""
    got = {}
    for _ in range(epochs):
        epoch = loader.epoch
        order = loader.reader._epoch_order(epoch)
        k = loader._start_batch
        for images, labels in loader:
            idx = order[k * loader.batch_size:k * loader.batch_size + len(labels)]
            for j, i in enumerate(idx):
                got[(epoch, int(i))] = (images[j].cpu().numpy(), int(labels[j]))
            k += 1
    return got


def test_loader_matches_the_reference(aug_packs):
    gpu_or_skip()
    from fastread.torch import ImageLoader
    pack = aug_packs["raw"]
    pixels = host_pixels(pack)
    _, labels = fastread.scan(aug_packs["root"])
    loader = ImageLoader(image=pack.path, batch_size=8, device="cuda", device_id=0, size=32,
                         augment=True, random_shuffle=True, seed=5)
    got = loader_outputs(loader, epochs=2)
    assert len(got) == 2 * len(pixels)
    for epoch in (0, 1):
        idx = np.arange(len(pixels))
        boxes, flips = crop_params(idx, 36, 36, seed=5, epoch=epoch)
        want = reference(pixels, boxes, flips, (32, 32), PIX_MEAN, PIX_STD)
        for i in idx:
            image, label = got[(epoch, int(i))]
            assert image.shape == (3, 32, 32) and image.dtype == np.float32
            np.testing.assert_allclose(image, want[i], atol=ATOL_F32, rtol=0)
            assert label == labels[i]
    # Without augment: the whole image resized, no flip.
    plain = ImageLoader(image=pack, batch_size=8, device="cuda", device_id=0, size=20)
    want = reference(pixels, np.tile([0, 0, 36, 36], (len(pixels), 1)), None, (20, 20),
                     PIX_MEAN, PIX_STD)
    for (_, i), (image, _) in loader_outputs(plain).items():
        np.testing.assert_allclose(image, want[i], atol=ATOL_F32, rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_loader_output_dtypes(aug_packs, dtype):
    torch = gpu_or_skip()
    from fastread.torch import ImageLoader
    loader = ImageLoader(image=aug_packs["raw"], batch_size=10, device="cuda", device_id=0,
                         size=24, augment=True, dtype=getattr(torch, dtype))
    images, labels = next(iter(loader))
    assert images.shape == (10, 3, 24, 24) and str(images.dtype) == f"torch.{dtype}"
    assert images.is_cuda and labels.is_cuda and labels.dtype == torch.int64
    pixels = host_pixels(aug_packs["raw"])[:10]
    boxes, flips = crop_params(np.arange(10), 36, 36, seed=0, epoch=0)
    if dtype == "uint8":
        want = reference(pixels, boxes, flips, (24, 24), dtype="uint8")
        assert np.abs(images.cpu().numpy().astype(int) - want).max() <= 1
    else:
        want = reference(pixels, boxes, flips, (24, 24), PIX_MEAN, PIX_STD, "float64")
        np.testing.assert_allclose(images.cpu().numpy().astype(np.float64), want,
                                   atol=ATOL_F16, rtol=RTOL_F16)


def test_loader_same_crops_at_any_world_size_and_batch_size(aug_packs):
    gpu_or_skip()
    from fastread.torch import ImageLoader
    kw = dict(image=aug_packs["raw"], device="cuda", device_id=0, size=16, augment=True,
              random_shuffle=True, seed=9)
    one = loader_outputs(ImageLoader(batch_size=8, **kw))
    two = {}
    for rank in (0, 1):
        two.update(loader_outputs(ImageLoader(batch_size=3, shard_id=rank, num_shards=2, **kw)))
    assert one.keys() == two.keys()
    for key in one:
        assert np.array_equal(one[key][0], two[key][0]) and one[key][1] == two[key][1]


def test_loader_resumes_mid_epoch(aug_packs):
    gpu_or_skip()
    from fastread.torch import ImageLoader
    kw = dict(image=aug_packs["raw"], batch_size=4, device="cuda", device_id=0, size=16,
              augment=True, random_shuffle=True, seed=4)
    full = [(i.cpu().numpy(), lab.cpu().numpy()) for i, lab in ImageLoader(**kw)]
    first = ImageLoader(**kw)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    second = ImageLoader(**kw)
    second.load_state_dict(state)
    rest = [(i.cpu().numpy(), lab.cpu().numpy()) for i, lab in second]
    assert len(rest) == len(full) - 3
    for (a, la), (b, lb) in zip(full[3:], rest):
        assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_loader_reads_o_direct_slots_and_elastic_shards(aug_packs):
    """O_DIRECT batches lie one sample per 4 KiB slot (a strided dense
    array); elastic sharding slices each global batch: the crops still
    follow the samples."""
    gpu_or_skip()
    from fastread.torch import ImageLoader
    kw = dict(image=aug_packs["raw"], device="cuda", device_id=0, size=16, augment=True,
              random_shuffle=True, seed=9)
    one = loader_outputs(ImageLoader(batch_size=8, **kw))
    direct = loader_outputs(ImageLoader(batch_size=8, o_direct=True, **kw))
    assert direct.keys() == one.keys()
    for key in one:
        assert np.array_equal(one[key][0], direct[key][0]) and one[key][1] == direct[key][1]
    whole = loader_outputs(ImageLoader(global_batch_size=8, **kw))
    elastic = {}
    for rank in (0, 1):
        elastic.update(loader_outputs(ImageLoader(global_batch_size=8, shard_id=rank,
                                                  num_shards=2, **kw)))
    assert elastic.keys() == whole.keys() and len(whole) >= 24
    for key in whole:
        assert np.array_equal(whole[key][0], elastic[key][0])
        # The same sample as without elastic sharding, too.
        assert np.array_equal(whole[key][0], one[key][0])


@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_tree_loader_augments_with_dali_too(aug_packs, dtype):
    """On a JPEG tree, augment= and dtype= mean the same through DALI's
    operators (random_resized_crop, coin_flip, crop_mirror_normalize)."""
    pytest.importorskip("nvidia.dali")
    torch = pytest.importorskip("torch")
    from fastread.torch import ImageLoader
    loader = ImageLoader(aug_packs["root"], batch_size=9, size=24, augment=True, dtype=dtype,
                         num_threads=1)
    images, labels = next(iter(loader))
    assert images.shape == (9, 3, 24, 24) and images.dtype == getattr(torch, dtype)
    plain = ImageLoader(aug_packs["root"], batch_size=9, size=24, dtype=dtype, num_threads=1)
    same, _ = next(iter(plain))
    assert not torch.equal(images, same)            # cropped, not the whole image resized
    if dtype == "uint8":
        assert int(same.max()) > 1                   # pixels, not normalized values


@pytest.mark.parametrize("which", ["jpeg", "plain"])
def test_packs_of_encoded_images_are_decoded_by_dali(aug_packs, which):
    """A plain pack of a JPEG tree and a --decode --encode jpeg pack are read
    by ranges and decoded by DALI, as the tree is: every sample once per
    epoch, with its label, at the asked size (the CPU decoder here)."""
    pytest.importorskip("nvidia.dali")
    torch = pytest.importorskip("torch")
    from fastread.torch import ImageLoader
    pack = aug_packs[which]
    loader = ImageLoader(image=pack.path, batch_size=8, size=20, augment=True, num_threads=1,
                         random_shuffle=True, seed=3)
    labels, count = [], 0
    for images, lab in loader:
        assert images.shape[1:] == (3, 20, 20) and images.dtype == torch.float32
        assert torch.isfinite(images).all()
        labels += lab.tolist()
        count += images.shape[0]
    assert count == len(pack.labels)
    assert sorted(labels) == sorted(int(x) for x in pack.labels)


@pytest.mark.parametrize("as_object", [False, True], ids=["path", "PackedImage"])
def test_a_pack_as_the_first_argument_is_image(aug_packs, as_object):
    """ImageLoader(pack): the packed image as file_root, told from a tree by
    its index, gives image='s batches (issue 39: it said 'file_root ... is
    not a directory')."""
    pytest.importorskip("torch")
    from fastread.torch import ImageLoader
    pack = aug_packs["raw"]
    kw = dict(batch_size=8, device="cpu", size=32, augment=True, random_shuffle=True, seed=5,
              dtype="uint8", num_threads=1)
    first = ImageLoader(pack if as_object else pack.path, **kw)
    assert first.image is not None and first.image.path == pack.path
    want = loader_outputs(ImageLoader(image=pack.path, **kw))
    got = loader_outputs(first)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k][0], want[k][0])
        assert got[k][1] == want[k][1]


def test_a_file_that_is_not_a_pack_is_named(aug_packs, tmp_path):
    pytest.importorskip("torch")
    from fastread.torch import ImageLoader
    lone = tmp_path / "lone.img"
    lone.write_bytes(open(aug_packs["raw"].path, "rb").read(4096))
    with pytest.raises(ValueError, match="is a file, not a tree.*lone.img.index' does not exist"):
        ImageLoader(str(lone), batch_size=4)
    with pytest.raises(ValueError, match="is a packed image: give it alone"):
        ImageLoader(aug_packs["raw"].path, files=["a.jpg"], batch_size=4)


def test_pack_of_encoded_images_and_a_tree_are_not_both_taken(aug_packs):
    from fastread.torch import ImageLoader
    with pytest.raises(ValueError, match="not both"):
        ImageLoader(aug_packs["root"], image=aug_packs["plain"].path, batch_size=4)

