"""fastread.dali.readers.file against DALI's own fn.readers.file (CPU-only)."""
import os

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed: DALI tests need it")
from nvidia.dali import fn, pipeline_def  # noqa: E402
from nvidia.dali.plugin.base_iterator import LastBatchPolicy  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: E402

from fastread.dali import readers  # noqa: E402


@pytest.fixture(scope="module")
def tree(disk_tmp):
    root = os.path.join(disk_tmp, "dali-tree")
    rng = np.random.default_rng(3)
    for c, count in enumerate([7, 11, 5]):
        os.makedirs(os.path.join(root, f"class_{c}"))
        for j in range(count):
            data = f"{c}/{j}".encode() + rng.integers(0, 256, int(rng.integers(0, 3000)),
                                                      dtype=np.uint8).tobytes()
            with open(os.path.join(root, f"class_{c}", f"img{j}.JPEG"), "wb") as f:
                f.write(data)
    return root  # 23 samples


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
    return lambda: readers.file(file_root=root, engine=os.environ.get("FASTREAD_ENGINE", "auto"), **kw)


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


def test_bad_policy_named(tree):
    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return readers.file(file_root=tree, last_batch_policy="SOMETIMES")
    with pytest.raises(ValueError, match="last_batch_policy"):
        pipe()


def test_name_argument_accepted(tree):
    got = epochs(lambda: readers.file(file_root=tree, name="Reader"), 23, 1)
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
