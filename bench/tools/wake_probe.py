"""Is the helpers' wake-up on a read_files() call's critical path? Over the
read_files probe's cached 4 KiB files, in lists of 64 and 256, times
read() + arrays() + sum(nbytes) per list on io_uring contexts whose helpers
poll 50 us (the default), 200 us and 1000 us between calls, and prints
per call: the whole call, the native part, and the pool's mean wake-up.
5 interleaved rounds, medians. Run from the repo root:

    python3 bench/tools/wake_probe.py
"""
import os
import statistics
import sys

sys.path.insert(0, "bench/tools")
from read_files_probe import make_tree, timed  # noqa: E402
from fastread import _core  # noqa: E402

paths = make_tree("/tmp/fastread-probe/4096x20000", 4096, 20000)
print(os.cpu_count(), "CPUs")
for batch in (64, 256):
    lists = [paths[i:i + batch] for i in range(0, len(paths) - batch + 1, batch)]
    ctxs = {s: _core.Context("io_uring", threads=0, spin_us=s) for s in (50, 200, 1000)}
    for c in ctxs.values():
        for l in lists: c.read(l).arrays()
    cells = {}
    for r in range(5):
        for s, c in ctxs.items():
            k0 = {k: c.stat(k) for k in ("file_calls", "file_call_ns", "pool_joins", "pool_wake_ns")}
            rate = timed(lambda l: sum(a.nbytes for a in c.read(l).arrays()), lists)
            d = {k: c.stat(k) - v for k, v in k0.items()}
            cells.setdefault(s, []).append((1e6 * batch / rate, d["file_call_ns"] / d["file_calls"] / 1e3,
                                            d["pool_wake_ns"] / max(1, d["pool_joins"]) / 1e3))
    for s, v in cells.items():
        print(f"batch {batch} spin_us {s:5d}: call {statistics.median(x[0] for x in v):6.1f} us, "
              f"native {statistics.median(x[1] for x in v):6.1f} us, wake {statistics.median(x[2] for x in v):5.1f} us")
