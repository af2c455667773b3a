"""What the interleaved S3 benchmarks share (bench_s3.py: 92 KB objects;
bench_shards.py: 64 MB shards): the client's CPU (a process tree's, from
/proc), one worker process per (reader, delay) driven over a pipe, the
machine and versions for the report, the `fastread make-dataset` tree, and
a local directory uploaded once to the SeaweedFS of --workdir.

Worker protocol: the parent starts `SCRIPT --worker CONFIG.json`; the
worker sets up its reader and says {"ready": true} (or {"skip": why}) on
stdout, then answers each request line (a JSON object of keyword
arguments for the reader's measure()) with one JSON line: count, bytes,
seconds, the tree's CPU seconds, and what else the reader reported.
"""

import argparse
import json
import os
import platform
import resource
import select
import shlex
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- CPU of a process tree --------------------------------------------------------

def proc_table():
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
    table = table or proc_table()
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
    children that ended and were reaped (curl, workers of past epochs)."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return tree_cpu(os.getpid()) + ended.ru_utime + ended.ru_stime


# -- worker processes -------------------------------------------------------------

def worker_main(config_path, reader_classes):
    """A worker: set up one reader (reader_classes[cfg["reader"]](cfg)),
    then answer request lines on stdin with one JSON line each on stdout,
    until stdin closes. measure(**request) returns (count, bytes) or
    (count, bytes, {more to report})."""
    with open(config_path) as f:
        cfg = json.load(f)
    os.environ.update(cfg["env"])   # before DALI, the CRT or boto3 read them
    out = sys.stdout
    sys.stdout = sys.stderr        # libraries' prints must not break the protocol
    reader = reader_classes[cfg["reader"]](cfg)

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
            got = reader.measure(**req)
            seconds, cpu = time.perf_counter() - t0, own_cpu() - cpu0
            m = {"objects": got[0], "bytes": got[1], "seconds": seconds, "cpu_s": cpu}
            if len(got) > 2:
                m.update(got[2])
            reply(m)
        except Exception as e:
            text = str(e)   # the head says what, the tail (a worker's traceback) where
            text = text if len(text) <= 1500 else f"{text[:500]} ... {text[-1000:]}"
            reply({"error": f"{type(e).__name__}: {text}"})


class Worker:
    """The parent's handle on one worker process (`script --worker CFG`)."""

    def __init__(self, script, reader, delay, cfg, workdir):
        self.reader, self.delay = reader, delay
        path = os.path.join(workdir, f"worker-{reader}-{delay}.json")
        with open(path, "w") as f:
            json.dump(dict(cfg, reader=reader), f)
        self.log = os.path.join(workdir, f"worker-{reader}-{delay}.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(script), "--worker", path],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True)
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

    def measure(self, timeout_s, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read_reply(timeout_s)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)


# -- a reader both scripts have ---------------------------------------------------

class Boto3Gets:
    """A reader's boto3 side (mixed in before the script's Reader, which
    sets cfg and endpoint): setup() makes a client of the server (path
    style, THREADS pooled connections, 3 attempts) and a
    ThreadPoolExecutor(THREADS); _get(key) reads one object of BUCKET
    whole and returns its size."""
    THREADS = 32
    BUCKET = "bench"

    def setup(self):
        import concurrent.futures

        import boto3
        from botocore.config import Config
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self.cfg["region"],
            aws_access_key_id=self.cfg["access_key"], aws_secret_access_key=self.cfg["secret_key"],
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=self.THREADS,
                          retries={"total_max_attempts": 3, "mode": "standard"}))
        self.pool = concurrent.futures.ThreadPoolExecutor(self.THREADS)

    def _get(self, key):
        return len(self.client.get_object(Bucket=self.BUCKET, Key=key)["Body"].read())


# -- the report -------------------------------------------------------------------

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


def versions(modules):
    """{module: __version__ or None} for each importable module, and curl's."""
    out = {}
    for mod in modules:
        try:
            m = __import__(mod, fromlist=["_"])
            out[mod] = getattr(m, "__version__", "?")
        except Exception:   # ImportError, or a package that fails importing
            out[mod] = None
    try:
        out["curl"] = subprocess.run(["curl", "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.split("\n")[0].split()[1]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        out["curl"] = None
    return out


def curl_skip_reason():
    """None where this curl has --aws-sigv4 and --parallel-max, else why not."""
    try:
        out = subprocess.run(["curl", "--help", "all"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no curl: {e}"
    if "--aws-sigv4" not in out or "--parallel-max" not in out:
        return "this curl lacks --aws-sigv4 or --parallel-max (needs 7.75+)"
    return None


# -- the data ---------------------------------------------------------------------

def ensure_dataset(dataset, classes, per_class):
    """The JPEG tree of `fastread make-dataset` (made, or reused when complete)."""
    from fastread.cli import main as fastread_cli
    argv = ["make-dataset", dataset, "--classes", str(classes),
            "--per-class", str(per_class), "--seed", "0", "--quiet"]
    saved = sys.argv
    try:
        sys.argv = ["fastread"] + argv
        rc = fastread_cli()
    finally:
        sys.argv = saved
    if rc not in (None, 0):
        raise SystemExit(f"fastread {' '.join(argv)} failed with {rc}")


def tree_files(local_dir):
    """{relative path: size} of the files under local_dir, hidden files and
    directories left out (make-dataset's bookkeeping, not samples)."""
    local = {}
    for root, dirs, files in os.walk(local_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            p = os.path.join(root, name)
            local[os.path.relpath(p, local_dir).replace(os.sep, "/")] = os.path.getsize(p)
    return local


def ensure_uploaded(server, bucket, local_dir, prefix):
    """The files of local_dir (tree_files) under s3://bucket/prefix, uploaded
    unless all are there with their sizes (a reused server directory);
    other objects under the prefix are deleted (listing readers would take
    them for samples). Sorted keys."""
    local = {f"{prefix}/{rel}": size for rel, size in tree_files(local_dir).items()}
    server.make_bucket(bucket)
    client = server.client()
    remote = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            remote[o["Key"]] = o["Size"]
    extra = sorted(set(remote) - set(local))
    for i in range(0, len(extra), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in extra[i:i + 1000]]})
    if any(remote.get(k) != size for k, size in local.items()):
        t0 = time.perf_counter()
        server.upload_tree(local_dir, bucket, prefix)
        print(f"# uploaded {len(local)} objects under s3://{bucket}/{prefix} in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return sorted(local)


# -- what both scripts' run(), summarize() and main() do alike -------------------

def parse_tail(ap, argv, known, delay):
    """The options both scripts end with (--json, --worker), then argv
    parsed: --delays (comma-separated, each through delay()) and --readers
    (comma-separated; ap.error on a name not in known) as lists, unless
    this is a worker (--worker: the rest is not used)."""
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.delays = [delay(d) for d in args.delays.split(",") if d != ""]
    args.readers = [r for r in args.readers.split(",") if r]
    unknown = set(args.readers) - set(known)
    if unknown:
        ap.error(f"unknown readers {sorted(unknown)}; known: {known}")
    return args


def open_endpoints(stack, upstream, delays, **how):
    """{delay: (endpoint, how, proxy pid or None)} from latency.delayed_endpoint
    (keyword arguments `how`), each entered and pushed on stack (the caller
    exits them in reverse)."""
    from latency import delayed_endpoint
    endpoints = {}
    for d in delays:
        cm = delayed_endpoint(upstream, d, **how)
        endpoints[d] = cm.__enter__()
        stack.append(cm)
    return endpoints


def measure_round(worker, server, endpoint, timeout_s, **request):
    """One measurement of worker, with the server's and the delay proxy's
    CPU seconds over it (server_cpu_s, proxy_cpu_s); endpoint is an
    open_endpoints value."""
    from latency import proxy_inflight
    proxy_pid = endpoint[2]
    table = proc_table()
    server_cpu0 = tree_cpu(server.proc.pid, table)
    proxy_cpu0 = tree_cpu(proxy_pid, table) if proxy_pid else 0.0
    flight0 = proxy_inflight(proxy_pid) if proxy_pid else None
    m = worker.measure(timeout_s, **request)
    flight1 = proxy_inflight(proxy_pid) if proxy_pid else None
    table = proc_table()
    m["server_cpu_s"] = tree_cpu(server.proc.pid, table) - server_cpu0
    m["proxy_cpu_s"] = (tree_cpu(proxy_pid, table) - proxy_cpu0) if proxy_pid else 0.0
    if flight0 and flight1 and flight1["at"] > flight0["at"]:
        # Requests in flight through the proxy, on average over the
        # measurement (its file is rewritten every 50 ms).
        m["proxy_inflight_mean"] = ((flight1["area_s"] - flight0["area_s"])
                                    / (flight1["at"] - flight0["at"]))
    return m


def inflight_cell(ms):
    """A table cell for the requests a reader kept in flight over its
    measurements ms: measured at the delay proxy (the median of their means,
    "~N"), else what the reader says of itself (its most, "<=N"), else "?"."""
    means = sorted(m["proxy_inflight_mean"] for m in ms if "proxy_inflight_mean" in m)
    if means:
        return f"~{means[len(means) // 2]:.0f}"
    most = max((m.get("inflight_max") or 0) for m in ms)
    return f"<={most}" if most else "?"


def close_all(workers, stack):
    """Each worker closed, then each open_endpoints context exited (last first)."""
    for w in workers.values():
        w.close()
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def report_base(args, vers):
    """The report's machine, load average, versions, command line and options."""
    return {"machine": machine(), "load_average": os.getloadavg(), "versions": vers,
            "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
            "options": {k: v for k, v in vars(args).items() if k not in ("json",)}}


def rows_by_reader(report):
    """{(reader, delay_ms): [measurements]} of the measurements without error
    that read something."""
    rows = {}
    for m in report["measurements"]:
        if "error" in m or not m.get("objects"):
            continue
        rows.setdefault((m["reader"], m["delay_ms"]), []).append(m)
    return rows


def summary_head(report):
    """The summary's machine and command lines."""
    mc = report["machine"]
    return [f"machine: {mc['nproc']} CPUs, {mc['cpu']}, kernel {mc['kernel']}; load average "
            f"at the end {', '.join(f'{x:.1f}' for x in report['load_average'])}",
            f"command: {report['command']}"]


def summary_problems(report):
    """The summary's lines of skipped readers and of (the first ten) errors."""
    lines = [f"skipped {k}: {why}" for k, why in sorted(report["skipped"].items())]
    errors = [m for m in report["measurements"] if "error" in m]
    for m in errors[:10]:
        lines.append(f"error {m['reader']}@{m['delay_ms']} round {m['round']}: {m['error']}")
    return lines


def main(argv, parse_args, run, summarize, reader_classes):
    """A benchmark script's main: a worker (--worker) or the run, its report
    written to --json and summarized on stdout."""
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, reader_classes)
    report = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(summarize(report))
    return 0
