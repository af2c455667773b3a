#!/usr/bin/env python3
"""`fastread bench s3://...` (the s3 family) against a SeaweedFS started
here: the objects of a local tree (or the first --objects of it, spread
evenly over its classes) are uploaded under s3://bench/train, then
`fastread bench s3://bench/train` runs once per added delay (0 ms: the
server itself; > 0: the delay proxy, bench/s3/latency.py), each with the
server's endpoint and credentials in the AWS_* environment, and its JSON
written to --json-dir/s3-<delay>ms.json.

    python bench/s3/run_family.py --tree /tmp/fastread-imagenet-20k --objects 5000 \\
        --delays 0,25 --json-dir out -- --device cpu --batchsize 64 --repeat 3

Arguments after `--` go to `fastread bench` (default: --device cpu), and
--delayed-args too at delays > 0 (e.g. "--batches 20": a reader bound by
latency need not read whole epochs). The
upload uses boto3 where it imports, else fastread's own signed client
(tests/s3_server.py). Bounded: each `fastread bench` run is stopped after
--run-timeout seconds, and no delay starts after --budget seconds.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "tests")))
sys.path.insert(0, HERE)

BUCKET, PREFIX = "bench", "train"


def subset(tree, objects):
    """[(path, key)]: every sample of `tree` (hidden files and directories
    left out, as fn.readers.file does), or the first objects // classes of
    each class (sorted), so a subset keeps every class."""
    classes = sorted(d for d in os.listdir(tree)
                     if not d.startswith(".") and os.path.isdir(os.path.join(tree, d)))
    if not classes:
        raise SystemExit(f"--tree {tree}: no class directories")
    per = None if not objects else max(1, objects // len(classes))
    jobs = []
    for c in classes:
        names = sorted(n for n in os.listdir(os.path.join(tree, c)) if not n.startswith("."))
        for n in names[:per]:
            jobs.append((os.path.join(tree, c, n), f"{PREFIX}/{c}/{n}"))
    return jobs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="a tree of `fastread make-dataset`")
    ap.add_argument("--objects", type=int, default=0,
                    help="upload only about this many objects (0: all)")
    ap.add_argument("--delays", default="0", help="added latency, ms, comma-separated")
    ap.add_argument("--delayed-args", default="",
                    help="more `fastread bench` arguments for delays > 0 (one string)")
    ap.add_argument("--json-dir", required=True)
    ap.add_argument("--workdir", default=None, help="the server's data (default: a temp dir)")
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument("--budget", type=float, default=420.0,
                    help="no delay's run starts after this many seconds")
    args = ap.parse_args(argv)
    delays = [int(d) for d in args.delays.split(",") if d.strip()]
    extra = extra or ["--device", "cpu"]
    os.makedirs(args.json_dir, exist_ok=True)
    t_start = time.monotonic()

    from latency import delayed_endpoint
    from s3_server import SeaweedFS, have_boto3

    jobs = subset(args.tree, args.objects)
    summary = {"tree": args.tree, "objects": len(jobs), "delays": {}, "upload": None}
    with SeaweedFS(args.workdir) as server:
        t0 = time.perf_counter()
        done = server.upload_files(jobs, BUCKET, workers=16)
        summary["upload"] = {"objects": len(done), "bytes": sum(done.values()),
                             "seconds": round(time.perf_counter() - t0, 2),
                             "client": "boto3" if have_boto3() else "fastread"}
        print(f"# uploaded {len(done)} objects ({sum(done.values()) / 1e6:.1f} MB) in "
              f"{summary['upload']['seconds']} s with {summary['upload']['client']}",
              flush=True)
        for d in delays:
            if time.monotonic() - t_start > args.budget:
                print(f"# {d} ms: left out, past --budget {args.budget:.0f} s", flush=True)
                summary["delays"][d] = "left out: past --budget"
                continue
            with delayed_endpoint(server.endpoint, d) as (endpoint, how, _pid):
                env = {**os.environ, **server.env(), "AWS_ENDPOINT_URL": endpoint,
                       "AWS_ENDPOINT_URL_S3": endpoint}
                out = os.path.join(args.json_dir, f"s3-{d}ms.json")
                more = extra + (shlex.split(args.delayed_args) if d > 0 else [])
                cmd = [sys.executable, "-m", "fastread.cli", "bench", f"s3://{BUCKET}/{PREFIX}",
                       "--no-progress", "--json", out] + more
                print(f"== {d} ms ({how}): fastread bench s3://{BUCKET}/{PREFIX} "
                      f"{' '.join(more)}", flush=True)
                try:
                    r = subprocess.run(cmd, env=env, timeout=args.run_timeout)
                    summary["delays"][d] = {"status": r.returncode, "via": how, "json": out}
                except subprocess.TimeoutExpired:
                    print(f"# {d} ms: stopped after --run-timeout {args.run_timeout:.0f} s",
                          flush=True)
                    summary["delays"][d] = {"status": "timeout", "via": how}
    with open(os.path.join(args.json_dir, "s3-summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    bad = [d for d, v in summary["delays"].items()
           if isinstance(v, dict) and v["status"] not in (0,)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
