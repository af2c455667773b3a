"""fastread.dali.readers.file against DALI's own fn.readers.file (CPU-only):
rolling epochs (the default) through both paths, the native operator and
the external source, with the DALI iterators' reader_name=; and
epoch_end="stop" (the external source ending each epoch)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed: DALI tests need it")
from nvidia.dali import fn, pipeline_def  # noqa: E402
from nvidia.dali.plugin.base_iterator import LastBatchPolicy  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: E402

from fastread.dali import _plugin, readers  # noqa: E402

# The two paths of readers.file; the operator's only where its plugin loads.
PATHS = [pytest.param(False, id="external"),
         pytest.param(True, id="native", marks=pytest.mark.skipif(
             not _plugin.load(), reason=f"fastread's DALI plugin: {_plugin.reason()}"))]


@pytest.fixture(scope="module")
def tree(class_tree):
    return class_tree("dali-tree", [7, 11, 5], seed=3, max_size=3000, tag=True,
                      class_name="class_{c}", file_name="img{j}.JPEG")[0]  # 23 samples


def epochs(reader_fn, batch_size, n_epochs, **iter_args):
    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None)
    def pipe():
        data, labels = reader_fn()
        return fn.pad(data), labels  # the torch iterator wants dense batches

    it = DALIGenericIterator([pipe()], ["data", "labels"], **iter_args)
    out = []
    for _ in range(n_epochs):
        samples = []
        for batch in it:
            data, labels = batch[0]["data"], batch[0]["labels"]
            for row, label in zip(data, labels):
                samples.append((bytes(row.numpy()[:8]), int(label)))
        out.append(samples)
        it.reset()
    return out


def dali_file(root, **kw):
    return lambda: fn.readers.file(file_root=root, name="Reader", **kw)


def fast_file(root, **kw):
    """epoch_end="stop": the external source ending every epoch."""
    return lambda: readers.file(file_root=root, engine=os.environ.get("FASTREAD_ENGINE", "auto"),
                                epoch_end="stop", **kw)


def rolling_file(root, native, **kw):
    """The default: rolling epochs, named for the iterators' reader_name."""
    return lambda: readers.file(file_root=root, engine=os.environ.get("FASTREAD_ENGINE", "auto"),
                                native=native, name="Reader", **kw)


ROLL_CASES = [dict(), dict(pad_last_batch=True), dict(num_shards=3, shard_id=1),
              dict(num_shards=3, shard_id=2, pad_last_batch=True),
              dict(num_shards=2, shard_id=1, stick_to_shard=True)]


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("policy", ["PARTIAL", "DROP", "FILL"])
@pytest.mark.parametrize("kw", ROLL_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_rolling_epochs_match_dali_with_reader_name(tree, native, policy, kw):
    # What a training loop sees through DALIGenericIterator(reader_name=...)
    # over 3 epochs: batch for batch fn.readers.file's, epoch shifts,
    # padding, shard rotation and the iterator's last-batch policy included.
    it_args = dict(reader_name="Reader", last_batch_policy=getattr(LastBatchPolicy, policy))
    want = epochs(dali_file(tree, **kw), 4, 3, **it_args)
    got = epochs(rolling_file(tree, native, **kw), 4, 3, **it_args)
    assert got == want


@pytest.mark.parametrize("native", PATHS)
def test_rolling_pipeline_never_stops(tree, native):
    @pipeline_def(batch_size=5, num_threads=2, device_id=None)
    def pipe():
        return rolling_file(tree, native)()

    p = pipe()
    p.build()
    labels = [int(x) for _ in range(12) for x in np.array(p.run()[1].as_tensor()).ravel()]
    want = [label for _, label in epochs(dali_file(tree), 23, 1, reader_name="Reader")[0]]
    assert labels == (want * 3)[:60]  # 60 samples: 2.6 epochs, no StopIteration


@pytest.mark.parametrize("native", PATHS)
def test_rolling_shuffled_epochs_hold_every_sample_once(tree, native):
    everything = sorted(epochs(dali_file(tree), 23, 1, reader_name="Reader")[0])
    per_epoch = epochs(rolling_file(tree, native, random_shuffle=True, seed=4, pad_last_batch=True),
                       6, 3, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)
    for samples in per_epoch:
        assert sorted(samples) == everything
    assert per_epoch[0] != per_epoch[1]


def test_packed_image_rolls_like_dali(tree, disk_tmp):
    import fastread
    img = os.path.join(disk_tmp, "dali-tree.img")
    if not os.path.exists(img):
        fastread.pack(tree, img)
    it_args = dict(reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)
    want = epochs(dali_file(tree, num_shards=2, shard_id=1), 4, 3, **it_args)
    got = epochs(lambda: readers.image(image=img, name="Reader", num_shards=2, shard_id=1),
                 4, 3, **it_args)
    assert got == want


def test_reader_meta_of_the_external_source(tree):
    @pipeline_def(batch_size=4, num_threads=2, device_id=None)
    def pipe():
        a = readers.file(file_root=tree, native=False, name="A", num_shards=2, shard_id=1,
                         pad_last_batch=True)
        b = fn.readers.file(file_root=tree, name="B")
        return (*a, *b)

    p = pipe()
    p.build()
    want = dict(epoch_size=23, epoch_size_padded=24, number_of_shards=2, shard_id=1,
                pad_last_batch=True, stick_to_shard=False)
    assert p.reader_meta("A") == want
    assert p.reader_meta("B")["epoch_size"] == 23  # DALI's own readers still answer
    assert set(p.reader_meta()) == {"A", "B"}


def test_automatic_path_choice(tree):
    def readers_of(**kw):
        @pipeline_def(batch_size=4, num_threads=2, device_id=None)
        def pipe():
            return readers.file(file_root=tree, **kw)
        return getattr(pipe(), "_fastread_readers", [])

    # The external source registers its Reader on the pipeline; the operator does not.
    assert len(readers_of(epoch_end="stop")) == 1
    assert len(readers_of(native=False)) == 1
    assert len(readers_of()) == (0 if _plugin.load() else 1)
    assert len(readers_of(device_output=False)) == 1  # not one of the operator's options


def test_native_true_refusals(tree):
    def pipe(**kw):
        return pipeline_def(batch_size=4, num_threads=2, device_id=None)(
            lambda: readers.file(file_root=tree, native=kw.pop("native", True), **kw))()

    with pytest.raises(ValueError, match="epoch_end='stop' needs the external source"):
        pipe(epoch_end="stop")
    with pytest.raises(ValueError, match="does not take xnvme_be"):
        pipe(xnvme_be="io_uring")
    with pytest.raises(ValueError, match="native must be"):
        pipe(native="yes")


def test_native_true_without_the_plugin_says_why(tree):
    code = textwrap.dedent(f"""
        from nvidia.dali import pipeline_def
        from fastread.dali import readers

        @pipeline_def(batch_size=4, num_threads=1, device_id=None)
        def pipe():
            return readers.file(file_root={tree!r}, native=True)
        try:
            pipe()
        except RuntimeError as e:
            print("RAISED", e)
        @pipeline_def(batch_size=4, num_threads=1, device_id=None)
        def fallback():
            return readers.file(file_root={tree!r})
        p = fallback()
        p.build()
        print("FALLBACK", len(p.run()[0]), len(p._fastread_readers))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, FASTREAD_DALI_PLUGIN="0"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "RAISED" in r.stdout and "FASTREAD_DALI_PLUGIN=0" in r.stdout
    assert "FALLBACK 4 1" in r.stdout


def test_rolling_rejects_last_batch_policy(tree):
    @pipeline_def(batch_size=4, num_threads=2, device_id=None)
    def pipe():
        return readers.file(file_root=tree, last_batch_policy="DROP")

    with pytest.raises(ValueError, match="give it to the DALI iterator"):
        pipe()
    with pytest.raises(ValueError, match="epoch_end must be"):
        pipeline_def(batch_size=4, num_threads=1, device_id=None)(
            lambda: readers.file(file_root=tree, epoch_end="never"))()


@pytest.mark.parametrize("batch_size", [4, 23, 64])
def test_same_samples_and_labels_in_order(tree, batch_size):
    want = epochs(dali_file(tree), batch_size, 1, reader_name="Reader",
                  last_batch_policy=LastBatchPolicy.PARTIAL)
    got = epochs(fast_file(tree), batch_size, 1)
    assert got == want


# Over several epochs DALI's reader keeps streaming past an epoch's end to
# fill the last batch, so its next epoch starts shifted unless the reader pads
# (pad_last_batch=True). fastread's epochs always start at the epoch's start:
# compare with DALI's padded reader, whose padding the iterator drops.
PADDED = dict(reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)


@pytest.mark.parametrize("batch_size", [4, 23])
def test_same_samples_every_epoch(tree, batch_size):
    want = epochs(dali_file(tree, pad_last_batch=True), batch_size, 3, **PADDED)
    got = epochs(fast_file(tree), batch_size, 3)
    assert got == want


@pytest.mark.parametrize("stick", [True, False])
def test_shards_match_dali_over_epochs(tree, stick):
    for shard in range(3):
        want = epochs(dali_file(tree, shard_id=shard, num_shards=3, stick_to_shard=stick,
                                pad_last_batch=True), 4, 3, **PADDED)
        got = epochs(fast_file(tree, shard_id=shard, num_shards=3, stick_to_shard=stick), 4, 3)
        assert got == want, f"shard {shard}"


@pytest.mark.parametrize("policy", ["DROP", "FILL"])
def test_last_batch_policies_match_dali(tree, policy):
    pad = policy == "FILL"
    want = epochs(dali_file(tree, shard_id=1, num_shards=2, pad_last_batch=pad, stick_to_shard=True),
                  5, 2, reader_name="Reader", last_batch_policy=getattr(LastBatchPolicy, policy))
    got = epochs(fast_file(tree, shard_id=1, num_shards=2, pad_last_batch=pad, stick_to_shard=True,
                           last_batch_policy=policy), 5, 2)
    if policy == "FILL":
        assert got == want  # padding repeats the shard's last sample, as DALI does
    else:
        # Unpadded, DALI's next epoch starts shifted past the dropped samples.
        assert got[0] == want[0] and len(got[1]) == len(want[1])


def test_shuffled_epochs_hold_every_sample_once(tree):
    everything = sorted(epochs(dali_file(tree), 23, 1, reader_name="Reader")[0])
    per_epoch = epochs(fast_file(tree, random_shuffle=True, seed=4), 6, 3)
    for samples in per_epoch:
        assert sorted(samples) == everything
    assert per_epoch[0] != per_epoch[1]
    # Shards of the same seed partition every epoch.
    shards = [epochs(fast_file(tree, random_shuffle=True, seed=4, shard_id=s, num_shards=3,
                               stick_to_shard=True), 4, 2) for s in range(3)]
    for ep in range(2):
        assert sorted(x for sh in shards for x in sh[ep]) == everything


def test_no_copy_option_gives_same_bytes(tree):
    a = epochs(fast_file(tree, no_copy=True), 6, 2)
    b = epochs(fast_file(tree, no_copy=False), 6, 2)
    assert a == b


def test_outside_pipeline_is_a_clear_error(tree):
    with pytest.raises(RuntimeError, match="inside a DALI pipeline"):
        readers.file(file_root=tree)
    with pytest.raises(RuntimeError, match="inside a DALI pipeline"):
        readers.file(file_root=tree, native=False)


def test_bad_policy_named(tree):
    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return readers.file(file_root=tree, last_batch_policy="SOMETIMES", epoch_end="stop")
    with pytest.raises(ValueError, match="last_batch_policy"):
        pipe()


def test_name_argument_accepted(tree):
    got = epochs(lambda: readers.file(file_root=tree, name="Reader", epoch_end="stop"), 23, 1)
    assert len(got[0]) == 23


@pytest.fixture(scope="module")
def mixed_case_tree(disk_tmp):
    root = os.path.join(disk_tmp, "dali-mixed-case")
    for d, names in {"keep_a": ["x.jpg", "Y.JPG", "z.png"], "keep_b": ["w.JPG", "v.jpg"],
                     "skip_c": ["u.jpg"]}.items():
        os.makedirs(os.path.join(root, d))
        for name in names:
            with open(os.path.join(root, d, name), "wb") as f:
                f.write(f"{d}/{name}".encode())
    return root


@pytest.mark.parametrize("kw", [dict(file_filters=["*.jpg"], case_sensitive_filter=True),
                                dict(file_filters=["*.jpg"], case_sensitive_filter=False),
                                dict(dir_filters=["keep_*"])],
                         ids=["case-sensitive", "case-insensitive", "dir_filters"])
def test_filters_match_dali(mixed_case_tree, kw):
    # readers.file accepted dir_filters and case_sensitive_filter but did not
    # pass them on to the scan: the samples differed from DALI's.
    want = epochs(dali_file(mixed_case_tree, **kw), 3, 1, reader_name="Reader",
                  last_batch_policy=LastBatchPolicy.PARTIAL)
    got = epochs(fast_file(mixed_case_tree, **kw), 3, 1)
    assert got == want


def test_stop_state_dict_counts_the_epochs_own_shard(class_tree):
    # stick_to_shard=False: epoch 2 of shard 0 of 3 reads shard 2, 4 of the
    # 10 samples (epoch 0 read 3): its positions and size are epoch 2's.
    root, _ = class_tree("dali-rotating", [10], seed=4, max_size=300)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return readers.file(file_root=root, shard_id=0, num_shards=3, stick_to_shard=False,
                            epoch_end="stop", name="R")

    p = pipe()
    assert readers.epoch_size(p) == 3
    readers.load_state_dict(p, {"epoch": 2, "batches_delivered": 0, "num_samples": 10,
                                "batch_size": 1, "seed": 0, "shuffle": False, "shard_id": 0,
                                "num_shards": 3})
    assert readers.epoch_size(p) == 4
    p.build()
    for _ in range(3):
        p.run()
    assert {k: v for k, v in readers.state_dict(p, 3).items()
            if k in ("epoch", "batches_delivered")} == {"epoch": 2, "batches_delivered": 3}
    state = readers.state_dict(p, 4)
    assert (state["epoch"], state["batches_delivered"]) == (3, 0)
    with pytest.raises(ValueError, match=r"in \[0, 4\] \(the batches of this shard's epoch 2\)"):
        readers.state_dict(p, 5)
