"""A second real S3 server for the tests and benchmarks: MinIO (single node,
single drive) on a free loopback port, with its root credentials as the one
identity, so that SigV4 signatures are checked (a wrong secret gets 403).

MinIO is optional. Its binary is not on PyPI: scripts/build-minio.sh builds
a pinned version with `go install` into /var/tmp/fastread-minio/bin (found
there, or at $FASTREAD_MINIO, or on PATH). Where there is none, find_minio()
is None and the fixtures skip naming MinIO; it is not in
FASTREAD_TEST_REQUIRE.

    with MinIO() as s3:
        s3.make_bucket("train"); s3.put("train", "a.jpg", b"...")

Everything but how the server starts (the clients, make_bucket, put,
upload_tree, env(), kill(), restart(), stop()) is SeaweedFS's
(tests/s3_server.py): the same helpers against either server.
"""
import os
import random
import shutil
import urllib.error
import urllib.request

from s3_server import _PORT_HIGH, _PORT_LOW, SeaweedFS, _port_free

#: Where scripts/build-minio.sh puts the binary (never committed).
DEFAULT_BIN = "/var/tmp/fastread-minio/bin/minio"


def find_minio():
    """The minio binary: $FASTREAD_MINIO, else DEFAULT_BIN, else PATH; None
    when there is none."""
    for c in (os.environ.get("FASTREAD_MINIO"), DEFAULT_BIN, shutil.which("minio")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def minio_reason():
    """None where a MinIO can be started here, else why not."""
    if find_minio() is None:
        return ("no MinIO binary for the MinIO tests: bash scripts/build-minio.sh "
                f"(builds {DEFAULT_BIN}) or set FASTREAD_MINIO")
    return None


class MinIO(SeaweedFS):
    """One MinIO server with its drive under `workdir`/data."""

    NAME = "MinIO"

    def __init__(self, workdir=None, minio=None, **kwargs):
        binary = minio or find_minio()
        if binary is None:
            raise FileNotFoundError(minio_reason())
        # SeaweedFS.__init__ looks for weed only when none is given: the
        # binary slot holds minio here.
        super().__init__(workdir, weed=binary, **kwargs)
        if len(self.secret_key) < 8 or len(self.access_key) < 3:
            raise ValueError("MinIO wants a root user of >= 3 characters and a "
                             "password of >= 8")

    def _choose_ports(self):
        """{"s3": (port, console port)}: both free now. The console is off
        (MINIO_BROWSER=off) but MinIO still takes --console-address."""
        rng = random.Random()
        for _ in range(500):
            p, c = rng.randrange(_PORT_LOW, _PORT_HIGH), rng.randrange(_PORT_LOW, _PORT_HIGH)
            if p != c and _port_free(p) and _port_free(c):
                return {"s3": (p, c)}
        raise RuntimeError("no two free loopback ports for MinIO in 500 tries")

    def _write_identities(self):
        return None   # the root credentials (env) are the one identity

    def _command(self, _ids_path):
        p, console = self.ports["s3"]
        return [self.weed, "server", "--quiet", "--anonymous",
                "--address", f"127.0.0.1:{p}", "--console-address", f"127.0.0.1:{console}",
                self.datadir]

    def _server_env(self):
        env = dict(os.environ)
        # An AWS_* or MINIO_* of the caller's must not configure the server.
        for k in list(env):
            if k.startswith(("MINIO_", "AWS_")):
                del env[k]
        env.update({
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_REGION": self.region,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            # No phone-home and no licence checks from a test server.
            "MINIO_CALLHOME_ENABLE": "off",
        })
        return env


def _health(endpoint, timeout=2):
    """True when /minio/health/live answers 200 (for manual checks)."""
    try:
        with urllib.request.urlopen(endpoint + "/minio/health/live", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


if __name__ == "__main__":
    # A manual check: python tests/s3_minio.py -> starts, prints, stops.
    with MinIO() as s:
        print("endpoint", s.endpoint, "log", s.logpath, "live", _health(s.endpoint))
        s.make_bucket("manual-check")
        print(s.put("manual-check", "a/b.bin", b"x" * 10))
