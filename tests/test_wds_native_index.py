"""The native WebDataset indexer (csrc/formats/, fastread._formats) against
the Python reference (index_tar + WebDataset._group) on tricky shards: long
names (GNU and pax), pax sizes, dots in keys, missing and unwanted
extensions, empty members, metadata members, keys seen again, every spec
(missing behaviours, case folding, DALI grouping), and bad shards (truncated,
not a tar, a FIFO) failing with the reference's own errors. Also
group_members (the S3 walk's entry) and the walker on member arrays."""
import mmap
import os
import tarfile

import numpy as np
import pytest
from conftest import write_tar
from hypothesis import HealthCheck, given, settings, strategies as st

from fastread import _formats
from fastread.errors import SpecialFileError
from fastread.formats import FormatError
from fastread.formats.webdataset import WebDataset, group_members, index_tar

SPECS = [dict(ext=["jpg;png", "cls"]),
         dict(ext=["jpg", "cls"], missing_component_behavior="skip"),
         dict(ext=["JPG", "cls"], case_sensitive_extensions=False),
         dict(ext=["seg.png", "txt"]),
         dict(ext=["jpg", "cls"], grouping="dali"),
         dict(ext=["jpg;jpeg", "cls"], grouping="dali", missing_component_behavior="skip")]


@pytest.fixture(scope="module")
def tricky(tmp_path_factory):
    root = tmp_path_factory.mktemp("tricky")
    a = write_tar(root / "a.tar", [
        ("__meta__", b"shard metadata"),
        ("d.x/x1.jpg", b"J1"), ("d.x/x1.cls", b"1"),        # a dot in the folder
        ("d.x/x2.jpg", b"J2"),                               # no cls
        ("x3.cls", b"3"), ("x3.seg.png", b"S3"),             # a dotted extension
        ("x4.JPG", b"J4"), ("x4.cls", b"4"),                 # upper case
        ("noext", b"ignored"), (".hidden", b"h"), ("dir/.x", b"h"),
        ("x5.jpg", b""), ("x5.cls", b""),                    # empty members
        ("x1.txt", b"t"), ("x6.png", b"P6"), ("x1.cls", b"again"),  # keys seen again
    ])
    b = write_tar(root / "b.tar", [("L" * 150 + "/y1.jpg", b"JY1" * 300),
                                   ("L" * 150 + "/y1.cls", b"7"),
                                   ("\u00e9t\u00e9/\u00fc.jpg", b"U")], fmt=tarfile.PAX_FORMAT)
    c = write_tar(root / "c.tar", [("G" * 200 + ".jpeg", b"JZ"), ("G" * 200 + ".cls", b"9")],
                  fmt=tarfile.GNU_FORMAT)
    return [a, b, c]


def columns(src):
    return (src.index.start.tolist(), src.index.length.tolist(),
            np.asarray(src.component_offsets, np.int64).tolist(),
            np.asarray(src.component_lengths, np.int64).tolist(), list(src.names),
            src.skipped, len(src))


@pytest.mark.parametrize("spec", SPECS)
def test_native_matches_python(tricky, spec, tmp_path):
    ours = WebDataset(tricky, index_cache="off", **spec)
    ref = WebDataset(tricky, index_cache="off", indexer="python", **spec)
    assert ours.index_origin == ref.index_origin == "built"
    assert columns(ours) == columns(ref)
    got = ours.read(np.arange(len(ours)))
    want = ref.read(np.arange(len(ref)))
    assert [a.tobytes() for a in got] == [a.tobytes() for a in want]


def test_native_is_used(tricky, monkeypatch):
    """The native path runs (the reference is not called) for a clean spec."""
    import fastread.formats.webdataset as w
    monkeypatch.setattr(w, "index_tar", lambda *a: pytest.fail("reference called"))
    src = WebDataset(tricky, ["jpg", "cls"], index_cache="off")
    assert len(src) > 0


def test_errors_are_the_references(tmp_path):
    dup = write_tar(tmp_path / "dup.tar", [("k.jpg", b"1"), ("k.jpg", b"2")])
    with pytest.raises(FormatError, match="component 'jpg' twice"):
        WebDataset([dup], ["jpg"], index_cache="off")
    miss = write_tar(tmp_path / "miss.tar", [("k.jpg", b"1")])
    with pytest.raises(FormatError, match="has no component 'cls'"):
        WebDataset([miss], ["jpg", "cls"], missing_component_behavior="error", index_cache="off")
    good = write_tar(tmp_path / "good.tar", [("k%d.jpg" % i, b"x" * 700) for i in range(4)])
    data = open(good, "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:512 + 300])
    with pytest.raises(FormatError, match=r"cut\.tar.*truncated"):
        WebDataset([str(cut)], ["jpg"], index_cache="off")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar" * 100)
    with pytest.raises(FormatError, match="not a tar archive"):
        WebDataset([str(junk)], ["jpg"], index_cache="off")
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match="empty file"):
        WebDataset([str(empty)], ["jpg"], index_cache="off")


def test_fifo_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.tar"
    os.mkfifo(fifo)
    with pytest.raises(SpecialFileError, match="pipe.tar"):
        WebDataset([str(fifo)], ["jpg"], index_cache="off")


def test_walker_matches_index_tar(tricky):
    for path in tricky:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            names, no, do, sz, ho = _formats.walk_tar(m, path)
            ref = index_tar(m, path)
        got = [(names[no[i]:no[i + 1]].decode("utf-8", "surrogateescape"), int(do[i]),
                int(sz[i]), int(ho[i])) for i in range(len(do))]
        assert got == [tuple(t) for t in ref]


def test_group_members_entry(tricky):
    """group_members on member arrays (what the S3 walk hands over) gives
    the columns WebDataset builds from the same shard."""
    path = tricky[0]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        names, no, do, sz, _ho = _formats.walk_tar(m, path)
    cols = group_members(path, names, no, do, sz, ["jpg;png", "cls"])
    src = WebDataset([path], ["jpg;png", "cls"], index_cache="off")
    assert cols["start"].tolist() == src.index.start.tolist()
    assert cols["comp_off"].tolist() == np.asarray(src.component_offsets).tolist()
    # The Python fallback (a non-ASCII extension folded) gives the same shape of answer.
    folded = group_members(path, names, no, do, sz, ["\u00c9xt", "cls"],
                           case_sensitive_extensions=False)
    assert folded["comp_off"].shape == (len(cols["start"]), 2)
    with pytest.raises(ValueError, match="name offsets"):
        _formats.group_members(names, no[:-1], do, sz, 1, [(b"jpg", 0)], False, False, 0)


_NAMES = st.sampled_from(["a.jpg", "a.cls", "b.jpg", "b.c.d", "__x__", "n", ".h", "d/a.jpg",
                          "d.e/f.cls", "a.JPG", "a\nb/c.jpg", "x/y.\u00e9", "a.", "c.cls"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_NAMES, st.binary(max_size=40)), max_size=12), st.sampled_from(SPECS))
def test_fuzzed_grouping(tmp_path, members, spec):
    path = write_tar(tmp_path / "f.tar", members)
    outcomes = []
    for indexer in ("native", "python"):
        try:
            outcomes.append(columns(WebDataset([path], index_cache="off", indexer=indexer,
                                               **spec)))
        except FormatError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
