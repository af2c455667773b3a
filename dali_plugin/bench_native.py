"""Warm read throughput on CPU-only DALI: fn.fastread.readers.file (the
native operator) against fn.readers.file and fastread.dali.readers.file (the
external source), interleaved round by round so a noisy machine hurts every
mode alike.

    python dali_plugin/bench_native.py DATA [--batch 64] [--threads 4] [--rounds 5]

Each round builds each mode's pipeline, runs `--warmup` untimed batches and
then one epoch of batches (`pipe.run()`, no decoding), and records img/s;
the report is each mode's median and its ratio to fn.readers.file. The files
are read once first so the page cache holds them (warm).
"""
import argparse
import statistics
import sys
import time

import numpy as np


def build(mode, root, paths, labels, batch, threads, depth):
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None,
                  prefetch_queue_depth=depth)
    def pipe():
        if mode == "fn.readers.file":
            return tuple(fn.readers.file(file_root=root, name="R"))
        if mode == "native":
            return tuple(fn.fastread.readers.file(files=paths, labels=labels, name="R"))
        from fastread.dali import readers
        return tuple(readers.file(file_root=root))

    p = pipe()
    p.build()
    return p


def run_epoch(pipe, warmup, batches):
    def step():
        try:
            return pipe.run()
        except StopIteration:  # the external source ends its epochs
            pipe.reset()
            return pipe.run()

    for _ in range(warmup):
        step()
    n = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        n += len(step()[1])
    return n / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--prefetch-queue-depth", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="fn.readers.file,native,external")
    args = ap.parse_args(argv)

    from fastread.dali import _plugin
    from fastread.index import scan

    if not _plugin.load():
        sys.exit(f"native operator unavailable: {_plugin.reason()}")
    paths, labels = scan(args.data)
    labels = labels.tolist()
    for p in paths:  # warm the page cache
        with open(p, "rb") as f:
            f.read()
    batches = len(paths) // args.batch
    modes = args.modes.split(",")
    results = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes:
            pipe = build(m, args.data, paths, labels, args.batch, args.threads,
                         args.prefetch_queue_depth)
            results[m].append(run_epoch(pipe, args.warmup, batches))
            del pipe
            print(f"round {r + 1} {m:16s} {results[m][-1]:10,.0f} img/s", flush=True)
    base = statistics.median(results["fn.readers.file"]) if "fn.readers.file" in results else None
    print(f"\n{len(paths)} files, batch {args.batch}, {args.threads} DALI threads, "
          f"warm, median of {args.rounds} interleaved rounds of {batches} batches")
    for m in modes:
        med = statistics.median(results[m])
        ratio = f"{med / base:5.2f}x" if base else ""
        print(f"{m:16s} {med:10,.0f} img/s  {ratio}  (runs: "
              f"{', '.join(f'{x:,.0f}' for x in results[m])}; spread "
              f"{np.std(results[m]) / med * 100:.0f}%)")


if __name__ == "__main__":
    main()
