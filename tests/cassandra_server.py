"""A real Apache Cassandra for the tests and benchmarks: Cassandra 5.0
(`org.apache.cassandra:cassandra-all` and its dependencies from Maven
Central) run as one node on loopback ports by Java 17, from a generated
`cassandra.yaml`.

    with Cassandra(workdir, auth=True) as c:
        c.host, c.port, c.username, c.password
        c.session().execute("CREATE KEYSPACE ...")   # the Python driver

The jars are fetched once by `python3 tests/cassandra_server.py fetch`
(scripts/setup.sh does it): Maven resolves them into ~/.m2 and copies them
into CACHE_DIR/<version>/lib, which every later run reuses. find_jars() says
where they are, or why they are not there.

The pytest fixture `cassandra_server` (conftest.py) is one such server for
the whole session (authentication on); the benchmark (bench/cassandra/)
starts its own. The node runs in its own process group (setsid) and dies
with the thread that started it (PR_SET_PDEATHSIG); stop(), kill() and an
atexit hook signal the whole group, so no JVM outlives its user.
"""

import atexit
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

# The process plumbing the S3 server has too: a port free on loopback, and a
# child in its own session that dies with the thread that started it.
from s3_server import _die_with_parent, _port_free  # noqa: E402,F401

VERSION = os.environ.get("FASTREAD_CASSANDRA_VERSION", "5.0.5")
CACHE_DIR = os.environ.get("FASTREAD_CASSANDRA_CACHE", "/var/tmp/fastread-cassandra")
USERNAME, PASSWORD = "cassandra", "cassandra"   # the superuser a fresh node creates

# Measured on the 2-core VM, shared with other jobs: the native port answers
# 9-10 s after the JVM starts (fresh data directory); a restart on the same
# data replays the commit log first. The bound leaves room for a busy machine.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
TERM_GRACE_S = 5.0
START_ATTEMPTS = 3   # a chosen port can be taken between the check and the bind
# Below the kernel's ephemeral range (32768-60999): no outgoing connection
# can be sitting on a port we choose.
_PORT_LOW, _PORT_HIGH = 23000, 32000

# Cassandra 5.0's conf/jvm17-server.options (the module system's exports and
# opens the server needs on Java 17, its G1 settings, Netty's allocator),
# with a small heap instead of a quarter of the machine's memory.
JVM17_OPTIONS = [
    "-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
    "-XX:G1HeapRegionSize=16m", "-XX:G1RSetUpdatingPauseTimePercent=5",
    "-XX:MaxGCPauseMillis=300", "-XX:InitiatingHeapOccupancyPercent=70",
    "-Djdk.attach.allowAttachSelf=true",
    *[f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc", "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql",
        "java.base/java.lang.ref", "jdk.unsupported/sun.misc",
        "jdk.compiler/com.sun.tools.javac.file", "jdk.attach/sun.tools.attach")],
    *[f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader",
        "java.base/jdk.internal.ref", "java.base/jdk.internal.reflect",
        "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util")],
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true", "-Dio.netty.allocator.maxOrder=11",
    # jvm-server.options' common part that matters here.
    "-Xss256k", "-XX:+HeapDumpOnOutOfMemoryError", "-Djava.net.preferIPv4Stack=true",
]

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fastread.tests</groupId><artifactId>cassandra-server</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.cassandra</groupId><artifactId>cassandra-all</artifactId>
      <version>{version}</version></dependency>
  </dependencies>
</project>
"""


def lib_dir(version=VERSION):
    return os.path.join(CACHE_DIR, version, "lib")


def find_java():
    """The java binary of a JDK 17 or newer ($JAVA_HOME, else PATH), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True,
                             timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in out.replace('"', " ").split():
        major = word.split(".")[0]
        if major.isdigit() and word[0].isdigit():
            return java if int(major) >= 17 else None
    return None


def why_not_available(version=VERSION):
    """None where a node can start here, else why not (what to install)."""
    if find_java() is None:
        return ("no Java 17 or newer for Cassandra (apt-get install openjdk-17-jre-headless, "
                "or set JAVA_HOME)")
    jar = os.path.join(lib_dir(version), f"cassandra-all-{version}.jar")
    if not os.path.isfile(jar):
        return (f"no Cassandra {version} jars in {lib_dir(version)}: run "
                f"`python3 tests/cassandra_server.py fetch` (Maven; scripts/setup.sh does it)")
    return None


def fetch(version=VERSION, quiet=False):
    """Resolves cassandra-all and its dependencies with Maven into
    lib_dir(version) (kept: later calls return at once). Returns the dir."""
    dest = lib_dir(version)
    marker = os.path.join(dest, ".complete")
    if os.path.exists(marker):
        return dest
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("no `mvn` to fetch Cassandra's jars (apt-get install maven)")
    work = os.path.join(CACHE_DIR, version)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "pom.xml"), "w") as f:
        f.write(POM.format(version=version))
    tmp = dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-B", "-q", "-f", os.path.join(work, "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={tmp}"]
    started = time.monotonic()
    res = subprocess.run(cmd, capture_output=quiet, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"mvn failed ({res.returncode}): {' '.join(cmd)}\n"
                           f"{(res.stdout or '')[-2000:]}{(res.stderr or '')[-2000:]}")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    with open(marker, "w") as f:
        f.write(f"fetched in {time.monotonic() - started:.1f} s\n")
    return dest


def choose_ports(n, rng=None):
    rng = rng or random.Random()
    ports = []
    for _ in range(n):
        for _ in range(500):
            p = rng.randrange(_PORT_LOW, _PORT_HIGH)
            if p not in ports and _port_free(p):
                ports.append(p)
                break
        else:
            raise RuntimeError("no free loopback port for Cassandra in 500 tries")
    return ports


def native_port_ready(host, port, timeout=2.0):
    """True once the node answers a CQL OPTIONS frame (protocol v4) with
    SUPPORTED: the native transport is up, not only the socket."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack(">BBhBi", 0x04, 0, 0, 0x05, 0))
            head = b""
            while len(head) < 9:
                got = s.recv(9 - len(head))
                if not got:
                    return False
                head += got
            return head[0] == 0x84 and head[4] == 0x06
    except OSError:
        return False


class Cassandra:
    """One Cassandra node with its data under `workdir`. start() waits until
    the native port answers (and, with auth, until the superuser can log in)."""

    def __init__(self, workdir=None, *, auth=False, tls=False, heap_mb=768, host="127.0.0.1",
                 version=VERSION, extra_yaml="", initial_token=0, seeds=None, ports=None):
        why = why_not_available(version)
        if why:
            raise FileNotFoundError(why)
        self.java = find_java()
        self.version = version
        self.auth = auth
        self.heap_mb = heap_mb
        self.host = host
        self.extra_yaml = extra_yaml
        # tls: the native port takes TLS and plain connections both
        # (client_encryption_options optional), with a self-signed
        # certificate for localhost and 127.0.0.1; tls_ca is its PEM.
        self.tls = tls
        self.tls_ca = None
        self.username, self.password = (USERNAME, PASSWORD) if auth else (None, None)
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="fastread-cassandra-", dir="/var/tmp")
        os.makedirs(self.workdir, exist_ok=True)
        self.logpath = os.path.join(self.workdir, "system.log")
        self.outpath = os.path.join(self.workdir, "stdout.log")
        # A node of a cluster of several (bench/cassandra/two_nodes.py): its
        # token, the seed it joins ("host:storage_port"), ports fixed by the
        # caller (every node of a cluster on 127.0.0.x uses the same ones).
        self.initial_token, self.seeds = initial_token, seeds
        self.port, self.storage_port = ports if ports else (None, None)
        self._fixed_ports = ports is not None
        self.proc = None
        self.start_seconds = None   # how long the last start took
        self._out = None
        self._cluster = None
        atexit.register(self.stop)

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def _make_keystore(self):
        """A PKCS12 keystore with a self-signed certificate (keytool, from
        the JDK) and the certificate as PEM for the clients to check."""
        ks = os.path.join(self.workdir, "node.p12")
        pem = os.path.join(self.workdir, "node.pem")
        keytool = os.path.join(os.path.dirname(os.path.realpath(self.java)), "keytool")
        if not os.path.exists(ks):
            subprocess.run([keytool, "-genkeypair", "-alias", "node", "-keyalg", "RSA",
                            "-keysize", "2048", "-dname", "CN=localhost", "-ext",
                            "SAN=DNS:localhost,IP:127.0.0.1", "-validity", "3650",
                            "-keystore", ks, "-storetype", "PKCS12", "-storepass", "fastread",
                            "-keypass", "fastread"], check=True, capture_output=True)
            subprocess.run([keytool, "-exportcert", "-rfc", "-alias", "node", "-keystore", ks,
                            "-storepass", "fastread", "-file", pem], check=True,
                           capture_output=True)
        self.tls_ca = pem
        return f"""client_encryption_options:
  enabled: true
  optional: true
  keystore: {ks}
  keystore_password: fastread
  store_type: PKCS12
  require_client_auth: false
"""

    def _write_config(self):
        d = self.workdir
        tls_yaml = self._make_keystore() if self.tls else ""
        yaml = f"""cluster_name: fastread-test
num_tokens: 1
initial_token: {self.initial_token}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
data_file_directories: [{d}/data]
commitlog_directory: {d}/commitlog
saved_caches_directory: {d}/saved_caches
hints_directory: {d}/hints
cdc_raw_directory: {d}/cdc_raw
commitlog_sync: periodic
commitlog_sync_period: 10000ms
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{self.seeds or f'{self.host}:{self.storage_port}'}"
listen_address: {self.host}
rpc_address: {self.host}
storage_port: {self.storage_port}
native_transport_port: {self.port}
endpoint_snitch: SimpleSnitch
authenticator: {"PasswordAuthenticator" if self.auth else "AllowAllAuthenticator"}
authorizer: AllowAllAuthorizer
start_native_transport: true
auto_bootstrap: false
# Multi-MB blobs: a mutation may be at most half a commit-log segment.
commitlog_segment_size: 64MiB
native_transport_max_frame_size: 32MiB
# Small caches: the page cache serves repeated reads.
key_cache_size: 8MiB
{tls_yaml}{self.extra_yaml}
"""
        conf = os.path.join(d, "cassandra.yaml")
        with open(conf, "w") as f:
            f.write(yaml)
        logback = os.path.join(d, "logback.xml")
        with open(logback, "w") as f:
            f.write(f"""<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{self.logpath}</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
""")
        return conf, logback

    def _command(self, conf, logback):
        return [
            self.java, f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", *JVM17_OPTIONS,
            f"-Dcassandra.config=file://{conf}", f"-Dlogback.configurationFile=file://{logback}",
            f"-Dcassandra.storagedir={self.workdir}", "-Dcassandra-foreground=yes",
            # One node: no gossip to settle, no ring to wait for, the default
            # superuser made at once rather than after 10 s.
            "-Dcassandra.skip_wait_for_gossip_to_settle=0", "-Dcassandra.ring_delay_ms=0",
            "-Dcassandra.superuser_setup_delay_ms=0",
            # No JMX port: cassandra.jmx.local.port unset leaves it off (no
            # fixed port 7199 for two nodes to collide on).
            "-cp", os.path.join(lib_dir(self.version), "*"),
            "org.apache.cassandra.service.CassandraDaemon",
        ]

    def start(self):
        return self._start(keep_ports=False)

    def _start(self, keep_ports):
        if self.proc is not None and self.proc.poll() is None:
            return self
        last_error = None
        for attempt in range(START_ATTEMPTS):
            if not (keep_ports and self.port) and not self._fixed_ports:
                self.port, self.storage_port = choose_ports(2)
            conf, logback = self._write_config()
            self._out = open(self.outpath, "ab")
            t0 = time.monotonic()
            self.proc = subprocess.Popen(self._command(conf, logback), cwd=self.workdir,
                                         stdin=subprocess.DEVNULL, stdout=self._out,
                                         stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            try:
                self._wait_ready()
                self.start_seconds = time.monotonic() - t0
                return self
            except RuntimeError as e:
                last_error = e
                self.kill()
                if "Address already in use" not in self.log_tail(6000):
                    break
                time.sleep(1.0)
        raise RuntimeError(f"Cassandra did not start: {last_error}")

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the JVM exited with status {self.proc.returncode}; "
                                   f"{self.logpath} ends:\n{self.log_tail()}")
            if native_port_ready(self.host, self.port):
                if not self.auth:
                    return
                try:   # the superuser is made just after the port opens
                    self.session()
                    return
                except Exception as e:  # the driver's AuthenticationFailed, NoHostAvailable
                    last = f"login: {type(e).__name__}: {e}"
                    self._close_cluster()
            else:
                last = f"native port {self.host}:{self.port} not answering"
            time.sleep(0.25)
        raise RuntimeError(f"not ready within {START_TIMEOUT_S:.0f} s ({last}); "
                           f"{self.logpath} ends:\n{self.log_tail()}")

    def log_tail(self, nbytes=3000):
        out = []
        for path in (self.logpath, self.outpath):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - nbytes))
                    out.append(f.read().decode(errors="replace"))
            except OSError as e:
                out.append(f"(no {os.path.basename(path)}: {e})")
        return "\n".join(out)

    def cpu_seconds(self):
        """User + system CPU seconds the node has used (from /proc), or None."""
        if self.proc is None:
            return None
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        """SIGKILL the node now (the "server dies mid-epoch" tests); the data
        stays for restart()."""
        if self.proc is None:
            return
        self._close_cluster()
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Cassandra pid {self.proc.pid} survived SIGKILL")
        if self._out is not None:
            self._out.close()
            self._out = None

    def restart(self):
        """Kill and start again on the same ports and data."""
        self.kill()
        return self._start(keep_ports=True)

    def stop(self):
        """SIGTERM, a bounded wait, then SIGKILL. Idempotent."""
        if self.proc is None:
            return
        self._close_cluster()
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self.proc = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- the Python driver ----------------------------------------------------

    def _close_cluster(self):
        if self._cluster is not None:
            try:
                self._cluster.shutdown()
            except Exception:  # a dead node: nothing to close cleanly
                pass
            self._cluster = None

    def session(self):
        """A cassandra-driver session on this node (cached)."""
        if self._cluster is None:
            from cassandra.cluster import Cluster
            from cassandra.auth import PlainTextAuthProvider
            auth = PlainTextAuthProvider(self.username, self.password) if self.auth else None
            self._cluster = Cluster([self.host], port=self.port, auth_provider=auth,
                                    protocol_version=4, connect_timeout=10)
            self._session = self._cluster.connect()
            self._session.default_timeout = 60
        return self._session


def main(argv):
    if argv[:1] == ["fetch"]:
        t0 = time.monotonic()
        print(f"cassandra: fetching Cassandra {VERSION}'s jars with Maven into {lib_dir()}",
              flush=True)
        print(f"cassandra: {fetch()} ({time.monotonic() - t0:.1f} s)")
        return 0
    if argv[:1] == ["check"]:
        why = why_not_available()
        print(why or f"ready: java {find_java()}, jars in {lib_dir()}")
        return 1 if why else 0
    if argv[:1] == ["run"]:
        with Cassandra(auth="--auth" in argv) as c:
            print(f"up: {c.host}:{c.port} in {c.start_seconds:.1f} s, pid {c.pid}, "
                  f"log {c.logpath}; Ctrl-C stops it", flush=True)
            try:
                while c.proc.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0
    print("usage: cassandra_server.py fetch | check | run [--auth]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
