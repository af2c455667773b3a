"""fastread.dali.readers.file's native operator at scale: what defining and
building the DALI pipeline costs with the files given as lists (the
before: files= of N strings and labels= of N ints) and as the binary
listing the operator maps (the after: file_index=, what readers.file passes
for a long local list; "listing_cold" writes it, "listing_kept" finds it in
the index cache).

Each N is a synthetic PathTable (N files, 1,000 a directory, made with
numpy in the child: no Python string a file) of which only the first
directories' files exist: building the pipeline needs only the list, and the
first (unshuffled) batch of 256 and the read-ahead behind it read those.
Each row runs in a fresh child process, so its RSS is its own (counted from
after the table is made: the same in every mode).

    python bench/scale/dali_file.py --sizes 1e6,1e7 [--rounds 2]
"""
import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fresh import print_build_rows, run_child  # noqa: E402

PER_DIR = 1000
EXISTING = 8 * PER_DIR   # files made on disk: the first batches and read-ahead

CHILD = r"""
import json, os, shutil, sys, time
import numpy as np
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
root, n, mode, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
PER_DIR = %(per_dir)d
from nvidia.dali import fn, pipeline_def
from fastread.dali import _plugin, _listing
from fastread.names import NameTable, PathTable
_plugin.require("bench/scale/dali_file.py")

def digits(values, width):
    # Fixed-width decimal ASCII of each value: (len(values), width) uint8.
    p = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] // p) %% 10 + 48).astype(np.uint8)

def fixed(prefix, values, width, suffix):
    rows = np.empty((len(values), len(prefix) + width + len(suffix)), np.uint8)
    rows[:, :len(prefix)] = np.frombuffer(prefix, np.uint8)
    rows[:, len(prefix):len(prefix) + width] = digits(values, width)
    rows[:, len(prefix) + width:] = np.frombuffer(suffix, np.uint8)
    return NameTable(rows.reshape(-1), np.arange(len(values) + 1, dtype=np.int64) * rows.shape[1])

ndirs = (n + PER_DIR - 1) // PER_DIR
table = PathTable(fixed(root.encode() + b"/d", np.arange(ndirs), 5, b"/"),
                  (np.arange(n) // PER_DIR).astype(np.uint32),
                  fixed(b"f", np.arange(n), 9, b".bin"))
labels = (np.arange(n) // PER_DIR).astype(np.int32)
if mode == "listing_cold":
    shutil.rmtree(cache, ignore_errors=True)
r0 = rss(); t = time.perf_counter()

@pipeline_def(batch_size=256, num_threads=2, device_id=None)
def pipe():
    if mode == "files":   # what readers.file passed before file_index=
        return tuple(fn.fastread.readers.file(files=list(table), labels=labels.tolist()))
    return tuple(fn.fastread.readers.file(**_listing.listing_args(table, labels,
                                                                  directory=cache)))

p = pipe()
p.build()
t_build = time.perf_counter() - t; r_build = rss() - r0
t = time.perf_counter()
data, labs = p.run()
t_first = time.perf_counter() - t; r_first = rss() - r0
assert len(data) == 256 and bytes(data.at(5)) == b"f%%09d.bin\n" %% 5, bytes(data.at(5))
peak = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"build_s": t_build, "build_rss": r_build, "first_batch_s": t_first,
                  "first_batch_rss": r_first, "peak_rss": peak}))
""" % {"per_dir": PER_DIR}


def make_tree(root, n):
    """The first EXISTING files of the synthetic table, each holding its name."""
    for i in range(min(n, EXISTING)):
        d = os.path.join(root, f"d{i // PER_DIR:05d}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"f{i:09d}.bin")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(f"f{i:09d}.bin\n".encode())


def measure(root, n, mode, cache, timeout):
    return run_child(CHILD, root, n, mode, cache, timeout=timeout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e6,1e7")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every mode")
    p.add_argument("--modes", default="files,listing_cold,listing_kept")
    p.add_argument("--timeout", type=int, default=600, help="seconds a row may take")
    p.add_argument("--data-dir", default="/var/tmp/fastread-scale-files")
    p.add_argument("--out", metavar="OUT.json")
    args = p.parse_args(argv)
    sizes = [int(float(x)) for x in args.sizes.split(",") if x]
    rows = []
    for n in sizes:
        root = os.path.join(args.data_dir, f"tree-{n}")
        cache = os.path.join(args.data_dir, f"cache-{n}")
        make_tree(root, n)
        for rnd in range(args.rounds):
            for mode in args.modes.split(","):
                row = {"n": n, "mode": mode, "round": rnd,
                       **measure(root, n, mode, cache, args.timeout)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    print_build_rows(rows, "operator's files", "first batch s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
