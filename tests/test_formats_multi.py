"""MultiFileRanges (fastread.formats._multi): batches over several files stay
whole and in order when a wait is interrupted (KeyboardInterrupt) or a
file's part of a batch fails."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import fastread
from fastread.formats import MultiFileRanges

from conftest import interruptible_child, sigint_storm


def _files(tmp_path, count=3, per_file=8, name=lambda k: f"f{k}"):
    paths = []
    for k in range(count):
        p = tmp_path / name(k)
        p.write_bytes(bytes((k * 64 + j) % 256 for j in range(per_file * 4)))
        paths.append(str(p))
    return paths


def _source(paths, per_file=8):
    return MultiFileRanges([fastread.FileRanges(p, np.arange(per_file) * 4, [4] * per_file)
                            for p in paths])


def _want(src, idx):
    return [a.tobytes() for a in src.read(np.asarray(idx))]


class _FlakyNative:
    """A native reader wrapper that raises ``exc`` from its next ``next()``
    calls as a real NativeReader would: a signal leaves the batch queued
    (``taken`` unchanged), a failed read uses it up (``taken`` + 1)."""

    def __init__(self, native):
        self.native = native
        self.plan = []          # exceptions for the next next() calls; None: pass through
        self.engine = native.engine

    @property
    def taken(self):
        return self.native.taken

    def next(self):
        exc = self.plan.pop(0) if self.plan else None
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        if exc is not None:
            batch = self.native.next()     # used up
            if batch is not None:
                batch.release()
            raise exc
        return self.native.next()

    def next_into(self, out):
        batch = self.next()
        if batch is None:
            return False
        out.append(batch)
        return True

    def __getattr__(self, name):
        return getattr(self.native, name)


def _multi_native(src, engine="psync"):
    opts = fastread.EngineOptions().resolve(engine)
    native = src.open_native(engine, opts, prefetch=2, workers=1)
    native._natives = [_FlakyNative(n) for n in native._natives]
    return native


def test_interrupted_wait_delivers_the_batch_on_the_next_call(tmp_path):
    src = _source(_files(tmp_path))
    native = _multi_native(src)
    try:
        batches = [[0, 9, 17, 1], [16, 8, 2, 10], [23, 15]]
        for b in batches:
            native.submit(np.array(b))
        # The first file's part arrives, the wait for the second is interrupted.
        native._natives[1].plan = [KeyboardInterrupt()]
        with pytest.raises(KeyboardInterrupt):
            native.next()
        assert native.taken == 0 and native.pending == 3
        for b in batches:
            got = native.next()
            assert [a.tobytes() for a in got.arrays()] == _want(src, b)
            assert got.indices().tolist() == b
        assert native.next() is None and native.taken == 3
    finally:
        native.close()


def test_interrupted_again_while_finishing_loses_nothing(tmp_path):
    src = _source(_files(tmp_path))
    native = _multi_native(src)
    try:
        native.submit(np.array([0, 9, 17]))
        native._natives[1].plan = [KeyboardInterrupt()]
        native._natives[2].plan = [KeyboardInterrupt(), KeyboardInterrupt()]
        for _ in range(3):
            with pytest.raises(KeyboardInterrupt):
                native.next()
        got = native.next()
        assert [a.tobytes() for a in got.arrays()] == _want(src, [0, 9, 17])
    finally:
        native.close()


def test_failed_part_fails_its_batch_only(tmp_path):
    """A part that fails uses up its batch: the call raises, taken counts
    it, and the next call returns the next batch whole (the failed batch's
    parts still queued in other files are dropped, not taken for it)."""
    src = _source(_files(tmp_path))
    native = _multi_native(src)
    try:
        native.submit(np.array([0, 9, 17]))
        native.submit(np.array([1, 10, 18]))
        native._natives[1].plan = [OSError(5, "injected")]
        # A signal while dropping the failed batch's last part: nothing lost.
        native._natives[2].plan = [KeyboardInterrupt()]
        with pytest.raises(OSError, match="injected"):
            native.next()
        assert native.taken == 1 and native.pending == 1
        with pytest.raises(KeyboardInterrupt):
            native.next()
        got = native.next()
        assert [a.tobytes() for a in got.arrays()] == _want(src, [1, 10, 18])
        assert native.next() is None
    finally:
        native.close()


def test_reader_epoch_goes_on_after_an_interrupt(tmp_path):
    """Through fastread.Reader: an interrupted batch is the next one
    returned, and the epoch holds every sample exactly once."""
    src = _source(_files(tmp_path))
    with fastread.Reader(source=src, batch_size=5, random_shuffle=True, seed=3,
                         engine="psync") as r:
        want = [b for arrays, _ in r for b in (a.tobytes() for a in arrays)]
        r.set_epoch(0)
        it = iter(r)
        flaky = [_FlakyNative(n) for n in r._native._natives]
        r._native._natives = flaky
        got = [a.tobytes() for a in next(it)[0]]
        # Every file's next wait is interrupted once: the second batch takes
        # up to three calls, some of them after parts of it were taken.
        for f in flaky:
            f.plan = [KeyboardInterrupt()]
        interrupts = 0
        while True:
            try:
                arrays, _ = next(it)
            except KeyboardInterrupt:
                interrupts += 1
                continue
            except StopIteration:
                break
            got += [a.tobytes() for a in arrays]
        assert interrupts >= 1
    assert got == want


def test_sigint_during_a_stalled_part_keeps_the_batch(shim, tmp_path):
    """A real SIGINT while the second file's part of the second batch is
    stalled in pread (tests/faultshim.c): the loop catches
    KeyboardInterrupt, goes on, and gets every batch of the epoch with
    exact bytes (before the fix the interrupted batch and all read ahead
    were dropped, and the epoch ended in RuntimeError)."""
    paths = _files(tmp_path, name=lambda k: "victim" if k == 1 else f"f{k}")
    script = f"""
    import json, os, numpy as np, fastread
    from fastread.formats import MultiFileRanges
    paths = {paths!r}
    src = MultiFileRanges([fastread.FileRanges(p, np.arange(8) * 4, [4] * 8) for p in paths])
    # Unshuffled batches of 5: the second is samples 5..7 of file 0 and 8..9
    # of file 1 ("victim"), whose first read stalls.
    r = fastread.Reader(source=src, batch_size=5, engine="psync", prefetch=1, workers=1)
    print("ready", flush=True)
    got, interrupts = [], 0
    it = iter(r)
    while True:
        try:
            arrays, _ = next(it)
        except StopIteration:
            break
        except KeyboardInterrupt:
            interrupts += 1
            continue
        got.append([a.tobytes().hex() for a in arrays])
    ref = [[a.tobytes().hex() for a in src.read(np.arange(s, min(s + 5, 24)))]
           for s in range(0, 24, 5)]
    print(json.dumps([interrupts, got == ref, len(got)]), flush=True)
    os._exit(0)
    """
    env = dict(os.environ, LD_PRELOAD=shim, FR_FAULT_PATH="victim", FR_FAULT_OP="read",
               FR_FAULT_MODE="stall", FR_FAULT_COUNT="1", FR_FAULT_STALL_MS="3000")
    p = interruptible_child(script, env)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the second batch's part of "victim" is stalled now
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the reader hung after SIGINT")
    assert p.returncode == 0, err
    interrupts, exact, count = json.loads(out.strip().splitlines()[-1])
    assert (interrupts, exact, count) == (1, True, 5), err


def test_sigint_storm_loses_no_part_and_mixes_no_batches(tmp_path):
    """SIGINT every few milliseconds while 300 batches of samples spread
    over four files are taken (each call either returns the batch whole or
    raises KeyboardInterrupt): every batch comes once, in order, with its
    own samples' bytes -- a part taken as a signal came is never lost, nor
    given to the next batch."""
    paths = _files(tmp_path, count=4, per_file=300)
    script = f"""
    import json, os, numpy as np, fastread
    from fastread.formats import MultiFileRanges
    paths = {paths!r}
    src = MultiFileRanges([fastread.FileRanges(p, np.arange(300) * 4, [4] * 300) for p in paths])
    rng = np.random.default_rng(5)
    batches = [rng.choice(1200, size=int(rng.integers(1, 12)), replace=False) for _ in range(300)]
    native = src.open_native("psync", fastread.EngineOptions().resolve("psync"), prefetch=2,
                             workers=2)
    for b in batches:
        native.submit(b)
    got = []
    def body():
        while len(got) < len(batches):
            native.next_into(got)
    interrupts = storm_loop(body)
    exact = all(g.indices().tolist() == b.tolist() and
                [a.tobytes() for a in g.arrays()] == [a.tobytes() for a in src.read(b)]
                for g, b in zip(got, batches))
    print(json.dumps([interrupts, exact, len(got), native.taken, native.next() is None]),
          flush=True)
    os._exit(0)
    """
    (interrupts, exact, count, taken, empty), sent = sigint_storm(script)
    assert (exact, count, taken, empty) == (True, 300, 300, True)
    assert interrupts >= 10, (interrupts, sent)  # the signals did land mid-call


def test_from_columns_reads_what_the_columns_say(tmp_path):
    paths = _files(tmp_path, count=3, per_file=8)
    # Sample i: 4 bytes of file i // 5 at offset 4 * (i % 5) + 2 (not each file's layout).
    file_ids = np.repeat(np.arange(3, dtype=np.uint32), 5)
    offsets = (np.arange(15) % 5) * 4 + 2
    src = MultiFileRanges.from_columns(paths, file_ids, offsets, np.full(15, 4),
                                       names=[f"k{i}" for i in range(15)],
                                       file_names=[f"shard{k}" for k in range(3)])
    assert len(src) == 15 and src.labels.tolist() == list(range(15))
    for i in range(15):
        whole = open(paths[i // 5], "rb").read()
        assert src.read([i])[0].tobytes() == whole[offsets[i]:offsets[i] + 4]
    assert src.sample_name(7) == "shard1[k7]"
    with pytest.raises(ValueError, match="must not decrease"):
        MultiFileRanges.from_columns(paths, [1, 0], [0, 0], [1, 1])
    with pytest.raises(ValueError, match="file_ids must be in 0..2"):
        MultiFileRanges.from_columns(paths, [3], [0], [1])
