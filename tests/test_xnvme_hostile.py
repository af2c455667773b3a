"""The xNVMe engines against hostile paths, faults and limits, on the real
libxnvme fastread was built with: paths past xNVMe's 383-byte URIs (read by
pread or through /proc/self/fd aliases) and past PATH_MAX, special files,
faults injected into the libc calls xNVMe's psync path makes (the
LD_PRELOAD shim of test_faults.py), and RLIMIT_NOFILE 64. Each case that
could hang runs in a fresh interpreter with a timeout. Skipped, with the
reason, where fastread was built without libxnvme."""
import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastread
from fastread.engine import xnvme_version

from conftest import fault_tree

_ver, _why = xnvme_version()
pytestmark = pytest.mark.skipif(_ver is None, reason=f"xNVMe engines: {_why}")
TIMEOUT = 120


def run_py(code, *, env=None, args=(), nofile=None, timeout=TIMEOUT):
    """Runs `code` in a fresh interpreter; returns the JSON of its last line."""
    def pre():
        if nofile is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    try:
        p = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code), *args],
                           env=env, preexec_fn=pre, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout}s: {e.stderr!r}")
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def deep_file(root, length, data, name="f.jpg"):
    """Writes `data` to a file whose path is at least `length` bytes, made
    through descriptors (mkdir, open relative to the parent) so paths past
    PATH_MAX can be made too. Returns the path (a str)."""
    path, fd = root, os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while len(os.path.join(path, name)) < length:
            part = "d" * min(200, max(1, length - len(os.path.join(path, name)) - 1))
            os.mkdir(part, dir_fd=fd)
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, path = nfd, os.path.join(path, part)
        f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
        try:
            os.write(f, data)
        finally:
            os.close(f)
    finally:
        os.close(fd)
    return os.path.join(path, name)


# -- paths -------------------------------------------------------------------------
@pytest.mark.parametrize("xasync", ["emu", "thrpool"])
@pytest.mark.parametrize("length", [384, 700, 3900])
def test_xnvme_file_reads_paths_longer_than_xnvme_uris(tmp_path, length, xasync):
    p = deep_file(str(tmp_path), length, b"long path bytes " + bytes(range(256)))
    assert len(p) >= length
    ctx = fastread.open_context("xnvme-file", xnvme_async=xasync)
    try:
        got = ctx.read([p, p]).arrays()
        assert [a.tobytes() for a in got] == [b"long path bytes " + bytes(range(256))] * 2
        assert ctx.stat("path_fallbacks") == 2  # read with pread, not refused by xNVMe
    finally:
        ctx.close()


@pytest.mark.parametrize("xasync", ["emu", "io_uring", "thrpool"])
@pytest.mark.parametrize("length", [384, 700, 3900])
def test_xnvme_ranges_of_an_image_behind_a_long_path(tmp_path, length, xasync):
    if xasync == "io_uring":
        from test_xnvme import _need
        _need("xnvme", xasync)
    data = np.random.default_rng(length).integers(0, 256, (1 << 20) + 333, np.uint8).tobytes()
    img = deep_file(str(tmp_path), length, data, "image.bin")
    assert len(img) >= length
    ctx = fastread.open_context("xnvme", xnvme_async=xasync)
    try:
        offs, lens = [0, 5, len(data) - 7, 4096], [len(data), 70000, 100, 1]
        got = ctx.read_ranges(img, offs, lens).arrays()  # opened through /proc/self/fd/N
        assert [a.tobytes() for a in got] == [data[o:o + n] for o, n in zip(offs, lens)]
        assert ctx.read_ranges(img, [1], [10]).arrays()[0].tobytes() == data[1:11]
        assert ctx.stat("reopens") == 0  # the alias is kept with the device
    finally:
        ctx.close()


def test_paths_past_path_max_fail_per_sample_with_enametoolong(tmp_path):
    p = deep_file(str(tmp_path), 4200, b"unreachable by name")
    good = str(tmp_path / "good.jpg")
    with open(good, "wb") as f:
        f.write(b"good")
    assert len(p) > 4096
    res, _ = run_py(f"""
        import errno, json, os, fastread
        out = {{}}
        try:
            fastread.read_files([{good!r}, {p!r}], engine="xnvme-file")
            out["xnvme-file"] = "ok"
        except fastread.ReadError as e:
            out["xnvme-file"] = [e.errno, os.fsdecode(e.filename),
                                 [os.fsdecode(q) for q, _ in e.failures]]
        ctx = fastread.open_context("xnvme")
        out["xnvme"] = ctx.read_ranges({p!r}, [0, 3], [5, 5]).lengths().tolist()
        ctx.close()
        print(json.dumps(out))
    """)
    assert res["xnvme-file"] == [errno.ENAMETOOLONG, p, [p]]
    assert res["xnvme"] == [-errno.ENAMETOOLONG] * 2


@pytest.mark.parametrize("engine", ["xnvme-file", "xnvme"])
def test_special_files_never_block(tmp_path, engine):
    fifo = str(tmp_path / "fifo.jpg")
    os.mkfifo(fifo)
    sock = str(tmp_path / "sock.jpg")
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    try:
        res, _ = run_py(f"""
            import json, os, fastread
            out = []
            for p in [{fifo!r}, {sock!r}, "/dev/zero", {str(tmp_path)!r}, "/dev/null"]:
                if {engine!r} == "xnvme":
                    ctx = fastread.open_context("xnvme")
                    out.append([p, ctx.read_ranges(p, [0], [10]).lengths().tolist()[0]])
                    ctx.close()
                    continue
                try:
                    fastread.read_files([p], engine="xnvme-file")
                    out.append([p, "ok"])
                except fastread.ReadError as e:
                    out.append([p, -e.errno])
            print(json.dumps(out))
        """, timeout=60)
    finally:
        s.close()
    got = dict(res)
    assert got[fifo] == -errno.EINVAL and got[sock] == -errno.EINVAL
    assert got[str(tmp_path)] == -errno.EISDIR
    # /dev/zero and /dev/null are character devices but not NVMe namespaces:
    # never read forever, never empty ranges passed off as data
    if engine == "xnvme":
        assert got["/dev/zero"] == got["/dev/null"] == -errno.ENODEV
    else:
        assert got["/dev/zero"] == got["/dev/null"] == -errno.EINVAL


# -- faults in the libc calls of xNVMe's psync path ---------------------------------
@pytest.fixture()
def files(tmp_path):
    return fault_tree(tmp_path, 3 << 20)


FAULT_SCRIPT = """
import json, os, sys, fastread
paths, engine_args = json.loads(sys.argv[1]), sys.argv[2]
def attempt():
    try:
        got = fastread.read_files(paths, engine="xnvme-file", threads=2,
                                  engine_args=engine_args)
        return ["ok", [a.tobytes().hex() for a in got]]
    except fastread.ReadError as e:
        return ["err", e.errno, os.fsdecode(e.filename),
                sorted(os.fsdecode(p) for p, _ in e.failures)]
first = attempt()
if sys.argv[3] == "heal":
    os.environ["FR_FAULT_OP"] = "none"  # the shim reads it at every call
print(json.dumps([first, attempt()]))
"""


def run_fault(shim, paths, engine_args, op, mode, count, stall_ms=100, heal=False):
    """Two read_files calls in one process under the fault shim; with `heal`
    the faults stop after the first."""
    env = dict(os.environ, LD_PRELOAD=shim, FR_FAULT_PATH="victim", FR_FAULT_OP=op,
               FR_FAULT_MODE=mode, FR_FAULT_COUNT=str(count), FR_FAULT_STALL_MS=str(stall_ms))
    res, _ = run_py(FAULT_SCRIPT, env=env,
                    args=(json.dumps(paths), engine_args, "heal" if heal else "keep"))
    return res


def exact(paths):
    return ["ok", [open(p, "rb").read().hex() for p in paths]]


# emu and thrpool read through psync's pread (libc: the shim reaches it);
# queue=0 reads synchronously. xNVMe's own open goes through libc open too.
STACKS = ["async=emu", "async=thrpool", "queue=0"]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("op", ["open", "read"])
def test_one_eio_is_read_again_by_the_repair_path(shim, files, stack, op):
    # xNVMe's failed open or read goes to fr_read_whole, which reads the
    # file again (and would name its errno): one EIO costs nothing
    first, second = run_fault(shim, files, stack, op, "eio", 1)
    assert first == exact(files) and second == exact(files)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("op", ["open", "read"])
def test_lasting_eio_fails_that_sample_only(shim, files, stack, op):
    first, second = run_fault(shim, files, stack, op, "eio", -1)
    for r in (first, second):
        assert r == ["err", errno.EIO, files[1], [files[1]]], r


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("op", ["open", "read"])
def test_eio_then_the_next_batch_is_exact(shim, files, stack, op):
    first, second = run_fault(shim, files, stack, op, "eio", -1, heal=True)
    assert first == ["err", errno.EIO, files[1], [files[1]]], first
    assert second == exact(files)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("op,mode", [("open", "eintr"), ("read", "eintr"), ("read", "eagain"),
                                     ("read", "short"), ("read", "stall")])
def test_retryable_faults_give_exact_bytes(shim, files, stack, op, mode):
    first, second = run_fault(shim, files, stack, op, mode, 3)
    assert first == exact(files) and second == exact(files)


@pytest.mark.parametrize("stack", STACKS)
def test_every_read_short_still_exact(shim, files, stack):
    first, second = run_fault(shim, files, stack, "read", "short", -1)
    assert first == exact(files) and second == exact(files)


@pytest.mark.parametrize("stack", ["async=emu", "queue=0"])
@pytest.mark.parametrize("op,mode", [("open", "eintr"), ("read", "eintr"), ("read", "eagain")])
def test_endless_retryable_faults_are_an_error_not_a_hang(shim, files, stack, op, mode):
    first, second = run_fault(shim, files, stack, op, mode, -1)
    for r in (first, second):
        assert r[0] == "err" and r[2] == files[1] and r[3] == [files[1]], r


# -- limits ------------------------------------------------------------------------
@pytest.mark.parametrize("xasync", ["emu", "io_uring", "thrpool"])
def test_xnvme_file_under_rlimit_nofile_64(tmp_path, xasync):
    if xasync == "io_uring":
        from test_xnvme import _need
        _need("xnvme-file", xasync)
    root = tmp_path / "many"
    paths = []
    for c in range(4):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(100):
            p = root / f"c{c}" / f"{j:03d}.jpg"
            p.write_bytes(bytes([(c + j) % 256]) * (100 + j * 37))
            paths.append(str(p))
    res, err = run_py(f"""
        import json, fastread
        out = []
        with fastread.Reader({str(root)!r}, batch_size=256, engine="xnvme-file", workers=2,
                             xnvme_async={xasync!r}) as r:
            for _ in range(2):
                out.append([a.tobytes().hex() for arrays, _ in r for a in arrays])
            order = r.paths
        print(json.dumps([order, out]))
    """, nofile=64)
    order, out = res
    want = [open(p, "rb").read().hex() for p in order]
    assert out == [want, want]
    assert "RLIMIT_NOFILE" in err  # the warning says why it may be slower
