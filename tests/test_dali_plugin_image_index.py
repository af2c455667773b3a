"""Packed images with a version-3 binary index through the native DALI
operator mapping the index itself (fn.fastread.readers.file(image=,
image_index=), what fastread.dali.readers.image passes for a local binary
index): batch for batch the same samples, labels and source names as the
operator given the ranges as lists (the JSON path), across shards, shuffles,
padding and checkpoints; no argument of the pipeline grows with the
samples; an index rewritten since the pipeline was defined, or a layout
that lies outside it, refused naming the index. On CPU-only DALI."""
import os
import shutil

import numpy as np
import pytest

from dali_helpers import (COUNTS, assert_checkpoint_resumes, batches, case_id, image_ranges,
                          make_pipe, packed_class_tree)
from nvidia.dali import fn  # noqa: E402 (dali_helpers skips without DALI)

import fastread  # noqa: E402
from fastread.dali import readers  # noqa: E402
from fastread.dali._native import index_args  # noqa: E402
from fastread.image import PackedImage  # noqa: E402


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """(JSON-indexed image, the same tree packed with a binary index)."""
    base = str(tmp_path_factory.mktemp("image_index_op"))
    root, img = packed_class_tree(base, "tree", seed=23, max_size=7000)
    binary = fastread.pack(root, os.path.join(base, "binary.img"), index_format="binary",
                           progress=False)
    assert img.version == 1 and binary.version == 3
    assert img.mapped_layout is None and binary.mapped_layout is not None
    return img, binary


CASES = [
    dict(),
    dict(pad_last_batch=True),
    dict(num_shards=3, shard_id=2),
    dict(random_shuffle=True, seed=5, num_shards=2, shard_id=1),
    dict(num_shards=4, shard_id=1, stick_to_shard=True, pad_last_batch=True),
]


@pytest.mark.parametrize("batch_size", [1, 6])
@pytest.mark.parametrize("kw", CASES, ids=case_id)
def test_mapped_index_equals_the_list_path(images, kw, batch_size):
    img, binary = images
    mapped = make_pipe(lambda: readers.image(image=binary.path, name="R", native=True, **kw),
                       batch_size)
    listed = make_pipe(lambda: fn.fastread.readers.file(**image_ranges(binary), name="R", **kw),
                       batch_size)
    json_ = make_pipe(lambda: readers.image(image=img.path, name="R", native=True, **kw),
                      batch_size)
    assert not getattr(mapped, "_fastread_readers", [])   # the operator
    assert mapped.reader_meta("R") == listed.reader_meta("R") == json_.reader_meta("R")
    iterations = 2 * (sum(COUNTS) // batch_size + 2)   # two epochs and their rolls
    want = batches(listed, iterations)
    assert batches(mapped, iterations) == want
    assert batches(json_, iterations) == want


def test_arguments_do_not_grow_with_the_samples(images):
    # The serialized pipeline holds the operator's arguments: with the
    # mapped index no list per sample (the list path's holds every range,
    # name and label).
    img, binary = images
    mapped = make_pipe(lambda: readers.image(image=binary.path, native=True), 4)
    listed = make_pipe(lambda: fn.fastread.readers.file(**image_ranges(binary)), 4)
    got, lists = mapped.serialize(), listed.serialize()
    assert b"image_index" in got and b"range_offsets" not in got
    assert len(lists) - len(got) > 10 * len(binary)   # a range, name and label a sample


def test_source_info_and_labels_from_the_mapped_index(images):
    # Shuffled, so that names, labels and bytes must come from the same row
    # of the mapped index (the tree's labels are sorted by class).
    _img, binary = images
    names = list(binary.names)
    p = make_pipe(lambda: readers.image(image=binary.path, native=True, random_shuffle=True,
                                        seed=11), 10)
    data, labels = p.run()
    rows = []
    for i in range(10):
        info = data[i].source_info()
        assert info.startswith(f"{binary.path}[") and info.endswith("]")
        row = names.index(info[len(binary.path) + 1:-1])
        rows.append(row)
        assert int(np.array(labels[i])[0]) == int(binary.labels[row])
        assert np.array(data[i]).tobytes() == binary.read([row])[0].tobytes()
    assert rows != sorted(rows)


def test_checkpoint_restores_the_stream(images):
    _img, binary = images

    def graph():
        return readers.image(image=binary.path, native=True, random_shuffle=True, seed=3,
                             num_shards=2, shard_id=0)
    assert_checkpoint_resumes(graph, make_pipe, before=4, after=6)


def test_index_rewritten_since_definition_is_refused(images, tmp_path):
    # The layout came from the index as fastread read it: an index replaced
    # before the pipeline is built (another pack's, so another header line)
    # is refused naming it, not read with the old layout.
    img, binary = images
    out = str(tmp_path / "copy.img")
    shutil.copyfile(binary.path, out)
    shutil.copyfile(binary.index_path, out + ".index")
    mine = PackedImage(out)
    args = index_args(mine.mapped_layout)
    with open(out + ".index", "r+b") as f:   # another header line, same size
        head = f.read(len(args["index_head"]))
        f.seek(0)
        f.write(head.replace(b"FASTREAD-INDEX", b"FASTREAD-INDEY"))
    with pytest.raises(RuntimeError, match=r"copy\.img\.index.*not the index the pipeline"):
        make_pipe(lambda: fn.fastread.readers.file(image=out, **args), 4)
    os.truncate(out + ".index", args["index_bytes"] - 1)
    with pytest.raises(RuntimeError, match=r"copy\.img\.index.*not the index the pipeline"):
        make_pipe(lambda: fn.fastread.readers.file(image=out, **args), 4)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(index_columns=a["index_columns"][:4]), r"index_columns \(4 given"),
    (lambda a: a.update(index_columns=[a["index_bytes"]] + a["index_columns"][1:]),
     r"column offsets .* lies outside"),
    (lambda a: a.update(index_count=a["index_count"] * 1000), r"column .* lies outside"),
    (lambda a: a.update(index_columns=[a["index_columns"][0] + 4] + a["index_columns"][1:]),
     r"column offsets \(at"),
])
def test_bad_layouts_are_refused_naming_the_index(images, change, match):
    _img, binary = images
    args = index_args(binary.mapped_layout)
    change(args)
    with pytest.raises(RuntimeError, match=r"binary\.img\.index.*" + match):
        make_pipe(lambda: fn.fastread.readers.file(image=binary.path, **args), 4)


def test_image_index_needs_the_image_and_no_lists(images):
    _img, binary = images
    args = index_args(binary.mapped_layout)
    with pytest.raises(RuntimeError, match="image_index=.*give image= too"):
        make_pipe(lambda: fn.fastread.readers.file(**args), 4)
    with pytest.raises(RuntimeError, match="no files=, labels= or range_"):
        make_pipe(lambda: fn.fastread.readers.file(image=binary.path, labels=[0], **args), 4)
