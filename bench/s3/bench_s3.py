#!/usr/bin/env python3
"""S3 read benchmark (issue 30 item 8): the same objects read from a real S3
server (SeaweedFS, tests/s3_server.py) by

  boto3      get_object in a ThreadPoolExecutor(32)
  dali       fn.readers.file(file_root="s3://bucket/prefix"), CPU-only pipeline
  fastread-dali  fastread.dali.readers.file over the same root, same pipeline
  s3torch    s3torchconnector S3MapDataset in a DataLoader with workers
  fastread   fastread.read_files over lists of 64 URLs, engine="s3"
  reader     fastread.Reader(file_root="s3://...", engine="s3")
  curl       curl --parallel --parallel-max 64 --aws-sigv4: the server's ceiling

at each added delay (--delays, ms; netem in a private namespace where the
kernel has it, else the delay proxy, bench/s3/latency.py), in ONE run whose
rounds interleave the readers (and the delays; with netem each delay > 0 is a
run of its own inside its namespace). Per measurement: objects/s, GB/s and the
client's CPU seconds per GB (the reader's process and its descendants: the
DataLoader's workers, curl; not the server, not the proxy, which are other
processes and reported apart).

Each (reader, delay) lives in a worker process of its own, made once and
measured every round: DALI's AWS client reads AWS_ENDPOINT_URL once per
process, and pipelines and DataLoaders are measured in their steady state
(not their start). Their prefetch (DALI: 2 batches of 32, DataLoader: 2 per
worker) is ready at a measurement's start: a bias of at most that many
objects per measurement.

    python bench/s3/bench_s3.py                       # defaults, a few minutes on 2 cores
    python bench/s3/bench_s3.py --objects 500 --seconds 5 --delays 0,25 --json out.json

fastread rows say "skipped" until the installed fastread has the s3 engine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "tests")))
sys.path.insert(0, HERE)

READERS = ("boto3", "dali", "fastread-dali", "s3torch", "fastread", "reader", "curl")
BUCKET = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# The client's CPU, the worker processes, the report's machine and versions,
# the tree and its upload: shared with bench_shards.py.
# (tree_cpu: tests/test_bench_s3.py reaches it as bench_s3.tree_cpu.)
import _harness  # noqa: E402
from _harness import (Boto3Gets, Worker, close_all, curl_skip_reason, ensure_dataset,  # noqa: E402
                      ensure_uploaded, inflight_cell, measure_round, open_endpoints, parse_tail,
                      report_base,
                      rows_by_reader, summary_head, summary_problems, tree_cpu, versions)


# -- the readers (each in a worker process) ---------------------------------------

class Reader:
    """setup() once; measure(n, offset, seconds) -> (objects, bytes) read."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.keys = cfg["keys"]
        self.endpoint = cfg["endpoint"]

    def skip_reason(self):
        return None

    def setup(self):
        pass

    def keys_at(self, n, offset):
        k = self.keys
        return [k[(offset + i) % len(k)] for i in range(n)]


class Boto3Reader(Boto3Gets, Reader):
    """get_object of each key in a ThreadPoolExecutor(THREADS) (_harness.Boto3Gets)."""

    def measure(self, n, offset, seconds):
        deadline = time.perf_counter() + seconds
        objects = nbytes = 0
        keys = self.keys_at(n, offset)
        for i in range(0, n, 256):   # check the time bound every 256 objects
            sizes = list(self.pool.map(self._get, keys[i:i + 256]))
            objects, nbytes = objects + len(sizes), nbytes + sum(sizes)
            if time.perf_counter() > deadline:
                break
        return objects, nbytes


class DaliReader(Reader):
    BATCH = 32

    def skip_reason(self):
        try:
            import nvidia.dali  # noqa: F401
        except ImportError as e:
            return f"no DALI: {e}"
        return None

    def setup(self):
        from nvidia.dali import fn, pipeline_def

        @pipeline_def(batch_size=self.BATCH, num_threads=os.cpu_count(), device_id=None,
                      prefetch_queue_depth=2)
        def pipe():
            jpegs, labels = fn.readers.file(file_root=f"s3://{BUCKET}/{self.cfg['prefix']}",
                                            name="files")
            return jpegs, labels
        self.pipe = pipe()
        self.pipe.build()

    def measure(self, n, offset, seconds):
        deadline = time.perf_counter() + seconds
        objects = nbytes = 0
        while objects < n and time.perf_counter() < deadline:
            jpegs, _ = self.pipe.run()
            objects += len(jpegs)
            nbytes += sum(jpegs.at(i).nbytes for i in range(len(jpegs)))
        return objects, nbytes


class FastreadDaliReader(DaliReader):
    """fastread.dali.readers.file over the same s3:// root, in the same
    CPU-only pipeline at DALI's batch: the drop-in for DALI's own reader
    (the native operator where the plugin loads, else the external source)."""

    def skip_reason(self):
        return super().skip_reason() or _FastreadBase.skip_reason(self)

    def setup(self):
        from nvidia.dali import pipeline_def
        from fastread.dali import readers

        @pipeline_def(batch_size=self.BATCH, num_threads=os.cpu_count(), device_id=None,
                      prefetch_queue_depth=2)
        def pipe():
            jpegs, labels = readers.file(file_root=f"s3://{BUCKET}/{self.cfg['prefix']}",
                                         name="files")
            return jpegs, labels
        self.pipe = pipe()
        self.pipe.build()


def _s3torch_len(reader):
    return len(reader.read())


def _sum_lengths(batch):
    return len(batch), sum(batch)


class _Cycle:
    """Indices 0..size-1 over and over: one DataLoader iterator serves every
    round (its workers persist)."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        i = 0
        while True:
            yield i % self.size
            i += 1


class S3TorchReader(Reader):
    BATCH, WORKERS = 32, 2

    def skip_reason(self):
        try:
            import s3torchconnector  # noqa: F401
            import torch  # noqa: F401
        except ImportError as e:
            return f"no s3torchconnector/torch: {e} (pip install s3torchconnector)"
        return None

    def setup(self):
        import torch.utils.data
        from s3torchconnector import S3ClientConfig, S3MapDataset
        ds = S3MapDataset.from_prefix(
            f"s3://{BUCKET}/{self.cfg['prefix']}/", region=self.cfg["region"],
            endpoint=self.endpoint, transform=_s3torch_len,
            s3client_config=S3ClientConfig(force_path_style=True))
        self.loader = torch.utils.data.DataLoader(
            ds, batch_size=self.BATCH, sampler=_Cycle(len(ds)), num_workers=self.WORKERS,
            persistent_workers=True, collate_fn=_sum_lengths, prefetch_factor=2)
        self.it = iter(self.loader)

    def measure(self, n, offset, seconds):
        deadline = time.perf_counter() + seconds
        objects = nbytes = 0
        while objects < n and time.perf_counter() < deadline:
            count, size = next(self.it)
            objects, nbytes = objects + count, nbytes + size
        return objects, nbytes


class _FastreadBase(Reader):
    def skip_reason(self):
        try:
            import fastread
        except ImportError as e:
            return f"no fastread: {e}"
        # engines()["s3"] is an EngineStatus (never True: the engine reads no
        # local file), and its truth value raises: ask s3_version() instead.
        from fastread.engine import s3_version
        why = s3_version()[1]
        if why:
            return f"fastread {getattr(fastread, '__version__', '?')} has no s3 engine ({why})"
        return None

    def engine_args(self):
        return f"endpoint={self.endpoint},region={self.cfg['region']}"


class FastreadReader(_FastreadBase):
    LIST = 64

    def setup(self):
        import fastread
        self.fastread = fastread

    def measure(self, n, offset, seconds):
        deadline = time.perf_counter() + seconds
        objects = nbytes = 0
        urls = [f"s3://{BUCKET}/{k}" for k in self.keys_at(n, offset)]
        for i in range(0, n, self.LIST):
            arrays = self.fastread.read_files(urls[i:i + self.LIST], engine="s3",
                                              engine_args=self.engine_args())
            objects += len(arrays)
            nbytes += sum(a.nbytes for a in arrays)
            if time.perf_counter() > deadline:
                break
        return objects, nbytes


class FastreadReaderReader(_FastreadBase):
    BATCH = 64

    def setup(self):
        import fastread
        self.reader = fastread.Reader(file_root=f"s3://{BUCKET}/{self.cfg['prefix']}",
                                      batch_size=self.BATCH, engine="s3",
                                      engine_args=self.engine_args())
        self.it = iter(self.reader)

    def _next(self):
        try:
            return next(self.it)
        except StopIteration:   # one epoch per iter(): start the next
            self.it = iter(self.reader)
            return next(self.it)

    def measure(self, n, offset, seconds):
        deadline = time.perf_counter() + seconds
        objects = nbytes = 0
        while objects < n and time.perf_counter() < deadline:
            arrays, _labels = self._next()
            objects += len(arrays)
            nbytes += sum(a.nbytes for a in arrays)
        return objects, nbytes


class CurlReader(Reader):
    PARALLEL = 64

    def skip_reason(self):
        return curl_skip_reason()

    def measure(self, n, offset, seconds):
        with tempfile.NamedTemporaryFile("w", suffix=".curl", delete=False) as f:
            for k in self.keys_at(n, offset):
                f.write(f'url = "{self.endpoint}/{BUCKET}/{k}"\noutput = "/dev/null"\n')
            config = f.name
        try:
            cmd = ["curl", "--silent", "--show-error", "--parallel", "--parallel-max",
                   str(self.PARALLEL), "--aws-sigv4", f"aws:amz:{self.cfg['region']}:s3",
                   "--user", f"{self.cfg['access_key']}:{self.cfg['secret_key']}",
                   "--write-out", "%{http_code} %{size_download}\\n", "--config", config]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        finally:
            os.unlink(config)
        lines = [line.split() for line in r.stdout.splitlines() if line.strip()]
        bad = [code for code, _ in lines if code != "200"]
        if r.returncode != 0 or bad:
            raise RuntimeError(f"curl status {r.returncode}, {len(bad)} non-200 answers "
                               f"({sorted(set(bad))[:5]}): {r.stderr[-500:]}")
        return len(lines), sum(int(size) for _, size in lines)


READER_CLASSES = {"boto3": Boto3Reader, "dali": DaliReader, "fastread-dali": FastreadDaliReader,
                  "s3torch": S3TorchReader,
                  "fastread": FastreadReader, "reader": FastreadReaderReader, "curl": CurlReader}


# -- the run ----------------------------------------------------------------------

def run_netem_children(args, delays):
    """Each delay > 0 as a child run of this script inside a namespace whose
    loopback has netem (server, client and all at that delay; its own server
    data under --workdir/netem-D). Their measurements, relabelled."""
    from latency import netem_namespace, run_in_namespace
    out = []
    for d in delays:
        with tempfile.NamedTemporaryFile(suffix=".json") as f, netem_namespace(d) as ns:
            argv = [sys.executable, os.path.abspath(__file__), "--dataset", args.dataset,
                    "--workdir", os.path.join(args.workdir, f"netem-{d}"), "--prefix", args.prefix,
                    "--objects", str(args.objects), "--seconds", str(args.seconds),
                    "--rounds", str(args.rounds), "--delays", "0", "--latency", "proxy",
                    "--readers", ",".join(args.readers), "--json", f.name]
            rc = run_in_namespace(ns, argv, timeout_s=args.rounds * len(args.readers) *
                                  (args.seconds + 120) + 600)
            if rc != 0:
                raise RuntimeError(f"the netem run at {d} ms failed with status {rc}")
            child = json.load(open(f.name))
        for m in child["measurements"]:
            m.update(delay_ms=d, via="netem")
            out.append(m)
    return out


def run(args):
    ensure_dataset(args.dataset, args.classes, args.per_class)
    from latency import probe_netem
    from s3_server import SeaweedFS
    netem_ok, netem_why = probe_netem() if args.latency != "proxy" else (False, "not asked")
    if args.latency == "netem" and not netem_ok:
        raise SystemExit(f"--latency netem: {netem_why}")
    netem_delays = [d for d in args.delays if d > 0] if netem_ok else []
    proxy_delays = [d for d in args.delays if d not in netem_delays]
    results = []
    os.makedirs(args.workdir, exist_ok=True)
    with SeaweedFS(os.path.join(args.workdir, "weed")) as server, \
            tempfile.TemporaryDirectory(prefix="s3bench-") as tmp:
        keys = ensure_uploaded(server, BUCKET, args.dataset, args.prefix)
        nbytes = sum(os.path.getsize(os.path.join(args.dataset, k[len(args.prefix) + 1:]))
                     for k in keys)
        base = {"keys": keys, "prefix": args.prefix, "region": server.region,
                "access_key": server.access_key, "secret_key": server.secret_key}
        workers, stack = {}, []
        try:
            endpoints = open_endpoints(stack, server.endpoint, proxy_delays,
                                       via="proxy0" if args.proxy_at_zero else "proxy")
            for d in proxy_delays:
                ep, how, _pid = endpoints[d]
                env = dict(server.env(), AWS_ENDPOINT_URL=ep, AWS_ENDPOINT_URL_S3=ep)
                for r in args.readers:
                    workers[(r, d)] = Worker(__file__, r, d, dict(base, endpoint=ep, env=env, how=how),
                                             tmp)
            for w in workers.values():
                if not w.wait_ready(args.setup_timeout):
                    print(f"# {w.reader} @ {w.delay} ms: skipped: {w.skip}", file=sys.stderr)
            offset = 0
            for rnd in range(args.rounds):
                for d in proxy_delays:
                    for r in args.readers:
                        w = workers[(r, d)]
                        if w.skip:
                            continue
                        m = measure_round(w, server, endpoints[d], args.seconds + 120,
                                          n=args.objects, offset=offset, seconds=args.seconds)
                        m.update(reader=r, delay_ms=d, round=rnd, via=endpoints[d][1])
                        results.append(m)
                        if "error" in m:
                            print(f"# {r} @ {d} ms round {rnd}: {m['error']}", file=sys.stderr)
                        offset = (offset + args.objects) % len(keys)
        finally:
            close_all(workers, stack)
    # netem: its own runs (a namespace each), after the interleaved one.
    results += run_netem_children(args, netem_delays)
    skips = {f"{w.reader}@{w.delay}": w.skip for w in workers.values() if w.skip}
    mods = ("fastread", "boto3", "nvidia.dali", "s3torchconnector", "torch")
    return dict(report_base(args, versions(mods)),
                dataset={"dir": args.dataset, "objects": len(keys), "bytes": nbytes},
                latency={"netem": netem_ok, "netem_why": netem_why,
                         "used": ("netem in a private namespace (runs of their own) for delays > 0"
                                  if netem_delays else
                                  "proxy process (tests/s3_proxy.py) for delays > 0")},
                skipped=skips, measurements=results)


def summarize(report):
    rows = rows_by_reader(report)
    lines = summary_head(report) + [
             f"dataset: {report['dataset']['objects']} objects, "
             f"{report['dataset']['bytes'] / 1e9:.3f} GB ({report['dataset']['dir']})",
             f"latency: netem {'works' if report['latency']['netem'] else 'unavailable: ' + report['latency']['netem_why']}; "
             f"{report['latency']['used']}",
             "",
             "| reader | delay ms | objects/s | GB/s | client CPU s/GB | server CPU s/GB | "
             "proxy CPU s/GB | requests in flight | rounds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (reader, delay) in sorted(rows, key=lambda k: (k[1], READERS.index(k[0]))):
        ms = rows[(reader, delay)]
        ops = statistics.median(m["objects"] / m["seconds"] for m in ms)
        gbs = statistics.median(m["bytes"] / m["seconds"] / 1e9 for m in ms)
        cpu = statistics.median(m["cpu_s"] / (m["bytes"] / 1e9) for m in ms)
        scpu = statistics.median(m["server_cpu_s"] / (m["bytes"] / 1e9) for m in ms)
        pcpu = statistics.median(m["proxy_cpu_s"] / (m["bytes"] / 1e9) for m in ms)
        lines.append(f"| {reader} | {delay} | {ops:,.0f} | {gbs:.3f} | {cpu:.2f} | {scpu:.2f} | "
                     f"{pcpu:.2f} | {inflight_cell(ms)} | {len(ms)} |")
    lines += summary_problems(report)
    lines.append("medians over rounds; GB = 1e9 bytes; client CPU = the reader's process tree; "
                 "requests in flight: ~ the mean the delay proxy counted, <= what the reader "
                 "says of itself, ? where neither is known")
    return "\n".join(lines)


def _delay(text):
    """A --delays item: ms, whole where it is."""
    return int(float(text)) if float(text).is_integer() else float(text)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="/var/tmp/fastread-s3bench/tree",
                    help="tree of `fastread make-dataset` (made if missing)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--workdir", default="/var/tmp/fastread-s3bench",
                    help="the server's data (reused: no second upload)")
    ap.add_argument("--prefix", default="train")
    ap.add_argument("--objects", type=int, default=1000, help="objects per measurement")
    ap.add_argument("--seconds", type=float, default=8.0, help="time bound of one measurement")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--delays", default="0,5,25", help="added latency, ms, comma-separated")
    ap.add_argument("--readers", default=",".join(READERS),
                    help=f"comma-separated subset of {','.join(READERS)}")
    ap.add_argument("--latency", choices=("auto", "proxy", "netem"), default="auto",
                    help="how delays are added: netem in a private namespace (auto: when "
                         "this kernel has it) or the delay proxy")
    ap.add_argument("--proxy-at-zero", action="store_true",
                    help="put the proxy in front at 0 ms too (its own overhead)")
    ap.add_argument("--setup-timeout", type=float, default=180.0)
    return parse_tail(ap, argv, READERS, delay=_delay)


def main(argv=None):
    return _harness.main(argv, parse_args, run, summarize, READER_CLASSES)


if __name__ == "__main__":
    sys.exit(main())
