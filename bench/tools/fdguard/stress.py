"""Descriptor audit stress (issue: a child's stdout cut at 64 KiB + "\\n").

Parent: runs the child ROUNDS times under RLIMIT_NOFILE 64 with stdout and
stderr on pipes, as tests/test_limits.py did before it moved to a file, and
checks that the child's last stdout line arrived whole (86,404 bytes).

Child (--child): runs fastread operations that hit EMFILE (many files,
many shards, s3 against loopback, cql against loopback, the fd table
filled to a few free slots), and after each checks that fds 0-2 are the
same open files (st_dev, st_ino) with the same status flags (O_NONBLOCK
above all); a watcher thread samples them every 0.5 ms during the run.
Prints a JSON line of what it saw, then an 86,404-byte line.

Usage: python3 stress.py [--rounds N] [--engines psync,io_uring] [--quick]
"""
import argparse
import fcntl
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIG = 86404


def stdio_state():
    out = []
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino, fcntl.fcntl(fd, fcntl.F_GETFL),
                        fcntl.fcntl(fd, fcntl.F_GETFD)))
        except OSError as e:
            out.append(("closed", e.errno))
    return out


def make_tree(root):
    paths = []
    for c in range(4):
        d = os.path.join(root, f"c{c}")
        os.makedirs(d, exist_ok=True)
        for j in range(100):
            p = os.path.join(d, f"{j:03d}.jpg")
            with open(p, "wb") as f:
                f.write(bytes([j]) * (j + 1 + c))
            paths.append(p)
    return paths


def make_shards(root, n):
    os.makedirs(root, exist_ok=True)
    paths = []
    for s in range(n):
        p = os.path.join(root, f"shard-{s:05d}.bin")
        with open(p, "wb") as f:
            f.write(b"HEADER!!" + bytes([s % 251]) * 48)
        paths.append(p)
    return paths


def fill_fds(keep_free):
    """Opens /dev/null until only `keep_free` descriptors are left; returns them."""
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        pass
    for _ in range(min(keep_free, len(held))):
        os.close(held.pop())
    return held


def listener(kind):
    """A loopback server in a thread: 'close' accepts and closes at once,
    'hang' accepts and never answers, 'http500' answers 500 and closes."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    port = s.getsockname()[1]

    def run():
        conns = []
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            if kind == "close":
                c.close()
            elif kind == "http500":
                try:
                    c.recv(65536)
                    c.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                              b"Connection: close\r\n\r\n")
                except OSError:
                    pass
                c.close()
            else:
                conns.append(c)
                if len(conns) > 8:
                    conns.pop(0).close()
    threading.Thread(target=run, daemon=True).start()
    return s, port


def child(args):
    import numpy as np
    import fastread
    from fastread.formats import MultiFileRanges
    work = tempfile.mkdtemp(prefix="fdaudit-")
    paths = make_tree(os.path.join(work, "tree"))
    shards = make_shards(os.path.join(work, "shards"), 300)
    base = stdio_state()
    events = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            now = stdio_state()
            if now != base:
                events.append(("watch", time.monotonic(), repr(now)))
                return
            time.sleep(0.0005)
    threading.Thread(target=watch, daemon=True).start()
    engines = args.engines.split(",")
    results = {}

    def check(name, fn):
        err = None
        try:
            fn()
        except Exception as e:  # an error is fine here: fds 0-2 are what is checked
            err = f"{type(e).__name__}: {str(e)[:120]}"
        now = stdio_state()
        results[name] = {"stdio_same": now == base, "err": err}
        if now != base:
            events.append((name, time.monotonic(), repr(now)))

    file_ids = np.arange(len(shards), dtype=np.uint32).repeat(3)
    offsets = np.tile(np.array([8, 24, 40], np.uint64), len(shards))
    lengths = np.full(len(file_ids), 16, np.uint64)
    for rep in range(args.reps):
        for e in engines:
            check(f"{rep}:read_files:{e}", lambda: fastread.read_files(paths, engine=e))
            for w in (1, 2, 4):
                def reader(e=e, w=w):
                    with fastread.Reader(os.path.join(work, "tree"), batch_size=256, engine=e,
                                         workers=w) as r:
                        for _ in range(2):
                            for arrays, _ in r:
                                pass
                check(f"{rep}:reader:{e}:w{w}", reader)

            def ranges(e=e, shuffle=False):
                src = MultiFileRanges.from_columns(shards, file_ids, offsets, lengths)
                with fastread.Reader(source=src, batch_size=128, engine=e, workers=2,
                                     random_shuffle=shuffle, max_open_files=16) as r:
                    for _ in r:
                        pass
            check(f"{rep}:file_ranges:{e}", ranges)
            check(f"{rep}:file_ranges_shuffled:{e}", lambda: ranges(shuffle=True))
            for free in (1, 2, 3, 5, 8):
                held = fill_fds(free)
                try:
                    check(f"{rep}:read_files:{e}:free{free}",
                          lambda: fastread.read_files(paths[:50], engine=e))
                    check(f"{rep}:file_ranges:{e}:free{free}", ranges)

                    def small_reader(e=e):
                        with fastread.Reader(os.path.join(work, "tree"), batch_size=64,
                                             engine=e, workers=2) as r:
                            for _ in r:
                                pass
                    check(f"{rep}:reader:{e}:free{free}", small_reader)
                finally:
                    for fd in held:
                        os.close(fd)
        if args.net:
            for kind in ("close", "hang", "http500"):
                srv, port = listener(kind)
                try:
                    s3 = dict(endpoint_url=f"http://127.0.0.1:{port}", access_key_id="k",
                              secret_access_key="s", region="us-east-1", retries=1,
                              deadline_ms=600, connect_timeout_ms=300)
                    urls = [f"s3://b/k{i}" for i in range(80)]
                    check(f"{rep}:s3:{kind}", lambda: fastread.read_files(urls, s3=s3))
                    for free in (1, 3, 6):
                        held = fill_fds(free)
                        try:
                            check(f"{rep}:s3:{kind}:free{free}",
                                  lambda: fastread.read_files(urls[:20], s3=s3))
                        finally:
                            for fd in held:
                                os.close(fd)
                    from fastread.cassandra import CassandraSource
                    ids = np.frombuffer(os.urandom(16 * 8), np.uint8).reshape(8, 16)

                    def cql(conns=4):
                        src = CassandraSource("ks.t", ids, hosts="127.0.0.1", port=port,
                                              connections=conns, timeout_ms=300,
                                              deadline_ms=600, retries=1)
                        with fastread.Reader(source=src, batch_size=8) as r:
                            for _ in r:
                                pass
                    check(f"{rep}:cql:{kind}", cql)
                    check(f"{rep}:cql:{kind}:c60", lambda: cql(60))
                    for free in (1, 2, 4):
                        held = fill_fds(free)
                        try:
                            check(f"{rep}:cql:{kind}:free{free}", cql)
                        finally:
                            for fd in held:
                                os.close(fd)
                finally:
                    srv.close()
    stop.set()
    bad = {k: v for k, v in results.items() if not v["stdio_same"]}
    errs = sorted({v["err"].split(":")[0] for v in results.values() if v["err"]})
    summary = {"ops": len(results), "stdio_changed": bad, "events": events[:20],
               "error_kinds": errs, "base": repr(base),
               "errors": {k: v["err"] for k, v in results.items() if v["err"]}}
    with open(os.environ.get("FDAUDIT_SUMMARY", os.devnull), "w") as f:
        json.dump(summary, f)
    sys.stdout.write(json.dumps({"ops": len(results), "stdio_changed": len(bad)}) + "\n")
    print("x" * (BIG - 1))


def parent(args):
    bad = 0
    for r in range(args.rounds):
        summ = tempfile.NamedTemporaryFile(prefix="fdaudit-sum-", suffix=".json", delete=False)
        summ.close()

        def pre():
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
        env = dict(os.environ, FDAUDIT_SUMMARY=summ.name)
        cmd = [sys.executable, "-W", "always", os.path.abspath(__file__), "--child",
               "--engines", args.engines, "--reps", str(args.reps)] + (["--net"] if args.net else [])
        t0 = time.monotonic()
        p = subprocess.run(cmd, preexec_fn=pre, capture_output=True, text=True, timeout=600,
                           env=env)
        lines = p.stdout.splitlines()
        last = lines[-1] if lines else ""
        with open(summ.name) as f:
            try:
                s = json.load(f)
            except ValueError:
                s = {}
        os.unlink(summ.name)
        ok = p.returncode == 0 and len(last) == BIG - 1 and not s.get("stdio_changed")
        bad += not ok
        print(json.dumps({"round": r, "rc": p.returncode, "stdout_bytes": len(p.stdout),
                          "last_line": len(last), "ops": s.get("ops"),
                          "stdio_changed": s.get("stdio_changed"), "events": s.get("events"),
                          "error_kinds": s.get("error_kinds"), "s": round(time.monotonic() - t0, 1),
                          "stderr_tail": p.stderr[-300:] if not ok else ""}), flush=True)
        if args.verbose:
            print(json.dumps(s.get("errors"), indent=1))
    print(json.dumps({"rounds": args.rounds, "bad": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--nofile", type=int, default=64)
    ap.add_argument("--engines", default="psync,io_uring,auto")
    ap.add_argument("--net", action="store_true", help="also s3 and cql against loopback servers")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    sys.exit(child(a) if a.child else parent(a))
