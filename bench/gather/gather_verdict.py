"""Issue 39's gather targets, judged from bench/gather/gather.py's JSON files
(bash bench/gpu.sh gather-targets runs them; any JSON of gather.py works):

    python3 bench/gather/gather_verdict.py warmhot.json cold-a.json [cold-b.json ...]

Prints each measurement's repeats (rows/s of every timed gather, not only the
median), then a verdict table, last:
  - hot zipf(1.2) 1M ids, FeatureStore defaults ("default"): the 1st, 2nd and
    3rd repeat of the same ids (gather.py's "hot": one untimed gather first);
    target >= 500M rows/s by the 2nd (issue 39 measured 154M, 283M, 411M);
  - warm uniform 1M ids, default against memmap: holds where it was
    (issue 39: 48.7-51.0M rows/s, 33x memmap);
  - cold uniform 1M ids, default against memmap, every file's pairs pooled
    (run the modes in both orders: a virtio disk's own caching favours
    whoever reads second); target >= 1.4x (issue 39: 1.37x).
Exit status 0 whatever the verdicts (a benchmark, not a test)."""
import json
import statistics
import sys

HOT_TARGET = 500e6
WARM_WAS = 48.7e6
COLD_TARGET = 1.4


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for r in doc.get("results", []):
            r["file"] = p
            rows.append(r)
    return rows


def rates(r):
    return [r["batch"] / t for t in r.get("times_s", []) if t > 0]


def pick(rows, state, dist, mode, batch=1_000_000):
    return [r for r in rows if r.get("state") == state and r.get("dist") == dist
            and r.get("mode") == mode and r.get("batch") == batch]


def fmt(x):
    if x is None:
        return "-"
    return f"{x / 1e6:,.1f}M" if x >= 10e6 else f"{x / 1e6:.3f}M"


def main(argv):
    if not argv:
        sys.exit(__doc__)
    rows = load(argv)
    print("measurements (rows/s of each timed gather):")
    for r in rows:
        what = f"  {r.get('state', '?'):5} {r.get('dist', '?'):7} {r.get('batch', 0):>9,} " \
               f"{r.get('mode', '?'):15}"
        if "times_s" not in r:
            print(f"{what} {r.get('skipped') or r.get('error')}")
            continue
        st = r.get("stats") or {}
        extra = ""
        if st:
            route = str(st.get("route") or "-").split(" (")[0]
            extra = (f"  [route: {route}; row_hits {st.get('row_hits')}, "
                     f"admitted {st.get('admitted')}, direct {st.get('direct_rows')}, "
                     f"host_routed {st.get('host_routed')}]")
        print(f"{what} {', '.join(fmt(x) for x in rates(r))}{extra}")

    verdicts = []
    hot = pick(rows, "hot", "zipf", "default")
    if hot and rates(hot[0]):
        rep = rates(hot[0])
        second = rep[1] if len(rep) > 1 else None
        ok = second is not None and second >= HOT_TARGET
        verdicts.append(("hot zipf 1M, default: repeats 1, 2, 3", " / ".join(fmt(x) for x in rep),
                         ">= 500M by the 2nd (was 154M / 283M / 411M)", "PASS" if ok else "FAIL"))
    else:
        verdicts.append(("hot zipf 1M, default", "not measured", ">= 500M by the 2nd", "-"))

    def median_of(found):
        xs = [x for r in found for x in rates(r)]
        return statistics.median(xs) if xs else None

    warm_d = median_of(pick(rows, "warm", "uniform", "default"))
    warm_m = median_of(pick(rows, "warm", "uniform", "memmap"))
    if warm_d:
        ratio = f" ({warm_d / warm_m:.1f}x memmap {fmt(warm_m)})" if warm_m else ""
        verdicts.append(("warm uniform 1M, default", fmt(warm_d) + ratio,
                         "holds (was 48.7-51.0M, 33x)",
                         "PASS" if warm_d >= 0.95 * WARM_WAS else "FAIL"))
    warm_z = median_of(pick(rows, "warm", "zipf", "default"))
    if warm_z:
        verdicts.append(("warm zipf 1M, default (a fresh store each)", fmt(warm_z), "-", "-"))

    cold_d = pick(rows, "cold", "uniform", "default")
    cold_m = pick(rows, "cold", "uniform", "memmap")
    cold_h = pick(rows, "cold", "uniform", "host")
    d, m, h = median_of(cold_d), median_of(cold_m), median_of(cold_h)
    if d and m:
        per_file = []
        for p in argv:
            fd = median_of([r for r in cold_d if r["file"] == p])
            fm = median_of([r for r in cold_m if r["file"] == p])
            if fd and fm:
                per_file.append(f"{fd / fm:.2f}x")
        verdicts.append(("cold uniform 1M, default vs memmap",
                         f"{fmt(d)} vs {fmt(m)}: {d / m:.2f}x (per file {', '.join(per_file)})",
                         ">= 1.4x (was 1.37x)", "PASS" if d / m >= COLD_TARGET else "FAIL"))
    if h and m:
        verdicts.append(("cold uniform 1M, backend host vs memmap", f"{fmt(h)}: {h / m:.2f}x",
                         "-", "-"))

    w = [max(len(v[i]) for v in verdicts + [("target", "measured", "asked", "verdict")])
         for i in range(4)]
    print("\nverdict:")
    for v in [("target", "measured", "asked", "verdict")] + verdicts:
        print("  " + " | ".join(s.ljust(w[i]) for i, s in enumerate(v)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
