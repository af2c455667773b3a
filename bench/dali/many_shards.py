"""The same samples in 100, 10,000 and 100,000 WebDataset shards: fastread's
Reader (one native reader over every shard, bounded descriptors) and
fastread.dali's webdataset reader against DALI's fn.readers.webdataset
(with wds2idx index files and without), in order and shuffled; samples/s,
peak threads and peak descriptors (issue 37, item 1).

    python bench/dali/many_shards.py [--samples 30000] [--shards 100,10000,100000]
        [--size 1024] [--batch 256] [--rounds 3] [--modes ...] [--dir DIR] [--json OUT]

Each measurement runs in a child process of its own (so that its threads
and descriptors are its own: a watcher thread samples /proc/self/task and
/proc/self/fd every 2 ms), builds its reader (timed: ``startup``), reads
one untimed epoch, then ``--epochs`` timed ones; samples/s is the best
timed epoch. Rounds are interleaved: every (layout, order, mode) runs once
per round, and the report gives each cell's median over the rounds, its
ratios to fn.readers.webdataset's with index files and without in the same
layout and order, and its rate against its own in the first layout (the
same bytes in the fewest shards); a measurement past --timeout counts as
failed.

Shards hold ``jpg`` (``--size`` random bytes) and ``cls`` members, written
with tarfile; the index files are DALI's v1.2 format (what its ``wds2idx``
tool writes: ``v1.2 <samples>``, then one line a sample of ``ext offset size
name`` per component), written from tarfile's own member offsets.

Modes: ``reader`` (fastread.Reader over fastread.formats.WebDataset, its
default engine: psync for shards), ``reader_uring`` (the same with
engine="io_uring": each ring's LRU of direct descriptors, a miss one linked
openat -> readv chain),
``dali_idx`` and ``dali`` (fn.readers.webdataset with and without
index_paths), ``fr_dali`` (fastread.dali.formats.webdataset, native=False:
fastread's Reader feeding a DALI pipeline), ``fr_dali_native`` (the same,
native=True: fastread's DALI operator, fn.fastread.readers.webdataset, one
fr_read_file_ranges call a batch). ``shuffled``: fastread reads one
permutation of all samples an epoch; DALI's reader a shuffle buffer
(random_shuffle=True, its default initial_fill of 1024).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

EXT = ["jpg", "cls"]
MODES = ("reader", "reader_uring", "dali_idx", "dali", "fr_dali", "fr_dali_native")


def make_layout(root, samples, shards, size):
    """`samples` samples in `shards` tar shards under root/<shards>; returns
    the shard and index paths (made once, reused)."""
    d = os.path.join(root, f"{shards}")
    done = os.path.join(d, ".done")
    paths = [os.path.join(d, f"shard-{s:06d}.tar") for s in range(shards)]
    idx = [p + ".idx" for p in paths]
    if os.path.exists(done):
        return paths, idx
    os.makedirs(d, exist_ok=True)
    rng = __import__("numpy").random.default_rng(0)
    per = [samples // shards + (s < samples % shards) for s in range(shards)]
    k = 0
    for s, p in enumerate(paths):
        lines = []
        with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tf:
            for _ in range(per[s]):
                key = f"{k:09d}"
                comp = []
                for ext, data in (("jpg", rng.integers(0, 256, size, dtype="uint8").tobytes()),
                                  ("cls", str(k % 1000).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    info.mtime = 0
                    tf.addfile(info, __import__("io").BytesIO(data))
                    m = tf.members[-1]
                    comp.append(f"{ext} {m.offset_data} {m.size} {m.name}")
                lines.append(" ".join(comp))
                k += 1
        with open(idx[s], "w") as f:
            f.write(f"v1.2 {len(lines)}\n" + "".join(line + "\n" for line in lines))
    open(done, "w").close()
    return paths, idx


class Peak:
    def __init__(self):
        self.threads = self.fds = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.002)

    def sample(self):
        self.threads = max(self.threads, len(os.listdir("/proc/self/task")))
        self.fds = max(self.fds, len(os.listdir("/proc/self/fd")))

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.sample()


def child(args):
    """One measurement: prints a JSON line."""
    mode, shuffle = args.child_mode, args.child_shuffle
    paths = sorted(os.path.join(args.child_dir, n) for n in os.listdir(args.child_dir)
                   if n.endswith(".tar"))
    n_samples = args.samples
    rates = []
    with Peak() as peak:
        t0 = time.perf_counter()
        if mode in ("reader", "reader_uring"):
            import fastread
            from fastread.formats.webdataset import WebDataset
            engine = {"engine": "io_uring"} if mode == "reader_uring" else {}
            r = fastread.Reader(source=WebDataset(paths, EXT), batch_size=args.batch,
                                random_shuffle=shuffle, seed=1, workers=args.workers, **engine)
            startup = time.perf_counter() - t0

            def epoch(e):
                r.set_epoch(e)
                return sum(len(a) for a, _ in r)
        else:
            from nvidia.dali import fn, pipeline_def
            if mode in ("fr_dali", "fr_dali_native"):
                from fastread.dali.formats import webdataset
                native = mode == "fr_dali_native"
                if native:
                    from fastread.dali import _plugin
                    if not _plugin.load():
                        sys.exit(f"native operator unavailable: {_plugin.reason()}")

                def read():
                    return webdataset(paths=paths, ext=EXT, native=native, name="R",
                                      random_shuffle=shuffle)
            else:
                index = [p + ".idx" for p in paths] if mode == "dali_idx" else None

                def read():
                    return fn.readers.webdataset(paths=paths, ext=EXT, index_paths=index,
                                                 name="R", random_shuffle=shuffle)

            @pipeline_def(batch_size=args.batch, num_threads=args.dali_threads, device_id=None,
                          prefetch_queue_depth=2)
            def pipe():
                return tuple(read())

            p = pipe()
            p.build()
            startup = time.perf_counter() - t0
            # An external source has no epoch size to ask for: the samples.
            per_epoch = n_samples if mode == "fr_dali" else p.epoch_size("R")
            batches = -(-per_epoch // args.batch)

            def epoch(e):
                got = 0
                for _ in range(batches):
                    out = p.run()
                    got += len(out[0])
                return got
        epoch(0)  # warm: untimed
        for e in range(1, args.epochs + 1):
            t = time.perf_counter()
            got = epoch(e)
            rates.append(got / (time.perf_counter() - t))
    print(json.dumps({"rate": max(rates), "startup": startup, "threads": peak.threads,
                      "fds": peak.fds, "samples": got, "expected": n_samples}), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--shards", default="100,10000,100000")
    ap.add_argument("--size", type=int, default=1024, help="bytes of each jpg member")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None, help="fastread reader workers")
    ap.add_argument("--dali-threads", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--orders", default="in_order,shuffled")
    ap.add_argument("--dir", default=None, help="where the shards go (kept between runs)")
    ap.add_argument("--json", default=None, help="write every measurement here")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds a measurement may take before it counts as failed")
    ap.add_argument("--child-mode", help=argparse.SUPPRESS)
    ap.add_argument("--child-dir", help=argparse.SUPPRESS)
    ap.add_argument("--child-shuffle", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_mode:
        return child(args)
    root = args.dir or os.path.join(tempfile.gettempdir(), f"fr-many-shards-{args.samples}-"
                                    f"{args.size}")
    layouts = [int(s) for s in args.shards.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    orders = [o for o in args.orders.split(",") if o]
    for s in layouts:
        t = time.perf_counter()
        make_layout(root, args.samples, s, args.size)
        print(f"# {s} shards ready ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    results = {}
    for rnd in range(args.rounds):
        for s in layouts:
            for order in orders:
                for mode in modes:
                    cmd = [sys.executable, __file__, "--child-mode", mode, "--child-dir",
                           os.path.join(root, str(s)), "--child-shuffle",
                           str(int(order == "shuffled")), "--samples", str(args.samples),
                           "--batch", str(args.batch), "--epochs", str(args.epochs),
                           "--dali-threads", str(args.dali_threads)]
                    if args.workers:
                        cmd += ["--workers", str(args.workers)]
                    key = (s, order, mode)
                    try:
                        out = subprocess.run(cmd, capture_output=True, text=True,
                                             timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        results.setdefault(key, []).append(
                            {"error": f"timed out after {args.timeout:.0f} s"})
                        print(f"# round {rnd} {key}: timed out", file=sys.stderr)
                        continue
                    if out.returncode != 0:
                        err = (out.stderr.strip().splitlines() or ["?"])[-1][:200]
                        results.setdefault(key, []).append({"error": err})
                        print(f"# round {rnd} {key}: failed: {err}", file=sys.stderr)
                        continue
                    m = json.loads(out.stdout.strip().splitlines()[-1])
                    results.setdefault(key, []).append(m)
                    print(f"# round {rnd} {key}: {m['rate']:.0f}/s threads {m['threads']} "
                          f"fds {m['fds']}", file=sys.stderr)

    def med(key, field):
        vals = [m[field] for m in results.get(key, []) if "error" not in m]
        return statistics.median(vals) if vals else None

    print(f"{args.samples} samples of {args.size} B + cls, batch {args.batch}, "
          f"median of {args.rounds} interleaved rounds; {os.cpu_count()} CPUs")
    print(f"{'shards':>7} {'order':9} {'mode':14} {'samples/s':>10} {'vs dali_idx':>11} "
          f"{'vs dali':>8} {'vs 100 sh.':>10} {'MB/s':>7} {'startup s':>9} {'threads':>7} "
          f"{'fds':>5}")
    for s in layouts:
        for order in orders:
            for mode in modes:
                key = (s, order, mode)
                rate = med(key, "rate")
                if rate is None:
                    errs = [m["error"] for m in results.get(key, []) if "error" in m]
                    print(f"{s:>7} {order:9} {mode:14} failed: {errs[:1]}")
                    continue
                base = med((s, order, "dali_idx"), "rate")
                base_noidx = med((s, order, "dali"), "rate")
                first = med((layouts[0], order, mode), "rate")
                print(f"{s:>7} {order:9} {mode:14} {rate:>10.0f} "
                      f"{(rate / base if base else float('nan')):>10.2f}x "
                      f"{(rate / base_noidx if base_noidx else float('nan')):>7.2f}x "
                      f"{(rate / first if first else float('nan')):>9.2f}x "
                      f"{rate * args.size / 1e6:>7.0f} "
                      f"{med(key, 'startup'):>9.2f} {max(m['threads'] for m in results[key] if 'error' not in m):>7} "
                      f"{max(m['fds'] for m in results[key] if 'error' not in m):>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"shards": k[0], "order": k[1], "mode": k[2], "runs": v}
                       for k, v in results.items()], f, indent=1)


if __name__ == "__main__":
    main()
