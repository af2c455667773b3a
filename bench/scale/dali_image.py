"""fastread.dali.readers.image over a packed image at scale: what defining
and building the DALI pipeline costs, with the samples given to the native
operator as lists (the before: range_offsets, range_lengths, files, labels,
one entry per sample) and with the operator mapping the binary index itself
(the after: image_index=, what readers.image passes for a local version-3
index).

For each N a sparse packed image of N samples with a binary index is made
once (bench/scale/generate.py). Each row runs in a fresh child process, so
its RSS is its own: the time and RSS growth from nothing to a built
pipeline (PackedImage opened, the operator defined and built: DALI's
arguments made), then to its first shuffled batch of 256.

    python bench/scale/dali_image.py --sizes 1e6,1e7 [--rounds 2]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402
from fresh import print_build_rows, run_child  # noqa: E402

CHILD = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
path, mode = sys.argv[1], sys.argv[2]
from nvidia.dali import fn, pipeline_def
import fastread
from fastread.dali import readers
from fastread.image import PackedImage
from fastread.dali import _plugin
_plugin.require("bench/scale/dali_image.py")   # loaded before the clock: both modes alike
r0 = rss(); t = time.perf_counter()

@pipeline_def(batch_size=256, num_threads=2, device_id=None)
def pipe():
    img = PackedImage(path)
    if mode == "lists":   # what readers.image passed before image_index=
        return tuple(fn.fastread.readers.file(
            image=img.path, range_offsets=img.offsets.tolist(),
            range_lengths=img.lengths.tolist(), files=list(img.names),
            labels=img.labels.tolist(), random_shuffle=True, seed=1))
    return tuple(readers.image(image=img, native=True, random_shuffle=True, seed=1))

p = pipe()
p.build()
t_build = time.perf_counter() - t; r_build = rss() - r0
t = time.perf_counter()
data, labels = p.run()
t_first = time.perf_counter() - t; r_first = rss() - r0
assert len(data) == 256
peak = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"build_s": t_build, "build_rss": r_build, "first_batch_s": t_first,
                  "first_batch_rss": r_first, "peak_rss": peak}))
"""


def measure(path, mode):
    return run_child(CHILD, path, mode)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e6,1e7")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both modes")
    p.add_argument("--data-dir", default="/var/tmp/fastread-scale-image")
    p.add_argument("--out", metavar="OUT.json")
    args = p.parse_args(argv)
    sizes = [int(float(x)) for x in args.sizes.split(",") if x]
    rows = []
    for n in sizes:
        root = os.path.join(args.data_dir, f"binary-{n}")
        os.makedirs(root, exist_ok=True)
        img = generate.make_image(root, n, sparse=True, index_format="binary")
        for rnd in range(args.rounds):
            for mode in ("lists", "image_index"):
                row = {"n": n, "mode": mode, "round": rnd, **measure(img, mode)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print_build_rows(rows, "operator's samples", "first shuffled batch s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
