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


def test_one_native_reader_reads_every_file(tmp_path):
    """All files through ONE native table reader (not one per file): a
    shuffled epoch holds every sample once with its bytes, batches mixing
    files come whole and in the order asked."""
    paths = _files(tmp_path, count=40, per_file=8)
    src = _source(paths)
    native = src.open_native("psync", fastread.EngineOptions().resolve("psync"), prefetch=2,
                             workers=2)
    try:
        assert isinstance(native, fastread.NativeReader) and native.size == 320
        rng = np.random.default_rng(1)
        batches = [rng.choice(320, size=int(rng.integers(1, 30)), replace=False)
                   for _ in range(30)]
        for b in batches:
            native.submit(b)
        for b in batches:
            got = native.next()
            assert got.indices().tolist() == b.tolist()
            assert [a.tobytes() for a in got.arrays()] == _want(src, b)
            got.release()
        assert native.next() is None
    finally:
        native.close()
    with fastread.Reader(source=src, batch_size=7, random_shuffle=True, seed=3,
                         engine="psync") as r:
        got = sorted(a.tobytes() for arrays, _ in r for a in arrays)
    assert got == sorted(_want(src, np.arange(320)))


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
