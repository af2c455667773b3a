"""Listing 10^5 objects (issue 37's listing target) on two real S3 servers,
SeaweedFS and MinIO, in one run: the sequential ListObjectsV2 walk the
target is measured against vs fastread.scan()'s parallel prefixes vs a kept
listing, at 0 and 25 ms round trips (bench/s3/latency.py: the test proxy
as a process in front of each server).

--objects one-byte objects under scan/cNNN/ (--classes folders), uploaded
once per server (kept under --workdir for the next run). Each round, for
every server and delay, once each, interleaved:
  boto3        boto3's list_objects_v2 paginator, no delimiter: the walk a
               user writes
  sequential   fastread.s3.list_objects(workers=1): the engine's own walk
  scan-W       fastread.scan() with W listings in flight (--inflight)
  kept         scan(listing_cache=) with the listing kept by an untimed
               scan just before (a second run, or another rank of the node)
Beside each: the server's CPU seconds for that listing (its process tree,
from /proc/PID/stat) and this client's.

    flock /work/bench.lock nice -n 5 python bench/s3/listing.py \
        --json docs/results/s3list-20261203c/listing.json
"""
import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "tests")))
sys.path.insert(0, HERE)

BUCKET = "scale"


def start_server(kind, workdir):
    if kind == "minio":
        from s3_minio import MinIO
        return MinIO(os.path.join(workdir, "minio"))
    from s3_server import SeaweedFS
    return SeaweedFS(os.path.join(workdir, "weed"))


def boto3_walk(c, url):
    """Keys of a plain paginated ListObjectsV2 walk with boto3 client `c`
    (made before the clock starts: a client costs ~0.5 s of CPU to make)."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    n = 0
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                            Prefix=prefix + "/"):
        n += len(page.get("Contents", ()))
    return n


def own_cpu():
    """This process alone: the servers and proxies are its children, and
    _harness.own_cpu counts descendants (a first run of this script
    reported their CPU as the client's)."""
    t = os.times()
    return t.user + t.system


def one_listing(how, boto3_client, opts, url, cache):
    """(seconds, objects) of one listing `how`."""
    import fastread
    from fastread import s3 as fs3
    t0 = time.perf_counter()
    if how == "boto3":
        n = boto3_walk(boto3_client, url)
    elif how == "sequential":
        n = len(fs3.list_objects(url, opts))
    elif how == "kept":
        n = len(fastread.scan(url, s3=opts, listing_cache=cache)[0])
    else:
        saved = fs3.LIST_WORKERS
        fs3.LIST_WORKERS = int(how.split("-")[1])
        try:
            n = len(fastread.scan(url, s3=opts)[0])
        finally:
            fs3.LIST_WORKERS = saved
    return time.perf_counter() - t0, n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/var/tmp/fastread-s3list3")
    ap.add_argument("--servers", default="seaweedfs,minio")
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--delays", default="0,25")
    ap.add_argument("--inflight", default="32,64,128", help="scan()'s listings in flight")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-boto3", action="store_true",
                    help="leave out boto3's paginator (where boto3 is not installed: the GPU machine)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import fastread
    from _harness import tree_cpu
    from latency import delayed_endpoint
    from scale import ensure_uploaded
    from fastread import s3 as fs3
    delays = [int(d) for d in args.delays.split(",")]
    hows = ([] if args.no_boto3 else ["boto3"]) + (["sequential"] + [f"scan-{w}" for w in args.inflight.split(",")]
            + ["kept"])
    fs3.NATIVE_LISTING = True
    report = {"machine": f"{platform.node()} {platform.platform()}, {os.cpu_count()} CPUs",
              "load_at_start": os.getloadavg(), "args": vars(args), "listing": []}
    per = args.objects // args.classes
    jobs = [(f"scan/c{c:03d}/{i:06d}.jpg", b"x") for c in range(args.classes)
            for i in range(per)]
    url = f"s3://{BUCKET}/scan"
    with contextlib.ExitStack() as stack:
        servers, eps = {}, {}
        for kind in args.servers.split(","):
            srv = stack.enter_context(start_server(kind, args.workdir))
            base = fastread.S3Options(endpoint_url=srv.endpoint, region=srv.region,
                                      access_key_id=srv.access_key,
                                      secret_access_key=srv.secret_key)
            ensure_uploaded(srv, base, "scan", jobs)
            servers[kind] = (srv, base)
            for d in delays:
                ep, via, _ = stack.enter_context(delayed_endpoint(srv.endpoint, d))
                eps[kind, d] = (ep, via, None if args.no_boto3 else srv.client(endpoint=ep))
        for rnd in range(args.rounds):
            for d in delays:
                for kind, (srv, base) in servers.items():
                    ep, via, boto3_client = eps[kind, d]
                    opts = fastread.S3Options.coerce(base, endpoint_url=ep)
                    cache = os.path.join(args.workdir, f"listing-cache-{kind}")
                    for how in hows:
                        if how == "kept":   # listed and kept, untimed
                            shutil.rmtree(cache, ignore_errors=True)
                            fastread.scan(url, s3=opts, listing_cache=cache)
                        la = os.getloadavg()[0]
                        s0, c0 = tree_cpu(srv.proc.pid), own_cpu()
                        secs, n = one_listing(how, boto3_client, opts, url, cache)
                        row = {"server": kind, "delay_ms": d, "via": via, "round": rnd,
                               "listing": how, "objects": n, "seconds": round(secs, 3),
                               "server_cpu_s": round(tree_cpu(srv.proc.pid) - s0, 2),
                               "client_cpu_s": round(own_cpu() - c0, 2), "load1": round(la, 2)}
                        report["listing"].append(row)
                        print(json.dumps(row), flush=True)
    report["load_at_end"] = os.getloadavg()
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
