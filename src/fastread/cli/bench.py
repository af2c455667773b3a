"""``fastread bench``: the command line of :mod:`fastread.bench`.

This module only parses arguments; the modes, the timing and the report are
:mod:`fastread.bench`'s (``fastread.bench.harness.run``).
"""
import argparse
import sys

from fastread.cli._args import key_value, nonnegative_int, positive_int

CACHE_CHOICES = ("auto", "warm", "cold", "both")


def add_parser(sub):
    p = sub.add_parser(
        "bench",
        help="fastread against DALI's reader and a Python external source, on this data",
        description="Read DATA batch by batch with DALI's own reader, the plain Python "
                    "external source and fastread, and report img/s, GB/s and a one-line "
                    "verdict. Without --modes, the headline modes for this kind of dataset "
                    "run, warm and (when the page cache can be dropped) cold. Modes that do "
                    "not apply to the dataset are not attempted; modes that cannot run here "
                    "say why. Exit status 0 unless a mode that was attempted failed.",
        epilog="`fastread bench --list-modes [DATA]` lists every mode, whether it applies "
               "and can run here, and why not.")
    p.add_argument("data", metavar="DATA", nargs="?",
                   help="dataset: a directory with one directory per class (image files, as "
                        "fn.readers.file reads it, or .npy arrays), a packed image, or "
                        "s3://bucket/prefix (objects prefix/CLASS/NAME on an S3 server: the s3 "
                        "modes; --cache does not apply)")
    p.add_argument("--modes", default=None, metavar="A,B,...",
                   help="modes to run, comma-separated names or globs (reader-*), or 'all' "
                        "(every mode that applies to DATA); default: the headline modes")
    p.add_argument("--list-modes", action="store_true",
                   help="list every mode and whether it can run here (and on DATA), then exit")
    p.add_argument("--image", metavar="IMAGE",
                   help="packed image of DATA for the image modes (default: "
                        "$FASTREAD_BENCH_IMAGE, else DATA.img if it exists)")
    p.add_argument("--batchsize", "--batch-size", dest="batch_size", type=positive_int,
                   default=64, metavar="N", help="samples per batch (default: 64)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--batches", type=positive_int, default=None, metavar="N",
                        help="timed batches per run (default: one full epoch)")
    length.add_argument("--epochs", type=positive_int, default=None, metavar="E",
                        help="time E full epochs per run instead of --batches")
    p.add_argument("--threads", type=positive_int, default=4, metavar="T",
                   help="DALI num_threads and fastread engine threads (default: 4)")
    p.add_argument("--decode", action="store_true",
                   help="decode the images (fn.decoders.image) after the reader; DALI modes only")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="gpu: batches to GPU memory (data.gpu(), mixed decoding, device='gpu'); "
                        "auto: gpu when a CUDA device is visible, else cpu (default)")
    p.add_argument("--prefetch-queue-depth", type=positive_int, default=2, metavar="N",
                   help="DALI prefetch_queue_depth (default: 2)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache", choices=CACHE_CHOICES, default="auto",
                       help="page cache: warm, cold (dropped before every timed epoch; needs root), "
                            "both, or auto: warm, then cold when it can be dropped (default)")
    cache.add_argument("--cold", dest="cache", action="store_const", const="cold",
                       help="the same as --cache cold")
    p.add_argument("--warmup", type=nonnegative_int, default=1, metavar="N",
                   help="untimed batches at the start of each timed run (default: 1)")
    p.add_argument("--warmup-runs", type=nonnegative_int, default=1, metavar="N",
                   help="untimed runs of each mode (up to one epoch each) before its timed "
                        "runs: the first pipeline of a mode is often an outlier (default: 1)")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="R",
                   help="timed runs per mode; the median is reported (default: 1)")
    p.add_argument("--rss", action="store_true",
                   help="sample the process RSS after each epoch; report the max and the "
                        "growth from epoch 2 to the last")
    p.add_argument("--engine-option", dest="engine_options", type=key_value, action="append",
                   default=[], metavar="KEY=VALUE",
                   help="option for fastread engines (repeatable), e.g. o_direct=1, "
                        "queue_depth=128, workers=4; s3.NAME=VALUE sets a fastread.S3Options "
                        "field for s3:// DATA (s3.endpoint_url=http://host:port, s3.region, "
                        "s3.inflight, ...; default: the AWS_* environment), which the s3 "
                        "family's other clients (boto3, DALI, curl) are given too")
    p.add_argument("--mem", choices=("cpu", "gpu"), default=None,
                   help="where xnvme-gds reads land: host memory or the GPU")
    p.add_argument("--json", metavar="OUT.json", help="write the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="bar chart of img/s per mode (matplotlib)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they show only when stderr is a terminal)")
    p.add_argument("--family", nargs=argparse.REMAINDER, metavar="NAME ARGS",
                   help="run a family that is a run of its own (scale: `fastread bench "
                        "--family scale --help`); everything after NAME is its arguments")
    p.set_defaults(run=run, _parser=p)
    return p


def _engine_options(args, parser):
    from fastread.engine import OPTION_NAMES, options

    opts = {"threads": args.threads}
    reader_opts = {}
    s3 = {}
    for key, value in args.engine_options:
        if key.startswith("s3."):  # a field of fastread.S3Options
            s3[key[3:]] = value
            continue
        if key in ("workers", "prefetch"):  # Reader options, not an engine's
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                parser.error(f"--engine-option {key}={value}: expected a positive integer")
            reader_opts[key] = value
            continue
        if key not in OPTION_NAMES:
            parser.error(f"--engine-option {key}={value}: unknown option {key!r}; "
                         f"valid options: workers, prefetch, {', '.join(OPTION_NAMES)}")
        opts[key] = value
    try:
        options("psync", **opts)  # the checks are the same for every engine
    except (TypeError, ValueError) as e:
        parser.error(f"--engine-option: {e}")
    if s3:
        from fastread.s3 import S3Options, is_url

        if args.data is not None and not is_url(args.data):
            parser.error(f"--engine-option s3.*: only for s3:// DATA, not {args.data!r}")
        # Endpoints and numbers as typed: key_value makes "8333" an int,
        # and an endpoint or region is a string.
        s3 = {k: str(v) if k in _S3_STRINGS and not isinstance(v, str) else v
              for k, v in s3.items()}
        try:
            S3Options.coerce(s3)  # names and types now, as one line
        except (TypeError, ValueError) as e:
            parser.error(f"--engine-option s3.*: {e}")
        opts["s3"] = s3  # a mapping: JSON-able (secrets redacted when written)
    opts.update(reader_opts)
    return opts


#: S3Options fields that are strings even when they look like numbers.
_S3_STRINGS = ("endpoint_url", "region", "profile", "addressing", "ca_bundle",
               "access_key_id", "secret_access_key", "session_token")


def run(args):
    parser = args._parser
    from fastread.bench.harness import Options, run as run_bench
    from fastread.bench.registry import BenchError

    if args.family is not None:
        from fastread.bench.registry import family_main

        if not args.family:
            parser.error("--family: expected a family name (e.g. --family scale)")
        try:
            return family_main(args.family[0])(args.family[1:])
        except BenchError as e:
            parser.error(str(e))
    if args.data is None and not args.list_modes:
        parser.error("the following arguments are required: DATA")
    if args.plot:
        from fastread.bench.environment import try_import
        if try_import("matplotlib")[0] is None:
            parser.error("--plot needs matplotlib (pip install matplotlib)")
    opts = Options(
        data=args.data, modes=args.modes, list_modes=args.list_modes, image=args.image,
        batch_size=args.batch_size, batches=args.batches, epochs=args.epochs,
        threads=args.threads, decode=args.decode, device=args.device,
        prefetch_queue_depth=args.prefetch_queue_depth, cache=args.cache,
        warmup=args.warmup, warmup_runs=args.warmup_runs, repeat=args.repeat, rss=args.rss,
        engine_options=_engine_options(args, parser), mem=args.mem, json=args.json,
        plot=args.plot, progress=False if args.no_progress else None,
        argv=getattr(args, "_argv", None))
    try:
        return run_bench(opts)
    except BenchError as e:
        parser.error(str(e))
    except ValueError as e:  # a FASTREAD_* variable that does not parse, ...
        print(f"fastread bench: error: {e}", file=sys.stderr)
        return 1
