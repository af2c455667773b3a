"""Warm read throughput of fastread.dali.readers.image (a packed image) through
the native operator against the external source, interleaved round by round
so that a noisy machine hurts every mode alike.

    python bench/dali/bench_image.py IMAGE [--batch 64] [--threads 4] [--rounds 5]
        [--modes native,external,native-files,fn.readers.file] [--root DIR]
        [--device cpu|gpu] [--decode]

Modes:
  native          readers.image(native=True): fn.fastread.readers.file(image=...)
  external        readers.image(native=False): the external source fed by
                  fastread.Reader over the image
  native-gpu      readers.image(native=True, device="gpu"): the operator's own
                  GPU outputs (a pipeline on GPU 0)
  external-gpu    readers.image(native=False, device="gpu")
  native-files    readers.file(native=True) over the directory that was packed
                  (--root, default: the image index's file_root)
  fn.readers.file DALI's own reader over that directory
Arguments after a colon are readers.image keywords joined by `+`, e.g.
`native:o_direct=true` (with O_DIRECT the reads bypass the page cache: not a
warm measurement).

Each round builds each mode's pipeline, runs `--warmup` untimed batches and
then one epoch of batches (`pipe.run()`), and records img/s; the report is
each mode's median, its ratio to the first mode's median and the median of
its per-round ratios to it (paired), and the process's CPU time per image
(all threads). The image (and --root's files, for the file modes)
are read once first, so the page cache holds them (warm).
"""
import argparse
import sys

from fastread.bench.interleaved import (add_common_arguments, build_pipeline, parse_modes,
                                        print_report, run_rounds, warm_page_cache)


KNOWN = ("native", "external", "native-gpu", "external-gpu", "native-files", "fn.readers.file")


def build(mode, image, root, batch, threads, depth, kw, device, decode):
    from nvidia.dali import fn

    from fastread.dali import readers

    gpu = device == "gpu" or mode.endswith("-gpu")

    def read():
        if mode == "fn.readers.file":
            return fn.readers.file(file_root=root, name="R")
        if mode == "native-files":
            return readers.file(file_root=root, native=True, name="R", **kw)
        native = mode.startswith("native")
        return readers.image(image=image, native=native, name="R",
                             device="gpu" if mode.endswith("-gpu") else "cpu", **kw)

    return build_pipeline(read, batch=batch, threads=threads, depth=depth, gpu=gpu,
                          decode=decode)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image")
    ap.add_argument("--root", help="the packed directory, for the file modes")
    add_common_arguments(ap, modes="native,external")
    args = ap.parse_args(argv)

    from fastread.dali import _plugin
    from fastread.image import PackedImage

    if not _plugin.load():
        sys.exit(f"native operator unavailable: {_plugin.reason()}")
    img = PackedImage(args.image)
    modes = parse_modes(args.modes, known=KNOWN)
    root = args.root or img.file_root
    warm_page_cache([img.path])
    if any(name in ("native-files", "fn.readers.file") for _, name, _ in modes):
        if not root:
            sys.exit("the file modes need --root (the index names no file_root)")
        from fastread.index import scan
        warm_page_cache(scan(root)[0])
    batches = len(img) // args.batch

    def build_mode(mode, kw):
        return build(mode, img.path, root, args.batch, args.threads, args.prefetch_queue_depth,
                     kw, args.device, args.decode)

    rates, cpu = run_rounds(modes, build_mode, rounds=args.rounds, warmup=args.warmup,
                            batches=batches)
    first = modes[0][0]
    mean_kb = img.lengths.mean() / 1024 if len(img) else 0
    print_report(f"{len(img)} samples (mean {mean_kb:.0f} KiB) in {args.image}, batch "
                 f"{args.batch}, {args.threads} DALI threads, device {args.device}, warm, "
                 f"{'decoded' if args.decode else 'bytes'}; median of {args.rounds} interleaved "
                 f"rounds of {batches} batches; ratios to {first}", rates, cpu, base=first)


if __name__ == "__main__":
    main()
