"""WebDataset shards into DALI, warm: fastread's native operator
(fastread.dali.readers.webdataset, native=True) against DALI's
fn.readers.webdataset and fastread's external source (native=False),
interleaved round by round so a noisy machine hurts every mode alike.

    python bench/dali/wds_native.py DATA [--batch 64] [--threads 4] [--rounds 5] [--decode]
        [--device cpu|gpu] [--modes dali,native,native:workers=2,external]

DATA is a directory of shards (``fastread make-dataset DIR --format
webdataset``); components ``jpg;jpeg;png`` and ``cls``. Each round builds
every mode's pipeline, runs ``--warmup`` untimed batches, then ``--epochs``
epochs of batches, and records img/s and the process's CPU time per image
(all threads; steadier than img/s on a shared machine). The report is each
mode's median and its ratio to fn.readers.webdataset. With ``--decode`` the
JPEGs are decoded (DALI's CPU decoder, ``mixed`` with ``--device gpu``)
and the pipeline outputs their shapes; without it, the components' bytes.
``--shuffle`` sets ``random_shuffle=True`` on every reader.
"""
import argparse
import os
import sys

from fastread.bench.interleaved import (add_common_arguments, build_pipeline, parse_modes,
                                        print_report, run_rounds, warm_page_cache)

EXT = ["jpg;jpeg;png", "cls"]
MODES = ("dali", "native", "external")


def build(mode, paths, batch, threads, depth, kw, device, decode, shuffle):
    from nvidia.dali import fn

    from fastread.dali.formats import webdataset

    def read():
        if mode == "dali":
            return fn.readers.webdataset(paths=paths, ext=EXT, name="R", random_shuffle=shuffle)
        return webdataset(paths=paths, ext=EXT, native=mode == "native", name="R",
                          random_shuffle=shuffle, **kw)

    return build_pipeline(read, batch=batch, threads=threads, depth=depth, gpu=device == "gpu",
                          decode=decode)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    add_common_arguments(ap, modes="dali,native,external", warmup=5)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--shuffle", action="store_true",
                    help="random_shuffle=True (DALI's reader: a buffer of initial_fill "
                         "samples; fastread: one permutation of all samples per epoch)")
    args = ap.parse_args(argv)

    from fastread.dali import _plugin
    from fastread.formats.webdataset import WebDataset

    modes = parse_modes(args.modes, known=MODES)
    if any(name == "native" for _, name, _ in modes) and not _plugin.load():
        sys.exit(f"native operator unavailable: {_plugin.reason()}")
    paths = sorted(os.path.join(args.data, n) for n in os.listdir(args.data)
                   if n.endswith((".tar", ".tar.gz", ".tgz")))
    if not paths:
        sys.exit(f"no shards (*.tar, *.tar.gz) in {args.data}")
    samples = len(WebDataset(paths, EXT, grouping="dali"))
    warm_page_cache(paths)
    batches = max(1, int(samples * args.epochs) // args.batch)

    def build_mode(mode, kw):
        return build(mode, paths, args.batch, args.threads, args.prefetch_queue_depth, kw,
                     args.device, args.decode, args.shuffle)

    rates, cpu = run_rounds(modes, build_mode, rounds=args.rounds, warmup=args.warmup,
                            batches=batches, width=24)
    print_report(
        f"{samples} samples in {len(paths)} shards, batch {args.batch}, {args.threads} DALI "
        f"threads, device {args.device}, warm, {'decoded' if args.decode else 'bytes'}"
        f"{', shuffled' if args.shuffle else ''}, "
        f"median of {args.rounds} interleaved rounds of {batches} batches\n"
        "img/s: median of the rounds (its ratio to fn.readers.webdataset's median), and "
        "the median of the per-round ratios (each mode against fn.readers.webdataset run "
        "next to it: steadier on a shared machine); CPU-us/img: all threads of the process "
        "(fn.readers.webdataset's / the mode's)", rates, cpu, base="dali", width=24)


if __name__ == "__main__":
    main()
