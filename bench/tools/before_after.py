"""Interleaved before/after table for ``fastread bench`` (issue 37's "no regression").

Two installs of fastread (say a venv built at an older commit and one at the
current head) are run alternately, round after round, on the same data set and
the same modes, so that the machine's drift falls on both alike. Each round is
one ``fastread bench ... --json`` per side; the table shows each mode's median
img/s over the rounds and the after/before ratio.

    python bench/tools/before_after.py DATA \\
        --before /work/venvs/before/bin/python --after /work/venvs/after/bin/python \\
        --rounds 3 --modes dali,python-file,fastread-io_uring -- --epochs 3 --cache warm

Arguments after ``--`` go to ``fastread bench`` unchanged (both sides alike).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_side(python, data, modes, extra, out_json):
    # The console script's entry point, run by that interpreter (no __main__ module).
    cmd = [python, "-c", "import sys; from fastread.cli import main; sys.exit(main())",
           "bench", data, "--modes", modes,
           "--json", out_json, "--no-progress", *extra]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.exit(f"before_after: {' '.join(cmd)} failed (rc {proc.returncode}):\n"
                 f"{proc.stdout[-4000:]}")
    with open(out_json) as f:
        return {r["mode"]: r["img_per_s"] for r in json.load(f)["results"]}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--before", required=True, metavar="PYTHON",
                   help="interpreter whose fastread is the 'before' build")
    p.add_argument("--after", required=True, metavar="PYTHON",
                   help="interpreter whose fastread is the 'after' build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", required=True, metavar="A,B,...")
    p.add_argument("--json", metavar="OUT.json", help="write every round's figures")
    p.add_argument("--label-before", default="before")
    p.add_argument("--label-after", default="after")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")

    rounds = {"before": [], "after": []}
    loads = []
    with tempfile.TemporaryDirectory(prefix="before-after-") as tmp:
        for i in range(args.rounds):
            # Alternate which side goes first so neither always gets the warmer cache.
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                python = args.before if side == "before" else args.after
                out = os.path.join(tmp, f"{side}-{i}.json")
                rounds[side].append(run_side(python, args.data, args.modes, extra, out))
                loads.append(loadavg())
                print(f"round {i + 1}/{args.rounds} {side}: "
                      + ", ".join(f"{m} {v:,.0f}" for m, v in rounds[side][-1].items())
                      + f"  (load {loads[-1]})", flush=True)

    modes = [m for m in rounds["after"][0] if all(m in r for r in rounds["before"])]
    missing = sorted(set(rounds["after"][0]) ^ set(rounds["before"][0]))
    rows = []
    print(f"\n| mode | {args.label_before} img/s (median of {args.rounds}) | "
          f"{args.label_after} img/s | after / before |")
    print("|---|---|---|---|")
    for m in modes:
        b = statistics.median(r[m] for r in rounds["before"])
        a = statistics.median(r[m] for r in rounds["after"])
        rows.append({"mode": m, "before": b, "after": a, "ratio": a / b if b else None})
        print(f"| {m} | {b:,.0f} | {a:,.0f} | {a / b:.2f}x |" if b else f"| {m} | 0 | {a:,.0f} | n/a |")
    if missing:
        print(f"\nmodes run on one side only (not compared): {', '.join(missing)}")
    print(f"load average after each run: {'; '.join(loads)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "extra": extra, "rounds": rounds, "table": rows,
                       "loadavg": loads}, f, indent=2)


if __name__ == "__main__":
    main()
