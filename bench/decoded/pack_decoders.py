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

GPU variants: ``dali-gpu`` is the pack's decoder as it stands
(fastread.decode_dali's defaults); ``dali-gpu-depth4``/``-depth8`` with 4 or
8 pipeline runs in flight (decode_dali.DEPTH, default 2);
``dali-gpu-simple`` every image on nvJPEG's own upsampling (the hardware
decoder for every JPEG it takes); ``-hw0``/``-hw65`` the hardware share,
``-gpuhuff`` Huffman decoding on the GPU.

Each round also times each decoder alone, its batches consumed and nothing
written ("decode only": Pillow's process pool, DaliDecoder's threads; with
the seconds to its first batch, the fixed start a pack of this size pays:
pipeline build, CUDA and nvJPEG set-up, and the rate after it), and
the run times writing the last pack's bytes to --out-dir with an fsync (the
sink's ceiling): a pack near that ceiling is bound by the disk, not the
decoder. With --tests-log (pytest's output of tests/test_pack_dali.py on
this machine) the run ends with a verdict table: the GPU cases pass, the GPU
pack's pixels within the tests' bound, and its speed against the target
(--target, default 3x Pillow), the measurements decode.AUTO_USES_DALI_GPU
waits for.

    flock /tmp/fastread-bench.lock python bench/decoded/pack_decoders.py \\
        [--tree DIR | --dir /var/tmp/fastread-packdecoders --images 2000 --classes 10] \\
        [--out-dir /dev/shm/packs] \\
        [--resize 160] [--crop 160] [--encode raw|jpeg] [--batch-size 256] \\
        [--rounds 3] [--decoders pillow,dali-cpu,dali-gpu[,dali-gpu-depth4,dali-gpu-depth8,dali-gpu-hw0,dali-gpu-hw65,dali-gpu-simple,dali-gpu-gpuhuff[-simple]]] \\
        [--json OUT.json] \\
        [--tests-log test_pack_dali.log] [--target 3]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=None, help="an existing JPEG tree (default: make one)")
    ap.add_argument("--dir", default="/var/tmp/fastread-packdecoders",
                    help="where the generated tree and the packs go")
    ap.add_argument("--out-dir", default=None,
                    help="where the packs are written (default: --dir); a RAM file system "
                         "(/dev/shm) times the decoders rather than the disk")
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
    ap.add_argument("--tests-log", default=None,
                    help="pytest's output of tests/test_pack_dali.py here: adds the verdict")
    ap.add_argument("--target", type=float, default=3.0,
                    help="the GPU pack's speed target, times Pillow's (verdict)")
    ap.add_argument("--no-decode-only", action="store_true",
                    help="time the packs only, not the decoders alone")
    args = ap.parse_args()

    import numpy as np

    import fastread
    from fastread import decode_dali
    from fastread.decode import _dali_gpus
    from fastread.datasets import make_imagenet_like

    if args.tree:
        tree = args.tree
    else:
        tree = os.path.join(args.dir, "train")
        make_imagenet_like(tree, classes=args.classes, per_class=args.images // args.classes,
                           progress=False)
    os.makedirs(args.dir, exist_ok=True)
    out_dir = args.out_dir or args.dir
    os.makedirs(out_dir, exist_ok=True)
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
    # GPU variants by the mixed decoder's hardware share (dali-gpu-hw0: all
    # of it on nvJPEG's CUDA decoder; dali-gpu-hw65: DALI's default 0.65),
    # to measure decode_dali.HW_DECODER_LOAD's choice against the others.
    # pack() takes the module's constant, so it is set around each run.
    hw_loads = {"dali-gpu-hw0": 0.0, "dali-gpu-hw65": 0.65}
    # dali-gpu-simple: nvJPEG's own chroma upsampling (FANCY_UPSAMPLING off),
    # which lets the hardware decoder run: its speed, and its pixels' distance.
    simple = {"dali-gpu-simple"}
    # dali-gpu-gpuhuff: no hardware share and hybrid_huffman_threshold 0, so
    # nvJPEG's GPU-hybrid backend decodes Huffman on the GPU for every image
    # (DALI's default threshold leaves ~100 KB JPEGs on the host's threads);
    # -simple: the same with nvJPEG's own chroma upsampling.
    gpu_huffman = {"dali-gpu-gpuhuff", "dali-gpu-gpuhuff-simple"}
    hw_loads.update({n: 0.0 for n in gpu_huffman})
    simple.add("dali-gpu-gpuhuff-simple")
    # Runs in flight (decode_dali.DEPTH; IN_FLIGHT follows it), by variant.
    depths = {"dali-gpu-depth4": 4, "dali-gpu-depth8": 8}
    for n in list(hw_loads) + list(simple) + list(depths):
        settings[n] = settings["dali-gpu"]
    for n in names:
        if n not in settings:
            ap.error(f"--decoders: unknown {n!r}; choose from {', '.join(settings)}")
    opts = dict(decode=True, resize=args.resize, crop=args.crop or None, encode=args.encode,
                batch_size=args.batch_size, decode_workers=args.workers, progress=False)
    print(f"tree {tree}: {len(paths)} JPEGs, {src_bytes / len(paths) / 1e3:.0f} KB each; "
          f"{os.cpu_count()} CPUs; {opts}; GPU: {gpus or why_not}", flush=True)

    from fastread.decode import Preprocess, choose_decoder, decoded_batches
    from fastread.decode_dali import DaliDecoder

    default_hw = decode_dali.HW_DECODER_LOAD
    default_depth = decode_dali.DEPTH

    def set_depth(n):
        decode_dali.DEPTH = depths.get(n, default_depth)
        decode_dali.IN_FLIGHT = decode_dali.DEPTH + 2

    pre = Preprocess(resize=args.resize, crop=args.crop or None, encode=args.encode)

    def decode_only(n):
        """Seconds to decode the tree with decoder `n`, writing nothing."""
        choice = choose_decoder(**{{"decoder": "decoder", "decode_device": "device"}[k]: v
                                   for k, v in settings[n].items()})
        t0 = time.perf_counter()
        if choice.name == "pillow":
            batches = decoded_batches(paths, pre, workers=args.workers)
        else:
            dec = DaliDecoder(pre, device=choice.device, batch_size=args.batch_size,
                              threads=args.workers, hw_decoder_load=hw_loads.get(n),
                              fancy_upsampling=n not in simple,
                              hybrid_huffman_threshold=0 if n in gpu_huffman else None)
            batches = dec.batches(paths)
            builds[n] = dec.build_seconds
            decoders[n] = dec
        count, first = 0, None
        for b in batches:
            if first is None:   # the fixed start: pipeline build, device and decoder init
                first, first_len = time.perf_counter() - t0, len(b)
            count += len(b)
        assert count == len(paths)
        starts[n].append((first, first_len))
        return time.perf_counter() - t0

    times = {n: [] for n in names}
    alone = {n: [] for n in names}
    starts = {n: [] for n in names}   # decode only: seconds to the first batch
    builds = {}   # decode only: the last DaliDecoder's pipeline build seconds
    decoders = {}   # decode only: the last DaliDecoder (its seconds per step)
    outs = {}
    failed = set()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            if n in failed:
                continue
            out = os.path.join(out_dir, f"bench-{n}.img")
            decode_dali.HW_DECODER_LOAD = hw_loads.get(n, default_hw)
            decode_dali.FANCY_UPSAMPLING = n not in simple
            decode_dali.HYBRID_HUFFMAN_THRESHOLD = 0 if n in gpu_huffman else None
            set_depth(n)
            t0 = time.perf_counter()
            try:
                img = fastread.pack(tree, out, **settings[n], **opts)
            except Exception as e:   # one variant that cannot run: say so, the others go on
                print(f"round {r} {n}: FAILED ({type(e).__name__}: "
                      f"{(str(e).strip().splitlines() or ['?'])[-1][:200]}); left out", flush=True)
                failed.add(n)
                continue
            finally:
                decode_dali.HW_DECODER_LOAD, decode_dali.FANCY_UPSAMPLING = default_hw, True
                decode_dali.HYBRID_HUFFMAN_THRESHOLD = None
                set_depth(None)
            dt = time.perf_counter() - t0
            times[n].append(dt)
            outs[n] = out
            print(f"round {r} {n}: {dt:.2f} s, {len(paths) / dt:.0f} img/s "
                  f"(decoder {img.preprocess['decoder']}, {len(img)} samples, "
                  f"{len(img.skipped)} skipped)", flush=True)
            if not args.no_decode_only:
                try:
                    set_depth(n)
                    alone[n].append(decode_only(n))
                except Exception as e:
                    print(f"round {r} {n} decode only: FAILED ({type(e).__name__}: "
                          f"{(str(e).strip().splitlines() or ['?'])[-1][:200]})", flush=True)
                    continue
                finally:
                    set_depth(None)
                first, first_len = starts[n][-1]
                rest = alone[n][-1] - first
                build = (f", of which the pipeline's build {builds[n][0]:.2f} s"
                         if builds.get(n) else "")
                if n in decoders:
                    build += "; seconds per step: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in decoders[n].seconds.items())

                print(f"round {r} {n} decode only: {len(paths) / alone[n][-1]:.0f} img/s "
                      f"(first batch after {first:.2f} s{build}; the rest at "
                      f"{(len(paths) - first_len) / rest if rest > 0 else 0:.0f} img/s)",
                      flush=True)
    sink = sink_rate(out_dir, os.path.getsize(next(iter(outs.values()))))
    print(f"writing {out_dir} (+ fsync): {sink / 1e6:.0f} MB/s, "
          f"{sink / (os.path.getsize(next(iter(outs.values()))) / len(paths)):.0f} samples/s "
          "of these packs at most", flush=True)

    names = [n for n in names if n not in failed]
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
                     "rounds_img_per_s": [len(paths) / t for t in times[n]],
                     "decode_only_img_per_s": (len(paths) / statistics.median(alone[n])
                                               if alone[n] else None),
                     "decode_only_first_batch_s": (statistics.median(f for f, _ in starts[n])
                                                   if starts[n] else None)})

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

    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print()
    print("| decoder | img/s (median) | vs Pillow (medians) | vs Pillow per round (median; "
          "each) | rounds (img/s) | decode only (img/s) |")
    print("|---|---:|---:|---|---|---:|")
    for row in rows:
        vs = f"{row['vs_pillow']:.2f}x" if row["vs_pillow"] else "-"
        paired = (f"{row['vs_pillow_per_round_median']:.2f}x ("
                  + ", ".join(f"{x:.2f}" for x in row["vs_pillow_per_round"]) + ")"
                  if row["vs_pillow_per_round"] else "-")
        only = f"{row['decode_only_img_per_s']:.0f}" if row["decode_only_img_per_s"] else "-"
        print(f"| {row['decoder']} | {row['img_per_s']:.0f} | {vs} | {paired} | "
              f"{', '.join(f'{x:.0f}' for x in row['rounds_img_per_s'])} | {only} |")
    print(f"(this process's peak RSS: {peak_rss:.0f} MB; Pillow decodes in child processes)")
    verdict = None
    if args.tests_log:
        verdict = verdict_rows(args.tests_log, rows, agreement, args.target)
        print()
        print("| check | target | measured | verdict |")
        print("|---|---|---|---|")
        for check, target, measured, ok in verdict:
            print(f"| {check} | {target} | {measured} | {ok} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tree": tree, "out_dir": out_dir, "images": len(paths), "source_bytes": src_bytes,
                       "cpus": os.cpu_count(), "options": {k: v for k, v in opts.items()},
                       "rows": rows, "agreement": agreement, "sink_bytes_per_s": sink,
                       "peak_rss_mb": peak_rss, "verdict": verdict}, f, indent=1)
    return 0


def sink_rate(directory, nbytes):
    """Bytes/s of writing `nbytes` (8 MiB at a time) to a new file in
    `directory` and fsync'ing it: what a pack's writes can reach there."""
    path = os.path.join(directory, f".sink-probe-{os.getpid()}")
    block = os.urandom(1 << 20) * 8
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, block[:min(left, len(block))])
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)
    return nbytes / (time.perf_counter() - t0)


def verdict_rows(log, rows, agreement, target):
    """(check, target, measured, PASS/FAIL/-) rows: the GPU cases of the
    tests, the GPU pack's pixels and its speed."""
    import re

    from fastread.decode import AUTO_USES_DALI_GPU

    text = open(log, errors="replace").read()
    gpu_cases = re.findall(r"::(test_gpu_\S+) (PASSED|FAILED|SKIPPED|ERROR)", text)
    failed = [n for n, st in gpu_cases if st in ("FAILED", "ERROR")]
    passed = [n for n, st in gpu_cases if st == "PASSED"]
    out = [("GPU cases of tests/test_pack_dali.py", "all pass",
            f"{len(passed)} passed, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""),
            "PASS" if passed and not failed else "FAIL")]
    gpu = agreement.get("dali-gpu")
    if gpu:
        out.append(("GPU pack vs Pillow, worst image's mean difference", "<= 2.0 levels "
                    "(MEAN_GPU)", f"{gpu['worst_image_mean']:.3f} (all: {gpu['mean']:.3f}, "
                    f"largest {gpu['max']})", "PASS" if gpu["worst_image_mean"] <= 2.0 else "FAIL"))
    row = next((r for r in rows if r["decoder"] == "dali-gpu"), None)
    if row and row["vs_pillow_per_round_median"]:
        speed = row["vs_pillow_per_round_median"]
        out.append(("GPU pack rate vs Pillow's (per round, median)", f">= {target:g}x",
                    f"{speed:.2f}x ({row['img_per_s']:.0f} img/s)",
                    "PASS" if speed >= target else "FAIL"))
    ok = all(v == "PASS" for *_, v in out) and len(out) == 3
    out.append(("decode.AUTO_USES_DALI_GPU", "True once all the above pass",
                str(AUTO_USES_DALI_GPU), "may be switched on" if ok and not AUTO_USES_DALI_GPU
                else "-"))
    return out


if __name__ == "__main__":
    sys.exit(main())
