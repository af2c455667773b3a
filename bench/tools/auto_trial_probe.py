"""Does engine="auto" keep the faster engine for large cached files, and
are its trial batches timed fairly? Over 2,000 cached 1 MiB files in lists
of 64, reads with an auto context (with this machine's CPU count) and with
plain io_uring and psync contexts, in 12 interleaved blocks; prints each
plain engine's median native ns a byte, the auto context's batches per
engine, trials and switches, and its ns a byte by a batch's place in a run
of one engine (1-4: right after a switch, as in a trial). Run from the repo
root (writes 2 GB under /tmp/trial-1m once):

    python3 bench/tools/auto_trial_probe.py
"""
import os
import statistics

from fastread import _core

root = "/tmp/trial-1m"
os.makedirs(root, exist_ok=True)
paths = [f"{root}/{i:05d}.bin" for i in range(2000)]
if not os.path.exists(paths[-1]):
    blob = os.urandom(1 << 20)
    for p in paths:
        with open(p, "wb") as f:
            f.write(blob)
for p in paths:  # cached
    with open(p, "rb") as f:
        f.read()
batch = 64
lists = [paths[i:i + batch] for i in range(0, len(paths) - batch + 1, batch)]
ctxs = {"auto": _core.Context("io_uring", threads=0, auto_engine=1),
        "io_uring": _core.Context("io_uring", threads=0),
        "psync": _core.Context("psync", threads=0)}


def one(c, l):
    t0 = c.stat("file_call_ns")
    b = c.read(l)
    nbytes = b.nbytes
    b.release()
    return (c.stat("file_call_ns") - t0) / nbytes, c.stat("auto_last")


rows = {k: [] for k in ctxs}
for block in range(12):
    for name, c in ctxs.items():
        for l in lists * 3:
            rows[name].append(one(c, l))
for name in ("io_uring", "psync"):
    v = [x[0] for x in rows[name]]
    print(f"{name:9s} steady: median {statistics.median(v):.4f} ns/B over {len(v)} calls")
a = rows["auto"]
eng = [x[1] for x in a]
print("auto: calls", len(a), "io_uring", eng.count(0), "psync", eng.count(1),
      "trials", ctxs["auto"].stat("auto_trials"), "switches", ctxs["auto"].stat("auto_switches"))
runs = []  # (engine, position in its run, ns/B)
pos = 0
for i, (x, e) in enumerate(a):
    pos = pos + 1 if i and eng[i - 1] == e else 1
    runs.append((e, pos, x))
for e, name in ((0, "io_uring"), (1, "psync")):
    for p in (1, 2, 3, 4):
        v = [x for (ee, pp, x) in runs if ee == e and pp == p]
        if v:
            print(f"auto {name:8s} batch {p} of a run: median {statistics.median(v):.4f} ns/B (n={len(v)})")
    v = [x for (ee, pp, x) in runs if ee == e and pp > 4]
    if v:
        print(f"auto {name:8s} batch 5+ of a run: median {statistics.median(v):.4f} ns/B (n={len(v)})")
