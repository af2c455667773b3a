"""The epoch order at any size (fastread._core.Order over the core's
fr_order, fastread.sampling.EpochOrder, the Reader's lazy queueing).

* Order is a bijection of [0, N) for N = 0, 1, 2, primes, powers of two
  and their neighbours, on both sides of the table/network threshold, 10^6
  checked whole and 10^9 sampled; positions, slices and fill agree; it is
  fr_permutation's order (what the native DALI operators draw).
* Sharded and elastic orders: the ranks partition the epoch identically
  whatever rank computes them; an elastic epoch resumed mid-way at another
  world size reads every sample exactly once.
* Block mode: each window of window*block positions holds whole blocks
  (runs of consecutive samples), every sample once.
* Statistics: positions' mean and variance, neighbours' correlation and
  the correlation of consecutive epochs are those of a random permutation
  (a broken key schedule or round function fails them).
* A 10^8-sample epoch's first batch in a subprocess: its RSS grows by a few
  MB, not the 800 MB of an N-element array.
* Reader: reads exactly the EpochOrder (full, block, elastic), queues only
  a bounded number of batches ahead (tracemalloc peak independent of N),
  resumes its state_dict, validates the shuffle options by name.
"""
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import fastread
from fastread._core import ORDER_TABLE_MAX, Order, permutation
from fastread.sampling import (EpochOrder, check_shuffle, elastic_indices, elastic_resume,
                               elastic_state, epoch_indices, global_order)

SIZES = [0, 1, 2, 3, 5, 7, 8, 13, 97, 255, 256, 257, 1000, ORDER_TABLE_MAX - 1, ORDER_TABLE_MAX,
         ORDER_TABLE_MAX + 1, 65539, 131071, 131072, 131073, 262147]


def is_permutation(a, n):
    return len(a) == n and (n == 0 or (a.min() == 0 and np.bincount(a, minlength=n).max() == 1))


@pytest.mark.parametrize("n", SIZES)
def test_full_order_is_a_bijection_and_fr_permutations_order(n):
    o = Order(7, 3, n)
    whole = o.fill(0, n)
    assert is_permutation(whole, n)
    assert np.array_equal(whole, permutation(7, 3, n))  # the DALI operators' order
    assert np.array_equal(o[:], whole)
    if n:
        k = n // 3
        assert np.array_equal(o[k:k + 5], whole[k:k + 5])
        assert o[n - 1] == whole[-1] and o[-1] == whole[-1]
        pos = np.array([0, n - 1, n // 2])
        assert np.array_equal(o.take(pos), whole[pos])
    with pytest.raises(IndexError):
        o.fill(n, 1)
    with pytest.raises(IndexError):
        o.take([n])
    assert o.memory() <= 8 * min(n, ORDER_TABLE_MAX) + 512


def test_million_checked_whole_and_epochs_seeds_differ():
    n = 10 ** 6
    a = Order(1, 0, n).fill(0, n)
    assert is_permutation(a, n)
    assert not np.array_equal(a, Order(1, 1, n).fill(0, n))
    assert not np.array_equal(a, Order(2, 0, n).fill(0, n))
    assert np.array_equal(a, Order(1, 0, n).fill(0, n))
    assert Order(1, 0, n).memory() < 1024  # the network: no table past ORDER_TABLE_MAX


def test_billion_sampled_positions_are_distinct():
    n = 10 ** 9
    o = Order(11, 5, n)
    rng = np.random.default_rng(0)
    stride = n // 200_000
    pos = np.arange(200_000, dtype=np.int64) * stride + rng.integers(0, stride, 200_000)
    got = o.take(pos)
    assert got.min() >= 0 and got.max() < n
    assert len(np.unique(got)) == len(got)
    # A slice at the far end is the same positions asked one by one.
    assert np.array_equal(o.fill(n - 1000, 1000), o.take(np.arange(n - 1000, n)))
    assert o.memory() < 1024


def test_order_arguments_are_checked():
    with pytest.raises(ValueError, match="mode"):
        Order(0, 0, 10, "bogus")
    with pytest.raises(ValueError, match="block and window"):
        Order(0, 0, 10, "block", 0, 4)
    with pytest.raises(ValueError, match="n must be"):
        Order(0, 0, -1)
    assert np.array_equal(Order(0, 0, 5, "sequential").fill(0, 5), np.arange(5))


# -- statistics -----------------------------------------------------------------

@pytest.mark.parametrize("n", [1000, 200_003])
def test_positions_look_uniformly_random(n):
    """Per epoch: the value at each position is uniform (mean, variance of
    a window of positions), neighbours are uncorrelated, and consecutive
    epochs' orders are uncorrelated. For 200,003 samples this is the
    Feistel network; for 1,000 the table."""
    rng_bound = 5  # standard errors allowed
    for epoch in range(4):
        a = Order(123, epoch, n).fill(0, n).astype(np.float64)
        head = a[: n // 10]
        m = len(head)
        mean, var = (n - 1) / 2, (n * n - 1) / 12
        # Sampling without replacement: the mean's variance has the finite-population factor.
        se_mean = np.sqrt(var / m * (1 - m / n))
        assert abs(head.mean() - mean) < rng_bound * se_mean, (epoch, head.mean())
        assert abs(head.var() / var - 1) < 0.1 + rng_bound * np.sqrt(2 / m)
        r = np.corrcoef(a[:-1], a[1:])[0, 1]
        assert abs(r) < rng_bound / np.sqrt(n), ("neighbours correlate", epoch, r)
        b = Order(123, epoch + 1, n).fill(0, n).astype(np.float64)
        r = np.corrcoef(a, b)[0, 1]
        assert abs(r) < rng_bound / np.sqrt(n), ("epochs correlate", epoch, r)
        c = Order(124, epoch, n).fill(0, n).astype(np.float64)
        assert abs(np.corrcoef(a, c)[0, 1]) < rng_bound / np.sqrt(n), "seeds correlate"


def test_displacement_is_that_of_a_random_permutation():
    """|order[i] - i| over a random permutation has mean n/3: an order that
    moves samples only locally (a weak network) fails."""
    n = 300_007
    a = Order(9, 9, n).fill(0, n)
    d = np.abs(a - np.arange(n)).mean()
    assert abs(d / (n / 3) - 1) < 0.02, d
    # And the lowest bits of neighbours are not linked (pairs of parities).
    pairs = (a[:-1] & 1) * 2 + (a[1:] & 1)
    counts = np.bincount(pairs, minlength=4) / (n - 1)
    assert np.all(np.abs(counts - 0.25) < 0.01), counts


# -- block mode -------------------------------------------------------------------

@pytest.mark.parametrize("n,block,window", [(1, 1, 1), (10, 3, 2), (1000, 64, 4), (1001, 64, 4),
                                            (100_003, 256, 8), (70_000, 1, 1),
                                            (200_000, 100, 1), (999_999, 256, 64)])
def test_block_order_windows_hold_whole_blocks(n, block, window):
    o = Order(5, 2, n, "block", block, window)
    a = o.fill(0, n)
    assert is_permutation(a, n)
    blocks = a // block
    # Every block's samples lie within one window of positions.
    first = np.full(-(-n // block), n)
    last = np.zeros(-(-n // block), dtype=np.int64)
    np.minimum.at(first, blocks, np.arange(n))
    np.maximum.at(last, blocks, np.arange(n))
    assert (last - first).max() < block * window
    # Windows: block*window positions each, but the one holding the short
    # block (sample n-1's block) is shorter by its shortfall and the later
    # ones start that much earlier; each holds at most `window` whole blocks.
    span, short = block * window, (block - n % block) % block
    kp = first[-1] // span
    starts = [k * span - (short if k > kp else 0) for k in range(-(-(n + short) // span))]
    for lo, hi in zip(starts, starts[1:] + [n]):
        touched = np.unique(blocks[lo:hi])
        assert len(touched) <= window
        assert np.all(first[touched] >= lo) and np.all(last[touched] < hi)
    if window == 1 and n > block:
        # Each block's samples come as one run of consecutive positions.
        assert np.all(last - first == np.bincount(blocks) - 1)
    assert not np.array_equal(a, Order(5, 3, n, "block", block, window).fill(0, n)) or n < 3


def test_block_order_runs_versus_full():
    """The locality block mode buys: runs of consecutive sample numbers in
    a batch of 256 (one ranged read each)."""
    n, batch = 1_000_000, 256
    full = Order(1, 0, n).fill(0, batch)
    blk = Order(1, 0, n, "block", 256, 8).fill(0, batch)

    def blocks_touched(idx, size):
        return len(np.unique(idx // size))
    # 256 draws from 3,907 blocks touch about 248 of them.
    assert blocks_touched(full, 256) > 235
    assert blocks_touched(blk, 256) <= 8    # at most the window's blocks


def test_check_shuffle_names_the_option():
    assert check_shuffle(True) == ("full", 0, 0)
    assert check_shuffle(False) == (None, 0, 0)
    assert check_shuffle("block") == ("block", 256, 64)
    assert check_shuffle("block", 16, 2) == ("block", 16, 2)
    with pytest.raises(TypeError, match="random_shuffle"):
        check_shuffle("sometimes", option="random_shuffle")
    with pytest.raises(ValueError, match="shuffle_block"):
        check_shuffle("block", 0)
    with pytest.raises(ValueError, match="shuffle_window"):
        check_shuffle("block", 4, -1)
    with pytest.raises(ValueError, match="shuffle_block.*applies only"):
        check_shuffle(True, 4)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        EpochOrder(100, shuffle="block", shuffle_buffer=10)


# -- sharding and resume ------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [True, "block"])
@pytest.mark.parametrize("n", [1000, 100_003])
def test_ranks_partition_the_epoch(n, shuffle):
    kw = dict(shuffle_block=64, shuffle_window=4) if shuffle == "block" else {}
    whole = global_order(n, shuffle=shuffle, seed=3, epoch=1, **kw)
    parts = [epoch_indices(n, shard_id=r, num_shards=7, shuffle=shuffle, seed=3, epoch=1, **kw)
             for r in range(7)]
    assert np.array_equal(np.concatenate(parts), whole)
    # The lazy form, batch by batch, is the same indices.
    for r in (0, 6):
        o = EpochOrder(n, shard_id=r, num_shards=7, shuffle=shuffle, seed=3, epoch=1,
                       batch_size=100, **kw)
        got = np.concatenate([o.batch(k) for k in range(o.batches())])
        assert np.array_equal(got, parts[r])
        assert np.array_equal(o[5:17], parts[r][5:17]) and o[3] == parts[r][3]


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_elastic_resume_at_another_world_size_reads_each_sample_once(shuffle):
    n, g = 100_003, 96  # past the table: the network
    kw = dict(shuffle_block=32, shuffle_window=4) if shuffle == "block" else {}
    args = dict(num_samples=n, global_batch_size=g, seed=8, shuffle=shuffle,
                pad_last_batch=True, **kw)
    stop = 400  # global batches read at world size 4
    read = [elastic_indices(n, global_batch_size=g, shard_id=r, num_shards=4, shuffle=shuffle,
                            seed=8, epoch=2, pad_last_batch=True, **kw)[:stop * g // 4]
            for r in range(4)]
    state = elastic_state(epoch=2, batches=stop, **args)
    assert len(repr(state)) < 400  # a few hundred bytes, not the order
    epoch, start = elastic_resume(state, **args)
    assert (epoch, start) == (2, stop)
    rest = [EpochOrder(n, global_batch_size=g, shard_id=r, num_shards=3, shuffle=shuffle,
                       seed=8, epoch=2, pad_last_batch=True, start_batch=start, **kw).to_array()
            for r in range(3)]
    seen = np.concatenate(read + rest)
    counts = np.bincount(seen, minlength=n)
    total = -(-n // g) * g
    assert len(seen) == total
    # Every sample once; padding repeats the order's last sample.
    last = global_order(n, shuffle=shuffle, seed=8, epoch=2, **kw)[-1]
    assert counts[last] == 1 + total - n
    counts[last] = 1
    assert np.all(counts == 1)


def test_elastic_state_v1_refused_where_the_order_changed():
    args = dict(num_samples=ORDER_TABLE_MAX + 1, global_batch_size=8, seed=1, shuffle=True)
    state = elastic_state(epoch=0, batches=2, **args)
    old = dict(state, elastic=1)
    with pytest.raises(ValueError, match="version 1"):
        elastic_resume(old, **args)
    small = dict(args, num_samples=ORDER_TABLE_MAX)
    assert elastic_resume(dict(elastic_state(epoch=0, batches=2, **small), elastic=1),
                          **small) == (0, 2)
    blk = dict(args, shuffle="block", shuffle_block=4, shuffle_window=2)
    with pytest.raises(ValueError, match="shuffle"):
        elastic_resume(elastic_state(epoch=0, batches=2, **blk), **args)
    with pytest.raises(ValueError, match="shuffle_window"):
        elastic_resume(elastic_state(epoch=0, batches=2, **blk), **dict(blk, shuffle_window=3))


# -- 10^8 samples ------------------------------------------------------------------

def test_hundred_million_first_batch_with_bounded_rss():
    """The first batch of a shuffled (full and block) 10^8-sample epoch,
    per-rank and elastic, in a fresh process: RSS grows by a few MB (an
    N-element array would be 800 MB)."""
    code = textwrap.dedent("""
        import resource, sys
        import numpy as np
        from fastread.sampling import EpochOrder
        def rss():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        before = rss()
        n = 10 ** 8
        out = []
        for kw in (dict(shuffle=True, shard_id=5, num_shards=8, batch_size=256),
                   dict(shuffle="block", shard_id=5, num_shards=8, batch_size=256),
                   dict(shuffle=True, global_batch_size=2048, shard_id=3, num_shards=8,
                        pad_last_batch=True)):
            o = EpochOrder(n, seed=1, epoch=4, **kw)
            b = o.batch(0)
            assert len(b) == 256 and b.min() >= 0 and b.max() < n and len(set(b)) == 256, kw
            out.append(b)
        print(rss() - before)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    grown = int(done.stdout.split()[-1])
    assert grown < 32 << 20, f"peak RSS grew by {grown} bytes"


# -- the Reader ----------------------------------------------------------------------

class _Ranges(fastread.FileRanges):
    """n one-byte ranges of one file, sample i the byte i % 251, names
    computed when asked (no list of n strings)."""

    class _Names:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return str(i)

    def __init__(self, path, n):
        self.path = os.fspath(path)
        self.offsets = np.arange(n, dtype=np.int64) % 251
        self.lengths = np.ones(n, dtype=np.int64)
        self.names = self._Names(n)
        self.labels = np.arange(n, dtype=np.int32)


@pytest.fixture
def byte_file(tmp_path):
    p = tmp_path / "bytes.bin"
    p.write_bytes(bytes(range(251)))
    return p


def _labels(reader):
    return np.concatenate([labels for _, labels in reader])


@pytest.mark.parametrize("kw", [dict(random_shuffle=True), dict(random_shuffle="block",
                                                                shuffle_block=16,
                                                                shuffle_window=3),
                                dict(random_shuffle=True, global_batch_size=64, num_shards=2,
                                     shard_id=1, pad_last_batch=True)])
def test_reader_reads_the_epoch_order(byte_file, kw):
    n = 5000
    kw = dict(kw)
    elastic = "global_batch_size" in kw
    with fastread.Reader(source=_Ranges(byte_file, n), seed=4, prefetch=2, workers=1,
                         **({} if elastic else dict(batch_size=50)), **kw) as r:
        for epoch in range(2):
            got = _labels(r)
            shuffle = kw["random_shuffle"]
            block = {k: kw[k] for k in ("shuffle_block", "shuffle_window") if k in kw}
            if elastic:
                want = elastic_indices(n, global_batch_size=64, shard_id=1, num_shards=2,
                                       shuffle=shuffle, seed=4, epoch=epoch,
                                       pad_last_batch=True)
            else:
                want = epoch_indices(n, shuffle=shuffle, seed=4, epoch=epoch, **block)
            assert np.array_equal(got, want)


def test_reader_resumes_block_state_and_refuses_another_shuffle(byte_file):
    n = 3000
    src = _Ranges(byte_file, n)
    kw = dict(random_shuffle="block", shuffle_block=8, shuffle_window=5, batch_size=40, seed=2)
    with fastread.Reader(source=src, **kw) as r:
        it = iter(r)
        first = np.concatenate([next(it)[1] for _ in range(7)])
        state = r.state_dict()
    assert state["shuffle"] == "block" and state["shuffle_window"] == 5
    with fastread.Reader(source=src, **kw) as r:
        r.load_state_dict(state)
        rest = _labels(r)
    assert np.array_equal(np.concatenate([first, rest]), epoch_indices(
        n, shuffle="block", shuffle_block=8, shuffle_window=5, seed=2))
    with fastread.Reader(source=src, **dict(kw, shuffle_window=6)) as r:
        with pytest.raises(ValueError, match="shuffle_window"):
            r.load_state_dict(state)
    with fastread.Reader(source=src, **dict(kw, random_shuffle=True, shuffle_block=None,
                                            shuffle_window=None)) as r:
        with pytest.raises(ValueError, match="shuffle"):
            r.load_state_dict(state)


def test_reader_plain_state_of_an_earlier_order_is_refused(byte_file):
    n = ORDER_TABLE_MAX + 10
    with fastread.Reader(source=_Ranges(byte_file, n), random_shuffle=True, batch_size=64) as r:
        state = r.state_dict(0, 3)
        old = {k: v for k, v in state.items() if k != "order"}
        with pytest.raises(ValueError, match="earlier fastread"):
            r.load_state_dict(old)
        r.load_state_dict(state)
        assert r.position() == (0, 3)


def test_reader_shuffle_options_are_checked(byte_file):
    src = _Ranges(byte_file, 100)
    with pytest.raises(TypeError, match="random_shuffle"):
        fastread.Reader(source=src, random_shuffle="often")
    with pytest.raises(ValueError, match="shuffle_block"):
        fastread.Reader(source=src, random_shuffle="block", shuffle_block=0)
    with pytest.raises(ValueError, match="shuffle_window.*applies only"):
        fastread.Reader(source=src, random_shuffle=True, shuffle_window=4)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        fastread.Reader(source=src, random_shuffle="block", shuffle_buffer=8)


def test_reader_queues_a_bounded_window_whatever_n(byte_file):
    """iter() and the first batch allocate (Python heap, tracemalloc) the
    same few KB at 10^4 and 10^6 samples: the epoch's batches are computed
    and queued as the read-ahead needs them, not all at iter()."""
    peaks = {}
    for n in (10_000, 1_000_000):
        with fastread.Reader(source=_Ranges(byte_file, n), random_shuffle=True, batch_size=32,
                             prefetch=2, workers=1) as r:
            tracemalloc.start()
            it = iter(r)
            _, labels = next(it)
            peaks[n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert np.array_equal(labels, epoch_indices(n, shuffle=True)[:32])
            del it
    # An array of the epoch (8 MB at 10^6) or its batches' list would show.
    assert peaks[1_000_000] < 512 << 10, peaks
    assert peaks[1_000_000] < 4 * peaks[10_000] + (64 << 10), peaks


# -- the native DALI operator ---------------------------------------------------------

def _dali_pipe(path, n, batch, checkpoint=None, **stream):
    pytest.importorskip("nvidia.dali")
    from fastread.dali import _plugin
    if not _plugin.load():
        pytest.skip(f"the native DALI plugin does not load: {_plugin.reason()}")
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, enable_checkpointing=True)
    def pipe():
        _, labels = fn.fastread.readers.file(
            image=str(path), range_offsets=(np.arange(n) % 251).tolist(),
            range_lengths=[1] * n, seed=4, name="r", **stream)
        return labels
    p = pipe(checkpoint=checkpoint) if checkpoint is not None else pipe()
    p.build()
    return p


def _dali_labels(p, batches):
    return np.concatenate([np.array(p.run()[0].as_tensor()).reshape(-1)
                           for _ in range(batches)])


@pytest.mark.parametrize("block", [{}, dict(shuffle_block=16, shuffle_window=3)])
def test_dali_operator_reads_the_same_order_and_resumes_it(byte_file, block):
    """Past the table (70,001 samples): the operator's order, shard 1 of 3,
    is EpochOrder's (full and block), and its checkpoint mid-epoch resumes
    it; a checkpoint of the earlier order (order=1) is refused."""
    n, batch = 70_001, 100
    stream = dict(random_shuffle=True, shard_id=1, num_shards=3, stick_to_shard=True, **block)
    p = _dali_pipe(byte_file, n, batch, **stream)
    want = epoch_indices(n, shuffle="block" if block else True, seed=4, epoch=0, shard_id=1,
                         num_shards=3, **block)
    got = _dali_labels(p, 30)
    assert np.array_equal(got, want[:30 * batch])
    cp = p.checkpoint()
    assert b"order=2" in cp
    q = _dali_pipe(byte_file, n, batch, checkpoint=cp, **stream)
    assert np.array_equal(_dali_labels(q, 5), want[30 * batch:35 * batch])
    if block:
        with pytest.raises(Exception, match="shuffle_window"):
            _dali_pipe(byte_file, n, batch, checkpoint=cp,
                       **dict(stream, shuffle_window=4)).run()
    old = cp.replace(b" order=2", b" order=1")  # same length: the checkpoint is protobuf
    with pytest.raises(Exception, match="earlier fastread"):
        _dali_pipe(byte_file, n, batch, checkpoint=old, **stream).run()


@pytest.mark.parametrize("native", [False, True])
def test_dali_readers_take_block_shuffles(tmp_path, native):
    """fastread.dali.readers.file(random_shuffle="block", shuffle_block=,
    shuffle_window=): the external source (a Reader) and the native
    operator read EpochOrder's block order; bad block options are refused
    by name."""
    pytest.importorskip("nvidia.dali")
    from fastread.dali import _plugin, readers
    if native and not _plugin.load():
        pytest.skip(f"the native DALI plugin does not load: {_plugin.reason()}")
    from nvidia.dali import pipeline_def

    n, batch = 40, 8
    files = []
    for i in range(n):
        p = tmp_path / f"{i:03d}.bin"
        p.write_bytes(bytes([i]))
        files.append(str(p))

    def build(**kw):
        @pipeline_def(batch_size=batch, num_threads=1, device_id=None)
        def pipe():
            _, labels = readers.file(files=files, labels=list(range(n)), seed=3,
                                     native=native, name="r", **kw)
            return labels
        p = pipe()
        p.build()
        return p
    p = build(random_shuffle="block", shuffle_block=4, shuffle_window=2)
    got = np.concatenate([np.array(p.run()[0].as_tensor()).reshape(-1)
                          for _ in range(n // batch)])
    want = epoch_indices(n, shuffle="block", shuffle_block=4, shuffle_window=2, seed=3)
    assert np.array_equal(got, want)
    with pytest.raises((ValueError, TypeError), match="shuffle_block"):
        build(random_shuffle=True, shuffle_block=4)
    with pytest.raises((ValueError, TypeError), match="random_shuffle"):
        build(random_shuffle="sometimes")
