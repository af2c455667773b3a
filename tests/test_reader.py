"""Reader: batches, labels, shards, shuffles, prefetch and buffer safety."""
import gc

import numpy as np
import pytest

import fastread
from conftest import engine_params


@pytest.fixture(scope="module")
def tree(class_tree):
    return class_tree("reader-tree", [25] * 4, seed=7, max_size=20000)


def epoch(reader):
    arrays, labels = [], []
    for a, l in reader:
        arrays.extend(x.tobytes() for x in a)
        labels.extend(l.tolist())
    return arrays, labels


@pytest.mark.parametrize("engine", engine_params())
def test_one_epoch_in_scan_order(engine, tree):
    root, content = tree
    paths, labels = fastread.scan(root)
    with fastread.Reader(root, batch_size=7, engine=engine) as r:
        assert len(r) == 15  # ceil(100 / 7)
        got, got_labels = epoch(r)
    assert got == [content[p] for p in paths]
    assert got_labels == labels.tolist()


def test_batches_have_labels_int32(tree):
    root, _ = tree
    with fastread.Reader(root, batch_size=10) as r:
        a, l = next(iter(r))
    assert len(a) == 10 and l.dtype == np.int32 and l.shape == (10,)


@pytest.mark.parametrize("num_shards", [1, 3, 7])
def test_shards_cover_every_sample_once(tree, num_shards):
    root, content = tree
    seen = []
    for shard in range(num_shards):
        with fastread.Reader(root, batch_size=8, shard_id=shard, num_shards=num_shards) as r:
            seen.extend(epoch(r)[0])
    assert sorted(seen) == sorted(content.values())


def test_shuffle_reproducible_and_new_each_epoch(tree):
    root, content = tree
    def two_epochs(seed):
        with fastread.Reader(root, batch_size=9, random_shuffle=True, seed=seed) as r:
            return epoch(r)[0], epoch(r)[0]
    a1, a2 = two_epochs(5)
    b1, b2 = two_epochs(5)
    c1, _ = two_epochs(6)
    assert a1 == b1 and a2 == b2
    assert a1 != a2 and a1 != c1
    assert sorted(a1) == sorted(a2) == sorted(content.values())


def test_shuffled_shards_partition_each_epoch(tree):
    root, content = tree
    for ep in range(3):
        seen = []
        for shard in range(3):
            with fastread.Reader(root, batch_size=8, shard_id=shard, num_shards=3,
                                 random_shuffle=True, seed=1) as r:
                r.set_epoch(ep)
                seen.extend(epoch(r)[0])
        assert sorted(seen) == sorted(content.values())


def test_pad_and_drop_last(tree):
    root, _ = tree
    with fastread.Reader(root, batch_size=16, drop_last=True) as r:
        sizes = [len(a) for a, _ in r]
        assert sizes == [16] * 6 and len(r) == 6
    with fastread.Reader(root, batch_size=16, pad_last_batch=True) as r:
        sizes = [len(a) for a, _ in r]
        assert sizes == [16] * 7 and len(r) == 7
    with fastread.Reader(root, batch_size=16) as r:
        assert [len(a) for a, _ in r] == [16] * 6 + [4]


def test_abandoned_epoch_then_new_one(tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    with fastread.Reader(root, batch_size=10, prefetch=3) as r:
        it = iter(r)
        next(it)
        next(it)
        got, _ = epoch(r)  # starts over, nothing stale leaks in
        assert got == [content[p] for p in paths]
        with pytest.raises(StopIteration):
            next(it)


def test_arrays_stay_valid_while_held(tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    with fastread.Reader(root, batch_size=10) as r:
        held = [a for a, _ in r]  # every batch kept: no reuse may happen
        for _ in range(2):
            epoch(r)
    flat = [x.tobytes() for batch in held for x in batch]
    assert flat == [content[p] for p in paths]


def test_memory_is_bounded_when_batches_are_dropped(tree):
    root, _ = tree
    with fastread.Reader(root, batch_size=10, prefetch=2) as r:
        for _ in range(10):
            epoch(r)
        gc.collect()
        # In flight: prefetch + workers - 1 (csrc/core/reader.c), one being
        # returned, and two the pool keeps for reuse. Workers default to one
        # per 2 CPUs: 1 on the 2-core VM, 8 on 16 cores.
        assert r.memory()["batches"] <= 2 + r.workers + 2


def test_ring_depth_caps_batches_even_if_arrays_are_held(tree):
    root, _ = tree
    with fastread.Reader(root, batch_size=10, prefetch=2, ring_depth=2) as r:
        held = []
        for _ in range(5):
            held.extend(a for a, _ in r)
        assert r.memory()["batches"] <= 2 + 2 + r.workers
        # Held views may have been overwritten but are still mapped memory.
        assert all(isinstance(x.sum(), np.integer) for b in held for x in b)


def test_read_error_in_reader_names_path(tree, tmp_path):
    import os
    import shutil
    root = tmp_path / "r"
    shutil.copytree(tree[0], root)
    with fastread.Reader(str(root), batch_size=50) as r:
        victim = r.paths[60]
        os.remove(victim)
        it = iter(r)
        next(it)
        with pytest.raises(fastread.ReadError) as e:
            next(it)
        assert e.value.filename == victim


def test_bad_arguments(tree, tmp_path):
    root, _ = tree
    with pytest.raises(ValueError, match="batch_size"):
        fastread.Reader(root, batch_size=0)
    with pytest.raises(ValueError, match="shard_id"):
        fastread.Reader(root, shard_id=3, num_shards=3)
    with pytest.raises(ValueError, match="prefetch"):
        fastread.Reader(root, prefetch=0)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        fastread.Reader(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="warp"):
        fastread.Reader(root, engine="warp")


def test_closed_reader_refuses(tree):
    root, _ = tree
    r = fastread.Reader(root, batch_size=10)
    a, _ = next(iter(r))
    r.close()
    with pytest.raises(ValueError, match="closed"):
        iter(r)
    assert a[0].size >= 0  # arrays already returned stay valid


@pytest.mark.parametrize("engine", engine_params())
def test_several_workers_deliver_in_order(engine, tree):
    root, content = tree
    paths, _ = fastread.scan(root)
    with fastread.Reader(root, batch_size=3, workers=4, prefetch=3, engine=engine) as r:
        for _ in range(3):
            got, _ = epoch(r)
            assert got == [content[p] for p in paths]
        it = iter(r)
        next(it)
        assert epoch(r)[0] == [content[p] for p in paths]  # reset with workers busy


def test_workers_validated(tree, monkeypatch):
    root, _ = tree
    with pytest.raises(ValueError, match="workers"):
        fastread.Reader(root, workers=65)
    monkeypatch.setenv("FASTREAD_WORKERS", "2")
    with fastread.Reader(root) as r:
        assert r.workers == 2


@pytest.mark.parametrize("batch_size", [1, 3])
def test_resume_without_stick_to_shard_uses_each_epochs_shard(class_tree, batch_size):
    # 10 samples in 3 shards are 3, 3 and 4 long; with stick_to_shard=False
    # epoch e reads shard (shard_id + e) % 3, so its length is that shard's,
    # not epoch 0's: a position counted against epoch 0's length would end
    # epoch 2 one batch early (and resume skipping its last samples).
    root, content = class_tree("reader-rotating", [10], seed=3, max_size=500)
    paths, _ = fastread.scan(root)
    args = dict(batch_size=batch_size, shard_id=0, num_shards=3, stick_to_shard=False, workers=1)
    sizes = {0: 3, 1: 3, 2: 4, 3: 3}
    with fastread.Reader(root, **args) as r:
        for e, n in sizes.items():
            r.set_epoch(e)
            assert len(r) == -(-n // batch_size) and r.num_samples == n
            whole = [x.tobytes() for a, _ in r for x in a]
            assert whole == [content[p] for p in paths[3 * (e % 3):][:n]]
            for k in range(len(r) + 1):
                r.set_epoch(e)
                it = iter(r)
                for _ in range(k):
                    next(it)
                state = r.state_dict()
                expect = (e, k) if k < len(r) else (e + 1, 0)
                assert (state["epoch"], state["batches_delivered"]) == expect
                with fastread.Reader(root, **args) as again:
                    again.load_state_dict(state)
                    rest = [x.tobytes() for a, _ in again for x in a]
                if k < len(r):
                    assert rest == whole[k * batch_size:]
        for e, n in sizes.items():
            assert r.epoch_samples(e) == n
            assert r.epoch_batches(e) == -(-n // batch_size)
        r.set_epoch(2, start_batch=r.epoch_batches(2))  # the last batch of the long shard
        with pytest.raises(ValueError, match="past the end of epoch 1"):
            r.set_epoch(1, start_batch=r.epoch_batches(2))
