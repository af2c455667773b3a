"""A fault-injecting HTTP/1.1 proxy on a loopback port, in front of a real S3
server (tests/s3_server.py): the S3 engine's error paths are tested against
the real server's answers, with the proxy breaking some of them on request.

    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.delay_ms = 25                          # every response, +25 ms
        proxy.fail("slowdown", times=3)              # next 3 requests: 503 SlowDown
        proxy.fail("reset", match="/bucket/victim")  # RST instead of an answer
        proxy.fail("truncate", keep=1000)            # 1000 body bytes, then close
        proxy.fail("stall", seconds=5, after_bytes=0)  # headers, then nothing for 5 s
        ... point the client at proxy.endpoint ...
        proxy.counts["slowdown"], proxy.log

Requests are forwarded byte for byte, the Host header included. A client
pointed at the proxy signs (SigV4) for the proxy's host:port; the server
recomputes the signature from the headers it receives, which are those, so
it validates (tests/test_s3_proxy.py: a signed boto3 GET through it works).

One thread accepts; one thread per client connection relays its requests
(keep-alive) over its own upstream connection. Every socket operation has a
timeout, a stall is bounded by its `seconds`, and close() (or leaving the
`with`) stops the threads within a few seconds. It can also run as a process
(`python s3_proxy.py --upstream URL --delay-ms D`), which the benchmark uses so
that the proxy's CPU is not counted as the client's.
"""

import argparse
import json
import os
import collections
import socket
import socketserver
import sys
import threading
import time
import urllib.parse

MODES = ("slowdown", "reset", "truncate", "stall", "status")
_CHUNK = 256 * 1024
_MAX_HEAD = 64 * 1024
_MAX_STALL_S = 300.0


class _Closed(Exception):
    """The peer closed the connection (cleanly, between requests, or not)."""


class _Stream:
    """A socket with a read buffer: HTTP heads, lines and counted bodies."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self):
        data = self.sock.recv(_CHUNK)
        if not data:
            raise _Closed()
        self.buf += data

    def read_head(self):
        """Bytes up to and including the blank line; None on a clean close
        before any byte of it."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self.buf[:end + 4])
                del self.buf[:end + 4]
                return head
            if len(self.buf) > _MAX_HEAD:
                raise ValueError(f"HTTP head over {_MAX_HEAD} bytes")
            try:
                self._fill()
            except _Closed:
                if not self.buf:
                    return None
                raise

    def read_line(self):
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end + 2])
                del self.buf[:end + 2]
                return line
            self._fill()

    def iter_exact(self, n):
        """n bytes, as they arrive."""
        while n > 0:
            if not self.buf:
                self._fill()
            take = min(n, len(self.buf))
            chunk = bytes(self.buf[:take])
            del self.buf[:take]
            n -= take
            yield chunk

    def iter_chunked(self):
        """A chunked body as it is on the wire (sizes, data, trailers)."""
        while True:
            line = self.read_line()
            yield line
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:   # trailers up to the blank line
                    t = self.read_line()
                    yield t
                    if t == b"\r\n":
                        return
            yield from self.iter_exact(size + 2)

    def iter_to_close(self):
        if self.buf:
            yield bytes(self.buf)
            self.buf.clear()
        while True:
            data = self.sock.recv(_CHUNK)
            if not data:
                return
            yield data


def _parse_head(head):
    """(first line, {lower-case name: value}) of an HTTP head."""
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def _body_iter(stream, headers, no_body=False):
    """The body that follows a head, and its length when known."""
    if no_body:
        return iter(()), 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return stream.iter_chunked(), None
    if "content-length" in headers:
        n = int(headers["content-length"])
        return stream.iter_exact(n), n
    return None, None


class _Rule:
    def __init__(self, mode, times, match, params):
        self.mode, self.remaining, self.match, self.params = mode, times, match, params

    def accepts(self, method, target):
        if self.remaining <= 0:
            return False
        if self.match is None:
            return True
        if callable(self.match):
            return bool(self.match(method, target))
        return self.match in target


class FaultProxy:
    """A proxy to `upstream` ("http://host:port", or an object with .endpoint)
    on 127.0.0.1:`port` (0: any free port)."""

    def __init__(self, upstream, port=0, delay_ms=0, io_timeout_s=30.0):
        url = getattr(upstream, "endpoint", upstream)
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.port:
            raise ValueError(f"upstream must be http://host:port, not {url!r}")
        self.upstream = (parsed.hostname, parsed.port)
        self.delay_ms = delay_ms
        self.io_timeout_s = io_timeout_s
        self.counts = collections.Counter()
        self.log = []           # (method, target, action, status) per request
        # Requests in flight (a request's head read, its answer not yet all
        # sent): now, at most, and integrated over time (request-seconds),
        # so that a caller reads the mean over any window (inflight()).
        self._active = 0
        self._active_max = 0
        self._active_area = 0.0
        self._active_since = time.monotonic()
        self._rules = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sockets = set()
        self._threads = set()

        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                proxy._serve_connection(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            block_on_close = False     # close() joins our own list, with a bound
            allow_reuse_address = True
            request_queue_size = 256

            def process_request(self, request, client_address):
                t = threading.Thread(target=self.process_request_thread,
                                     args=(request, client_address), daemon=True)
                with proxy._lock:
                    proxy._threads.add(t)
                t.start()

        self._server = Server(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self._accept_thread = threading.Thread(target=self._server.serve_forever,
                                               kwargs={"poll_interval": 0.1}, daemon=True,
                                               name=f"s3-proxy-{self.port}")
        self._accept_thread.start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    # -- faults ----------------------------------------------------------------

    def fail(self, mode, times=1, match=None, **params):
        """The next `times` requests that `match` (a substring of the request
        target "/bucket/key?query", or a callable (method, target) -> bool;
        None: any) get `mode`:
          slowdown          503 SlowDown (S3's throttling answer), server not asked
          status            status=S, code=C: that S3 error answer, server not asked
          reset             the connection reset (RST) instead of an answer
          truncate          the server's answer with only keep=N body bytes
                            (default half) of its Content-Length, then close
          stall             after_bytes=N body bytes (None: not even the head),
                            then nothing for seconds=S (default 10), then close
        Rules are tried in the order given; the first that matches is used."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        with self._lock:
            self._rules.append(_Rule(mode, times, match, params))

    def clear(self):
        """Drop the faults not yet used (the delay stays)."""
        with self._lock:
            self._rules.clear()

    def _take_rule(self, method, target):
        with self._lock:
            self.counts["requests"] += 1
            for rule in self._rules:
                if rule.accepts(method, target):
                    rule.remaining -= 1
                    return rule
        return None

    def _count_active(self, delta):
        with self._lock:
            now = time.monotonic()
            self._active_area += self._active * (now - self._active_since)
            self._active_since = now
            self._active += delta
            self._active_max = max(self._active_max, self._active)

    def inflight(self):
        """{"now", "max", "area_s", "at"}: requests in flight now and at
        most so far, and their integral over time up to monotonic time "at";
        (area_s2 - area_s1) / (at2 - at1) is the mean between two calls."""
        with self._lock:
            now = time.monotonic()
            area = self._active_area + self._active * (now - self._active_since)
            return {"now": self._active, "max": self._active_max, "area_s": area, "at": now}

    def _record(self, method, target, action, status):
        """Called before the first byte of the answer goes to the client, so
        a client that has its answer always finds the request in the log."""
        with self._lock:
            self.counts[action] += 1
            self.log.append((method, target, action, status))

    def _sleep(self, seconds):
        """Sleep unless closing; False when the proxy is closing."""
        return not self._closing.wait(seconds) if seconds > 0 else not self._closing.is_set()

    # -- relay -------------------------------------------------------------------

    def _track(self, sock):
        with self._lock:
            self._sockets.add(sock)

    def _untrack_close(self, sock, reset=False):
        if sock is None:
            return
        with self._lock:
            self._sockets.discard(sock)
        try:
            if reset:   # linger 0: close sends RST, not FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
        except OSError:
            pass

    def _connect_upstream(self):
        s = socket.create_connection(self.upstream, timeout=self.io_timeout_s)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(s)
        return _Stream(s)

    def _serve_connection(self, client_sock):
        client_sock.settimeout(self.io_timeout_s)
        client_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(client_sock)
        client = _Stream(client_sock)
        upstream = None
        reset = False
        try:
            while not self._closing.is_set():
                keep, reset, upstream = self._one_request(client, upstream)
                if not keep:
                    break
        except (OSError, _Closed, ValueError):
            pass   # a peer went away or the proxy is closing: end this connection
        finally:
            self._untrack_close(upstream.sock if upstream else None)
            self._untrack_close(client_sock, reset=reset)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _one_request(self, client, upstream):
        """Relay one request; (keep the connection, reset it, upstream)."""
        head = client.read_head()
        if head is None:
            return False, False, upstream
        first, headers = _parse_head(head)
        parts = first.split(" ")
        if len(parts) != 3:
            raise ValueError(f"not an HTTP/1.1 request line: {first[:100]!r}")
        method, target = parts[0], parts[1]
        if headers.get("expect", "").lower() == "100-continue":
            # Answer the interim response ourselves so the client sends its body
            # now; the server's own 100 Continue is skipped below.
            client.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body_iter, _ = _body_iter(client, headers)
        body = b"".join(body_iter) if body_iter is not None else b""
        client_close = headers.get("connection", "").lower() == "close"

        self._count_active(+1)
        try:
            return self._answer(client, upstream, head, body, method, target, client_close)
        finally:
            self._count_active(-1)

    def _answer(self, client, upstream, head, body, method, target, client_close):
        """_one_request's answer to a request read whole."""
        rule = self._take_rule(method, target)
        mode = rule.mode if rule else "pass"
        if not self._sleep(self.delay_ms / 1000.0):
            return False, False, upstream

        if mode in ("slowdown", "status"):
            status = rule.params.get("status", 503) if mode == "status" else 503
            code = rule.params.get("code", "SlowDown" if status == 503 else "InternalError")
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                   f"<Message>injected by the test proxy</Message>"
                   f"<Resource>{target}</Resource><RequestId>proxy</RequestId></Error>").encode()
            reason = {503: "Slow Down", 500: "Internal Server Error"}.get(status, "Error")
            self._record(method, target, mode, status)
            client.sock.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                                f"Content-Length: {len(xml)}\r\n\r\n".encode() + xml)
            return not client_close, False, upstream
        if mode == "reset":
            self._record(method, target, "reset", None)
            return False, True, upstream

        # Forward unchanged. A pooled upstream connection the server closed
        # while idle fails before any answer: reconnect once and resend.
        for attempt in (0, 1):
            if upstream is None:
                upstream = self._connect_upstream()
            try:
                upstream.sock.sendall(head + body)
                resp_head = upstream.read_head()
                while resp_head is not None and resp_head[9:10] == b"1":   # 1xx interim
                    resp_head = upstream.read_head()
                if resp_head is None:
                    raise _Closed()
                break
            except (_Closed, ConnectionError):
                self._untrack_close(upstream.sock)
                upstream = None
                if attempt == 1:
                    raise
        status_line, resp_headers = _parse_head(resp_head)
        status = int(status_line.split(" ")[1])
        no_body = method == "HEAD" or status in (204, 304)
        resp_body, length = _body_iter(upstream, resp_headers, no_body)
        upstream_close = resp_headers.get("connection", "").lower() == "close"
        if resp_body is None:            # delimited by close
            resp_body, upstream_close = upstream.iter_to_close(), True

        if mode == "truncate":
            full = length if length is not None else 0
            keep = rule.params.get("keep", full // 2)
            self._record(method, target, "truncate", status)
            self._send_limited(client.sock, resp_head, resp_body, keep)
            self._drop(upstream)    # the rest of its answer is unread
            return False, False, None
        if mode == "stall":
            after = rule.params.get("after_bytes")
            self._record(method, target, "stall", status)
            if after is not None:
                self._send_limited(client.sock, resp_head, resp_body, after)
            self._sleep(min(float(rule.params.get("seconds", 10.0)), _MAX_STALL_S))
            self._drop(upstream)
            return False, False, None

        self._record(method, target, "pass", status)
        client.sock.sendall(resp_head)
        for chunk in resp_body:
            client.sock.sendall(chunk)
        if upstream_close:
            self._drop(upstream)
            upstream = None
        return not (client_close or upstream_close), False, upstream

    def _send_limited(self, sock, head, body, limit):
        """The head and the first `limit` bytes of the body."""
        sock.sendall(head)
        for chunk in body:
            if limit <= 0:
                break
            sock.sendall(chunk[:limit])
            limit -= len(chunk)

    def _drop(self, upstream):
        """Close an upstream whose answer was not read to its end."""
        self._untrack_close(upstream.sock)

    # -- lifecycle -----------------------------------------------------------------

    def settled_log(self, timeout_s=3.0):
        """The log once it stops growing: for requests still on their way
        (a client that gave up on one, or reads from several threads)."""
        deadline = time.monotonic() + timeout_s
        n = -1
        while time.monotonic() < deadline:
            time.sleep(0.15)
            if len(self.log) == n:
                break
            n = len(self.log)
        return list(self.log)

    def close(self, timeout_s=5.0):
        """Stop accepting, end every connection (stalls included), join the
        threads (bounded). Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            socks, threads = list(self._sockets), list(self._threads)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for t in threads + [self._accept_thread]:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"{len(alive)} proxy threads still running {timeout_s} s after close")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv=None):
    """A proxy process: prints its endpoint on one line, serves until stdin
    closes or --seconds pass (bounded either way)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="http://host:port of the S3 server")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="added to every response")
    ap.add_argument("--seconds", type=float, default=3600.0, help="exit after this long")
    ap.add_argument("--stats", help="rewrite this JSON file with inflight() every 50 ms")
    args = ap.parse_args(argv)
    with FaultProxy(args.upstream, delay_ms=args.delay_ms) as proxy:
        print(proxy.endpoint, flush=True)
        done = threading.Event()

        def write_stats():
            while not done.wait(0.05):
                tmp = args.stats + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(proxy.inflight(), f)
                os.replace(tmp, args.stats)   # readers never see half a file
        if args.stats:
            threading.Thread(target=write_stats, daemon=True).start()

        def watch_stdin():
            sys.stdin.read()     # returns when the parent closes our stdin or dies
            done.set()
        threading.Thread(target=watch_stdin, daemon=True).start()
        done.wait(args.seconds)


if __name__ == "__main__":
    main()
