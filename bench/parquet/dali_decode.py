"""Issue 40's DALI row: the same JPEGs as Parquet rows and as files, each
read into a DALI pipeline and decoded there (``fn.decoders.image``,
``device="mixed"`` on a GPU: nvJPEG; ``--decode-device cpu`` without one),
in interleaved rounds so that drift on a shared machine hurts every mode
alike. Target: ``readers.parquet`` within 10% of ``readers.file`` on the
same images (the verdict line, per-round ratios' median).

Modes (each builds its pipeline, runs ``--warmup`` untimed batches, then
``--batches`` timed ones, or one epoch if 0):

  parquet          fastread.dali.readers.parquet(paths=DATA) + decode
  file             fastread.dali.readers.file(file_root=TREE) + decode (the reference)
  fn.readers.file  DALI's own fn.readers.file + decode (context)

    python bench/parquet/dali_decode.py --tree TREE [--parquet DIR] [--batch 256]
        [--threads 8] [--rounds 3] [--decode-device mixed|cpu] [--json OUT]

Without ``--parquet`` the tree is written as Hub-style Parquet first
(:func:`fastread.formats.parquet_write.write_image_parquet`, row groups of
1,000 rows) under ``TREE.parquet``; the files are read once before the
rounds (warm page cache: the readers and the decoder are compared, not the
disk).
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", required=True, help="a class tree of JPEGs")
    ap.add_argument("--parquet", default=None, help="the same images as Parquet (default: "
                    "written to TREE.parquet)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batches", type=int, default=0, help="timed batches per round (0: an epoch)")
    ap.add_argument("--decode-device", choices=("mixed", "cpu"), default="mixed")
    ap.add_argument("--modes", default="parquet,file,fn.readers.file")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from nvidia.dali import fn, pipeline_def, types

    import fastread
    from fastread.dali import readers
    from fastread.formats.parquet_write import write_image_parquet

    tree = os.path.abspath(args.tree)
    pq_dir = args.parquet or tree.rstrip("/") + ".parquet"
    if args.parquet is None and not os.path.isdir(os.path.join(pq_dir, "data")):
        t0 = time.perf_counter()
        write_image_parquet(tree, pq_dir, rows_per_group=1000,
                            files=max(1, len(fastread.scan(tree)[0]) // 2500))
        print(f"wrote {pq_dir} in {time.perf_counter() - t0:.1f} s", flush=True)
    paths, _ = fastread.scan(tree)
    n = len(paths)
    nbytes = 0
    for p in paths:   # warm
        with open(p, "rb") as f:
            nbytes += len(f.read())
    for root, _, names in os.walk(pq_dir):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 24):
                    pass
    gpu = args.decode_device == "mixed"
    device_id = 0 if gpu else None

    def make(mode):
        @pipeline_def(batch_size=args.batch, num_threads=args.threads, device_id=device_id,
                      prefetch_queue_depth=2)
        def pipe():
            if mode == "parquet":
                data, label = readers.parquet(paths=pq_dir, name="r")
            elif mode == "file":
                data, label = readers.file(file_root=tree, name="r")
            else:
                data, label = fn.readers.file(file_root=tree, name="r")
            images = fn.decoders.image(data, device=args.decode_device, output_type=types.RGB)
            return images, label

        p = pipe()
        p.build()
        return p

    modes = args.modes.split(",")
    batches = args.batches or -(-n // args.batch)
    rates = {m: [] for m in modes}
    print(f"tree {tree}: {n} JPEGs, {nbytes / n / 1e3:.0f} KB each; parquet {pq_dir}; "
          f"batch {args.batch}, {args.threads} threads, decode {args.decode_device}, "
          f"{batches} timed batches a round", flush=True)
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            p = make(m)
            try:
                for _ in range(args.warmup):
                    p.run()
                t0 = time.perf_counter()
                for _ in range(batches):
                    out = p.run()
                if gpu:   # the last batch's pixels are there: DALI's work is done
                    out[0].as_cpu()
                dt = time.perf_counter() - t0
            finally:
                del p
            rates[m].append(batches * args.batch / dt)
            print(f"round {r} {m}: {rates[m][-1]:.0f} img/s", flush=True)
    ref = "file" if "file" in rates else modes[0]
    print()
    print(f"| mode | img/s (median) | vs {ref} (medians) | vs {ref} per round |")
    print("|---|---:|---:|---|")
    rows = {}
    for m in modes:
        med = statistics.median(rates[m])
        paired = [a / b for a, b in zip(rates[m], rates[ref])]
        rows[m] = {"img_per_s": rates[m], "median": med, "vs_ref_per_round": paired}
        print(f"| {m} | {med:.0f} | {med / statistics.median(rates[ref]):.2f}x | "
              + ", ".join(f"{x:.2f}" for x in paired) + " |")
    verdict = None
    if "parquet" in rates and ref == "file":
        ratio = statistics.median(rows["parquet"]["vs_ref_per_round"])
        verdict = "PASS" if ratio >= 0.9 else "FAIL"
        print(f"\nverdict: readers.parquet / readers.file with {args.decode_device} decoding "
              f"(per-round median) {ratio:.2f}x, target >= 0.90x: {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tree": tree, "parquet": pq_dir, "images": n, "batch": args.batch,
                       "threads": args.threads, "decode_device": args.decode_device,
                       "rows": rows, "verdict": verdict}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
