"""A/B of two fastread builds on bench/engines/engines.py, in whole-process rounds
interleaved A, B, B, A, A, B, ... (so a slow spell of a shared machine hits
both alike, and neither always runs second), with medians per cell and the
median of the paired B/A ratios.

    python bench/engines/engines_ab.py --a /tmp/base-site --b "" --rounds 5 \\
        --out bench-results/engines-ab.json -- --sizes 4k,92k --caches warm \\
        --engines io_uring,psync --files 4096 --no-ceiling

--a / --b: a directory put first on PYTHONPATH (a `pip install --target`
of the build), or "" for the interpreter's own fastread. Arguments after
"--" go to every bench/engines/engines.py run (each runs --rounds 1). Reported per
cell: files/s and CPU us/file (medians), B/A, and read_files/Reader for each
build (the median over rounds of that round's ratio).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(site, extra, out):
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.join(HERE, "engines.py"), "--rounds", "1", "--out", out,
           "--plot", out + ".png", *extra]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def key(c):
    return (c["size"], c["cache"], c["batch"], c["engine"], c["api"])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help='PYTHONPATH dir of build A ("" : installed)')
    p.add_argument("--b", required=True, help='PYTHONPATH dir of build B ("" : installed)')
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    runs = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # A, B in even rounds, B, A in odd ones: the run that comes
            # second in a round is not always the same build.
            for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
                res = run_once(getattr(args, side), extra, os.path.join(tmp, f"{side}{r}.json"))
                runs[side].append({key(c): c for c in res["cells"] if "files_per_s" in c})
                print(f"round {r} {side} done", file=sys.stderr, flush=True)
    cells = []
    for k in sorted(runs["a"][0]):
        if not all(k in x for side in runs for x in runs[side]):
            continue
        cell = dict(zip(("size", "cache", "batch", "engine", "api"), k))
        for side in ("a", "b"):
            fps = [x[k]["files_per_s"] for x in runs[side]]
            cpu = [x[k].get("cpu_us_per_file", x[k].get("cpu_s_per_file", 0) * 1e6)
                   for x in runs[side]]
            cell[f"{side}_files_per_s"] = statistics.median(fps)
            cell[f"{side}_rounds"] = fps
            cell[f"{side}_cpu_us_per_file"] = statistics.median(cpu)
        cell["b_over_a"] = statistics.median(
            b[k]["files_per_s"] / a[k]["files_per_s"] for a, b in zip(runs["a"], runs["b"]))
        if k[4] == "read_files":
            rk = k[:4] + ("reader",)
            for side in ("a", "b"):
                if all(rk in x for x in runs[side]):
                    cell[f"{side}_of_reader"] = statistics.median(
                        x[k]["files_per_s"] / x[rk]["files_per_s"] for x in runs[side])
        cells.append(cell)
    result = {"a": args.a, "b": args.b, "rounds": args.rounds, "engines_args": extra,
              "cells": cells}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'cell':36} {'A files/s':>10} {'B files/s':>10} {'B/A':>5} {'A cpu':>6} {'B cpu':>6}"
          f" {'A rf/R':>6} {'B rf/R':>6}")
    for c in cells:
        name = f"{c['size']} {c['cache']} b{c['batch']} {c['engine']} {c['api']}"
        rf = (f" {c['a_of_reader']:6.2f} {c['b_of_reader']:6.2f}" if "a_of_reader" in c else "")
        print(f"{name:36} {c['a_files_per_s']:10,.0f} {c['b_files_per_s']:10,.0f} "
              f"{c['b_over_a']:5.2f} {c['a_cpu_us_per_file']:6.2f} {c['b_cpu_us_per_file']:6.2f}"
              + rf)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
