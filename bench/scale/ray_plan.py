"""What planning ``fastread.ray.read_files`` costs the driver at 10^6-10^7
files, before and after its plan became O(index) (issue 37: each read task
a ``PathTable.take`` of the listing instead of a Python string a file), in
the same run, each row a fresh process.

    python bench/scale/ray_plan.py [--before-rev REV] [--sizes 1e6,1e7]
        [--cases table,list] [--rounds 2] [--batch N] [--json OUT]

"before" is ``src/fastread/ray/datasource.py`` at ``--before-rev`` (default
the commit before the change) loaded beside the installed fastread; "after"
is the installed one. The files are a synthetic listing (no files on disk:
only the plan is timed; auto-sizing stats a few, which count at its 128 KiB
default size, so tasks of 1,024 files unless ``--batch``): ``table``, a
:class:`fastread.FileList` of a PathTable in 1,000 directories (what
``FileList.scan`` and ``scan(table=True)`` give); ``list``, a list of ``str``
paths the caller holds (its cost is in the baseline, not the row). Per row:
``plan_s`` = FilesDatasource(shuffle=True) + get_read_tasks (what
read_datasource calls); ``rss_b_per_file`` = VmRSS after the plan - before
it, over N; ``task_b_per_file`` = the pickled bytes of every ReadTask (what
Ray's ``ray.put`` ships), over N; up to ``--traced-max`` files, a second,
untimed plan under tracemalloc gives ``held_b_per_file`` (bytes the plan
holds) and ``objects_per_file`` (new pymalloc blocks: a ``str`` a file is
one each). Rows alternate before/after in each round.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

CHILD = r"""
import importlib, json, sys, time
import numpy as np
import fastread
from fastread.names import NameTable, PathTable

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

impl, case, n, batch, old_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
traced = sys.argv[6] == "1"
if impl == "before":
    sys.path.insert(0, old_dir)
    mod = importlib.import_module("fastread_ray_before")
else:
    mod = importlib.import_module("fastread.ray.datasource")
import ray.cloudpickle as pickle
dirs = 1000
digits = (np.arange(n, dtype=np.int64)[:, None] // 10 ** np.arange(8, -1, -1)) % 10 + 48
rows = np.concatenate([digits.astype(np.uint8),
                       np.broadcast_to(np.frombuffer(b".jpg", np.uint8), (n, 4))], axis=1)
del digits
table = PathTable(NameTable.from_names([f"/data/c{d:04d}/" for d in range(dirs)]),
                  np.arange(n, dtype=np.int64) * dirs // n,
                  NameTable(rows.reshape(-1), np.arange(n + 1, dtype=np.int64) * rows.shape[1]))
labels = (np.arange(n, dtype=np.int64) * dirs // n).astype(np.int32)
source = fastread.FileList(table, labels) if case == "table" else table.tolist()
kw = {} if batch == "auto" else {"batch_size": int(batch)}
if case == "list":
    kw["labels"] = labels
# Warm-up: a small plan first, so lazy imports and Ray's DataContext are in
# the baseline, not in the row.
small = fastread.FileList(table.take(np.arange(min(n, 1000))), labels[:1000])
mod.FilesDatasource(small, shuffle=True, seed=1, **{k: v for k, v in kw.items() if k != "labels"}
                    ).get_read_tasks(1)
base = rss()
t0 = time.perf_counter()
src = mod.FilesDatasource(source, shuffle=True, seed=1, **kw)
tasks = src.get_read_tasks(1)
t1 = time.perf_counter()
after = rss()
task_bytes = sum(len(pickle.dumps(t)) for t in tasks)
row = {"impl": impl, "case": case, "n": n, "tasks": len(tasks), "plan_s": t1 - t0,
       "rss_b_per_file": (after - base) / n, "task_b_per_file": task_bytes / n}
if traced:
    # Bytes and Python objects the plan holds (tracemalloc, which numpy
    # reports to; pymalloc blocks: a str a file would be one each), in a
    # second, untimed plan.
    import gc, tracemalloc
    del src, tasks
    gc.collect()
    tracemalloc.start()
    blocks, held = sys.getallocatedblocks(), tracemalloc.get_traced_memory()[0]
    src = mod.FilesDatasource(source, shuffle=True, seed=1, **kw)
    tasks = src.get_read_tasks(1)
    row["held_b_per_file"] = (tracemalloc.get_traced_memory()[0] - held) / n
    row["objects_per_file"] = (sys.getallocatedblocks() - blocks) / n
    tracemalloc.stop()
print("RAYPLAN-RESULT " + json.dumps(row))
"""


def run(impl, case, n, batch, old_dir, traced):
    out = subprocess.run([sys.executable, "-c", CHILD, impl, case, str(n), batch, old_dir,
                          "1" if traced else "0"],
                         capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RAYPLAN-RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"{impl} {case} {n} failed (rc {out.returncode}):\n{out.stderr[-3000:]}")


def _cell(rows, key, digits):
    vals = [r[key] for r in rows if key in r]
    return f"{max(vals):.{digits}f}" if vals else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-rev", default="3ea95bc~1")
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--cases", default="table,list")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", default="auto")
    ap.add_argument("--traced-max", type=float, default=1e6,
                    help="sizes up to this also get the traced (tracemalloc) plan")
    ap.add_argument("--json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as old_dir:
        src = subprocess.run(["git", "-C", REPO, "show",
                              f"{a.before_rev}:src/fastread/ray/datasource.py"],
                             capture_output=True, text=True, check=True).stdout
        with open(os.path.join(old_dir, "fastread_ray_before.py"), "w") as f:
            f.write(src)
        rows = []
        print(f"loadavg {open('/proc/loadavg').read().strip()}", flush=True)
        for n in (int(float(s)) for s in a.sizes.split(",")):
            for case in a.cases.split(","):
                for r in range(a.rounds):
                    for impl in (("before", "after") if r % 2 == 0 else ("after", "before")):
                        row = run(impl, case, n, a.batch, old_dir, n <= a.traced_max)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        print(f"loadavg {open('/proc/loadavg').read().strip()}", flush=True)
    print("\n| N | case | impl | tasks | plan s (median) | RSS B/file | held B/file | "
          "objects/file | pickled tasks B/file |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["n"], r["case"], r["impl"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2] != "before"))
    for key in keys:
        got = [r for r in rows if (r["n"], r["case"], r["impl"]) == key]
        med = sorted(r["plan_s"] for r in got)[len(got) // 2]
        print(f"| {key[0]:.0e} | {key[1]} | {key[2]} | {got[0]['tasks']} | {med:.2f} | "
              f"{max(r['rss_b_per_file'] for r in got):.0f} | {_cell(got, 'held_b_per_file', 1)} | "
              f"{_cell(got, 'objects_per_file', 3)} | {got[0]['task_b_per_file']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
