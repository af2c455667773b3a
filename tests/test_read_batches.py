"""read_batches: lists of paths read ahead on native threads, yielding
exactly what read_files() returns for each list, in order; buffers valid
after the caller moves on; errors at their list's position; lazy
consumption of the lists; KeyboardInterrupt leaves the list queued; s3://
lists."""
import errno
import os
import signal
import threading
import time

import numpy as np
import pytest

import fastread
from conftest import engine_params, interruptible_child, sigint_storm

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """300 files of 0..20,000 bytes, each starting with its own name (every
    file differs). Returns (paths, {path: bytes})."""
    rng = np.random.default_rng(31)
    root = tmp_path_factory.mktemp("batches")
    content = {}
    for i in range(300):
        p = str(root / f"f{i:03d}.bin")
        data = p.encode() + rng.integers(0, 256, int(rng.integers(0, 20000)),
                                         dtype=np.uint8).tobytes()
        with open(p, "wb") as f:
            f.write(data)
        content[p] = data
    return sorted(content), content


def lists_of(paths, sizes):
    """Consecutive lists of the given lengths, wrapping around `paths`."""
    out, at = [], 0
    for n in sizes:
        out.append([paths[(at + k) % len(paths)] for k in range(n)])
        at += n
    return out


SIZES = [64, 1, 0, 256, 3, 64, 0, 100, 7, 64, 33, 250]


@pytest.mark.parametrize("engine", engine_params())
def test_yields_what_read_files_returns_in_order(engine, tree):
    paths, content = tree
    lists = lists_of(paths, SIZES)
    got = list(fastread.read_batches(lists, engine=engine, queue_depth=8))
    assert len(got) == len(lists)
    for lst, arrays in zip(lists, got):
        want = fastread.read_files(lst, engine=engine) if lst else []
        assert len(arrays) == len(lst)
        for p, a, w in zip(lst, arrays, want):
            assert a.dtype == np.uint8 and a.ndim == 1
            assert a.tobytes() == content[p] == w.tobytes(), p


@pytest.mark.parametrize("workers,prefetch", [(1, 1), (1, 2), (3, 2), (2, 5)])
def test_order_and_bytes_with_several_workers(tree, workers, prefetch):
    paths, content = tree
    lists = lists_of(paths, [5, 40, 1, 64, 2, 17] * 5)
    it = fastread.read_batches(iter(lists), prefetch=prefetch, workers=workers)
    n = 0
    for lst, arrays in zip(lists, it):
        assert [a.tobytes() for a in arrays] == [content[p] for p in lst]
        n += 1
    assert n == len(lists)
    with pytest.raises(StopIteration):
        next(it)


def test_buffers_stay_valid_after_the_caller_moves_on(tree):
    """Arrays of earlier lists, held while many later lists are read (and
    the arenas of the dropped ones reused), keep their bytes; also after
    the iterator is closed and gone."""
    paths, content = tree
    lists = lists_of(paths, [64] * 40)
    it = fastread.read_batches(lists, prefetch=2, workers=1)
    kept = [(lists[0], next(it)), (lists[1], next(it))]
    for k, arrays in enumerate(it, start=2):
        if k == 17:
            kept.append((lists[k], arrays))
        del arrays
    it.close()
    del it
    for lst, arrays in kept:
        assert [a.tobytes() for a in arrays] == [content[p] for p in lst]
    # Views of one list outlive each other.
    lst, arrays = kept[0]
    last = arrays[-1]
    del kept, arrays
    assert last.tobytes() == content[lst[-1]]


def test_arenas_are_reused_once_arrays_are_dropped(tree):
    """A caller that drops each list's arrays before the next keeps the
    number of batches the reader ever allocated bounded (read-ahead plus
    the one held), however many lists go by."""
    paths, _ = tree
    it = fastread.read_batches(lists_of(paths, [32] * 200), prefetch=2, workers=2)
    for arrays in it:
        del arrays
        assert it._native is None or it._native.pool_batches() <= 2 + 2 + 2


def test_reads_the_next_lists_while_the_caller_holds_one(tree):
    """After the first list is taken, the native threads go on reading the
    next prefetch + workers - 1 lists without another call (the caller's
    work overlaps their reading), and pull no more lists than that."""
    paths, _ = tree
    pulled = []

    def lists():
        for k in range(20):
            pulled.append(k)
            yield paths[k * 10:(k + 1) * 10]

    it = fastread.read_batches(lists(), prefetch=3, workers=1)
    assert len(pulled) == 3  # submitted at the call, nothing yielded yet
    first = next(it)
    assert len(first) == 10 and len(pulled) == 4
    deadline = time.monotonic() + 20
    while it._native.stat("file_calls") < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert it._native.stat("file_calls") == 4  # lists 1-3 read while we held list 0
    assert len(pulled) == 4
    rest = list(it)
    assert len(rest) == 19 and len(pulled) == 20


def test_a_second_pass_reads_with_the_sizes_every_worker_learnt(tree):
    """The workers share the sizes of the files they read: on a second pass
    over the same lists every list is read with all its sizes known,
    whichever worker reads it (as a Reader's second epoch), exact bytes."""
    paths, content = tree
    lists = lists_of(paths, [20] * 10)
    it = fastread.read_batches(lists * 2, prefetch=2, workers=3)
    for lst in lists * 2:
        assert [a.tobytes() for a in next(it)] == [content[p] for p in lst]
    assert it._native.stat("hinted_lists") == 10
    assert list(it) == []


def test_a_failed_list_raises_at_its_position_and_iteration_goes_on(tree, tmp_path):
    paths, content = tree
    missing = str(tmp_path / "missing.bin")
    lists = [paths[:3], [paths[3], missing, paths[4]], paths[5:8]]
    it = fastread.read_batches(lists)
    assert [a.tobytes() for a in next(it)] == [content[p] for p in paths[:3]]
    with pytest.raises(fastread.ReadError) as e:
        next(it)
    assert e.value.errno == errno.ENOENT and e.value.filename == missing
    assert missing in str(e.value) and [p for p, _ in e.value.failures] == [missing]
    assert [a.tobytes() for a in next(it)] == [content[p] for p in paths[5:8]]
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.skipif(fastread.engines()["io_uring"].files is not True,
                    reason="io_uring is not available here (fastread.engines() says why)")
@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_a_batch_the_engine_fails_uses_up_its_list_only(tree, prefetch):
    """io_uring's test-only hook fails the first submit: that list raises
    OSError, and every later list still gets its own bytes and its own
    names in errors (each used to pair with the batch before it, and the
    iteration ended in IndexError)."""
    paths, content = tree
    lists = [paths[:2], paths[2:5], [paths[5], paths[5] + ".missing"], paths[6:9]]
    it = fastread.read_batches(lists, prefetch=prefetch, workers=1, engine="io_uring",
                               threads=1,
                               engine_args="fault_mode=eio,fault_op=submit,fault_count=1")
    with pytest.raises(OSError, match="engine 'io_uring' failed a batch") as e:
        next(it)
    assert not isinstance(e.value, fastread.ReadError)
    assert [a.tobytes() for a in next(it)] == [content[p] for p in paths[2:5]]
    with pytest.raises(fastread.ReadError) as e:
        next(it)
    assert e.value.filename == paths[5] + ".missing"
    assert [a.tobytes() for a in next(it)] == [content[p] for p in paths[6:9]]
    with pytest.raises(StopIteration):
        next(it)


def test_errors_name_the_paths_of_their_list_when_the_caller_reuses_one(tree, tmp_path):
    """A caller that refills one list object for every list: an error
    names the path of the list that failed, not of a list pulled later."""
    paths, content = tree
    missing = str(tmp_path / "missing-in-list-0")
    chunks = [[paths[0], missing], paths[1:3], paths[3:5], paths[5:7]]

    def refilled():
        buf = []
        for c in chunks:
            buf[:] = c
            yield buf

    it = fastread.read_batches(refilled(), prefetch=3)
    with pytest.raises(fastread.ReadError) as e:
        next(it)
    assert e.value.filename == missing and [p for p, _ in e.value.failures] == [missing]
    for c in chunks[1:]:
        assert [a.tobytes() for a in next(it)] == [content[p] for p in c]


def test_errors_of_the_lists_come_after_the_lists_before_them(tree):
    paths, content = tree

    def lists():
        yield paths[:2]
        yield paths[2:4]
        raise LookupError("the caller's list source broke")

    it = fastread.read_batches(lists())
    assert len(next(it)) == 2 and len(next(it)) == 2
    with pytest.raises(LookupError, match="source broke"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    # A list that is one path, or holds a path with a NUL byte, likewise.
    it = fastread.read_batches([paths[:1], paths[1], paths[2:3]])
    assert [a.tobytes() for a in next(it)] == [content[paths[0]]]
    with pytest.raises(TypeError, match=r"one path .*pass \[path\]"):
        next(it)
    it = fastread.read_batches([paths[:1], [paths[1] + "\0x"]])
    assert len(next(it)) == 1
    with pytest.raises(ValueError, match="NUL"):
        next(it)
    # The very first list failing says so at the call.
    with pytest.raises(TypeError, match="one path"):
        fastread.read_batches([paths[0]])


def test_empty_lists_and_no_lists(tree):
    paths, content = tree
    assert list(fastread.read_batches([])) == []
    assert list(fastread.read_batches([[], []])) == [[], []]
    got = list(fastread.read_batches([[], paths[:2], [], paths[2:3], []]))
    assert [len(x) for x in got] == [0, 2, 0, 1, 0]
    assert got[3][0].tobytes() == content[paths[2]]
    # Lists given as other iterables (tuples, generators), paths as bytes
    # and PathLike.
    got = list(fastread.read_batches([tuple(paths[:2]), (p for p in paths[2:4]),
                                      [os.fsencode(paths[4])], [__import__("pathlib").Path(paths[5])]]))
    assert [[a.tobytes() for a in x] for x in got] == \
        [[content[p] for p in paths[:2]], [content[p] for p in paths[2:4]], [content[paths[4]]],
         [content[paths[5]]]]


def test_close_and_context_manager(tree):
    paths, content = tree
    with fastread.read_batches(lists_of(paths, [8] * 10)) as it:
        first = next(it)
    with pytest.raises(StopIteration):
        next(it)
    it.close()  # twice is fine
    assert [a.tobytes() for a in first] == [content[p] for p in paths[:8]]
    # Dropped mid-way: the native threads stop (no hang, no warning).
    it = fastread.read_batches(lists_of(paths, [8] * 10))
    next(it)
    del it


def test_bad_arguments_name_them(tree):
    paths, _ = tree
    for bad in (0, -1, 5000, True, "2"):
        with pytest.raises(ValueError, match="prefetch"):
            fastread.read_batches([paths[:1]], prefetch=bad)
    with pytest.raises(ValueError, match="workers"):
        fastread.read_batches([paths[:1]], workers=65)
    with pytest.raises(TypeError, match="unknown engine option"):
        fastread.read_batches([paths[:1]], queue_dept=4)
    with pytest.raises(ValueError, match="unknown engine 'nope'"):
        fastread.read_batches([paths[:1]], engine="nope")


def test_one_thread_at_a_time(tree):
    paths, _ = tree
    it = fastread.read_batches(lists_of(paths, [4] * 5))
    it._inside = -1  # another thread inside next()
    with pytest.raises(RuntimeError, match="another thread"):
        next(it)
    it._inside = None
    # Handing the iterator to another thread is fine.
    out = []
    t = threading.Thread(target=lambda: out.extend(it))
    t.start()
    t.join(60)
    assert len(out) == 5


def test_keyboard_interrupt_while_waiting_leaves_the_list_queued(tree):
    """SIGINT while next() waits for a stalled list (io_uring's test-only
    fault hook holds the victim's completion 3 s) reaches Python at once;
    the next next() returns that same list, exact, then the one after."""
    if fastread.engines()["io_uring"].files is not True:
        pytest.skip(f"io_uring: {fastread.engines()['io_uring'].files}")
    paths, _ = tree
    script = f"""
    import hashlib, time, fastread
    paths = {paths[:6]!r}
    victim = paths[1]
    lists = [paths[:3], paths[3:6]]
    it = fastread.read_batches(lists, engine="io_uring", workers=1,
                               engine_args="fault_mode=stall,fault_path=" + victim.rsplit("/", 1)[1]
                               + ",fault_stall_ms=3000")
    print("ready", flush=True)
    t0 = time.monotonic()
    try:
        next(it)
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted after", round(time.monotonic() - t0, 1), flush=True)
    first = next(it)
    second = next(it)
    ok = [a.tobytes() for a in first + second] == [open(p, "rb").read() for p in paths[:6]]
    print("exact" if ok else "wrong", flush=True)
    """
    p = interruptible_child(script)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    except BaseException:
        p.kill()
        raise
    lines = out.split("\n")
    assert p.returncode == 0 and lines[0].startswith("interrupted after"), (out, err)
    assert float(lines[0].split()[-1]) < 2.5, out  # at once, not after the stall
    assert lines[1] == "exact", (out, err)


def test_fork_child_refuses_the_parents_iterator(tree):
    paths, _ = tree
    it = fastread.read_batches(lists_of(paths, [4] * 6))
    next(it)
    pid = os.fork()
    if pid == 0:  # the child: a clear error, and leaving does not hang
        code = 1
        try:
            next(it)
        except RuntimeError as e:
            code = 0 if "fork" in str(e) else 2
        finally:
            it.close()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(list(it)) == 5


def test_s3_lists(s3_server, s3_engine):
    import random
    rng = random.Random(5)
    s3_server.make_bucket("batches")
    data = {}
    for i in range(120):
        key = f"b/{i:04d}.bin"
        data[key] = rng.randbytes(rng.randrange(0, 9000))
        s3_server.put("batches", key, data[key])
    o = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key)
    keys = sorted(data)
    lists = [[f"s3://batches/{k}" for k in keys[i:i + 16]] for i in range(0, len(keys), 16)]
    it = fastread.read_batches(lists, s3=o)
    for lst, arrays in zip(lists, it):
        assert [a.tobytes() for a in arrays] == [data[u[len("s3://batches/"):]] for u in lst]
    assert it.engine == "s3"
    # A missing object: ReadError naming the URL and S3's answer, then on.
    bad = ["s3://batches/b/0001.bin", "s3://batches/b/missing.bin"]
    it = fastread.read_batches([bad, lists[0]], s3=dict(endpoint_url=s3_server.endpoint,
                                                        region=s3_server.region,
                                                        access_key_id=s3_server.access_key,
                                                        secret_access_key=s3_server.secret_key))
    with pytest.raises(fastread.ReadError) as e:
        next(it)
    assert e.value.errno == errno.ENOENT and e.value.filename == bad[1]
    assert "404" in str(e.value) and s3_server.secret_key not in str(e.value)
    assert len(next(it)) == 16


def test_sigint_storm_loses_no_list(tree):
    """SIGINT every few milliseconds while 400 lists are read: the loop
    catches KeyboardInterrupt and goes on, and gets every list once, in
    order, exact."""
    paths, _ = tree
    script = f"""
    import json, os, fastread
    paths = {paths[:150]!r}
    lists = [[paths[(k * 7 + j) % 150] for j in range(k % 9)] for k in range(400)]
    it = fastread.read_batches(lists, prefetch=2, workers=2, engine="psync")
    got = []
    def body():
        for arrays in it:
            got.append(arrays)
    interrupts = storm_loop(body)
    content = {{p: open(p, "rb").read() for p in paths}}
    exact = len(got) == len(lists) and all(
        [a.tobytes() for a in g] == [content[p] for p in lst] for g, lst in zip(got, lists))
    print(json.dumps([interrupts, exact, len(got)]), flush=True)
    os._exit(0)
    """
    (interrupts, exact, count), sent = sigint_storm(script, seed=1)
    assert (exact, count) == (True, 400)
    assert interrupts >= 10, (interrupts, sent)
