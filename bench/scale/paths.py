"""What a file tree's paths cost a Reader: scan, Reader build, RSS a sample
and a shuffled epoch, for two installs of fastread in the same run (issue 37:
paths as a PathTable against a str each), each row a fresh process.

    python bench/scale/paths.py ROOT --python /work/venvs/before/bin/python \\
        --python /work/venvs/after/bin/python [--rounds 3] [--json OUT]

ROOT: a tree (bench/scale/generate.py files ROOT N). Per row, in the child:
``scan_s`` = FileList.scan(ROOT) (what Reader(file_root=) does: a list of str
before, a PathTable after); ``build_s`` = Reader(source=..., random_shuffle=
True) and its first batch; ``rss_b_per_sample`` = (VmRSS after the first
batch - VmRSS after the imports) / N, the source's paths plus the native
reader's copy; ``epoch_per_s`` = samples of one shuffled epoch after the
first batch over its time. The installs alternate within each round (ABBA),
after one untimed warm-up row that fills the dentry cache.
"""
import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import fastread

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

root, batch = sys.argv[1], int(sys.argv[2])
base = rss()
t0 = time.perf_counter()
src = fastread.FileList.scan(root)
t1 = time.perf_counter()
reader = fastread.Reader(source=src, batch_size=batch, random_shuffle=True, seed=0)
it = iter(reader)
arrays, _ = next(it)
t2 = time.perf_counter()
after = rss()
n = len(arrays)
for arrays, _ in it:
    n += len(arrays)
t3 = time.perf_counter()
reader.close()
print("PATHS-RESULT " + json.dumps({
    "fastread": fastread.__file__, "paths_type": type(src.names).__name__, "n": len(src),
    "epoch_samples": n, "scan_s": t1 - t0, "build_s": t2 - t1,
    "rss_b_per_sample": (after - base) / len(src),
    "epoch_per_s": (n - len(arrays)) / (t3 - t2) if t3 > t2 else None}))
"""


def run(python, root, batch):
    out = subprocess.run([python, "-c", CHILD, root, str(batch)], capture_output=True,
                         text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("PATHS-RESULT "):
            return json.loads(line[len("PATHS-RESULT "):])
    raise RuntimeError(f"{python}: no result (rc {out.returncode}): {out.stderr[-2000:]}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--python", action="append", required=True,
                   help="an interpreter with fastread installed (give two to compare)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    with open("/proc/loadavg") as f:
        print(f"loadavg before: {f.read().strip()}", flush=True)
    run(args.python[0], args.root, args.batch_size)  # warm-up: dentries and inodes
    rows = []
    for r in range(args.rounds):
        # ABBA: whichever runs second in a round is not always the same one.
        for py in (args.python if r % 2 == 0 else args.python[::-1]):
            row = dict(run(py, args.root, args.batch_size), python=py, round=r)
            rows.append(row)
            print(f"round {r} {py}: {row['paths_type']:9s} n={row['n']} scan {row['scan_s']:.2f} s, "
                  f"build+first batch {row['build_s']:.2f} s, "
                  f"{row['rss_b_per_sample']:.0f} B/sample, epoch {row['epoch_per_s']:,.0f}/s",
                  flush=True)
    with open("/proc/loadavg") as f:
        print(f"loadavg after: {f.read().strip()}")
    med = {}
    for py in args.python:
        mine = [x for x in rows if x["python"] == py]
        med[py] = {k: sorted(x[k] for x in mine)[len(mine) // 2]
                   for k in ("scan_s", "build_s", "rss_b_per_sample", "epoch_per_s")}
        print(f"median {py}: " + ", ".join(f"{k} {v:.4g}" for k, v in med[py].items()))
    if len(args.python) == 2:
        a, b = (med[py] for py in args.python)
        print("ratios second/first: " + ", ".join(f"{k} {b[k] / a[k]:.2f}x" for k in a))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "median": med, "time": time.time()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
