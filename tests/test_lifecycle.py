"""Reader lifecycle: threads, use after close, fork, and no fd/RSS growth.

Anything that could hang runs in a subprocess with a timeout, so a hang fails
the test instead of stalling CI.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fastread
from conftest import available_engines


@pytest.fixture(scope="module")
def tree(class_tree):
    return class_tree("lifecycle-tree", [30] * 4, seed=13, max_size=5000)


def run_py(code, timeout=60, env=None):
    """Runs code in a fresh interpreter; a hang becomes a failed test."""
    full_env = dict(os.environ, **(env or {}))
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout}s: stdout={e.stdout!r} stderr={e.stderr!r}")


def epoch_bytes(reader):
    return [x.tobytes() for a, _ in reader for x in a]


@pytest.mark.parametrize("engine", available_engines())
def test_four_threads_on_one_reader_get_data_or_a_clear_error(tree, engine):
    root, content = tree
    paths, _ = fastread.scan(root)
    expected = [content[p] for p in paths]
    outcomes = []
    with fastread.Reader(root, batch_size=8, engine=engine, workers=2) as r:
        start = threading.Barrier(4)

        def work():
            start.wait()
            for _ in range(5):
                try:
                    got = epoch_bytes(r)
                except RuntimeError as e:
                    assert "one thread at a time" in str(e)
                    outcomes.append("refused")
                    continue
                # An epoch a thread completes is whole and exact.
                outcomes.append("ok" if got == expected else "WRONG")

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert outcomes.count("ok") + outcomes.count("refused") == 20, outcomes
        assert "ok" in outcomes
        # The reader is still sound after the contention.
        assert epoch_bytes(r) == expected


def test_iterator_started_in_one_thread_may_be_consumed_in_another(tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    got = []
    with fastread.Reader(root, batch_size=16) as r:
        it = iter(r)
        t = threading.Thread(target=lambda: got.extend(x.tobytes() for a, _ in it for x in a))
        t.start()
        t.join(timeout=60)
        assert not t.is_alive()
        assert got == [content[p] for p in paths]
        # The epoch is over, so another thread may start the next one.
        t = threading.Thread(target=lambda: got.extend(epoch_bytes(r)))
        t.start()
        t.join(timeout=60)
        assert len(got) == 2 * len(paths)


def test_other_thread_cannot_steal_an_unfinished_epoch(tree):
    root, _ = tree
    with fastread.Reader(root, batch_size=16) as r:
        it = iter(r)
        next(it)
        err = []

        def other():
            try:
                iter(r)
            except RuntimeError as e:
                err.append(str(e))
        t = threading.Thread(target=other)
        t.start()
        t.join(timeout=30)
        assert err and "another thread is iterating" in err[0]
        next(it)  # the owner's epoch goes on
        del it  # dropping the iterator ends its epoch: anyone may start one
        t = threading.Thread(target=lambda: err.append(len(epoch_bytes(r))))
        t.start()
        t.join(timeout=30)
        assert err[-1] == 120


def test_two_iterators_in_one_thread_the_newer_wins(tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    with fastread.Reader(root, batch_size=16) as r:
        first = iter(r)
        next(first)
        second = iter(r)
        assert [x.tobytes() for a, _ in second for x in a] == [content[p] for p in paths]
        with pytest.raises(StopIteration):
            next(first)


def test_use_after_close_and_double_close(tree):
    root, _ = tree
    r = fastread.Reader(root, batch_size=16)
    it = iter(r)
    a, _ = next(it)
    r.close()
    r.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        next(it)
    with pytest.raises(ValueError, match="closed"):
        iter(r)
    with pytest.raises(ValueError, match="closed"):
        r.memory()
    assert len(a) == 16 and all(x.dtype == np.uint8 for x in a)  # still valid
    with r:  # entering a closed reader and leaving it again is harmless
        pass


def test_close_from_another_thread_waits_for_the_batch_being_read(tree):
    root, _ = tree
    r = fastread.Reader(root, batch_size=4, prefetch=1)
    it = iter(r)
    closer = threading.Thread(target=r.close)
    next(it)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive()
    with pytest.raises(ValueError, match="closed"):
        next(it)


def test_fork_child_gets_a_clear_error_and_can_build_its_own(tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    code = f"""
        import os, sys, fastread
        r = fastread.Reader({root!r}, batch_size=16, workers=2, prefetch=2)
        it = iter(r)
        next(it)  # native threads are busy reading ahead
        pid = os.fork()
        if pid == 0:
            try:
                try:
                    iter(r)
                    os._exit(3)
                except RuntimeError as e:
                    assert "fork" in str(e), e
                try:
                    next(it)
                    os._exit(4)
                except RuntimeError as e:
                    assert "fork" in str(e), e
                r.close()  # harmless in the child
                with fastread.Reader({root!r}, batch_size=16) as mine:
                    n = sum(len(a) for a, _ in mine)
                os._exit(0 if n == {len(paths)} else 5)
            except BaseException as e:
                print("child:", repr(e), file=sys.stderr)
                os._exit(6)
        _, status = os.waitpid(pid, 0)
        rest = sum(len(a) for a, _ in it)  # the parent's epoch is untouched
        r.close()
        print(os.waitstatus_to_exitcode(status), rest)
    """
    p = run_py(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", str(len(paths) - 16)], p.stderr


def test_read_files_in_a_fork_child_opens_its_own_context(tree):
    """read_files() keeps one context per thread; a fork()ed child must not
    use the parent's (its helper threads stayed in the parent), and finds
    out without a getpid() per call (os.register_at_fork clears the cache)."""
    root, content = tree
    paths, _ = fastread.scan(root)
    code = f"""
        import os, sys, fastread
        paths = {paths[:16]!r}
        want = [open(p, "rb").read() for p in paths]
        assert [a.tobytes() for a in fastread.read_files(paths)] == want
        pid = os.fork()
        if pid == 0:
            try:
                ok = [a.tobytes() for a in fastread.read_files(paths)] == want
                os._exit(0 if ok else 5)
            except BaseException as e:
                print("child:", repr(e), file=sys.stderr)
                os._exit(6)
        _, status = os.waitpid(pid, 0)
        again = [a.tobytes() for a in fastread.read_files(paths)] == want
        print(os.waitstatus_to_exitcode(status), again)
    """
    p = run_py(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "True"], p.stderr


def _fds():
    """This process's descriptors: {fd: what it refers to}."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


def _new_fds(before):
    """A message naming the descriptors opened since `before` (a _fds())."""
    now = _fds()
    added = sorted({t for fd, t in now.items() if before.get(fd) != t})
    return f"{len(now) - len(before)} more descriptors, e.g. {added[:10]}"


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("engine", available_engines())
def test_no_fd_or_rss_growth_over_open_close_cycles_and_epochs(tree, engine):
    root, _ = tree
    paths, _ = fastread.scan(root)

    def cycle():
        with fastread.Reader(root, batch_size=32, engine=engine, workers=2) as r:
            assert sum(len(a) for a, _ in r) == len(paths)

    for _ in range(20):  # warm up allocator arenas and caches
        cycle()
    fds, rss = _fds(), _rss_kib()
    for _ in range(200):
        cycle()
    assert len(_fds()) == len(fds), _new_fds(fds)
    grown = _rss_kib() - rss
    assert grown < 16 * 1024, f"RSS grew by {grown} KiB over 200 open/close cycles"

    # cufile keeps registered file handles (open descriptors) in a bounded
    # cache per worker context, across epochs by design (engine_cufile.c).
    # With the default bound (4096) and 8 workers the caches fill over many
    # epochs, each worker meeting new files in its batches (4 batches an
    # epoch here); with 2 workers and a bound of 8 every cache is full after
    # the warm-up, so any growth after it is a leak.
    opts = {"engine_args": "handles=8", "workers": 2} if engine == "cufile" else {}
    with fastread.Reader(root, batch_size=32, engine=engine, **opts) as r:
        for _ in range(3):
            epoch_bytes(r)
        fds, rss = _fds(), _rss_kib()
        for _ in range(20):
            epoch_bytes(r)
        assert len(_fds()) == len(fds), _new_fds(fds)
        grown = _rss_kib() - rss
        assert grown < 8 * 1024, f"RSS grew by {grown} KiB over 20 epochs"


_CUT_CHILD = """
import sys
import numpy as np
import fastread
from fastread.formats import MultiFileRanges
root, probe = sys.argv[1], sys.argv[2]
if probe == "engines":
    fastread.engines()
elif probe == "reader":
    with fastread.Reader(root, batch_size=64, engine="io_uring", workers=2) as r:
        for _ in r:
            pass
else:
    paths, _ = fastread.scan(root)
    src = MultiFileRanges.from_columns(paths, np.arange(len(paths), dtype=np.uint32),
                                       np.zeros(len(paths), np.uint64),
                                       np.ones(len(paths), np.uint64))
    with fastread.Reader(source=src, batch_size=64, engine="io_uring", workers=2) as r:
        for _ in r:
            pass
sys.stderr.write("ready\\n")
sys.stderr.flush()
print("x" * 86403)
"""


@pytest.mark.parametrize("probe", ["engines", "reader", "table_reader"])
def test_io_uring_probes_leave_the_callers_next_blocking_write_whole(tree, probe):
    """A thread that sets up an io_uring ring is on that ring's task list,
    and the kernel's teardown of the ring, asynchronous and tens of ms after
    it is closed, interrupts whatever blocking call the thread is in then,
    as a signal would: a write into a full pipe returns short, and with
    PYTHONUNBUFFERED=1 print() drops the rest. That was test_limits' child
    stdout cut at 64 KiB + a newline with exit status 0 (about 1 run in 10): its
    Reader probed io_uring on the main thread, which then printed 86 KB.
    Probes now set their rings up on a thread of their own. Here the parent
    reads the child's stdout only 0.3 s after the child starts printing, so
    the print blocks on a full pipe while the teardown runs."""
    if fastread.engines()["io_uring"].files is not True:
        pytest.skip(f"io_uring: {fastread.engines()['io_uring'].files}")
    root, _ = tree
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-c", _CUT_CHILD, root, probe], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    try:
        lines = []
        while not lines or lines[-1] not in (b"ready\n", b""):
            lines.append(p.stderr.readline())
        time.sleep(0.3)
        out = p.stdout.read()
        err = p.stderr.read()
        assert p.wait(timeout=60) == 0, (b"".join(lines) + err)[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
    assert len(out) == 86404, f"stdout cut at {len(out)} bytes"
