"""read_files: byte equality per engine, buffered and O_DIRECT, and errors."""
import errno
import os
import stat

import numpy as np
import pytest

import fastread
from conftest import EDGE_SIZES, available_engines, engine_params


@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "o_direct"])
@pytest.mark.parametrize("engine", engine_params())
def test_bytes_equal_plain_reads(engine, o_direct, edge_tree):
    _, content = edge_tree
    paths = sorted(content) * 3  # repeated paths and more files than a queue
    arrays = fastread.read_files(paths, engine=engine, o_direct=o_direct, queue_depth=8)
    assert len(arrays) == len(paths)
    for p, a in zip(paths, arrays):
        assert a.dtype == np.uint8 and a.ndim == 1
        assert a.tobytes() == content[p], p


@pytest.mark.parametrize("engine", engine_params())
def test_engine_options_change_nothing_observable(engine, edge_tree):
    _, content = edge_tree
    paths = sorted(content)
    for opts in ({"register_buffers": False}, {"register_files": False},
                 {"queue_depth": 1}, {"threads": 1}, {"direct_alignment": 512, "o_direct": True}):
        arrays = fastread.read_files(paths, engine=engine, **opts)
        assert [a.tobytes() for a in arrays] == [content[p] for p in paths], opts


def test_empty_file_is_empty_array(edge_tree):
    _, content = edge_tree
    empty = [p for p, d in content.items() if not d]
    for a in fastread.read_files(empty):
        assert a.shape == (0,) and a.dtype == np.uint8


def test_views_outlive_each_other_and_the_context(edge_tree):
    _, content = edge_tree
    paths = sorted(content)
    ctx = fastread.open_context("psync")
    arrays = ctx.read(paths).arrays()
    ctx.close()
    del ctx
    keep = arrays[8]
    del arrays
    # Later reads must not overwrite memory a live view points into.
    for _ in range(5):
        fastread.read_files(paths)
    assert keep.tobytes() == content[paths[8]]


@pytest.mark.parametrize("engine", engine_params())
def test_errors_name_the_path(engine, edge_tree, tmp_path):
    _, content = edge_tree
    good = sorted(content)[3]
    missing = str(tmp_path / "missing.jpg")
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files([good, missing, good], engine=engine)
    assert e.value.filename == missing and e.value.errno == errno.ENOENT
    assert missing in str(e.value)
    assert isinstance(e.value, OSError)

    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files([str(tmp_path)], engine=engine)
    assert e.value.errno == errno.EISDIR and e.value.filename == str(tmp_path)

    both = [missing, str(tmp_path)]
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files(both, engine=engine)
    assert [p for p, _ in e.value.failures] == both


@pytest.mark.parametrize("engine", engine_params())
def test_unreadable_file(engine):
    import contextlib
    import tempfile
    d = tempfile.mkdtemp(prefix="fastread-perm-", dir="/var/tmp")
    os.chmod(d, 0o755)
    p = os.path.join(d, "secret.jpg")
    with open(p, "wb") as f:
        f.write(b"x" * 100)
    os.chmod(p, 0)

    @contextlib.contextmanager
    def unprivileged():
        # Root reads anything: act as 'nobody' for the duration of the read.
        if os.geteuid() != 0:
            yield
            return
        os.seteuid(65534)
        try:
            yield
        finally:
            os.seteuid(0)

    try:
        with unprivileged(), pytest.raises(fastread.ReadError) as e:
            fastread.read_files([p], engine=engine, register_buffers=False)
        assert e.value.errno == errno.EACCES and e.value.filename == p
    finally:
        os.chmod(p, 0o644)
        os.remove(p)
        os.rmdir(d)


def test_unreadable_file_via_fifo(tmp_path):
    # Works as root too: a FIFO is no regular file and must not block.
    p = tmp_path / "pipe.jpg"
    os.mkfifo(p)
    for engine in [e for e, st in fastread.engines().items() if st.files is True]:
        with pytest.raises(fastread.ReadError) as e:
            fastread.read_files([str(p)], engine=engine)
        assert e.value.filename == str(p)
    assert stat.S_ISFIFO(os.stat(p).st_mode)


def test_unknown_engine_lists_available():
    with pytest.raises(ValueError) as e:
        fastread.read_files(["x"], engine="warp-drive")
    msg = str(e.value)
    assert "warp-drive" in msg and "psync" in msg


def test_bad_engine_option_named():
    with pytest.raises(TypeError, match="queue_dept"):
        fastread.read_files(["x"], queue_dept=4)
    with pytest.raises(ValueError, match="direct_alignment"):
        fastread.read_files(["x"], engine="psync", direct_alignment=1000)
    with pytest.raises(ValueError, match="queue_depth"):
        fastread.read_files(["x"], queue_depth=0)


def test_nul_in_path_rejected():
    with pytest.raises(ValueError, match="NUL"):
        fastread.read_files(["a\0b"])


def test_engines_reports_reasons():
    avail = fastread.engines()
    assert avail["psync"].files is True and avail["psync"].ranges is True
    for name, st in avail.items():  # one shape: each answer True, or why not
        assert isinstance(st, fastread.EngineStatus), name
        for ok in (st.files, st.ranges):
            assert ok is True or (isinstance(ok, str) and ok), name
        assert st.why == (None if st.files is True and st.ranges is True
                          else next(v for v in (st.files, st.ranges) if v is not True))
        with pytest.raises(TypeError, match="files or"):
            bool(st)


def test_env_default_engine(monkeypatch, edge_tree):
    _, content = edge_tree
    monkeypatch.setenv("FASTREAD_ENGINE", "psync")
    from fastread.engine import resolve
    assert resolve(None) == "psync"
    monkeypatch.setenv("FASTREAD_QUEUE_DEPTH", "zero")
    with pytest.raises(ValueError, match="FASTREAD_QUEUE_DEPTH"):
        fastread.read_files(sorted(content)[:1])


def test_file_grown_after_sizing_is_not_truncated(tmp_path):
    # A file bigger than anything seen before must come back whole.
    big = tmp_path / "big.jpg"
    data = np.random.default_rng(0).integers(0, 256, 9 << 20, dtype=np.uint8).tobytes()
    big.write_bytes(data)
    for engine in [e for e, st in fastread.engines().items() if st.files is True]:
        (a,) = fastread.read_files([str(big)], engine=engine)
        assert a.tobytes() == data


def test_sizes_fixture_is_complete():
    assert 0 in EDGE_SIZES and max(EDGE_SIZES) > 2 << 20


def test_path_types_read_the_same_file(tmp_path):
    """str, bytes, PathLike and a name that is no valid UTF-8 (a str with
    surrogateescape, as os.listdir gives it) all name the same file."""
    import pathlib
    raw = os.fsencode(str(tmp_path)) + b"/name-\xff-\xe9.bin"
    with open(raw, "wb") as f:
        f.write(b"payload")
    as_str = os.fsdecode(raw)
    arrays = fastread.read_files([raw, as_str, pathlib.Path(as_str)])
    assert [a.tobytes() for a in arrays] == [b"payload"] * 3


def test_context_counts_calls_and_their_time(edge_tree):
    """fr_ctx_stat's file_calls / file_call_ns: one call each read_files(),
    its wall time inside the native call (what bench/engines/engines.py sets against
    the whole call as Python sees it)."""
    from fastread.files import _context
    _, content = edge_tree
    paths = sorted(content)
    ctx = _context("psync", None, {"queue_depth": 4}, len(paths))
    calls, ns = ctx.stat("file_calls"), ctx.stat("file_call_ns")
    for _ in range(3):
        fastread.read_files(paths, engine="psync", queue_depth=4)
    assert ctx.stat("file_calls") == calls + 3
    assert ctx.stat("file_call_ns") > ns


def test_path_of_wrong_type_is_a_type_error():
    with pytest.raises(TypeError):
        fastread.read_files([3])


def test_context_lookup_follows_arguments_and_environment(monkeypatch, edge_tree):
    """read_files() looks its context up by its own arguments before checking
    them: the same settings given again (as keywords, a mapping or an
    EngineOptions) reuse one context, other settings or another FASTREAD_*
    environment get theirs, and bad settings fail at every call."""
    from fastread.files import _context
    _, content = edge_tree
    paths = sorted(content)
    a = _context("psync", None, {"queue_depth": 8}, 1)
    assert _context("psync", None, {"queue_depth": 8}, 1) is a
    assert _context("psync", {"queue_depth": 8}, {}, 1) is a
    assert _context("psync", fastread.EngineOptions(queue_depth=8), {}, 1) is a
    assert _context("psync", None, {"queue_depth": 16}, 1) is not a
    assert a.stat("threads") == min(os.sysconf("SC_NPROCESSORS_ONLN"), 16)  # threads=0
    monkeypatch.setenv("FASTREAD_THREADS", "1")
    b = _context("psync", None, {"queue_depth": 8}, 1)
    assert b is not a and b.stat("threads") == 1
    assert [x.tobytes() for x in fastread.read_files(paths, engine="psync", queue_depth=8)] == \
        [content[p] for p in paths]
    monkeypatch.delenv("FASTREAD_THREADS")
    assert _context("psync", None, {"queue_depth": 8}, 1) is a
    for _ in range(2):
        with pytest.raises(TypeError, match="no_such_option"):
            fastread.read_files(paths, engine="psync", no_such_option=1)
        with pytest.raises(ValueError, match="queue_depth"):
            fastread.read_files(paths, engine="psync", queue_depth=0)


@pytest.mark.parametrize("engine", engine_params())
def test_remembered_sizes_are_hints_only(engine, tmp_path):
    """A second read_files() of a list takes its sizes from the context's
    memory; files that changed since read as they are now."""
    paths = [str(tmp_path / f"f{i}") for i in range(40)]
    for i, p in enumerate(paths):
        with open(p, "wb") as f:
            f.write(bytes([i]) * (100 * i + 1))
    # Three reads: this thread's context may have read large files before
    # (it remembers sizes only after a call of small ones), then it stores,
    # then it uses them.
    for _ in range(3):
        arrays = fastread.read_files(paths, engine=engine)
        assert [a.tobytes() for a in arrays] == [bytes([i]) * (100 * i + 1) for i in range(40)]
    ctx = fastread.files._context(engine, None, {}, len(paths))
    # Only engines that use size hints consult the memory (auto: io_uring
    # for files this small).
    remembers = engine in ("io_uring", "auto", "xnvme-file")
    assert (ctx.stat("remembered_paths") >= 40) == remembers
    calls = ctx.stat("remembered_calls")
    assert (calls >= 1) == remembers
    with open(paths[3], "wb") as f:
        f.write(b"g" * 300_000)  # grew
    with open(paths[4], "wb") as f:
        f.write(b"s")  # shrank
    os.remove(paths[5])
    with pytest.raises(fastread.ReadError) as e:
        fastread.read_files(paths, engine=engine)
    assert e.value.filename == paths[5]
    assert ctx.stat("remembered_calls") == calls + remembers
    del paths[5]
    arrays = fastread.read_files(paths, engine=engine)
    assert arrays[3].tobytes() == b"g" * 300_000 and arrays[4].tobytes() == b"s"
    assert arrays[5].tobytes() == bytes([6]) * 601


def test_remember_sizes_off_and_checked(monkeypatch, tmp_path):
    p = tmp_path / "a"
    p.write_bytes(b"abc")
    monkeypatch.setenv("FASTREAD_REMEMBER_SIZES", "0")
    for _ in range(2):
        assert fastread.read_files([str(p)])[0].tobytes() == b"abc"
    ctx = fastread.files._context("auto", None, {}, 1)
    assert ctx.stat("remembered_paths") == 0 and ctx.stat("remembered_calls") == 0
    monkeypatch.setenv("FASTREAD_REMEMBER_SIZES", "-1")
    with pytest.raises(ValueError, match="FASTREAD_REMEMBER_SIZES"):
        fastread.read_files([str(p)])
    monkeypatch.setenv("FASTREAD_REMEMBER_SIZES", "many")
    with pytest.raises(ValueError, match="FASTREAD_REMEMBER_SIZES"):
        fastread.read_files([str(p)])
    with pytest.raises(ValueError, match="remember_sizes"):
        fastread.Context("psync", remember_sizes=-1)
    if "io_uring" not in available_engines():
        return
    ctx = fastread.Context("io_uring", threads=1, remember_sizes=1)
    q = tmp_path / "b"
    q.write_bytes(b"de")
    for _ in range(2):
        batch = ctx.read([str(p), str(q)])
        assert [a.tobytes() for a in batch.arrays()] == [b"abc", b"de"]
    assert ctx.stat("remembered_paths") == 1  # full at one path
    ctx.close()
    ctx = fastread.Context("psync", threads=1)  # ignores size hints: remembers nothing
    ctx.read([str(p)]).release()
    ctx.read([str(p)]).release()
    assert ctx.stat("remembered_paths") == 0 and ctx.stat("remembered_calls") == 0
    ctx.close()
