"""WebDataset tar shards (fastread.formats.webdataset): grouping against the
webdataset library, DALI's fn.readers.webdataset on CPU (missing
components too), gzip'd shards, bad input and a fuzzed tar index."""
import glob
import gzip
import io
import os
import tarfile

import numpy as np
import pytest
from conftest import write_tar
from hypothesis import HealthCheck, given, settings, strategies as st

import fastread
from fastread.datasets.webdataset import make_webdataset
from fastread.formats import FormatError
from fastread.formats.webdataset import WebDataset, index_tar, split_name


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    make_webdataset(root, shards=3, per_shard=40, width=32, height=24, seed=4)
    return sorted(glob.glob(str(root / "*.tar")))


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """Shards with missing components, upper-case extensions, directories in
    keys, multi-dot extensions, metadata members and a long (GNU/pax) name."""
    root = tmp_path_factory.mktemp("ragged")
    a = write_tar(root / "a.tar", [
        ("__meta__", b"shard metadata"),
        ("d/x1.jpg", b"J1"), ("d/x1.cls", b"1"),
        ("d/x2.jpg", b"J2"),                       # no cls
        ("d/x3.cls", b"3"), ("d/x3.seg.png", b"S3"),  # no jpg
        ("x4.JPG", b"J4"), ("x4.cls", b"4"),
        ("noext", b"ignored"),
        ("x5.jpg", b""), ("x5.cls", b"5"),        # empty member
    ])
    b = write_tar(root / "b.tar", [("L" * 150 + "/y1.jpg", b"JY1" * 300),
                                   ("L" * 150 + "/y1.cls", b"7")], fmt=tarfile.PAX_FORMAT)
    c = write_tar(root / "c.tar", [("z1.jpeg", b"JZ"), ("z1.cls", b"9")], fmt=tarfile.GNU_FORMAT)
    return [a, b, c]


def read_all(src):
    arrays = src.read(np.arange(len(src)))
    return [[a.tobytes() for a in comp] for comp in src.components(arrays, np.arange(len(src)))]


def wds_samples(paths):
    import webdataset as wds
    return list(wds.WebDataset(paths, shardshuffle=False))


def test_split_name():
    assert split_name("a/b.c.d") == ("a/b", "c.d")
    assert split_name("a.b/c.d") == ("a.b/c", "d")
    assert split_name("noext") is None


def test_matches_webdataset_library(shards):
    pytest.importorskip("webdataset")
    src = WebDataset(shards, ["jpg", "cls", "json"])
    ref = wds_samples(shards)
    jpg, cls, js = read_all(src)
    assert len(ref) == len(src) == 120
    for i, r in enumerate(ref):
        f, j = src.locate(i)
        assert r["__key__"] == src.files[f].names[j]
        assert (r["jpg"], r["cls"], r["json"]) == (jpg[i], cls[i], js[i])


def test_ragged_matches_webdataset_library(ragged):
    pytest.importorskip("webdataset")
    # The library lower-cases extensions; so does case_sensitive_extensions=False.
    src = WebDataset(ragged, ["jpg;jpeg", "cls", "seg.png"], case_sensitive_extensions=False)
    ref = wds_samples(ragged)
    assert [r["__key__"] for r in ref] == [src.sample_name(i).split("[", 1)[1][:-1]
                                           for i in range(len(src))]
    comps = read_all(src)
    for i, r in enumerate(ref):
        for k, alts in enumerate((("jpg", "jpeg"), ("cls",), ("seg.png",))):
            want = next((r[a] for a in alts if a in r), b"")
            assert comps[k][i] == want, (i, k)


def native_params():
    """native=False (the external source) and True (the operator), which
    skips with the reason where the plugin does not load."""
    try:
        from fastread.dali import _plugin
        why = None if _plugin.load() else _plugin.reason()
    except ImportError as e:
        why = str(e)
    return [pytest.param(False, id="extsrc"),
            pytest.param(True, id="native",
                         marks=[pytest.mark.skip(reason=why)] if why else [])]


def dali_run(pipe_fn, batch_size):
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None)
    def pipe():
        out = pipe_fn()
        return tuple(out) if isinstance(out, (list, tuple)) else out

    p = pipe()
    p.build()
    return p


@pytest.mark.parametrize("native", native_params())
@pytest.mark.parametrize("behavior", ["empty", "skip"])
def test_matches_dali_reader(ragged, shards, behavior, native):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn

    from fastread.dali.formats import webdataset

    # DALI's reader does not read pax long names (ragged[1]): it yields empty samples.
    paths = [ragged[0], ragged[2]] + shards
    ext = ["jpg;jpeg", "cls"]
    src = WebDataset(paths, ext, missing_component_behavior=behavior, grouping="dali")
    n = len(src)
    # a.tar: __meta__, d/x2, d/x3, x4 (JPG is not jpg) and noext lack a component.
    assert src.skipped == (5 if behavior == "skip" else 0)
    assert n == 128 - src.skipped
    theirs = dali_run(lambda: fn.readers.webdataset(paths=paths, ext=ext,
                                                    missing_component_behavior=behavior), n)
    ours = dali_run(lambda: webdataset(paths=paths, ext=ext, native=native,
                                       missing_component_behavior=behavior), n)
    a, b = theirs.run(), ours.run()
    for k in range(2):
        assert len(a[k]) == len(b[k]) == n
        for i in range(n):
            assert np.array(a[k][i]).tobytes() == np.array(b[k][i]).tobytes(), (k, i)


def stream(pipe, n, k):
    """The first n samples' k components from a pipeline, batch by batch
    (each batch copied out before the next run, as DALI allows)."""
    got = [[] for _ in range(k)]
    while len(got[0]) < n:
        try:
            out = pipe.run()
        except StopIteration:
            break
        for j in range(k):
            got[j] += [np.array(out[j][i]).tobytes() for i in range(len(out[j]))]
    return [g[:n] for g in got]


@pytest.mark.parametrize("native", native_params())
def test_batches_match_dali_reader_packed_and_skewed(tmp_path, shards, native):
    """Many small batches (more than the packing ring holds), one of them
    with a component far longer than the rest (fed as views instead of
    packed), missing components: every batch equals fn.readers.webdataset's."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn

    from fastread.dali.formats import webdataset

    rng = np.random.default_rng(5)
    members = []
    for i in range(40):
        size = 3 << 20 if i == 17 else int(rng.integers(0, 3000))
        members.append((f"s{i:03d}.jpg", rng.bytes(size)))
        if i % 5:
            members.append((f"s{i:03d}.cls", str(i).encode()))
    paths = [write_tar(tmp_path / "skew.tar", members)] + shards
    ext = ["jpg", "cls"]
    n = len(WebDataset(paths, ext, grouping="dali"))
    theirs = stream(dali_run(lambda: fn.readers.webdataset(paths=paths, ext=ext), 7), n, 2)
    ours = stream(dali_run(lambda: webdataset(paths=paths, ext=ext, native=native), 7), n, 2)
    assert len(ours[0]) == len(theirs[0]) == n == 160
    assert len(theirs[0][17]) == 3 << 20 and theirs[1][5] == b""
    for k in range(2):
        for i in range(n):
            assert ours[k][i] == theirs[k][i], (k, i)


@pytest.mark.parametrize("native", native_params())
def test_single_component_output(shards, native):
    pytest.importorskip("nvidia.dali")
    from fastread.dali.formats import webdataset

    src = WebDataset(shards, ["cls"])
    (got,) = stream(dali_run(lambda: webdataset(paths=shards, ext=["cls"], native=native), 16),
                    len(src), 1)
    assert got == read_all(src)[0]


def test_missing_component_error(ragged):
    with pytest.raises(FormatError, match=r"a.tar at byte \d+: sample 'd/x2' has no component "
                                          r"'cls'"):
        WebDataset(ragged, ["jpg", "cls"], missing_component_behavior="error")


def test_reader_shuffles_all_samples(shards):
    src = WebDataset(shards, ["jpg", "cls"])
    want = sorted(read_all(src)[0])
    got = []
    with fastread.Reader(source=src, batch_size=17, random_shuffle=True, seed=2) as r:
        for arrays, ids in r:
            got.extend(a.tobytes() for a in src.components(arrays, ids)[0])
    assert sorted(got) == want and got != read_all(src)[0]


def test_gzip_shards(shards, tmp_path):
    gz = []
    for p in shards:
        dest = tmp_path / (os.path.basename(p) + ".gz")
        with open(p, "rb") as f:
            dest.write_bytes(gzip.compress(f.read()))
        gz.append(str(dest))
    cache = tmp_path / "cache"
    src = WebDataset(gz, ["jpg", "cls"], cache_dir=str(cache))
    assert read_all(src) == read_all(WebDataset(shards, ["jpg", "cls"]))
    assert len(os.listdir(cache)) == 3
    assert src.sample_name(0).startswith(gz[0] + "[")
    pytest.importorskip("webdataset")
    assert [r["cls"] for r in wds_samples(gz)] == read_all(src)[1]


def test_empty_tar_has_no_samples(tmp_path):
    p = write_tar(tmp_path / "e.tar", [])
    assert len(WebDataset([p], ["jpg"])) == 0


@pytest.mark.parametrize("damage, match", [
    (lambda b: b"", r"at byte 0: empty file"),
    (lambda b: b"hello world" * 100, r"at byte 0: not a tar archive"),
    (lambda b: b[:512 * 3] + b"X" + b[512 * 3 + 1:], r"at byte 1536: tar header checksum error"),
    (lambda b: b[:1000], r"at byte 0: member data runs past the end"),
    (lambda b: b[:1536 + 100], r"at byte 1536: truncated tar header"),
])
def test_bad_tars(tmp_path, damage, match):
    good = open(write_tar(tmp_path / "g.tar", [("a.jpg", b"x" * 900), ("a.cls", b"1"),
                                               ("b.jpg", b"y")]), "rb").read()
    p = tmp_path / "bad.tar"
    p.write_bytes(damage(good))
    with pytest.raises(FormatError, match=match) as e:
        WebDataset([str(p)], ["jpg"])
    assert str(p) in str(e.value)


@pytest.mark.parametrize("damage, match", [
    (lambda z: z[:len(z) // 2], "truncated gzip stream"),
    (lambda z: z[:20] + bytes(64) + z[84:], "bad gzip stream"),
    (lambda z: b"not gzip at all", "bad gzip stream"),
])
def test_bad_gzip(tmp_path, damage, match):
    rng = np.random.default_rng(0)
    tar = write_tar(tmp_path / "g.tar", [("a.jpg", rng.bytes(5000)), ("a.cls", b"1")])
    p = tmp_path / "bad.tar.gz"
    p.write_bytes(damage(gzip.compress(open(tar, "rb").read())))
    with pytest.raises(FormatError, match=match) as e:
        WebDataset([str(p)], ["jpg"], cache_dir=str(tmp_path / "c"))
    assert str(p) in str(e.value)
    assert not os.listdir(tmp_path / "c")   # nothing half-written is left in the cache


def test_duplicate_component_is_an_error(tmp_path):
    p = write_tar(tmp_path / "d.tar", [("a.jpg", b"1"), ("a.jpg", b"2")])
    with pytest.raises(FormatError, match="component 'jpg' twice"):
        WebDataset([p], ["jpg"])


def test_shard_changed_after_indexing_is_a_read_error(tmp_path):
    p = write_tar(tmp_path / "t.tar", [(f"k{i}.jpg", b"z" * 2000) for i in range(5)])
    src = WebDataset([p], ["jpg"])
    os.truncate(p, 3000)
    with pytest.raises(fastread.ReadError, match=r"t.tar\[k\d\]"):
        src.read(np.arange(5))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_index_tar(data):
    members = [(f"k{i}.{e}", bytes(data.draw(st.integers(0, 700))))
               for i in range(data.draw(st.integers(0, 3))) for e in ("jpg", "cls")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=data.draw(
            st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))) as t:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            t.addfile(info, io.BytesIO(payload))
    blob = bytearray(buf.getvalue())
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    blob = bytes(blob[:cut]) if data.draw(st.booleans()) else bytes(blob)
    try:
        out = index_tar(blob, "fuzz.tar")
    except FormatError as e:
        assert str(e).startswith("fuzz.tar")
        return
    for m in out:
        assert 0 <= m.offset and m.offset + m.size <= len(blob)


def test_generator_and_cli(tmp_path, capsys):
    a = make_webdataset(tmp_path / "a", shards=2, per_shard=5, width=16, height=16)
    assert make_webdataset(tmp_path / "a", shards=2, per_shard=5, width=16, height=16) == a
    assert len(WebDataset(sorted(glob.glob(str(tmp_path / "a" / "*.tar"))), ["jpg"])) == 10
    from fastread.cli import main
    assert main(["make-dataset", str(tmp_path / "w"), "--format", "webdataset", "--shards", "2",
                 "--per-shard", "3", "--width", "16", "--height", "16", "--quiet"]) == 0
    assert "WebDataset, 6 samples in 2 shards" in capsys.readouterr().out


def test_torch_loader_resume(shards):
    pytest.importorskip("torch")
    from fastread.torch import WebDatasetLoader
    loader = WebDatasetLoader(shards, ["jpg", "cls"], batch_size=16, random_shuffle=True, seed=5)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = [[t.numpy().tobytes() for t in jpg] for jpg, _ in it]
    again = WebDatasetLoader(shards, ["jpg", "cls"], batch_size=16, random_shuffle=True, seed=5)
    again.load_state_dict(state)
    assert [[t.numpy().tobytes() for t in jpg] for jpg, _ in again] == rest
    assert len(rest) == len(loader) - 1


def test_generator_remakes_with_other_params(tmp_path):
    """Made again with other parameters: the old shards go, the marker says
    the new ones; made again with the same ones: nothing is rewritten."""
    root = tmp_path / "wds"
    make_webdataset(root, shards=3, per_shard=4, width=16, height=16)
    assert len(glob.glob(str(root / "shard-*.tar"))) == 3
    info = make_webdataset(root, shards=1, per_shard=4, width=16, height=16)
    assert len(glob.glob(str(root / "shard-*.tar"))) == 1 and info.files == 4
    mtime = os.stat(root / "shard-000000.tar").st_mtime_ns
    assert make_webdataset(root, shards=1, per_shard=4, width=16, height=16) == info
    assert os.stat(root / "shard-000000.tar").st_mtime_ns == mtime
