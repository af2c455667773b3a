"""Descriptors held after cufile Readers are opened, run and closed again and
again (on the GPU machine: CUFILE_FORCE_COMPAT_MODE=true python3
bench/tools/cufile_fd_probe.py): 12 rounds of 20 over a tree of 120 files of sizes
0-5000 (as tests/test_lifecycle.py's); prints the growth per round and the
sizes of the files whose descriptors stayed open. cuFile's and CUDA's
one-time setup shows in the first round only."""
import collections
import os
import tempfile

import numpy as np

import fastread


def fds():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def tree(root, sizes):
    paths = []
    rng = np.random.default_rng(13)
    for k, size in enumerate(sizes):
        p = os.path.join(root, f"c{k % 4}", f"{k:03d}.jpg")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        paths.append(p)
    return paths


base = tempfile.mkdtemp(dir="/var/tmp")
rng = np.random.default_rng(13)
sets = {"0-5000": [int(rng.integers(0, 5000)) for _ in range(120)]}
for label, sizes in sets.items():
    paths = tree(os.path.join(base, label.replace(" ", "_")), sizes)
    size_of = dict(zip(paths, sizes))
    for rnd in range(12):
        before = fds()
        for _ in range(20):
            with fastread.Reader(files=paths, labels=[0] * len(paths), batch_size=32,
                                 engine="cufile", workers=2) as r:
                for _ in r:
                    pass
        after = fds()
        kept = [t for fd, t in after.items() if before.get(fd) != t]
        print(f"{label:10} round {rnd}: {len(before)} -> {len(after)} descriptors; kept files of "
              f"sizes {sorted(collections.Counter(size_of.get(t, -1) for t in kept).items())[:8]}",
              flush=True)
