"""engine="auto" chooses io_uring or psync per batch (the C core's
fr_auto_rule), and the helper threads' polling (spin_us): what the rule
says, that an auto context reads the same bytes through either engine, and
that the counters behind `bench/engines/engines.py`'s pool figures add up."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastread
from fastread import _core
from fastread.engine import auto_choice, resolve

needs_uring = pytest.mark.skipif(fastread.engines()["io_uring"].files is not True,
                                 reason=f"io_uring: {fastread.engines()['io_uring'].files}")


def write_tree(root, count, size, seed):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        p = root / f"f{i:03d}.bin"
        p.write_bytes(rng.integers(0, 256, size + i, dtype=np.uint8).tobytes())
        paths.append(str(p))
    return paths


def same_bytes(batch, paths):
    arrays = batch.arrays()
    return all(a.tobytes() == open(p, "rb").read() for a, p in zip(arrays, paths))


def test_rule_matches_the_documented_thresholds():
    big, small = _core.AUTO_MIN_SIZE, _core.AUTO_MIN_SIZE - 1
    cpus = _core.AUTO_MIN_CPUS
    assert _core.auto_rule(big, 1, cpus) == "psync"
    assert _core.auto_rule(small, 1, cpus) == "io_uring"
    assert _core.auto_rule(big, 0, cpus) == "io_uring"
    assert _core.auto_rule(big, -1, cpus) == "io_uring"
    assert _core.auto_rule(big, 1, cpus - 1) == "io_uring"
    assert _core.auto_rule(big, 1, cpus, o_direct=True) == "io_uring"


@needs_uring
def test_auto_context_sends_cached_large_files_to_psync_and_small_ones_to_io_uring(tmp_path):
    (tmp_path / "big").mkdir()
    (tmp_path / "small").mkdir()
    big = write_tree(tmp_path / "big", 10, _core.AUTO_MIN_SIZE + 5000, 1)
    small = write_tree(tmp_path / "small", 10, 3000, 2)
    # auto_engine=2: as on a machine with AUTO_MIN_CPUS CPUs, whatever this one has.
    ctx = _core.Context("io_uring", threads=2, auto_engine=2)
    assert ctx.stat("auto_engine") == 1
    picks = []
    for paths, hints in [(big, None), (big, [os.path.getsize(p) for p in big])] + \
            [(small, None)] * 6:
        b = ctx.read(paths, hints) if hints else ctx.read(paths)
        assert not b.failures() and same_bytes(b, paths)
        b.release()
        picks.append(ctx.stat("auto_last"))
    # Small files 4x or more below the running mean twice in a row: another
    # data set, and the mean starts over (one such batch is an outlier).
    assert picks == [1, 1, 1, 0, 0, 0, 0, 0], picks
    assert ctx.stat("auto_psync_batches") == 3
    assert ctx.stat("auto_uring_batches") == 5
    assert ctx.stat("psync.threads") == 2  # its psync side has the same threads
    ctx.close()


@needs_uring
def test_auto_does_not_flip_on_files_of_mixed_sizes(tmp_path):
    """Batches whose first files alternate around the threshold (the rest
    of the data set above it) stay on one engine: each switch costs the
    other pool's polling helpers' time on 16 cores."""
    lo = write_tree(tmp_path, 1, _core.AUTO_MIN_SIZE // 2, 6)[0]
    (tmp_path / "hi").mkdir()
    hi = write_tree(tmp_path / "hi", 4, _core.AUTO_MIN_SIZE * 2, 7)
    ctx = _core.Context("io_uring", threads=2, auto_engine=2)
    picks = []
    # As many batches as come before the first trial (which times io_uring
    # against psync: see test_auto_times_both_engines_where_the_rule_picks_psync).
    for i in range(_core.AUTO_TRIAL_FIRST):
        paths = ([lo] if i % 3 == 0 else []) + hi
        b = ctx.read(paths)
        assert same_bytes(b, paths)
        b.release()
        picks.append(ctx.stat("auto_last"))
    switches = sum(a != b for a, b in zip(picks, picks[1:]))
    assert switches <= 1 and picks[-1] == 1, picks
    assert ctx.stat("auto_trials") == 0
    ctx.close()


@needs_uring
def test_auto_follows_a_context_onto_another_data_set_within_two_batches(tmp_path):
    (tmp_path / "tiny").mkdir()
    big = write_tree(tmp_path, 4, _core.AUTO_MIN_SIZE * 4, 8)
    tiny = write_tree(tmp_path / "tiny", 4, 2000, 9)
    ctx = _core.Context("io_uring", threads=2, auto_engine=2)
    picks = []
    # Fewer big batches than come before a trial, counting the first tiny
    # one (an outlier, still in psync's band).
    first = _core.AUTO_TRIAL_FIRST - 1
    for paths in [big] * first + [tiny] * 3 + [big] * 3:
        b = ctx.read(paths)
        assert same_bytes(b, paths)
        b.release()
        picks.append(ctx.stat("auto_last"))
    assert picks[:first] == [1] * first and picks[first:first + 3] == [1, 0, 0], picks
    assert picks[first + 3:] == [0, 1, 1], picks
    assert ctx.stat("auto_trials") == 0
    ctx.close()


@needs_uring
def test_auto_times_both_engines_where_the_rule_picks_psync(tmp_path):
    """Cached large files: psync first; after AUTO_TRIAL_FIRST batches a
    trial of AUTO_TRIAL_BATCHES with io_uring; then the engine that read
    faster per byte, and the next trial AUTO_TRIAL_EVERY batches later."""
    big = write_tree(tmp_path, 4, _core.AUTO_MIN_SIZE + 3000, 10)
    ctx = _core.Context("io_uring", threads=2, auto_engine=2)
    picks, kept = [], []
    first, every, trial = _core.AUTO_TRIAL_FIRST, _core.AUTO_TRIAL_EVERY, _core.AUTO_TRIAL_BATCHES
    for _ in range(first + trial + every + trial + 1):
        b = ctx.read(big)
        assert not b.failures() and same_bytes(b, big)
        b.release()
        picks.append(ctx.stat("auto_last"))
        kept.append(ctx.stat("auto_switches"))
    assert picks[:first] == [1] * first, picks
    assert picks[first:first + trial] == [0] * trial, picks
    # One kept engine between the trials: io_uring if the trial switched.
    after = first + trial
    keep = 0 if kept[after - 1] % 2 else 1
    assert picks[after:after + every] == [keep] * every, picks
    assert picks[after + every:after + every + trial] == [1 - keep] * trial, picks
    assert ctx.stat("auto_trials") == 2
    assert ctx.stat("auto_psync_batches") + ctx.stat("auto_uring_batches") == len(picks)
    ctx.close()


@needs_uring
def test_auto_on_this_machine_follows_the_rule(tmp_path):
    paths = write_tree(tmp_path, 8, _core.AUTO_MIN_SIZE + 100, 3)
    ctx = _core.Context("io_uring", threads=2, auto_engine=1)
    b = ctx.read(paths)
    assert same_bytes(b, paths)
    b.release()
    cpus = len(os.sched_getaffinity(0))
    want = _core.auto_rule(_core.AUTO_MIN_SIZE + 100, 1, cpus)
    assert ctx.stat("auto_last") == (1 if want == "psync" else 0)
    ctx.close()


@needs_uring
def test_auto_times_both_engines_on_any_machine(tmp_path):
    """With this machine's CPU count (auto_engine=1): cached large files go
    to the rule's pick for it (io_uring below AUTO_MIN_CPUS) and its first
    trial reads with the other engine, the same bytes either way."""
    big = write_tree(tmp_path, 3, _core.AUTO_MIN_SIZE + 2000, 11)
    cpus = len(os.sched_getaffinity(0))
    first = 1 if _core.auto_rule(_core.AUTO_MIN_SIZE, 1, cpus) == "psync" else 0
    ctx = _core.Context("io_uring", threads=2, auto_engine=1)
    picks = []
    for _ in range(_core.AUTO_TRIAL_FIRST + _core.AUTO_TRIAL_BATCHES):
        b = ctx.read(big)
        assert not b.failures() and same_bytes(b, big)
        b.release()
        picks.append(ctx.stat("auto_last"))
    assert picks == [first] * _core.AUTO_TRIAL_FIRST + [1 - first] * _core.AUTO_TRIAL_BATCHES, picks
    assert ctx.stat("auto_trials") == 1
    ctx.close()


@needs_uring
def test_explicit_engines_and_o_direct_are_never_switched(tmp_path):
    for engine, kw in (("io_uring", {}), ("psync", {"auto_engine": 1}),
                       ("io_uring", {"auto_engine": 1, "o_direct": True})):
        ctx = _core.Context(engine, threads=2, **kw)
        assert ctx.stat("auto_engine") == 0, (engine, kw)
        ctx.close()


@needs_uring
def test_read_files_and_reader_with_auto_get_the_per_batch_choice(tmp_path, monkeypatch):
    paths = write_tree(tmp_path, 6, 2000, 4)
    from fastread.files import _context
    assert _context("auto", None, {}, 6).stat("auto_engine") == 1
    assert _context("io_uring", None, {}, 6).stat("auto_engine") == 0
    monkeypatch.setenv("FASTREAD_ENGINE", "auto")
    assert _context(None, None, {"threads": 3}, 6).stat("auto_engine") == 1
    # resolve() names what the core picks for "auto" (fr_engine_auto).
    assert resolve("auto") == _core.auto_engine()[0] == "io_uring"
    # "auto" reaches the core as it is; the context says what it reads with.
    ctx = _core.Context("auto", threads=2)
    assert ctx.engine == "io_uring" and ctx.stat("auto_engine") == 1 and ctx.auto_fallback == 0
    with fastread.Reader(files=paths, labels=list(range(6)), batch_size=3) as r:
        assert r.engine == "io_uring" and r._native.auto_fallback == 0
        got = [a.tobytes() for arrays, _ in r for a in arrays]
    assert got == [open(p, "rb").read() for p in paths]
    with fastread.Reader(files=paths, labels=list(range(6)), batch_size=3,
                         engine="io_uring") as r:
        assert r.engine == "io_uring"


def test_auto_choice_states_the_rule_and_this_machine():
    engine, why = auto_choice()
    if engine == "io_uring" and fastread.engines()["psync"].files is True:
        assert "per batch" in why and f"{_core.AUTO_MIN_SIZE // 1024} KiB" in why
        assert f"has {len(os.sched_getaffinity(0))} CPUs" in why
    out = subprocess.run([sys.executable, "-m", "fastread.cli", "info"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "auto's rule" in out.stdout and "spin_us" in out.stdout


@pytest.mark.parametrize("engine", ["psync", "io_uring"])
def test_spin_us_reaches_the_pool_and_pool_counters_add_up(tmp_path, engine):
    paths = write_tree(tmp_path, 64, 100, 5)
    cpus = len(os.sched_getaffinity(0))
    for threads in (1, 2, 4):
        for spin in (0, 30):
            ctx = _core.Context(engine, threads=threads, spin_us=spin)
            fits = threads <= cpus
            assert ctx.stat("pool_spin_ns") == (spin * 1000 if fits else 0)
            keys = ("pool_phases", "pool_joins", "pool_skips", "pool_alone")
            before = [ctx.stat(k) for k in keys]  # io_uring's rings are set up in a phase
            for _ in range(5):
                b = ctx.read(paths)
                assert same_bytes(b, paths)
                b.release()
            phases, joins, skips, alone = (ctx.stat(k) - v for k, v in zip(keys, before))
            assert phases >= 5
            helpers = threads - 1  # the caller works (psync) or drives ring 0 (io_uring)
            # each helper joins or skips a phase at most once; alone phases had no helper
            assert joins + skips <= phases * helpers
            assert 0 <= alone <= phases
            if helpers == 0:
                assert joins == 0 and alone == phases
            ctx.close()


def test_spin_us_default_and_environment(monkeypatch):
    from fastread import _defaults
    from fastread.engine import options
    assert options("psync")["spin_us"] == 50
    monkeypatch.setenv("FASTREAD_SPIN_US", "0")
    assert options("psync")["spin_us"] == 0
    with pytest.raises(ValueError, match="spin_us"):
        _core.Context("psync", spin_us=100001)
