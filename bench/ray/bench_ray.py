#!/usr/bin/env python3
"""Ray Data on one machine (issue 32, benchmark 4a): the same tree read by

  read_binary_files        ray.data.read_binary_files(root, include_paths=True)
  read_binary_files-tasks  the same with override_num_blocks= as many read
                           tasks as fastread's: Ray's reader given fastread's
                           task layout (what fewer tasks alone buy)
  read_images              ray.data.read_images(root, include_paths=True): decoded
  fastread                 fastread.ray.read_files(root): bytes, label, path,
                           read tasks as fastread sizes them (--batch-size)
  fastread-256             the same, 256 files per read task (the default
                           before the tasks were sized to Ray's blocks)
  fastread-copy            fastread's tasks, each block's bytes column gathered
                           from per-file arrays (a copy), as before the
                           blocks were the engine's packed buffer
  fastread-before          256 files per task, blocks gathered by copying:
                           fastread.ray.read_files as it was before both
  fastread-decode          fastread.ray.read_files(root, decode=True): decoded
  ray-floor                fastread's tasks and blocks (same rows, labels,
                           paths, bytes), each made once per worker process
                           and then returned as it is, nothing read or built:
                           Ray's own cost of that pass, a reader's ceiling
  ray-iter                 fastread's blocks already in Ray's object store
                           (materialized once), only iterated: the consumer's
                           share of a pass

on one local Ray cluster (``ray.init(num_cpus=--cpus)``), in ONE run whose
rounds interleave the modes (the order rotates each round). A measurement
is one full pass: the dataset is built (its listing included) and consumed
with ``iter_batches(batch_size=256, batch_format="pyarrow")`` on the driver,
counting rows and the bytes column's bytes; rows/s is rows over that wall
time. Every mode must yield every file once (rows checked against
``fastread.scan``). Each mode runs once untimed first: the page cache is
warm (this measures the readers, not the disk) and Ray's workers have
imported what the mode runs.

    fastread make-dataset --classes 10 --per-class 500 --mean-kb 92 /var/tmp/fastread-ray-bench/train
    python bench/ray/bench_ray.py /var/tmp/fastread-ray-bench/train --rounds 5 --json out.json

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

MODES = ("read_binary_files", "read_binary_files-tasks", "read_images", "fastread",
         "fastread-256", "fastread-copy", "fastread-before", "fastread-decode", "ray-floor",
         "ray-iter")


def _copied_block(paths, labels, engine, opts):
    """A block whose bytes column is gathered from per-file arrays."""
    import fastread
    from fastread.ray.datasource import _block

    return [_block(fastread.read_files(paths, engine, opts), labels, paths, False)]


def copy_dataset(source):
    """``source``'s read tasks, their blocks gathered by copying."""
    import functools

    import numpy as np

    from fastread.ray.datasource import read

    pos = {p: i for i, p in enumerate(source.paths)}
    source._tasks = [
        (functools.partial(_copied_block, list(files),
                           source.labels[np.array([pos[p] for p in files])],
                           source._engine, source._opts), rows, size, files)
        for _fn, rows, size, files in source._tasks]
    return read(source)


class Modes:
    """Builds each mode's dataset for one pass; ``listing``: the tree's
    paths and sizes, ``batch_size``: fastread's files per read task (None:
    its own sizing)."""

    def __init__(self, root, listing, batch_size):
        self.root, self.batch_size = root, batch_size
        self.paths, self.sizes = listing
        self._stored = None

    def source(self, batch_size=None):
        from fastread.ray.datasource import FilesDatasource

        return FilesDatasource(self.root, batch_size=batch_size or self.batch_size)

    def build(self, mode):
        import ray.data

        import fastread.ray
        from fastread.bench.families.ray_data import floor_dataset

        if mode == "read_binary_files":
            return ray.data.read_binary_files(self.root, include_paths=True)
        if mode == "read_binary_files-tasks":
            return ray.data.read_binary_files(self.root, include_paths=True,
                                              override_num_blocks=self.source().num_tasks)
        if mode == "read_images":
            return ray.data.read_images(self.root, include_paths=True, mode="RGB")
        if mode == "fastread":
            return fastread.ray.read_files(self.root, batch_size=self.batch_size)
        if mode == "fastread-256":
            return fastread.ray.read_files(self.root, batch_size=256)
        if mode == "fastread-copy":
            return copy_dataset(self.source())
        if mode == "fastread-before":
            return copy_dataset(self.source(256))
        if mode == "fastread-decode":
            return fastread.ray.read_files(self.root, batch_size=self.batch_size, decode=True)
        if mode == "ray-floor":
            return floor_dataset(self.source(), self.sizes)
        if mode == "ray-iter":
            if self._stored is None:
                self._stored = fastread.ray.read_files(self.root,
                                                       batch_size=self.batch_size).materialize()
            return self._stored
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")


def one_pass(modes, mode):
    """(rows, bytes of the bytes column or None, seconds) of one full pass."""
    t0 = time.perf_counter()
    ds = modes.build(mode)
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
    p.add_argument("--batch-size", type=int, default=None,
                   help="files per fastread read task (default: fastread's own sizing)")
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
    built = Modes(args.root, (paths, sizes), args.batch_size)
    src = built.source()
    print(f"fastread: {src.num_tasks} read tasks of {src.batch_size} files; load average "
          f"{os.getloadavg()[0]:.1f} (other work on the machine)", flush=True)
    loads = [os.getloadavg()[0]]
    for m in modes:
        one_pass(built, m)

    results = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            rows, nbytes, secs = one_pass(built, m)
            if rows != want:
                raise SystemExit(f"{m}: {rows} rows, the tree has {want} files")
            results[m].append(secs)
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1} {m:<24} {rows / secs:9.0f} rows/s  ({secs:.2f} s)  "
                  f"load {loads[-1]:.1f}", flush=True)
    ray.shutdown()

    base = results.get("read_binary_files")
    print(f"\n{'mode':<24} {'rows/s (median)':>16} {'min':>8} {'max':>8}  vs read_binary_files")
    table = []
    for m in modes:
        rates = [want / s for s in results[m]]
        ratio = (statistics.median(b / s for b, s in zip(base, results[m])) if base else None)
        table.append({"mode": m, "rows_per_s": statistics.median(rates), "min": min(rates),
                      "max": max(rates), "seconds": results[m], "vs_read_binary_files": ratio})
        print(f"{m:<24} {statistics.median(rates):16.0f} {min(rates):8.0f} {max(rates):8.0f}  "
              + (f"{ratio:.1f}x" if ratio is not None else "-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"root": args.root, "files": want, "bytes": total, "cpus": args.cpus,
                       "ray": ray.__version__, "rounds": args.rounds,
                       "batch_size": args.batch_size, "fastread_tasks": src.num_tasks,
                       "fastread_files_per_task": src.batch_size, "host": platform.node(),
                       "cpu_count": os.cpu_count(), "load_average": loads,
                       "results": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
