"""The disk's ceiling with fastread's own engine: one large sequential
O_DIRECT read of a file (a packed image) at high queue depth, in 1 MiB
pieces (the engine's largest transfer), many in flight.

    python3 bench/ceiling.py IMAGE [--queue-depth 128] [--cold]

Block-level reads of the same image are judged against this number.
"""
import argparse
import os
import subprocess
import time

import numpy as np

import fastread


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("image")
    p.add_argument("--queue-depth", type=int, default=128)
    p.add_argument("--batch-mib", type=int, default=256, help="MiB per native call")
    p.add_argument("--engine", default="io_uring")
    p.add_argument("--cold", action="store_true", help="drop the page cache first (root)")
    args = p.parse_args()

    size = os.path.getsize(args.image)
    piece = 1 << 20
    offsets = np.arange(0, size - size % piece, piece, dtype=np.int64)
    per_call = max(1, (args.batch_mib << 20) // piece)
    if args.cold:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    ctx = fastread.open_context(args.engine, o_direct=True, queue_depth=args.queue_depth)
    start = time.perf_counter()
    done = 0
    for i in range(0, len(offsets), per_call):
        chunk = offsets[i:i + per_call]
        batch = ctx.read_ranges(args.image, chunk, np.full(len(chunk), piece, dtype=np.int64))
        if batch.failures():
            raise SystemExit(f"{args.image}: read failed: {batch.failures()[:3]}")
        done += batch.nbytes
        del batch
    seconds = time.perf_counter() - start
    print(f"ceiling {args.engine} O_DIRECT qd {args.queue_depth}: {done / seconds / 1e9:.3f} GB/s "
          f"({done / 1e9:.2f} GB in {seconds:.2f} s{', cold' if args.cold else ''})")


if __name__ == "__main__":
    main()
