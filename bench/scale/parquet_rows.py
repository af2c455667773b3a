"""What a Parquet source costs against its row count (issue 37's scale table):
startup to the first shuffled batch, RSS a row, peak threads and descriptors,
each N in a fresh process (the parent polls /proc/PID/task and /proc/PID/fd).

    python bench/scale/parquet_rows.py [--sizes 1e4,1e6] [--dir /var/tmp/fastread-scale]

The files: N rows of 100-byte binary ``image`` and an int64 ``label``, row
groups of 10,000 rows, 10 files (pyarrow's writer; made once, kept). Timed
in the child after its imports: Parquet(DIR) + Reader(random_shuffle=True)
+ the first batch (``startup_s``), then ``--batches`` batches more
(``samples_per_s``). RSS a row: (VmHWM - VmRSS after the imports) / N.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import fastread
from fastread.formats import Parquet

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024

root, nbatches = sys.argv[1], int(sys.argv[2])
base = status("VmRSS:")
t0 = time.perf_counter()
src = Parquet(root)
reader = fastread.Reader(source=src, batch_size=256, random_shuffle=True, seed=0)
it = iter(reader)
next(it)
t1 = time.perf_counter()
k = 0
for _ in range(nbatches):
    try:
        arrays, _ = next(it)
    except StopIteration:
        break
    k += len(arrays)
t2 = time.perf_counter()
print("PQ-RESULT " + json.dumps({"n": len(src), "startup_s": t1 - t0,
      "samples_per_s": k / (t2 - t1), "rss_b_per_row": (status("VmHWM:") - base) / len(src)}))
reader.close()
"""


def make(root, n):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    marker = os.path.join(root, f".rows-{n}")
    if os.path.exists(marker):
        return
    os.makedirs(root, exist_ok=True)
    per = -(-n // 10)
    for f in range(10):
        lo, hi = f * per, min(n, (f + 1) * per)
        if lo >= hi:
            break
        ids = np.arange(lo, hi, dtype=np.int64)
        blobs = [int(i).to_bytes(8, "little") * 12 + b"\0" * 4 for i in ids]
        table = pa.table({"image": pa.array(blobs, pa.binary()), "label": ids % 1000})
        pq.write_table(table, os.path.join(root, f"part-{f:02d}.parquet"), row_group_size=10_000)
    open(marker, "w").close()


def count(path):
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def run(python, root, nbatches):
    proc = subprocess.Popen([python, "-c", CHILD, root, str(nbatches)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    threads = fds = 0
    while proc.poll() is None:
        threads = max(threads, count(f"/proc/{proc.pid}/task"))
        fds = max(fds, count(f"/proc/{proc.pid}/fd"))
        time.sleep(0.005)
    out, err = proc.communicate()
    for line in out.splitlines():
        if line.startswith("PQ-RESULT "):
            return dict(json.loads(line[10:]), peak_threads=threads, peak_fds=fds)
    raise RuntimeError(f"no result (rc {proc.returncode}): {err[-2000:]}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e4,1e6")
    p.add_argument("--dir", default="/var/tmp/fastread-scale")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args(argv)
    with open("/proc/loadavg") as f:
        print(f"loadavg before: {f.read().strip()}")
    for n in (int(float(x)) for x in args.sizes.split(",")):
        root = os.path.join(args.dir, f"parquet-{n}")
        make(root, n)
        print(json.dumps(run(args.python, root, args.batches)), flush=True)
    with open("/proc/loadavg") as f:
        print(f"loadavg after: {f.read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
