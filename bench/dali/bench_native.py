"""Warm read throughput on CPU-only DALI: fn.fastread.readers.file (the
native operator) against fn.readers.file and fastread.dali.readers.file (the
external source), interleaved round by round so a noisy machine hurts every
mode alike.

    python bench/dali/bench_native.py DATA [--batch 64] [--threads 4] [--rounds 5]
        [--modes fn.readers.file,native,native:dense=false,native:threads=1+workers=1,external]
        [--output bytes|shapes]

GPU modes (a pipeline on GPU 0, whatever --device says):
  native-gpu   fn.fastread.readers.file(device="gpu"): the operator's own GPU
               outputs (one copy per batch from its page-locked arenas)
  external-gpu readers.file(device="gpu", native=False): the external source
               fed by fastread.Reader(device="gpu") (readers.file's GPU path
               before the operator had GPU outputs)
  reader-gpu   fastread.Reader(device="gpu") alone, no DALI: the ceiling the
               operator is measured against (batches of --batch, the same
               files; arguments after the colon are Reader keywords, e.g.
               reader-gpu:workers=12)
  memory       (any device) the same pipeline fed from memory: every file's
               bytes loaded once, handed to fn.external_source(no_copy=True)
               batch by batch; with --decode, the decode-only ceiling
With --device gpu, fn.readers.file, native and external move their outputs
with .gpu(). So one run gives native-gpu / reader-gpu and native-gpu /
fn.readers.file side by side:

    python bench/dali/bench_native.py DATA --batch 256 --threads 8 --device gpu \
        --modes fn.readers.file,native,native-gpu,reader-gpu

Each round builds each mode's pipeline, runs `--warmup` untimed batches and
then one epoch of batches (`pipe.run()`, no decoding), and records img/s;
the report is each mode's median, its ratio to fn.readers.file's median and
the median of its per-round ratios to it (paired), and the process's CPU time
per image (all threads; steadier than img/s on a shared machine). The files
are read once first so the page cache holds them (warm).
"""
import argparse
import sys

from fastread.bench.interleaved import (add_common_arguments, build_pipeline, parse_modes,
                                        print_report, run_rounds, warm_page_cache)


def build(mode, root, paths, labels, batch, threads, depth, op_args=None, output="bytes",
          device="cpu", decode=False):
    from nvidia.dali import fn

    def read():
        if mode == "fn.readers.file":
            return fn.readers.file(file_root=root, name="R")
        if mode in ("native", "native-gpu"):
            kw = dict(op_args or {})
            if mode == "native-gpu":
                kw["device"] = "gpu"
            return fn.fastread.readers.file(files=paths, labels=labels, name="R", **kw)
        if mode == "memory":
            data, labels_ = fn.external_source(source=InMemory(paths, labels, batch),
                                               num_outputs=2, batch=True, no_copy=True)
            return data, labels_
        from fastread.dali import readers
        if mode == "external-gpu":  # uploads by fastread's workers, fed to DALI on the GPU
            return readers.file(file_root=root, native=False, device="gpu")
        # The external source: pinned arenas when the pipeline has a GPU.
        return readers.file(file_root=root, native=False)

    if mode == "reader-gpu":
        return ReaderGpu(paths, labels, batch, op_args or {})
    gpu = device == "gpu" or mode in ("native-gpu", "external-gpu")
    # "shapes": the bytes stay inside the pipeline, as when a decoder
    # consumes them (which reads every byte from either reader's output alike).
    return build_pipeline(read, batch=batch, threads=threads, depth=depth, gpu=gpu,
                          decode=decode, shapes_only=output == "shapes")


class InMemory:
    """The files' bytes and labels, loaded once (shared by every round's
    pipeline), as batches that cycle through them in order: a source that
    costs DALI nothing but the references (no_copy=True)."""
    _cache = {}

    def __init__(self, paths, labels, batch):
        import numpy as np
        key = (tuple(paths), batch)
        if key not in InMemory._cache:
            data = [np.fromfile(p, dtype=np.uint8) for p in paths]
            labs = [np.array([lab], dtype=np.int32) for lab in labels]
            InMemory._cache[key] = [(data[i:i + batch], labs[i:i + batch])
                                    for i in range(0, len(paths) - batch + 1, batch)]
        self.batches = InMemory._cache[key]
        self.next = 0

    def __call__(self):
        out = self.batches[self.next]
        self.next = (self.next + 1) % len(self.batches)
        return out


class ReaderGpu:
    """fastread.Reader(device="gpu") on GPU 0, stepped like a pipeline: each
    run() is one batch delivered in GPU memory (its epochs roll over)."""

    def __init__(self, paths, labels, batch, kw):
        import fastread
        self.reader = fastread.Reader(files=paths, labels=labels, batch_size=batch,
                                      device="gpu", device_id=0, **kw)
        self.it = iter(self.reader)

    def run(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.reader)
            return next(self.it)

    def __del__(self):
        reader = getattr(self, "reader", None)  # None: the constructor failed
        if reader is not None:
            reader.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    add_common_arguments(ap, modes="fn.readers.file,native,external")
    ap.add_argument("--output", choices=("bytes", "shapes"), default="bytes",
                    help="pipeline outputs: the bytes read, or only their shapes (the bytes "
                         "consumed inside the pipeline, as a decoder would)")
    args = ap.parse_args(argv)

    from fastread.dali import _plugin
    from fastread.index import scan

    if not _plugin.load():
        sys.exit(f"native operator unavailable: {_plugin.reason()}")
    paths, labels = scan(args.data)
    labels = labels.tolist()
    warm_page_cache(paths)
    batches = len(paths) // args.batch
    modes = parse_modes(args.modes)

    def build_mode(mode, op_args):
        return build(mode, args.data, paths, labels, args.batch, args.threads,
                     args.prefetch_queue_depth, op_args, args.output, args.device, args.decode)

    rates, cpu = run_rounds(modes, build_mode, rounds=args.rounds, warmup=args.warmup,
                            batches=batches)
    what = "decoded" if args.decode else args.output
    header = (f"{len(paths)} files, batch {args.batch}, {args.threads} DALI threads, "
              f"device {args.device}, warm, outputs: {what}, median of {args.rounds} "
              f"interleaved rounds of {batches} batches")
    ceiling = next((m for m in ("reader-gpu", "memory") if m in rates), None)
    if ceiling == "reader-gpu":
        header += "\nratios: x fn.readers.file, and % of fastread.Reader(device='gpu') (reader-gpu)"
    elif ceiling:
        header += "\nratios: x fn.readers.file, and % of the same pipeline fed from memory (memory)"
    print_report(header, rates, cpu, base="fn.readers.file", ceiling=ceiling)


if __name__ == "__main__":
    main()
