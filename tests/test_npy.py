"""Tests for fastread.npy: .npy headers without the data, checked against np.load."""
import errno
import io
import os
import struct

import numpy as np
import pytest

import fastread
from fastread.errors import ReadError
from fastread.npy import (MAX_HEADER_SIZE, PROBE_BYTES, NpyError, NpyHeader, NpyIndex,
                          array_view, header_size, parse_header)

VERSIONS = [(1, 0), (2, 0), (3, 0)]
DTYPES = [
    "u1", "i1", "<i2", ">i2", ">i4", "<u8", "<f2", "<f4", ">f4", "<f8", ">f8",
    "<c8", ">c16", "?", "S5", "<U3", "V7", "<M8[ns]",
    np.dtype([("a", "<i4"), ("b", ">f8", (2,)), ("c", "S3")]),
    np.dtype([("x", "u1"), ("y", "<f8")], align=True),  # padding fields in descr
    np.dtype([("outer", [("in", "<i2"), ("f", "?")]), ("z", "<u4", (2, 2))]),
]
SHAPES = [(), (0,), (1,), (7,), (3, 224, 224), (2, 1, 3, 2, 2), (0, 3), (4, 5)]


def dtype_id(dt):
    return np.dtype(dt).str if np.dtype(dt).names is None else f"struct{len(np.dtype(dt).names)}"


def sample(shape, dtype, fortran, seed=0):
    """Deterministic non-trivial contents (random bytes) of the given kind."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if dt.kind == "b":
        raw &= 1  # only 0 / 1 are valid bools
    if dt.kind == "M":
        raw.view("<i8")[:] %= 10**18  # keep clear of NaT for array_equal
    a = raw.view(dt).reshape(shape)
    if fortran and a.ndim > 1:
        a = np.asfortranarray(a)
    return a


def npy_bytes(a, version=None):
    f = io.BytesIO()
    np.lib.format.write_array(f, a, version=version, allow_pickle=False)
    return f.getvalue()


def raw_header(text, version=(1, 0), pad=True):
    """A .npy preamble + header whose dict text is given verbatim."""
    body = text.encode("utf8" if version == (3, 0) else "latin1")
    width = 2 if version == (1, 0) else 4
    if pad:
        body += b" " * (-(8 + width + len(body) + 1) % 64) + b"\n"
    fmt = "<H" if width == 2 else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(body)) + body


def memory(x):
    """The bytes of a contiguous array in memory order."""
    return x.ravel(order="A").view(np.uint8).tobytes()


def values_equal(a, b):
    """Same values, bit for bit (NaN-proof); field by field for structured
    dtypes, whose padding bytes np.load need not keep."""
    if a.dtype.names:
        return all(values_equal(a[n], b[n]) for n in a.dtype.names)
    return a.tobytes() == b.tobytes()


def same(a, b):
    """Same dtype, shape, memory order and values."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.flags.c_contiguous == b.flags.c_contiguous
            and a.flags.f_contiguous == b.flags.f_contiguous
            and values_equal(a, b))


# -- parse_header / array_view against np.load ------------------------------------
@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"v{v[0]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_header_and_view_equal_np_load(dtype, version, fortran):
    for i, shape in enumerate(SHAPES):
        a = sample(shape, dtype, fortran, seed=i)
        raw = npy_bytes(a, version)
        ref = np.load(io.BytesIO(raw))
        assert raw[6:8] == bytes(version)
        h = parse_header(raw, "mem.npy")
        assert isinstance(h, NpyHeader)
        assert h.shape == ref.shape == shape
        assert h.dtype == ref.dtype == np.dtype(dtype)
        # numpy writes F order only for arrays that are F- but not C-contiguous.
        assert h.fortran_order == (a.flags.f_contiguous and not a.flags.c_contiguous)
        assert h.fortran_order == (fortran and shape in [(3, 224, 224), (2, 1, 3, 2, 2), (4, 5)])
        assert h.nbytes == ref.nbytes == a.nbytes
        assert h.data_offset == len(raw) - a.nbytes
        assert h.data_offset % 64 == 0
        assert header_size(raw[:12]) == h.data_offset
        # The header alone (no data) parses the same.
        assert parse_header(raw[:h.data_offset]) == h
        buf = np.frombuffer(bytearray(raw), np.uint8)
        v = array_view(buf, h)
        assert same(v, ref), (shape, dtype)
        assert memory(v) == raw[h.data_offset:]  # exactly the file's data bytes
        assert v.flags.f_contiguous if h.fortran_order else v.flags.c_contiguous
        if a.nbytes:
            assert np.shares_memory(v, buf)  # a view, not a copy
        # Data-only buffer with offset=0.
        assert same(array_view(buf[h.data_offset:], h, offset=0), ref)


def test_values_not_just_bytes():
    # A float view that reads the wrong bytes would still have the right
    # shape: check actual numbers, including a big-endian dtype.
    a = (np.arange(24).reshape(2, 3, 4) / 7).astype(">f8")
    raw = npy_bytes(a.copy(order="F"))
    h = parse_header(raw, "x.npy")
    v = array_view(np.frombuffer(raw, np.uint8), h)
    assert h.fortran_order and h.dtype == np.dtype(">f8")
    assert v[1, 2, 3] == pytest.approx(23 / 7) and v[0, 1, 0] == pytest.approx(4 / 7)
    np.testing.assert_array_equal(v, a)


def test_accepts_bytes_memoryview_and_uint8_array():
    raw = npy_bytes(np.arange(10, dtype="<i2"))
    for buf in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8)):
        h = parse_header(buf, "x")
        assert (h.shape, h.dtype, h.nbytes) == ((10,), np.dtype("<i2"), 20)


def test_version_3_utf8_field_names():
    dt = np.dtype([("größe", "<f4"), ("名前", "S4")])
    a = np.zeros(3, dt)
    a["größe"] = [1.5, 2.5, -3]
    raw = io.BytesIO()
    with pytest.warns(UserWarning, match="3.0"):
        np.save(raw, a)  # np.save picks 3.0 itself: the names are not latin-1
    raw = raw.getvalue()
    assert raw[6:8] == b"\x03\x00"
    h = parse_header(raw, "u.npy")
    assert h.dtype.names == ("größe", "名前")
    v = array_view(np.frombuffer(raw, np.uint8), h)
    assert v["größe"].tolist() == [1.5, 2.5, -3.0]


def test_unpadded_header_and_1_0_length_field():
    # Hand-written files (other writers) need not pad to 64 bytes.
    raw = raw_header("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", pad=False)
    data = np.array([1, 2, 65535], "<u2").tobytes()
    h = parse_header(raw + data)
    assert h.data_offset == len(raw) and h.data_offset % 64 != 0
    assert array_view(np.frombuffer(raw + data, np.uint8), h).tolist() == [1, 2, 65535]


# -- rejections -------------------------------------------------------------------
def test_rejects_object_dtype(tmp_path):
    p = tmp_path / "obj.npy"
    np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(NpyError, match="objects") as e:
        parse_header(p.read_bytes(), p)
    assert str(p) in str(e.value) and e.value.path == str(p)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="obj.npy.*objects"):
        NpyIndex.build([p])
    # A structured dtype with one object field too.
    raw = npy_bytes_pickled(np.zeros(2, [("a", "<i4"), ("b", "O")]))
    with pytest.raises(NpyError, match="objects"):
        parse_header(raw, "s.npy")


def npy_bytes_pickled(a):
    f = io.BytesIO()
    np.save(f, a, allow_pickle=True)
    return f.getvalue()


GOOD = npy_bytes(np.arange(6, dtype="<i4"))


@pytest.mark.parametrize("raw, needle", [
    (b"\x93NUMPX" + GOOD[6:], "not a .npy file"),
    (b"PK\x03\x04" + GOOD[4:], "not a .npy file"),   # a .npz (zip)
    (b"", "truncated header"),
    (GOOD[:5], "truncated header"),
    (GOOD[:9], "truncated header"),
    (GOOD[:64], "truncated header"),
    (GOOD[:127], "truncated header"),
    (GOOD[:6] + b"\x04\x00" + GOOD[8:], "version 4.0"),
    (GOOD[:6] + b"\x01\x01" + GOOD[8:], "version 1.1"),
    (raw_header("{'descr': '<i4', 'fortran_order': False}"), "keys"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}"), "keys"),
    (raw_header("['descr', 'fortran_order', 'shape']"), "not a dict"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': (-2,)}"), "shape"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': [2]}"), "shape"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2.0,)}"), "shape"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': (True,)}"), "shape"),
    (raw_header("{'descr': '<i4', 'fortran_order': 0, 'shape': (2,)}"), "fortran_order"),
    (raw_header("{'descr': '<q9', 'fortran_order': False, 'shape': (2,)}"), "descr"),
    (raw_header("{'descr': 5, 'fortran_order': False, 'shape': (2,)}"), "descr"),
    (raw_header("{'descr': '|O', 'fortran_order': False, 'shape': (2,)}"), "objects"),
    # No bytes of data, so no size check: shapes NumPy cannot make (issue 43)
    (raw_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': {(0, 2**62, 2**62)}}}"),
     "is no NumPy array: array is too big"),
    (raw_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': {(0,) + (1,) * 70}}}"),
     "maximum supported dimension"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,)"), "cannot parse"),
    (raw_header("{'descr': '<i4', 'fortran_order': False, 'shape': __import__('os')}"),
     "cannot parse"),
    (b"\x93NUMPY\x02\x00" + struct.pack("<I", MAX_HEADER_SIZE + 1) + b" " * 100, "longer than"),
    (b"\x93NUMPY\x02\x00" + b"\xff\xff\xff\xff", "longer than"),
    (b"\x93NUMPY\x01\x00\x10\x00" + b"\xff" * 16, "cannot parse"),
    (b"\x93NUMPY\x03\x00" + struct.pack("<I", 52) + b"\xff" * 52, "utf8"),
])
def test_rejects_malformed(raw, needle):
    with pytest.raises(NpyError) as e:
        parse_header(raw, "/data/bad.npy")
    msg = str(e.value)
    assert msg.startswith("/data/bad.npy: "), msg
    assert needle in msg, msg
    assert isinstance(e.value, ValueError)


def test_errors_without_path_still_say_what():
    with pytest.raises(ValueError, match="^not a .npy file"):
        parse_header(b"hello world!")


# -- NpyIndex ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def npy_tree(tmp_path_factory):
    from fastread.datasets import make_npy_dataset

    pytest.importorskip("tqdm")
    root = tmp_path_factory.mktemp("npy") / "ds"
    info = make_npy_dataset(root, classes=3, per_class=7, shape=(3, 4, 5), dtype="float32",
                            seed=4, progress=False)
    return info


def test_index_over_generated_dataset(npy_tree):
    paths = npy_tree.paths()
    assert len(paths) == 21
    idx = NpyIndex.build(paths, threads=3)
    assert len(idx) == 21 and idx.paths == paths
    for arr in (idx.data_offset, idx.nbytes, idx.file_size):
        assert arr.dtype == np.int64 and arr.shape == (21,)
    assert idx.fortran_order.dtype == bool and not idx.fortran_order.any()
    assert idx.data_offset.tolist() == [128] * 21
    assert idx.nbytes.tolist() == [3 * 4 * 5 * 4] * 21
    assert idx.file_size.tolist() == [os.path.getsize(p) for p in paths]
    assert idx.shape == [(3, 4, 5)] * 21 and idx.dtype == [np.dtype("float32")] * 21
    assert idx.uniform() == ((3, 4, 5), np.dtype("float32"))
    assert idx[5] == parse_header(open(paths[5], "rb").read())
    # The data read by fastread's own engine, viewed with the index's headers.
    arrays = fastread.read_files(paths)
    for i, (p, buf) in enumerate(zip(paths, arrays)):
        ref = np.load(p)
        v = array_view(buf, idx[i])
        np.testing.assert_array_equal(v, ref)
        assert v.dtype == ref.dtype and v.shape == ref.shape
    # Different files hold different data (the comparison above can fail).
    assert not np.array_equal(np.load(paths[0]), np.load(paths[1]))


def write(path, raw):
    with open(path, "wb") as f:
        f.write(raw)
    return str(path)


def test_index_keeps_input_order_over_many_chunks(tmp_path):
    # Distinct shapes, dtypes and orders per file: any mix-up between files
    # or chunks shows.
    paths, arrays = [], []
    dts = ["u1", "<i2", ">f4", "<c8"]
    for i in range(300):
        a = sample((i % 17 + 1, i % 5 + 1), dts[i % 4], fortran=i % 3 == 0, seed=i)
        arrays.append(a)
        paths.append(write(tmp_path / f"{i:03d}.npy", npy_bytes(a, VERSIONS[i % 3])))
    order = list(np.random.default_rng(0).permutation(300))
    paths = [paths[i] for i in order]
    arrays = [arrays[i] for i in order]
    one = NpyIndex.build(paths, threads=1)
    many = NpyIndex.build(paths, threads=8)
    for idx in (one, many):
        assert idx.paths == paths
        assert idx.shape == [a.shape for a in arrays]
        assert idx.dtype == [a.dtype for a in arrays]
        assert idx.fortran_order.tolist() == [a.ndim > 1 and not a.flags.c_contiguous for a in arrays]
        assert idx.nbytes.tolist() == [a.nbytes for a in arrays]
        assert idx.uniform() is None
    for i in (0, 1, 150, 299):
        v = array_view(np.fromfile(paths[i], np.uint8), many[i])
        assert same(v, np.load(paths[i]))


@pytest.mark.parametrize("waited, pooled", [(True, True), (False, False)], ids=["cold", "cached"])
def test_default_threads_adapt_to_storage_speed(tmp_path, monkeypatch, waited, pooled):
    # A chunk that waited on storage: the rest go to the pool after the first
    # chunk on the calling thread -- in input order all the same.
    import threading

    import fastread.npy as npy

    paths = [write(tmp_path / f"{i}.npy", npy_bytes(np.zeros(i % 7 + 1, "<u2")))
             for i in range(700)]
    seen = []
    probe = npy._probe_chunk

    def spy(chunk):
        seen.append((threading.current_thread() is threading.main_thread(), len(chunk)))
        return probe(chunk)

    monkeypatch.setattr(npy, "_waited", lambda wall, cpu: waited)
    monkeypatch.setattr(npy, "_probe_chunk", spy)
    idx = NpyIndex.build(paths)
    assert idx.shape == [(i % 7 + 1,) for i in range(700)]
    on_main = sum(k for main, k in seen if main)
    assert sum(k for _, k in seen) == 700
    assert on_main == (npy._ADAPT_CHUNK if pooled else 700)


def test_long_header_is_read_past_the_first_probe(tmp_path):
    dt = np.dtype([(f"field_number_{k:04d}", "<i2") for k in range(250)])
    a = np.zeros(3, dt)
    a["field_number_0249"] = [7, 8, 9]
    p = tmp_path / "wide.npy"
    np.save(p, a)
    h = parse_header(p.read_bytes())
    assert PROBE_BYTES < h.data_offset < MAX_HEADER_SIZE
    idx = NpyIndex.build([p, p])
    assert idx.data_offset.tolist() == [h.data_offset] * 2
    assert idx.uniform() == ((3,), dt)
    v = array_view(np.fromfile(p, np.uint8), idx[0])
    assert v["field_number_0249"].tolist() == [7, 8, 9]


def test_uniform_needs_same_shape_dtype_and_order(tmp_path):
    a = np.arange(12, dtype="<i4").reshape(3, 4)
    base = write(tmp_path / "a.npy", npy_bytes(a))
    twin = write(tmp_path / "b.npy", npy_bytes(a + 1, (2, 0)))  # other version, same array kind
    assert NpyIndex.build([base, twin]).uniform() == ((3, 4), np.dtype("<i4"))
    for name, other in [("shape", a.reshape(4, 3)), ("dtype", a.astype(">i4")),
                        ("order", np.asfortranarray(a))]:
        q = write(tmp_path / f"{name}.npy", npy_bytes(other))
        assert NpyIndex.build([base, q]).uniform() is None, name
    empty = NpyIndex.build([])
    assert len(empty) == 0 and empty.uniform() is None and empty.nbytes.dtype == np.int64


@pytest.mark.parametrize("cut, needle", [(-1, "truncated"), (-24, "truncated"),
                                         (+1, "trailing bytes"), (+4096, "trailing bytes")])
def test_index_checks_file_size(tmp_path, cut, needle):
    raw = npy_bytes(np.arange(6, dtype="<f8"))
    bad = raw[:cut] if cut < 0 else raw + b"\0" * cut
    good = write(tmp_path / "good.npy", raw)
    p = write(tmp_path / "bad.npy", bad)
    with pytest.raises(NpyError) as e:
        NpyIndex.build([good, p, good])
    assert str(e.value).startswith(f"{p}: {needle}")
    assert e.value.path == p


@pytest.mark.parametrize("raw, needle", [
    (b"", "truncated header"), (GOOD[:9], "truncated header"), (GOOD[:100], "truncated header"),
    (b"\x93NUMPX" + GOOD[6:], "not a .npy file"),
])
def test_index_malformed_files_name_the_path(tmp_path, raw, needle):
    p = write(tmp_path / "x.npy", raw)
    with pytest.raises(NpyError, match=needle) as e:
        NpyIndex.build([p])
    assert str(p) in str(e.value)


def test_missing_files_raise_read_error(tmp_path):
    good = write(tmp_path / "good.npy", GOOD)
    gone1, gone2 = str(tmp_path / "gone1.npy"), str(tmp_path / "gone2.npy")
    with pytest.raises(ReadError) as e:
        NpyIndex.build([good, gone1, good, gone2], threads=2)
    assert isinstance(e.value, OSError)
    assert e.value.errno == errno.ENOENT and e.value.filename == gone1
    assert e.value.failures == [(gone1, errno.ENOENT), (gone2, errno.ENOENT)]
    assert gone1 in str(e.value)


def test_first_failure_in_input_order_decides(tmp_path):
    bad = write(tmp_path / "bad.npy", GOOD + b"x")
    gone = str(tmp_path / "gone.npy")
    with pytest.raises(NpyError, match="trailing"):
        NpyIndex.build([bad, gone])
    with pytest.raises(ReadError):
        NpyIndex.build([gone, bad])


def test_directory_is_a_read_error(tmp_path):
    with pytest.raises(ReadError) as e:
        NpyIndex.build([tmp_path])
    assert e.value.errno == errno.EISDIR and e.value.filename == str(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without permission")
def test_unreadable_file_is_a_read_error(tmp_path):
    p = write(tmp_path / "secret.npy", GOOD)
    os.chmod(p, 0)
    with pytest.raises(ReadError) as e:
        NpyIndex.build([p])
    assert e.value.errno == errno.EACCES and e.value.filename == p


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_bad_threads(threads):
    with pytest.raises(ValueError, match="threads"):
        NpyIndex.build([], threads=threads)


def test_waited_tells_waiting_from_computing():
    import fastread.npy as npy
    assert npy._waited(wall=0.010, cpu=0.002)
    assert not npy._waited(wall=0.010, cpu=0.009)
    assert not npy._waited(wall=0.0009, cpu=0.0)  # too short to judge


# -- array_view -------------------------------------------------------------------
def test_array_view_checks_its_buffer():
    a = np.arange(6, dtype="<i4").reshape(2, 3)
    raw = npy_bytes(a)
    h = parse_header(raw)
    buf = np.frombuffer(bytearray(raw), np.uint8)
    with pytest.raises(ValueError, match="needs 24"):
        array_view(buf[:-1], h)
    with pytest.raises(ValueError, match="needs 24"):
        array_view(buf, h, offset=len(raw) - 23)
    with pytest.raises(ValueError, match="uint8"):
        array_view(buf.view("<i4"), h, offset=0)
    with pytest.raises(ValueError, match="uint8"):
        array_view(buf[::2], h, offset=0)
    with pytest.raises(ValueError, match="offset"):
        array_view(buf, h, offset=-1)
    # Writable buffer: writes go through to it (a view); read-only stays read-only.
    v = array_view(buf, h)
    v[1, 2] = 99
    assert buf[h.data_offset + 20] == 99
    ro = array_view(raw, h)
    assert not ro.flags.writeable and ro.tolist() == [[0, 1, 2], [3, 4, 5]]
