"""``fastread bench``: read throughput of each mode over one dataset tree.

Each mode (see :mod:`fastread.cli.modes`) runs ``--warmup`` untimed batches
and then ``--batches`` timed ones (default: one epoch; ``--epochs E``: E
epochs), ``--repeat`` times, each time with a freshly built pipeline or
reader (and, with ``--cold``, after dropping the page cache). The table
shows the median run by img/s (the lower median for an even count):

* img/s  -- samples / second over the timed batches;
* GB/s   -- bytes of encoded data (sum of sample sizes) / second / 1e9;
* vs dali -- img/s relative to the ``dali`` mode, if it ran.

A mode that cannot run here says why in one line and is skipped.
"""
import gc
import json
import math
import os
import statistics
import sys
import time

from fastread.cli._args import key_value, nonnegative_int, positive_int

#: Written with "3" by --cold (a module attribute so tests can redirect it).
DROP_CACHES = "/proc/sys/vm/drop_caches"


def add_parser(sub):
    p = sub.add_parser(
        "bench",
        help="measure img/s and GB/s of DALI, Python and fastread readers",
        description="Read DATA_DIR batch by batch with each mode (DALI's reader, the seed's "
                    "Python reader, fastread's engines) and report img/s and GB/s of encoded "
                    "data. A mode that cannot run here says why in one line and is skipped.",
        epilog="Modes: dali, python-file, fastread-<engine>, read_files-<engine>, python-loop, "
               "xnvme-file, xnvme-gds, xnvme-bam; default: every mode that can run here. "
               "`fastread bench --list-modes` shows them with why any cannot run.")
    p.add_argument("data_dir", metavar="DATA_DIR", nargs="?",
                   help="dataset root with one directory per class (as fn.readers.file reads)")
    p.add_argument("--modes", default=None, metavar="A,B,...",
                   help="comma-separated modes to run (default: all that can run here)")
    p.add_argument("--list-modes", action="store_true",
                   help="list every mode and whether it can run here, then exit")
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
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: device_id=None; gpu: device_id=0, data.gpu() or mixed decoding "
                        "(default: cpu)")
    p.add_argument("--prefetch-queue-depth", type=positive_int, default=2, metavar="N",
                   help="DALI prefetch_queue_depth (default: 2)")
    p.add_argument("--cold", action="store_true",
                   help=f"sync and write 3 to {DROP_CACHES} before each run (needs root)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, metavar="N",
                   help="untimed batches at the start of each run (default: 1)")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="R",
                   help="runs per mode; the median is reported (default: 1)")
    p.add_argument("--rss", action="store_true",
                   help="sample the process RSS after each epoch; report the max and the "
                        "growth from epoch 2 to the last")
    p.add_argument("--engine-option", dest="engine_options", type=key_value, action="append",
                   default=[], metavar="KEY=VALUE",
                   help="option for fastread engines (repeatable), e.g. o_direct=1, "
                        "queue_depth=128")
    p.add_argument("--mem", choices=("cpu", "gpu"), default=None,
                   help="where xnvme-gds reads land: host memory or the GPU")
    p.add_argument("--json", metavar="OUT.json", help="write the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="bar chart of img/s per mode (matplotlib)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they show only when stderr is a terminal)")
    p.set_defaults(run=run, _parser=p)
    return p


# -- argument checks -----------------------------------------------------------
def _engine_options(args, parser):
    from fastread.engine import OPTION_NAMES, options

    opts = {"threads": args.threads}
    reader_opts = {}
    for key, value in args.engine_options:
        if key == "workers":  # a Reader option, not an engine's
            reader_opts[key] = int(value)  # "1" parses as True
            continue
        if key not in OPTION_NAMES:
            parser.error(f"--engine-option {key}={value}: unknown option {key!r}; "
                         f"valid options: workers, {', '.join(OPTION_NAMES)}")
        opts[key] = value
    try:
        options("psync", **opts)  # the checks are the same for every engine
        opts.update(reader_opts)
    except (TypeError, ValueError) as e:
        parser.error(f"--engine-option: {e}")
    return opts


def _select(args, parser, modes):
    by_name = {m.name: m for m in modes}
    if args.modes is None:
        return list(modes)
    names = [n.strip() for n in args.modes.split(",") if n.strip()]
    if not names:
        parser.error("--modes: no mode given")
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"--modes: unknown mode{'s' if len(unknown) > 1 else ''} "
                     f"{', '.join(unknown)}; valid modes: {', '.join(by_name)}")
    return [by_name[n] for n in dict.fromkeys(names)]


# -- measurement ---------------------------------------------------------------
def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _Cold:
    def __init__(self, enabled):
        self.enabled = enabled
        self.effective = enabled

    def drop(self):
        if not self.effective:
            return
        try:
            os.sync()
            with open(DROP_CACHES, "w") as f:
                f.write("3")
        except OSError as e:
            print(f"--cold: cannot drop the page cache ({DROP_CACHES}: "
                  f"{e.strerror or e}); running warm", flush=True)
            self.effective = False


def _timed_run(runner, *, warmup, batches, epoch_batches, rss, progress, desc):
    from tqdm import tqdm

    bar = tqdm(total=warmup + batches, desc=desc, unit="batch", leave=False,
               disable=None if progress is None else not progress, file=sys.stderr,
               dynamic_ncols=True)
    try:
        for _ in range(warmup):
            runner.next()
            bar.update()
        samples = nbytes = 0
        rss_samples = []
        t0 = time.perf_counter()
        for i in range(1, batches + 1):
            s, b = runner.next()
            samples += s
            nbytes += b
            if rss and (i % epoch_batches == 0 or i == batches):
                rss_samples.append(_rss_bytes())
            bar.update()
        seconds = time.perf_counter() - t0
    finally:
        bar.close()
    return {"samples": samples, "bytes": nbytes, "batches": batches, "seconds": seconds,
            "img_per_s": samples / seconds if seconds > 0 else math.inf,
            "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else math.inf,
            "rss": rss_samples if rss else None}


def _summarize(mode, runs, rss):
    median = statistics.median_low([r["img_per_s"] for r in runs])
    med = next(r for r in runs if r["img_per_s"] == median)
    out = {"mode": mode.name, "kind": mode.kind, "engine": mode.engine,
           "img_per_s": med["img_per_s"], "gb_per_s": med["gb_per_s"],
           "batches": med["batches"], "seconds": med["seconds"], "samples": med["samples"],
           "bytes": med["bytes"], "runs": runs}
    if rss:
        vals = [v for r in runs for v in (r["rss"] or []) if v is not None]
        growth = [r["rss"][-1] - r["rss"][1] for r in runs
                  if r["rss"] and len(r["rss"]) >= 2 and None not in r["rss"]]
        out["rss_max"] = max(vals) if vals else None
        out["rss_growth"] = max(growth) if growth else None
    return out


# -- output ----------------------------------------------------------------------
def _mb(v):
    return "n/a" if v is None else f"{v / 2**20:.1f}"


def format_table(results, rss=False):
    dali = next((r["img_per_s"] for r in results if r["mode"] == "dali"), None)
    # The disk's ceiling (a ceiling-<engine> mode), judged by bytes: a share
    # of its GB/s for every mode.
    ceiling = max((r["gb_per_s"] for r in results if r.get("kind") == "ceiling"), default=None)
    head = ["mode", "img/s", "GB/s", "batches", "seconds"]
    if dali:
        head.append("vs dali")
    if ceiling:
        head.append("of ceiling")
    if rss:
        head += ["max RSS MiB", "RSS growth MiB"]
    rows = []
    for r in results:
        row = [r["mode"], f"{r['img_per_s']:,.0f}", f"{r['gb_per_s']:.3f}", str(r["batches"]),
               f"{r['seconds']:.3f}"]
        if dali:
            row.append(f"{r['img_per_s'] / dali:.2f}x")
        if ceiling:
            row.append(f"{100 * r['gb_per_s'] / ceiling:.0f}%")
        if rss:
            row += [_mb(r.get("rss_max")), _mb(r.get("rss_growth"))]
        rows.append(row)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def write_plot(path, results, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["mode"] for r in results]
    vals = [r["img_per_s"] for r in results]
    lo = [v - min(x["img_per_s"] for x in r["runs"]) for v, r in zip(vals, results)]
    hi = [max(x["img_per_s"] for x in r["runs"]) - v for v, r in zip(vals, results)]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names) + 2), 4.5))
    colors = ["#76b900" if n.startswith(("fastread-", "read_files-")) else
              "#4c72b0" if n == "dali" else "#999999" for n in names]
    bars = ax.bar(names, vals, yerr=[lo, hi] if any(lo) or any(hi) else None, capsize=4,
                  color=colors)
    for b, v, h in zip(bars, vals, hi):
        ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v + h),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                    textcoords="offset points")
    ax.set_ylabel("images / s")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelrotation=30)
    for t in ax.get_xticklabels():
        t.set_ha("right")
    ax.margins(y=0.12)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the command -------------------------------------------------------------------
def run(args):
    parser = args._parser
    import fastread
    from fastread.cli import modes as M

    if args.data_dir is None and not args.list_modes:
        parser.error("the following arguments are required: DATA_DIR")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        parser.error(f"DATA_DIR {args.data_dir!r} is not a directory")
    if args.plot:
        from fastread.cli._env import try_import
        if try_import("matplotlib")[0] is None:
            parser.error("--plot needs matplotlib (pip install matplotlib)")
    engine_options = _engine_options(args, parser)
    env = M.probe_environment(fastread.engines())
    table = M.all_modes(env.engines)
    selected = _select(args, parser, table)

    if args.list_modes:
        width = max(len(m.name) for m in table)
        for m in table:
            why = M.unavailable(m, env, device=args.device, decode=args.decode, mem=args.mem)
            print(f"{m.name:<{width}}  {'ok' if why is None else 'not available: ' + why}"
                  f"  -- {m.help}")
        return 0

    from fastread.cli import numpy_modes
    try:
        if numpy_modes.is_numpy_run(selected):
            from fastread.index import scan_numpy
            paths = scan_numpy(args.data_dir)
            labels = [0] * len(paths)
        else:
            paths, labels = fastread.scan(args.data_dir)
    except (OSError, ValueError) as e:
        parser.error(f"cannot index DATA_DIR: {e}")
    if not paths:
        parser.error(f"DATA_DIR {args.data_dir!r} holds no samples "
                     "(expected one directory per class with image files)")
    total_bytes = sum(os.path.getsize(p) for p in paths)
    cfg = M.Config(data_dir=args.data_dir, paths=paths, labels=labels,
                   batch_size=args.batch_size, threads=args.threads, device=args.device,
                   decode=args.decode, prefetch_queue_depth=args.prefetch_queue_depth,
                   engine_options=engine_options, mem=args.mem or "cpu")
    epoch = cfg.epoch_batches
    batches = args.batches if args.batches else epoch * (args.epochs or 1)
    print(f"dataset {args.data_dir}: {len(paths)} files, {total_bytes / 1e9:.3f} GB, "
          f"{epoch} batches of {args.batch_size} per epoch; timing {batches} batches "
          f"(+{args.warmup} warmup) x {args.repeat} run(s), device {args.device}"
          f"{', decode' if args.decode else ''}, threads {args.threads}", flush=True)

    cold = _Cold(args.cold)
    results, skipped, failed = [], {}, {}
    for mode in selected:
        why = M.unavailable(mode, env, device=args.device, decode=args.decode, mem=args.mem,
                            cfg=cfg)
        if why is not None:
            skipped[mode.name] = why
            print(f"mode {mode.name}: not available: {why}", flush=True)
            continue
        runs = []
        try:
            for r in range(args.repeat):
                cold.drop()
                runner = M.build(mode, cfg)
                try:
                    desc = mode.name + (f" [{r + 1}/{args.repeat}]" if args.repeat > 1 else "")
                    runs.append(_timed_run(runner, warmup=args.warmup, batches=batches,
                                           epoch_batches=epoch, rss=args.rss,
                                           progress=False if args.no_progress else None,
                                           desc=desc))
                finally:
                    runner.close()
                    del runner
                    gc.collect()
        except Exception as e:  # a mode that breaks at run time: say so, go on
            msg = str(e).strip().splitlines()
            failed[mode.name] = f"{type(e).__name__}: {msg[0] if msg else ''}"
            print(f"mode {mode.name}: failed: {failed[mode.name]}", flush=True)
            continue
        res = _summarize(mode, runs, args.rss)
        results.append(res)
        spread = ""
        if len(runs) > 1:
            spread = " (runs: " + ", ".join(f"{x['img_per_s']:,.0f}" for x in runs) + ")"
        print(f"mode {mode.name}: {res['img_per_s']:,.0f} img/s, {res['gb_per_s']:.3f} GB/s"
              f"{spread}", flush=True)

    if results:
        print()
        print(format_table(results, rss=args.rss))
    else:
        print("no mode ran")
    if args.cold and not cold.effective:
        print("(--cold was requested but the page cache could not be dropped: warm results)")

    if args.json:
        doc = {
            "fastread": fastread.__version__,
            "argv": getattr(args, "_argv", None),
            "dataset": {"root": os.path.abspath(args.data_dir), "files": len(paths),
                        "bytes": total_bytes, "epoch_batches": epoch},
            "config": {"batch_size": args.batch_size, "batches": batches, "epochs": args.epochs,
                       "warmup": args.warmup, "repeat": args.repeat, "threads": args.threads,
                       "device": args.device, "decode": args.decode,
                       "prefetch_queue_depth": args.prefetch_queue_depth,
                       "cold": args.cold, "cold_effective": cold.effective,
                       "engine_options": engine_options},
            "results": results,
            "skipped": skipped,
            "failed": failed,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    if args.plot and results:
        title = (f"{os.path.basename(os.path.abspath(args.data_dir))}: batch {args.batch_size}, "
                 f"{batches} batches, {args.threads} threads, {args.device}"
                 f"{', decode' if args.decode else ''}{', cold' if cold.effective else ''}"
                 f"{f', median of {args.repeat}' if args.repeat > 1 else ''}")
        write_plot(args.plot, results, title)
        print(f"wrote {args.plot}")
    return 1 if failed else 0
