"""cassandra-dali-plugin's loop_read.py comparison, on a real Apache
Cassandra 5 node (tests/cassandra_server.py) holding the 20,000-JPEG tree
(`fastread make-dataset`, ingested once with `fastread cassandra ingest`):

  fastread-reader   fastread.Reader(source=CassandraSource(...)): the cql engine
  fastread-dali     fastread.dali.readers.cassandra in a DALI pipeline (CPU)
  fastread-dali-gpu the same with device="gpu": the operator's outputs in GPU
                    memory (a GPU machine)
  fastread-reader-gpu  fastread.Reader(..., device="gpu"): batches in GPU memory
  python-driver     cassandra-driver's execute_concurrent_with_args per batch
                    (a prepared SELECT, the function's defaults: 100 in flight):
                    what a Python user writes
  file-dali         DALI's fn.readers.file on the same files on local disk
                    (no network: run in the 0 ms rounds only)

at 0, 5 and 25 ms added round trip (a delay proxy as a process of its own in
front of the node, half each way; this kernel has no sch_netem: --proxy native,
bench/tools/delayproxy in Go, where built, else tests/cassandra_proxy.py),
interleaved: every round runs every mode once, rounds repeated. Reported:
img/s, GB/s, requests in flight (fastread-reader: the cql engine's peak,
summed over its workers; fastread-dali: the operator's bound, workers x
batch; python-driver: its concurrency), the
client's CPU seconds per GB (this process: the readers' threads and DALI's),
the server's CPU (its JVM, from /proc) per GB and in cores, the proxy's.

    python bench/cassandra/loop_read.py --json out.json
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import cassandra_server as cs  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


NATIVE_PROXY = os.path.join(ROOT, "build", "tools", "delayproxy")


def find_native_proxy(given):
    """The Go delay proxy (bench/tools/delayproxy: `cd bench/tools/delayproxy &&
    CGO_ENABLED=0 go build -o ../../../build/tools/delayproxy .`): --proxy-bin,
    else build/tools/delayproxy; None where neither is there."""
    for path in (given, NATIVE_PROXY):
        if path and os.access(path, os.X_OK):
            return path
    return None


class Proxy:
    """The delay proxy as a process of its own (its CPU is not the client's):
    `native`, the Go binary at that path, or None, tests/cassandra_proxy.py.
    Both take TARGET_PORT DELAY_MS (each way: half the round trip), print
    their port and run until stdin closes."""

    def __init__(self, port, rtt_ms, native=None):
        cmd = [native] if native else [sys.executable, os.path.join(ROOT, "tests",
                                                                    "cassandra_proxy.py")]
        self.kind = "native" if native else "python"
        self.proc = subprocess.Popen(cmd + [str(port), str(rtt_ms / 2)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise RuntimeError(f"delay proxy {cmd[0]} printed no port ({line!r})")
        self.port = int(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def ensure_tree(path):
    if not os.path.exists(os.path.join(path, ".fastread-dataset.json")):
        subprocess.run([sys.executable, "-m", "fastread.cli", "make-dataset", path,
                        "--classes", "20", "--per-class", "1000", "--seed", "0"], check=True)
    return path


def ingest(server, tree, keyspace):
    from fastread.cassandra_tools import connect, ingest as do_ingest, list_ids
    session = connect([server.host], port=server.port)
    t0 = time.monotonic()
    inserted, skipped = do_ingest(session, tree, keyspace, "train",
                                  journal=os.path.join(server.workdir, "train.ingest"))
    took = time.monotonic() - t0
    ids, labels = list_ids(session, keyspace, "train")
    return session, ids, labels, {"inserted": inserted, "skipped": skipped, "seconds": took}


# -- the modes: each returns (images, bytes) for `n` images -------------------------------

def run_fastread(table, ids, port, batch, n, prefetch, workers, device="cpu"):
    import fastread
    from fastread.cassandra import CassandraSource
    src = CassandraSource(table, ids, hosts="127.0.0.1", port=port)
    count = nbytes = 0
    gpu = {"device": "gpu", "device_id": 0} if device == "gpu" else {}
    t0 = time.monotonic()
    first = None
    with fastread.Reader(source=src, batch_size=batch, random_shuffle=True, seed=1,
                         prefetch=prefetch, workers=workers, **gpu) as r:
        # Epoch after epoch until n: a run long enough (--images) that the
        # connections' setup (a few round trips each) is not its rate.
        while count < n:
            for arrays, _ in r:
                count += len(arrays)
                nbytes += sum(a.nbytes for a in arrays)
                if first is None:
                    first = (time.monotonic() - t0, count)
                if count >= n:
                    break
        stats = r.stats()
    return count, nbytes, None, {"inflight": stats.get("cql_inflight_max"),
                                 "workers": r.workers, "prefetch": prefetch,
                                 "first": first, "end": time.monotonic() - t0}


def run_fastread_dali(table, ids, port, batch, n, prefetch, workers, native, device="cpu"):
    from nvidia.dali import pipeline_def
    from fastread.dali import readers
    uuids = [str(u) for u in ids]
    extra = {"workers": workers} if workers else {}
    if device == "gpu":
        extra["device"] = "gpu"

    @pipeline_def(batch_size=batch, num_threads=2, device_id=0 if device == "gpu" else None,
                  prefetch_queue_depth=2)
    def pipe():
        return readers.cassandra(table=table, source_uuids=uuids, cassandra_ips=["127.0.0.1"],
                                 cassandra_port=port, shuffle_every_epoch=True,
                                 prefetch_buffers=prefetch, native=native, **extra)
    p = pipe()
    is_native = "fastread__readers__Cassandra" in p.serialize().decode("latin-1") \
        if native is not False else False
    t0 = time.monotonic()
    count, nbytes, first = run_pipeline(p, n)
    # The bound: each worker has one batch in flight (the operator's default
    # is CassandraSource's: half the CPUs, 4 to 16).
    from fastread.cassandra import CassandraSource
    w = workers or CassandraSource.default_workers
    return count, nbytes, None, {"inflight": w * batch, "workers": w, "native": is_native,
                                 "prefetch": prefetch, "first": first,
                                 "end": time.monotonic() - t0}


def run_pipeline(p, n):
    """Runs a built-to-be DALI pipeline until `n` samples came out. Bytes
    are counted from the outputs' shapes (uint8): no copy of the samples,
    which would be the benchmark's cost, not the reader's, and works for
    GPU outputs alike."""
    t0 = time.monotonic()
    p.build()
    count = nbytes = 0
    first = None
    while count < n:
        data, _ = p.run()
        count += len(data)
        nbytes += sum(int(np.prod(s)) for s in data.shape())
        if first is None:
            first = (time.monotonic() - t0, count)
    del p
    return count, nbytes, first


def run_python_driver(table, ids, port, batch, n, concurrency):
    """execute_concurrent_with_args as a Python user calls it: its default
    concurrency (100) unless --py-concurrency says otherwise."""
    from cassandra.cluster import Cluster
    from cassandra.concurrent import execute_concurrent_with_args
    cluster = Cluster(["127.0.0.1"], port=port, protocol_version=4)
    session = cluster.connect()
    stmt = session.prepare(f"SELECT data, label FROM {table} WHERE id = ?")
    rng = np.random.default_rng(1)
    order = rng.permutation(len(ids))
    count = nbytes = 0
    t0 = time.monotonic()
    try:
        for start in range(0, len(order), batch):
            if count >= n:
                break
            params = [(ids[i],) for i in order[start:start + batch]]
            rows = (execute_concurrent_with_args(session, stmt, params) if concurrency is None
                    else execute_concurrent_with_args(session, stmt, params,
                                                      concurrency=concurrency))
            for _, res in rows:
                row = res.one()
                nbytes += len(row.data)
                count += 1
    finally:
        cluster.shutdown()
    return count, nbytes, time.monotonic() - t0, {"inflight": concurrency or 100}


def probe_rtt(table, ids, port, k=30):
    """The Python driver's single-request round trip (one SELECT at a time,
    k of them after a warm-up, median and min in ms): what a proxy adds."""
    from cassandra.cluster import Cluster
    cluster = Cluster(["127.0.0.1"], port=port, protocol_version=4)
    try:
        session = cluster.connect()
        stmt = session.prepare(f"SELECT data, label FROM {table} WHERE id = ?")
        took = []
        for i in range(k + 3):
            t0 = time.monotonic()
            session.execute(stmt, (ids[i],))
            took.append((time.monotonic() - t0) * 1e3)
        took = took[3:]
    finally:
        cluster.shutdown()
    return {"rtt_ms_median": float(np.median(took)), "rtt_ms_min": float(min(took))}


def run_file_dali(tree, batch, n):
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe():
        data, label = fn.readers.file(file_root=tree, random_shuffle=True, seed=1)
        return data, label
    return run_pipeline(pipe(), n)[:2]


def measure(fn, server, proxy):
    c0, s0, p0, t0 = self_cpu(), proc_cpu(server.pid), proxy and proc_cpu(proxy.proc.pid), \
        time.monotonic()
    out = fn()
    dt = time.monotonic() - t0
    count, nbytes = out[0], out[1]
    if len(out) > 2 and out[2] is not None:  # timed without its connection setup
        dt = out[2]
    extra = dict(out[3]) if len(out) > 3 else {}
    # The steady rate: from the first batch out to the last (the setup, a few
    # round trips per connection through the proxy, left out); "end" is the
    # mode's own clock at its last batch, "first" (seconds, rows) at its first.
    first, end = extra.pop("first", None), extra.pop("end", None)
    steady = None
    if first and end and end > first[0] and count > first[1]:
        steady = (count - first[1]) / (end - first[0])
    gb = nbytes / 1e9
    client, srv = self_cpu() - c0, proc_cpu(server.pid) - s0
    prx = (proc_cpu(proxy.proc.pid) - p0) if proxy else 0.0
    return {"images": count, "bytes": nbytes, "seconds": dt, "img_s": count / dt,
            "gb_s": gb / dt, "client_cpu_s_per_gb": client / gb,
            "server_cpu_s_per_gb": srv / gb, "server_cores": srv / dt,
            "proxy_cores": prx / dt, "img_s_steady": steady,
            "first_batch_s": first[0] if first else None, **extra}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="/var/tmp/fastread-bench/imagenet-20k")
    ap.add_argument("--workdir", default="/var/tmp/fastread-cassandra-bench")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--images", type=int, default=6144,
                    help="images per timed run of the fastread modes (epochs repeat: at "
                         "16-core rates 100000 makes a run of >= 3 s)")
    ap.add_argument("--driver-images", type=int, default=None,
                    help="images per python-driver run (default --images, at most one "
                         "epoch: ~1,000 img/s, 6144 is a 6 s run)")
    ap.add_argument("--prefetch", type=int, default=4,
                    help="batches read ahead (MODE@W/P overrides it per mode)")
    ap.add_argument("--proxy", choices=("auto", "native", "python", "both"), default="auto",
                    help="the delay proxy: native (bench/tools/delayproxy, Go), python "
                         "(tests/cassandra_proxy.py); auto: native where its binary is; both: "
                         "every round runs each mode behind each (modes named MODE~PROXY)")
    ap.add_argument("--proxy-bin", default=None,
                    help=f"the native proxy's binary (default {NATIVE_PROXY})")
    ap.add_argument("--py-concurrency", type=int, default=None,
                    help="execute_concurrent_with_args' concurrency (default: its own, 100)")
    ap.add_argument("--workers", type=int, default=None,
                    help="fastread's reader threads (default: theirs)")
    ap.add_argument("--delays", default="0,5,25", help="added round trips, ms")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heap-mb", type=int, default=1536)
    ap.add_argument("--modes", default="fastread-reader,fastread-dali,python-driver,file-dali",
                    help="comma-separated; MODE@W runs a fastread mode with W reader threads, "
                         "MODE@W/P with W threads and P batches read ahead")
    ap.add_argument("--zero-through-proxy", action="store_true",
                    help="run the 0 ms rounds through the delay proxy too (0 ms added)")
    ap.add_argument("--compare-proxies", action="store_true",
                    help="first, at each delay, the driver's single-request round trip "
                         "through each proxy (native and python): the same added latency?")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    modes = args.modes.split(",")
    delays = [float(d) for d in args.delays.split(",")]
    native_proxy = find_native_proxy(args.proxy_bin) if args.proxy != "python" else None
    if args.proxy in ("native", "both") and not native_proxy:
        sys.exit(f"--proxy {args.proxy}: no executable {args.proxy_bin or NATIVE_PROXY} "
                 "(build bench/tools/delayproxy)")
    # The proxies each round goes through (None: tests/cassandra_proxy.py).
    round_proxies = [native_proxy, None] if args.proxy == "both" else [native_proxy]
    print(f"delay proxy: {native_proxy or 'tests/cassandra_proxy.py'}", flush=True)
    tree = ensure_tree(args.tree)
    server = cs.Cassandra(args.workdir, heap_mb=args.heap_mb)
    server.start()
    print(f"cassandra up in {server.start_seconds:.1f} s (pid {server.pid})", flush=True)
    try:
        _, ids, _, ing = ingest(server, tree, "bench20k")
        print(f"ingest: {ing}", flush=True)
        table = "bench20k.data_train"
        # One untimed pass first: the node's JIT and caches warm, for every mode alike.
        run_fastread(table, ids, server.port, args.batch, min(args.images, len(ids)),
                     args.prefetch, args.workers)
        rtts = []
        kinds = ([native_proxy] if native_proxy else []) + [None] if args.compare_proxies \
            else [native_proxy]
        for delay in delays:
            for kind in kinds:
                px = Proxy(server.port, delay, kind)
                try:
                    r = {"delay_ms": delay, "proxy": px.kind,
                         **probe_rtt(table, ids, px.port)}
                finally:
                    px.close()
                rtts.append(r)
                print("rtt:", json.dumps(r), flush=True)
        r = {"delay_ms": None, "proxy": None, **probe_rtt(table, ids, server.port)}
        rtts.append(r)
        print("rtt (no proxy):", json.dumps(r), flush=True)
        results = []
        for rnd in range(args.rounds):
            for delay, proxy_bin in [(d, b) for d in delays for b in round_proxies]:
                # --zero-through-proxy: the 0 ms rounds through the proxy too, so
                # that "x own 0 ms" compares latency alone, not the proxy's cost.
                via = delay > 0 or args.zero_through_proxy
                if not via and proxy_bin is not round_proxies[0]:
                    continue  # no proxy: one set of 0 ms runs, whatever --proxy says
                proxy = Proxy(server.port, delay, proxy_bin) if via else None
                label = f"~{proxy.kind}" if proxy and len(round_proxies) > 1 else ""
                port = proxy.port if proxy else server.port
                try:
                    for mode in modes:
                        if mode == "file-dali" and delay > 0:
                            continue
                        # "MODE@W": a fastread mode with W reader threads.
                        base, _, wp = mode.partition("@")
                        w, _, pf = wp.partition("/")
                        workers = int(w) if w else args.workers
                        prefetch = int(pf) if pf else args.prefetch
                        fn = {
                            "fastread-reader": lambda: run_fastread(
                                table, ids, port, args.batch, args.images, prefetch,
                                workers),
                            "fastread-dali": lambda: run_fastread_dali(
                                table, ids, port, args.batch, args.images, prefetch,
                                workers, None),
                            "fastread-reader-gpu": lambda: run_fastread(
                                table, ids, port, args.batch, args.images, prefetch,
                                workers, "gpu"),
                            "fastread-dali-gpu": lambda: run_fastread_dali(
                                table, ids, port, args.batch, args.images, prefetch,
                                workers, None, "gpu"),
                            "fastread-dali-ext": lambda: run_fastread_dali(
                                table, ids, port, args.batch, args.images, prefetch,
                                workers, False),
                            "python-driver": lambda: run_python_driver(
                                table, ids, port, args.batch,
                                args.driver_images or args.images, args.py_concurrency),
                            "file-dali": lambda: run_file_dali(tree, args.batch, args.images),
                        }[base]
                        r = measure(fn, server, proxy)
                        r.update(mode=mode + label, delay_ms=delay, round=rnd,
                                 proxy=proxy.kind if proxy else None)
                        results.append(r)
                        print(json.dumps(r), flush=True)
                finally:
                    if proxy:
                        proxy.close()
        summary = {}
        for r in results:
            summary.setdefault((r["mode"], r["delay_ms"]), []).append(r)
        print("\nmode                         delay  img/s    GB/s  in flight  x driver  x own 0 ms  "
              "client CPU s/GB  server CPU s/GB  server cores  proxy cores  steady img/s  "
              "x own 0 ms steady  seconds")
        table_rows = []
        med_of = {}
        for key, rs in summary.items():
            med_of[key] = {k: float(np.median([x[k] for x in rs])) for k in
                           ("img_s", "gb_s", "client_cpu_s_per_gb", "server_cpu_s_per_gb",
                            "server_cores", "proxy_cores", "seconds")}
            st = [x["img_s_steady"] for x in rs if x.get("img_s_steady")]
            med_of[key]["img_s_steady"] = float(np.median(st)) if st else None
            med_of[key]["inflight"] = rs[-1].get("inflight")
        for (mode, delay), med in sorted(med_of.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            driver = med_of.get(("python-driver" + mode.partition("~")[1] +
                                 mode.partition("~")[2], delay))
            zero = med_of.get((mode, 0.0))
            med["x_driver"] = med["img_s"] / driver["img_s"] if driver else None
            med["x_own_0ms"] = med["img_s"] / zero["img_s"] if zero else None
            med["x_own_0ms_steady"] = med["img_s_steady"] / zero["img_s_steady"] \
                if zero and med["img_s_steady"] and zero["img_s_steady"] else None
            table_rows.append({"mode": mode, "delay_ms": delay, **med})
            fmt = (lambda v: f"{v:8.2f}" if v is not None else "       -")
            print(f"{mode:28s} {delay:5.0f}  {med['img_s']:7.0f}  {med['gb_s']:5.3f}  "
                  f"{str(med['inflight']):>9s}  {fmt(med['x_driver'])}  "
                  f"{fmt(med['x_own_0ms'])}    {med['client_cpu_s_per_gb']:13.2f}  "
                  f"{med['server_cpu_s_per_gb']:15.2f}  {med['server_cores']:12.2f}  "
                  f"{med['proxy_cores']:11.2f}  "
                  f"{med['img_s_steady'] or 0:12.0f}  {fmt(med['x_own_0ms_steady'])}"
                  f"           {med['seconds']:7.2f}")
        with open("/proc/loadavg") as f:
            print("loadavg:", f.read().strip())
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": f"{platform.node()} {os.cpu_count()} CPUs",
                           "cassandra": cs.VERSION, "args": vars(args), "ingest": ing,
                           "server_start_s": server.start_seconds, "runs": results,
                           "rtt": rtts, "proxy": native_proxy or "python",
                           "median": table_rows}, f, indent=1)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
