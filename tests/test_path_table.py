"""fastread.PathTable: a file tree's paths as a directory table and a names
blob (scan(table=True), FileList, the native tree reader), equal to the list
of str scan() returns, read exactly as that list is, and refused with why
when its columns are broken."""
import os

import numpy as np
import pytest

import fastread
from fastread import FileList, NameTable, NativeReader, PathTable, Reader, scan
from fastread.names import PathTable as _PT

TREE = ["b/2.jpg", "b/1.jpg", "a/x.png", "a/y.JPG", "a/skip.txt", "c/z.jpeg", "empty/",
        "\u732b/\u72ac.jpg", "d/sub/deep.jpg"]


def _write(root, rel, data):
    path = os.path.join(os.fsencode(str(root)), os.fsencode(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not rel.endswith("/"):
        with open(path, "wb") as f:
            f.write(data)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for k, rel in enumerate(TREE):
        _write(root, rel, rel.encode() * (k + 1))
    # A name that is not UTF-8 (surrogateescape round trip).
    _write(root, "a/\udcff.jpg", b"not utf-8")
    return str(root)


def test_table_equals_list(tree):
    for kw in ({}, {"file_filters": ["*.jpg"]}, {"dir_filters": ["a", "c"]},
               {"case_sensitive_filter": True}):
        paths, labels = scan(tree, **kw)
        table, tlabels = scan(tree, table=True, **kw)
        assert isinstance(table, PathTable) and isinstance(paths, list)
        assert table == paths and list(table) == paths and table.tolist() == paths
        assert [table[i] for i in range(len(paths))] == paths
        assert table[-1] == paths[-1] and table[1:3] == paths[1:3]
        assert np.array_equal(labels, tlabels)
        assert np.array_equal(table.dir_ids, labels)  # one directory a class
        with pytest.raises(IndexError):
            table[len(paths)]
    assert any("\udcff" in p for p in scan(tree, table=True)[0])


def test_file_list_and_files(tree, tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("b/1.jpg 3\na/x.png 1\nb/2.jpg 2\n")
    for kw in ({"file_list": str(lst)}, {"files": ["b/1.jpg", "a/x.png"], "labels": [5, 6]}):
        paths, labels = scan(tree, **kw)
        table, tlabels = scan(tree, table=True, **kw)
        assert table == paths and np.array_equal(labels, tlabels)


def test_from_paths_shares_prefixes():
    paths = [f"/datasets/imagenet/train/n0144{i % 3}/{i}.jpg" for i in range(30)] + \
        ["rel.jpg", "/top.jpg"]
    t = PathTable.from_paths(paths)
    assert t == paths and len(t.dirs) == 5  # 3 folders, "" and "/"
    # Each prefix stored once; the names blob holds only what follows them.
    assert len(t.dirs.blob) == sum(len(f"/datasets/imagenet/train/n0144{k}/") for k in range(3)) + 1
    assert len(t.names.blob) == sum(len(p.rpartition("/")[2]) for p in paths)
    with pytest.raises(ValueError, match="NUL"):
        PathTable.from_paths(["a/b\0c"])
    with pytest.raises(ValueError, match="directory id"):
        PathTable(NameTable.from_names(["a/"]), [1], NameTable.from_names(["x"]))
    with pytest.raises(ValueError, match="directory ids"):
        PathTable(NameTable.from_names(["a/"]), [0, 0], NameTable.from_names(["x"]))


def _contents(source, indices):
    return [bytes(a) for a in source.read(indices)]


@pytest.mark.parametrize("engine", ["psync", "io_uring"])
def test_native_reader_reads_the_same_bytes(tree, engine):
    status = fastread.engines()[engine].files
    if status is not True:
        pytest.skip(f"engine {engine}: {status}")
    table, _ = scan(tree, table=True)
    paths = table.tolist()
    want = [open(p, "rb").read() for p in paths]
    rd = NativeReader(table, engine, workers=2)
    try:
        assert rd.size == len(paths)
        assert [rd.path(i) for i in range(len(paths))] == paths
        with pytest.raises(IndexError):
            rd.path(len(paths))
        order = np.random.default_rng(1).permutation(len(paths))
        for _epoch in range(2):  # the second with every size known
            rd.submit(order[:4])
            rd.submit(order[4:])
            got = [bytes(a) for a in rd.next().arrays()] + [bytes(a) for a in rd.next().arrays()]
            assert got == [want[i] for i in order]
    finally:
        rd.close()


def test_reader_same_epochs_as_a_list(tree):
    table, labels = scan(tree, table=True)
    kw = dict(batch_size=3, random_shuffle=True, seed=7, num_shards=2, shard_id=1)
    a = Reader(file_root=tree, **kw)
    b = Reader(source=FileList(table.tolist(), labels), **kw)
    assert isinstance(a.source.names, PathTable) and isinstance(b.source.names, list)
    for _epoch in range(2):
        got_a = [([bytes(x) for x in arr], lab.tolist()) for arr, lab in a]
        got_b = [([bytes(x) for x in arr], lab.tolist()) for arr, lab in b]
        assert got_a == got_b and got_a
    assert a.state_dict() == b.state_dict()
    a.close()
    b.close()


def test_missing_file_is_named(tree, tmp_path):
    _write(tmp_path, "k/gone.jpg", b"x")
    _write(tmp_path, "k/kept.jpg", b"y")
    src = FileList.scan(str(tmp_path))
    os.remove(tmp_path / "k" / "gone.jpg")
    with pytest.raises(fastread.ReadError, match="gone.jpg"):
        list(Reader(source=src, batch_size=2))


def test_broken_columns_refused_by_the_reader():
    good = PathTable.from_paths(["/tmp/a/x.jpg", "/tmp/a/y.jpg"])
    offs = good.names.offsets.copy()
    offs[1] = offs[2] + 1
    bad = _PT(good.dirs, good.dir_ids, NameTable(good.names.blob, offs))
    with pytest.raises(ValueError, match="name offset 2 decreases"):
        NativeReader(bad, "psync")


def test_name_table_take_gathers_in_order():
    # A Ray read task's names (fastread.ray ImageDatasource): numpy gathers.
    names = ["a", "bcd", "", "\u00e9f", "ghij"]
    t = NameTable.from_names(names)
    for idx in ([4, 0, 2, 3], [], [1, 1], list(range(5))[::-1]):
        got = t.take(np.array(idx, dtype=np.int64))
        got.check("take")
        assert list(got) == [names[i] for i in idx]
    with pytest.raises(IndexError):
        t.take([5])


def test_path_table_take_keeps_only_the_directories_it_uses():
    # A Ray read task's files (fastread.ray FilesDatasource): numpy gathers,
    # the directory table cut to the task's directories.
    paths = ["/r/a/x.jpg", "/r/b/y.jpg", "z.jpg", "/r/a/\u00e9.png", "/r/c/w.jpg", "/r/b/v"]
    t = PathTable.from_paths(paths)
    for idx in ([3, 0, 5], [], [2, 2], [4], list(range(6))[::-1]):
        got = t.take(np.array(idx, dtype=np.int64))
        got.check("take")
        assert got.tolist() == [paths[i] for i in idx]
        assert len(got.dirs) == len({paths[i].rpartition("/")[0] for i in idx})
    with pytest.raises(IndexError):
        t.take([6])


def test_from_paths_numpy_split_matches_the_loop(monkeypatch):
    # PathTable.from_paths splits ASCII str paths with numpy, a chunk at a
    # time; it must give the loop's table (same directories, ids, names) for
    # any mix of slashes, empty paths, prefixes and chunk edges.
    import random

    import fastread.names as names_mod

    def loop(paths):
        with monkeypatch.context() as m:
            m.setattr(names_mod, "_split_ascii_paths", lambda p: None)
            return PathTable.from_paths(paths)

    rng = random.Random(3)
    parts = ["a", "b", "/", "c/", "//", "x.jpg", ""]
    for trial in range(200):
        paths = ["".join(rng.choice(parts) for _ in range(rng.randrange(0, 6)))
                 for _ in range(rng.randrange(0, 30))]
        if trial % 3 == 0:
            paths.sort()
        monkeypatch.setattr(names_mod, "_SPLIT_CHUNK", rng.choice([1, 2, 3, 7, 1 << 16]))
        fast, slow = PathTable.from_paths(paths), loop(paths)
        fast.check("from_paths")
        assert fast.tolist() == paths
        assert list(fast.dirs) == list(slow.dirs)
        assert fast.dir_ids.tolist() == slow.dir_ids.tolist()
        assert list(fast.names) == list(slow.names)
    # What the numpy split leaves to the loop: non-ASCII names, NUL, PathLike.
    assert names_mod._split_ascii_paths(["d/\u00e9.jpg"]) is None
    assert names_mod._split_ascii_paths(["d/a\0b"]) is None
    assert PathTable.from_paths(["d/\u00e9.jpg", "d/x"]).tolist() == ["d/\u00e9.jpg", "d/x"]
    with pytest.raises(ValueError, match="NUL"):
        PathTable.from_paths(["d/a\0b"])
