#!/usr/bin/env python3
"""Ray Data on one machine (issue 32, benchmark 4a): the same tree read by

  read_binary_files   ray.data.read_binary_files(root, include_paths=True)
  read_images         ray.data.read_images(root, include_paths=True): decoded
  fastread            fastread.ray.read_files(root): bytes, label, path
  fastread-decode     fastread.ray.read_files(root, decode=True): decoded
  ray-floor           the blocks fastread makes (same tasks, rows, bytes), made
                      without reading: Ray's own cost of a pass, a ceiling

on one local Ray cluster (``ray.init(num_cpus=--cpus)``), in ONE run whose
rounds interleave the modes (the order rotates each round). A measurement
is one full pass: the dataset is built (its listing included) and consumed
with ``iter_batches(batch_size=256, batch_format="pyarrow")`` on the driver,
counting rows; rows/s is rows over that wall time. Every mode must yield
every file once (rows checked against ``fastread.scan``). Each mode runs
once untimed first: the page cache is warm (this measures the readers, not
the disk) and Ray's workers have imported what the mode runs.

    fastread make-dataset --classes 10 --per-class 500 --mean-kb 92 /var/tmp/fastread-ray-bench/train
    python bench/ray/bench_ray.py /var/tmp/fastread-ray-bench/train --rounds 3 --json out.json

The ratio column is each mode's rows/s over read_binary_files' in the same
round (median over rounds): the issue's target is fastread >= 10x.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

MODES = ("read_binary_files", "read_images", "fastread", "fastread-decode", "ray-floor")


def _zeros_block(sizes, labels, names):
    """A block shaped as fastread's (bytes, label, path), its bytes zeros:
    what a read task returns when it reads nothing."""
    from fastread.ray.datasource import _block
    import numpy as np

    return [_block([np.zeros(n, np.uint8) for n in sizes], labels, names, False)]


def floor_dataset(paths, sizes, batch_size):
    """The blocks fastread.ray.read_files makes for the tree (same tasks,
    rows and bytes) made without reading: Ray's own cost of a pass, the
    ceiling of any reader's rows/s in it."""
    import functools

    import numpy as np
    import ray.data

    from fastread.ray.datasource import _read_task, read

    class Floor(ray.data.Datasource):
        num_tasks = -(-len(paths) // batch_size)

        def estimate_inmemory_data_size(self):
            return int(sum(sizes))

        def get_read_tasks(self, parallelism, per_task_row_limit=None, **_):
            out = []
            for i in range(0, len(paths), batch_size):
                part = paths[i:i + batch_size]
                fn = functools.partial(_zeros_block, sizes[i:i + batch_size],
                                       np.zeros(len(part), np.int32), part)
                out.append(_read_task(fn, len(part), None, (), per_task_row_limit))
            return out

    return read(Floor())


def build(mode, root, batch_size, listing=None):
    import ray.data

    import fastread.ray

    if mode == "read_binary_files":
        return ray.data.read_binary_files(root, include_paths=True)
    if mode == "read_images":
        return ray.data.read_images(root, include_paths=True, mode="RGB")
    if mode == "fastread":
        return fastread.ray.read_files(root, batch_size=batch_size)
    if mode == "fastread-decode":
        return fastread.ray.read_files(root, batch_size=batch_size, decode=True)
    if mode == "ray-floor":
        return floor_dataset(*listing, batch_size)
    raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")


def one_pass(mode, root, batch_size, listing=None):
    """(rows, bytes of the bytes column or None, seconds) of one full pass."""
    t0 = time.perf_counter()
    ds = build(mode, root, batch_size, listing)
    rows, nbytes = 0, 0
    for batch in ds.iter_batches(batch_size=256, batch_format="pyarrow"):
        rows += batch.num_rows
        if "bytes" in batch.column_names:
            nbytes += batch.column("bytes").nbytes
    return rows, nbytes or None, time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a class-per-directory tree (fastread make-dataset)")
    p.add_argument("--cpus", type=int, default=2, help="ray.init(num_cpus=...) (default 2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256,
                   help="files per fastread read task (default 256)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--json", help="write the measurements here")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; modes: {', '.join(MODES)}")

    import ray
    import ray.data

    import fastread

    paths, _ = fastread.scan(args.root)
    want = len(paths)
    total = sum(os.path.getsize(q) for q in paths)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    print(f"{want} files, {total / want / 1e3:.1f} KB mean, {args.root}; Ray {ray.__version__}, "
          f"num_cpus={args.cpus}, {os.cpu_count()} CPUs on {platform.node()}", flush=True)
    # One untimed pass of each mode: the page cache is warm, and Ray's
    # workers have imported what each mode runs (fastread, Pillow, ...).
    sizes = [os.path.getsize(q) for q in paths]
    listing = (paths, sizes)
    for m in modes:
        one_pass(m, args.root, args.batch_size, listing)

    results = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            rows, nbytes, secs = one_pass(m, args.root, args.batch_size, listing)
            if rows != want:
                raise SystemExit(f"{m}: {rows} rows, the tree has {want} files")
            results[m].append(secs)
            print(f"round {r + 1} {m:<18} {rows / secs:9.0f} rows/s  ({secs:.2f} s)", flush=True)
    ray.shutdown()

    base = results.get("read_binary_files")
    print(f"\n{'mode':<18} {'rows/s (median)':>16} {'min':>8} {'max':>8}  vs read_binary_files")
    table = []
    for m in modes:
        rates = [want / s for s in results[m]]
        ratio = (statistics.median(b / s for b, s in zip(base, results[m])) if base else None)
        table.append({"mode": m, "rows_per_s": statistics.median(rates), "min": min(rates),
                      "max": max(rates), "seconds": results[m], "vs_read_binary_files": ratio})
        print(f"{m:<18} {statistics.median(rates):16.0f} {min(rates):8.0f} {max(rates):8.0f}  "
              + (f"{ratio:.1f}x" if ratio is not None else "-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"root": args.root, "files": want, "bytes": total, "cpus": args.cpus,
                       "ray": ray.__version__, "rounds": args.rounds,
                       "batch_size": args.batch_size, "host": platform.node(),
                       "cpu_count": os.cpu_count(), "results": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
