"""How fastread hands GPU batches to DALI, timed: the same
``fastread.dali.readers.file(device="gpu")`` pipeline fed through DLPack
(``TensorListGPU.from_dlpack_list``, what fastread uses) and through the
CUDA array interface (one ``TensorGPU`` per sample), alternating, warm cache.
Needs a GPU and DALI.

    python3 bench/dali_feed.py DATA_DIR [--batchsize 256] [--rounds 3] [--profile]

``--profile`` prints where the Python side of one DLPack run spends its time.
"""
import argparse
import cProfile
import pstats
import time

from fastread.dali import readers


def _cuda_array_interface_batch(arrays, device_id):
    from nvidia.dali.tensors import TensorGPU, TensorListGPU
    return TensorListGPU([TensorGPU(a, "", device_id) for a in arrays], "", contiguous=False)


FEEDS = {"dlpack": readers._gpu_batch, "cuda_array_interface": _cuda_array_interface_batch}


def run(data_dir, feed, batch_size, threads, iterations, profile=False):
    from nvidia.dali import pipeline_def

    readers._gpu_batch = FEEDS[feed]
    try:
        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0)
        def pipe():
            return readers.file(file_root=data_dir, device="gpu", name="Reader")

        p = pipe()
        p.build()
        samples = 0

        def loop(n):
            nonlocal samples
            done = 0
            while done < n:
                try:
                    out = p.run()
                except StopIteration:
                    p.reset()
                    continue
                samples += len(out[1])
                done += 1

        loop(10)
        samples = 0
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        loop(iterations)
        if prof:
            prof.disable()
        seconds = time.perf_counter() - t0
        del p
    finally:
        readers._gpu_batch = FEEDS["dlpack"]
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return samples / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir")
    ap.add_argument("--batchsize", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    results = {feed: [] for feed in FEEDS}
    for _ in range(args.rounds):
        for feed in FEEDS:
            results[feed].append(run(args.data_dir, feed, args.batchsize, args.threads,
                                     args.iterations))
    for feed, vals in results.items():
        vals.sort()
        print(f"{feed:>22}: median {vals[len(vals) // 2]:>10,.0f} samples/s  "
              f"(runs {', '.join(f'{v:,.0f}' for v in vals)})")
    if args.profile:
        run(args.data_dir, "dlpack", args.batchsize, args.threads, args.iterations, profile=True)


if __name__ == "__main__":
    main()
