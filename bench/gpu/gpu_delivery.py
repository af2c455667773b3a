"""Reader(device="gpu") against its two limits, in one run: host-only reads
(the same Reader on the host) and pinned host-to-device copies of a batch's
bytes. Issue 16's target is Reader(device="gpu") >= 300k img/s on the H200
machine, approaching min(host reads, pinned H2D).

    python bench/gpu/gpu_delivery.py /tmp/fastread-imagenet-20k --batch 256 --rounds 3 \\
        --json bench-results/gpu_delivery.json

Modes (interleaved: round r runs every mode once before round r + 1):
  host       Reader(engine=..., device="cpu"), arrays dropped as they come
  host-pinned  the same with page-locked arenas (pin_memory=True, device_id=0):
             what device="gpu" reads into
  gpu        Reader(device="gpu"): each batch copied to GPU memory by the
             reader's workers before it is handed out
  gpu-wN     the same with N workers (--workers), to see whether more
             batches in flight hide the copies
  h2d        the bytes of one batch (batch x the set's mean file size) copied
             from page-locked host memory to the GPU, torch or CuPy, one
             synchronised copy per batch: the copy's ceiling at this size
Each Reader mode runs --epochs epochs after an untimed one (sizes learnt,
caches warm). Reported: img/s (median of rounds, every round kept) and
gpu / min(host-pinned, h2d). Modes that cannot run here say why and are
skipped (no GPU: only the host modes run).
"""
import argparse
import json
import os
import statistics
import sys
import time


def run_reader(paths, batch, epochs, **kw):
    import fastread
    with fastread.Reader(files=paths, labels=[0] * len(paths), batch_size=batch, **kw) as r:
        for arrays, _ in r:  # untimed: sizes learnt, arenas and device buffers made
            del arrays
        t0 = time.perf_counter()
        n = 0
        for _ in range(epochs):
            for arrays, _ in r:
                n += len(arrays)
                del arrays
        return n / (time.perf_counter() - t0)


def h2d_copier(nbytes, device_id):
    """A function doing one pinned host-to-device copy of nbytes, synchronised,
    with torch or CuPy; raises RuntimeError saying why neither can."""
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device_id}")

        def copy():
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(device_id)
        return copy
    except ImportError:
        pass
    try:
        import cupy
    except ImportError:
        raise RuntimeError("needs torch or cupy for the pinned copy") from None
    with cupy.cuda.Device(device_id):
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        dev = cupy.empty(nbytes, dtype=cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)

    def copy():
        dev.data.copy_from_host_async(mem.ptr, nbytes, stream)
        stream.synchronize()
    return copy


def run_h2d(copy, batch, images):
    copy()  # first touch
    reps = max(1, images // batch)
    t0 = time.perf_counter()
    for _ in range(reps):
        copy()
    return reps * batch / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a file tree (e.g. fastread make-dataset's JPEGs)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per Reader run")
    p.add_argument("--engine", default="io_uring")
    p.add_argument("--workers", default="", help="extra worker counts for gpu-wN, e.g. 12,16")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import fastread
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engines"))
    from engines import list_files  # bench/engines/engines.py: the same file order
    paths = list_files(args.root)
    if not paths:
        sys.exit(f"gpu_delivery: no files under {args.root}")
    mean = sum(os.path.getsize(q) for q in paths[:2000]) / min(2000, len(paths))
    images = len(paths) * args.epochs
    modes = {
        "host": lambda: run_reader(paths, args.batch, args.epochs, engine=args.engine),
        "host-pinned": lambda: run_reader(paths, args.batch, args.epochs, engine=args.engine,
                                          device_id=args.device_id, pin_memory=True),
        "gpu": lambda: run_reader(paths, args.batch, args.epochs, engine=args.engine,
                                  device="gpu", device_id=args.device_id),
    }
    for w in filter(None, args.workers.split(",")):
        modes[f"gpu-w{int(w)}"] = (lambda w=int(w): run_reader(
            paths, args.batch, args.epochs, engine=args.engine, device="gpu",
            device_id=args.device_id, workers=w))
    skipped = {}
    try:
        copy = h2d_copier(int(mean * args.batch), args.device_id)
        modes["h2d"] = lambda: run_h2d(copy, args.batch, images)
    except Exception as e:  # noqa: BLE001 - reported, the rest runs
        skipped["h2d"] = str(e)

    rates = {m: [] for m in modes}
    for rnd in range(args.rounds):
        for m in list(modes):
            if m in skipped:
                continue
            try:
                v = modes[m]()
            except Exception as e:  # noqa: BLE001 - e.g. no GPU: say why, go on
                skipped[m] = f"{type(e).__name__}: {e}"
                continue
            rates[m].append(v)
            print(f"round {rnd} {m:12} {v:12,.0f} img/s", flush=True)
    result = {"root": args.root, "files": len(paths), "mean_bytes": mean, "batch": args.batch,
              "engine": args.engine, "epochs": args.epochs, "rounds": args.rounds,
              "cpus": os.cpu_count(), "fastread": getattr(fastread, "__version__", "?"),
              "img_per_s": {m: statistics.median(v) for m, v in rates.items() if v},
              "rounds_img_per_s": {m: v for m, v in rates.items() if v}, "skipped": skipped}
    med = result["img_per_s"]
    print(f"{len(paths)} files of {mean / 1024:.0f} KiB mean, batch {args.batch}, "
          f"engine {args.engine}, median of {args.rounds} rounds:")
    for m, v in med.items():
        print(f"  {m:12} {v:12,.0f} img/s")
    for m, why in skipped.items():
        print(f"  {m:12} skipped: {why}")
    if "gpu" in med and "host-pinned" in med and "h2d" in med:
        bound = min(med["host-pinned"], med["h2d"])
        result["gpu_of_bound"] = med["gpu"] / bound
        print(f"gpu / min(host-pinned, h2d) = {med['gpu']:,.0f} / {bound:,.0f} = "
              f"{result['gpu_of_bound']:.2f} (target: gpu >= 300,000 img/s on the H200)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
