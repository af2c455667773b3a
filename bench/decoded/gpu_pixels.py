"""Where DALI's pack decoder parts from Pillow's pixels, image by image, and
which of its stages does it (issue 39: on an H200 the GPU path's worst
image was 7-9 levels off Pillow on tests/test_pack_dali.py's tree, where
DALI's CPU path is at 0.17).

For each variant and each of the tests' settings (source size, resize 40
crop 32, resize 150, max side 64) it packs nothing: it decodes the tree's
files with fastread.decode_dali.DaliDecoder (or a variant of it) and prints
each variant's mean difference from Pillow's pixels (fastread.decode.
preprocess_file), its worst image (name and mean) and largest single
difference:

  dali-cpu            DALI's CPU decoder and resize (the reference: ~0.2)
  gpu                 fancy chroma upsampling for every image, hardware share 1.0
  gpu-simple          nvJPEG's default chroma upsampling (replication), hardware 1.0
  gpu-hw0             fancy upsampling, no hardware decoder (nvJPEG's CUDA decoder)
  gpu-simple-hw0      neither
  gpu-resize          DALI's CPU decoder, then the GPU's resize and slice: the
                      resize alone on the GPU

If gpu-resize is off while dali-cpu is not, the GPU's resampling is the
cause; if gpu-simple is off by more than gpu, the chroma upsampling; if the
hw0 variants differ from the others, the hardware decoder.

Then, per setting, a line per image: its header (chroma subsampling, size,
EXIF orientation, progressive or not), its downscale factor (source over
target, the smaller axis), and its mean difference under each variant.

    python bench/decoded/gpu_pixels.py [--tree DIR] [--variants ...] [--json OUT]
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

SETTINGS = {"source-size": {}, "resize=40,crop=32": dict(resize=40, crop=32),
            "resize=150": dict(resize=150), "max_side=64": dict(max_side=64)}


def test_tree(root):
    """tests/test_pack_dali.py's tree: small JPEGs and a few modes."""
    from PIL import Image

    from fastread.datasets import make_imagenet_like

    if os.path.isdir(root):
        return root
    make_imagenet_like(root, classes=4, per_class=6, width=96, height=72, mean_kb=4, workers=1,
                       progress=False)
    cls = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    px = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    Image.fromarray(px[..., 0], "L").save(os.path.join(root, cls[0], "gray.png"))
    Image.fromarray(np.dstack([px, px[..., :1]]), "RGBA").save(os.path.join(root, cls[1], "rgba.png"))
    Image.fromarray(px).convert("P").save(os.path.join(root, cls[1], "pal.png"))
    Image.fromarray(px).convert("CMYK").save(os.path.join(root, cls[2], "cmyk.jpg"), quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(px).save(os.path.join(root, cls[3], "rot.jpg"), quality=95, exif=exif)
    return root


def variant_decoder(name, pre, threads):
    """A DaliDecoder for the variant `name`."""
    from fastread.decode_dali import DaliDecoder

    if name == "dali-cpu":
        return DaliDecoder(pre, device="cpu", batch_size=16, threads=threads)
    fancy = "simple" not in name
    hw = 0.0 if name.endswith("hw0") else 1.0

    class Variant(DaliDecoder):
        def decoder_args(self):
            return dict(device="mixed", jpeg_fancy_upsampling=fancy, hw_decoder_load=hw)

    return Variant(pre, device="gpu", batch_size=16, threads=threads, hw_decoder_load=hw)


def gpu_resize(pre, arrays, sizes):
    """CPU-decoded pixels resized and sliced on the GPU as the pack decoder
    does (DaliDecoder's resize and slice, after a copy to the GPU)."""
    from nvidia.dali import fn, pipeline_def, types

    from fastread.decode import crop_box

    @pipeline_def(batch_size=len(arrays), num_threads=2, device_id=0, exec_dynamic=True)
    def pipe():
        px = fn.external_source(name="px", dtype=types.UINT8, ndim=3, layout="HWC").gpu()
        w = fn.external_source(name="w", dtype=types.FLOAT, ndim=0)
        h = fn.external_source(name="h", dtype=types.FLOAT, ndim=0)
        out = fn.resize(px, resize_x=w, resize_y=h, interp_type=types.INTERP_LINEAR,
                        antialias=True)
        if pre.crop is not None:
            a = fn.external_source(name="a", dtype=types.INT32, ndim=1)
            out = fn.slice(out, start=a, shape=np.array([pre.crop, pre.crop], np.int32),
                           axis_names="HW")
        return out

    p = pipe()
    p.build()
    p.feed_input("px", arrays, layout="HWC")
    p.feed_input("w", [np.float32(w) for w, _ in sizes])
    p.feed_input("h", [np.float32(h) for _, h in sizes])
    if pre.crop is not None:
        p.feed_input("a", [np.array(crop_box(w, h, pre.crop)[::-1], np.int32) for w, h in sizes])
    out, = p.run()
    out = out.as_cpu()
    return [np.array(out.at(i)) for i in range(len(arrays))]


def compare(name, pre, paths, names, threads):
    """{"mean", "worst_image", "worst_mean", "max", "by_pillow"} of one variant."""
    from PIL import Image, ImageOps

    from fastread.decode import Preprocess, preprocess_file

    ref = [np.frombuffer(d, np.uint8).reshape(s) for d, s in (preprocess_file(p, pre) for p in paths)]
    if name == "gpu-resize":
        # DALI's CPU decoder at the source size, then the GPU's resize.
        full = variant_decoder("dali-cpu", Preprocess(), threads)
        src = [np.frombuffer(memoryview(d).cast("B"), np.uint8).reshape(s)
               for c in full.batches(paths) for d, s, _ in c]
        sizes = []
        for p in paths:
            with Image.open(p) as im:
                sizes.append(pre.target_size(*ImageOps.exif_transpose(im).size))
        got = gpu_resize(pre, src, sizes)
        by_pillow = []
    else:
        dec = variant_decoder(name, pre, threads)
        got = [np.frombuffer(memoryview(d).cast("B"), np.uint8).reshape(s)
               for c in dec.batches(paths) for d, s, _ in c]
        by_pillow = [names[j] for j in dec.by_pillow]
    means, worst = [], 0
    for r, g in zip(ref, got):
        d = np.abs(r.astype(np.int16) - g.astype(np.int16))
        means.append(float(d.mean()))
        worst = max(worst, int(d.max()))
    k = int(np.argmax(means))
    return {"mean": float(np.mean(means)), "worst_image": names[k], "worst_mean": means[k],
            "max": worst, "by_pillow": by_pillow, "per_image": means}


def header_facts(path, pre):
    """(subsampling, upright "WxH", EXIF orientation, progressive,
    downscale factor) of one file, from its header."""
    from PIL import Image

    from fastread.decode_dali import upright_size

    data = open(path, "rb").read()
    try:
        size = upright_size(data)
    except Exception as e:
        return (f"({type(e).__name__})", "-", "-", "-", "-")
    with Image.open(path) as im:
        orientation = im.getexif().get(0x0112, 1)
        fmt = im.format
        sampling = "-"
        if fmt == "JPEG":
            from PIL import JpegImagePlugin
            sampling = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}.get(
                JpegImagePlugin.get_sampling(im), "other") if len(im.layer) == 3 else \
                f"{len(im.layer)} comp."
        progressive = bool(im.info.get("progressive") or im.info.get("progression"))
    t = pre.target_size(*size)
    factor = min(size[0] / t[0], size[1] / t[1])
    return (sampling if fmt == "JPEG" else fmt, f"{size[0]}x{size[1]}", orientation,
            progressive, round(factor, 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=None, help="a tree to compare (default: the tests' tree)")
    ap.add_argument("--variants", default=None, help="comma-separated (default: those that run)")
    ap.add_argument("--settings", default=";".join(SETTINGS), help="semicolon-separated")
    ap.add_argument("--limit", type=int, default=400, help="files at most (the first ones)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import fastread
    from fastread.decode import Preprocess, _dali_gpus

    tree = args.tree or test_tree(os.path.join(tempfile.gettempdir(), "fastread-gpu-pixels",
                                               "train"))
    paths = fastread.scan(tree)[0][:args.limit]
    names = [os.path.relpath(p, tree) for p in paths]
    _, gpus, why = _dali_gpus()
    variants = args.variants.split(",") if args.variants else \
        ["dali-cpu"] + (["gpu", "gpu-simple", "gpu-hw0", "gpu-simple-hw0", "gpu-resize"]
                        if gpus else [])
    print(f"tree {tree}: {len(paths)} files; GPU: {gpus or why}", flush=True)
    table = {}
    print("| variant | setting | mean | worst image (mean) | largest | decoded by Pillow |")
    print("|---|---|---:|---|---:|---|")
    for setting in args.settings.split(";"):
        pre = Preprocess(**SETTINGS[setting])
        for v in variants:
            try:
                r = compare(v, pre, paths, names, args.threads)
            except Exception as e:   # a variant that cannot run here: say so, go on
                print(f"| {v} | {setting} | - | {type(e).__name__}: {str(e).splitlines()[0][:80]} | - | - |")
                continue
            table[f"{v} {setting}"] = r
            print(f"| {v} | {setting} | {r['mean']:.3f} | {r['worst_image']} "
                  f"({r['worst_mean']:.2f}) | {r['max']} | {len(r['by_pillow'])} |", flush=True)
    per = [v for v in variants if v != "gpu-resize"]
    print()
    print("| setting | image | subsampling | size | orientation | progressive | factor | "
          + " | ".join(per) + " |")
    print("|---|---|---|---|---:|---|---:|" + "---:|" * len(per))
    for setting in args.settings.split(";"):
        pre = Preprocess(**SETTINGS[setting])
        for i, (p, n) in enumerate(zip(paths, names)):
            facts = header_facts(p, pre)
            table.setdefault("per_image", {}).setdefault(setting, {})[n] = {
                "facts": list(facts), **{v: table[f"{v} {setting}"]["per_image"][i]
                                         for v in per if f"{v} {setting}" in table}}
            print(f"| {setting} | {n} | " + " | ".join(str(x) for x in facts) + " | "
                  + " | ".join(f"{table[f'{v} {setting}']['per_image'][i]:.2f}"
                               if f"{v} {setting}" in table else "-" for v in per) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tree": tree, "files": len(paths), "results": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
