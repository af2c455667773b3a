"""Added network latency for the S3 benchmark (issue 30 item 7), loopback only.

Two ways, the first that works:

  netem   a private network namespace whose loopback has `tc qdisc netem
          delay D/2` (each direction, so a request/response round trip gains
          D); the benchmark runs itself, server included, inside it. Needs
          CAP_NET_ADMIN and the kernel's sch_netem, which this machine's
          kernel (6.18, no modules) lacks: "Specified qdisc kind is unknown".
  proxy   tests/s3_proxy.py as a separate process in front of the server,
          holding every response D ms. A process of its own, so its CPU is
          not the client's; it does share the machine's cores with it.

    python bench/s3/latency.py        # says which works here, and why not
"""

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.normpath(os.path.join(HERE, "..", "..", "tests"))
PROXY_START_TIMEOUT_S = 30.0


def _run(cmd, timeout=20):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def probe_netem():
    """(True, "") when a private namespace with netem on its loopback can be
    made here, else (False, the reason). Leaves nothing behind."""
    if not (shutil.which("ip") and shutil.which("tc")):
        return False, "no `ip`/`tc` (iproute2)"
    ns = f"fastread-probe-{os.getpid()}"
    made = _run(["ip", "netns", "add", ns])
    if made.returncode != 0:
        return False, f"ip netns add: {made.stderr.strip()}"
    try:
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        q = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
                  "netem", "delay", "1ms"])
        if q.returncode != 0:
            return False, f"netns works; tc netem: {q.stderr.strip()}"
        return True, ""
    finally:
        _run(["ip", "netns", "del", ns])


@contextlib.contextmanager
def netem_namespace(delay_ms):
    """A namespace named for this process whose loopback delays each packet
    delay_ms/2 (a round trip: +delay_ms). Yields its name; deleted after."""
    ns = f"fastread-netem-{os.getpid()}-{int(delay_ms)}"
    steps = [["ip", "netns", "add", ns],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
             ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
              "delay", f"{delay_ms / 2.0}ms"]]
    try:
        for cmd in steps:
            r = _run(cmd)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
        yield ns
    finally:
        _run(["ip", "netns", "del", ns])


def run_in_namespace(ns, argv, timeout_s):
    """argv inside namespace ns (its output passes through); its status."""
    return subprocess.run(["ip", "netns", "exec", ns] + list(argv), timeout=timeout_s).returncode


#: {proxy pid: the JSON file it rewrites with its requests in flight}
#: (s3_proxy.py --stats; proxy_inflight() reads it).
_STATS = {}


def proxy_inflight(pid):
    """The ProxyProcess `pid`'s inflight() as last written (now, max,
    area_s, at: see tests/s3_proxy.py), or None."""
    path = _STATS.get(pid)
    try:
        with open(path) as f:
            return json.load(f)
    except (TypeError, OSError, ValueError):
        return None


class ProxyProcess:
    """tests/s3_proxy.py in a process of its own, in front of `upstream`, with
    delay_ms on every response. Ends when we close its stdin (or die). It
    counts the requests in flight through it (proxy_inflight(pid))."""

    def __init__(self, upstream, delay_ms):
        self.upstream, self.delay_ms = upstream, delay_ms
        self.proc = None
        self.endpoint = None
        fd, self.stats_path = tempfile.mkstemp(prefix="fastread-proxy-", suffix=".json")
        os.close(fd)

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(TESTS, "s3_proxy.py"), "--upstream", self.upstream,
             "--delay-ms", str(self.delay_ms), "--seconds", "3600", "--stats", self.stats_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], PROXY_START_TIMEOUT_S)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            self.__exit__()
            raise RuntimeError(f"proxy did not start within {PROXY_START_TIMEOUT_S} s: "
                               f"{line!r} {self.proc.stderr.read()[-2000:]}")
        self.endpoint = line
        _STATS[self.proc.pid] = self.stats_path
        return self

    def __exit__(self, *exc):
        if self.proc is None:
            return
        _STATS.pop(self.proc.pid, None)
        for p in (self.stats_path, self.stats_path + ".tmp"):
            try:
                os.unlink(p)
            except OSError:
                pass
        try:
            self.proc.stdin.close()     # its watch thread sees EOF and it exits
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@contextlib.contextmanager
def delayed_endpoint(upstream, delay_ms, via="proxy"):
    """(endpoint, how, proxy pid or None) for reaching `upstream` with
    delay_ms added: 0 ms: the server itself ("direct"); otherwise a proxy
    process ("proxy"). via="proxy0" puts the proxy in front even at 0 ms
    (to see its own overhead)."""
    if delay_ms == 0 and via != "proxy0":
        yield upstream, "direct", None
        return
    with ProxyProcess(upstream, delay_ms) as p:
        yield p.endpoint, "proxy", p.proc.pid


if __name__ == "__main__":
    ok, why = probe_netem()
    print("netem in a private namespace:", "works" if ok else f"not here ({why})")
    print("fallback: tests/s3_proxy.py delay per response")
    if len(sys.argv) > 1:   # python latency.py http://127.0.0.1:PORT -> time one GET / via 25 ms
        with delayed_endpoint(sys.argv[1], 25) as (ep, how, _pid):
            import urllib.error
            import urllib.request
            t0 = time.perf_counter()
            try:
                urllib.request.urlopen(ep + "/", timeout=10).read()
            except urllib.error.HTTPError:
                pass
            print(how, ep, f"{(time.perf_counter() - t0) * 1000:.1f} ms")
