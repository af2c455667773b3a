"""Does anything in a parent that has used fastread (contexts cached per
thread, a live Reader, an s3 context, a Reader reading on another thread
meanwhile) make a subprocess.run(preexec_fn=...) child's stdout pipe
non-blocking? The child reports its stdout's O_NONBLOCK at start (before
importing anything), and prints 86,404 bytes; the parent checks both.

Usage: python3 parent_fork.py ROUNDS [--busy]"""
import fcntl
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading

import fastread

CHILD = r"""
import fcntl, os, sys
nb = fcntl.fcntl(1, fcntl.F_GETFL) & os.O_NONBLOCK
sys.stderr.write(f"nonblock-at-start={int(bool(nb))}\n")
import fastread, json
root = sys.argv[1]
with fastread.Reader(root, batch_size=256, engine=sys.argv[2], workers=2) as r:
    got = [[a.tobytes().hex() for arrays, _ in r for a in arrays] for _ in range(2)]
nb = fcntl.fcntl(1, fcntl.F_GETFL) & os.O_NONBLOCK
sys.stderr.write(f"nonblock-at-end={int(bool(nb))}\n")
if os.environ.get("FDAUDIT_RAW"):
    data = b"x" * 86403 + b"\n"
    st0 = os.fstat(1)
    done, log = 0, []
    while done < len(data):
        try:
            n = os.write(1, data[done:])
        except OSError as e:
            st = os.fstat(1) if e.errno != 9 else None
            log.append(f"err{e.errno}@{done}:nb={int(bool(fcntl.fcntl(1, fcntl.F_GETFL) & os.O_NONBLOCK))}"
                       f":same={st is not None and (st.st_ino, st.st_dev) == (st0.st_ino, st0.st_dev)}")
            if e.errno != 11 or len(log) > 20:
                break
            import time; time.sleep(0.001)
            continue
        if n != len(data) - done:
            log.append(f"partial{n}@{done}")
        done += n
    sys.stderr.write("writes=" + ",".join(log) + "\n")
else:
    print("x" * 86403)
"""


def http500():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)

    def run():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            try:
                c.recv(65536)
                c.sendall(b"HTTP/1.1 500 X\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            c.close()
    threading.Thread(target=run, daemon=True).start()
    return s.getsockname()[1]


def main():
    rounds = int(sys.argv[1])
    busy = "--busy" in sys.argv
    work = tempfile.mkdtemp(prefix="fdaudit-parent-")
    paths = []
    for c in range(4):
        os.makedirs(os.path.join(work, f"c{c}"))
        for j in range(100):
            p = os.path.join(work, f"c{c}", f"{j:03d}.jpg")
            with open(p, "wb") as f:
                f.write(bytes([j]) * (j + 1 + c))
            paths.append(p)
    for e in ("psync", "io_uring", "auto"):
        fastread.read_files(paths, engine=e)
    port = http500()
    s3 = dict(endpoint_url=f"http://127.0.0.1:{port}", access_key_id="k", secret_access_key="s",
              region="us-east-1", retries=0)
    try:
        fastread.read_files([f"s3://b/k{i}" for i in range(8)], s3=s3)
    except fastread.ReadError:
        pass
    live = fastread.Reader(work, batch_size=64, engine="io_uring", workers=2)
    next(iter(live))
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            with fastread.Reader(work, batch_size=64, engine="auto", workers=2) as r:
                for _ in r:
                    pass
            fastread.read_files(paths[:64], engine="psync")
    if busy:
        threading.Thread(target=churn, daemon=True).start()
    bad = 0
    for i in range(rounds):
        engine = os.environ.get("FDAUDIT_ENGINE") or ("psync", "io_uring")[i % 2]
        p = subprocess.run([sys.executable, "-W", "always", "-c", CHILD, work, engine],
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),
                           capture_output=True, text=True, timeout=120)
        last = p.stdout.splitlines()[-1] if p.stdout else ""
        nb = [l for l in p.stderr.splitlines() if l.startswith("nonblock")]
        if os.environ.get("FDAUDIT_RAW"):
            w = [l for l in p.stderr.splitlines() if l.startswith("writes=")]
            if w and w[0] != "writes=":
                print({"round": i, "engine": engine, "writes": w[0][:300]}, flush=True)
        ok = p.returncode == 0 and len(last) == 86403 and nb == ["nonblock-at-start=0",
                                                                  "nonblock-at-end=0"]
        bad += not ok
        if not ok:
            print({"round": i, "engine": engine, "rc": p.returncode, "stdout": len(p.stdout), "nb": nb,
                   "stderr": p.stderr[-400:]}, flush=True)
    stop.set()
    live.close()
    print({"rounds": rounds, "bad": bad, "busy": busy,
           "load": os.getloadavg()}, flush=True)


if __name__ == "__main__":
    main()
