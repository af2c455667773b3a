"""Squirrel index time (issue 37, item 2): a store of N samples in shards of
1,000 (bench/scale/generate.py's, as the scale family makes it), indexed by
SquirrelStore with the C walk (indexer="native") and by the Python reference
(indexer="python"), interleaved rounds, each in a fresh process with the
inflated copies already cached (the walk measured, not gzip).

    nice -n 5 python bench/scale/squirrel_index.py [--samples 1000000] [--rounds 2]
        [--dir /var/tmp/fastread-scale-squirrel]
"""
import argparse
import json
import os
import subprocess
import sys
import time

from generate import make_squirrel  # bench/scale/generate.py


def child(root, cache, indexer):
    from fastread.formats.squirrel import SquirrelStore

    t0 = time.perf_counter()
    src = SquirrelStore(root, cache_dir=cache, indexer=indexer)
    return {"indexer": indexer, "seconds": time.perf_counter() - t0, "samples": len(src)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/var/tmp/fastread-scale-squirrel")
    ap.add_argument("--child")
    args = ap.parse_args()
    root = os.path.join(args.dir, f"squirrel-{args.samples}")
    cache = os.path.join(args.dir, "cache")
    if args.child:
        print(json.dumps(child(root, cache, args.child)))
        return 0
    make_squirrel(root, args.samples, 1000)
    run = lambda ix: json.loads(subprocess.run(  # noqa: E731
        [sys.executable, __file__, "--samples", str(args.samples), "--dir", args.dir,
         "--child", ix], check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    run("native")   # fills the cache of inflated shards
    got = {"native": [], "python": []}
    for _ in range(args.rounds):
        for ix in ("native", "python"):
            r = run(ix)
            got[ix].append(r["seconds"])
            print(f"{ix:7s} {r['samples']} samples: {r['seconds']:.2f} s", flush=True)
    nat, py = min(got["native"]), min(got["python"])
    print(f"best: native {nat:.2f} s, python {py:.2f} s: {py / nat:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
