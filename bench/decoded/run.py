"""Decode once against decoding every epoch, on the CPU (issue 33).

Makes (or reuses) an ImageNet-like JPEG tree (``fastread make-dataset``),
packs it three ways with ``fastread pack --decode`` (the packs of
``fastread.bench.families.decoded.PACKS``: raw pixels at shorter side 160,
the same center-cropped to 160 x 160, JPEG q90 at max side 256), timing each
pack, then runs the ``decoded`` family of ``fastread bench`` on the tree:
DALI's ``fn.readers.file`` + CPU decoder against fastread's packs, the same
augmentation after each. Prints one table (img/s of the training pipeline,
bytes on disk per image, pack time and throughput) and writes it as JSON.

    flock /tmp/fastread-bench.lock python bench/decoded/run.py \
        [--dir /var/tmp/fastread-decoded] [--images 3000] [--classes 10] \
        [--batch-size 64] [--threads 2] [--epochs 1] [--repeat 3] [--json OUT.json]

Packs are written once per tree and settings (delete them to pack again;
--repack forces it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/fastread-decoded")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="DALI num_threads")
    ap.add_argument("--decode-workers", type=int, default=None,
                    help="pack's decoding processes (default: one per CPU)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repack", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import fastread
    from fastread.bench.families.decoded import PACKS, pack_path
    from fastread.datasets import make_imagenet_like

    tree = os.path.join(args.dir, "train")
    os.makedirs(args.dir, exist_ok=True)
    make_imagenet_like(tree, classes=args.classes, per_class=args.images // args.classes,
                       progress=False)
    paths, _ = fastread.scan(tree)
    src_bytes = sum(os.path.getsize(p) for p in paths)
    packs = {}
    for name, opts in PACKS.items():
        out = pack_path(tree, name)
        t0 = time.perf_counter()
        if args.repack or not os.path.exists(out):
            img = fastread.pack(tree, out, decode=True, decode_workers=args.decode_workers,
                                progress=False, **opts)
            seconds = time.perf_counter() - t0
        else:
            img, seconds = fastread.PackedImage(out), None
        packs[name] = {
            "options": opts, "samples": len(img), "skipped": len(img.skipped),
            "data_bytes_per_image": int(img.lengths.sum()) / len(img),
            "disk_bytes_per_image": img.image_size / len(img),
            "pack_seconds": seconds,
            "pack_img_per_s": len(paths) / seconds if seconds else None,
            "pack_source_mb_per_s": src_bytes / 1e6 / seconds if seconds else None,
        }
        print(f"pack {name}: {json.dumps(packs[name])}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [sys.executable, "-m", "fastread.cli", "bench", tree, "--modes", "decoded-*",
               "--device", "cpu", "--cache", "warm", "--batch-size", str(args.batch_size),
               "--threads", str(args.threads), "--epochs", str(args.epochs),
               "--repeat", str(args.repeat), "--json", out]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        with open(out) as f:
            bench = json.load(f)
    results = [r for r in bench.get("results", []) if r.get("img_per_s")]
    base = next((r["img_per_s"] for r in results
                 if r["mode"] == "decoded-dali-file-decode"), None)
    rows = []
    for r in results:
        pack = r["mode"].replace("decoded-dali-", "")
        p = packs.get(pack, {})
        rows.append({
            "mode": r["mode"], "what": r["what"], "img_per_s": r["img_per_s"],
            "vs_baseline": r["img_per_s"] / base if base else None,
            "disk_bytes_per_image": p.get("disk_bytes_per_image", src_bytes / len(paths)),
            "data_bytes_per_image": p.get("data_bytes_per_image", src_bytes / len(paths)),
            "pack_seconds": p.get("pack_seconds"), "pack_img_per_s": p.get("pack_img_per_s"),
        })
    print()
    print("| mode | pipeline | img/s | vs baseline | bytes/image on disk (data) | pack s | "
          "pack img/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        print(f"| {row['mode']} | {row['what']} | {row['img_per_s']:.0f} | "
              f"{f(row['vs_baseline'], '.2f')}x | {row['disk_bytes_per_image']:,.0f} "
              f"({row['data_bytes_per_image']:,.0f}) | {f(row['pack_seconds'], '.1f')} | "
              f"{f(row['pack_img_per_s'], '.0f')} |")
    doc = {"images": len(paths), "source_bytes_per_image": src_bytes / len(paths),
           "cpus": os.cpu_count(), "batch_size": args.batch_size, "threads": args.threads,
           "packs": packs, "rows": rows, "bench": bench}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
