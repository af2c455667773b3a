"""Tests for fastread.index.scan(), and for scan() with fastread.sampling's
shards and epochs against DALI's own (test_sampling.py tests the arithmetic).

The parity tests compare against a CPU-only DALI ``fn.readers.file`` pipeline
(``device_id=None``) and are skipped when ``nvidia.dali`` is not importable.
Every file's content is its own relative path, so samples read by DALI can be
identified and compared, in order, with the paths returned by ``scan``.
"""

import os
import time

import numpy as np
import pytest

from fastread.index import DALI_DEFAULT_FILTERS, scan
from fastread.sampling import epoch_indices, shard_range


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------

def _write(root, rel, content=None):
    """Create root/rel (rel: str or bytes) with its relative path as content."""
    rel_b = os.fsencode(rel)
    path = os.path.join(os.fsencode(str(root)), rel_b)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(rel_b if content is None else content)
    return path


def _ours(paths, labels):
    """Samples as (content bytes, label) in scan order."""
    out = []
    for p, l in zip(paths, labels):
        with open(p, "rb") as f:
            out.append((f.read(), int(l)))
    return out


def _make_dali_reader():
    from nvidia.dali import fn, pipeline_def

    def read(n=None, *, shard_id=0, num_shards=1, batch_size=4, **reader_kwargs):
        """First ``n`` samples (default: this shard's size) read by DALI."""

        @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None,
                      prefetch_queue_depth=1)
        def pipe_def():
            data, labels = fn.readers.file(name="Reader", shard_id=shard_id,
                                           num_shards=num_shards, **reader_kwargs)
            return data, labels

        pipe = pipe_def()
        pipe.build()
        if n is None:
            size = pipe.reader_meta("Reader")["epoch_size"]
            n = size * (shard_id + 1) // num_shards - size * shard_id // num_shards
        out = []
        while len(out) < n:
            data, labels = pipe.run()
            for i in range(len(data)):
                out.append((bytes(np.asarray(data.at(i))), int(np.asarray(labels.at(i))[0])))
        del pipe
        return out[:n]

    return read


@pytest.fixture(scope="module")
def dali_read():
    """DALI reference reader; skips the test when DALI is unavailable."""
    pytest.importorskip(
        "nvidia.dali",
        reason="nvidia.dali is not installed: DALI parity tests need nvidia-dali-cuda120")
    return _make_dali_reader()


@pytest.fixture(scope="module")
def dali_opt():
    """DALI reference reader, or None (the DALI half of the test is skipped)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return None
    return _make_dali_reader()


def _dali_error(dali_read, expected="", **kw):
    """Check that DALI fails too, with ``expected`` in its message (no-op without DALI)."""
    if dali_read is None:
        return
    with pytest.raises(RuntimeError) as ei:
        dali_read(**kw)
    assert expected in str(ei.value)


# ----------------------------------------------------------------------------
# awkward directory tree
# ----------------------------------------------------------------------------

AWKWARD_FILES = [
    # extension case, hidden files, non-matching files, nested dirs
    "Apple/a.jpg", "Apple/B.JPG", "Apple/c.Jpeg", "Apple/d.PnG", "Apple/e.txt",
    "Apple/.hidden.jpg", "Apple/sub/deep.jpg", "Apple/sub/deeper/x.png",
    "Apple/f.jpg.bak", "Apple/g.jpgx", "Apple/h", "Apple/_i.jpg", "Apple/[x].jpg",
    # byte order vs locale order of class names: "Apple" < "B" < "_u" < "aB" < "a_b" < "ab" < "apple"
    "apple/x.jpg", "_u/u.jpg", "a_b/1.jpg", "ab/1.jpg", "aB/1.jpg", "B/b.png",
    # unicode
    "ç/é.jpg", "ç/E.jpg", "ç/ê.png", "ç/z.jpg",
    "猫/🐱.png", "猫/犬.jpg", "猫/a b.jpg", "猫/ lead.jpg", "猫/tab\tname.jpg",
    "😀emoji/😀.webp", "😀emoji/Ö.JPEG",
    # every default extension, plus some that are not defaults
    "z/a.jpg", "z/b.jpeg", "z/c.png", "z/d.bmp", "z/e.tif", "z/f.tiff", "z/g.pnm",
    "z/h.ppm", "z/i.pgm", "z/j.pbm", "z/k.jp2", "z/l.webp", "z/m.flac", "z/n.ogg",
    "z/o.wav", "z/P.WAV", "z/Q.TIFF", "z/r.gif", "z/s.jpe", "z/t.heic", "z/u.avif",
    "z/v.JP2", "z/w.npy",
    # Unicode case folding corner cases (towlower, per character)
    "fold/x.tİf", "fold/y.jpĸ", "fold/z.ſ", "fold/b.tıf", "fold/ΣΑΣ.PNG", "fold/c.\u212a",
    "fold/Straße.JPG",
    # classes whose files are all in subdirectories / do not match
    "nested/inner/x.jpg", "onlytxt/readme.txt",
    # files directly in the root are ignored
    "root.jpg", "ROOT.PNG",
]


@pytest.fixture(scope="module")
def awkward_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("awkward")
    for rel in AWKWARD_FILES:
        _write(root, rel)
    os.makedirs(root / "empty")                  # empty class: still consumes a label
    os.makedirs(root / "links" / "dir.jpg")     # a directory named like an image
    os.symlink(root / "Apple" / "a.jpg", root / "links" / "lf.jpg")     # abs symlink to file
    os.symlink(os.path.join("..", "z", "c.png"), root / "links" / "rel.PNG")  # relative one
    os.mkfifo(root / "links" / "fifo.jpg")       # special files are skipped
    os.symlink(root / "Apple", root / "linkdir")  # symlink to a class directory
    os.symlink(root / "z" / "a.jpg", root / "rootlink.jpg")  # file symlink at root: ignored
    return root


def test_default_filters_constant():
    assert DALI_DEFAULT_FILTERS == (
        "*.jpg", "*.jpeg", "*.png", "*.bmp", "*.tif", "*.tiff", "*.pnm", "*.ppm",
        "*.pgm", "*.pbm", "*.jp2", "*.webp", "*.flac", "*.ogg", "*.wav")


def test_default_filters_match_dali_schema():
    pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed")
    from nvidia.dali import backend
    default = backend.GetSchema("readers__File").GetArgumentDefaultValueString("file_filters")
    assert default == str(list(DALI_DEFAULT_FILTERS))


def test_awkward_tree_semantics(awkward_root):
    paths, labels = scan(awkward_root)
    assert labels.dtype == np.int32
    assert len(paths) == len(labels)
    root = str(awkward_root)
    rel = [os.path.relpath(p, root) for p in paths]
    assert all(p.startswith(root + "/") for p in paths)
    # class order is byte order and empty/non-matching classes consume labels
    classes = sorted(
        (e.name for e in os.scandir(root) if e.is_dir()), key=os.fsencode)
    assert classes[:4] == ["Apple", "B", "_u", "aB"]
    by_label = {int(l): r.split("/")[0] for l, r in zip(labels, rel)}
    for lab, cls in by_label.items():
        assert classes[lab] == cls
    assert "empty" in classes and "empty" not in by_label.values()
    # only first-level files, root files ignored, case-insensitive defaults
    assert "Apple/B.JPG" in rel and "Apple/.hidden.jpg" in rel and "Apple/c.Jpeg" in rel
    assert not any("sub" in r or "inner" in r for r in rel)
    assert "root.jpg" not in rel and "rootlink.jpg" not in rel
    assert "Apple/e.txt" not in rel and "z/r.gif" not in rel and "Apple/f.jpg.bak" not in rel
    assert "fold/x.tİf" in rel and "fold/b.tıf" not in rel
    # symlinks: file symlinks listed, symlinked class directories followed,
    # directories and FIFOs skipped
    assert "links/lf.jpg" in rel and "links/rel.PNG" in rel
    assert "links/dir.jpg" not in rel and "links/fifo.jpg" not in rel
    assert [r.split("/", 1)[1] for r in rel if r.startswith("linkdir/")] == \
        [r.split("/", 1)[1] for r in rel if r.startswith("Apple/")]
    # within a class: byte order
    apple = [r for r in rel if r.startswith("Apple/")]
    assert apple == ["Apple/.hidden.jpg", "Apple/B.JPG", "Apple/[x].jpg", "Apple/_i.jpg",
                     "Apple/a.jpg", "Apple/c.Jpeg", "Apple/d.PnG"]


def test_awkward_tree_parity(dali_read, awkward_root):
    paths, labels = scan(awkward_root)
    assert dali_read(file_root=str(awkward_root)) == _ours(paths, labels)


def test_root_spelling_is_kept(awkward_root):
    root = str(awkward_root)
    p1, l1 = scan(root)
    p2, l2 = scan(root + "/")
    p3, _ = scan(root + "//")
    from pathlib import Path
    p4, _ = scan(Path(root))
    assert p1 == p2 == p4
    assert p3 == [root + "//" + p[len(root) + 1:] for p in p1]
    np.testing.assert_array_equal(l1, l2)


def test_relative_root(awkward_root, monkeypatch):
    monkeypatch.chdir(awkward_root)
    paths, labels = scan(".")
    assert paths[0] == "./Apple/.hidden.jpg"
    assert _ours(paths, labels) == _ours(*scan(awkward_root))


CUSTOM_FILTERS = [
    (["*.jpg"], False),
    (["*.jpg"], True),
    (["*.JPG", "*.png"], False),
    (["*.JPG", "*.png"], True),
    (["*"], False),
    (["?.jpg"], False),
    (["[a-c].*"], False),
    (["[A-C].*"], True),
    (["[!a]*.jpg"], False),
    (["[^a]*.jpg"], False),
    (["*.[jp][pn]g"], False),
    (["\\[x\\].jpg", "[]_]*"], False),
    (["[[:upper:]]*"], False),
    (["[[:alpha:]].*"], True),
    (["*.\u212a", "*.k"], False),
    (["*ς.png"], False),
    (["*σ.png"], False),
    (["*.TİF", "*.s"], False),
    (["strasse.jpg", "STRASSE.JPG", "straße.jpg"], False),
    (["Ö*", "é*"], False),
    (["*.jpg", "*.JPG", "*.jpg"], False),  # duplicates must not duplicate samples
    ("*.wav", False),                      # a single string
]


@pytest.mark.parametrize("filters,case_sensitive", CUSTOM_FILTERS)
def test_custom_filters_parity(dali_read, awkward_root, filters, case_sensitive):
    kw = dict(file_root=str(awkward_root), file_filters=filters,
              case_sensitive_filter=case_sensitive)
    try:
        paths, labels = scan(awkward_root, filters, case_sensitive_filter=case_sensitive)
    except ValueError as e:  # nothing matches: DALI must agree
        assert "No files found" in str(e)
        _dali_error(dali_read, "No files found", **kw)
        return
    assert dali_read(**kw) == _ours(paths, labels)


def test_custom_filters_semantics(awkward_root):
    rel = lambda ps: [os.path.relpath(p, awkward_root) for p in ps]
    p, _ = scan(awkward_root, ["*.jpg"])
    assert "Apple/B.JPG" in rel(p)
    p, _ = scan(awkward_root, ["*.jpg"], case_sensitive_filter=True)
    assert "Apple/B.JPG" not in rel(p) and "Apple/a.jpg" in rel(p)
    p, _ = scan(awkward_root, ["*.txt"])
    assert rel(p) == ["Apple/e.txt", "linkdir/e.txt", "onlytxt/readme.txt"]
    with pytest.raises(ValueError, match="No files found"):
        scan(awkward_root, ["*ς.png"])  # towlower('Σ') is 'σ', never final sigma
    p, _ = scan(awkward_root, ["*σ.png"])
    assert rel(p) == ["fold/ΣΑΣ.PNG"]


@pytest.mark.parametrize("dir_filters", [["a*"], ["a*", "*b"], ["[[:upper:]]*", "z"]])
def test_dir_filters_parity(dali_read, awkward_root, dir_filters):
    paths, labels = scan(awkward_root, dir_filters=dir_filters)
    assert dali_read(file_root=str(awkward_root), dir_filters=dir_filters) == \
        _ours(paths, labels)


def test_invalid_utf8_names_parity(dali_read, tmp_path):
    names = [b"\xff.jpg", b"\xc4\x80.jpg", b"\x80.jpg", b"\xee\x80\x80.jpg", b"A.jpg",
             b"\xc3\xa9.jpg", b"\xc3\x89.JPG", b"x\xff.T\xc4\xb0F", b"x.t\xc4\xb0f"]
    for n in names:
        _write(tmp_path, b"c/" + n)
        _write(tmp_path, b"\xfe\xc3\xa9/" + n)
    _write(tmp_path, b"\xc3\xa9/a.jpg")
    paths, labels = scan(tmp_path)
    got = _ours(paths, labels)
    # byte order, and bytewise (ASCII-only folding) matching for invalid UTF-8
    assert [c for c, _ in got if c.startswith(b"c/")] == sorted(
        b"c/" + n for n in names if n != b"x\xff.T\xc4\xb0F")
    assert dali_read(file_root=str(tmp_path)) == got
    for filters in (["?.jpg"], ["[!a]*"], ["*.t\u0130f"], ["x?.t*"]):
        paths, labels = scan(tmp_path, filters)
        assert dali_read(file_root=str(tmp_path), file_filters=filters) == _ours(paths, labels)


def test_dangling_symlink_in_class_is_listed(dali_opt, tmp_path):
    _write(tmp_path, "c/a.jpg")
    os.symlink(tmp_path / "nowhere.jpg", tmp_path / "c" / "b.jpg")
    os.symlink(tmp_path / "c", tmp_path / "c" / "c.jpg")  # symlink to a dir, name matches
    paths, labels = scan(tmp_path)
    assert paths == [str(tmp_path / "c" / n) for n in ("a.jpg", "b.jpg", "c.jpg")]
    assert labels.tolist() == [0, 0, 0]
    # DALI lists them too and only fails when it reads them
    _dali_error(dali_opt, str(tmp_path / "c" / "b.jpg"), file_root=str(tmp_path),
                batch_size=1)
    os.unlink(tmp_path / "c" / "b.jpg")
    _dali_error(dali_opt, str(tmp_path / "c" / "c.jpg"), file_root=str(tmp_path),
                batch_size=1)


def test_dangling_symlink_in_root_is_an_error(dali_opt, tmp_path):
    _write(tmp_path, "c/a.jpg")
    os.symlink(tmp_path / "nowhere", tmp_path / "broken")
    with pytest.raises(FileNotFoundError, match="broken"):
        scan(tmp_path)
    _dali_error(dali_opt, "Could not access", file_root=str(tmp_path))


def test_missing_root(dali_opt, tmp_path):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        scan(missing)
    _dali_error(dali_opt, "Failed to open", file_root=str(missing))


def test_root_is_a_file(tmp_path):
    f = _write(tmp_path, "c/a.jpg")
    with pytest.raises(NotADirectoryError, match="a.jpg"):
        scan(os.fsdecode(f))


def test_empty_root(dali_opt, tmp_path):
    _write(tmp_path, "root.jpg")
    _write(tmp_path, "c/readme.txt")
    _write(tmp_path, "c/d/deep.jpg")
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError) as ei:
        scan(tmp_path)
    assert str(tmp_path) in str(ei.value) and "*.jpg" in str(ei.value)
    with pytest.raises(ValueError, match=r"\*\.png"):
        scan(tmp_path, ["*.png"])
    _dali_error(dali_opt, "No files found", file_root=str(tmp_path))


def test_bad_arguments(tmp_path):
    _write(tmp_path, "c/a.jpg")
    with pytest.raises(ValueError, match="file_filters"):
        scan(tmp_path, [])
    with pytest.raises(ValueError, match="dir_filters"):
        scan(tmp_path, dir_filters=[])
    with pytest.raises(ValueError, match="file_root"):
        scan(None)
    with pytest.raises(ValueError, match="files"):
        scan(tmp_path, file_list=tmp_path / "l.txt", files=["a"])
    with pytest.raises(ValueError, match="labels"):
        scan(tmp_path, labels=[1])
    with pytest.raises(ValueError, match="files"):
        scan(tmp_path, files=[])
    with pytest.raises(ValueError, match="2 labels for 1 files"):
        scan(tmp_path, files=["c/a.jpg"], labels=[1, 2])


# ----------------------------------------------------------------------------
# file_list / files
# ----------------------------------------------------------------------------

@pytest.fixture()
def list_root(tmp_path):
    for rel in ["a b.jpg", " lead.jpg", "x.jpg", "tab\tname.jpg", "sub/y.txt", "#c.jpg",
                "n1.jpg", "猫.png", "x.jpg 1", "other/x.jpg", "other/sub/z.jpg"]:
        _write(tmp_path, rel)
    return tmp_path


def _list_lines(root):
    abs_path = os.path.join(str(root), "n1.jpg").encode()
    return (b"a b.jpg 3\n"
            b" lead.jpg 1\n"
            b"x.jpg\t 7  \r\n"
            b"\n"
            b"   \t\n"
            b"sub/y.txt 007\n"
            b"x.jpg 2\n"
            b"tab\tname.jpg\t5\n"
            b"#c.jpg 5\n"
            b"x.jpg 1 2\n"
            b"x.jpg \x0b3\n"
            b"n1.jpg 1\x0c\n"
            b"\xe7\x8c\xab.png 2147483648\n"
            b"x.jpg 99999999999\n"
            + abs_path + b" 4\n"
            b"x.jpg 9")  # no trailing newline


def test_file_list_parity(dali_read, list_root):
    lst = list_root / "list.txt"
    lst.write_bytes(_list_lines(list_root))
    paths, labels = scan(None, file_list=lst)
    ours = _ours(paths, labels)
    assert [l for _, l in ours] == [3, 1, 7, 7, 2, 5, 5, 2, 3, 1, -2147483648, 1215752191,
                                    4, 9]
    assert paths[0] == str(list_root / "a b.jpg") and paths[1] == str(list_root) + "/ lead.jpg"
    assert dali_read(file_list=str(lst)) == ours
    # file_filters is ignored with file_list
    p2, l2 = scan(None, ["*.png"], file_list=lst)
    assert p2 == paths


def test_file_list_relative_to_file_root(dali_read, list_root, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("lists") / "val.txt"
    elsewhere.write_bytes(b"x.jpg 0\nsub/z.jpg 1\n")
    root = str(list_root / "other")
    paths, labels = scan(root, file_list=elsewhere)
    assert paths == [root + "/x.jpg", root + "/sub/z.jpg"]
    assert dali_read(file_list=str(elsewhere), file_root=root) == _ours(paths, labels)


def test_file_list_without_directory_is_relative_to_cwd(dali_read, list_root, monkeypatch):
    (list_root / "l.txt").write_bytes(b"x.jpg 4\nother/x.jpg 5\n")
    monkeypatch.chdir(list_root)
    paths, labels = scan(None, file_list="l.txt")
    assert paths == ["x.jpg", "other/x.jpg"]
    assert dali_read(file_list="l.txt") == _ours(paths, labels)


def test_file_list_does_not_check_existence(list_root):
    (list_root / "l.txt").write_bytes(b"missing.jpg 1\n")
    paths, labels = scan(None, file_list=list_root / "l.txt")
    assert paths == [str(list_root / "missing.jpg")] and labels.tolist() == [1]


@pytest.mark.parametrize("content,bad_line", [
    (b"x.jpg 1\nx.jpg -1\n", 2),
    (b"x.jpg 1a\n", 1),
    (b"\n\nx.jpg\n", 3),
    (b"5\n", 1),
    (b" 5\n", 1),
    (b"x.jpg5\n", 1),
    (b"x.jpg\xc2\xa03\n", 1),
    (b"x.jpg 1\n" + b"y" * 20000 + b" 1\n", 2),
])
def test_file_list_malformed(dali_opt, list_root, content, bad_line):
    lst = list_root / "bad.txt"
    lst.write_bytes(content)
    with pytest.raises(ValueError) as ei:
        scan(None, file_list=lst)
    assert str(lst) in str(ei.value) and f"line {bad_line}" in str(ei.value)
    _dali_error(dali_opt, file_list=str(lst))


def test_file_list_empty_and_missing(dali_opt, list_root):
    lst = list_root / "empty.txt"
    lst.write_bytes(b"\n  \n")
    with pytest.raises(ValueError, match="empty.txt"):
        scan(None, file_list=lst)
    _dali_error(dali_opt, "No files found", file_list=str(lst))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        scan(None, file_list=list_root / "nope.txt")


def test_files_and_labels_parity(dali_read, list_root):
    files = ["x.jpg", "a b.jpg", "other/x.jpg", "x.jpg"]
    paths, labels = scan(str(list_root), files=files, labels=[4, 0, 7, 1])
    assert labels.tolist() == [4, 0, 7, 1]
    assert dali_read(file_root=str(list_root), files=files, labels=[4, 0, 7, 1]) == \
        _ours(paths, labels)
    paths, labels = scan(str(list_root), files=files)
    assert labels.tolist() == [0, 1, 2, 3]
    assert dali_read(file_root=str(list_root), files=files) == _ours(paths, labels)
    abs_files = [str(list_root / "x.jpg")]
    assert scan(None, files=abs_files)[0] == abs_files


# ----------------------------------------------------------------------------
# sharding
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flat_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat")
    for i in range(13):
        _write(root, f"c{i % 3}/{i:03d}.jpg")
    return root


@pytest.mark.parametrize("n,num_shards", [(13, 1), (13, 3), (13, 4), (10, 7), (13, 13)])
def test_shard_parity(dali_read, flat_root, n, num_shards):
    paths, labels = scan(flat_root)
    paths, labels = paths[:n], labels[:n]
    files = [os.path.relpath(p, flat_root) for p in paths]
    ours = _ours(paths, labels)
    covered = []
    for s in range(num_shards):
        idx = epoch_indices(n, shard_id=s, num_shards=num_shards)
        start, end = shard_range(n, s, num_shards)
        assert idx.tolist() == list(range(start, end))
        expected = dali_read(file_root=str(flat_root), files=files, labels=labels.tolist(),
                             shard_id=s, num_shards=num_shards)
        assert expected == [ours[i] for i in idx]
        covered.extend(idx.tolist())
    assert sorted(covered) == list(range(n))


@pytest.mark.parametrize("n,num_shards,batch_size",
                         [(10, 3, 1), (10, 3, 3), (10, 4, 4), (10, 3, 5), (13, 4, 2), (12, 3, 2)])
def test_pad_last_batch_parity(dali_read, flat_root, n, num_shards, batch_size):
    paths, labels = scan(flat_root)
    paths, labels = paths[:n], labels[:n]
    files = [os.path.relpath(p, flat_root) for p in paths]
    ours = _ours(paths, labels)
    for s in range(num_shards):
        idx = epoch_indices(n, shard_id=s, num_shards=num_shards, pad_last_batch=True,
                            batch_size=batch_size)
        assert len(idx) % batch_size == 0
        # read one extra sample: DALI's next sample starts the next shard, proving
        # that the padded length matches
        got = dali_read(len(idx) + 1, file_root=str(flat_root), files=files,
                        labels=labels.tolist(), shard_id=s, num_shards=num_shards,
                        pad_last_batch=True, batch_size=batch_size)
        nxt = shard_range(n, (s + 1) % num_shards, num_shards)[0]
        assert got == [ours[i] for i in idx] + [ours[nxt]]


# ----------------------------------------------------------------------------
# speed
# ----------------------------------------------------------------------------

def test_scan_speed(tmp_path):
    # Creating files on a busy disk can take ~1 ms each: use tmpfs when available.
    # (Warm scans of a disk directory are dominated by the same Python work.)
    import shutil
    import tempfile
    shm = "/dev/shm"
    base = tempfile.mkdtemp(dir=shm) if os.access(shm, os.W_OK) else str(tmp_path)
    try:
        n_classes, per_class = 40, 500
        for c in range(n_classes):
            d = os.path.join(base, f"class_{c:03d}")
            os.mkdir(d)
            for i in range(per_class):
                os.close(os.open(os.path.join(d, f"img_{i:05d}.JPEG"),
                                 os.O_CREAT | os.O_WRONLY, 0o644))
            open(os.path.join(d, "notes.txt"), "wb").close()
        scan(base)  # warm the dentry cache
        t0 = time.perf_counter()
        paths, labels = scan(base)
        dt = time.perf_counter() - t0
        assert len(paths) == n_classes * per_class
        assert np.array_equal(labels, np.repeat(np.arange(n_classes), per_class))
        assert dt < 0.5, f"scan of {len(paths)} files took {dt:.3f}s"
    finally:
        if base != str(tmp_path):
            shutil.rmtree(base, ignore_errors=True)
