"""fastread.sampling: DALI's shard boundaries and an epoch's indices (sharded,
shuffled, padded, last batch dropped). Parity with DALI's reader over
scanned trees is in test_scan.py."""
import numpy as np
import pytest

from fastread.sampling import epoch_indices, shard_range


def test_shard_range_formula():
    assert [shard_range(10, s, 3) for s in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [shard_range(10, s, 4) for s in range(4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert [shard_range(10, s, 7) for s in range(7)] == \
        [(0, 1), (1, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 10)]
    assert shard_range(5, 0, 1) == (0, 5)
    assert shard_range(np.int64(10), np.int32(2), 3) == (6, 10)
    big = 10**12 + 7
    assert shard_range(big, 3, 8) == (big * 3 // 8, big * 4 // 8)


def test_shard_arguments_validated():
    with pytest.raises(ValueError, match="num_shards"):
        shard_range(10, 0, 0)
    with pytest.raises(ValueError, match="shard_id"):
        shard_range(10, 3, 3)
    with pytest.raises(ValueError, match="shard_id"):
        shard_range(10, -1, 3)
    with pytest.raises(ValueError, match="num_shards"):
        shard_range(2, 0, 3)  # DALI: samples must be >= num_shards
    with pytest.raises(ValueError, match="num_samples"):
        shard_range(-1, 0, 1)
    with pytest.raises(ValueError, match="shard_id"):
        shard_range(10, 1.0, 3)
    with pytest.raises(ValueError, match="batch_size"):
        epoch_indices(10, batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        epoch_indices(10, drop_last=True)
    with pytest.raises(ValueError, match="seed"):
        epoch_indices(10, shuffle=True, seed=-1)
    with pytest.raises(ValueError, match="epoch"):
        epoch_indices(10, shuffle=True, epoch=-2)


@pytest.mark.parametrize("n,num_shards", [(1000, 1), (1000, 3), (1001, 8), (17, 17)])
def test_shuffled_shards_partition_every_epoch(n, num_shards):
    for epoch in range(3):
        parts = [epoch_indices(n, shard_id=s, num_shards=num_shards, shuffle=True, seed=7,
                               epoch=epoch) for s in range(num_shards)]
        allidx = np.concatenate(parts)
        assert allidx.dtype == np.int64
        assert np.array_equal(np.sort(allidx), np.arange(n))
        for s, p in enumerate(parts):
            start, end = shard_range(n, s, num_shards)
            assert len(p) == end - start


def test_shuffle_reproducible_and_changes_per_epoch():
    from fastread._core import permutation
    a = epoch_indices(1000, shuffle=True, seed=3, epoch=0)
    assert np.array_equal(a, epoch_indices(1000, shuffle=True, seed=3, epoch=0))
    assert np.array_equal(a, permutation(3, 0, 1000))  # the core's, as the DALI operators draw
    assert np.array_equal(np.sort(a), np.arange(1000))
    assert not np.array_equal(a, epoch_indices(1000, shuffle=True, seed=3, epoch=1))
    assert not np.array_equal(a, epoch_indices(1000, shuffle=True, seed=4, epoch=0))
    assert not np.array_equal(a, np.arange(1000))
    # every rank sees the same global permutation
    full = np.concatenate([epoch_indices(1000, shard_id=s, num_shards=4, shuffle=True,
                                         seed=3, epoch=5) for s in range(4)])
    assert np.array_equal(full, permutation(3, 5, 1000))
    # unshuffled: identical every epoch
    assert np.array_equal(epoch_indices(10, shard_id=1, num_shards=3, epoch=4), [3, 4, 5])


def test_pad_and_drop_counts():
    # 10 samples, 3 shards -> 3, 3, 4 samples; ceil(10/3) = 4
    counts = lambda **kw: [len(epoch_indices(10, shard_id=s, num_shards=3, **kw))
                           for s in range(3)]
    assert counts() == [3, 3, 4]
    assert counts(pad_last_batch=True) == [4, 4, 4]
    assert counts(pad_last_batch=True, batch_size=3) == [6, 6, 6]
    assert counts(pad_last_batch=True, batch_size=4) == [4, 4, 4]
    assert counts(batch_size=3, drop_last=True) == [3, 3, 3]
    assert counts(batch_size=2, drop_last=True) == [2, 2, 4]
    assert counts(pad_last_batch=True, batch_size=3, drop_last=True) == [3, 3, 3]
    assert counts(batch_size=5, drop_last=True) == [0, 0, 0]
    # padding repeats the shard's last sample (also after shuffling)
    assert epoch_indices(10, shard_id=0, num_shards=3, pad_last_batch=True,
                         batch_size=3).tolist() == [0, 1, 2, 2, 2, 2]
    p = epoch_indices(10, shard_id=0, num_shards=3, shuffle=True, seed=1,
                      pad_last_batch=True, batch_size=5)
    assert len(p) == 5 and p[3] == p[4] == p[2]
    # nothing to pad when everything divides
    assert epoch_indices(12, shard_id=2, num_shards=3, pad_last_batch=True,
                         batch_size=2).tolist() == [8, 9, 10, 11]


def test_index_still_exports_them():
    import fastread.index
    assert fastread.index.epoch_indices is epoch_indices
    assert fastread.index.shard_range is shard_range
