"""How far DALI's mixed decoder with nvJPEG's own chroma upsampling
(``jpeg_fancy_upsampling=False``: each chroma sample replicated) parts from
Pillow's pixels, per chroma subsampling, content and downscale factor, with
the fancy upsampling (libjpeg's interpolation, the pack's) beside it as the
control (issue 39: the table a per-image rule "nvJPEG's upsampling where it
stays within the tests' bound" would stand on; docs/decoded.md).

Sources (made here, in memory): ``--images`` ImageNet-like JPEGs
(fastread.datasets.make_imagenet_like, 500x375) and as many noise images
(uniform random RGB, 256x192: the worst case for chroma, whose every sample
differs from its neighbours), each saved by Pillow at 4:4:4, 4:2:2 and 4:2:0
(quality 90; the ImageNet-like ones re-encoded from their decoded pixels)
and as greyscale. Each is resized by DALI (fastread.decode_dali.DaliDecoder:
the pack's decoder, fed target sizes directly) and by Pillow (the pack's
reference: ``Image.resize(size, BILINEAR)``) to source / f on both axes for
f in ``--factors``. Per (content, subsampling, factor, route) the mean of the
per-image mean absolute differences, the worst image's, and the largest
single difference. Last, per subsampling, the least factor from which every
larger factor's worst image is within ``--bound`` levels (default 1.0: half
the tests' MEAN_GPU of 2.0), per content and on both.

    python bench/decoded/hw_rule.py [--images 16] [--factors 0.5,1,1.25,...] [--json OUT]
"""
import argparse
import io
import json
import os
import sys
import tempfile
import time

import numpy as np

FACTORS = (0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
SAMPLINGS = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2, "gray": None}


def sources(n, seed=0):
    """{(content, subsampling): [JPEG bytes]}."""
    from PIL import Image

    import fastread
    from fastread.datasets import make_imagenet_like

    root = os.path.join(tempfile.gettempdir(), "fastread-hw-rule", "train")
    make_imagenet_like(root, classes=1, per_class=n, seed=seed, progress=False)
    base = {"imagenet": [], "noise": []}
    for p in fastread.scan(root)[0][:n]:
        with Image.open(p) as im:
            base["imagenet"].append(im.convert("RGB"))
    rng = np.random.default_rng(seed)
    for _ in range(n):
        base["noise"].append(Image.fromarray(rng.integers(0, 256, (192, 256, 3), np.uint8)))
    out = {}
    for content, images in base.items():
        q = 95 if content == "noise" else 90
        for name, sub in SAMPLINGS.items():
            files = []
            for im in images:
                buf = io.BytesIO()
                if sub is None:
                    im.convert("L").save(buf, "JPEG", quality=q)
                else:
                    im.save(buf, "JPEG", quality=q, subsampling=sub)
                files.append(buf.getvalue())
            out[(content, name)] = files
    return out


def pillow(data, size):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as src:
        img = src.convert("RGB")
    if size != img.size:
        img = img.resize(size, Image.BILINEAR)
    return np.asarray(img, dtype=np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16, help="images per content")
    ap.add_argument("--factors", default=",".join(str(f) for f in FACTORS))
    ap.add_argument("--bound", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--device", default="gpu", help="cpu: a smoke test of this script alone")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    factors = [float(f) for f in args.factors.split(",")]

    from PIL import Image, JpegImagePlugin

    from fastread.decode import Preprocess
    from fastread.decode_dali import DaliDecoder

    t0 = time.perf_counter()
    src = sources(args.images)
    print(f"sources: {sum(len(v) for v in src.values())} JPEGs in {time.perf_counter() - t0:.1f} s; "
          f"factors {factors}", flush=True)
    routes = {"simple": DaliDecoder(Preprocess(), device=args.device, batch_size=256,
                                    threads=args.threads, fancy_upsampling=False,
                                    hw_decoder_load=1.0),
              "fancy": DaliDecoder(Preprocess(), device=args.device, batch_size=256,
                                   threads=args.threads, hw_decoder_load=1.0)}
    rows = []
    print("| content | subsampling | factor | route | mean | worst image | largest |")
    print("|---|---|---:|---|---:|---:|---:|")
    for (content, sampling), files in src.items():
        with Image.open(io.BytesIO(files[0])) as im:
            w, h = im.size
            got = "gray" if len(im.layer) == 1 else \
                {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}.get(JpegImagePlugin.get_sampling(im))
        assert got == sampling, (got, sampling)
        jobs = []
        for f in factors:
            for d in files:
                jobs.append((f, d, (max(1, int(w / f)), max(1, int(h / f)))))
        refs = [pillow(d, s) for _, d, s in jobs]
        for route, dec in routes.items():
            got = []
            for i in range(0, len(jobs), 256):
                part = jobs[i:i + 256]
                got += [px for px, _ in dec._run([np.frombuffer(d, np.uint8) for _, d, _ in part],
                                                 [s for _, _, s in part])]
            for f in factors:
                ds = [np.abs(r.astype(np.int16) - g.astype(np.int16))
                      for (jf, _, _), r, g in zip(jobs, refs, got) if jf == f]
                means = [float(d.mean()) for d in ds]
                row = {"content": content, "subsampling": sampling, "factor": f, "route": route,
                       "mean": float(np.mean(means)), "worst_image": max(means),
                       "max": max(int(d.max()) for d in ds)}
                rows.append(row)
                print(f"| {content} | {sampling} | {f:g} | {route} | {row['mean']:.3f} | "
                      f"{row['worst_image']:.3f} | {row['max']} |", flush=True)
    print()
    print(f"least factor from which nvJPEG's upsampling's worst image is <= {args.bound} "
          "levels at every larger factor measured:")
    rule = {}
    for contents in (("imagenet",), ("noise",), ("imagenet", "noise")):
        key = "+".join(contents)
        rule[key] = {}
        for sampling in SAMPLINGS:
            ok = None
            for f in sorted(factors, reverse=True):
                worst = max(r["worst_image"] for r in rows if r["subsampling"] == sampling
                            and r["route"] == "simple" and r["factor"] == f
                            and r["content"] in contents)
                if worst > args.bound:
                    break
                ok = f
            rule[key][sampling] = ok
        print(f"  {key}: " + ", ".join(f"{k} {'none' if v is None else v}"
                                       for k, v in rule[key].items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"images": args.images, "factors": factors, "bound": args.bound,
                       "rows": rows, "least_factor": rule}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
