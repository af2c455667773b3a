"""WebDataset index cost at scale (issue 37, item 2-3): N samples in S local
shards of tiny samples (two members each, ``%09d.jpg`` of 8 bytes and
``%09d.cls`` of 1), so only per-sample and per-shard costs show.

Measured, each in a fresh process (the shards in the page cache: the
first run writes them):
  build_native   WebDataset(...) indexed by the C core (no index file, no cache)
  build_python   the same by the Python reference (indexer="python"; the before)
  cli            `fastread index --combined` (native build + write)
  open_fridx     WebDataset(index_paths=<the combined .fridx>)
  open_cache     WebDataset(...) with the node-local cache holding the index
  first_batch_*  Reader(source=WebDataset(...), batch_size=256) in order: from
                 construction to the first batch, with the index file, from the
                 cache, and building natively
with the time, RSS growth and Reader.memory()/index_bytes() per sample.

``--synthetic N`` (e.g. 100000000) measures an index too large to build
here: S sparse shard files (holes: the reads return zeros) and a synthetic
``.fridx`` of N samples written column by column in chunks (never in RAM;
~32 B a sample on disk), then in a fresh process
  huge_open          WebDataset(index_paths=<it>): time and RSS
  huge_first_batch   + Reader(random_shuffle=True, batch_size=256): the first
                     batch of a shuffled epoch, time and RSS
(targets, issue 37: opens in <= 2 s and <= 1 GB RSS, first batch <= 1 s).

    nice -n 5 python bench/scale/index.py [--samples 1000000] [--shards 200]
        [--dir /var/tmp/fastread-scale-index] [--json OUT]
    nice -n 5 python bench/scale/index.py --synthetic 100000000 --shards 10000
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from generate import _tar_header  # bench/scale/generate.py: the one ustar writer here

_BLOCK = 512


def make_shards(root, samples, shards):
    """S tar shards of N samples in all (written once; reused when present)."""
    os.makedirs(root, exist_ok=True)
    per = -(-samples // shards)
    paths = []
    jpg, cls = b"JPEGDATA".ljust(_BLOCK, b"\0"), b"7".ljust(_BLOCK, b"\0")
    done = os.path.join(root, f"DONE-{samples}-{shards}")
    for s in range(shards):
        path = os.path.join(root, f"shard-{s:06d}.tar")
        paths.append(path)
        if os.path.exists(done):
            continue
        lo, hi = s * per, min(samples, (s + 1) * per)
        parts = []
        for i in range(lo, hi):
            parts += [_tar_header(f"{i:09d}.jpg", 8), jpg, _tar_header(f"{i:09d}.cls", 1), cls]
        parts.append(b"\0" * 1024)
        with open(path + ".tmp", "wb") as f:
            f.write(b"".join(parts))
        os.replace(path + ".tmp", path)
    if not os.path.exists(done):
        old = time.time() - 3600   # not "racy": the index cache keeps their index
        for p in paths:
            os.utime(p, (old, old))
        open(done, "w").close()
    return paths


def make_synthetic(root, samples, shards, lengths="<u4"):
    """A synthetic index of ``samples`` two-component samples (8-byte jpg,
    1-byte cls, laid out as make_shards lays them) over ``shards`` sparse
    shard files, as one .fridx written in chunks; reused when present.
    ``lengths``: the length column's dtype, ``<u4`` (what version 3 writes)
    or ``<i8`` (version 2's layout: the before)."""
    from fastread.formats import _index_files

    os.makedirs(root, exist_ok=True)
    fridx = os.path.join(root, "all.fridx" if lengths == "<u4" else "all-i8.fridx")
    done = fridx + ".done"
    per = -(-samples // shards)
    counts = np.full(shards, per, np.int64)
    counts[-1] = samples - per * (shards - 1)
    paths = [os.path.join(root, f"shard-{s:06d}.tar") for s in range(shards)]
    if os.path.exists(done):
        return paths, fridx
    old = time.time() - 3600
    recs = []
    for p, n in zip(paths, counts.tolist()):
        size = n * 4 * _BLOCK + 1024
        # Shared by the layouts' index files: made once, so that one's
        # writing does not make the other's identity stale.
        if not os.path.exists(p) or os.path.getsize(p) != size:
            with open(p, "wb") as f:
                f.truncate(size)   # a hole: no disk blocks
            os.utime(p, (old, old))
        st = os.stat(p)
        recs.append({"path": p, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    spec = {"ext": ["jpg", "cls"], "case_sensitive": True, "grouping": "webdataset",
            "missing": "empty"}
    first = np.r_[0, np.cumsum(counts)[:-1]]
    chunk = 1 << 22

    def fill(name, out):
        if name == "counts":
            out[:] = counts
            return
        for a in range(0, samples, chunk):
            b = min(samples, a + chunk)
            i = np.arange(a, b, dtype=np.int64)
            f = np.searchsorted(first, i, side="right") - 1
            local = i - first[f]
            if name == "start":
                out[a:b] = local * 4 * _BLOCK + _BLOCK
            elif name == "length":
                out[a:b] = 3 * _BLOCK + 1
            elif name == "file_ids":
                out[a:b] = f
            elif name == "labels":
                out[a:b] = i
            elif name == "comp_off":
                out[a:b, 0], out[a:b, 1] = 0, 2   # blocks: bytes 0 and 1024
            elif name == "comp_len":
                out[a:b, 0], out[a:b, 1] = 8, 1
    cols = [("start", "<i8", (samples,)), ("length", lengths, (samples,)),
            ("comp_off", "<u2", (samples, 2)), ("comp_len", "<u4", (samples, 2)),
            ("counts", "<i8", (shards,)), ("file_ids", "<u4", (samples,)),
            ("labels", "<i4", (samples,))]
    _index_files.write_fridx(fridx, {"spec": spec, "shards": recs, "samples": samples,
                                     "skipped": 0, "comp_unit": _index_files.BLOCK},
                             cols, fill)
    open(done, "w").close()
    return paths, fridx


def huge_child(mode, paths, fridx):
    from fastread import Reader
    from fastread.formats.webdataset import WebDataset

    rss0 = _rss()
    t0 = time.perf_counter()
    src = WebDataset(paths, ["jpg", "cls"], index_paths=fridx, index_cache="off")
    out = {"mode": mode, "samples": len(src), "shards": len(paths),
           "index_s": time.perf_counter() - t0, "origin": src.index_origin, **src.index_bytes()}
    out["rss_open"] = _rss()
    if mode == "huge_first_batch":
        r = Reader(source=src, batch_size=256, random_shuffle=True, seed=1)
        arrays, labels = next(iter(r))
        out["first_batch_s"] = time.perf_counter() - t0
        out["batch"] = len(labels)
        # The batch is what the index says: 8 + 1 bytes of components a sample.
        jpg, cls = src.components(arrays, np.asarray(labels, np.int64))
        out["batch_ok"] = all(len(a) == 8 for a in jpg) and all(len(c) == 1 for c in cls)
        r.close()
    out["rss"] = _rss()
    out["rss_growth"] = out["rss"] - rss0
    out["rss_per_sample"] = out["rss_growth"] / max(1, len(src))
    out["index_total_per_sample"] = out["index_bytes"] / max(1, len(src))
    # Anonymous (what the process made) and file-backed (the index's clean
    # pages, mapped by fault-around where the page cache holds them: they
    # depend on what the cache kept of the file, and the kernel may drop
    # them) apart.
    out.update(_rss_kinds())
    return out


def _drop_from_cache(path):
    """The page cache's pages of ``path`` dropped (this file's only:
    POSIX_FADV_DONTNEED), so that every layout's row starts with its index
    cold, whichever file was written or read last."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _rss_kinds():
    kinds = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                kinds["rss_" + line[3:7].lower()] = int(line.split()[1]) * 1024
    return kinds


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(mode, paths, fridx, cache):
    from fastread import Reader
    from fastread.formats.webdataset import WebDataset

    ext = ["jpg", "cls"]
    kw = {"build_native": dict(index_cache="off"),
          "build_python": dict(index_cache="off", indexer="python"),
          "open_fridx": dict(index_paths=fridx, index_cache="off"),
          "open_cache": dict(index_cache=cache),
          "first_batch_fridx": dict(index_paths=fridx, index_cache="off"),
          "first_batch_cache": dict(index_cache=cache),
          "first_batch_build": dict(index_cache="off")}[mode]
    rss0 = _rss()
    t0 = time.perf_counter()
    src = WebDataset(paths, ext, **kw)
    t_index = time.perf_counter() - t0
    out = {"mode": mode, "samples": len(src), "shards": len(paths), "index_s": t_index,
           "origin": src.index_origin, **src.index_bytes()}
    if mode.startswith("first_batch"):
        r = Reader(source=src, batch_size=256)
        arrays, labels = next(iter(r))
        out["first_batch_s"] = time.perf_counter() - t0
        out["batch"] = len(labels)
        out["reader_memory"] = r.memory()
        r.close()
    out["rss_growth"] = _rss() - rss0
    out["rss_per_sample"] = out["rss_growth"] / max(1, len(src))
    # index_bytes_per_sample (index_bytes()): the columns beyond names;
    # index_total_per_sample: all of index_bytes, the keys blob included.
    out["index_total_per_sample"] = out["index_bytes"] / max(1, len(src))
    return out


def huge(args):
    root = os.path.join(args.dir, f"synthetic-{args.synthetic}x{args.shards}")
    layouts = [x for x in args.lengths.split(",") if x]
    if args.child:
        paths, fridx = make_synthetic(root, args.synthetic, args.shards, layouts[0])
        print(json.dumps(huge_child(args.child, paths, fridx)))
        return 0
    for lengths in layouts:
        t0 = time.perf_counter()
        _paths, fridx = make_synthetic(root, args.synthetic, args.shards, lengths)
        print(f"synthetic index of {args.synthetic} samples in {args.shards} shards, lengths "
              f"{lengths}: {os.path.getsize(fridx) / 1e9:.2f} GB, "
              f"{time.perf_counter() - t0:.1f} s to make (or find)", flush=True)
    rows = []
    # Interleaved: every round runs each layout's rows, each in a fresh process.
    for rnd in range(args.rounds):
        for lengths in layouts:
            for mode in ("huge_open", "huge_first_batch"):
                if args.cold_index:
                    _drop_from_cache(make_synthetic(root, args.synthetic, args.shards,
                                                    lengths)[1])
                cmd = [sys.executable, __file__, "--synthetic", str(args.synthetic), "--shards",
                       str(args.shards), "--dir", args.dir, "--child", mode, "--lengths",
                       lengths]
                res = subprocess.run(cmd, check=True, capture_output=True, text=True)
                r = json.loads(res.stdout.strip().splitlines()[-1])
                r.update(lengths=lengths, round=rnd)
                rows.append(r)
                print(f"{lengths} {mode:18s} open {r['index_s']:6.3f} s"
                      + (f"  first batch {r['first_batch_s']:6.3f} s ok={r['batch_ok']}"
                         if "first_batch_s" in r else "")
                      + f"  RSS {r['rss'] / 2**20:7.1f} MiB (+{r['rss_growth'] / 2**20:.1f}; "
                        f"anon {r['rss_anon'] / 2**20:.1f}, file {r['rss_file'] / 2**20:.1f})  "
                        f"index {r['index_bytes_per_sample']:.1f} B/sample "
                        f"(mapped={r['index_mapped']})", flush=True)
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"synthetic": args.synthetic, "shards": args.shards, "rows": rows}, f,
                      indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--dir", default="/var/tmp/fastread-scale-index")
    ap.add_argument("--json")
    ap.add_argument("--skip-python", action="store_true")
    ap.add_argument("--child")
    ap.add_argument("--synthetic", type=int, default=0,
                    help="N: a synthetic N-sample index over sparse shards (the 10^8 row)")
    ap.add_argument("--lengths", default="<u4",
                    help="with --synthetic: the length columns' dtypes to compare, e.g. "
                         "'<i8,<u4' (version 2's layout, then version 3's)")
    ap.add_argument("--rounds", type=int, default=1, help="with --synthetic: interleaved rounds")
    ap.add_argument("--cold-index", action="store_true",
                    help="with --synthetic: the index file dropped from the page cache before "
                         "each row (POSIX_FADV_DONTNEED of that file only)")
    args = ap.parse_args()
    if args.synthetic:
        return huge(args)
    root = os.path.join(args.dir, f"{args.samples}x{args.shards}")
    fridx = os.path.join(root, "all.fridx")
    cache = os.path.join(root, "cache")
    paths = make_shards(root, args.samples, args.shards)
    if args.child:
        print(json.dumps(child(args.child, paths, fridx, cache)))
        return 0
    rows = []

    def run(mode):
        cmd = [sys.executable, __file__, "--samples", str(args.samples), "--shards",
               str(args.shards), "--dir", args.dir, "--child", mode]
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{mode:18s} index {r['index_s']:7.3f} s"
              + (f"  first batch {r['first_batch_s']:7.3f} s" if "first_batch_s" in r else "")
              + f"  index {r['index_bytes_per_sample']:4.1f} B/sample beyond names "
                f"({r['index_total_per_sample']:5.1f} with them)  RSS +"
                f"{r['rss_per_sample']:6.1f} B/sample  ({r['origin']})", flush=True)

    run("build_native")
    if not args.skip_python:
        run("build_python")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fastread.cli", "index", *paths, "--ext", "jpg,cls",
                    "--combined", fridx], check=True, capture_output=True)
    cli_s = time.perf_counter() - t0
    rows.append({"mode": "cli", "seconds": cli_s, "file_bytes": os.path.getsize(fridx)})
    print(f"{'cli':18s} {cli_s:7.3f} s (process included), .fridx "
          f"{os.path.getsize(fridx) / args.samples:.1f} B/sample", flush=True)
    run("open_fridx")
    subprocess.run([sys.executable, __file__, "--samples", str(args.samples), "--shards",
                    str(args.shards), "--dir", args.dir, "--child", "open_cache"], check=True,
                   capture_output=True)   # fills the cache (or finds it)
    run("open_cache")
    run("first_batch_fridx")
    run("first_batch_cache")
    run("first_batch_build")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "shards": args.shards, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
