"""psync against io_uring on ranges of many shards, in one process: the
native table reader (what fastread.Reader runs over WebDataset shards)
over the same samples in 100, 10,000 and 100,000 shards, shuffled and in
order; samples/s and CPU microseconds a sample (the process's user + system
time, every thread's, over the timed epochs), interleaved rounds.

    python bench/engines/file_ranges_ab.py --dir /tmp/frms-30k-1024 [--shards 100,10000]
        [--rounds 5] [--batch 256] [--workers 1] [--engines psync,io_uring,io_uring@16000]

--dir is a tree bench/dali/many_shards.py made (one folder per shard count,
shards of ``jpg`` + ``cls``). ``ENGINE@N``: that engine with
max_open_files=N (io_uring's slots are no process descriptors: a table as
large as the shards, up to RLIMIT_NOFILE, holds every one). CPU a sample is the cost the shard count adds:
on a machine with spare cores the rate hides it, here (2 cores) it is the
rate.
"""
import argparse
import os
import resource
import statistics
import time

import numpy as np

import fastread
from fastread.formats.webdataset import WebDataset

EXT = ["jpg", "cls"]


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def epoch(native, order, batch):
    got = 0
    ahead = 4
    starts = list(range(0, len(order), batch))
    for s in starts[:ahead]:
        native.submit(order[s:s + batch])
    for k in range(len(starts)):
        if k + ahead < len(starts):
            s = starts[k + ahead]
            native.submit(order[s:s + batch])
        b = native.next()
        fails = b.failures()
        if fails:
            raise SystemExit(f"failed samples: {fails[:3]}")
        got += b.count if hasattr(b, "count") else len(b.arrays())
        b.release()
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--shards", default="100,10000")
    ap.add_argument("--engines", default="psync,io_uring")
    ap.add_argument("--orders", default="shuffled,in_order")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    engines = args.engines.split(",")
    readers = {}
    for s in [int(x) for x in args.shards.split(",")]:
        d = os.path.join(args.dir, str(s))
        paths = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".tar"))
        t = time.perf_counter()
        src = WebDataset(paths, EXT)
        n = len(src)
        print(f"# {s} shards: {n} samples, indexed in {time.perf_counter() - t:.1f} s", flush=True)
        default_open = src.max_open_files
        for e in engines:
            name, _, most = e.partition("@")
            src.max_open_files = int(most) if most else default_open
            native = src.open_native(name, fastread.EngineOptions().resolve(name), prefetch=4,
                                     workers=args.workers)
            readers[(s, e)] = (native, n)
    rng = np.random.default_rng(0)
    res = {}
    for rnd in range(args.rounds):
        for (s, e), (native, n) in readers.items():
            for o in args.orders.split(","):
                order = rng.permutation(n) if o == "shuffled" else np.arange(n)
                if rnd == 0:
                    epoch(native, order, args.batch)  # warm: untimed
                c0, t0 = cpu(), time.perf_counter()
                got = epoch(native, order, args.batch)
                wall, used = time.perf_counter() - t0, cpu() - c0
                res.setdefault((s, o, e), []).append((got / wall, used / got * 1e6))
    print(f"{args.rounds} interleaved rounds, batch {args.batch}, workers {args.workers}, "
          f"{os.cpu_count()} CPUs; load {open('/proc/loadavg').read().strip()}")
    print(f"{'shards':>7} {'order':9} {'engine':14} {'samples/s':>10} {'cpu us/s.':>9} "
          f"{'vs 100 sh. (same eng.)':>22} {'vs psync':>8}")
    first = int(args.shards.split(",")[0])
    for (s, o, e), v in sorted(res.items()):
        rate = statistics.median(x[0] for x in v)
        us = statistics.median(x[1] for x in v)
        base = statistics.median(x[0] for x in res[(first, o, e)])
        ps = res.get((s, o, "psync"))
        vs = rate / statistics.median(x[0] for x in ps) if ps else float("nan")
        print(f"{s:>7} {o:9} {e:14} {rate:>10.0f} {us:>9.2f} {rate / base:>21.2f}x {vs:>7.2f}x")
    for (s, e), (native, n) in readers.items():
        print(f"# {s} {e}: fd_cache_opens {native.stat('fd_cache_opens')} "
              f"hits {native.stat('fd_cache_hits')} reads {native.stat('fd_cache_reads')} "
              f"rings {native.stat('file_ranges_native')}")
        native.close()


if __name__ == "__main__":
    main()
