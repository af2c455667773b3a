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
import concurrent.futures
import json
import os
import platform
import resource
import select
import shlex
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


# -- CPU of a process tree --------------------------------------------------------

def _proc_table():
    """{pid: (ppid, utime+stime seconds)} of every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[1] is ppid; utime, stime are fields 14, 15 of stat (11, 12 here)
        table[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return table


def tree_cpu(root_pid, table=None):
    """CPU seconds of root_pid and its live descendants."""
    table = table or _proc_table()
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        if pid in table:
            total += table[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def own_cpu():
    """This process, its live descendants (DataLoader workers), and its
    children that ended and were reaped (curl)."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return tree_cpu(os.getpid()) + ended.ru_utime + ended.ru_stime


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


class Boto3Reader(Reader):
    THREADS = 32

    def setup(self):
        import boto3
        from botocore.config import Config
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self.cfg["region"],
            aws_access_key_id=self.cfg["access_key"], aws_secret_access_key=self.cfg["secret_key"],
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=self.THREADS,
                          retries={"total_max_attempts": 3, "mode": "standard"}))
        self.pool = concurrent.futures.ThreadPoolExecutor(self.THREADS)

    def _get(self, key):
        return len(self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

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
        try:
            out = subprocess.run(["curl", "--help", "all"], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"no curl: {e}"
        if "--aws-sigv4" not in out or "--parallel-max" not in out:
            return "this curl lacks --aws-sigv4 or --parallel-max (needs 7.75+)"
        return None

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


def worker_main(config_path):
    """A worker: set up one reader, then answer "measure" lines on stdin with
    one JSON line each on stdout, until stdin closes."""
    with open(config_path) as f:
        cfg = json.load(f)
    os.environ.update(cfg["env"])   # before DALI or the CRT read them
    out = sys.stdout
    sys.stdout = sys.stderr        # libraries' prints must not break the protocol
    reader = READER_CLASSES[cfg["reader"]](cfg)

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reason = reader.skip_reason()
    if reason:
        reply({"skip": reason})
        return
    try:
        reader.setup()
    except Exception as e:
        reply({"skip": f"setup failed: {type(e).__name__}: {str(e)[:400]}"})
        return
    reply({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        try:
            cpu0, t0 = own_cpu(), time.perf_counter()
            objects, nbytes = reader.measure(req["objects"], req["offset"], req["seconds"])
            seconds, cpu = time.perf_counter() - t0, own_cpu() - cpu0
            reply({"objects": objects, "bytes": nbytes, "seconds": seconds, "cpu_s": cpu})
        except Exception as e:
            reply({"error": f"{type(e).__name__}: {str(e)[:600]}"})


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, reader, delay, cfg, workdir):
        self.reader, self.delay = reader, delay
        path = os.path.join(workdir, f"worker-{reader}-{delay}.json")
        with open(path, "w") as f:
            json.dump(dict(cfg, reader=reader), f)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(os.path.join(workdir, f"worker-{reader}-{delay}.log"), "w"),
                                     text=True)
        self.skip = None

    def read_reply(self, timeout_s):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            return {"error": f"no answer within {timeout_s:.0f} s (exit status {self.proc.poll()})"}
        return json.loads(line)

    def wait_ready(self, timeout_s):
        r = self.read_reply(timeout_s)
        if not r.get("ready"):
            self.skip = r.get("skip") or r.get("error")
        return self.skip is None

    def measure(self, objects, offset, seconds):
        self.proc.stdin.write(json.dumps({"objects": objects, "offset": offset,
                                          "seconds": seconds}) + "\n")
        self.proc.stdin.flush()
        return self.read_reply(seconds + 120)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)


# -- the run ----------------------------------------------------------------------

def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version()}


def versions():
    out = {}
    for mod in ("fastread", "boto3", "nvidia.dali", "s3torchconnector", "torch"):
        try:
            m = __import__(mod, fromlist=["_"])
            out[mod] = getattr(m, "__version__", "?")
        except ImportError:
            out[mod] = None
    try:
        out["curl"] = subprocess.run(["curl", "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.split("\n")[0].split()[1]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        out["curl"] = None
    return out


def ensure_dataset(args):
    """The tree of `fastread make-dataset` (made, or reused when complete)."""
    from fastread.cli import main as fastread_cli
    argv = ["make-dataset", args.dataset, "--classes", str(args.classes),
            "--per-class", str(args.per_class), "--seed", "0", "--quiet"]
    saved = sys.argv
    try:
        sys.argv = ["fastread"] + argv
        rc = fastread_cli()
    finally:
        sys.argv = saved
    if rc not in (None, 0):
        raise SystemExit(f"fastread {' '.join(argv)} failed with {rc}")


def ensure_uploaded(server, args):
    """The tree's samples (not its hidden files) under s3://bench/<prefix>,
    uploaded unless all are there with their sizes (a reused --workdir);
    other objects under the prefix are deleted (listing readers would take
    them for samples). Sorted keys."""
    local = {}
    for root, dirs, files in os.walk(args.dataset):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue   # make-dataset's bookkeeping, not a sample
            p = os.path.join(root, name)
            rel = os.path.relpath(p, args.dataset).replace(os.sep, "/")
            local[f"{args.prefix}/{rel}"] = os.path.getsize(p)
    server.make_bucket(BUCKET)
    client = server.client()
    remote = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=args.prefix + "/"):
        for o in page.get("Contents", []):
            remote[o["Key"]] = o["Size"]
    extra = sorted(set(remote) - set(local))
    for i in range(0, len(extra), 1000):
        client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in extra[i:i + 1000]]})
    if any(remote.get(k) != size for k, size in local.items()):
        t0 = time.perf_counter()
        server.upload_tree(args.dataset, BUCKET, args.prefix)
        print(f"# uploaded {len(local)} objects in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return sorted(local)


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
    ensure_dataset(args)
    from latency import delayed_endpoint, probe_netem
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
        keys = ensure_uploaded(server, args)
        nbytes = sum(os.path.getsize(os.path.join(args.dataset, k[len(args.prefix) + 1:]))
                     for k in keys)
        base = {"keys": keys, "prefix": args.prefix, "region": server.region,
                "access_key": server.access_key, "secret_key": server.secret_key}
        workers, stack = {}, []
        try:
            endpoints = {}
            for d in proxy_delays:
                cm = delayed_endpoint(server.endpoint, d, via="proxy0" if args.proxy_at_zero else "proxy")
                endpoints[d] = cm.__enter__()
                stack.append(cm)
            for d in proxy_delays:
                ep, how, _pid = endpoints[d]
                env = dict(server.env(), AWS_ENDPOINT_URL=ep, AWS_ENDPOINT_URL_S3=ep)
                for r in args.readers:
                    workers[(r, d)] = Worker(r, d, dict(base, endpoint=ep, env=env, how=how), tmp)
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
                        proxy_pid = endpoints[d][2]
                        table = _proc_table()
                        server_cpu0 = tree_cpu(server.proc.pid, table)
                        proxy_cpu0 = tree_cpu(proxy_pid, table) if proxy_pid else 0.0
                        m = w.measure(args.objects, offset, args.seconds)
                        table = _proc_table()
                        m["server_cpu_s"] = tree_cpu(server.proc.pid, table) - server_cpu0
                        m["proxy_cpu_s"] = (tree_cpu(proxy_pid, table) - proxy_cpu0) if proxy_pid else 0.0
                        m.update(reader=r, delay_ms=d, round=rnd, via=endpoints[d][1])
                        results.append(m)
                        if "error" in m:
                            print(f"# {r} @ {d} ms round {rnd}: {m['error']}", file=sys.stderr)
                        offset = (offset + args.objects) % len(keys)
        finally:
            for w in workers.values():
                w.close()
            for cm in reversed(stack):
                cm.__exit__(None, None, None)
    # netem: its own runs (a namespace each), after the interleaved one.
    results += run_netem_children(args, netem_delays)
    skips = {f"{w.reader}@{w.delay}": w.skip for w in workers.values() if w.skip}
    return {"machine": machine(), "load_average": os.getloadavg(), "versions": versions(),
            "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
            "dataset": {"dir": args.dataset, "objects": len(keys), "bytes": nbytes},
            "latency": {"netem": netem_ok, "netem_why": netem_why,
                        "used": ("netem in a private namespace (runs of their own) for delays > 0"
                                 if netem_delays else
                                 "proxy process (tests/s3_proxy.py) for delays > 0")},
            "options": {k: v for k, v in vars(args).items() if k not in ("json",)},
            "skipped": skips, "measurements": results}


def summarize(report):
    rows = {}
    for m in report["measurements"]:
        if "error" in m or not m.get("objects"):
            continue
        rows.setdefault((m["reader"], m["delay_ms"]), []).append(m)
    lines = [f"machine: {report['machine']['nproc']} CPUs, {report['machine']['cpu']}, "
             f"kernel {report['machine']['kernel']}; load average at the end "
             f"{', '.join(f'{x:.1f}' for x in report['load_average'])}",
             f"command: {report['command']}",
             f"dataset: {report['dataset']['objects']} objects, "
             f"{report['dataset']['bytes'] / 1e9:.3f} GB ({report['dataset']['dir']})",
             f"latency: netem {'works' if report['latency']['netem'] else 'unavailable: ' + report['latency']['netem_why']}; "
             f"{report['latency']['used']}",
             "",
             "| reader | delay ms | objects/s | GB/s | client CPU s/GB | server CPU s/GB | proxy CPU s/GB | rounds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (reader, delay) in sorted(rows, key=lambda k: (k[1], READERS.index(k[0]))):
        ms = rows[(reader, delay)]
        ops = statistics.median(m["objects"] / m["seconds"] for m in ms)
        gbs = statistics.median(m["bytes"] / m["seconds"] / 1e9 for m in ms)
        cpu = statistics.median(m["cpu_s"] / (m["bytes"] / 1e9) for m in ms)
        scpu = statistics.median(m["server_cpu_s"] / (m["bytes"] / 1e9) for m in ms)
        pcpu = statistics.median(m["proxy_cpu_s"] / (m["bytes"] / 1e9) for m in ms)
        lines.append(f"| {reader} | {delay} | {ops:,.0f} | {gbs:.3f} | {cpu:.2f} | {scpu:.2f} | "
                     f"{pcpu:.2f} | {len(ms)} |")
    for k, why in sorted(report["skipped"].items()):
        lines.append(f"skipped {k}: {why}")
    errors = [m for m in report["measurements"] if "error" in m]
    for m in errors[:10]:
        lines.append(f"error {m['reader']}@{m['delay_ms']} round {m['round']}: {m['error']}")
    lines.append("medians over rounds; GB = 1e9 bytes; client CPU = the reader's process tree")
    return "\n".join(lines)


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
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.delays = [int(float(d)) if float(d).is_integer() else float(d)
                   for d in args.delays.split(",") if d != ""]
    args.readers = [r for r in args.readers.split(",") if r]
    unknown = set(args.readers) - set(READERS)
    if unknown:
        ap.error(f"unknown readers {sorted(unknown)}; known: {READERS}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    report = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(summarize(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
