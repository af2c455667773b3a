"""Time and memory to a shuffled epoch's first batch against N = 10^4..10^8.

Each case runs in a fresh process (its peak RSS, VmHWM, is its own):

* ``lazy``: fastread.sampling.EpochOrder (the core's fr_order), rank 3 of
  8, first batch of 256, full shuffle; ``lazy-block``: the same with
  shuffle="block" (defaults 256 x 64); ``lazy-elastic``: elastic sharding,
  global batch 2048 over 8 ranks;
* ``numpy``: np.random.default_rng(seed).permutation(N), then the slice;
* ``array``: fastread._core.permutation(seed, epoch, N), the whole epoch as
  an array (what every reader did before fr_order);
* ``old``: ``--old-python``'s fastread (a build before fr_order, e.g. the
  system interpreter's install of main): its epoch_indices, i.e. the
  Fisher-Yates table of N int64s, then the slice;
* ``reader`` / ``reader-old``: a Reader over a synthetic source of N
  one-byte ranges of one file (names computed when asked), iter() to the
  first batch, with this build / ``--old-python``'s; RSS growth there is
  VmRSS after the first batch minus before iter() (the source's own
  arrays, 2 x 8 B + 4 B a sample, are built before).

Usage: python bench/scale/orders.py [--max-exp 8] [--old-python PATH] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

ORDER_CASE = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    def hwm():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    kind, n = sys.argv[1], int(sys.argv[2])
    from fastread import sampling
    from fastread._core import permutation
    base = hwm()
    t0 = time.perf_counter()
    if kind == "lazy":
        b = sampling.EpochOrder(n, shuffle=True, seed=1, epoch=3, shard_id=3, num_shards=8,
                                batch_size=256).batch(0)
    elif kind == "lazy-block":
        b = sampling.EpochOrder(n, shuffle="block", seed=1, epoch=3, shard_id=3, num_shards=8,
                                batch_size=256).batch(0)
    elif kind == "lazy-elastic":
        b = sampling.EpochOrder(n, shuffle=True, seed=1, epoch=3, shard_id=3, num_shards=8,
                                global_batch_size=2048, pad_last_batch=True).batch(0)
    elif kind == "numpy":
        p = np.random.default_rng(1).permutation(n)
        b = p[n * 3 // 8: n * 3 // 8 + 256]
    elif kind == "array":
        b = permutation(1, 3, n)[n * 3 // 8: n * 3 // 8 + 256]
    elif kind == "old":
        b = sampling.epoch_indices(n, shuffle=True, seed=1, epoch=3, shard_id=3,
                                   num_shards=8)[:256]
    dt = time.perf_counter() - t0
    assert len(b) == 256
    print(json.dumps({"case": kind, "n": n, "seconds": dt, "rss_growth": hwm() - base}))
""")

READER_CASE = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import fastread
    def hwm():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    kind, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    class Names:
        def __len__(self):
            return n
        def __getitem__(self, i):
            return str(i)

    class Ranges(fastread.FileRanges):
        def __init__(self):
            self.path = path
            self.offsets = np.arange(n, dtype=np.int64) % 251
            self.lengths = np.ones(n, dtype=np.int64)
            self.names = Names()
            self.labels = np.zeros(n, dtype=np.int32)
    t0 = time.perf_counter()
    r = fastread.Reader(source=Ranges(), random_shuffle=True, batch_size=256, seed=1,
                        shard_id=3, num_shards=8)
    t1 = time.perf_counter()
    base = rss()
    it = iter(r)
    arrays, labels = next(it)
    t2 = time.perf_counter()
    assert len(arrays) == 256
    print(json.dumps({"case": kind, "n": n, "open_seconds": t1 - t0, "seconds": t2 - t1,
                      "rss_growth": rss() - base, "peak_rss": hwm()}))
    del it
    r.close()
""")


def run(python, code, *args):
    out = subprocess.run([python, "-c", code, *map(str, args)], capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        return {"case": args[0], "n": args[1], "error": out.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-exp", type=int, default=8)
    ap.add_argument("--reader-max-exp", type=int, default=7)
    ap.add_argument("--old-python", help="an interpreter whose fastread predates fr_order")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bytes.bin")
        with open(path, "wb") as f:
            f.write(bytes(range(251)))
        for exp in range(4, a.max_exp + 1):
            n = 10 ** exp
            for kind in ("lazy", "lazy-block", "lazy-elastic", "numpy", "array"):
                rows.append(run(sys.executable, ORDER_CASE, kind, n))
            if a.old_python:
                rows.append(run(a.old_python, ORDER_CASE, "old", n))
            if exp <= a.reader_max_exp:
                rows.append(run(sys.executable, READER_CASE, "reader", n, path))
                if a.old_python:
                    rows.append(run(a.old_python, READER_CASE, "reader-old", n, path))
            for r in rows[-8:]:
                if r.get("n") == n:
                    print(json.dumps(r), flush=True)
    print()
    print("| N | case | first batch (ms) | RSS growth (MB) |")
    print("|---|---|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['n']:.0e} | {r['case']} | error: {r['error']} | |")
            continue
        print(f"| 10^{len(str(r['n'])) - 1} | {r['case']} | {r['seconds'] * 1e3:.2f} | "
              f"{r['rss_growth'] / 2**20:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
