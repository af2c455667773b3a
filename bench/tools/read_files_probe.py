"""Where a read_files() call's time goes on small cached files, against a
Reader over the same files (issue 16: read_files() at 4 KiB on 16 cores ran
at 0.56-0.64 of the Reader). Run from the repo root:

    python3 bench/tools/read_files_probe.py [--root DIR] [--size 4096] [--files 20000]

Makes --files files of --size bytes under --root once, warms them, then per
batch size (64, 256) prints files/s of: the Reader; read_files(), with and
without remembered sizes (FASTREAD_REMEMBER_SIZES=0); the engine call alone
with no sizes given (what read_files() does: after the first pass over the
files, every size is remembered) and with every size given (the path a
Reader takes from its second epoch on), each with its native microseconds a
call, on read_files()' context and on one that remembers nothing; the context's read() then arrays() (read_files() less
its argument checks); read_files() with other options (--read-options); and
the Python steps of a call (context lookup, arrays(), failures()) timed
alone. Interleaved rounds; medians."""
import argparse
import contextlib
import os
import statistics
import time

import fastread
from fastread import _core, files as files_mod


def make_tree(root, size, count):
    paths = [os.path.join(root, f"d{k % 100:02d}", f"{k:06d}.bin") for k in range(count)]
    if not all(os.path.exists(p) and os.path.getsize(p) == size for p in paths[:: max(1, count // 50)]):
        payload = os.urandom(size)
        for p in paths:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(payload)
    for p in paths:  # warm: every file in the page cache
        with open(p, "rb") as f:
            f.read()
    return paths


def add_tree_arguments(ap, rounds):
    """The options of the probes' file tree (--root, --size, --files) and --rounds."""
    ap.add_argument("--root", default="/tmp/fastread-probe")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=rounds)


def tree(args):
    """The tree add_tree_arguments' options name, made and cached (make_tree)."""
    return make_tree(os.path.join(args.root, f"{args.size}x{args.files}"), args.size, args.files)


def timed(fn, lists, min_time=0.4):
    """files/s over passes of fn over lists for at least min_time seconds."""
    t0 = time.perf_counter()
    n = 0
    while n == 0 or time.perf_counter() - t0 < min_time:
        for chunk in lists:
            fn(chunk)
            n += len(chunk)
    return n / (time.perf_counter() - t0)


def native_us(ctx, fn, lists):
    c0, t0 = ctx.stat("file_calls"), ctx.stat("file_call_ns")
    rate = timed(fn, lists)
    calls = ctx.stat("file_calls") - c0
    return rate, (ctx.stat("file_call_ns") - t0) / max(1, calls) / 1000


@contextlib.contextmanager
def sizes_forgotten():
    """read_files() as it reads without remembered sizes (every file sized
    by the engine): its contexts are keyed by the environment, so this is a
    context of its own."""
    os.environ["FASTREAD_REMEMBER_SIZES"] = "0"
    try:
        yield
    finally:
        del os.environ["FASTREAD_REMEMBER_SIZES"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_tree_arguments(ap, rounds=3)
    ap.add_argument("--engine", default="io_uring")
    ap.add_argument("--threads", default="", help="extra thread counts for the engine call, e.g. 8,4")
    ap.add_argument("--variants", default="",
                    help="engine_args to compare, ';'-separated, e.g. 'unsized=fds;taskrun=defer': "
                         "read_files() and the engine call with each")
    ap.add_argument("--read-options", default="",
                    help="options for read_files() itself, ';'-separated, one each, e.g. "
                         "'threads=12;spin_us=200': a row each")
    args = ap.parse_args()
    paths = tree(args)
    sizes = [args.size] * len(paths)
    print(f"{len(paths)} files of {args.size} B, {os.cpu_count()} CPUs, engine {args.engine}")
    variants = [v for v in args.variants.split(";") if v]
    for batch in (64, 256):
        lists = [paths[i:i + batch] for i in range(0, len(paths) - batch + 1, batch)]
        ctx = files_mod._context(args.engine, None, {}, batch)
        # Every context the engine call is timed with: read_files()' own, one
        # per extra thread count, and read_files()' own with each variant.
        contexts = [(f"threads={ctx.stat('threads')} (read_files' context)", ctx)]
        contexts += [(f"threads={t}", _core.Context(args.engine, threads=int(t)))
                     for t in args.threads.split(",") if t]
        contexts += [(f"engine_args={v}", files_mod._context(args.engine, None, {"engine_args": v}, batch))
                     for v in variants]
        with sizes_forgotten():
            contexts.append(("sizes not remembered", files_mod._context(args.engine, None, {}, batch)))
        one = ctx.read(lists[0])
        cells = {}

        def add(name, value):
            cells.setdefault(name, []).append(value)

        def us_a_call(fn):
            return 1e6 * batch / timed(fn, lists)

        for _ in range(args.rounds):
            with fastread.Reader(files=paths, labels=[0] * len(paths), batch_size=batch,
                                 engine=args.engine) as reader:
                for arrays, _ in reader:
                    pass
                t0, n = time.perf_counter(), 0
                while n == 0 or time.perf_counter() - t0 < 0.4:
                    for arrays, _ in reader:
                        n += len(arrays)
                add("Reader", n / (time.perf_counter() - t0))
            add("read_files()", timed(lambda l: fastread.read_files(l, engine=args.engine), lists))
            add("read() then arrays() (read_files() without its checks)",
                timed(lambda l: ctx.read(l).arrays(), lists))
            with sizes_forgotten():
                add("read_files(), sizes not remembered (FASTREAD_REMEMBER_SIZES=0)",
                    timed(lambda l: fastread.read_files(l, engine=args.engine), lists))
            for opt in [o for o in args.read_options.split(";") if o]:
                key, value = opt.split("=", 1)
                kw = {key: value if key == "engine_args" else int(value)}
                add(f"read_files(), {opt}",
                    timed(lambda l: fastread.read_files(l, engine=args.engine, **kw), lists))
            for v in variants:
                add(f"read_files(), engine_args={v}",
                    timed(lambda l: fastread.read_files(l, engine=args.engine, engine_args=v), lists))
            for label, c in contexts:
                add(f"engine call, no sizes given, {label}",
                    native_us(c, lambda l: c.read(l).release(), lists))
                add(f"engine call, sizes known, {label}",
                    native_us(c, lambda l: c.read(l, sizes[:len(l)]).release(), lists))
            add("python: _context()", us_a_call(lambda l: files_mod._context(args.engine, None, {}, batch)))
            add("python: arrays()", us_a_call(lambda l: one.arrays()))
            add("python: failures()", us_a_call(lambda l: one.failures()))
            add("python: arrays + sum(nbytes)", us_a_call(lambda l: sum(a.nbytes for a in one.arrays())))
        for label, c in contexts:
            if label.startswith("threads=") and c is not ctx:
                c.close()  # read_files()' contexts stay: its cache owns them
        print(f"\nbatch {batch}")
        for name, values in cells.items():
            if isinstance(values[0], tuple):
                rate = statistics.median(v[0] for v in values)
                us = statistics.median(v[1] for v in values)
                print(f"  {name:60s} {rate:12,.0f} files/s  native {us:7.1f} us a call "
                      f"({1e6 * batch / rate:7.1f} us a call in all)")
            elif name.startswith("python"):
                print(f"  {name:60s} {statistics.median(values):7.1f} us a call")
            else:
                rate = statistics.median(values)
                print(f"  {name:60s} {rate:12,.0f} files/s  ({1e6 * batch / rate:7.1f} us a batch)")


if __name__ == "__main__":
    main()
