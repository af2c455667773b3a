"""fastread.files.read_files_packed: a list of files read into one buffer,
back to back (a dense read, Context.read(dense=True), viewed by
Batch.packed()), the buffers of an Arrow binary column (fastread.ray's
blocks). Checked: exact bytes and offsets for every file engine, empty
files included; the engine's arena itself where the engine lays files out
(no copy), a copy where it cannot (O_DIRECT); a file that turns out larger
than its size hint (the dense repair path); a pooled
batch read dense and then not (the flag does not stick); errors naming the
path."""
import os

import numpy as np
import pytest

import fastread
from conftest import write_class_tree
from fastread.files import read_files_packed

# The engines that lay whole files out in the arena themselves (fr_layout),
# so a dense read is the packed buffer as read.
LAYS_OUT = ("auto", "psync", "io_uring")


def file_engines():
    return ["auto"] + [e for e, st in fastread.engines().items() if st.files is True]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    # Sizes around the 64-byte alignment a non-dense read pads to, and empty files.
    root, content = write_class_tree(tmp_path_factory.mktemp("packed") / "t", [11, 7], seed=3,
                                     max_size=1, sizes=[0, 1, 63, 64, 65, 4097, 100_000, 0, 33_333])
    paths, _ = fastread.scan(root)
    return paths, content


def owner_is_batch(a):
    while a is not None and type(a).__name__ != "Batch":
        if isinstance(a, np.ndarray) and a.flags.owndata:
            return False
        a = getattr(a, "base", None)
    return a is not None


def unpack(data, offsets):
    assert data.dtype == np.uint8 and data.ndim == 1
    assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == data.size
    assert np.all(np.diff(offsets) >= 0)
    return [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]


@pytest.mark.parametrize("engine", file_engines())
def test_every_file_back_to_back_exact(tree, engine):
    paths, content = tree
    order = paths[::-1] + paths[:3]   # any order, a file twice
    data, offsets = read_files_packed(order, engine)
    assert len(offsets) == len(order) + 1
    assert unpack(data, offsets) == [content[p] for p in order]
    if engine in LAYS_OUT:
        assert owner_is_batch(data), "the arena was copied"
        # Read again: the context now knows the sizes (remember_sizes) and
        # lays the files out from them, still back to back.
        again, offsets2 = read_files_packed(order, engine)
        assert owner_is_batch(again) and offsets2.tolist() == offsets.tolist()
        assert unpack(again, offsets2) == [content[p] for p in order]


def test_o_direct_is_copied_packed(tree):
    paths, content = tree
    data, offsets = read_files_packed(paths, "auto", o_direct=True)
    assert unpack(data, offsets) == [content[p] for p in paths]


def test_file_larger_than_its_size_hint(tree):
    # A size hint below the file's size: the engine's first read finds more
    # than the hint and the file is read whole again, at the arena's end (it
    # outgrew its slot), so the batch is no longer back to back. (The growth
    # check byte it wrote onto the next file's first byte, fr_batch.
    # dense_spill, is overwritten here by that file's own later read; the
    # reread Context.read does for it is the C core's fr_batch_reread_
    # first_byte, tested in csrc/tests/test_dense.c.)
    paths, content = tree
    big = [p for p in paths if len(content[p]) > 1000]
    for engine in ("psync", "io_uring"):
        if fastread.engines()[engine].files is not True:
            continue
        ctx = fastread.open_context(engine)
        hints = [len(content[p]) // 2 for p in big]
        batch = ctx.read(big, sizes=hints, dense=True)
        assert not batch.failures()
        packed = batch.packed()   # None where a file was read again elsewhere
        got = unpack(*packed) if packed is not None else [bytes(a) for a in batch.arrays()]
        assert got == [content[p] for p in big]


def test_pooled_batch_does_not_keep_the_dense_layout(tree):
    paths, content = tree
    ctx = fastread.open_context("psync")
    dense = ctx.read(paths, dense=True)
    assert dense.packed() is not None
    dense.release()   # its arena goes back to the pool, for the next read
    padded = ctx.read(paths[:4])   # 0, 1, 63, 64 bytes: 64-byte aligned slots
    assert padded.packed() is None
    assert [bytes(a) for a in padded.arrays()] == [content[p] for p in paths[:4]]


def test_empty_list_and_errors_name_the_path(tree, tmp_path):
    paths, _ = tree
    data, offsets = read_files_packed([])
    assert data.size == 0 and offsets.tolist() == [0]
    missing = str(tmp_path / "gone.jpg")
    with pytest.raises(fastread.ReadError) as e:
        read_files_packed(paths[:2] + [missing])
    assert e.value.filename == missing and missing in str(e.value)
    with pytest.raises(TypeError, match=r"read_files_packed\(\) takes a list of paths"):
        read_files_packed(paths[0])
    with pytest.raises(fastread.ReadError, match="not a regular file") as e:
        read_files_packed([paths[0], os.path.dirname(paths[0])])
    assert e.value.filename == os.path.dirname(paths[0])


def test_sources_read_packed_files_and_ranges(tree, tmp_path):
    # SampleSource.read_packed: a FileList's files and a packed image's
    # ranges (FileRanges) back to back, in the order asked, equal to read().
    paths, content = tree
    files = fastread.FileList(paths)
    idx = np.array([5, 0, -1, 3, 3])
    data, offsets = files.read_packed(idx)
    assert unpack(data, offsets) == [bytes(a) for a in files.read(idx)]
    assert owner_is_batch(data)
    out = str(tmp_path / "t.img")
    fastread.pack(os.path.dirname(os.path.dirname(paths[0])), out, progress=False)
    img = fastread.PackedImage(out)
    root = os.path.dirname(os.path.dirname(paths[0]))
    order = np.arange(len(img))[::-1]
    for engine in [e for e in ("psync", "io_uring") if fastread.engines()[e].ranges is True]:
        data, offsets = img.read_packed(order, engine)
        assert unpack(data, offsets) == [content[os.path.join(root, img.names[i])]
                                         for i in order]
        assert owner_is_batch(data)
    # O_DIRECT ranges (the image's samples are 4096-aligned) keep aligned
    # slots: copied, same bytes.
    data, offsets = img.read_packed(order, "psync", o_direct=True)
    assert unpack(data, offsets) == [content[os.path.join(root, img.names[i])] for i in order]
    with pytest.raises(IndexError):
        img.read_packed([len(img)])
