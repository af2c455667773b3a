"""`fastread pack` from a Parquet data set (issue 40): the packed image
equal to packing the JPEG tree the Parquet was written from, plain and
decoded; nulls named; the CLI."""
import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import fastread  # noqa: E402
from fastread.cli import main as cli_main  # noqa: E402
from fastread.datasets import make_imagenet_like  # noqa: E402
from fastread.formats.parquet import write_image_parquet  # noqa: E402


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("pqpack") / "train"
    make_imagenet_like(root, classes=3, per_class=7, width=64, height=48, mean_kb=3,
                       workers=1, progress=False)
    return str(root)


@pytest.fixture(scope="module")
def hub(tree, tmp_path_factory):
    """The tree as a Hub-style data set: 2 files, row groups of 4 rows, and
    a second split that a split= choice must leave out."""
    out = str(tmp_path_factory.mktemp("pqpack_hub"))
    write_image_parquet(tree, out, rows_per_group=4, files=2)
    write_image_parquet(tree, out, split="test", rows_per_group=5, files=1)
    return out


def body(img):
    """The image's bytes after its header block (the header holds a random
    image id): equal for two packs of the same samples."""
    with open(img.path, "rb") as f:
        f.seek(img.alignment)
        return f.read()


def assert_same_pack(a, b):
    assert len(a) == len(b) > 0
    assert list(a.names) == list(b.names)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.checksums, b.checksums)
    assert a.image_size == b.image_size
    assert body(a) == body(b)


def test_plain_pack_equals_the_jpeg_tree_pack(tree, hub, tmp_path):
    from_tree = fastread.pack(tree, str(tmp_path / "tree.img"), progress=False)
    from_pq = fastread.pack(hub, str(tmp_path / "pq.img"), split="train", progress=False)
    assert_same_pack(from_tree, from_pq)
    assert fastread.verify(from_pq.path, progress=False) == []
    # Names are <class>/<file> as the tree's are, not the row positions.
    assert all(n.count("/") == 1 and n.endswith(".JPEG") for n in from_pq.names)


def test_decoded_pack_equals_the_jpeg_tree_pack(tree, hub, tmp_path):
    kw = dict(decode=True, resize=40, crop=32, decoder="pillow", progress=False)
    from_tree = fastread.pack(tree, str(tmp_path / "tree.img"), decode_workers=0, **kw)
    from_pq = fastread.pack(hub, str(tmp_path / "pq.img"), split="train", decode_workers=2,
                            **kw)
    assert from_pq.decoded and from_pq.shapes is not None
    assert [list(s) for s in from_pq.shapes] == [list(s) for s in from_tree.shapes]
    assert_same_pack(from_tree, from_pq)


def test_one_parquet_file_packs_its_rows(tree, hub, tmp_path):
    files = sorted(os.listdir(os.path.join(hub, "data")))
    first = os.path.join(hub, "data", files[0])
    img = fastread.pack(first, str(tmp_path / "one.img"), progress=False)
    rows = pq.read_table(first)
    assert len(img) == rows.num_rows
    got = img.read(np.arange(len(img)))
    want = rows.column("image").combine_chunks().field("bytes").to_pylist()
    assert [bytes(g) for g in got] == want
    np.testing.assert_array_equal(img.labels, rows.column("label").to_numpy())


@pytest.fixture()
def with_null(tree, tmp_path):
    """A one-file set whose third row has a null image."""
    from fastread.index import scan
    paths, labels = scan(tree)
    blobs = [{"bytes": open(p, "rb").read(), "path": os.path.basename(p)} for p in paths[:6]]
    blobs[2] = None
    t = pa.table({"image": pa.array(blobs, pa.struct([("bytes", pa.binary()),
                                                      ("path", pa.string())])),
                  "label": pa.array(labels[:6].astype(np.int64))})
    path = str(tmp_path / "null.parquet")
    pq.write_table(t, path, row_group_size=4)
    return path


def test_null_row_fails_the_plain_pack_naming_it(with_null, tmp_path):
    out = str(tmp_path / "null.img")
    with pytest.raises(ValueError, match=r"null\.parquet\[row group 0, row 2\].*null 'image'"):
        fastread.pack(with_null, out, progress=False)
    assert not os.path.exists(out)


def test_null_row_is_left_out_of_a_decoded_pack_with_skip_bad(with_null, tmp_path):
    img = fastread.pack(with_null, str(tmp_path / "skip.img"), decode=True, resize=32,
                        decoder="pillow", decode_workers=0, skip_bad=True, progress=False)
    assert len(img) == 5
    assert len(img.skipped) == 1 and "null" in img.skipped[0][1]
    assert "row group 0, row 2" in img.skipped[0][0]


def test_split_and_filters_are_refused_where_they_do_not_apply(tree, hub, tmp_path):
    with pytest.raises(ValueError, match="not one"):
        fastread.pack(tree, str(tmp_path / "a.img"), split="train", progress=False)
    with pytest.raises(ValueError, match="file_filters"):
        fastread.pack(hub, str(tmp_path / "b.img"), file_filters=["*.jpg"], progress=False)
    with pytest.raises(ValueError, match="pillow"):
        fastread.pack(hub, str(tmp_path / "c.img"), split="train", decode=True, resize=32,
                      decoder="dali", progress=False)


def test_cli_packs_a_split(tree, hub, tmp_path, capsys):
    out = str(tmp_path / "cli.img")
    assert cli_main(["pack", hub, out, "--split", "test", "--quiet"]) == 0
    assert "21 samples" in capsys.readouterr().out
    img = fastread.PackedImage(out)
    assert_same_pack(img, fastread.pack(tree, str(tmp_path / "tree.img"), progress=False))
