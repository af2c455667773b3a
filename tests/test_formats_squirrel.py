"""Squirrel MessagePack stores (fastread.formats.squirrel): parity with
squirrel-core's get_iter(), the DALI reader, bad input and a fuzzed parser."""
import gzip
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastread
from fastread.formats import FormatError
from fastread.formats.squirrel import SquirrelStore, value_end, walk_sample

msgpack = pytest.importorskip("msgpack")
msgpack_numpy = pytest.importorskip("msgpack_numpy")


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True, default=msgpack_numpy.encode)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pytest.importorskip("squirrel")
    from fastread.datasets.squirrel import make_squirrel
    root = tmp_path_factory.mktemp("sq")
    make_squirrel(root, samples=45, per_shard=20, shape=(3, 12, 10), seed=3)
    return str(root)


def read_all(src):
    return src.fields(src.read(np.arange(len(src))), np.arange(len(src)))


def test_matches_squirrel_get_iter(store, tmp_path):
    from squirrel.driver.msgpack import MessagepackDriver
    driver = MessagepackDriver(store)
    keys = sorted(driver.store.keys())
    ref = list(driver.get_iter(keys_iterable=keys))
    src = SquirrelStore(store, cache_dir=str(tmp_path / "c"))
    images, labels = read_all(src)
    assert len(ref) == len(src) == 45
    for i, r in enumerate(ref):
        assert images[i].dtype == r["image"].dtype and images[i].shape == r["image"].shape
        np.testing.assert_array_equal(images[i], r["image"])
        assert int(labels[i]) == r["label"]
    assert not images[0].flags.owndata   # a view of the sample's bytes


def test_reader_shuffle_and_shards(store, tmp_path):
    src = SquirrelStore(store, keys=("label", "image"), cache_dir=str(tmp_path / "c"))
    want = sorted(a.tobytes() for a in read_all(src)[1])
    got = []
    for shard in range(2):
        with fastread.Reader(source=src, batch_size=8, shard_id=shard, num_shards=2,
                             random_shuffle=True, seed=1) as r:
            for arrays, ids in r:
                got.extend(a.tobytes() for a in src.fields(arrays, ids)[1])
    assert sorted(got) == want


def test_dali_reader(store, tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from fastread.dali.formats import squirrel

    @pipeline_def(batch_size=16, num_threads=2, device_id=None)
    def pipe():
        return squirrel(url=store, keys=("image", "label"), cache_dir=str(tmp_path / "c"))

    p = pipe()
    p.build()
    images, labels = read_all(SquirrelStore(store, cache_dir=str(tmp_path / "c")))
    i = 0
    while True:
        try:
            out = p.run()
        except StopIteration:
            break
        for a, b in zip(out[0], out[1]):
            np.testing.assert_array_equal(np.array(a), images[i])
            assert int(np.array(b)) == int(labels[i])
            i += 1
    assert i == 45


def write_shard(d, name, samples, compress=True, raw=None):
    os.makedirs(d, exist_ok=True)
    blob = raw if raw is not None else b"".join(pack(s) for s in samples)
    with open(os.path.join(d, name), "wb") as f:
        f.write(gzip.compress(blob) if compress else blob)
    return str(d)


def sample(i):
    return {"image": np.full((2, 3), i, np.uint8), "label": i}


def test_uncompressed_and_empty_shards(tmp_path):
    d = write_shard(tmp_path / "s", "a.gz", [sample(1), sample(2)], compress=False)
    write_shard(d, "b.gz", [])
    write_shard(d, "c.gz", [sample(3)])
    src = SquirrelStore(d, cache_dir=str(tmp_path / "c"))
    images, labels = read_all(src)
    assert [int(x) for x in labels] == [1, 2, 3] and images[2].tolist() == [[3] * 3] * 2


@pytest.mark.parametrize("raw, match", [
    (pack(sample(1)) + pack(sample(2))[:-3], r"at byte \d+: truncated MessagePack object"),
    (pack(sample(1)) + b"\xc1", r"at byte \d+: (byte 0xc1 is not a MessagePack type|a sample is "
                                r"not a MessagePack map)"),
    (pack(sample(1)) + pack([1, 2]), r"a sample is not a MessagePack map"),
    (pack(sample(1)) + pack({"image": np.zeros(3, np.uint8)}), r"sample 1 has no key 'label'"),
])
def test_bad_shards(tmp_path, raw, match):
    d = write_shard(tmp_path / "s", "a.gz", None, raw=raw)
    with pytest.raises(FormatError, match=match) as e:
        SquirrelStore(d, cache_dir=str(tmp_path / "c"))
    assert "a.gz" in str(e.value)


def test_bad_gzip_and_missing_store(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "a.gz").write_bytes(gzip.compress(pack(sample(1)) * 50)[:-30])
    with pytest.raises(FormatError, match=r"a.gz at byte \d+: truncated gzip stream"):
        SquirrelStore(str(d), cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError, match="no \\*.gz shards"):
        SquirrelStore(str(tmp_path / "c"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_parser(data):
    base = pack({"image": np.arange(data.draw(st.integers(0, 40)), dtype=np.uint8).reshape(-1, 1),
                 "label": data.draw(st.integers(-2**40, 2**40)), "x": [1.5, None, True, "s"],
                 "e": msgpack.ExtType(3, b"abc")})
    blob = bytearray(base)
    for _ in range(data.draw(st.integers(0, 3))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    blob = bytes(blob[:data.draw(st.integers(0, len(blob)))])
    try:
        end, fields = walk_sample(blob, 0, len(blob), "fuzz.gz")
    except FormatError as e:
        assert str(e).startswith("fuzz.gz")
        return
    assert end <= len(blob)
    for f in fields.values():
        if f[0] == "array":
            assert f[1] + f[2] <= len(blob)


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=64))
def test_fuzz_value_end(blob):
    try:
        end = value_end(blob, 0, len(blob), "f")
    except FormatError:
        return
    assert 0 < end <= len(blob)
    # msgpack's own parser agrees where the value ends.
    u = msgpack.Unpacker(raw=True)
    u.feed(blob)
    u.skip()
    assert u.tell() == end


def test_cli_make_dataset(tmp_path, capsys):
    pytest.importorskip("squirrel")
    from fastread.cli import main
    assert main(["make-dataset", str(tmp_path / "s"), "--format", "squirrel", "--shards", "2",
                 "--per-shard", "3", "--shape", "3,4,5", "--quiet"]) == 0
    assert "Squirrel store, 6 samples in 2 shards" in capsys.readouterr().out
    src = SquirrelStore(str(tmp_path / "s"), cache_dir=str(tmp_path / "c"))
    assert len(src) == 6 and read_all(src)[0][0].shape == (3, 4, 5)


def test_torch_loader(store, tmp_path):
    torch = pytest.importorskip("torch")
    from fastread.torch import SquirrelLoader
    images, labels = read_all(SquirrelStore(store, cache_dir=str(tmp_path / "c")))
    loader = SquirrelLoader(store, batch_size=16, cache_dir=str(tmp_path / "c"))
    got = list(loader)
    assert len(got) == len(loader) == 3
    assert torch.equal(torch.cat([g[0] for g in got]), torch.from_numpy(np.stack(images)))
    assert torch.cat([g[1] for g in got]).tolist() == [int(x) for x in labels]


class _CreatesFile:
    """A pickle that creates a file when it is loaded: proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _pickled_array(path):
    """What msgpack_numpy writes for an object array: its pickle, which
    msgpack_numpy.decode would pass to pickle.loads."""
    import pickle
    return {b"nd": True, b"kind": b"O", b"type": "|O", b"shape": [1],
            b"data": pickle.dumps(_CreatesFile(path))}


@pytest.mark.parametrize("where", ["value", "array meta", "key", "nested value"])
def test_pickled_object_arrays_are_refused_unrun(tmp_path, where):
    proof = str(tmp_path / "code-ran")
    evil = _pickled_array(proof)
    image = {"nd": True, "type": "|u1", "kind": b"", "shape": [2, 2], "data": bytes(4)}
    if where == "value":
        s = {"image": image, "label": evil}
    elif where == "array meta":
        s = {"image": dict(image, shape=evil), "label": 1}
    elif where == "key":
        s = {"image": image, "label": 1, "x": {"y": 1}}
        raw = msgpack.packb(s, use_bin_type=True)
        # a map whose first key is the pickle (msgpack cannot pack a dict key)
        raw = bytes([raw[0] + 1]) + msgpack.packb(evil, use_bin_type=True) + b"\x01" + raw[1:]
    else:
        s = {"image": image, "label": {"deep": [1, evil]}}
    d = write_shard(tmp_path / "s", "a.gz", None,
                    raw=raw if where == "key" else msgpack.packb(s, use_bin_type=True))
    with pytest.raises(FormatError, match=r"a.gz at byte \d+: .*kind b?'O'.* refused"):
        SquirrelStore(d, cache_dir=str(tmp_path / "c"))
    assert not os.path.exists(proof)


def test_negative_shape_is_a_format_error(tmp_path):
    image = {"nd": True, "type": "|u1", "kind": b"", "shape": [-1, -4], "data": bytes(4)}
    d = write_shard(tmp_path / "s", "a.gz", None,
                    raw=msgpack.packb({"image": image, "label": 1}, use_bin_type=True))
    with pytest.raises(FormatError, match=r"a.gz at byte \d+: .*negative dimension"):
        SquirrelStore(d, cache_dir=str(tmp_path / "c"))


@pytest.mark.parametrize("array, needle", [
    # issue 43: indexed, then numpy's bare "cannot reshape array of size 0" mid-epoch
    ({"type": "|V0", "shape": [2], "data": b""}, r"\|V0 has items of 0 bytes"),
    ({"type": "<f4", "shape": [0, 2 ** 62, 2 ** 62], "data": b""}, "array is too big"),
    ({"type": "<f4", "shape": [1] * 70, "data": bytes(4)}, "maximum supported dimension"),
])
def test_arrays_numpy_cannot_view_are_format_errors(tmp_path, array, needle):
    image = {"nd": True, "kind": b"", **array}
    d = write_shard(tmp_path / "s", "a.gz", None,
                    raw=msgpack.packb({"image": image, "label": 1}, use_bin_type=True))
    with pytest.raises(FormatError, match=r"a.gz at byte \d+: array 'image': .*" + needle):
        SquirrelStore(d, cache_dir=str(tmp_path / "c"))


def test_values_decode_as_msgpack_numpy_does(tmp_path):
    """Values (labels, metadata) holding msgpack_numpy's own encodings come
    back as msgpack_numpy.decode gives them, without its pickle path."""
    rec = np.zeros(2, [("a", "<i4"), ("b", ">f8")])
    rec["a"], rec["b"] = [1, 2], [0.5, -1.5]
    values = {"scalar": np.float32(2.5), "int": np.int64(-7), "complex": 1 + 2j,
              "array": np.arange(6, dtype=">i2").reshape(2, 3), "structured": rec,
              "nested": [np.uint8(3), {"a": np.ones(2, np.float16)}], "plain": [1, "s", None],
              "own map": {"nd": 1, "data": b"x", "type": "<i4"}}
    samples = [{"image": np.zeros((2, 2), np.uint8), "label": 0, **values}]
    d = write_shard(tmp_path / "s", "a.gz", samples)
    keys = ("image", "label") + tuple(values)
    src = SquirrelStore(d, keys=keys, cache_dir=str(tmp_path / "c"))
    got = dict(zip(keys, read_all(src)))
    want = msgpack.unpackb(pack(samples[0]), object_hook=msgpack_numpy.decode, raw=False,
                           use_list=False)

    def same(a, b):
        if isinstance(b, np.ndarray) or isinstance(b, np.generic):
            assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
        elif isinstance(b, (tuple, list)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                same(x, y)
        elif isinstance(b, dict):
            assert a.keys() == b.keys()
            for k in b:
                same(a[k], b[k])
        else:
            assert type(a) is type(b) and a == b

    for k in values:
        field = got[k][0]
        if k in ("scalar", "int", "complex", "array", "structured"):
            same(field, np.asarray(want[k]))
        else:   # fields() wraps a value in np.asarray; compare the index's value
            same(src._fields[0][keys.index(k)][1], want[k])


@pytest.mark.parametrize("stack", [True, False])
def test_torch_loader_big_endian_and_string_fields(tmp_path, stack):
    torch = pytest.importorskip("torch")
    from fastread.torch import SquirrelLoader
    samples = [{"image": (np.arange(6).reshape(2, 3) + i).astype(">f4"), "label": i,
                "key": f"s{i}", "raw": b"b%d" % i} for i in range(4)]
    d = write_shard(tmp_path / "s", "a.gz", samples)
    loader = SquirrelLoader(d, keys=("image", "label", "key", "raw"), batch_size=2, stack=stack,
                            cache_dir=str(tmp_path / "c"))
    got = list(loader)
    assert len(got) == 2
    for b, (images, labels, keys, raws) in enumerate(got):
        for j in range(2):
            i = 2 * b + j
            want = torch.arange(6, dtype=torch.float32).reshape(2, 3) + i
            assert torch.equal(images[j], want) and int(labels[j]) == i
            assert keys[j] == f"s{i}" and raws[j] == b"b%d" % i
        assert isinstance(images, torch.Tensor) == stack and keys == [f"s{2 * b}", f"s{2 * b + 1}"]


def test_torch_loader_names_key_of_untensorable_dtype(tmp_path):
    pytest.importorskip("torch")
    from fastread.torch import SquirrelLoader
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("long double is a double here; torch takes it")
    d = write_shard(tmp_path / "s", "a.gz",
                    [{"image": np.zeros(2, np.longdouble), "label": 0}] * 2)
    loader = SquirrelLoader(d, batch_size=2, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="squirrel field 'image': float128"):
        next(iter(loader))


def _rows(src):
    return [tuple((f[0],) + tuple(np.asarray(x).tolist() if isinstance(x, np.ndarray) else
                                  str(x) if isinstance(x, np.dtype) else x for x in f[1:])
                  for f in row) for row in src._fields]


def test_native_index_matches_the_reference(store, tmp_path):
    """The C walk (fr_sq_walk) and the Python reference give the same
    samples, byte ranges and fields; the C walk does the shards itself
    (it is not silently left to the reference)."""
    from fastread import _formats
    from fastread.formats import squirrel as sq
    native = SquirrelStore(store, cache_dir=str(tmp_path / "c"))
    ref = SquirrelStore(store, cache_dir=str(tmp_path / "c"), indexer="python")
    assert len(native) == len(ref) == 45
    for a, b in zip(native.files, ref.files):
        assert a.offsets.tolist() == b.offsets.tolist()
        assert a.lengths.tolist() == b.lengths.tolist()
    assert _rows(native) == _rows(ref)
    for x, y in zip(read_all(native), read_all(ref)):
        assert [np.asarray(v).tobytes() for v in x] == [np.asarray(v).tobytes() for v in y]
    with open(native.files[0].path, "rb") as f:
        cols = _formats.squirrel_walk(f.read(), ("image", "label"))
    assert len(cols["start"]) == len(native.files[0])
    with pytest.raises(ValueError):
        SquirrelStore(store, indexer="other")
    assert sq._native_walk(b"\x91\x01", "x", ("a",)) is None   # not a map: the reference's


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_native_walk_agrees_with_the_reference_on_edited_shards(data):
    """Shards of several samples with bytes replaced and cut: wherever the
    reference indexes a shard the native walk gives the same (or leaves it
    to the reference); it never indexes one the reference refuses, except
    for fields it does not decode (not wanted)."""
    from fastread.formats import squirrel as sq
    n = data.draw(st.integers(1, 4))
    blob = bytearray(b"".join(pack({"image": np.arange(data.draw(st.integers(0, 9)),
                                                       dtype=np.uint8), "label": i,
                                    "other": "é"}) for i in range(n)))
    for _ in range(data.draw(st.integers(0, 3))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    blob = bytes(blob[:data.draw(st.integers(1, len(blob)))])
    keys = ("image", "label")
    try:
        ref = sq._reference_walk(blob, len(blob), "f.gz", keys)
    except FormatError:
        ref = None
    try:
        got = sq._native_walk(blob, "f.gz", keys)
    except FormatError:   # a wanted field's decoding (the reference's own) refused it
        assert ref is None
        return
    if got is None:
        return
    if ref is None:
        # Accepted natively, refused by the reference: only for a field
        # not wanted ("other"), which the reference decodes and the walk
        # does not; wanted as well, the walk refuses it too.
        try:
            full = sq._native_walk(blob, "f.gz", keys + ("other",))
        except FormatError:
            full = None
        assert full is None
        return
    assert got[0].tolist() == ref[0].tolist() and got[1].tolist() == ref[1].tolist()
    norm = lambda rows: [tuple(repr(x) for x in row) for row in rows]  # noqa: E731
    assert norm(got[2]) == norm(ref[2])
