"""Decode once (``fastread pack --decode``) against decoding every epoch, on
the CPU: the same DALI augmentation after each (random resized crop to
``CROP`` x ``CROP``, random mirror, normalize to float CHW).

==============================  ==============================================
``decoded-dali-file-decode``    ``fn.readers.file`` over the JPEG tree +
                                ``fn.decoders.image(device="cpu")``: the
                                baseline
``decoded-dali-jpeg``           ``readers.image`` over the tree re-encoded
                                once at max side 256, JPEG q90 + the CPU
                                decoder (FFCV's usual setting)
``decoded-dali-raw``            ``readers.image(decoded=True)`` over raw
                                pixels, shorter side 160 (no decoder)
``decoded-dali-raw-crop``       the same, center-cropped to 160 x 160 (one
                                shape: one block per batch)
==============================  ==============================================

They run on a JPEG tree (DATA) whose decoded packs lie beside it, named by
:func:`pack_path` (``DATA.decoded-raw.img``, ...): ``bench/decoded/run.py``
writes them (timing the packs) and runs these modes. The settings of each
pack are :data:`PACKS`; a pack made otherwise is refused by its index's
``preprocess``. GPU decoding (nvImageCodec, ``device="mixed"``) is not part
of this family yet.
"""
import os

from fastread.bench.registry import Mode
from fastread.bench.runners import DaliRunner

NAME = "decoded"
ORDER = 45

#: Output side of the shared augmentation.
CROP = 128

#: The decoded packs the modes read: name -> fastread.pack's decode options.
PACKS = {
    "jpeg": dict(max_side=256, encode="jpeg", quality=90),
    "raw": dict(resize=160),
    "raw-crop": dict(resize=160, crop=160),
}


def pack_path(root, pack):
    """Where pack ``pack`` (a key of :data:`PACKS`) of the tree ``root`` lies."""
    return f"{os.path.normpath(root)}.decoded-{pack}.img"


def modes(env):
    yield Mode("decoded-dali-file-decode", NAME, "files",
               "fn.readers.file + fn.decoders.image(cpu) + augment",
               "DALI's reader and CPU decoder every epoch, then the shared augmentation: "
               "the baseline", check=_check, build=_build_files, dali=True, role="baseline")
    for pack in PACKS:
        decoded = PACKS[pack].get("encode", "raw") == "raw"
        what = ("readers.image(decoded=True) + augment" if decoded
                else "readers.image + fn.decoders.image(cpu) + augment")
        yield Mode(f"decoded-dali-{pack}", NAME, "files", what,
                   f"fastread's packed image {pack} ({_describe(PACKS[pack])}), then the shared "
                   "augmentation", check=_check, build=_build_pack, dali=True,
                   params=(("pack", pack),))


def _describe(opts):
    if "max_side" in opts:
        size = f"max side {opts['max_side']}"
    else:
        size = f"shorter side {opts['resize']}"
    if opts.get("crop"):
        size += f", center crop {opts['crop']}"
    enc = f"JPEG q{opts['quality']}" if opts.get("encode") == "jpeg" else "raw uint8 HWC"
    return f"{size}, {enc}"


def _check(mode, cfg):
    why = cfg.env.dali_error_for(fastread_reader=mode.param("pack") is not None)
    if why:
        return why
    if cfg.device == "gpu":
        return "a CPU comparison (--device cpu): GPU decoding is not in this family yet"
    pack = mode.param("pack")
    if pack is not None and cfg.dataset is not None:
        path = pack_path(cfg.data_dir, pack)
        if not os.path.exists(path):
            opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in PACKS[pack].items())
            return f"no pack at {path} (`fastread pack {cfg.data_dir} {path} --decode {opts}`)"
    return None


def augment(images, labels):
    """The augmentation every mode ends with (DALI CPU operators)."""
    from nvidia.dali import fn, types

    images = fn.random_resized_crop(images, size=(CROP, CROP), seed=1)
    images = fn.crop_mirror_normalize(
        images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(seed=2),
        mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
        std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
    return images, labels


def _build_files(mode, cfg):
    def outputs():
        from nvidia.dali import fn
        data, labels = fn.readers.file(file_root=cfg.data_dir, random_shuffle=True, seed=0,
                                       name="Reader")
        return augment(fn.decoders.image(data, device="cpu"), labels)
    return DaliRunner(cfg, None, outputs=outputs)


def open_pack(cfg, pack):
    """The pack ``pack`` of DATA, checked against :data:`PACKS`."""
    import fastread
    from fastread.bench.registry import BenchError

    path = pack_path(cfg.data_dir, pack)
    img = fastread.PackedImage(path)
    want = PACKS[pack]
    got = img.preprocess or {}
    if not img.decoded or any(got.get(k) != v for k, v in want.items()):
        raise BenchError(f"{path} was not packed with {want} (its index says {got}): "
                         "pack it again")
    if len(img) + len(img.skipped) != cfg.dataset.samples:
        raise BenchError(f"{path} holds {len(img)} samples (+{len(img.skipped)} skipped), "
                         f"{cfg.data_dir} {cfg.dataset.samples}: pack it again")
    return img


def _build_pack(mode, cfg):
    pack = mode.param("pack")
    img = open_pack(cfg, pack)
    decoded = img.encoding == "raw"
    opts = dict(cfg.engine_options)

    def outputs():
        from nvidia.dali import fn
        from fastread.dali import readers
        data, labels = readers.image(image=img, decoded=decoded, random_shuffle=True, seed=0,
                                     name="Reader", **opts)
        return augment(data if decoded else fn.decoders.image(data, device="cpu"), labels)
    return DaliRunner(cfg, None, outputs=outputs)
