"""The engine matrix of issue 16: every engine through read_files() and Reader,
for small, ImageNet-sized and large files, warm and cold, two batch sizes.

    python bench/engines/engines.py --out bench-results/engines.json --plot bench-results/engines.png

Cells: size (4k, 92k, 256k, 512k, 1m) x cache (warm, cold) x batch (64, 256) x engine
(io_uring, psync, xnvme-file where built, auto) x api (read_files, reader;
--apis adds read_batches).
Rounds are interleaved: round r runs every cell once before round r + 1
starts (the engines' order turned by one each round), so a slow spell of a
shared machine hits every cell alike; each cell reports the median of its rounds and every round's
value. Cold cells drop the page cache (dentries and inodes too) before each
timed run (`sync; echo 3 > /proc/sys/vm/drop_caches`: root), or with
--evict drop only the data's pages (posix_fadvise: no root, but paths stay
cached). Cold runs also time the disk's ceiling: one file read front to back
in 1 MiB O_DIRECT ranges with many in flight (io_uring), in GB/s.

Data: the 92k set is a `fastread make-dataset` tree (--data-92k); the 4k,
256k, 512k and 1m sets are made under --data-root on first use (random
bytes, fixed seed).

What a cell measures: `files` files (default: all of the set) read in batches
of `batch` (warm: in as many passes as fill --min-time seconds). read_files:
one read_files() call per batch, in order, no size hints, no read-ahead
(the arrays are dropped before the next call). reader: epochs of
fastread.Reader (no shuffle; cold: one) after an untimed epoch that learns
the files' sizes (a Reader's steady state); the cold run drops the cache
after that epoch. read_batches: fastread.read_batches over the same lists
(see run_read_batches; takes the --reader-option options, e.g. workers=).
Reported: files/s, MB/s, and CPU seconds per file
of the whole process (getrusage: every thread, io-wq workers included).
"""
import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time

SIZES = {"4k": 4096, "92k": None, "256k": 256 << 10, "512k": 512 << 10, "1m": 1 << 20}
DEFAULT_COUNTS = {"4k": 20000, "92k": 20000, "256k": 6000, "512k": 3000, "1m": 2000}


def make_set(root, name, size, count, seed=0):
    """A tree of `count` files of `size` bytes (10 directories), made once."""
    top = os.path.join(root, f"engines-{name}")
    marker = os.path.join(top, ".complete")
    try:
        with open(marker) as f:
            if int(f.read().split()[0]) >= count:
                return top
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random(seed)
    for i in range(count):
        d = os.path.join(top, f"d{i % 10:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
            f.write(rng.randbytes(size))
    with open(marker, "w") as f:
        f.write(f"{count} files of {size} bytes\n")
    return top


def list_files(top):
    """Every regular file under top (dot files excepted), in sorted order."""
    out = []
    for d, dirs, files in os.walk(top):
        dirs.sort()
        out += [os.path.join(d, f) for f in sorted(files) if not f.startswith(".")]
    return out


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_caches(paths, evict):
    if evict:
        for p in paths:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass


def engine_spec(spec):
    """'name' or 'name:key=value;key=value' (a variant with its own engine
    options, e.g. io_uring:engine_args=taskrun=coop or psync:threads=2)."""
    name, _, rest = spec.partition(":")
    opts = {}
    for item in filter(None, rest.split(";")):
        k, _, v = item.partition("=")
        try:
            opts[k] = int(v, 0)
        except ValueError:
            opts[k] = v
    return name, opts


#: Context counters read around a read_files() cell (fr_ctx_stat): who served
#: the calls (threadpool.h) and, for auto, which engine read the batches.
POOL_STATS = ("pool_phases", "pool_joins", "pool_skips", "pool_alone", "pool_sleeps",
              "pool_wake_ns", "pool_preempted", "auto_uring_batches", "auto_psync_batches",
              "auto_trials", "auto_switches", "file_calls", "file_call_ns")


def read_files_context(engine, opts, batch):
    """The context read_files() uses for these arguments (its per-thread
    cache), for its counters; None if this fastread has no such lookup."""
    try:
        from fastread import files
        return files._context(engine, None, opts, batch)
    except (ImportError, AttributeError):
        return None


def context_stats(ctx):
    """POOL_STATS of ctx (and of an auto context's psync side, "psync.*")."""
    if ctx is None:
        return {}
    out = {k: ctx.stat(k) for k in POOL_STATS}
    out.update({"psync." + k: ctx.stat("psync." + k) for k in POOL_STATS[:7]})
    return {k: v for k, v in out.items() if v >= 0}


def pool_summary(before, after):
    """Per-cell pool figures from two context_stats: helpers that joined a
    phase on average, phases the caller read alone, mean wake-up latency."""
    d = {k: after[k] - before.get(k, 0) for k in after}
    out = {}
    for side in ("", "psync."):
        phases = d.get(side + "pool_phases", 0)
        if phases <= 0:
            continue
        joins = d.get(side + "pool_joins", 0)
        out[side + "helpers_per_phase"] = joins / phases
        out[side + "alone_share"] = d.get(side + "pool_alone", 0) / phases
        out[side + "slept_share"] = d.get(side + "pool_sleeps", 0) / max(1, joins + d.get(
            side + "pool_skips", 0))
        out[side + "wake_us"] = d.get(side + "pool_wake_ns", 0) / max(1, joins) / 1000
    if d.get("file_calls", 0) > 0:  # time inside the native call, per call
        out["calls"] = d["file_calls"]
        out["native_us"] = d["file_call_ns"] / d["file_calls"] / 1000
    for k in ("auto_uring_batches", "auto_psync_batches", "auto_trials", "auto_switches"):
        if k in d:
            out[k] = d[k]
    return out


def pool_text(p):
    """One line of a read_files cell's pool_summary figures."""
    text = (f"{p['helpers_per_phase']:.1f} helpers/phase, {100 * p['alone_share']:.0f}% alone, "
            f"wake {p['wake_us']:.0f} us")
    if "call_us" in p:
        text += f", native {p['native_us']:.0f} of {p['call_us']:.0f} us a call"
    return text


def run_read_files(paths, batch, spec, opts, min_time=0.0):
    """Passes over the list until min_time seconds have gone by (one pass
    at least); returns seconds, CPU seconds, bytes, pool figures and files
    read."""
    import fastread
    engine, extra = engine_spec(spec)
    opts = {**opts, **extra}
    ctx = read_files_context(engine, opts, batch)
    before = context_stats(ctx)
    t0, c0 = time.perf_counter(), cpu_seconds()
    nbytes = files = 0
    while files == 0 or time.perf_counter() - t0 < min_time:
        for i in range(0, len(paths), batch):
            arrays = fastread.read_files(paths[i:i + batch], engine=engine, **opts)
            nbytes += sum(a.nbytes for a in arrays)
            del arrays
        files += len(paths)
    dt, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    pool = pool_summary(before, context_stats(ctx))
    if pool.get("calls"):  # against the whole call as Python sees it
        pool["call_us"] = dt / pool["calls"] * 1e6
    return dt, cpu, nbytes, pool, files


def run_reader(paths, batch, spec, opts, cold, evict, min_time=0.0):
    """Timed epochs of a fresh Reader (one if cold, else until min_time
    seconds have gone by), after an untimed epoch that learns the files'
    sizes (a Reader's steady state from its second epoch on)."""
    import fastread
    engine, extra = engine_spec(spec)
    opts = {**opts, **extra}
    with fastread.Reader(files=paths, labels=[0] * len(paths), batch_size=batch, engine=engine,
                         **opts) as reader:
        for arrays, _ in reader:
            del arrays
        if cold:
            drop_caches(paths, evict)
        t0, c0 = time.perf_counter(), cpu_seconds()
        nbytes = files = 0
        while files == 0 or (not cold and time.perf_counter() - t0 < min_time):
            for arrays, _ in reader:
                nbytes += sum(a.nbytes for a in arrays)
                del arrays
            files += len(paths)
        return time.perf_counter() - t0, cpu_seconds() - c0, nbytes, {}, files


def run_read_batches(paths, batch, spec, opts, cold, evict, min_time=0.0):
    """fastread.read_batches over the set's lists of `batch` paths (read
    ahead on native threads, the caller dropping each list's arrays before
    the next). Warm: one iterator over pass after pass; the first pass is
    untimed (its contexts learn the files' sizes, as a Reader's first
    epoch), then whole passes until min_time seconds have gone by. Cold:
    a fresh iterator reads one timed pass after the cache is dropped."""
    import fastread
    engine, extra = engine_spec(spec)
    opts = {**opts, **extra}
    lists = [paths[i:i + batch] for i in range(0, len(paths), batch)]

    def forever():
        while True:
            yield from lists

    if cold:
        drop_caches(paths, evict)
        t0, c0 = time.perf_counter(), cpu_seconds()
        nbytes = 0
        for arrays in fastread.read_batches(lists, engine=engine, **opts):
            nbytes += sum(a.nbytes for a in arrays)
            del arrays
        return time.perf_counter() - t0, cpu_seconds() - c0, nbytes, {}, len(paths)
    with fastread.read_batches(forever(), engine=engine, **opts) as it:
        for _ in range(len(lists)):
            next(it)
        t0, c0 = time.perf_counter(), cpu_seconds()
        nbytes = files = 0
        while files == 0 or time.perf_counter() - t0 < min_time:
            for _ in range(len(lists)):
                arrays = next(it)
                nbytes += sum(a.nbytes for a in arrays)
                del arrays
            files += len(paths)
        return time.perf_counter() - t0, cpu_seconds() - c0, nbytes, {}, files


def ceiling(path, evict, piece=1 << 20, sequential=True, count=None):
    """GB/s of cold O_DIRECT reads of `piece` bytes from `path` with io_uring
    (4 rings x 64 in flight): front to back, or at random 4 KiB-aligned
    offsets (seed 0), the disk's ceiling for requests of a file's size."""
    import random
    from fastread import _core
    size = os.path.getsize(path)
    piece = (piece + 4095) // 4096 * 4096
    if sequential:
        offs = list(range(0, size - piece + 1, piece))
    else:
        rng = random.Random(0)
        n = count or max(1000, min(20000, (1 << 30) // piece))
        offs = [rng.randrange(0, (size - piece) // 4096) * 4096 for _ in range(n)]
    drop_caches([path], evict)
    ctx = _core.Context("io_uring", threads=4, queue_depth=64, o_direct=True)
    t0 = time.perf_counter()
    for i in range(0, len(offs), 256):
        part = offs[i:i + 256]
        b = ctx.read_ranges(path, part, [piece] * len(part))
        if b.failures():
            raise OSError(f"ceiling read of {path} failed: {b.failures()[:3]}")
        b.release()
    dt = time.perf_counter() - t0
    ctx.close()
    return len(offs) * piece / dt / 1e9


def make_ceiling_file(root, gib=2):
    path = os.path.join(root, "engines-ceiling.bin")
    want = gib << 30
    if not os.path.exists(path) or os.path.getsize(path) != want:
        chunk = os.urandom(1 << 24)
        with open(path + ".tmp", "wb") as f:
            for _ in range(want // len(chunk)):
                f.write(chunk)
        os.replace(path + ".tmp", path)
    return path


def machine():
    import fastread
    info = {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "fastread": getattr(fastread, "__version__", "?"),
            "engines": {k: v.as_dict() for k, v in fastread.engines().items()}}
    try:
        from fastread.engine import resolve
        info["auto"] = resolve("auto")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        info["auto"] = f"error: {e}"
    try:
        with open("/proc/meminfo") as f:
            info["mem_total"] = f.readline().split(":")[1].strip()
    except OSError:
        pass
    return info


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = result["cells"]
    sizes = [s for s in result["config"]["sizes"]]
    caches = result["config"]["caches"]
    batches = result["config"]["batches"]
    engines = result["config"]["engines"]
    apis = result["config"]["apis"]
    rows = [(s, c) for s in sizes for c in caches]
    fig, axes = plt.subplots(len(rows), len(batches), figsize=(5.5 * len(batches), 3.2 * len(rows)),
                             squeeze=False)
    for r, (s, c) in enumerate(rows):
        for b_i, b in enumerate(batches):
            ax = axes[r][b_i]
            width = 0.8 / max(1, len(engines))
            for e_i, e in enumerate(engines):
                vals = []
                for a in apis:
                    cell = next((x for x in cells if x["size"] == s and x["cache"] == c and
                                 x["batch"] == b and x["engine"] == e and x["api"] == a), None)
                    vals.append(cell["files_per_s"] if cell and "files_per_s" in cell else 0)
                xs = [i + e_i * width for i in range(len(apis))]
                ax.bar(xs, vals, width, label=e)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(apis))])
            ax.set_xticklabels(apis)
            ax.set_title(f"{s} files, {c}, batch {b}")
            ax.set_ylabel("files/s")
            if r == 0 and b_i == 0:
                ax.legend(fontsize="small")
    fig.suptitle(f"fastread engines on {result['machine']['host']} "
                 f"({result['machine']['cpus']} CPUs), median of {result['config']['rounds']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarize(result):
    """Lines comparing engines within each (size, cache, batch, api)."""
    out = []
    cells = [c for c in result["cells"] if "files_per_s" in c]
    keys = sorted({(c["size"], c["cache"], c["batch"], c["api"]) for c in cells},
                  key=lambda k: (list(SIZES).index(k[0]), k[1], k[2], k[3]))
    ceil = result.get("ceiling_gb_per_s")
    rceil = result.get("random_ceiling_gb_per_s", {})
    for k in keys:
        group = {c["engine"]: c for c in cells if (c["size"], c["cache"], c["batch"], c["api"]) == k}
        best = max(c["files_per_s"] for c in group.values())
        parts = []
        for e, c in group.items():
            s = f"{e} {c['files_per_s']:,.0f} ({c['files_per_s'] / best:.2f}x best"
            if ceil and k[1] == "cold":
                s += f", {100 * c['mb_per_s'] / 1000 / ceil:.0f}% of sequential"
                if rceil.get(k[0]):
                    s += f", {100 * c['mb_per_s'] / 1000 / rceil[k[0]]:.0f}% of random ceiling"
            parts.append(s + ")")
        out.append(f"{k[0]:>4} {k[1]:4} batch {k[2]:3} {k[3]:10}: " + "; ".join(parts))
    # read_files and read_batches against Reader, same engine: the medians'
    # ratio, and the median of the rounds' ratios (each round ran both
    # within seconds: a slow spell of a shared machine cancels out)
    for c in cells:
        if c["api"] not in ("read_files", "read_batches"):
            continue
        r = next((x for x in cells if x["api"] == "reader" and x["engine"] == c["engine"] and
                  x["size"] == c["size"] and x["cache"] == c["cache"] and x["batch"] == c["batch"]),
                 None)
        if r:
            c["of_reader"] = c["files_per_s"] / r["files_per_s"]
            if len(c["rounds_files_per_s"]) == len(r["rounds_files_per_s"]):
                c["of_reader_paired"] = statistics.median(
                    a / b for a, b in zip(c["rounds_files_per_s"], r["rounds_files_per_s"]))
    # auto against the best named engine of its cell (issue 16: within 5%)
    for c in cells:
        if c["engine"] != "auto":
            continue
        named = [x for x in cells if x["engine"] != "auto" and ":" not in x["engine"] and
                 (x["size"], x["cache"], x["batch"], x["api"]) ==
                 (c["size"], c["cache"], c["batch"], c["api"])]
        if named:
            best = max(named, key=lambda x: x["files_per_s"])
            c["auto_of_best"] = c["files_per_s"] / best["files_per_s"]
            c["best_engine"] = best["engine"]
            # Round by round (the two ran minutes apart at most, in the same
            # round): what drifts over the run cancels out.
            pairs = [a / b for a, b in zip(c["rounds_files_per_s"], best["rounds_files_per_s"])]
            if pairs and len(c["rounds_files_per_s"]) == len(best["rounds_files_per_s"]):
                c["auto_of_best_paired"] = statistics.median(pairs)
    return out


def derived_lines(result):
    """The issue's two ratios per cell: read_files() against Reader with the
    same engine (target >= 0.80) and auto against the best named engine
    (target >= 0.95), with the read_files cells' pool figures."""
    out = []
    for c in result["cells"]:
        if "of_reader" in c:
            p = c.get("pool", {})
            pool = f"  [{pool_text(p)}]" if "helpers_per_phase" in p else ""
            # Targets: read_files 0.80 (issue 16), read_batches 0.90 (issue 31).
            target = 0.9 if c["api"] == "read_batches" else 0.8
            paired = (f", paired by round {c['of_reader_paired']:.2f}"
                      if "of_reader_paired" in c else "")
            out.append(f"{c['api']}/Reader {c['size']:>4} {c['cache']:4} b{c['batch']:<3} "
                       f"{c['engine']:10}: {c['of_reader']:.2f}"
                       f"{'' if c['of_reader'] >= target else f'  (< {target:.2f})'}{paired}{pool}")
    for c in result["cells"]:
        if "auto_of_best" in c:
            p = c.get("pool", {})
            split = (f"  [io_uring {p.get('auto_uring_batches', 0)} / psync "
                     f"{p.get('auto_psync_batches', 0)} batches; "
                     f"{p.get('auto_trials', 0)} trials, {p.get('auto_switches', 0)} switched]"
                     if "auto_uring_batches" in p else "")
            paired = (f", paired by round {c['auto_of_best_paired']:.2f}"
                      if "auto_of_best_paired" in c else "")
            out.append(f"auto/best {c['size']:>4} {c['cache']:4} b{c['batch']:<3} "
                       f"{c['api']:10}: {c['auto_of_best']:.2f} of {c['best_engine']}"
                       f"{'' if c['auto_of_best'] >= 0.95 else '  (< 0.95)'}{paired}{split}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-92k", default="/var/tmp/fastread-bench/imagenet-20k",
                   help="a `fastread make-dataset` tree (the 92k set)")
    p.add_argument("--data-root", default="/var/tmp/fastread-bench",
                   help="where the 4k, 256k, 512k and 1m sets (and the ceiling file) are made")
    p.add_argument("--sizes", default="4k,92k,1m")
    p.add_argument("--caches", default="warm,cold")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--engines", default="io_uring,psync,xnvme-file,auto",
                   help="engines, or variants name:key=value;key=value (see engine_spec)")
    p.add_argument("--apis", default="read_files,reader")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.5,
                   help="warm cells: seconds a round of a cell reads for at least, in whole "
                        "passes over the set (20,000 cached 4 KiB files take ~10 ms on 16 cores: "
                        "too short a run for a 5%% comparison)")
    p.add_argument("--files", type=int, default=0,
                   help="files per cell (default: 20000 for 4k and 92k, 6000 for 256k, "
                        "3000 for 512k, 2000 for 1m)")
    p.add_argument("--evict", action="store_true",
                   help="cold: evict the data's pages only (no root; dentries stay cached)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="engine option for every cell (e.g. threads=0, queue_depth=128)")
    p.add_argument("--read-files-option", action="append", default=[], metavar="KEY=VALUE",
                   help="engine option for read_files cells only (e.g. threads=0)")
    p.add_argument("--reader-option", action="append", default=[], metavar="KEY=VALUE",
                   help="Reader option for reader and read_batches cells only (e.g. workers=2)")
    p.add_argument("--out", default="bench-results/engines.json")
    p.add_argument("--plot", default=None, help="PNG path (default: next to --out)")
    p.add_argument("--no-ceiling", action="store_true")
    p.add_argument("--time-budget", type=float, default=0,
                   help="seconds: start no cell after this (0: no limit); the JSON says which "
                        "rounds ran, so a call with a time limit still reports")
    args = p.parse_args(argv)
    started = time.monotonic()  # the budget counts data sets and ceilings too

    def kv(items):
        out = {}
        for it in items:
            k, _, v = it.partition("=")
            try:
                out[k] = int(v, 0)
            except ValueError:
                out[k] = v
        return out

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import fastread
    sizes = args.sizes.split(",")
    caches = args.caches.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    avail = fastread.engines()
    engines = [e for e in args.engines.split(",")
               if engine_spec(e)[0] == "auto" or getattr(avail.get(engine_spec(e)[0]), "files", None) is True]
    skipped = {e: str(getattr(avail.get(engine_spec(e)[0]), "files", "unknown engine")) for e in args.engines.split(",")
               if e not in engines}
    apis = args.apis.split(",")
    common = kv(args.option)
    rf_opts = {**common, **kv(args.read_files_option)}
    rd_opts = {**common, **kv(args.reader_option)}

    sets = {}
    for s in sizes:
        if s == "92k":
            top = args.data_92k
        else:
            top = make_set(args.data_root, s, SIZES[s], max(args.files, DEFAULT_COUNTS[s]))
        paths = list_files(top)
        n = args.files or DEFAULT_COUNTS[s]
        sets[s] = paths[:n]
        print(f"set {s}: {len(sets[s])} files from {top}", flush=True)
        if not sets[s]:
            hint = " (--data-92k: make one with `fastread make-dataset DIR`)" if s == "92k" else ""
            sys.exit(f"set {s}: no files under {top}{hint}")

    result = {"machine": machine(), "skipped_engines": skipped,
              "config": {"sizes": sizes, "caches": caches, "batches": batches, "engines": engines,
                         "apis": apis, "rounds": args.rounds, "min_time": args.min_time,
                         "evict": args.evict,
                         "options": common, "read_files_options": rf_opts,
                         "reader_options": rd_opts, "argv": sys.argv[1:]},
              "cells": []}
    print(json.dumps(result["machine"]), flush=True)
    if "cold" in caches and not args.no_ceiling:
        cf = make_ceiling_file(args.data_root)
        vals = [ceiling(cf, args.evict) for _ in range(args.rounds)]
        result["ceiling_gb_per_s"] = statistics.median(vals)
        result["ceiling_rounds"] = vals
        print(f"disk ceiling, sequential 1 MiB: {result['ceiling_gb_per_s']:.2f} GB/s ({vals})",
              flush=True)
        # Per set: random reads of the set's mean file size (what a cold
        # file read can hope for at best: it also needs its metadata).
        result["random_ceiling_gb_per_s"] = {}
        for s_name, paths in sets.items():
            mean = sum(os.path.getsize(p) for p in paths[:2000]) / min(2000, len(paths))
            vals = [ceiling(cf, args.evict, piece=int(mean), sequential=False)
                    for _ in range(args.rounds)]
            result["random_ceiling_gb_per_s"][s_name] = statistics.median(vals)
            print(f"disk ceiling, random {mean / 1024:.0f} KiB: "
                  f"{statistics.median(vals):.2f} GB/s ({vals})", flush=True)

    cells = [(s, c, b, e, a) for s in sizes for c in caches for b in batches for e in engines
             for a in apis]
    runs = {k: [] for k in cells}
    for rnd in range(args.rounds):
        # The engines' order turns by one each round, so no engine always runs
        # right after the same other one (on the 2-core VM, auto, always after
        # psync, read 256 KiB files 0.82x as fast as io_uring in all 3 rounds
        # while the same engine, and equal when run alone).
        turned = engines[rnd % len(engines):] + engines[:rnd % len(engines)]
        order = [(s, c, b, e, a) for s in sizes for c in caches for b in batches for e in turned
                 for a in apis]
        for k in order:
            if args.time_budget and time.monotonic() - started > args.time_budget:
                result["stopped_early"] = (f"time budget of {args.time_budget:g} s spent in "
                                           f"round {rnd}")
                print(result["stopped_early"] + ": reporting what ran", flush=True)
                break
            s, c, b, e, a = k
            paths = sets[s]
            min_time = args.min_time if c == "warm" else 0.0
            if a == "reader":
                dt, cpu, nbytes, pool, files = run_reader(paths, b, e, rd_opts, c == "cold",
                                                          args.evict, min_time)
            elif a == "read_batches":
                if c != "cold":
                    warm(paths)
                dt, cpu, nbytes, pool, files = run_read_batches(paths, b, e, rd_opts,
                                                                c == "cold", args.evict, min_time)
            else:
                if c == "cold":
                    drop_caches(paths, args.evict)
                else:
                    warm(paths)
                dt, cpu, nbytes, pool, files = run_read_files(paths, b, e, rf_opts, min_time)
            runs[k].append({"s": dt, "cpu_s": cpu, "bytes": nbytes, "pool": pool, "files": files})
            extra = f"  pool: {pool_text(pool)}" if "helpers_per_phase" in pool else ""
            print(f"round {rnd} {s:>4} {c:4} b{b:<3} {e:10} {a:10} "
                  f"{files / dt:10,.0f} files/s  {nbytes / dt / 1e6:8.0f} MB/s  "
                  f"{cpu / files * 1e6:6.1f} us cpu/file{extra}", flush=True)

        if "stopped_early" in result:
            break
    for k, rs in runs.items():
        if not rs:
            continue
        s, c, b, e, a = k
        n = len(sets[s])
        rates = [r["files"] / r["s"] for r in rs]
        med = statistics.median(rates)
        mid = sorted(rs, key=lambda r: r["files"] / r["s"])[len(rs) // 2]
        result["cells"].append({"size": s, "cache": c, "batch": b, "engine": e, "api": a,
                                "files": n, "files_per_s": med, "rounds_files_per_s": rates,
                                "rounds_files_read": [r["files"] for r in rs],
                                "mb_per_s": mid["bytes"] / mid["s"] / 1e6,
                                "cpu_us_per_file": statistics.median(
                                    r["cpu_s"] / r["files"] * 1e6 for r in rs),
                                "pool": mid.get("pool", {})})
    lines = summarize(result)
    result["summary"] = lines
    result["derived"] = derived_lines(result)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n".join(lines + result["derived"]))
    png = args.plot or os.path.splitext(args.out)[0] + ".png"
    try:
        plot(result, png)
        print(f"wrote {args.out} and {png}")
    except ImportError as e:
        print(f"wrote {args.out} (no plot: {e})")


if __name__ == "__main__":
    main()
