"""The table of file_ranges_prof_rounds.sh's runs.jsonl: per (build, kind,
shards, engine, order) the median over rounds of samples/s and of CPU
microseconds a sample (user, system, both), context switches and page
faults per 1,000 samples; the rate and CPU against the same build's cell
at the fewest shards.

    python bench/engines/file_ranges_prof_table.py OUT/runs.jsonl [...]
"""
import collections
import json
import statistics
import sys


def main():
    runs = collections.defaultdict(list)
    for path in sys.argv[1:]:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                runs[(r["venv"], r["kind"], r["engine"], r["order"], r["shards"])].append(r)
    med = {k: {f: statistics.median(x[f] for x in v)
               for f in ("rate", "cpu_us", "user_us", "sys_us", "csw_per_k", "faults_per_k")}
           | {"n": len(v)} for k, v in runs.items()}
    print(f"{'build':16} {'kind':6} {'engine':15} {'order':8} {'shards':>6} {'n':>2} "
          f"{'samples/s':>9} {'cpu us':>7} {'user':>6} {'sys':>6} {'csw/k':>6} {'flt/k':>6} "
          f"{'rate vs min':>11} {'+cpu us':>7}")
    for k in sorted(med):
        m = med[k]
        base_key = min((x for x in med if x[:4] == k[:4]), key=lambda x: x[4])
        b = med[base_key]
        print(f"{k[0]:16} {k[1]:6} {k[2]:15} {k[3]:8} {k[4]:>6} {m['n']:>2} {m['rate']:>9.0f} "
              f"{m['cpu_us']:>7.2f} {m['user_us']:>6.2f} {m['sys_us']:>6.2f} {m['csw_per_k']:>6.1f} "
              f"{m['faults_per_k']:>6.2f} {m['rate'] / b['rate']:>10.2f}x "
              f"{m['cpu_us'] - b['cpu_us']:>+7.2f}")


if __name__ == "__main__":
    main()
