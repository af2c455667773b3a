"""One configuration of many-shard reading, profiled: the native table
reader (what fastread.Reader runs over WebDataset shards, as
file_ranges_ab.py opens it) or the Reader itself, over one shard count,
one engine and one order; after one untimed epoch, `perf stat` or
`perf record -g` is attached to this process for the timed epochs only
(issue 37: where the time goes at 10^4 shards).

    python bench/engines/file_ranges_prof.py --dir /var/tmp/sp-16k --shards 10000
        [--engine io_uring@16000] [--order shuffled] [--kind table|reader]
        [--epochs 3] [--perf stat|record|none] [--out PREFIX] [--workers 1]

Prints one JSON line: samples, wall, CPU us a sample (this process's user
and system time, every thread's, io_uring's io-wq workers included, from
getrusage over the timed epochs) and the engine's counters. With --perf,
perf's output goes to PREFIX.stat.txt or PREFIX.data (report it with
`perf report -i PREFIX.data --no-children --sort dso,sym`). perf is
stopped with SIGINT when the timed epochs end, so it counts them alone.
--dir is a tree bench/dali/many_shards.py made (one folder per shard count).
"""
import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np

import fastread
from fastread.formats.webdataset import WebDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from file_ranges_ab import epoch  # noqa: E402

EXT = ["jpg", "cls"]


def rusage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_nvcsw + r.ru_nivcsw, r.ru_minflt + r.ru_majflt


# One epoch of the table reader, four batches submitted ahead: file_ranges_ab's.
table_epoch = epoch


def start_perf(mode, prefix, events):
    pid = str(os.getpid())
    if mode == "stat":
        cmd = ["perf", "stat", "-e", events, "-p", pid, "-o", prefix + ".stat.txt"]
    else:
        cmd = ["perf", "record", "-g", "-F", "2000", "-p", pid, "-o", prefix + ".data"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # attached to every thread before the timed epochs
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--shards", type=int, default=10000)
    ap.add_argument("--engine", default="io_uring")
    ap.add_argument("--order", default="shuffled", choices=("shuffled", "in_order"))
    ap.add_argument("--kind", default="table", choices=("table", "reader"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--perf", default="none", choices=("none", "stat", "record"))
    ap.add_argument("--events", default="task-clock,context-switches,cpu-migrations,"
                                        "page-faults,cycles,instructions")
    ap.add_argument("--out", default="/tmp/fr-prof")
    args = ap.parse_args()
    d = os.path.join(args.dir, str(args.shards))
    paths = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".tar"))
    src = WebDataset(paths, EXT)
    n = len(src)
    name, _, most = args.engine.partition("@")
    if most:
        src.max_open_files = int(most)
    rng = np.random.default_rng(0)
    if args.kind == "table":
        native = src.open_native(name, fastread.EngineOptions().resolve(name), prefetch=4,
                                 workers=args.workers)

        def epoch(e):
            order = rng.permutation(n) if args.order == "shuffled" else np.arange(n)
            return table_epoch(native, order, args.batch)
    else:
        r = fastread.Reader(source=src, batch_size=args.batch,
                            random_shuffle=args.order == "shuffled", seed=1,
                            workers=args.workers, engine=name)
        native = r

        def epoch(e):
            r.set_epoch(e)
            return sum(len(a) for a, _ in r)
    epoch(0)  # warm: untimed (page cache, every shard opened once)
    perf = start_perf(args.perf, args.out, args.events) if args.perf != "none" else None
    u0, s0, cs0, pf0 = rusage()
    t0 = time.perf_counter()
    got = sum(epoch(e) for e in range(1, args.epochs + 1))
    wall = time.perf_counter() - t0
    u1, s1, cs1, pf1 = rusage()
    if perf:
        perf.send_signal(signal.SIGINT)
        err = perf.communicate(timeout=120)[1].decode(errors="replace")
        if perf.returncode not in (0, -signal.SIGINT, 130):
            print(err, file=sys.stderr)
    stats = {}
    for key in ("fd_cache_opens", "fd_cache_hits", "fd_cache_reads", "file_ranges_native",
                "fd_cache_slots"):
        try:
            stats[key] = (native.stat(key) if args.kind == "table"
                          else r._native.stat(key))  # the Reader's native reader
        except Exception as exc:  # noqa: BLE001 (a counter this reader lacks)
            stats[key] = repr(exc)
    print(json.dumps({
        "kind": args.kind, "shards": args.shards, "engine": args.engine, "order": args.order,
        "samples": got, "wall_s": round(wall, 3), "rate": round(got / wall),
        "user_us": round((u1 - u0) / got * 1e6, 3), "sys_us": round((s1 - s0) / got * 1e6, 3),
        "cpu_us": round((u1 - u0 + s1 - s0) / got * 1e6, 3),
        "csw_per_k": round((cs1 - cs0) / got * 1e3, 2), "faults_per_k": round((pf1 - pf0) / got * 1e3, 2),
        "load": open("/proc/loadavg").read().strip(), "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
