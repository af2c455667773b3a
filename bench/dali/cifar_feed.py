"""What feeding DALI costs per CIFAR-10 batch, timed: the bench's DALI
pipelines (``cifar-dali-numpy``: DALI fed from NumPy arrays in memory;
``cifar-fastread``: ``fastread.dali.formats.cifar10``; ``cifar-ranges``: the
same with ``in_memory=False``), all built in one process, then run one epoch
each in interleaved rounds (A B C A B C ...). Per mode: the median wall
img/s and the median process CPU time per image (every thread: DALI's
workers, the engine's, Python), and the ratio to the first mode taken round
by round. On a shared machine the CPU time is the steadier number.

    python3 bench/dali/cifar_feed.py DATA_DIR [--batchsize 64] [--rounds 5]
        [--modes cifar-dali-numpy,cifar-fastread] [--threads 4] [--device cpu]
        [--profile MODE]

``--profile MODE`` runs one more epoch of MODE under cProfile and prints the
Python functions by own time (what the feeding costs on the Python side).
"""
import argparse
import statistics
import sys
import time

MODES = ("cifar-dali-numpy", "cifar-fastread", "cifar-ranges")


def build(mode, data_dir, batch_size, threads, device):
    """The bench family's pipeline for ``mode``, built."""
    from nvidia.dali import pipeline_def

    from fastread.bench.families import formats as fam

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None,
                  prefetch_queue_depth=2)
    def pipe():
        if mode == "cifar-dali-numpy":
            from nvidia.dali import fn
            images, labels = fam.load_in_memory(data_dir)
            data, lab = fn.external_source(
                source=fam._NumpyEpochs(images, labels, batch_size), num_outputs=2,
                batch=True, cycle=False)
        else:
            from fastread.dali.formats import cifar10
            data, lab = cifar10(file_root=data_dir, train=True, random_shuffle=True,
                                in_memory=mode == "cifar-fastread")
        return fam.dali_augment(data, gpu), lab

    p = pipe()
    p.build()
    return p


def epoch(p):
    """Runs ``p`` to the end of one epoch (then resets it): images."""
    n = 0
    while True:
        try:
            out = p.run()
        except StopIteration:
            p.reset()
            return n
        n += len(out[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--batchsize", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--modes", default=",".join(MODES[:2]))
    ap.add_argument("--profile", default=None)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes + ([args.profile] if args.profile else []):
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; modes: {', '.join(MODES)}")
    pipes = {m: build(m, args.data_dir, args.batchsize, args.threads, args.device)
             for m in modes}
    for m in modes:  # warm-up epoch each
        epoch(pipes[m])
    wall = {m: [] for m in modes}
    cpu = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes:
            c0, t0 = time.process_time(), time.perf_counter()
            n = epoch(pipes[m])
            t, c = time.perf_counter() - t0, time.process_time() - c0
            wall[m].append(n / t)
            cpu[m].append(c / n * 1e6)
        print(f"round {r + 1}: " + ", ".join(
            f"{m} {wall[m][-1]:,.0f} img/s {cpu[m][-1]:.1f} us/img" for m in modes),
            file=sys.stderr)
    base = modes[0]
    print(f"batch {args.batchsize}, {args.threads} DALI threads, device {args.device}, "
          f"{args.rounds} interleaved rounds of one epoch per mode; medians")
    print(f"{'mode':<18} {'img/s':>8} {'CPU us/img':>10} {'img/s vs ' + base:>24} "
          f"{'CPU vs ' + base:>22}")
    for m in modes:
        rate = statistics.median(a / b for a, b in zip(wall[m], wall[base]))
        cost = statistics.median(a / b for a, b in zip(cpu[m], cpu[base]))
        print(f"{m:<18} {statistics.median(wall[m]):>8,.0f} {statistics.median(cpu[m]):>10.1f} "
              f"{rate:>23.2f}x {cost:>21.2f}x")
    if args.profile:
        import cProfile
        import pstats
        p = pipes.get(args.profile) or build(args.profile, args.data_dir, args.batchsize,
                                             args.threads, args.device)
        prof = cProfile.Profile()
        prof.enable()
        epoch(p)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
