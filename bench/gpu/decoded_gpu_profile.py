"""Where readers.image(decoded=True, device="gpu") + DALI's GPU augmentation
spends its time (issue 39, item 5), in one process on the GPU machine, warm:

  fused      fastread.torch.ImageLoader(image=pack, device="cuda", augment=True):
             the reference (no DALI)
  aug-only   DALI's fn.random_resized_crop + fn.crop_mirror_normalize alone, on
             a GPU external source cycling 4 batches already in GPU memory
             (no_copy): DALI's own augmentation rate at this batch size
  f          readers.image(pack, decoded=True, device="gpu") + the same (the
             native operator as DALI's mixed operator: _image.GPU_OUTPUT_STAGE)
  f-gpu      the same with the operator as a GPU operator (its copies on the
             GPU stream, between the augmentation's kernels)
  g, g-gpu   f's and f-gpu's reader alone (uint8 HWC batches in DALI's GPU outputs)
  e          readers.image(pack, decoded=True) host outputs + .gpu() + the same

Each DALI mode is timed through DALIGenericIterator (what a PyTorch loop
uses) and, with ``:run``, through pipe.run() alone (DALI's pipeline without
the iterator's copy into torch tensors). Then a sweep of f and aug-only over
batch size, prefetch_queue_depth, exec_dynamic and the dynamic executor's
stream policy (SINGLE / PER_BACKEND, DALI's default / PER_OPERATOR), each
configuration built, timed and dropped in turn; and the copy engine's ceiling
for one batch of pixels (pinned host to device, torch, one stream).

    python3 bench/gpu/decoded_gpu_profile.py --raw160 PACK [--batch 256] [--threads 8]
        [--rounds 3] [--seconds 3] [--sweep-seconds 2] [--json OUT]
"""
import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import time

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def build(args, mode, batch, size, pqd=2, dynamic=None, policy=None, **reader_args):
    """A built DALI pipeline for `mode` ('aug-only', 'f', 'f-gpu', 'g', 'g-gpu', 'e')."""
    from fastread.dali import _image
    import torch
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali import pipeline as dpipe

    from fastread.dali import readers

    kw = dict(batch_size=batch, num_threads=args.threads, device_id=0, prefetch_queue_depth=pqd)
    if dynamic is not None:
        kw["exec_dynamic"] = dynamic
    if policy is not None:
        kw["stream_policy"] = getattr(dpipe.StreamPolicy, policy)
    batches = None
    if mode == "aug-only":
        g = torch.Generator(device="cuda").manual_seed(0)
        batches = [torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device="cuda",
                                 generator=g) for _ in range(4)]
        torch.cuda.synchronize()
        cycle = itertools.cycle(batches)

    @pipeline_def(**kw)
    def pipe():
        if mode == "aug-only":
            images = fn.external_source(source=lambda: next(cycle), device="gpu", batch=True,
                                        no_copy=True, layout="HWC", dtype=types.UINT8)
            labels = fn.constant(idata=0, shape=[1], dtype=types.INT32, device="cpu").gpu()
        else:
            device = "cpu" if mode == "e" else "gpu"
            stage = _image.GPU_OUTPUT_STAGE
            if mode.endswith("-gpu"):
                _image.GPU_OUTPUT_STAGE = "gpu"
            try:
                images, labels = readers.image(image=args.raw160, decoded=True, device=device,
                                               random_shuffle=True, seed=0, name="Reader",
                                               **reader_args)
            finally:
                _image.GPU_OUTPUT_STAGE = stage
            if device == "cpu":
                images, labels = images.gpu(), labels.gpu()
        if mode in ("g", "g-gpu"):
            return images, labels
        images = fn.random_resized_crop(images, size=(size, size), seed=1)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mirror=fn.random.coin_flip(seed=2), mean=MEAN, std=STD)
        return images, labels

    p = pipe()
    p.build()
    p._keep = batches   # the external source's batches live as long as the pipeline
    return p


def iter_stream(p):
    from nvidia.dali.plugin.pytorch import DALIGenericIterator
    it = DALIGenericIterator([p], ["images", "labels"], auto_reset=True, size=-1)
    while True:
        for out in it:
            yield out[0]["images"], out[0]["labels"]


def run_stream(p):
    while True:
        images, labels = p.run()
        yield images, labels


def fused(args, batch, size):
    from fastread.torch import ImageLoader
    loader = ImageLoader(image=args.raw160, batch_size=batch, device="cuda", device_id=0,
                         size=size, augment=True, random_shuffle=True, seed=0)
    while True:
        yield from loader


def measure(stream, seconds, batch, touch=True):
    import torch
    acc = torch.zeros((), device="cuda", dtype=torch.float64)
    n = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        images, _ = next(stream)
        if touch and isinstance(images, torch.Tensor):
            acc += images.sum(dtype=torch.float64)
        n += batch
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def copy_ceiling(batch, size, seconds=1.0):
    """Pinned host to device copies of one batch of uint8 pixels (torch, one
    stream, back to back): the copy engine's rate in img/s."""
    import torch
    host = torch.empty((batch, size, size, 3), dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(16):
            dev.copy_(host, non_blocking=True)
        n += 16
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return n * batch / dt, n * host.numel() / dt / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw160", required=True)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sweep-seconds", type=float, default=2.0)
    ap.add_argument("--modes", default="fused,aug-only,aug-only:run,f,f:run,f-gpu,g,g-gpu,e")
    ap.add_argument("--sweep", default="batch=256,512,1024;pqd=2,4;dynamic=1,0;"
                                        "policy=PER_BACKEND,PER_OPERATOR,SINGLE")
    ap.add_argument("--sweep-modes", default="f,aug-only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import nvidia.dali
    print(f"DALI {nvidia.dali.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs", flush=True)
    out = dict(batch=args.batch, size=args.size, threads=args.threads)
    rate, gbs = copy_ceiling(args.batch, args.size)
    print(f"copy engine, pinned HtoD of one batch ({args.batch}x{args.size}x{args.size}x3 uint8): "
          f"{rate:,.0f} img/s ({gbs:.1f} GB/s)", flush=True)
    out["copy_ceiling"] = dict(img_s=rate, gb_s=gbs)

    # The main modes, interleaved rounds.
    streams = {}
    for m in args.modes.split(","):
        base, _, how = m.partition(":")
        t0 = time.perf_counter()
        try:
            if base == "fused":
                s = fused(args, args.batch, args.size)
            else:
                p = build(args, base, args.batch, args.size)
                s = run_stream(p) if how == "run" else iter_stream(p)
            measure(s, 0.5, args.batch, touch=how != "run")
        except Exception as e:  # noqa: BLE001  (one failing leaves the others)
            print(f"{m}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  flush=True)
            continue
        streams[m] = s
        print(f"built {m} in {time.perf_counter() - t0:.1f} s", flush=True)
    rates = {m: [] for m in streams}
    for r in range(args.rounds):
        for m, s in streams.items():
            rates[m].append(measure(s, args.seconds, args.batch, touch=":run" not in m))
        print(f"round {r + 1}: " + ", ".join(f"{m} {v[-1]:,.0f}" for m, v in rates.items()),
              flush=True)
    print(f"\n{'mode':<14} {'img/s (median)':>15}  rounds")
    for m, v in rates.items():
        print(f"{m:<14} {statistics.median(v):>15,.0f}  {' '.join(f'{x:,.0f}' for x in v)}")
    out["modes"] = {m: dict(img_s=statistics.median(v), rounds=v) for m, v in rates.items()}
    streams.clear()
    gc.collect()

    # The sweep: one configuration at a time (built, timed, dropped).
    axes = {}
    for part in args.sweep.split(";"):
        k, _, vs = part.partition("=")
        axes[k] = vs.split(",")
    sweep = []
    print("\nsweep (through DALIGenericIterator):", flush=True)
    for mode in args.sweep_modes.split(","):
        for combo in itertools.product(*axes.values()):
            cfg = dict(zip(axes, combo))
            dynamic = cfg.get("dynamic", "1") == "1"
            policy = cfg.get("policy") if dynamic else None
            if not dynamic and cfg.get("policy") not in (None, "PER_BACKEND"):
                continue   # stream policies are the dynamic executor's
            batch = int(cfg.get("batch", args.batch))
            pqd = int(cfg.get("pqd", 2))
            try:
                p = build(args, mode, batch, args.size, pqd=pqd, dynamic=dynamic, policy=policy)
                s = iter_stream(p)
                measure(s, 0.3, batch)
                v = measure(s, args.sweep_seconds, batch)
            except Exception as e:  # noqa: BLE001
                v = None
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"  {mode} {cfg}: failed: {why}", flush=True)
            else:
                print(f"  {mode:<9} batch {batch:>5} pqd {pqd} dynamic {int(dynamic)} "
                      f"policy {policy or '-':<12} {v:>10,.0f} img/s", flush=True)
            sweep.append(dict(mode=mode, batch=batch, pqd=pqd, dynamic=dynamic, policy=policy,
                              img_s=v))
            s = p = None
            gc.collect()
    out["sweep"] = sweep
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
