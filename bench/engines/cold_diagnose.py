"""Why cold buffered reads trail O_DIRECT: one cold Reader epoch per mode
(io_uring buffered, io_uring O_DIRECT; interleaved rounds), with what the
block layer saw meanwhile (from /sys/dev/block/MAJ:MIN/stat of the tree's
device) and the process's io-wq worker threads (iou-wrk), sampled every 20 ms.

    python bench/engines/cold_diagnose.py /var/tmp/tree --rounds 3 [--drop]

Cold: the files' pages are evicted (posix_fadvise DONTNEED: no root, dentries
and inodes stay cached, so only the data path is timed), or with --drop the
whole page cache (root). Per mode: files/s; disk reads per file and KiB per
read (merged requests); reads in flight at the disk on average (read ticks
over wall time) and ms per read. The device's counters are the whole
device's: on a shared machine other work shows up in them.

Measured on the 2-core VM (6.18, virtio disk, read_ahead_kb 8192), 3,000
files of 88 KiB, batch 256, 4 rings x 64: no iou-wrk thread in either mode
(buffered misses are async buffered reads, not worker threads); buffered
kept ~22 reads in flight at the disk (350-390 KiB each after merging, 14 ms
per read) against O_DIRECT's ~63 (220 KiB, 5 ms), and read 5-6k files/s
against 27k.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def device_stat_path(path):
    st = os.stat(path)
    return f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"


def read_stat(p):
    with open(p) as f:
        v = [int(x) for x in f.read().split()]
    return {"reads": v[0], "sectors": v[2], "read_ms": v[3], "busy_ms": v[9]}


def io_workers(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                n += f.read().startswith("iou-wrk")
        except OSError:
            pass
    return n


def one(paths, batch, o_direct, drop, stat_path):
    import fastread
    sys.path.insert(0, HERE)
    from engines import drop_caches
    with fastread.Reader(files=paths, labels=[0] * len(paths), batch_size=batch,
                         engine="io_uring", o_direct=o_direct) as r:
        for arrays, _ in r:  # sizes learnt, as in a Reader's steady state
            del arrays
        drop_caches(paths, not drop)
        samples, done = [], threading.Event()

        def watch():
            while not done.is_set():
                samples.append(io_workers(os.getpid()))
                time.sleep(0.02)
        th = threading.Thread(target=watch, daemon=True)
        s0 = read_stat(stat_path)
        th.start()
        t0 = time.perf_counter()
        n = 0
        for arrays, _ in r:
            n += len(arrays)
            del arrays
        dt = time.perf_counter() - t0
        done.set()
        th.join()
        s1 = read_stat(stat_path)
    d = {k: s1[k] - s0[k] for k in s0}
    reads = max(d["reads"], 1)
    return {"files_per_s": n / dt, "disk_reads_per_file": d["reads"] / n,
            "kib_per_read": d["sectors"] * 512 / reads / 1024,
            "reads_in_flight": d["read_ms"] / (dt * 1000), "ms_per_read": d["read_ms"] / reads,
            "iou_wrk_max": max(samples or [0])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a file tree on the disk to look at")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--files", type=int, default=0, help="at most this many files (0: all)")
    p.add_argument("--drop", action="store_true", help="drop the whole page cache (root)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from engines import list_files
    paths = list_files(args.root)
    if args.files:
        paths = paths[:args.files]
    if not paths:
        sys.exit(f"cold_diagnose: no files under {args.root}")
    stat_path = device_stat_path(paths[0])
    if not os.path.exists(stat_path):
        sys.exit(f"cold_diagnose: {stat_path} does not exist (no block device under {args.root}?)")
    runs = {"buffered": [], "o_direct": []}
    for rnd in range(args.rounds):
        for mode in (runs if rnd % 2 == 0 else list(reversed(list(runs)))):
            r = one(paths, args.batch, mode == "o_direct", args.drop, stat_path)
            runs[mode].append(r)
            print(f"round {rnd} {mode:9} " + "  ".join(f"{k} {v:,.2f}" for k, v in r.items()),
                  flush=True)
    result = {"root": args.root, "files": len(paths), "batch": args.batch, "stat": stat_path,
              "rounds": runs,
              "median": {m: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
                         for m, rs in runs.items()}}
    for m, med in result["median"].items():
        print(f"median {m:9} " + "  ".join(f"{k} {v:,.2f}" for k, v in med.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
