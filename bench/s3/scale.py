"""S3 at scale (issue 37, item 2): what it costs to start reading a WebDataset
set in S3, and to list a bucket of 10^5 objects, at 0 and 25 ms round trips.

(a) Shards: --shards tar shards of --shard-mb MB (members of --sample-kb KB
    random bytes plus a 1-byte .cls each; DALI's wds2idx index file beside
    each shard), uploaded once to a SeaweedFS under --workdir. For each
    delay, three ways to build the index, then the first shuffled batch:
      full-stream  every shard streamed whole (webdataset._index_objects,
                   today's S3 path before this change)
      headers      formats/_s3_tar.py: a ranged GET per tar header, a jump
                   over each member (index files ignored)
      index-file   only SHARD.tar.idx fetched
    Reported: seconds to build the index (and the CPU seconds the server
    and this client spent on it), seconds to the first batch of a
    Reader (global shuffle, batch --batch), bytes fetched for the index (the
    s3 context's s3_bytes counter, or the s3 client's bytes_received), and
    that as a share of the set.
(b) Listing: --objects objects of 1 byte under scan/cNNN/ (--classes
    folders), uploaded once in parallel. For each delay: one sequential
    ListObjectsV2 walk (list_objects(workers=1)) vs list_objects(workers=W)
    (all levels) vs fastread.scan() (two levels, W listings at once), each
    with pages parsed in Python and in C (libexpat, many listings on one
    multi handle: csrc/engines/s3/s3_list.c), in interleaved --rounds.

Delays come from bench/s3/latency.py (tests/s3_proxy.py as a process,
holding every response the delay). One run, every figure side by side.

    nice -n 5 python bench/s3/scale.py --json docs/results/s3scale/scale.json
"""
import argparse
import functools
import io
import json
import os
import platform
import shutil
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "tests")))
sys.path.insert(0, HERE)

BUCKET = "scale"


def write_wds2idx(path):
    """PATH.idx as DALI's wds2idx writes it (v1.2: "v1.2 SAMPLES", then a
    line per sample of EXT OFFSET SIZE NAME per component), from the tar's
    headers. Written here rather than by running wds2idx (two `tar`
    processes a shard: minutes for 1,000 shards on 2 shared cores);
    tests/test_s3_scale.py reads files made by wds2idx itself."""
    from fastread.formats.webdataset import index_tar, split_name
    with open(path, "rb") as f:
        members = index_tar(f.read(), path)
    samples, last = [], None
    for m in members:
        key, ext = split_name(m.name)
        if key != last:
            samples.append([])
            last = key
        samples[-1].append(f"{ext} {m.offset} {m.size} {m.name}")
    with open(path + ".idx", "w") as f:
        f.write(f"v1.2 {len(samples)}\n")
        for s in samples:
            f.write(" ".join(s) + "\n")


def make_shards(root, shards, shard_mb, sample_kb):
    """The local shards (made once per parameters) with their wds2idx files."""
    import numpy as np
    stamp = os.path.join(root, "DONE")
    params = f"{shards} {shard_mb} {sample_kb}\n"
    if os.path.exists(stamp) and open(stamp).read() == params:
        return sorted(os.path.join(root, p) for p in os.listdir(root) if p.endswith(".tar"))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rng = np.random.default_rng(0)
    per = max(1, int(shard_mb * 1024 / sample_kb))
    payload = rng.bytes(sample_kb * 1024 + 4096)
    paths = []
    for s in range(shards):
        path = os.path.join(root, f"shard-{s:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(per):
                for ext, data in (("jpg", payload[i % 4096:i % 4096 + sample_kb * 1024]),
                                  ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:05d}_{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        write_wds2idx(path)
        paths.append(path)
    with open(stamp, "w") as f:
        f.write(params)
    return paths


def put_many(args_s3, jobs, workers=32):
    """PUTs (bucket, key, bytes-or-path) with `workers` threads, each its own
    client."""
    import concurrent.futures
    from fastread import _s3
    local = threading.local()
    clients = []

    def one(job):
        bucket, key, body = job
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = _s3.Client(args_s3)
            clients.append(c)
        if isinstance(body, str):
            with open(body, "rb") as f:
                body = f.read()
        status, _, err = c.request("PUT", bucket, key, "", body)
        if status != 200:
            raise OSError(f"PUT s3://{bucket}/{key}: {err or status}")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, jobs))
    for c in clients:
        c.close()


def ensure_uploaded(server, opts, prefix, jobs):
    """jobs [(key, body)] under s3://BUCKET/prefix/ unless as many are there."""
    from fastread import s3 as fs3
    server.make_bucket(BUCKET)
    have = fs3.list_objects(f"s3://{BUCKET}/{prefix}/", opts, workers=32)
    if len(have) == len(jobs):
        return
    t0 = time.perf_counter()
    put_many(opts.engine_args(), [(BUCKET, k, b) for k, b in jobs])
    print(f"# uploaded {len(jobs)} objects under {prefix}/ in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)


def first_batch(urls, opts, how, batch):
    """(seconds to build the WebDataset, seconds to its first shuffled batch
    after that, the batch's sample bytes), with the index built `how`."""
    import fastread
    from fastread.formats import webdataset as wds
    real = wds._s3_tar.index_objects
    if how == "full-stream":
        wds._s3_tar.index_objects = lambda u, s3, *a, **k: wds._index_objects(u, s3)
    elif how == "headers":
        wds._s3_tar.index_objects = functools.partial(real, index_files=False)
    try:
        t0 = time.perf_counter()
        source = wds.WebDataset(urls, ["jpg", "cls"], s3=opts)
        t1 = time.perf_counter()
        r = fastread.Reader(source=source, batch_size=batch, random_shuffle=True, seed=1)
        try:
            arrays, _ = next(iter(r))
            t2 = time.perf_counter()
            nbytes = sum(len(a) for a in arrays)
        finally:
            r.close()
    finally:
        wds._s3_tar.index_objects = real
    return t1 - t0, t2 - t0, nbytes


def index_bytes(urls, opts, how, workers):
    """(seconds, bytes fetched, requests) of building the index alone."""
    from fastread.engine import EngineOptions, cached_context
    from fastread.formats import _s3_tar
    from fastread.formats import webdataset as wds
    t0 = time.perf_counter()
    if how == "full-stream":
        ctx = cached_context("s3", EngineOptions(s3=opts))
        before = ctx.stats()
        wds._index_objects(urls, opts)
        after = ctx.stats()
        return (time.perf_counter() - t0, after["s3_bytes"] - before["s3_bytes"],
                after.get("s3_requests", 0) - before.get("s3_requests", 0))
    walked = _s3_tar.walk_shards(urls, wds.index_tar, opts, workers=workers,
                                 index_files=how == "index-file")
    assert all(w.source == ("index file" if how == "index-file" else "headers") for w in walked)
    return (time.perf_counter() - t0, sum(w.bytes_fetched for w in walked),
            sum(w.requests for w in walked))


def tree_cpu_s(pid):
    """CPU seconds of process `pid` and its children (the SeaweedFS server)."""
    from _harness import tree_cpu
    return tree_cpu(pid)


def own_cpu_s():
    t = os.times()
    return t.user + t.system


#: The listings compared, each with pages parsed in Python (the walk before
#: the C listing) and in C (csrc/engines/s3/s3_list.c), in one run.
#: "kept": scan(listing_cache=) with the listing kept by an untimed scan
#: just before (what a second run, or another rank of the node, pays).
LISTINGS = [(how, parser) for how in ("sequential", "parallel", "scan")
            for parser in ("python", "c")] + [("kept", "c")]


def listing(url, opts, how, workers, parser="python", cache=None):
    import fastread
    from fastread import s3 as fs3
    fs3.NATIVE_LISTING = parser == "c"
    try:
        t0 = time.perf_counter()
        if how == "sequential":
            n = len(fs3.list_objects(url, opts))
        elif how == "parallel":
            n = len(fs3.list_objects(url, opts, workers=workers))
        elif how == "kept":
            n = len(fastread.scan(url, s3=opts, listing_cache=cache)[0])
        else:
            n = len(fastread.scan(url, s3=opts)[0])
        return time.perf_counter() - t0, n
    finally:
        fs3.NATIVE_LISTING = True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/var/tmp/fastread-s3scale")
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--shard-mb", type=float, default=1.0)
    ap.add_argument("--sample-kb", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--delays", default="0,25")
    ap.add_argument("--workers", type=int, default=64, help="shards walked at once")
    ap.add_argument("--list-workers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the listings")
    ap.add_argument("--skip", default="", help="comma-separated: shards, listing")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    delays = [int(d) for d in args.delays.split(",")]
    skip = set(filter(None, args.skip.split(",")))

    import fastread
    from fastread.formats import _s3_tar
    from latency import delayed_endpoint
    from s3_server import SeaweedFS
    os.makedirs(args.workdir, exist_ok=True)
    report = {"machine": f"{platform.node()} {platform.platform()}, {os.cpu_count()} CPUs",
              "load_at_start": os.getloadavg(),
              "fastread": fastread.__version__ if hasattr(fastread, "__version__") else "",
              "args": vars(args), "shards": [], "listing": []}
    paths = [] if "shards" in skip else make_shards(
        os.path.join(args.workdir, "shards"), args.shards, args.shard_mb, args.sample_kb)
    set_bytes = sum(os.path.getsize(p) for p in paths)
    report["set_bytes"] = set_bytes
    with SeaweedFS(os.path.join(args.workdir, "weed")) as server:
        base = fastread.S3Options(endpoint_url=server.endpoint, region=server.region,
                                  access_key_id=server.access_key,
                                  secret_access_key=server.secret_key)
        if paths:
            jobs = []
            for p in paths:
                name = os.path.basename(p)
                jobs += [(f"wds/{name}", p), (f"wds/{name}.idx", p + ".idx")]
            ensure_uploaded(server, base, "wds", jobs)
        urls = [f"s3://{BUCKET}/wds/{os.path.basename(p)}" for p in paths]
        if "listing" not in skip:
            per = args.objects // args.classes
            ensure_uploaded(server, base, "scan",
                            [(f"scan/c{c:03d}/{i:06d}.jpg", b"x") for c in range(args.classes)
                             for i in range(per)])
        for d in delays:
            with delayed_endpoint(server.endpoint, d) as (ep, how_reached, _pid):
                opts = fastread.S3Options.coerce(base, endpoint_url=ep)
                for how in ([] if not urls else ["full-stream", "headers", "index-file"]):
                    s0, c0 = tree_cpu_s(server.proc.pid), own_cpu_s()
                    secs, nbytes, reqs = index_bytes(urls, opts, how, args.workers)
                    server_cpu, client_cpu = tree_cpu_s(server.proc.pid) - s0, own_cpu_s() - c0
                    build, to_batch, batch_bytes = first_batch(urls, opts, how, args.batch)
                    row = {"delay_ms": d, "via": how_reached, "index": how,
                           "index_s": round(secs, 3), "index_bytes": nbytes,
                           "index_share": nbytes / set_bytes, "requests": reqs,
                           "index_server_cpu_s": round(server_cpu, 2),
                           "index_client_cpu_s": round(client_cpu, 2),
                           "webdataset_s": round(build, 3), "first_batch_s": round(to_batch, 3),
                           "first_batch_bytes": batch_bytes}
                    report["shards"].append(row)
                    print(json.dumps(row), flush=True)
                if "listing" not in skip:
                    url = f"s3://{BUCKET}/scan"
                    # Interleaved rounds: every way once a round, so that
                    # the shared machine's load falls on all of them alike.
                    for rnd in range(args.rounds):
                        for how, parser in LISTINGS:
                            la = os.getloadavg()[0]
                            cache = os.path.join(args.workdir, "listing-cache")
                            if how == "kept":   # listed and kept, untimed
                                shutil.rmtree(cache, ignore_errors=True)
                                fastread.scan(url, s3=opts, listing_cache=cache)
                            s0, c0 = tree_cpu_s(server.proc.pid), own_cpu_s()
                            secs, n = listing(url, opts, how, args.list_workers, parser,
                                              cache)
                            row = {"delay_ms": d, "via": how_reached, "round": rnd,
                                   "listing": how, "parser": parser, "objects": n,
                                   "seconds": round(secs, 3),
                                   "server_cpu_s": round(tree_cpu_s(server.proc.pid) - s0, 2),
                                   "client_cpu_s": round(own_cpu_s() - c0, 2),
                                   "load1": round(la, 2)}
                            report["listing"].append(row)
                            print(json.dumps(row), flush=True)
    report["window"] = _s3_tar.HEADER_WINDOW
    report["load_at_end"] = os.getloadavg()
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
