"""The `parquet` bench family's modes in interleaved rounds (issue 40): every
mode one epoch per round, in turn, so a noisy shared machine hurts every
mode alike; medians and per-round ratios to the fastest Python peer and to
the files ceiling. Bytes of the image column (no decoding).

    python bench/parquet/interleaved.py DATA [--rounds 3] [--batch 64]
        [--epochs 1] [--modes parquet-reader,parquet-datasets,...] [--without-prefault]
        [--cache warm|cold] [--small-cache] [--also DATA2]... [--touch]
        [--without-native] [--native-held] [--index-by-map] [--index-cache]

``--cache cold``: before each mode's timed epoch(s), the pages of every file
it could read leave the page cache (``posix_fadvise(DONTNEED)`` per file:
DATA with its LitData copy, the JPEG tree of the ceiling, the ``datasets``
cache's Arrow files), so each mode starts from the disk without
``drop_caches``, which is machine-wide and would disturb other jobs on a
shared machine. Behind a virtio disk the host's own cache may still answer:
the files ceiling, evicted the same way, is the measure of what "cold" gave.

``--epochs E``: each round times E epochs of one runner (one Reader, one
pipeline), as a training run of E epochs uses it: fastread's Parquet
source keeps decoded row groups within ``cache_bytes`` across epochs, so
E > 1 measures that as well as the first epoch's decoding.

The order of the modes turns by one each round (round r starts at mode r),
so that no mode always runs right after the same one: a mode run straight
after a fastread Parquet mode gets the ~1.8 GB of pages Arrow's jemalloc
pool just freed, already faulted in (jemalloc returns them to the kernel
only after its decay time), and skips the page faults a fresh process
pays; with a fixed order readers.parquet always ran straight after the
Reader (issue 40: "3x faster" over the same source, equal in fresh
processes). Each line also gives the minor page faults the epoch took.

``--index-cache``: also runs parquet-reader and parquet-reader-fileorder
with the ranges index cached on disk (``MODE-idxwarm``: a directory
filled by the untimed warm-up round, so every timed epoch is a fresh
source and Reader that finds every row group's ranges there and reads no
column chunk) and not cached (``MODE-idxcold``: a new empty directory for
every epoch, so the chunks are read to index them and the entry written,
as a first run on a node). The plain modes use the node-local cache
(``FASTREAD_INDEX_CACHE_DIR`` or ``~/.cache/fastread/index``) as users get it.

DATA: a Hub-style Parquet directory written by
fastread.formats.parquet.write_image_parquet (its note names the JPEG tree
that the ceiling reads as files).
"""
import argparse
import dataclasses
import os
import resource
import statistics
import time

from fastread.bench import environment
from fastread.bench.families import parquet as fam
from fastread.bench.runners import Config
from fastread.bench.sweep import evict


def _files_below(*roots):
    out = []
    for root in roots:
        for d, _dirs, names in os.walk(root):
            out += [os.path.join(d, n) for n in names]
    return out


def _cold_files(data):
    """Every file a mode could read: DATA (with its LitData copy), the JPEG
    tree it was written from, the `datasets` cache (its Arrow copies)."""
    hf = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"),
        "datasets")
    roots = [data, hf]
    tree = fam.source_tree(data)
    if tree:
        roots.append(tree)
    return _files_below(*[r for r in roots if os.path.isdir(r)])

def _without_prefault(mode):
    """``mode`` with the Parquet source's pre-faulting of decode memory off
    (fastread.formats._parquet_meta._prefault a no-op while it runs): the
    before of a before/after in one run."""
    from fastread.formats import _parquet_meta

    def build(m, cfg):
        kept = _parquet_meta._prefault
        _parquet_meta._prefault = lambda *a: None
        runner = mode.build(mode, cfg)
        close = runner.close

        def closing():
            try:
                close()
            finally:
                _parquet_meta._prefault = kept
        runner.close = closing
        return runner
    return dataclasses.replace(mode, name=mode.name + "-noprefault", build=build)


def _without_native(mode):
    """``mode`` with the Parquet source's native route off
    (fastread.formats._parquet_native.ENABLED False while the source is
    built: every row group through pyarrow's Python reader, values copied
    into a BinaryArray), named ``MODE-pyarrow``: the before of a
    before/after in one run (issue 40)."""
    from fastread.formats import _parquet_native

    def build(m, cfg):
        kept = _parquet_native.ENABLED
        _parquet_native.ENABLED = False
        try:
            return mode.build(mode, cfg)   # the source decides its route when built
        finally:
            _parquet_native.ENABLED = kept
    return dataclasses.replace(mode, name=mode.name + "-pyarrow", build=build)


def _native_held(mode):
    """``mode`` with the native route keeping an uncompressed row group's
    chunk and handing out views of it (fastread.formats._parquet_native.RANGED
    False while the source is built), named ``MODE-held``: against the
    default, which keeps the values' file ranges and reads them per batch."""
    from fastread.formats import _parquet_native

    def build(m, cfg):
        kept = _parquet_native.RANGED
        _parquet_native.RANGED = False
        try:
            return mode.build(mode, cfg)
        finally:
            _parquet_native.RANGED = kept
    return dataclasses.replace(mode, name=mode.name + "-held", build=build)


def _index_by_map(mode):
    """``mode`` with the ranged route's index pass over a read-only map of
    each chunk (fastread.formats._parquet_native.INDEX_BY_MAP while the
    Reader runs: Arrow touches only the length prefixes; the rows are still
    read by the engine), named ``MODE-mapidx``."""
    from fastread.formats import _parquet_native

    def build(m, cfg):
        _parquet_native.INDEX_BY_MAP = True     # loads may start as the Reader is built
        try:
            runner = mode.build(mode, cfg)
        except BaseException:
            _parquet_native.INDEX_BY_MAP = False
            raise
        close = runner.close

        def closing():
            try:
                close()
            finally:
                _parquet_native.INDEX_BY_MAP = False
        runner.close = closing
        return runner
    return dataclasses.replace(mode, name=mode.name + "-mapidx", build=build)


def _index_cache(mode, warm):
    """``mode`` with the Parquet ranges index (formats._parquet_index_cache)
    in a directory of its own (``FASTREAD_INDEX_CACHE_DIR`` while the source
    and Reader are built): ``warm``, one directory kept for the run (filled
    by the warm-up round); cold, a new empty one every epoch, removed after."""
    import shutil
    import tempfile
    kept_dir = tempfile.mkdtemp(prefix="fr-pqidx-warm-") if warm else None
    if kept_dir:
        import atexit
        atexit.register(shutil.rmtree, kept_dir, ignore_errors=True)

    def build(m, cfg):
        d = kept_dir or tempfile.mkdtemp(prefix="fr-pqidx-cold-")
        old = os.environ.get("FASTREAD_INDEX_CACHE_DIR")
        os.environ["FASTREAD_INDEX_CACHE_DIR"] = d
        try:
            runner = mode.build(mode, cfg)
        finally:
            if old is None:
                del os.environ["FASTREAD_INDEX_CACHE_DIR"]
            else:
                os.environ["FASTREAD_INDEX_CACHE_DIR"] = old
        close = runner.close

        def closing():
            reader = getattr(runner, "reader", None)
            if reader is not None:
                st = reader.stats()
                print(f"  {m.name}: {st.get('row_groups_index_cached')} row groups from the "
                      f"cached index, {st.get('row_group_chunks_read')} chunks read, "
                      f"{st.get('index_cache_written')} entries written", flush=True)
            try:
                close()
            finally:
                if not warm:
                    shutil.rmtree(d, ignore_errors=True)
        runner.close = closing
        return runner
    return dataclasses.replace(mode, name=mode.name + ("-idxwarm" if warm else "-idxcold"),
                               build=build)


def _small_cache(mode, spill):
    """``mode`` (file order) with the row-group cache's budget below the
    data set's decoded size (:data:`SMALL_CACHE`), as for a data set larger
    than memory: with ``spill`` (row groups dropped once read through) or,
    the before of a before/after in one run, without it."""
    from fastread.formats import parquet as pqmod

    def build(m, cfg):
        kept_default, kept_size = pqmod.DEFAULT_CACHE_BYTES, pqmod.Parquet.decoded_bytes
        pqmod.DEFAULT_CACHE_BYTES = SMALL_CACHE
        if not spill:
            pqmod.Parquet.decoded_bytes = lambda self: 0
        try:
            return mode.build(mode, cfg)   # the source and its cache are made here
        finally:
            pqmod.DEFAULT_CACHE_BYTES, pqmod.Parquet.decoded_bytes = kept_default, kept_size
    tag = "-1g" if spill else "-1g-nospill"
    return dataclasses.replace(mode, name=mode.name + tag, build=build)


def _over(mode, data, cfg):
    """``mode`` over another data set ``data`` (the same rows written another
    way, e.g. the image column uncompressed), named ``MODE@<dir name>``:
    both data sets' Reader in the same rounds, side by side."""
    from fastread.formats import Parquet
    n = len(Parquet(data))
    if n != cfg.dataset.samples:
        raise SystemExit(f"--also {data}: {n} rows, DATA has {cfg.dataset.samples}")
    # fam.detect knows Parquet directories only; a save_to_disk-like directory
    # of .arrow files (the same rows as Arrow IPC) is read by the same source.
    ds = fam.detect(data) or dataclasses.replace(cfg.dataset, root=data)
    other = dataclasses.replace(cfg, dataset=ds)

    def build(m, _cfg):
        return mode.build(mode, other)
    return dataclasses.replace(mode, name=f"{mode.name}@{os.path.basename(os.path.normpath(data))}",
                               build=build)


def _touching(runner):
    """``runner`` whose batches are read, not only handed out: one byte of
    every 4 KiB page of every sample is summed before the batch counts.
    Why: a source whose samples are views of a memory-mapped file (the
    .arrow files) hands out views without reading a byte (0 page faults);
    a consumer (a decoder) reads them all, and for a map that is when the
    page faults come. The other modes' samples are already in memory, so
    for them this costs the same small Python loop."""
    epoch = runner.new_epoch

    def reading(batches):
        for arrays, labels in batches:
            for a in arrays:
                if len(a):
                    int(a[::4096].sum())
            yield arrays, labels
    runner._it = reading(runner._it)          # the epoch the runner already began
    runner.new_epoch = lambda: reading(epoch())
    return runner


#: The budget of --small-cache (of the 20k set's 1.8 GB decoded).
SMALL_CACHE = 1 << 30
PEERS = ("parquet-datasets", "parquet-pyarrow-dali", "parquet-ray", "parquet-litdata")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--modes", default=None)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--gap", type=float, default=0.0,
                    help="seconds of pause before each mode's epoch (past jemalloc's decay "
                         "time, ~1 s: no mode inherits the pages the one before freed)")
    ap.add_argument("--cache", choices=("warm", "cold"), default="warm",
                    help="cold: every file a mode could read evicted from the page cache "
                         "before its epoch(s) (per file, not drop_caches)")
    ap.add_argument("--engines", default=None,
                    help="comma list: fastread's modes once per engine (named MODE@ENGINE) "
                         "instead of once with the engine 'auto' picks")
    ap.add_argument("--without-prefault", action="store_true",
                    help="also run parquet-reader with the pre-faulting off")
    ap.add_argument("--without-native", action="store_true",
                    help="also run parquet-reader and parquet-reader-fileorder with the "
                         "source's native route off (MODE-pyarrow: pyarrow's Python reader)")
    ap.add_argument("--native-held", action="store_true",
                    help="also run parquet-reader and parquet-reader-fileorder with the "
                         "native route holding chunks (MODE-held: views of the chunk) "
                         "instead of reading file ranges")
    ap.add_argument("--index-by-map", action="store_true",
                    help="also run parquet-reader and parquet-reader-fileorder with the "
                         "ranged route's index pass over a memory map (MODE-mapidx)")
    ap.add_argument("--index-cache", action="store_true",
                    help="also run parquet-reader and parquet-reader-fileorder with the ranges "
                         "index cached on disk (MODE-idxwarm) and not (MODE-idxcold)")
    ap.add_argument("--small-cache", action="store_true",
                    help="also run parquet-reader-fileorder with cache_bytes=1 GiB, with and "
                         "without dropping row groups once read through")
    ap.add_argument("--also", action="append", default=[], metavar="DATA2",
                    help="also run fastread's Parquet Reader modes over DATA2 (the same rows "
                         "written another way, Parquet or .arrow files), as MODE@<DATA2's name>, in the same rounds; may be given more than once")
    ap.add_argument("--touch", action="store_true",
                    help="read one byte of every 4 KiB page of every sample (a consumer's "
                         "reads: a memory map's page faults come then)")
    args = ap.parse_args()
    env = environment.probe_environment()
    cfg = Config(env=env, dataset=fam.detect(args.data), batch_size=args.batch)
    modes = list(fam.modes(env))
    if args.engines:
        ours = [m for m in modes if m.engine is not None]
        modes = [m for m in modes if m.engine is None] + [
            dataclasses.replace(m, name=f"{m.name}@{e}", engine=e)
            for m in ours for e in args.engines.split(",")]
    if args.modes is not None:
        wanted = args.modes.split(",")
        modes = [m for m in modes if m.name in wanted]
    if args.without_prefault:
        modes += [_without_prefault(m) for m in modes if m.name == "parquet-reader"]
    readers = [m for m in modes if m.name in ("parquet-reader", "parquet-reader-fileorder")]
    if args.without_native:
        modes += [_without_native(m) for m in readers]
    if args.native_held:
        modes += [_native_held(m) for m in readers]
    if args.index_by_map:
        modes += [_index_by_map(m) for m in readers]
    if args.index_cache:
        modes += [_index_cache(m, warm) for m in readers for warm in (True, False)]
    if args.small_cache:
        modes += [_small_cache(m, spill) for m in modes if m.name == "parquet-reader-fileorder"
                  for spill in (True, False)]
    modes += [_over(m, d, cfg) for d in args.also for m in modes
              if m.name.startswith("parquet-reader")]
    runnable = []
    for m in modes:
        why = m.check(m, cfg)
        if why:
            print(f"skip {m.name}: {why}")
        else:
            runnable.append(m)
    n = cfg.dataset.samples
    batches = -(-n // args.batch)
    res = {m.name: [] for m in runnable}
    cpu = {m.name: [] for m in runnable}
    cold_files = _cold_files(args.data) if args.cache == "cold" else []
    for rnd in range(-1, args.rounds):          # round -1: untimed warm-up
        turn = rnd % len(runnable) if runnable else 0
        for m in runnable[turn:] + runnable[:turn]:
            if args.gap:
                time.sleep(args.gap)
            if args.cache == "cold":
                # Before the build, as a fresh machine: what a mode reads while it
                # builds (footers, a pipeline's first prefetch) comes from the disk too.
                evict(cold_files)
            runner = m.build(m, cfg)
            if args.touch:
                runner = _touching(runner)
            try:
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                t = time.perf_counter()
                samples = 0
                while samples < n * args.epochs:
                    got, _nbytes = runner.next()
                    samples += got
                dt = time.perf_counter() - t
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                faults = r1.ru_minflt - r0.ru_minflt
                # The process's CPU over the epoch(s), all threads: less moved by
                # other jobs on a shared machine than the rate is.
                user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
            finally:
                runner.close()
            if rnd >= 0:
                res[m.name].append(samples / dt)
                cpu[m.name].append((user, system))
                print(f"round {rnd}: {m.name:24s} {samples / dt:9.0f} img/s  "
                      f"{faults:8d} page faults  cpu {user:.2f} s user {system:.2f} s sys",
                      flush=True)
    del batches
    med = {k: statistics.median(v) for k, v in res.items()}
    peers = [k for k in PEERS if k in med]
    best = max(peers, key=med.get) if peers else None
    # the fastest files ceiling (one per engine with --engines)
    ceilings = [k for k in med if k.startswith("parquet-files-ceiling")]
    ceiling = max(ceilings, key=med.get) if ceilings else None
    print(f"\n{cfg.dataset.describe()}; batch {args.batch}; {args.rounds} rounds of "
          f"{args.epochs} epoch(s), page cache {args.cache}; medians:")
    for k, v in med.items():
        line = f"  {k:24s} {v:9.0f} img/s"
        if best:
            line += f"  {v / med[best]:5.2f}x {best}"
        if ceiling:
            line += f"  {v / med[ceiling]:5.0%} of files"
        if cpu.get(k):
            line += (f"  cpu {statistics.median(u for u, _ in cpu[k]):.2f} user "
                     f"{statistics.median(y for _, y in cpu[k]):.2f} sys")
        print(line)


if __name__ == "__main__":
    main()
