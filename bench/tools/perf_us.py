"""CPU microseconds a sample by symbol, from `perf record` profiles (the
cpu-clock event: each sample's period is nanoseconds of CPU), side by side:
the first profile is the base, each other one's column says what it adds.

    python bench/tools/perf_us.py BASE.data:SAMPLES OTHER.data:SAMPLES [...]
        [--top 30] [--min-us 0.01] [--names A,B] [--group NAME=SYM,SYM ...]

SAMPLES: the samples (records) read while perf recorded, what each
profile's time is divided by (file_ranges_prof.py prints it); A.data+B.data:N
sums several profiles (rounds) over their N samples in all. Rows:
user space vs kernel totals, then symbols (dso + symbol, unresolved
addresses of one object folded into "DSO [unresolved]") by the largest
difference against the base.
"""
import argparse
import collections
import subprocess


def profile(path):
    out = subprocess.run(
        ["perf", "report", "-i", path, "--no-children", "--sort", "dso,sym", "--stdio",
         "-g", "none", "-F", "period,dso,sym", "-t", ";"],
        capture_output=True, text=True, check=True).stdout
    by = collections.Counter()
    for line in out.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(";")]
        if len(parts) < 3:
            continue
        period, dso, sym = int(parts[0]), parts[1], parts[2]
        if sym.startswith("[.] 0x") or sym.startswith("[k] 0x"):
            sym = sym[:4] + "[unresolved]"
        by[(dso, sym)] += period
    return by


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", help="PATH.data:SAMPLES")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--min-us", type=float, default=0.01)
    ap.add_argument("--names", default=None, help="comma-separated column names")
    ap.add_argument("--group", action="append", default=[],
                    help="NAME=SYM,SYM,...: a row summing those symbols (any object)")
    args = ap.parse_args()
    cols = []
    for spec in args.profiles:
        paths, _, n = spec.rpartition(":")
        by = collections.Counter()
        for path in paths.split("+"):
            by.update(profile(path))
        cols.append({k: v / 1e3 / int(n) for k, v in by.items()})
    names = args.names.split(",") if args.names else [f"p{i}" for i in range(len(cols))]
    w = 10
    head = f"{'us a sample':44}" + "".join(f"{n:>{w}}" for n in names)
    head += "".join(f"{'+' + n:>{w}}" for n in names[1:])
    print(head)

    def row(label, vals):
        s = f"{label[:44]:44}" + "".join(f"{v:>{w}.3f}" for v in vals)
        s += "".join(f"{v - vals[0]:>+{w}.3f}" for v in vals[1:])
        print(s)

    kernel = [sum(v for (d, _), v in c.items() if d == "[kernel.kallsyms]") for c in cols]
    total = [sum(c.values()) for c in cols]
    row("total", total)
    row("kernel", kernel)
    row("user space", [t - k for t, k in zip(total, kernel)])
    for dso in sorted({d for c in cols for (d, _) in c} - {"[kernel.kallsyms]"}):
        vals = [sum(v for (d, _), v in c.items() if d == dso) for c in cols]
        if max(vals) >= args.min_us:
            row("  " + dso, vals)
    for g in args.group:
        label, _, syms = g.partition("=")
        want = set(syms.split(","))
        row("= " + label, [sum(v for (_, sym), v in c.items() if sym[4:] in want) for c in cols])
    print()
    keys = {k for c in cols for k in c}
    diff = sorted(keys, key=lambda k: -max(abs(c.get(k, 0) - cols[0].get(k, 0)) for c in cols[1:])
                  if len(cols) > 1 else -cols[0].get(k, 0))
    for k in diff[:args.top]:
        vals = [c.get(k, 0.0) for c in cols]
        if max(vals) < args.min_us:
            continue
        dso = "k" if k[0] == "[kernel.kallsyms]" else k[0].split(".")[0][:10]
        row(f"{dso}: {k[1][4:]}", vals)


if __name__ == "__main__":
    main()
