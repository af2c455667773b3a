"""read_batches() against a Reader over the same files (issue 31 item 3:
target >= 0.9x), and read_files() for reference: 4 KiB and 92 KiB files,
warm, lists of 64 and 256, io_uring, interleaved rounds. One command, one
table:

    python bench/engines/read_batches.py [--rounds 5] [--files 20000] [--out DIR]

The 4 KiB and 92 KiB sets (random bytes, fixed seed; 92 KiB = 94,208 bytes
each) are made under --data-root on first use. The cells are those of
bench/engines/engines.py (--apis reader,read_batches,read_files), whose JSON
is kept in --out; "paired" is the median over rounds of that round's ratio
(the two cells of a round ran seconds apart, so a slow spell of a shared
machine cancels out). Arguments after "--" go to engines.py as they are
(e.g. -- --reader-option workers=4, --engines psync).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import engines  # noqa: E402  (bench/engines/engines.py)

SIZE_92K = 94208


def table(result):
    """Rows of the comparison, one per (size, batch, engine)."""
    cells = {(c["size"], c["batch"], c["engine"], c["api"]): c for c in result["cells"]
             if "files_per_s" in c}
    rows = [f"{'size':>4} {'list':>4} {'engine':9} {'Reader f/s':>11} {'read_batches':>12} "
            f"{'ratio':>5} {'paired':>6} {'read_files':>11} {'ratio':>5}  verdict (>= 0.90)"]
    for (size, batch, engine, api), c in sorted(cells.items()):
        if api != "reader":
            continue
        rb = cells.get((size, batch, engine, "read_batches"))
        rf = cells.get((size, batch, engine, "read_files"))
        if rb is None:
            continue
        ratio = rb["files_per_s"] / c["files_per_s"]
        paired = rb.get("of_reader_paired", ratio)
        rf_text = (f"{rf['files_per_s']:11,.0f} {rf['files_per_s'] / c['files_per_s']:5.2f}"
                   if rf else f"{'-':>11} {'-':>5}")
        rows.append(f"{size:>4} {batch:>4} {engine:9} {c['files_per_s']:11,.0f} "
                    f"{rb['files_per_s']:12,.0f} {ratio:5.2f} {paired:6.2f} {rf_text}  "
                    f"{'ok' if paired >= 0.9 else 'BELOW'}")
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", default="/var/tmp/fastread-bench")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--files", type=int, default=20000)
    p.add_argument("--batches", default="64,256")
    p.add_argument("--min-time", default="0.5")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    data_92k = engines.make_set(args.data_root, "92k-flat", SIZE_92K, args.files)
    out = os.path.join(args.out, "read_batches.json")
    engines.main(["--data-root", args.data_root, "--data-92k", data_92k, "--sizes", "4k,92k",
                  "--caches", "warm", "--batches", args.batches, "--engines", "io_uring",
                  "--apis", "reader,read_batches,read_files", "--rounds", str(args.rounds),
                  "--files", str(args.files), "--min-time", args.min_time, "--no-ceiling",
                  "--out", out, *extra])
    with open(out) as f:
        result = json.load(f)
    m = result["machine"]
    print()
    print(f"read_batches vs Reader ({m.get('cpus', '?')} CPUs, {m.get('kernel', '?')}; "
          f"{args.rounds} rounds, {args.files} files a set, warm)")
    print("\n".join(table(result)))


if __name__ == "__main__":
    main()
