"""Parquet in S3 (issue 40): rows/s of fastread's Parquet source against
pyarrow over ``pyarrow.fs.S3FileSystem``, same objects, same server
(SeaweedFS on loopback, started here through tests/s3_server.py), at each
added latency (tests/s3_proxy.py in a process of its own, holding every
response D ms: bench/s3/latency.py), alternating rounds. Bytes of the image
column are delivered (not decoded); both read every row once per epoch, in
file order.

    python bench/s3/s3_parquet.py DATA [--files 2] [--delays 0,25] [--rounds 3]
        [--batch 64] [--proxy s3|tcp] [--proxy-bin PATH]

--proxy tcp puts bench/tools/delayproxy (Go; `CGO_ENABLED=0 go build -o
build/tools/delayproxy ./bench/tools/delayproxy`) in front instead of
tests/s3_proxy.py: it delays every chunk by half the round trip each way
rather than holding each response, and forwards at loopback rates where
the Python proxy, one process, may be what bounds a 16-core run.

DATA: a Hub-style directory (``data/*.parquet``, e.g. written by
fastread.formats.parquet.write_image_parquet); the first ``--files`` files
are uploaded.
"""
import argparse
import contextlib
import os
import subprocess
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
sys.path.insert(0, HERE)

import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import fastread  # noqa: E402
import s3_server  # noqa: E402
from fastread.formats import Parquet  # noqa: E402
from latency import ProxyProcess  # noqa: E402


@contextlib.contextmanager
def tcp_proxy(binary, endpoint, delay_ms):
    """The Go delay proxy in front of ``endpoint`` (http://127.0.0.1:PORT):
    ``delay_ms`` added to each round trip (half each way). Yields an object
    with ``endpoint``, like ProxyProcess."""
    port = endpoint.rstrip("/").rsplit(":", 1)[1]
    proc = subprocess.Popen([binary, port, str(delay_ms / 2)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"delay proxy {binary} printed no port ({line!r})")
        yield argparse.Namespace(endpoint=f"http://127.0.0.1:{line}")
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fastread_epoch(url, opts, batch, shuffle, workers=None):
    src = Parquet(url, s3=opts)
    t = time.perf_counter()
    n = nbytes = 0
    kw = {} if workers is None else {"workers": workers}
    with fastread.Reader(source=src, batch_size=batch, random_shuffle=shuffle,
                         s3=opts, **kw) as r:
        for arrays, _ in r:
            n += len(arrays)
            nbytes += sum(a.size for a in arrays)
    return n, nbytes, time.perf_counter() - t


def pyarrow_epoch(keys, fs, batch):
    t = time.perf_counter()
    n = nbytes = 0
    for key in keys:
        with fs.open_input_file(key) as f:
            for b in pq.ParquetFile(f).iter_batches(batch_size=batch, columns=["image", "label"]):
                col = b.column("image").field("bytes")
                n += len(col)
                nbytes += col.buffers()[2].size if col.buffers()[2] is not None else 0
    return n, nbytes, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--delays", default="0,25")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=None,
                    help="the Reader's workers (default: its own; Parquet loads on max(workers, "
                         "min(8, CPUs)) threads)")
    ap.add_argument("--part-size", type=int, default=None, help="S3Options.part_size")
    ap.add_argument("--inflight", type=int, default=None, help="S3Options.inflight")
    ap.add_argument("--proxy", choices=("s3", "tcp"), default="s3",
                    help="s3: tests/s3_proxy.py holding each response; tcp: the Go delay proxy")
    ap.add_argument("--proxy-bin", default=os.path.join(HERE, "..", "..", "build", "tools",
                                                         "delayproxy"))
    args = ap.parse_args()
    if args.proxy == "tcp" and not os.access(args.proxy_bin, os.X_OK):
        sys.exit(f"--proxy tcp: no executable {args.proxy_bin} (CGO_ENABLED=0 go build -o "
                 "build/tools/delayproxy ./bench/tools/delayproxy)")
    local = sorted(os.path.join(args.data, "data", n)
                   for n in os.listdir(os.path.join(args.data, "data"))
                   if n.endswith(".parquet"))[:args.files]
    delays = [int(d) for d in args.delays.split(",")]
    with tempfile.TemporaryDirectory(prefix="fastread-s3pq-") as tmp, \
            s3_server.SeaweedFS(os.path.join(tmp, "weed")) as srv:
        bucket = srv.make_bucket("pq-bench")
        for p in local:
            with open(p, "rb") as f:
                srv.put(bucket, "hf/data/" + os.path.basename(p), f.read())
        mb = sum(os.path.getsize(p) for p in local) / 1e6
        rows = len(Parquet(local))
        print(f"{len(local)} files, {mb:.0f} MB, {rows} rows, batch {args.batch}; SeaweedFS "
              f"on loopback; delay proxy: {args.proxy}; workers {args.workers}, part_size "
              f"{args.part_size}, inflight {args.inflight}; machine: {os.cpu_count()} CPUs")
        results = {}
        for d in delays:
            with (tcp_proxy(args.proxy_bin, srv.endpoint, d) if args.proxy == "tcp"
                  else ProxyProcess(srv.endpoint, d)) as proxy:
                opts = fastread.S3Options(endpoint_url=proxy.endpoint, region=srv.region,
                                          access_key_id=srv.access_key,
                                          secret_access_key=srv.secret_key,
                                          part_size=args.part_size, inflight=args.inflight)
                host = proxy.endpoint.split("://", 1)[1].rstrip("/")
                fs = pafs.S3FileSystem(access_key=srv.access_key, secret_key=srv.secret_key,
                                       endpoint_override=host, scheme="http",
                                       region=srv.region)
                keys = [f"{bucket}/hf/data/{os.path.basename(p)}" for p in local]
                url = f"s3://{bucket}/hf"
                for rnd in range(args.rounds):
                    for name, run in (
                            ("fastread",
                             lambda: fastread_epoch(url, opts, args.batch, False, args.workers)),
                            ("fastread-shuffled",
                             lambda: fastread_epoch(url, opts, args.batch, True, args.workers)),
                            ("pyarrow-S3FileSystem", lambda: pyarrow_epoch(keys, fs, args.batch))):
                        n, nbytes, dt = run()
                        assert n == rows, (name, n, rows)
                        results.setdefault((name, d), []).append(n / dt)
                        print(f"delay {d:3d} ms round {rnd}: {name:22s} {n / dt:8.0f} rows/s "
                              f"{nbytes / dt / 1e6:8.1f} MB/s", flush=True)
        print("\nmedian rows/s")
        for d in delays:
            base = statistics.median(results[("pyarrow-S3FileSystem", d)])
            for name in ("fastread", "fastread-shuffled", "pyarrow-S3FileSystem"):
                v = statistics.median(results[(name, d)])
                print(f"  delay {d:3d} ms  {name:22s} {v:8.0f}  {v / base:5.2f}x pyarrow")


if __name__ == "__main__":
    main()
