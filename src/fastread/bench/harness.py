"""The benchmark run: pick the modes for a dataset, time each one warm and
cold, print the tables and the verdict, write JSON and the plot.

:func:`run` takes an :class:`Options` (what ``fastread bench`` parsed) and
returns the exit status: 0 unless a mode that was attempted failed. Modes
that do not apply to the dataset are not attempted; modes that cannot run
here are skipped with their reason. Usage errors raise
:class:`~fastread.bench.registry.BenchError` (one line, naming the path,
option or mode).
"""
import dataclasses
import gc
import json
import math
import os

from fastread.bench import environment, registry, report, runners
from fastread.bench.registry import BenchError


@dataclasses.dataclass
class Options:
    data: str = None
    modes: str = None                 # None: the headline run; "all"; names or globs
    list_modes: bool = False
    image: str = None
    batch_size: int = 64
    batches: int = None
    epochs: int = None
    threads: int = 4
    decode: bool = False
    device: str = "auto"              # auto: gpu if a CUDA device is visible, else cpu
    prefetch_queue_depth: int = 2
    cache: str = "auto"               # auto (warm, and cold if possible), warm, cold, both
    warmup: int = 1                   # untimed batches at the start of each timed run
    warmup_runs: int = 1              # untimed runs of each mode before its timed runs
    repeat: int = 1
    rss: bool = False
    engine_options: dict = dataclasses.field(default_factory=dict)
    mem: str = None
    json: str = None
    plot: str = None
    progress: bool = None             # None: when stderr is a terminal
    argv: list = None


def _out(*parts):
    print(*parts, flush=True)


def _device(opts, env):
    """(device, note): --device auto picks the GPU when one is visible."""
    if opts.device != "auto":
        return opts.device, None
    if env.cuda_error is None:
        return "gpu", "device gpu (a CUDA device is visible; --device cpu for host memory)"
    return "cpu", "device cpu (no CUDA device: `fastread info` says why)"


def _config(opts, env, dataset, device):
    return runners.Config(env=env, dataset=dataset, batch_size=opts.batch_size,
                          threads=opts.threads, device=device, decode=opts.decode,
                          prefetch_queue_depth=opts.prefetch_queue_depth,
                          engine_options=dict(opts.engine_options), mem=opts.mem)


_KIND_SHORT = {"files": "a file tree", "image": "a packed image", "npy": "a .npy tree"}


def list_modes(opts):
    """Every mode, by family, with whether it applies to DATA (if given) and
    can run here, and why not."""
    env = environment.probe_environment()
    device, _ = _device(opts, env)
    dataset = (registry.detect_dataset(opts.data, opts.image, engine_options=opts.engine_options)
               if opts.data else None)
    cfg = _config(opts, env, dataset, device)
    modes = registry.all_modes(env)
    headline = {m.name for m in registry.defaults(modes, dataset, device)}
    width = max(len(m.name) for m in modes)
    where = f" for {dataset.describe()}" if dataset else ""
    _out(f"modes{where}, device {device} (* = in the default run):")
    family, notes = None, {}
    for m in modes:
        if m.family != family:
            family = m.family
            _out(f"[{family}]")
        if not registry.applies(m, dataset):
            state = ("does not apply (reads "
                     f"{_KIND_SHORT.get(m.dataset) or registry.DATASET_KINDS[m.dataset]})")
        else:
            why = m.unavailable(cfg)
            if why is None:
                state = "ok"
            elif len(why) > 60:  # long reasons (an engine's) once, as a note below
                state = f"not available [{notes.setdefault(why, len(notes) + 1)}]"
            else:
                state = "not available: " + why
        star = "*" if m.name in headline else " "
        _out(f"{star} {m.name:<{width}}  {state}  -- {m.help}")
    for why, n in notes.items():
        _out(f"[{n}] {why}")
    for name, why in registry.broken_families().items():
        _out(f"family module {name}: cannot be imported: {why}")
    return 0


#: The one "cache state" of a dataset that is not read through this
#: machine's page cache (objects on a server).
NO_PAGE_CACHE = "none"


def _cache_passes(opts, page_cache, dataset=None):
    """(passes, note): which cache states to time, and why cold is left out."""
    if dataset is not None and not dataset.page_cache:
        # Objects come from a server every time: there is no page cache of
        # ours to warm or drop (and dropping it would only disturb a server
        # on this machine). Refused when asked for, not silently warm.
        if opts.cache in ("cold", "both"):
            raise BenchError(f"--cache {opts.cache}: {dataset.root} is not read through this "
                             "machine's page cache (objects come from the server every run); "
                             "leave --cache out")
        return [NO_PAGE_CACHE], (f"cache: does not apply to {dataset.root} (objects come from "
                                 "the server every run)")
    if opts.cache == "warm":
        return ["warm"], None
    why = page_cache.can_drop()
    if opts.cache == "auto":
        if why:
            return ["warm"], f"cold: not measured: {why}"
        return ["warm", "cold"], None
    if why:  # cold or both were asked for
        return ["warm"], f"--cold: {why}; running warm"
    return (["cold"] if opts.cache == "cold" else ["warm", "cold"]), None


def run(opts):
    """The benchmark; returns the exit status (0 unless an attempted mode failed)."""
    import fastread

    if opts.list_modes:
        return list_modes(opts)
    if not opts.data:
        raise BenchError("DATA is required (a dataset directory or a packed image)")
    for flag, path in (("--json", opts.json), ("--plot", opts.plot)):
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        if parent and not os.path.isdir(parent):
            raise BenchError(f"{flag} {path}: directory {parent} does not exist")
    env = environment.probe_environment()
    device, device_note = _device(opts, env)
    dataset = registry.detect_dataset(opts.data, opts.image, engine_options=opts.engine_options)
    modes = registry.all_modes(env)
    selected, explicit = registry.select(opts.modes, modes, dataset, device)
    cfg = _config(opts, env, dataset, device)
    epoch = cfg.epoch_batches
    batches = opts.batches if opts.batches else epoch * (opts.epochs or 1)
    cpus = os.cpu_count() or 1

    _out(f"dataset {dataset.describe()}")
    if any(not registry.applies(m, dataset) for m in selected):
        for note in dataset.notes:  # why the image modes are left out
            _out(f"  note: {note}")
    _out(f"machine: {cpus} CPU{'s' if cpus > 1 else ''}, "
         f"{device_note or f'device {device}'}; fastread {fastread.__version__}")
    _out(f"timing {batches} batches of {opts.batch_size} ({epoch} per epoch, "
         f"+{opts.warmup} warm-up batch{'es' if opts.warmup != 1 else ''}) x {opts.repeat} "
         f"run(s) per mode after {opts.warmup_runs} untimed warm-up run(s); "
         f"threads {opts.threads}{', decode' if opts.decode else ''}")

    runnable, skipped, not_applicable = [], {}, {}
    for m in selected:
        if not registry.applies(m, dataset):
            not_applicable[m.name] = (f"does not apply to {dataset.root} "
                                      f"(it reads {registry.DATASET_KINDS[m.dataset]})")
            _out(f"mode {m.name}: {not_applicable[m.name]}")
            continue
        why = m.unavailable(cfg)
        if why is not None:
            skipped[m.name] = why
            _out(f"mode {m.name}: not available: {why}")
            continue
        runnable.append(m)
    if not explicit and opts.modes is None:
        _summarize_others(modes, selected, dataset, cfg)

    page_cache = runners.PageCache()
    passes, cache_note = _cache_passes(opts, page_cache, dataset)
    if cache_note:
        _out(cache_note)
    results, failed, verdicts = [], {}, []
    warmed = set()
    where_base = f"{cpus} CPU{'s' if cpus > 1 else ''}, {device}"
    for cache in passes:
        pass_results = []
        if len(passes) > 1 or cache == "cold":
            _out(f"-- {cache} cache" + (" (page cache dropped before every timed epoch)"
                                        if cache == "cold" else ""))
        for m in runnable:
            if m.name in failed:
                continue
            label = m.name + (" [cold]" if cache == "cold" else "")
            try:
                res = _time_mode(m, cfg, opts, batches, epoch, cache, page_cache,
                                 warm_up=m.name not in warmed, label=label)
            except Exception as e:  # a mode that breaks at run time: say so, go on
                msg = str(e).strip().splitlines()
                failed[m.name] = f"{type(e).__name__}: {msg[0] if msg else ''}"
                _out(f"mode {label}: failed: {failed[m.name]}")
                continue
            warmed.add(m.name)
            pass_results.append(res)
            runs = res["runs"]
            spread = ""
            if len(runs) > 1:
                spread = " (runs: " + ", ".join(f"{x['img_per_s']:,.0f}" for x in runs) + ")"
            _out(f"mode {label}: {res['img_per_s']:,.0f} img/s, {res['gb_per_s']:.3f} GB/s"
                 f"{spread}")
        results += pass_results
        if pass_results:
            _out()
            if len(passes) > 1:
                _out(f"{cache} cache:")
            _out(report.format_table(pass_results, rss=opts.rss))
            v = report.verdict(pass_results, f"{where_base}, {cache} cache"
                               if cache != NO_PAGE_CACHE else where_base)
            verdicts.append(v)
            _out(v)
    if not results:
        _out("no mode ran")

    if opts.json:
        _write_json(opts, dataset, cfg, batches, epoch, passes, results, skipped, failed,
                    not_applicable, verdicts, device, cache_note)
        _out(f"wrote {opts.json}")
    if opts.plot and results:
        name = (dataset.root.rstrip("/") if registry.is_url(dataset.root)
                else os.path.basename(os.path.abspath(dataset.root)))
        title = (f"{name}: batch {opts.batch_size}, "
                 f"{batches} batches, {opts.threads} threads, {where_base}"
                 f"{', decode' if opts.decode else ''}"
                 f"{f', median of {opts.repeat}' if opts.repeat > 1 else ''}")
        report.write_plot(opts.plot, results, title)
        _out(f"wrote {opts.plot}")
    return 1 if failed else 0


def _summarize_others(modes, selected, dataset, cfg):
    """One line on the modes the headline run leaves out."""
    chosen = {m.name for m in selected}
    others = [m for m in modes if m.name not in chosen and registry.applies(m, dataset)]
    if not others:
        return
    cannot = [m.name for m in others if m.unavailable(cfg) is not None]
    text = (f"{len(others)} more modes apply to this dataset (--modes all runs them)")
    if cannot:
        shown = ", ".join(cannot[:6]) + (", ..." if len(cannot) > 6 else "")
        text += f"; {len(cannot)} of them cannot run here ({shown}: --list-modes says why)"
    _out(text)


def _time_mode(mode, cfg, opts, batches, epoch, cache, page_cache, warm_up, label):
    """The mode's warm-up run (once per process, capped at one epoch), then
    its timed runs; returns the summary."""
    runs = []
    progress = opts.progress
    if warm_up:
        for _ in range(opts.warmup_runs):
            _one_run(mode, cfg, opts.warmup, min(batches, epoch), epoch, False, progress,
                     f"{mode.name} (warm-up)")
    for r in range(opts.repeat):
        desc = label + (f" [{r + 1}/{opts.repeat}]" if opts.repeat > 1 else "")
        if cache == "cold":
            runs.append(_cold_run(mode, cfg, opts, batches, epoch, page_cache, progress, desc))
        else:
            runs.append(_one_run(mode, cfg, opts.warmup, batches, epoch, opts.rss, progress,
                                 desc))
    return runners.summarize(mode, runs, opts.rss, cache=cache)


def cold_segments(batches, epoch, warmup):
    """[(untimed, timed)] batches of each cold segment: one segment per epoch,
    each after its own drop of the page cache, so no timed batch reads a
    sample that an earlier batch since the drop read (a runner's second
    epoch would read its first epoch's files again, from the cache). The
    untimed warm-up batches count against the epoch (at least one batch of
    it is timed)."""
    w = min(warmup, max(epoch - 1, 0))
    per = max(epoch - w, 1)
    out = []
    left = batches
    while left > 0:
        n = min(left, per)
        out.append((w, n))
        left -= n
    return out


def _cold_run(mode, cfg, opts, batches, epoch, page_cache, progress, desc):
    """One cold timed run: the page cache dropped before every epoch of it,
    a fresh runner each epoch (built after the drop), the epochs' times and
    samples added up. ``drops`` in the run's record counts the drops."""
    segs = cold_segments(batches, epoch, opts.warmup)
    parts = []
    for k, (warmup, n) in enumerate(segs):
        page_cache.drop()
        d = desc + (f" (epoch {k + 1}/{len(segs)})" if len(segs) > 1 else "")
        parts.append(_one_run(mode, cfg, warmup, n, epoch, opts.rss, progress, d))
    samples = sum(p["samples"] for p in parts)
    nbytes = sum(p["bytes"] for p in parts)
    seconds = sum(p["seconds"] for p in parts)
    rss = [v for p in parts for v in (p["rss"] or [])] if opts.rss else None
    return {"samples": samples, "bytes": nbytes, "batches": sum(p["batches"] for p in parts),
            "seconds": seconds, "cpu_seconds": sum(p["cpu_seconds"] for p in parts),
            "img_per_s": samples / seconds if seconds > 0 else math.inf,
            "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else math.inf,
            "rss": rss, "drops": len(parts),
            "epochs_img_per_s": [p["img_per_s"] for p in parts]}


def _one_run(mode, cfg, warmup, batches, epoch, rss, progress, desc):
    runner = mode.build(mode, cfg)
    try:
        return runners.timed_run(runner, warmup=warmup, batches=batches, epoch_batches=epoch,
                                 rss=rss, progress=progress, desc=desc)
    finally:
        runner.close()
        del runner
        gc.collect()


def _redacted(engine_options):
    from fastread.s3 import SECRET_KEYS

    out = dict(engine_options)
    if out.get("s3"):
        s3 = out["s3"]
        given = s3.given() if hasattr(s3, "given") else dict(s3)
        # S3Options names (secret_access_key) and engine_args keys alike
        out["s3"] = {k: "***" if k in SECRET_KEYS else v for k, v in given.items()}
    if isinstance(out.get("engine_args"), str):
        from fastread.s3 import redact_engine_args
        out["engine_args"] = redact_engine_args(out["engine_args"])
    return out


def _redacted_argv(argv):
    """The command line with secret values (--engine-option
    s3.secret_access_key=..., engine_args=...,session_token=...) as ***."""
    if argv is None:
        return None
    import re

    from fastread.s3 import SECRET_KEYS

    secret = re.compile(r"((?:%s)=)[^,]*" % "|".join(SECRET_KEYS))
    return [secret.sub(r"\1***", a) for a in argv]


def _write_json(opts, dataset, cfg, batches, epoch, passes, results, skipped, failed,
                not_applicable, verdicts, device, cache_note=None):
    import fastread

    doc = {
        "fastread": fastread.__version__,
        "argv": _redacted_argv(opts.argv),
        "dataset": {"root": (dataset.root if registry.is_url(dataset.root)
                             else os.path.abspath(dataset.root)), "kind": dataset.primary,
                    "kinds": list(dataset.kinds), "image": dataset.image,
                    "files": dataset.samples, "bytes": dataset.nbytes,
                    "epoch_batches": epoch},
        "machine": {"cpus": os.cpu_count(), "device": device},
        "config": {"batch_size": opts.batch_size, "batches": batches, "epochs": opts.epochs,
                   "warmup": opts.warmup, "warmup_runs": opts.warmup_runs,
                   "repeat": opts.repeat, "threads": opts.threads, "device": device,
                   "decode": opts.decode, "prefetch_queue_depth": opts.prefetch_queue_depth,
                   "cache": passes, "cold": "cold" in passes,
                   # why cold was not measured (None when it was, or not asked for)
                   "cold_note": cache_note,
                   # cold: the page cache is dropped before every timed epoch
                   "cold_drops": "every timed epoch" if "cold" in passes else None,
                   # s3 secrets (--engine-option s3.secret_access_key=...) as ***
                   "engine_options": _redacted(cfg.engine_options), "mem": opts.mem},
        "results": results,
        "verdicts": verdicts,
        "skipped": skipped,
        "not_applicable": not_applicable,
        "failed": failed,
    }
    try:
        with open(opts.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    except OSError as e:
        raise BenchError(f"--json {opts.json}: {e.strerror or e}") from None
