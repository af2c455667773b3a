"""Packing speed of the decoders of ``fastread pack --decode`` (issue 33):
Pillow (a process per CPU) against DALI's ``fn.decoders.image`` on the CPU
(nvImageCodec's libjpeg-turbo, DALI's threads) and, where a CUDA GPU is
present, on the GPU (``device="mixed"``: nvJPEG), over one JPEG tree.

One run, interleaved rounds: each round packs the tree once per decoder, the
order rotating from round to round, so drift on a shared machine (other
builds, page cache) spreads over all of them; the table gives each
decoder's median images/s, its ratio to Pillow's median, and the median of
its per-round ratios to Pillow's pack of the same round (side by side).
The tree is read once first (warm page cache: the decoders are compared,
not the disk). Afterwards the last DALI pack is compared with the last
Pillow pack pixel by pixel (mean absolute difference per image, the worst
image's, and the largest single difference), the numbers the tests'
tolerance (tests/test_pack_dali.py) stands on.

    flock /tmp/fastread-bench.lock python bench/decoded/pack_decoders.py \\
        [--tree DIR | --dir /var/tmp/fastread-packdecoders --images 2000 --classes 10] \\
        [--resize 160] [--crop 160] [--encode raw|jpeg] [--batch-size 256] \\
        [--rounds 3] [--decoders pillow,dali-cpu,dali-gpu] [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=None, help="an existing JPEG tree (default: make one)")
    ap.add_argument("--dir", default="/var/tmp/fastread-packdecoders",
                    help="where the generated tree and the packs go")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--resize", type=int, default=160)
    ap.add_argument("--crop", type=int, default=160, help="0: no crop")
    ap.add_argument("--encode", choices=("raw", "jpeg"), default="raw")
    ap.add_argument("--batch-size", type=int, default=256,
                    help="files per DALI pipeline run (pack's --batch-size)")
    ap.add_argument("--workers", type=int, default=None,
                    help="Pillow processes / DALI threads (default: one per CPU)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decoders", default=None,
                    help="comma-separated of pillow, dali-cpu, dali-gpu (default: those "
                         "that run here)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np

    import fastread
    from fastread.decode import _dali_gpus
    from fastread.datasets import make_imagenet_like

    if args.tree:
        tree = args.tree
    else:
        tree = os.path.join(args.dir, "train")
        make_imagenet_like(tree, classes=args.classes, per_class=args.images // args.classes,
                           progress=False)
    os.makedirs(args.dir, exist_ok=True)
    paths, _ = fastread.scan(tree)
    src_bytes = 0
    for p in paths:   # warm the page cache: the decoders are compared, not the disk
        with open(p, "rb") as f:
            src_bytes += len(f.read())

    backend, gpus, why_not = _dali_gpus()
    if args.decoders:
        names = args.decoders.split(",")
    else:
        names = ["pillow"] + (["dali-cpu"] if backend is not None else []) + \
            (["dali-gpu"] if gpus else [])
    settings = {"pillow": dict(decoder="pillow"),
                "dali-cpu": dict(decoder="dali", decode_device="cpu"),
                "dali-gpu": dict(decoder="dali", decode_device="gpu")}
    for n in names:
        if n not in settings:
            ap.error(f"--decoders: unknown {n!r}; choose from {', '.join(settings)}")
    opts = dict(decode=True, resize=args.resize, crop=args.crop or None, encode=args.encode,
                batch_size=args.batch_size, decode_workers=args.workers, progress=False)
    print(f"tree {tree}: {len(paths)} JPEGs, {src_bytes / len(paths) / 1e3:.0f} KB each; "
          f"{os.cpu_count()} CPUs; {opts}; GPU: {gpus or why_not}", flush=True)

    times = {n: [] for n in names}
    outs = {}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            out = os.path.join(args.dir, f"bench-{n}.img")
            t0 = time.perf_counter()
            img = fastread.pack(tree, out, **settings[n], **opts)
            dt = time.perf_counter() - t0
            times[n].append(dt)
            outs[n] = out
            print(f"round {r} {n}: {dt:.2f} s, {len(paths) / dt:.0f} img/s "
                  f"(decoder {img.preprocess['decoder']}, {len(img)} samples, "
                  f"{len(img.skipped)} skipped)", flush=True)

    rows = []
    base = len(paths) / statistics.median(times["pillow"]) if "pillow" in times else None
    for n in names:
        rate = len(paths) / statistics.median(times[n])
        # Each round's ratio to Pillow's pack of the same round: the
        # side-by-side measure, steadier than the ratio of medians when the
        # machine's load drifts.
        paired = ([p / t for p, t in zip(times["pillow"], times[n])]
                  if "pillow" in times else [])
        rows.append({"decoder": n, "img_per_s": rate, "vs_pillow": rate / base if base else None,
                     "vs_pillow_per_round": paired,
                     "vs_pillow_per_round_median": statistics.median(paired) if paired else None,
                     "rounds_img_per_s": [len(paths) / t for t in times[n]]})

    agreement = {}
    if "pillow" in outs and args.encode == "raw":
        ref = fastread.PackedImage(outs["pillow"])
        ref_px = [ref.pixels(a, i) for i, a in enumerate(ref.read(np.arange(len(ref))))]
        for n in names:
            if n == "pillow":
                continue
            img = fastread.PackedImage(outs[n])
            assert img.names == ref.names and (img.shapes == ref.shapes).all()
            means, worst = [], 0
            for i, a in enumerate(img.read(np.arange(len(img)))):
                d = np.abs(img.pixels(a, i).astype(np.int16) - ref_px[i])
                means.append(float(d.mean()))
                worst = max(worst, int(d.max()))
            agreement[n] = {"mean": float(np.mean(means)), "worst_image_mean": max(means),
                            "max": worst,
                            "p999": float(np.percentile(means, 99.9))}
            print(f"{n} vs pillow: mean abs diff {agreement[n]['mean']:.3f} levels, worst "
                  f"image {agreement[n]['worst_image_mean']:.3f}, largest single "
                  f"difference {worst}", flush=True)

    print()
    print("| decoder | img/s (median) | vs Pillow (medians) | vs Pillow per round (median; "
          "each) | rounds (img/s) |")
    print("|---|---:|---:|---|---|")
    for row in rows:
        vs = f"{row['vs_pillow']:.2f}x" if row["vs_pillow"] else "-"
        paired = (f"{row['vs_pillow_per_round_median']:.2f}x ("
                  + ", ".join(f"{x:.2f}" for x in row["vs_pillow_per_round"]) + ")"
                  if row["vs_pillow_per_round"] else "-")
        print(f"| {row['decoder']} | {row['img_per_s']:.0f} | {vs} | {paired} | "
              f"{', '.join(f'{x:.0f}' for x in row['rounds_img_per_s'])} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tree": tree, "images": len(paths), "source_bytes": src_bytes,
                       "cpus": os.cpu_count(), "options": {k: v for k, v in opts.items()},
                       "rows": rows, "agreement": agreement}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
