"""Descriptors held after cufile Readers are opened, run and closed again and
again (on the GPU machine: CUFILE_FORCE_COMPAT_MODE=true python3
bench/tools/cufile_fd_probe.py): ROUNDS (8) rounds of 20 over a tree of 120
files of sizes 0-5000 (as tests/test_lifecycle.py's), the first half with a
file list, the second as the test does it (a root, arrays summed); PAD=N
holds N more descriptors open first. Prints the growth per round and the
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


# PAD=N holds N more descriptors open first (a pytest process has ~370).
pad = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(os.environ.get("PAD", "0")))]
base = tempfile.mkdtemp(dir="/var/tmp")
rng = np.random.default_rng(13)
sets = {"0-5000": [int(rng.integers(0, 5000)) for _ in range(120)]}
for label, sizes in sets.items():
    paths = tree(os.path.join(base, label.replace(" ", "_")), sizes)
    size_of = dict(zip(paths, sizes))
    for rnd in range(int(os.environ.get("ROUNDS", "8"))):
        before = fds()
        for k in range(20):
            if rnd >= 4:  # as tests/test_lifecycle.py does it: a root, arrays summed
                with fastread.Reader(os.path.dirname(os.path.dirname(paths[0])), batch_size=32,
                                     engine="cufile", workers=2) as r:
                    assert sum(len(a) for a, _ in r) == len(paths)
            else:
                with fastread.Reader(files=paths, labels=[0] * len(paths), batch_size=32,
                                     engine="cufile", workers=2) as r:
                    for _ in r:
                        pass
        after = fds()
        kept = [t for fd, t in after.items() if before.get(fd) != t]
        print(f"{label:10} {'root' if rnd >= 4 else 'files'} round {rnd}: {len(before)} -> {len(after)} descriptors; kept files of "
              f"sizes {sorted(collections.Counter(size_of.get(t, -1) for t in kept).items())[:8]}",
              flush=True)
