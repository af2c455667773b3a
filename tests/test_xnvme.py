"""The xNVMe engines: xnvme-file (whole files) and xnvme (ranges of one device
or image), byte-equal to plain reads with every async engine this machine
runs, buffered and O_DIRECT. Skipped, with the reason, where fastread was
built without libxnvme."""
import errno
import os
import subprocess
import sys

import numpy as np
import pytest

import fastread
from conftest import EDGE_SIZES
from fastread.engine import options, xnvme_version

_built = "xnvme-file" in fastread._core.engine_names()
_ver, _why = xnvme_version()
pytestmark = pytest.mark.skipif(_ver is None, reason=f"xNVMe engines: {_why}")

# Async interfaces of xNVMe's linux backend that can read regular files;
# io_uring_cmd needs NVMe char devices, nil does no I/O (both refused, below).
# A libxnvme may lack some (io_uring and io_uring_cmd without liburing, libaio
# without libaio.h; xNVMe main has no posix stack for files): the engines
# refuse those by name, and their tests skip with that message. emu and
# thrpool are in every build.
ASYNC = ["emu", "io_uring", "posix", "thrpool", "libaio"]
ALWAYS = ("emu", "thrpool")


def _refusal(engine, xasync):
    """None if `engine` reads regular files with async=`xasync` here, else the
    engine's reason (an OSError at open, or ENOTSUP per sample of a file)."""
    try:
        ctx = fastread.open_context(engine, xnvme_async=xasync)
    except OSError as e:
        assert e.errno == errno.ENOTSUP and f"async={xasync}" in str(e) and engine in str(e)
        return str(e)
    try:
        return None if ctx.stat("file_stack") in (0, -1) else (
            f"{engine}: the loaded libxnvme has no stack for regular files with async={xasync}")
    finally:
        ctx.close()


def _need(engine, xasync):
    if _ver is None:
        return
    why = _refusal(engine, xasync)
    assert why is None or xasync not in ALWAYS, why
    if why:
        pytest.skip(why)


def _need_built_in(engine, xasync):
    """Skips, with the engine's message naming the stack (liburing, libaio),
    where the loaded libxnvme was built without async=`xasync`; unlike _need,
    an interface that reads no regular files (io_uring_cmd) is not skipped."""
    if _ver is None:
        return
    try:
        fastread.open_context(engine, xnvme_async=xasync).close()
    except OSError as e:
        if e.errno == errno.ENOTSUP and f"async={xasync} is not in the loaded libxnvme" in str(e):
            assert xasync not in ALWAYS, str(e)
            pytest.skip(str(e))

needs_read_ranges = pytest.mark.skipif(
    not hasattr(fastread.Context, "read_ranges"),
    reason="fastread.Context.read_ranges (the Python range-read binding) is not in this build; "
           "csrc/tests/test_xnvme_ranges.c covers the engine")


def _files(edge_tree, libaio=False):
    _, content = edge_tree
    paths = sorted(content)
    # libaio tears down a queue (one per file) in ~30 ms: fewer files for it
    return (paths[:len(EDGE_SIZES)] if libaio else paths * 2), content


@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "o_direct"])
@pytest.mark.parametrize("xasync", ASYNC)
def test_xnvme_file_bytes_equal(xasync, o_direct, edge_tree):
    _need("xnvme-file", xasync)
    paths, content = _files(edge_tree, libaio=xasync == "libaio")
    arrays = fastread.read_files(paths, engine="xnvme-file", o_direct=o_direct, queue_depth=8,
                                 xnvme_async=xasync)
    assert [a.tobytes() for a in arrays] == [content[p] for p in paths]
    ctx = fastread.open_context("xnvme-file", o_direct=o_direct, xnvme_async=xasync)
    batch = ctx.read(paths)
    assert [a.tobytes() for a in batch.arrays()] == [content[p] for p in paths]
    assert ctx.stat("repairs") == 0  # xNVMe read them, not the plain-read fallback
    assert ctx.stat("o_direct") == int(o_direct)
    ctx.close()


@pytest.mark.parametrize("opts", [{"xnvme_queue": 0}, {"threads": 1}, {"xnvme_inflight": 1},
                                  {"xnvme_qdepth": 2}, {"queue_depth": 1, "threads": 3},
                                  {"engine_args": "async=io_uring,qdepth=4"}], ids=str)
def test_xnvme_file_options(opts, edge_tree):
    if "async=io_uring" in opts.get("engine_args", ""):
        _need("xnvme-file", "io_uring")
    paths, content = _files(edge_tree)
    arrays = fastread.read_files(paths, engine="xnvme-file", **opts)
    assert [a.tobytes() for a in arrays] == [content[p] for p in paths]


def test_imports_without_ld_library_path(tmp_path):
    # pkg-config may have found libxnvme under a prefix of its own (xNVMe's
    # meson install --prefix): the module's RUNPATH names that directory.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([sys.executable, "-c", "import fastread.engine as e; "
                        "print(e.xnvme_version()[0])"], env=env, cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == _ver, r.stderr


def test_xnvme_file_short_and_empty_files(tmp_path):
    for size in (0, 1, 100):
        (tmp_path / f"f{size}").write_bytes(b"x" * size)
    paths = [str(tmp_path / f"f{s}") for s in (0, 1, 100, 0)]
    arrays = fastread.read_files(paths, engine="xnvme-file")
    assert [a.size for a in arrays] == [0, 1, 100, 0]
    assert arrays[0].dtype == np.uint8


def test_xnvme_file_errors(edge_tree, tmp_path):
    _, content = edge_tree
    good = sorted(content)[5]
    missing = str(tmp_path / "missing.jpg")
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files([good, missing], engine="xnvme-file")
    assert e.value.filename == missing and e.value.errno == errno.ENOENT
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files([str(tmp_path)], engine="xnvme-file")
    assert e.value.errno == errno.EISDIR
    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)
    with pytest.raises(fastread.ReadError) as e:  # must not block
        fastread.read_files([str(fifo)], engine="xnvme-file")
    assert e.value.filename == str(fifo)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_xnvme_file_unreadable(tmp_path):
    p = tmp_path / "secret.jpg"
    p.write_bytes(b"abc")
    os.chmod(p, 0)
    try:
        with pytest.raises(fastread.ReadError) as e:
            fastread.read_files([str(p)], engine="xnvme-file")
        assert e.value.errno == errno.EACCES and e.value.filename == str(p)
    finally:
        os.chmod(p, 0o644)


@pytest.mark.parametrize("args", ["sync=nvme", "sync=block", "admin=nvme",
                                  "async=io_uring_cmd"])
def test_xnvme_file_refuses_stacks_for_devices(args, tmp_path):
    # NVMe/block ioctls on a regular file: xNVMe main divides by its zero
    # block size (SIGFPE); refused at open, naming the engine and the key.
    with pytest.raises(OSError, match=f"xnvme-file: {args} cannot read regular files") as e:
        fastread.open_context("xnvme-file", engine_args=args)
    assert e.value.errno == errno.ENOTSUP


@needs_read_ranges
@pytest.mark.parametrize("args", ["sync=nvme", "sync=block", "async=io_uring_cmd"])
def test_xnvme_ranges_refuse_files_with_stacks_for_devices(args, image):
    if args.startswith("async="):
        _need_built_in("xnvme", args[len("async="):])
    path, _ = image
    ctx = fastread.open_context("xnvme", engine_args=args)  # devices could still be read
    try:
        assert ctx.read_ranges(path, [0, 10], [5, 5]).lengths().tolist() == [-errno.ENOTSUP] * 2
    finally:
        ctx.close()


@pytest.mark.parametrize("engine", ["xnvme-file", "xnvme"])
def test_async_nil_is_refused(engine):
    with pytest.raises(ValueError, match="async=nil completes every command without reading"):
        fastread.open_context(engine, xnvme_async="nil")


def test_grown_file_is_read_whole(tmp_path):
    big = tmp_path / "big.jpg"
    data = np.random.default_rng(0).integers(0, 256, 9 << 20, dtype=np.uint8).tobytes()
    big.write_bytes(data)
    for xasync in ("emu", "thrpool"):
        (a,) = fastread.read_files([str(big)], engine="xnvme-file", xnvme_async=xasync)
        assert a.tobytes() == data


def test_options_rejected_with_their_names():
    with pytest.raises(TypeError, match="xnvme_async"):
        options("psync", xnvme_async="io_uring")
    with pytest.raises(TypeError, match="xnvme_bounce"):
        options("xnvme-file", xnvme_bounce=1)
    with pytest.raises(TypeError, match="xnvme_colour"):
        options("xnvme-file", xnvme_colour=1)
    with pytest.raises(ValueError, match="warp"):
        fastread.open_context("xnvme-file", xnvme_async="warp")
    with pytest.raises(ValueError, match="colour"):
        fastread.open_context("xnvme-file", engine_args="colour=blue")
    assert options("xnvme-file", xnvme_async="posix", xnvme_qdepth=8,
                   engine_args="be=linux")["engine_args"] == "be=linux,async=posix,qdepth=8"


def test_engines_and_info_report_xnvme():
    avail = fastread.engines()
    assert avail["xnvme-file"].files is True and avail["xnvme-file"].ranges is True
    assert avail["xnvme"].ranges is True
    assert "read_files is not supported" in avail["xnvme"].files
    assert _ver.startswith("0.") or _ver[0].isdigit()
    from fastread.cli.info import collect
    assert collect()["xnvme"]["version"] == _ver
    with pytest.raises(fastread.ReadError if False else Exception):
        fastread.read_files(["/nonexistent"], engine="xnvme")


# -- the range engine -------------------------------------------------------------
@pytest.fixture(scope="module")
def image(disk_tmp):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (5 << 20) + 777, dtype=np.uint8).tobytes()
    path = os.path.join(disk_tmp, "xnvme-image.bin")
    with open(path, "wb") as f:
        f.write(data)
    return path, data


def _ranges(size):
    rng = np.random.default_rng(3)
    offs = [0, 0, size - 10, size, 4096, 1, (3 << 20) - 7]
    lens = [size, 0, 100, 10, 4096, 1, (2 << 20) + 11]
    offs += rng.integers(0, size, 100).tolist()
    lens += rng.integers(0, 300_000, 100).tolist()
    return np.array(offs, dtype=np.int64), np.array(lens, dtype=np.int64)


@needs_read_ranges
@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "o_direct"])
@pytest.mark.parametrize("xasync", ASYNC)
def test_xnvme_ranges_bytes_equal(xasync, o_direct, image):
    _need("xnvme", xasync)
    path, data = image
    offs, lens = _ranges(len(data))
    ctx = fastread.open_context("xnvme", o_direct=o_direct, xnvme_async=xasync)
    try:
        for _ in range(2):
            arrays = ctx.read_ranges(path, offs, lens).arrays()
            for o, n, a in zip(offs.tolist(), lens.tolist(), arrays):
                assert a.tobytes() == data[o:o + n], (o, n)
    finally:
        ctx.close()


@needs_read_ranges
def test_xnvme_ranges_missing_image(tmp_path):
    ctx = fastread.open_context("xnvme")
    try:
        batch = ctx.read_ranges(str(tmp_path / "nope.img"), [0], [10])
        assert batch.lengths().tolist() == [-errno.ENOENT]
    except fastread.ReadError as e:
        assert e.errno == errno.ENOENT
    finally:
        ctx.close()


@needs_read_ranges
@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "o_direct"])
@pytest.mark.parametrize("xasync", ["io_uring", "emu"])  # emu: where io_uring is not built in
def test_xnvme_file_reads_ranges_through_the_range_engine(xasync, o_direct, image):
    _need("xnvme-file", xasync)
    path, data = image
    offs, lens = _ranges(len(data))
    ctx = fastread.open_context("xnvme-file", o_direct=o_direct, xnvme_async=xasync)
    try:
        arrays = ctx.read_ranges(path, offs, lens).arrays()
        for o, n, a in zip(offs.tolist(), lens.tolist(), arrays):
            assert a.tobytes() == data[o:o + n], (o, n)
    finally:
        ctx.close()


def test_xnvme_file_reports_the_depth_it_reached(tmp_path):
    # peak_files / peak_commands: the most files and commands one thread had
    # in flight (docs/engines.md's per-stack table quotes them). A file of up
    # to 1 MiB is one command; a larger one one command per MiB started.
    small = []
    for i in range(6):
        (tmp_path / f"s{i}").write_bytes(bytes([i]) * 100)
        small.append(str(tmp_path / f"s{i}"))
    big = tmp_path / "big"
    big.write_bytes(b"b" * ((2 << 20) + 5))
    for xasync in ALWAYS:
        ctx = fastread.open_context("xnvme-file", threads=1, xnvme_async=xasync,
                                    xnvme_inflight=3)
        try:
            assert [a.tobytes() for a in ctx.read(small).arrays()] == [
                bytes([i]) * 100 for i in range(6)]
            assert (ctx.stat("peak_files"), ctx.stat("peak_commands")) == (3, 3)
            assert ctx.read([str(big)]).arrays()[0].nbytes == (2 << 20) + 5
            assert ctx.stat("peak_commands") == 3  # 1 MiB, 1 MiB, 6 bytes (one past the end)
        finally:
            ctx.close()
    ctx = fastread.open_context("xnvme-file", xnvme_queue=0)  # synchronous: no queue at all
    try:
        ctx.read(small)
        assert (ctx.stat("peak_files"), ctx.stat("peak_commands")) == (0, 0)
    finally:
        ctx.close()
