"""perf stat outputs of file_ranges_prof_rounds.sh (PERF=stat) as a table:
per file, task-clock microseconds, context switches, CPU migrations and page
faults per sample / 1,000 samples, with the samples from runs.jsonl.

    python bench/tools/perf_stat_table.py OUT
"""
import collections
import json
import os
import re
import statistics
import sys


def main():
    out = sys.argv[1]
    samples = {}
    with open(os.path.join(out, "runs.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            tag = f"{r['round']}-{r['venv']}-{r['kind']}-{r['shards']}-{r['engine']}-{r['order']}"
            samples[tag] = r["samples"]
    cells = collections.defaultdict(list)
    for tag, n in samples.items():
        path = os.path.join(out, tag + ".stat.txt")
        if not os.path.exists(path):
            continue
        text = open(path).read()

        def val(event):
            m = re.search(r"^\s*([\d,.]+)\s+(?:msec\s+)?" + re.escape(event) + r"\b", text, re.M)
            return float(m.group(1).replace(",", "")) if m else float("nan")
        cells[tag.split("-", 1)[1]].append((val("task-clock") * 1e3 / n,
                                            val("context-switches") * 1e3 / n,
                                            val("cpu-migrations") * 1e3 / n,
                                            val("page-faults") * 1e3 / n))
    print(f"{'cell':52} {'n':>2} {'task-clock us':>13} {'csw/k':>7} {'migr/k':>7} {'flt/k':>7}")
    for cell in sorted(cells):
        v = cells[cell]
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        print(f"{cell:52} {len(v):>2} {med[0]:>13.2f} {med[1]:>7.1f} {med[2]:>7.2f} {med[3]:>7.2f}")


if __name__ == "__main__":
    main()
