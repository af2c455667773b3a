"""Elastic, resumable sharding (issue 32 items 2 and 3): one global order per
(seed, epoch) cut into global batches, each rank reading its slice; a
position taken at one world size resumes at another with every sample of
the epoch read once. The order arithmetic (fastread.sampling), the Reader,
the torch loaders and the DALI readers' external source in one process,
and the Reader and ImageLoader under torchrun on loopback (gloo): 2 "nodes"
x 2 ranks resumed by 1 node x 3 ranks and the other way round."""
import collections
import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastread
from fastread import _defaults
from fastread.sampling import (check_global_batch, elastic_batches, elastic_epoch_samples,
                               elastic_indices, elastic_resume, elastic_state,
                               elastic_world_sizes, global_order)

HERE = os.path.dirname(os.path.abspath(__file__))


# -- the order arithmetic -------------------------------------------------------

def tails():
    return st.sampled_from([(False, False), (True, False), (False, True)])


def divisor_world(g, draw_index):
    divisors = [w for w in range(1, g + 1) if g % w == 0]
    return divisors[draw_index % len(divisors)]


def read_all(n, g, w, *, tail, start=0, stop=None, **kw):
    """{rank: that rank's indices for global batches [start, stop)}."""
    pad, drop = tail
    local = g // w
    out = {}
    for r in range(w):
        idx = elastic_indices(n, global_batch_size=g, shard_id=r, num_shards=w,
                              pad_last_batch=pad, drop_last=drop, start_batch=start, **kw)
        if stop is not None:
            idx = idx[:(stop - start) * local]
        out[r] = idx
    return out


@st.composite
def layouts(draw):
    """(n, g, tail, w1, w2) with w1 and w2 dividing g and the tail readable
    at both world sizes."""
    g = draw(st.integers(1, 24))
    w1 = divisor_world(g, draw(st.integers(0, 50)))
    w2 = divisor_world(g, draw(st.integers(0, 50)))
    pad, drop = draw(tails())
    n = draw(st.integers(1, 150))
    if drop and n < g:
        n = g + n
    left = n % g
    if not (pad or drop) and 0 < left < max(w1, w2):
        pad = True  # the partial tail would leave a rank empty (tested below)
    return n, g, (pad, drop), w1, w2


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(0, 2**64 - 1), st.integers(0, 5), st.booleans(),
       st.integers(0, 4))
def test_global_batches_do_not_depend_on_world_size(layout, seed, epoch, shuffle, buffer):
    n, g, tail, w1, w2 = layout
    kw = dict(shuffle=shuffle, seed=seed, epoch=epoch, shuffle_buffer=buffer if shuffle else 0)
    order = global_order(n, **kw)
    total = elastic_epoch_samples(n, g, pad_last_batch=tail[0], drop_last=tail[1])
    expect = np.concatenate([order, np.full(max(0, total - n), order[-1])])[:total]
    batches = elastic_batches(n, g, pad_last_batch=tail[0], drop_last=tail[1])
    for w in (w1, w2):
        parts = read_all(n, g, w, tail=tail, **kw)
        local = g // w
        # every rank reads the same number of batches, whole ones but the last
        counts = {-(-len(p) // local) for p in parts.values()}
        assert counts == {batches}
        # global batch k is the ranks' batch k in rank order: the same samples,
        # in the same order, at every world size
        got = []
        for k in range(batches):
            for r in range(w):
                got.extend(parts[r][k * local:(k + 1) * local])
        assert np.array_equal(np.asarray(got, dtype=np.int64), expect)


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(0, 1000), st.integers(0, 3), st.data())
def test_resume_at_another_world_size_reads_each_sample_once(layout, seed, epoch, data):
    n, g, tail, w1, w2 = layout
    kw = dict(shuffle=True, seed=seed, epoch=epoch)
    batches = elastic_batches(n, g, pad_last_batch=tail[0], drop_last=tail[1])
    k = data.draw(st.integers(0, batches))
    first = read_all(n, g, w1, tail=tail, stop=k, **kw)
    state = elastic_state(num_samples=n, global_batch_size=g, seed=seed, shuffle=True,
                          epoch=epoch, batches=k, pad_last_batch=tail[0], drop_last=tail[1])
    assert state["samples_consumed"] == min(k * g, elastic_epoch_samples(
        n, g, pad_last_batch=tail[0], drop_last=tail[1]))
    resumed_epoch, start = elastic_resume(
        json.loads(json.dumps(state)), num_samples=n, global_batch_size=g, seed=seed,
        shuffle=True, pad_last_batch=tail[0], drop_last=tail[1])
    assert (resumed_epoch, start) == (epoch, k)
    rest = read_all(n, g, w2, tail=tail, start=start, **kw)
    seen = collections.Counter(np.concatenate(list(first.values()) + list(rest.values())).tolist())
    whole = collections.Counter(np.concatenate(list(read_all(n, g, w1, tail=tail, **kw)
                                                    .values())).tolist())
    assert seen == whole
    if not tail[0] and not tail[1]:
        assert seen == collections.Counter(range(n))  # every sample exactly once
    if tail[1]:
        assert sum(seen.values()) == n // g * g and max(seen.values()) == 1


def test_tail_policies_and_their_errors():
    # 50 samples in global batches of 12: 2 left over
    with pytest.raises(ValueError, match="pad_last_batch=True.*drop_last=True"):
        elastic_indices(50, global_batch_size=12, shard_id=0, num_shards=4)
    ok = read_all(50, 12, 2, tail=(False, False))  # 2 left over, 2 ranks: one each
    assert [len(p) for p in ok.values()] == [25, 25]
    padded = read_all(50, 12, 4, tail=(True, False))
    assert all(len(p) == 15 for p in padded.values())
    assert collections.Counter(np.concatenate(list(padded.values())).tolist())[49] == 11
    dropped = read_all(50, 12, 4, tail=(False, True))
    assert sorted(np.concatenate(list(dropped.values())).tolist()) == list(range(48))
    with pytest.raises(ValueError, match="exclude each other"):
        elastic_indices(50, global_batch_size=12, pad_last_batch=True, drop_last=True)
    with pytest.raises(ValueError, match="do not fill one global batch"):
        elastic_indices(5, global_batch_size=12, drop_last=True)


def test_world_sizes_that_read_and_resume_an_epoch():
    # The rule: the divisors of G; without a tail policy and with a partial
    # last global batch of R samples, only those up to R. 50 samples, G=12:
    # R=2, so a state saved at 2 ranks does not resume at 4.
    assert elastic_world_sizes(50, 12) == [1, 2]
    assert elastic_world_sizes(50, 12, pad_last_batch=True) == [1, 2, 3, 4, 6, 12]
    assert elastic_world_sizes(50, 12, drop_last=True) == [1, 2, 3, 4, 6, 12]
    assert elastic_world_sizes(48, 12) == [1, 2, 3, 4, 6, 12]  # no partial batch
    assert elastic_world_sizes(5, 12, drop_last=True) == []
    with pytest.raises(ValueError, match="or run at most 2 ranks"):
        elastic_indices(50, global_batch_size=12, shard_id=0, num_shards=4)
    for n in (17, 24, 50, 64):
        for g in (4, 8, 12):
            for pad, drop in ((False, False), (True, False), (False, True)):
                sizes = elastic_world_sizes(n, g, pad_last_batch=pad, drop_last=drop)
                for w in range(1, g + 1):
                    if g % w:
                        continue
                    try:
                        read_all(n, g, w, tail=(pad, drop))
                        reads = True
                    except ValueError:
                        reads = False
                    assert reads == (w in sizes), (n, g, pad, drop, w)
                # every world size listed resumes every other's state, each
                # sample of the epoch read once over the two runs
                k = elastic_batches(n, g, pad_last_batch=pad, drop_last=drop) // 2
                for w1 in sizes:
                    before = collections.Counter()
                    for r in range(w1):
                        part = elastic_indices(n, global_batch_size=g, shard_id=r,
                                               num_shards=w1, shuffle=True, seed=3, epoch=1,
                                               pad_last_batch=pad, drop_last=drop)
                        before.update(part[:k * (g // w1)].tolist())
                    state = elastic_state(num_samples=n, global_batch_size=g, seed=3,
                                          shuffle=True, epoch=1, batches=k,
                                          pad_last_batch=pad, drop_last=drop)
                    for w2 in sizes:
                        epoch, start = elastic_resume(state, num_samples=n, global_batch_size=g,
                                                      seed=3, shuffle=True,
                                                      pad_last_batch=pad, drop_last=drop)
                        after = collections.Counter()
                        for r in range(w2):
                            after.update(elastic_indices(
                                n, global_batch_size=g, shard_id=r, num_shards=w2, shuffle=True,
                                seed=3, epoch=epoch, pad_last_batch=pad, drop_last=drop,
                                start_batch=start).tolist())
                        whole = collections.Counter()
                        for r in range(w1):
                            whole.update(elastic_indices(
                                n, global_batch_size=g, shard_id=r, num_shards=w1, shuffle=True,
                                seed=3, epoch=1, pad_last_batch=pad,
                                drop_last=drop).tolist())
                        assert before + after == whole, (n, g, pad, drop, w1, w2)


def test_global_batch_must_divide_by_the_world_size():
    assert check_global_batch(12, 3) == 4
    with pytest.raises(ValueError, match=r"global_batch_size``=12 is not divisible.*num_shards=5"):
        check_global_batch(12, 5)
    with pytest.raises(ValueError, match="global_batch_size"):
        check_global_batch(0, 1)
    with pytest.raises(ValueError, match="global_batch_size"):
        check_global_batch(2.0, 1)
    with pytest.raises(ValueError, match="start_batch"):
        elastic_indices(24, global_batch_size=12, start_batch=3)


def test_resume_refuses_another_order():
    mine = dict(num_samples=53, global_batch_size=12, seed=3, shuffle=True)
    state = elastic_state(epoch=2, batches=3, **mine)
    assert elastic_resume(state, **mine) == (2, 3)
    for key, other in (("num_samples", 54), ("global_batch_size", 24), ("seed", 4),
                       ("shuffle", False)):
        with pytest.raises(ValueError, match=f"taken with {key}="):
            elastic_resume(state, **{**mine, key: other})
    with pytest.raises(ValueError, match="taken with pad_last_batch="):
        elastic_resume(state, **mine, pad_last_batch=True)
    with pytest.raises(ValueError, match="not at a global batch boundary"):
        elastic_resume({**state, "samples_consumed": 13}, **mine)
    with pytest.raises(ValueError, match="not an elastic state_dict"):
        elastic_resume({"epoch": 1, "batches_delivered": 2}, **mine)
    # the last (partial) global batch consumed: the epoch's end
    end = elastic_state(epoch=2, batches=5, **mine)
    assert end["samples_consumed"] == 53 and elastic_resume(end, **mine) == (2, 5)


def test_node_env(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert _defaults.node_env() == dict(rank=0, world_size=1, local_rank=0, local_world_size=1,
                                        group_rank=0)
    env = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _defaults.node_env() == dict(rank=3, world_size=4, local_rank=1, local_world_size=2,
                                        group_rank=1)
    monkeypatch.setenv("FASTREAD_WORKERS", "0")
    cpus = os.cpu_count() or 1
    assert _defaults.reader_workers() == min(8, max(1, cpus // 2 // 2))
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match=r"LOCAL_RANK=2 must be in \[0, LOCAL_WORLD_SIZE=2\)"):
        _defaults.node_env()
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x'"):
        _defaults.node_env()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=8 exceeds WORLD_SIZE=4"):
        _defaults.node_env()


# -- the readers in one process ---------------------------------------------------

N_FILES = 53
GLOBAL = 12


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    from conftest import write_class_tree
    root = tmp_path_factory.mktemp("elastic") / "tree"
    root, content = write_class_tree(root, [20, 18, 15], seed=32, max_size=300, min_size=8,
                                     tag=True)
    ids = {hashlib.sha1(data).hexdigest(): i for i, data in enumerate(content.values())}
    return root, ids


def sample_ids(arrays, ids):
    return [ids[hashlib.sha1(bytes(np.asarray(a))).hexdigest()] for a in arrays]


def open_readers(root, w, **kw):
    return [fastread.Reader(root, shard_id=r, num_shards=w, global_batch_size=GLOBAL,
                            random_shuffle=True, seed=9, workers=1, **kw) for r in range(w)]


@pytest.mark.parametrize("w1,w2,tail", [(2, 3, {}), (4, 3, {"pad_last_batch": True}),
                                        (3, 4, {"drop_last": True}), (1, 6, {"drop_last": True})])
def test_reader_resumes_at_another_world_size(tree, w1, w2, tail):
    root, ids = tree
    readers = open_readers(root, w1, **tail)
    for r in readers:
        assert r.batch_size == GLOBAL // w1
        r.set_epoch(1)
    its = [iter(r) for r in readers]
    seen = collections.Counter()
    for _ in range(2):  # two global batches
        for it in its:
            seen.update(sample_ids(next(it)[0], ids))
    states = [r.state_dict() for r in readers]
    assert all(s == states[0] for s in states)
    assert states[0]["epoch"] == 1 and states[0]["samples_consumed"] == 2 * GLOBAL
    for r in readers:
        r.close()
    resumed = open_readers(root, w2, **tail)
    for r in resumed:
        r.load_state_dict(json.loads(json.dumps(states[0])))
        assert r.position() == (1, 2)
        batches = list(r)
        assert len(batches) == len(r) - 2
        for arrays, _ in batches:
            seen.update(sample_ids(arrays, ids))
        assert r.state_dict()["epoch"] == 2 and r.state_dict()["samples_consumed"] == 0
        r.close()
    order = global_order(N_FILES, shuffle=True, seed=9, epoch=1)
    if tail.get("drop_last"):
        assert seen == collections.Counter(order[:N_FILES // GLOBAL * GLOBAL].tolist())
    elif tail.get("pad_last_batch"):
        assert set(seen) == set(range(N_FILES))
        assert seen[int(order[-1])] == 1 + (-N_FILES) % GLOBAL
        assert sum(seen.values()) == -(-N_FILES // GLOBAL) * GLOBAL
    else:
        assert seen == collections.Counter(range(N_FILES))


def test_reader_elastic_arguments(tree):
    root, _ = tree
    with pytest.raises(ValueError, match=r"global_batch_size``=12 is not divisible.*num_shards=5"):
        fastread.Reader(root, shard_id=0, num_shards=5, global_batch_size=12)
    with pytest.raises(ValueError, match="batch_size=5 does not match global_batch_size=12"):
        fastread.Reader(root, num_shards=2, batch_size=5, global_batch_size=12)
    with pytest.raises(ValueError, match="stick_to_shard=False does not apply"):
        fastread.Reader(root, num_shards=2, global_batch_size=12, stick_to_shard=False)
    with pytest.raises(ValueError, match="pad_last_batch=True.*drop_last=True"):
        fastread.Reader(root, num_shards=6, shard_id=0, global_batch_size=12)
    with fastread.Reader(root, num_shards=2, global_batch_size=12, workers=1) as elastic, \
            fastread.Reader(root, num_shards=2, batch_size=6, workers=1) as plain:
        assert plain.batch_size == 6 and elastic.batch_size == 6
        with pytest.raises(ValueError, match="taken by an elastic reader"):
            plain.load_state_dict(elastic.state_dict())
        with pytest.raises(ValueError, match="not an elastic state_dict"):
            elastic.load_state_dict(plain.state_dict())


def test_plain_reader_state_dict_resumes_the_same_shard(tree):
    root, ids = tree
    with fastread.Reader(root, shard_id=1, num_shards=2, batch_size=5, random_shuffle=True,
                         seed=4, workers=1) as r:
        r.set_epoch(3)
        it = iter(r)
        head = [sample_ids(next(it)[0], ids) for _ in range(2)]
        state = r.state_dict()
        rest = [sample_ids(a, ids) for a, _ in it]
        assert state["epoch"] == 3 and state["batches_delivered"] == 2
    with fastread.Reader(root, shard_id=1, num_shards=2, batch_size=5, random_shuffle=True,
                         seed=4, workers=1) as again:
        again.load_state_dict(state)
        assert [sample_ids(a, ids) for a, _ in again] == rest
        assert len(head) + len(rest) == len(again)
    with fastread.Reader(root, shard_id=0, num_shards=2, batch_size=5, workers=1) as other:
        with pytest.raises(ValueError, match="taken with seed=4"):
            other.load_state_dict(state)


def test_image_loader_elastic_resume(tree):
    pytest.importorskip("torch")
    from fastread.torch import ImageLoader

    root, ids = tree
    seen = collections.Counter()
    loaders = [ImageLoader(root, decode=False, shard_id=r, num_shards=4, global_batch_size=GLOBAL,
                           random_shuffle=True, seed=2, drop_last=True, workers=1)
               for r in range(4)]
    its = [iter(ldr) for ldr in loaders]
    for it in its:
        images, labels = next(it)
        assert len(images) == 3 and labels.dtype.__str__() == "torch.int64"
        seen.update(sample_ids([t.numpy() for t in images], ids))
    state = loaders[0].state_dict()
    assert state["samples_consumed"] == GLOBAL and state["epoch"] == 0
    for ldr in loaders:
        ldr.close()
    resumed = [ImageLoader(root, decode=False, shard_id=r, num_shards=2, global_batch_size=GLOBAL,
                           random_shuffle=True, seed=2, drop_last=True, workers=1)
               for r in range(2)]
    for ldr in resumed:
        ldr.load_state_dict(state)
        assert len(ldr) == N_FILES // GLOBAL
        for images, _ in ldr:
            assert len(images) == 6
            seen.update(sample_ids([t.numpy() for t in images], ids))
        assert ldr.state_dict()["epoch"] == 1
        ldr.close()
    order = global_order(N_FILES, shuffle=True, seed=2, epoch=0)
    assert seen == collections.Counter(order[:48].tolist())
    plain = ImageLoader(root, decode=False, shard_id=0, num_shards=2, workers=1)
    try:
        with pytest.raises(ValueError, match="taken by an elastic loader"):
            plain.load_state_dict(state)
    finally:
        plain.close()


def test_image_loader_decoded_counts_batches_delivered_not_read_ahead(tmp_path):
    """The decoding ImageLoader's DALI pipeline pulls batches ahead of the
    loop; its elastic state counts the batches the loop got."""
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali")
    from fastread.datasets import make_imagenet_like
    from fastread.torch import ImageLoader

    root = str(tmp_path / "jpegs")
    make_imagenet_like(root, classes=2, per_class=13, seed=3, mean_kb=2, width=40, height=32,
                       workers=1, progress=False)  # 26 images: 3 global batches of 8, 2 left

    def loader(rank, world):
        return ImageLoader(root, size=16, num_threads=1, shard_id=rank, num_shards=world,
                           global_batch_size=8, random_shuffle=True, seed=1)

    def key(image):
        return hashlib.sha1(image.numpy().tobytes()).hexdigest()

    whole = loader(0, 1)
    expect = collections.Counter(key(img) for images, _ in whole for img in images)
    whole.close()
    assert sum(expect.values()) == 26
    seen = collections.Counter()
    first = [loader(r, 2) for r in range(2)]
    for ldr in first:
        images, _ = next(iter(ldr))
        assert images.shape == (4, 3, 16, 16)
        seen.update(key(img) for img in images)
    state = first[0].state_dict()
    assert state["samples_consumed"] == 8  # though DALI has read further ahead
    assert first[0].reader.position()[1] > 1
    for ldr in first:
        ldr.close()
    rest = loader(0, 1)
    rest.load_state_dict(state)
    seen.update(key(img) for images, _ in rest for img in images)
    rest.close()
    assert seen == expect


@pytest.mark.parametrize("in_memory", [True, False])
def test_cifar10_loader_elastic_resume(tmp_path, in_memory):
    pytest.importorskip("torch")
    from fastread.datasets import make_cifar10
    from fastread.torch import Cifar10Loader

    root = str(tmp_path / "cifar")
    make_cifar10(root, train_per_class=5, test_per_class=1, seed=2)  # 50 train records

    def loader(rank, world):
        return Cifar10Loader(root, shard_id=rank, num_shards=world, global_batch_size=12,
                             random_shuffle=True, seed=4, drop_last=True, in_memory=in_memory,
                             workers=1)

    def keys(images):
        return [hashlib.sha1(img.numpy().tobytes()).hexdigest() for img in images]

    whole = loader(0, 1)
    expect = collections.Counter(k for images, _ in whole for k in keys(images))
    assert sum(expect.values()) == 48
    seen = collections.Counter()
    for rank in range(4):
        ldr = loader(rank, 4)
        it = iter(ldr)
        for _ in range(3):
            images, _ = next(it)
            assert images.shape[0] == 3
            seen.update(keys(images))
        state = ldr.state_dict()
        ldr.close()
    assert state["samples_consumed"] == 36
    for rank in range(2):
        ldr = loader(rank, 2)
        ldr.load_state_dict(state)
        seen.update(k for images, _ in ldr for k in keys(images))
        ldr.close()
    assert seen == expect


def test_dali_reader_elastic_resume(tree):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from fastread.dali import readers

    root, ids = tree

    def pipe(w, r, **kw):
        @pipeline_def(batch_size=GLOBAL // w, num_threads=1, device_id=None,
                      prefetch_queue_depth=2)
        def p():
            data, labels = readers.file(file_root=root, shard_id=r, num_shards=w,
                                        random_shuffle=True, seed=5, epoch_end="stop",
                                        global_batch_size=GLOBAL, **kw)
            return data, labels
        return p()

    seen = collections.Counter()
    first = [pipe(3, r) for r in range(3)]
    for p in first:
        p.build()
        for _ in range(3):  # DALI reads ahead: the reader has handed out more
            data, _ = p.run()
            seen.update(sample_ids([np.array(t) for t in data], ids))
    state = readers.state_dict(first[0], 3)
    assert state["samples_consumed"] == 3 * GLOBAL
    assert all(readers.state_dict(p, 3) == state for p in first)
    with pytest.raises(RuntimeError, match="before build"):
        readers.load_state_dict(first[0], state)
    del first
    rest = [pipe(2, r) for r in range(2)]
    for p in rest:
        readers.load_state_dict(p, state)
        p.build()
        for _ in range(elastic_batches(N_FILES, GLOBAL) - 3):
            data, _ = p.run()
            seen.update(sample_ids([np.array(t) for t in data], ids))
    assert seen == collections.Counter(range(N_FILES))


def elastic_file_pipe(root, w, r, *, native, checkpoint=None, depth=2, **kw):
    from nvidia.dali import pipeline_def

    from fastread.dali import readers

    @pipeline_def(batch_size=GLOBAL // w, num_threads=1, device_id=None,
                  prefetch_queue_depth=depth, enable_checkpointing=True)
    def p():
        data, labels = readers.file(file_root=root, shard_id=r, num_shards=w,
                                    random_shuffle=True, seed=6, pad_last_batch=True,
                                    global_batch_size=GLOBAL, native=native, name="files", **kw)
        return data, labels
    pipe = p(checkpoint=checkpoint) if checkpoint is not None else p()
    pipe.build()
    return pipe


def run_ids(pipe, count, ids):
    out = []
    for _ in range(count):
        data, _ = pipe.run()
        out.append(sample_ids([np.array(t) for t in data], ids))
    return out


@pytest.mark.parametrize("depth", [1, 3])
def test_dali_operator_checkpoint_resumes_at_another_world_size(tree, depth):
    """fn.fastread.readers.file with global_batch_size: the same batches as
    the external source, and pipe.checkpoint() taken with 3 shards restores
    a pipeline of 2 (and 4) shards at the next global batch."""
    pytest.importorskip("nvidia.dali")
    from fastread.dali import _plugin
    if not _plugin.load():
        pytest.skip(f"the native DALI plugin does not load: {_plugin.reason()}")
    root, ids = tree
    batches = elastic_batches(N_FILES, GLOBAL, pad_last_batch=True)  # 5 a epoch
    native = elastic_file_pipe(root, 3, 1, native=True, depth=depth)
    external = elastic_file_pipe(root, 3, 1, native=False, depth=depth)
    assert native.reader_meta("files")["epoch_size_padded"] == batches * GLOBAL
    assert external.reader_meta("files") == native.reader_meta("files")
    # rolling epochs: both paths give the same batches, epoch after epoch
    assert run_ids(native, 2 * batches, ids) == run_ids(external, 2 * batches, ids)
    del native, external
    for k in (2, batches + 3):  # mid-epoch, in the second epoch
        seen = collections.Counter()
        cps = []
        for r in range(3):
            pipe = elastic_file_pipe(root, 3, r, native=True, depth=depth)
            for batch in run_ids(pipe, k, ids)[(k // batches) * batches:]:
                seen.update(batch)
            cps.append(pipe.checkpoint())
        assert len(set(cps)) == 1, "every rank's checkpoint is the same"
        for w in (2, 4):
            rest = collections.Counter(seen)
            for r in range(w):
                pipe = elastic_file_pipe(root, w, r, native=True, depth=depth,
                                         checkpoint=cps[0])
                for batch in run_ids(pipe, batches - k % batches, ids):
                    rest.update(batch)
            order = global_order(N_FILES, shuffle=True, seed=6, epoch=k // batches)
            expect = collections.Counter(range(N_FILES))
            expect[int(order[-1])] += batches * GLOBAL - N_FILES
            assert rest == expect, (k, w)
    # a per-shard checkpoint does not restore an elastic reader
    from nvidia.dali import pipeline_def

    from fastread.dali import readers

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, enable_checkpointing=True)
    def plain():
        return readers.file(file_root=root, shard_id=0, num_shards=3, random_shuffle=True,
                            seed=6, pad_last_batch=True, native=True, name="files")
    other = plain()
    other.build()
    other.run()
    with pytest.raises(Exception, match="not a checkpoint of an elastic reader with "
                                        "global_batch_size=12"):
        elastic_file_pipe(root, 3, 0, native=True, checkpoint=other.checkpoint()).run()


def test_dali_operator_elastic_checkpoint_refuses_another_global_order(tree):
    """An elastic checkpoint (portable across world sizes) still belongs to
    one global order: the data set's size and the shuffle define it."""
    pytest.importorskip("nvidia.dali")
    from fastread.dali import _plugin
    if not _plugin.load():
        pytest.skip(f"the native DALI plugin does not load: {_plugin.reason()}")
    from nvidia.dali import pipeline_def

    from fastread.dali import readers

    root, ids = tree
    paths, _ = fastread.scan(root)

    def pipe(n, shuffle, w, checkpoint=None):
        @pipeline_def(batch_size=GLOBAL // w, num_threads=1, device_id=None,
                      enable_checkpointing=True)
        def p():
            return readers.file(files=paths[:n], shard_id=0, num_shards=w, seed=6,
                                random_shuffle=shuffle, pad_last_batch=True,
                                global_batch_size=GLOBAL, native=True, name="files")
        out = p(checkpoint=checkpoint) if checkpoint is not None else p()
        out.build()
        return out

    first = pipe(N_FILES, True, 3)
    first.run()
    cp = first.checkpoint()
    pipe(N_FILES, True, 2, checkpoint=cp).run()  # another world size: resumes
    with pytest.raises(Exception, match="saved by a reader with num_samples=53, this reader "
                                        "has num_samples=40"):
        pipe(40, True, 2, checkpoint=cp)
    with pytest.raises(Exception, match="saved by a reader with random_shuffle=1, this reader "
                                        "has random_shuffle=0"):
        pipe(N_FILES, False, 4, checkpoint=cp)


@pytest.mark.parametrize("native", [True, False])
def test_dali_iterator_counts_elastic_rolling_epochs_with_fill(tmp_path, native):
    """DALIGenericIterator(reader_name=..., FILL) over an elastic reader
    (rolling epochs, pad_last_batch) ends each epoch after its global
    batches, with this rank's slices of them (the reader_meta it reads is
    the elastic one)."""
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali")
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from conftest import write_class_tree
    from fastread.dali import _plugin
    if native and not _plugin.load():
        pytest.skip(f"the native DALI plugin does not load: {_plugin.reason()}")
    # files of one size: the iterator makes tensors of whole batches
    root, content = write_class_tree(tmp_path / "even", [20, 18, 15], seed=5, sizes=[64],
                                     max_size=64)
    ids = {hashlib.sha1(data).hexdigest(): i for i, data in enumerate(content.values())}
    it = DALIGenericIterator(elastic_file_pipe(root, 3, 1, native=native), ["data", "label"],
                             reader_name="files", last_batch_policy=LastBatchPolicy.FILL)
    batches = elastic_batches(N_FILES, GLOBAL, pad_last_batch=True)
    assert len(it) == batches
    for epoch in range(2):
        got = [ids[hashlib.sha1(row.numpy().tobytes()).hexdigest()]
               for out in it for row in out[0]["data"]]
        it.reset()
        assert got == elastic_indices(N_FILES, global_batch_size=GLOBAL, shard_id=1,
                                      num_shards=3, shuffle=True, seed=6, epoch=epoch,
                                      pad_last_batch=True).tolist()


def test_dali_webdataset_operator_elastic(tmp_path):
    """readers.webdataset with global_batch_size: the operator and the
    external source give the same batches (with initial_fill too: the
    buffer runs over the whole set), and the operator's checkpoint taken
    with 3 shards resumes with 2."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from fastread.dali import _plugin, readers
    from fastread.datasets import make_webdataset
    if not _plugin.load():
        pytest.skip(f"the native DALI plugin does not load: {_plugin.reason()}")
    make_webdataset(str(tmp_path / "wds"), shards=3, per_shard=17, width=8, height=8)  # 51
    paths = sorted(str(p) for p in (tmp_path / "wds").glob("*.tar"))

    def pipe(w, r, native, checkpoint=None, **kw):
        @pipeline_def(batch_size=GLOBAL // w, num_threads=1, device_id=None,
                      enable_checkpointing=True)
        def p():
            jpg, _cls = readers.webdataset(paths=paths, ext=["jpg", "cls"], shard_id=r,
                                           num_shards=w, random_shuffle=True, seed=8,
                                           pad_last_batch=True, global_batch_size=GLOBAL,
                                           native=native, name="wds", **kw)
            return jpg
        out = p(checkpoint=checkpoint) if checkpoint is not None else p()
        out.build()
        return out

    def run(p, count):
        return [[hashlib.sha1(np.array(t).tobytes()).hexdigest() for t in p.run()[0]]
                for _ in range(count)]

    batches = elastic_batches(51, GLOBAL, pad_last_batch=True)
    for kw in ({}, {"initial_fill": 7}):
        assert run(pipe(3, 2, True, **kw), batches + 2) == run(pipe(3, 2, False, **kw),
                                                               batches + 2)
    seen = collections.Counter()
    for r in range(3):
        p = pipe(3, r, True)
        for b in run(p, 2):
            seen.update(b)
        cp = p.checkpoint()
    for r in range(2):
        for b in run(pipe(2, r, True, checkpoint=cp), batches - 2):
            seen.update(b)
    whole = collections.Counter()
    for b in run(pipe(1, 0, False), batches):
        whole.update(b)
    assert seen == whole and sum(whole.values()) == batches * GLOBAL


def test_dali_elastic_arguments(tree):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from fastread.dali import readers

    root, _ = tree
    for native in (False, None):
        with pytest.raises(ValueError, match="needs pad_last_batch=True"):
            @pipeline_def(batch_size=6, num_threads=1, device_id=None)
            def rolling():
                return readers.file(file_root=root, num_shards=2, global_batch_size=GLOBAL,
                                    native=native)
            rolling()
        with pytest.raises(ValueError, match=r"pipeline's batch_size \(5\) must be"):
            @pipeline_def(batch_size=5, num_threads=1, device_id=None)
            def wrong():
                return readers.file(file_root=root, num_shards=2, global_batch_size=GLOBAL,
                                    pad_last_batch=True, native=native)
            wrong()
        with pytest.raises(ValueError, match="not divisible by the world size"):
            @pipeline_def(batch_size=2, num_threads=1, device_id=None)
            def uneven():
                return readers.file(file_root=root, num_shards=5, global_batch_size=GLOBAL,
                                    pad_last_batch=True, native=native)
            uneven()


# -- torchrun on loopback ---------------------------------------------------------

CHILD = textwrap.dedent('''
    import hashlib, json, os, sys
    import numpy as np
    import torch.distributed as dist
    import fastread
    from fastread import _defaults
    from fastread.torch import ImageLoader

    root, phase, out_dir, state_dir, stop = sys.argv[1:6]
    stop = int(stop)
    dist.init_process_group("gloo")
    node = _defaults.node_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (node["rank"], node["world_size"]) == (rank, world), (node, rank, world)
    assert node["rank"] == node["group_rank"] * node["local_world_size"] + node["local_rank"]
    assert node["local_world_size"] == int(os.environ["EXPECT_LOCAL_WORLD_SIZE"])
    expect_workers = min(8, max(1, (os.cpu_count() or 1) // 2 // node["local_world_size"]))
    assert _defaults.reader_workers() == expect_workers

    def ids(arrays):
        return [hashlib.sha1(bytes(np.asarray(a))).hexdigest() for a in arrays]

    def run(name, make, batches_of):
        loader = make()
        state_path = os.path.join(state_dir, name + ".json")
        if phase == "resume":
            with open(state_path) as f:
                loader.load_state_dict(json.load(f))
        else:
            loader.set_epoch(1)
        got, n = [], 0
        for batch in loader:
            got.extend(ids(batches_of(batch)))
            n += 1
            if phase == "first" and n == stop:
                break
        # ranks agree on the batches they read (a DDP step would hang otherwise)
        counts = [None] * world
        dist.all_gather_object(counts, n)
        assert len(set(counts)) == 1, counts
        if phase == "first":
            state = loader.state_dict()
            states = [None] * world
            dist.all_gather_object(states, state)
            assert all(s == states[0] for s in states), states
            if rank == 0:
                with open(state_path, "w") as f:
                    json.dump(state, f)
        loader.close()
        return got

    common = dict(random_shuffle=True, seed=11, global_batch_size=12, workers=1)
    out = {
        "reader": run("reader", lambda: fastread.Reader(root, shard_id=rank, num_shards=world,
                                                        **common), lambda b: b[0]),
        "reader_pad": run("reader_pad", lambda: fastread.Reader(
            root, shard_id=rank, num_shards=world, pad_last_batch=True, **common),
            lambda b: b[0]),
        # shards from torchrun's environment
        "images": run("images", lambda: ImageLoader(root, decode=False, drop_last=True,
                                                    **common),
                      lambda b: [t.numpy() for t in b[0]]),
    }
    with open(os.path.join(out_dir, f"{phase}-{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
''')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script, args, nodes, per_node, tmp_path, tag, node_env=None):
    """`script` under torchrun: `nodes` agents of `per_node` ranks each, one
    c10d rendezvous on loopback; node_env(node) adds to one agent's
    environment (what a node's machine would have, e.g. its cache disk)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EXPECT_LOCAL_WORLD_SIZE": str(per_node),
           "FASTREAD_WORKERS": "0", "PYTHONPATH": HERE}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(var, None)
    procs = []
    for node in range(nodes):
        node_vars = {**env, **(node_env(node) if node_env else {})}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
               f"--nproc-per-node={per_node}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=elastic-{tag}",
               f"--node-rank={node}", "--max-restarts=0", script, *args]
        log = open(tmp_path / f"{tag}-node{node}.log", "w")
        procs.append((subprocess.Popen(cmd, env=node_vars, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=str(tmp_path)), log))
    failed = []
    for p, log in procs:
        try:
            rc = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        log.close()
        if rc != 0:
            failed.append(rc)
    if failed:
        logs = "\n".join((tmp_path / f"{tag}-node{n}.log").read_text()[-3000:]
                         for n in range(nodes))
        pytest.fail(f"torchrun {nodes}x{per_node} ({tag}) failed ({failed}):\n{logs}")


def test_torchrun_resume_at_another_world_size(tree, tmp_path):
    """2 "nodes" x 2 ranks read 2 global batches of epoch 1 and save the
    state; 1 node x 3 ranks resume it (each torchrun start costs seconds
    on the 2-core VM, so one direction: the unit tests cover the rest)."""
    pytest.importorskip("torch.distributed")
    root, ids = tree
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out_dir, state_dir = tmp_path / "out", tmp_path / "state"
    out_dir.mkdir()
    state_dir.mkdir()
    first, then = (2, 2), (1, 3)
    stop = 2  # global batches read before the state is taken
    torchrun(str(script), [root, "first", str(out_dir), str(state_dir), str(stop)], *first,
             tmp_path, "first")
    for name in ("reader", "reader_pad", "images"):
        with open(state_dir / f"{name}.json") as f:
            state = json.load(f)
        assert state["epoch"] == 1 and state["samples_consumed"] == stop * GLOBAL, (name, state)
    torchrun(str(script), [root, "resume", str(out_dir), str(state_dir), "0"], *then,
             tmp_path, "resume")
    seen = {name: collections.Counter() for name in ("reader", "reader_pad", "images")}
    for phase, world in (("first", first[0] * first[1]), ("resume", then[0] * then[1])):
        for rank in range(world):
            with open(out_dir / f"{phase}-{rank}.json") as f:
                got = json.load(f)
            for name, hashes in got.items():
                seen[name].update(ids[h] for h in hashes)
    order = global_order(N_FILES, shuffle=True, seed=11, epoch=1)
    # every sample of the epoch exactly once over both runs
    assert seen["reader"] == collections.Counter(range(N_FILES))
    padded = collections.Counter(range(N_FILES))
    padded[int(order[-1])] += (-N_FILES) % GLOBAL
    assert seen["reader_pad"] == padded
    assert seen["images"] == collections.Counter(order[:N_FILES // GLOBAL * GLOBAL].tolist())


CACHE_CHILD = textwrap.dedent('''
    import json, os, sys
    import torch.distributed as dist
    import fastread

    url, out_dir = sys.argv[1:3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    reader = fastread.Reader(url, shard_id=rank, num_shards=world, global_batch_size=12,
                             random_shuffle=True, seed=5, workers=1)
    names = []
    for epoch in range(2):
        reader.set_epoch(epoch)
        for arrays, labels in reader:
            pass
        names.extend(reader.paths[i] for i in reader._epoch_order(epoch))
    stats = reader.stats()
    reader.close()
    dist.barrier()
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump({"node": os.environ["NODE_TAG"], "names": names,
                   "misses": stats["cache_misses"], "hits": stats["cache_hits"],
                   "cache_dir": os.environ["FASTREAD_OBJECT_CACHE_DIR"]}, f)
    dist.destroy_process_group()
''')


def test_torchrun_ranks_of_a_node_share_its_object_cache(tree, tmp_path, s3_engine, s3_server,
                                                        s3_proxy):
    """2 "nodes" x 2 ranks read 2 elastic epochs of s3:// objects, each node
    with its own FASTREAD_OBJECT_CACHE_DIR: the ranks of a node fetch each
    object once between them (the other rank, and the next epoch, hit the
    node's cache), so no object is fetched more often than there are nodes."""
    root, _ = tree
    s3_server.make_bucket("elastic")
    uploaded = s3_server.upload_tree(root, "elastic", "set")
    script = tmp_path / "cache_child.py"
    script.write_text(CACHE_CHILD)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    aws = {**s3_server.env(), "AWS_ENDPOINT_URL": s3_proxy.endpoint,
           "AWS_ENDPOINT_URL_S3": s3_proxy.endpoint}

    def node_env(node):
        return {**aws, "NODE_TAG": str(node),
                "FASTREAD_OBJECT_CACHE_DIR": str(tmp_path / f"cache-node{node}")}

    torchrun(str(script), ["s3://elastic/set", str(out_dir)], 2, 2, tmp_path, "cache",
             node_env=node_env)
    per_node = collections.defaultdict(lambda: {"names": set(), "misses": 0, "lookups": 0,
                                                "reads": 0, "rank_distinct": 0})
    for rank in range(4):
        with open(out_dir / f"{rank}.json") as f:
            got = json.load(f)
        node = per_node[got["node"]]
        node["names"].update(got["names"])
        node["misses"] += got["misses"]
        node["lookups"] += got["misses"] + got["hits"]
        node["reads"] += len(got["names"])
        node["rank_distinct"] += len(set(got["names"]))
        assert got["cache_dir"].endswith("cache-node" + got["node"])
    assert sorted(per_node) == ["0", "1"]
    for node in per_node.values():
        assert node["lookups"] == node["reads"]  # every read went through the cache
        # each object this node read was fetched once, by one of its ranks: a
        # rank found in the cache what the node's other rank read an epoch
        # before (one cache per rank would have fetched rank_distinct)
        assert node["misses"] == len(node["names"]) < node["rank_distinct"], node
    gets = collections.Counter(t.split("?")[0] for m, t, *_ in s3_proxy.log
                               if m == "GET" and t.split("?")[0].endswith(".jpg"))
    assert sum(gets.values()) == sum(n["misses"] for n in per_node.values())
    assert max(gets.values()) <= 2 and len(gets) == len(uploaded)
