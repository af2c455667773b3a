"""Packed images at scale: what opening the index and starting a shuffled epoch cost.

For each N a sparse packed image of N samples of 100 bytes (holes: no blocks)
is made once (bench/scale/generate.py: a binary index, version 3, from 2^20
samples on; ``--json-at`` sizes also get the JSON index, what ``pack``
wrote before version 3, and a row of their own). Each row runs in a fresh child process so
its RSS is its own: the time and RSS growth to open the PackedImage, then to
build a ``Reader(random_shuffle=True)`` and take its first batch.

    python bench/scale/image_index.py --sizes 1e6,1e7,1e8 --json-at 1e6
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402
from fresh import run_child  # noqa: E402

CHILD = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
import fastread
from fastread.image import PackedImage
path = sys.argv[1]
r0 = rss(); t = time.perf_counter()
img = PackedImage(path)
t_open = time.perf_counter() - t; r_open = rss() - r0
t = time.perf_counter()
reader = fastread.Reader(source=img, batch_size=256, random_shuffle=True, seed=1)
arrays, labels = next(iter(reader))
t_first = time.perf_counter() - t; r_first = rss() - r0
assert len(arrays) == 256
peak = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"n": len(img), "version": img.version, "open_s": t_open, "open_rss": r_open,
                  "first_batch_s": t_first, "first_batch_rss": r_first, "peak_rss": peak,
                  "verified": img.index_verified}))
"""


def measure(path):
    return run_child(CHILD, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e6,1e7,1e8")
    p.add_argument("--json-at", default="1e6", help="sizes that also get a JSON-index row")
    p.add_argument("--data-dir", default="/var/tmp/fastread-scale-image")
    p.add_argument("--out", metavar="OUT.json")
    args = p.parse_args(argv)
    sizes = [int(float(x)) for x in args.sizes.split(",") if x]
    json_at = {int(float(x)) for x in args.json_at.split(",") if x}
    rows = []
    for n in sizes:
        for fmt in (("json", "binary") if n in json_at else ("binary",)):
            root = os.path.join(args.data_dir, f"{fmt}-{n}")
            os.makedirs(root, exist_ok=True)
            img = generate.make_image(root, n, sparse=True, index_format=fmt)
            row = {"index": fmt, "index_bytes": os.path.getsize(img + ".index"),
                   **measure(img)}
            row["n"] = n
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| N | index | index file MB | open s | RSS after open MB | Reader + shuffled first "
          "batch s | RSS then MB | B/sample then |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['n']:,} | {r['index']} | - | {r['error']} |  |  |  |  |")
            continue
        print(f"| {r['n']:,} | {r['index']} (v{r['version']}) | {r['index_bytes'] / 1e6:,.0f} | "
              f"{r['open_s']:.3f} | {r['open_rss'] / 2**20:,.0f} | {r['first_batch_s']:.2f} | "
              f"{r['first_batch_rss'] / 2**20:,.0f} | {r['first_batch_rss'] / r['n']:.1f} |")
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
