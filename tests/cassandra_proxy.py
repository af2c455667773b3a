"""A loopback TCP proxy that delays every chunk by `delay_ms` in each
direction (added round trip: 2 x delay_ms), for the Cassandra tests and
benchmark: latency without netem (no root, no other hosts). Bounded: it
listens on 127.0.0.1 only, forwards to one loopback target, and stops with
close() (or its `with` block).

    with DelayProxy(("127.0.0.1", 9042), delay_ms=10) as p:
        p.port   # connect here
"""
import collections
import select
import socket
import threading
import time


class DelayProxy:
    def __init__(self, target, delay_ms=0.0):
        host, _ = target
        if not host.startswith("127.") and host != "localhost":
            raise ValueError(f"DelayProxy forwards to loopback only, not {host!r}")
        self.target = target
        self.delay = delay_ms / 1000.0
        self._listen = socket.create_server(("127.0.0.1", 0))
        self.port = self._listen.getsockname()[1]
        self._stop = threading.Event()
        self._socks = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        self._listen.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listen.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(None)  # blocking sends; receives wait in select()
            self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                q = collections.deque()
                cv = threading.Condition()
                for fn in (self._pump_in, self._pump_out):
                    t = threading.Thread(target=fn, args=(a, b, q, cv), daemon=True)
                    t.start()
                    self._threads.append(t)

    def _pump_in(self, src, dst, q, cv):
        while not self._stop.is_set():
            try:
                if not select.select([src], [], [], 0.2)[0]:
                    continue
                data = src.recv(1 << 20)
            except (OSError, ValueError):
                data = b""
            with cv:
                q.append((time.monotonic() + self.delay, data))
                cv.notify()
            if not data:
                return

    def _pump_out(self, src, dst, q, cv):
        while not self._stop.is_set():
            with cv:
                while not q and not self._stop.is_set():
                    cv.wait(0.2)
                if not q:
                    return
                due, data = q.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        self._stop.set()
        self._listen.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv):
    """`python cassandra_proxy.py TARGET_PORT DELAY_MS`: a proxy process in
    front of 127.0.0.1:TARGET_PORT (a process of its own, so that its CPU
    is not the client's); prints its port, runs until stdin closes."""
    import sys
    proxy = DelayProxy(("127.0.0.1", int(argv[0])), float(argv[1]))
    print(proxy.port, flush=True)
    try:
        sys.stdin.read()
    finally:
        proxy.close()
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
