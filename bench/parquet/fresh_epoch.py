"""The first epoch of a fresh process, interleaved (issue 40, the Parquet
ranges index cache): every round runs each mode once, each in a new Python
process that builds it and times one epoch; the order turns by one each
round. fastread's Parquet Reader modes run twice: ``-idxwarm`` with the
ranges index cached on disk (a directory filled by an untimed process
before the rounds) and ``-idxcold`` with a new empty directory (the chunks
read to index them, the entries written).

    python bench/parquet/fresh_epoch.py DATA [--rounds 5] [--batch 64] [--gap 3]
        [--modes parquet-reader,parquet-reader-fileorder,parquet-files-ceiling,...]

DATA: as for interleaved.py (write_image_parquet's directory).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def child(data, name, batch):
    from fastread.bench import environment
    from fastread.bench.families import parquet as fam
    from fastread.bench.runners import Config
    import resource
    env = environment.probe_environment()
    cfg = Config(env=env, dataset=fam.detect(data), batch_size=batch)
    (mode,) = [m for m in fam.modes(env) if m.name == name]
    why = mode.check(mode, cfg)
    if why:
        print(json.dumps({"skip": why}))
        return
    t0 = time.perf_counter()
    runner = mode.build(mode, cfg)
    built = time.perf_counter() - t0
    n = cfg.dataset.samples
    try:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        samples = 0
        while samples < n:
            got, _nbytes = runner.next()
            samples += got
        dt = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        st = runner.reader.stats() if hasattr(runner, "reader") else {}
    finally:
        runner.close()
    print(json.dumps({"rate": samples / dt, "build_s": built,
                      "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
                      "from_index": st.get("row_groups_index_cached"),
                      "chunks_read": st.get("row_group_chunks_read")}))


def run(data, name, batch, index_dir):
    env = dict(os.environ)
    if index_dir is not None:
        env["FASTREAD_INDEX_CACHE_DIR"] = index_dir
    out = subprocess.run([sys.executable, __file__, data, "--child", name, "--batch", str(batch)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gap", type=float, default=3.0)
    ap.add_argument("--modes", default="parquet-reader,parquet-reader-fileorder,"
                                       "parquet-files-ceiling,parquet-pyarrow-dali")
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        return child(args.data, args.child, args.batch)
    warm_dir = tempfile.mkdtemp(prefix="fr-pqidx-fresh-warm-")
    plan = []
    for name in args.modes.split(","):
        if name.startswith("parquet-reader"):
            plan += [(name + "-idxwarm", name, "warm"), (name + "-idxcold", name, "cold")]
        else:
            plan.append((name, name, None))
    for label, name, kind in plan:          # fills the warm directory; untimed
        if kind == "warm":
            run(args.data, name, args.batch, warm_dir)
    res = {label: [] for label, _, _ in plan}
    try:
        for rnd in range(args.rounds):
            turn = rnd % len(plan)
            for label, name, kind in plan[turn:] + plan[:turn]:
                time.sleep(args.gap)
                cold = tempfile.mkdtemp(prefix="fr-pqidx-fresh-cold-") if kind == "cold" else None
                try:
                    got = run(args.data, name, args.batch,
                              warm_dir if kind == "warm" else cold if kind == "cold"
                              else tempfile.gettempdir() + "/fr-pqidx-fresh-none")
                finally:
                    if cold:
                        shutil.rmtree(cold, ignore_errors=True)
                if "skip" in got:
                    print(f"skip {label}: {got['skip']}")
                    continue
                res[label].append(got)
                print(f"round {rnd}: {label:34s} {got['rate']:9.0f} img/s  build "
                      f"{got['build_s']:.2f} s  cpu {got['user']:.2f} user {got['sys']:.2f} sys"
                      f"  from index {got['from_index']}  chunks read {got['chunks_read']}",
                      flush=True)
    finally:
        shutil.rmtree(warm_dir, ignore_errors=True)
    ceil = res.get("parquet-files-ceiling") or []
    print(f"\n{args.data}; batch {args.batch}; {args.rounds} rounds, a fresh process each; "
          "medians (and of the files ceiling, median of the per-round ratios):")
    for label, runs in res.items():
        if not runs:
            continue
        line = f"  {label:34s} {statistics.median(r['rate'] for r in runs):9.0f} img/s"
        if len(ceil) == len(runs):
            line += (f"  {statistics.median(r['rate'] / c['rate'] for r, c in zip(runs, ceil)):5.0%}"
                     " of files")
        print(line)


if __name__ == "__main__":
    main()
