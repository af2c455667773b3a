"""``python -m fastread.bench.sweep``: any ``fastread bench`` modes over a
sweep of queue depths (warm, ``--cold``: page cache dropped before each run,
or ``--evict``: only this dataset's files and image evicted).

Used by ``bench/gpu.sh image`` to time block-level reads of a packed image
against file-level modes and the disk's ceiling.
"""
import argparse
import dataclasses
import json
import os
import sys

from fastread.bench import environment, registry, report, runners


def evict(paths):
    """Drops these files' pages from the page cache (dirty pages are synced first)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _positive(text):
    try:
        v = int(text, 0)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _key_value(text):
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), int(raw, 0)
    except ValueError:
        return key.strip(), raw


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m fastread.bench.sweep",
        description="Time fastread bench modes for each queue depth (warm, --cold or --evict).")
    p.add_argument("data", metavar="DATA", help="dataset directory (or a packed image)")
    p.add_argument("--image", help="packed image of DATA (default: DATA.img)")
    p.add_argument("--modes", default="image-io_uring,reader-io_uring,dali",
                   help="comma-separated modes or globs (default: %(default)s)")
    p.add_argument("--queue-depths", default="32,64,128", metavar="A,B,...",
                   help="queue depths to sweep (modes with an engine; default: 32,64,128)")
    p.add_argument("--batchsize", dest="batch_size", type=_positive, default=64)
    p.add_argument("--batches", type=_positive, default=None,
                   help="timed batches per run (default: one epoch)")
    p.add_argument("--threads", type=_positive, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=_positive, default=1)
    p.add_argument("--cold", action="store_true",
                   help="drop the whole page cache before each run (needs root)")
    p.add_argument("--evict", action="store_true",
                   help="evict the dataset's files and the image from the page cache "
                        "(posix_fadvise DONTNEED) before each run")
    p.add_argument("--engine-option", dest="engine_options", type=_key_value, action="append",
                   default=[], metavar="KEY=VALUE")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    try:
        depths = [int(x) for x in args.queue_depths.split(",")]
    except ValueError:
        p.error(f"--queue-depths {args.queue_depths!r}: expected integers such as 32,64")
    try:
        dataset = registry.detect_dataset(args.data, args.image)
        env = environment.probe_environment()
        modes, _ = registry.select(args.modes, registry.all_modes(env), dataset, "cpu")
    except registry.BenchError as e:
        p.error(str(e))
    page_cache = runners.PageCache()
    if args.cold and page_cache.can_drop():
        p.error(f"--cold: {page_cache.can_drop()}")
    epoch = registry.epoch_batches(dataset.samples, args.batch_size)
    batches = args.batches or epoch
    print(f"{dataset.describe()}; {batches} batches of {args.batch_size}"
          f"{', cold' if args.cold else ', evicted' if args.evict else ', warm'}", flush=True)
    results = []
    for mode in modes:
        for qd in (depths if mode.engine else [None]):
            opts = dict({"threads": args.threads}, **dict(args.engine_options))
            if qd:
                opts["queue_depth"] = qd
            cfg = runners.Config(env=env, dataset=dataset, batch_size=args.batch_size,
                                 threads=args.threads, engine_options=opts)
            label = mode.name + (f" qd={qd}" if qd else "")
            why = ("does not apply to this dataset" if not registry.applies(mode, dataset)
                   else mode.unavailable(cfg))
            if why:
                print(f"{label}: not available: {why}", flush=True)
                continue
            runs = []
            for _ in range(args.repeat):
                if args.cold:
                    page_cache.drop()
                if args.evict:
                    evict(list(dataset.paths or [])
                          + ([dataset.image] if dataset.image else []))
                runner = mode.build(mode, cfg)
                try:
                    runs.append(runners.timed_run(runner, warmup=args.warmup, batches=batches,
                                                  epoch_batches=epoch, progress=False,
                                                  desc=label))
                finally:
                    runner.close()
            res = runners.summarize(dataclasses.replace(mode, name=label), runs,
                                    cache="cold" if args.cold else "warm")
            results.append(res)
            print(f"{label}: {res['img_per_s']:,.0f} img/s, {res['gb_per_s']:.3f} GB/s",
                  flush=True)
    print()
    if results:
        print(report.format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "cold": args.cold, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
