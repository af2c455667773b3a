"""What remembering sizes costs where it cannot help: read_files()'s context
(io_uring, one ring per CPU) reading lists of cached small files that it has
never read (a first epoch: every path looked up, missed and stored), lists
of a data set larger than the memo (every path looked up and missed, none
stored) and lists it has read before (a second epoch: what remembering is
for), against the same reads with remembering off, over read_files_probe.py's
files (made if missing). Run from the repo root:

    python3 bench/tools/size_memo_probe.py [--root DIR] [--size 4096] [--files 20000]

Prints us a call per batch size; medians of interleaved rounds."""
import argparse
import os
import statistics
import time

from fastread import _core
from read_files_probe import add_tree_arguments, tree  # this folder's probe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_tree_arguments(ap, rounds=5)
    args = ap.parse_args()
    paths = sorted(tree(args))  # cached by tree()
    print(f"{len(paths)} files of {args.size} B, {os.cpu_count()} CPUs, engine io_uring")
    for batch in (64, 256):
        lists = [paths[i:i + batch] for i in range(0, len(paths) - batch + 1, batch)]
        cells = {}
        for _ in range(args.rounds):
            for label, remember, epochs in (("off (remember_sizes=0)", 0, 0),
                                            ("first epoch (every path new)", 65536, 0),
                                            ("memo full (remember_sizes=1)", 1, 0),
                                            ("second epoch (every size remembered)", 65536, 1)):
                ctx = _core.Context("io_uring", threads=0, remember_sizes=remember)
                ctx.read(lists[0]).release()  # rings and arenas set up
                if remember == 1:
                    ctx.read(lists[-1]).release()  # full: later paths are never stored
                for chunk in lists[1:-1] if epochs else ():
                    ctx.read(chunk).release()
                t0 = time.perf_counter()
                for chunk in lists[1:-1]:
                    ctx.read(chunk).release()
                us = 1e6 * (time.perf_counter() - t0) / (len(lists) - 2)
                cells.setdefault(label, []).append(us)
                ctx.close()
        print(f"\nbatch {batch}")
        for label, values in cells.items():
            print(f"  {label:40s} {statistics.median(values):8.1f} us a call")


if __name__ == "__main__":
    main()
