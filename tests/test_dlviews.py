"""fastread._dlviews: DLPack views of byte ranges and whole arrays whose deleters take no GIL
(ViewBlock tells when all are released) and pack_ranges, the native packing
of ranges into rows, which fastread.dali.formats.webdataset feeds DALI."""
import gc

import numpy as np
import pytest

from fastread._dlviews import RangeView, ViewBlock, array_view, pack_ranges, range_views


def samples():
    return [np.arange(i, i + 20, dtype=np.uint8) for i in range(5)]


def test_views_are_the_ranges_without_a_copy():
    arrays = samples()
    views, block = range_views(arrays, [0, 3, -1, 5, 20], [10, 4, -1, 15, 20])
    assert isinstance(block, ViewBlock) and all(isinstance(v, RangeView) for v in views)
    assert [len(v) for v in views] == [10, 1, 0, 10, 0]
    got = [np.from_dlpack(v) for v in views]
    assert [g.tolist() for g in got] == [list(range(10)), [4], [], list(range(8, 18)), []]
    arrays[0][0] = 99                       # a view, not a copy
    assert got[0][0] == 99
    with pytest.raises(BufferError, match="exported"):
        views[0].__dlpack__()
    assert block.arrays[0] is arrays[0]      # the block keeps the bytes mapped


def test_block_in_use_until_every_view_is_released():
    views, block = range_views(samples(), [0] * 5, [4] * 5)
    consumed = [np.from_dlpack(v) for v in views[:3]]
    del views
    gc.collect()
    assert block.in_use                      # three consumers hold theirs
    del consumed[:2]
    assert block.in_use
    del consumed
    gc.collect()
    assert not block.in_use
    _views, block = range_views(samples(), [0] * 5, [1] * 5)
    del _views                               # never exported: released when collected
    assert not block.in_use


def test_block_dropped_first_frees_on_last_view():
    views, block = range_views(samples(), [1] * 5, [2] * 5)
    del block
    assert [np.from_dlpack(v).tolist() for v in views] == [[1], [2], [3], [4], [5]]


def test_dali_takes_the_views():
    pytest.importorskip("nvidia.dali")
    from nvidia.dali.tensors import TensorListCPU

    views, block = range_views(samples(), [2] * 5, [6] * 5)
    tl = TensorListCPU.from_dlpack_list(views, "", contiguous=False)
    del views
    assert [np.array(tl[i]).tolist() for i in range(5)] == \
        [list(range(i + 2, i + 6)) for i in range(5)]
    assert block.in_use
    del tl
    gc.collect()
    assert not block.in_use


@pytest.mark.parametrize("starts, ends, match", [
    ([0, 0, 0, 0, 0], [21, 1, 1, 1, 1], "range 0:21 of array 0 is outside its 20 bytes"),
    ([5, 0, 0, 0, 0], [4, 1, 1, 1, 1], "range 5:4 of array 0"),
    ([0] * 4, [1] * 4, "5 arrays but 4 starts"),
])
def test_bad_ranges(starts, ends, match):
    with pytest.raises(ValueError, match=match):
        range_views(samples(), starts, ends)
    with pytest.raises(ValueError, match=match):
        pack_ranges(samples(), starts, ends, np.zeros((5, 30), np.uint8), np.zeros(5, np.int32))


@pytest.mark.parametrize("item, match", [
    (np.zeros(3, np.int32), "array 2 is not a C-contiguous 1-D uint8 array"),
    (np.zeros((2, 2), np.uint8), "array 2 is not a C-contiguous 1-D uint8 array"),
    (np.zeros(8, np.uint8)[::2], "array 2 is not a C-contiguous"),
    (b"abc", "item 2 is a bytes, not a NumPy array"),
])
def test_bad_arrays(item, match):
    arrays = samples()
    arrays[2] = item
    with pytest.raises(ValueError, match=match):
        range_views(arrays, [0] * 5, [1] * 5)
    with pytest.raises(ValueError, match=match):
        pack_ranges(arrays, [0] * 5, [1] * 5, np.zeros((5, 4), np.uint8), np.zeros(5, np.int32))


def test_pack_ranges():
    out = np.full((5, 12), 0xEE, np.uint8)
    lengths = np.full(5, -7, np.int32)
    pack_ranges(samples(), [0, 3, -1, 8, 20], [10, 4, -1, 20, 20], out, lengths)
    assert lengths.tolist() == [10, 1, 0, 12, 0]
    for i, (a, b) in enumerate([(0, 10), (3, 4), (0, 0), (8, 20), (20, 20)]):
        assert out[i, :lengths[i]].tolist() == samples()[i][a:b].tolist()
        assert (out[i, lengths[i]:] == 0xEE).all()    # padding left as it was
    assert pack_ranges([], [], [], np.zeros((0, 1), np.uint8), np.zeros(0, np.int32)) is None


@pytest.mark.parametrize("out, lengths, match", [
    (np.zeros((5, 9), np.uint8), np.zeros(5, np.int32), "does not fit a row of 9 bytes"),
    (np.zeros((4, 12), np.uint8), np.zeros(5, np.int32), "out must be .* of 5 rows"),
    (np.zeros((5, 12), np.int16), np.zeros(5, np.int32), "out must be"),
    (np.zeros((5, 12), np.uint8)[:, ::2], np.zeros(5, np.int32), "out must be"),
    (np.zeros((5, 12), np.uint8), np.zeros(5, np.int64), "lengths must be"),
    (np.zeros((5, 12), np.uint8), np.zeros(4, np.int32), "lengths must be"),
])
def test_pack_ranges_bad_outputs(out, lengths, match):
    with pytest.raises(ValueError, match=match):
        pack_ranges(samples(), [0] * 5, [10] * 5, out, lengths)


def test_pack_ranges_refuses_read_only_output():
    out = np.zeros((5, 12), np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        pack_ranges(samples(), [0] * 5, [1] * 5, out, np.zeros(5, np.int32))


@pytest.mark.parametrize("array", [np.arange(24, dtype=np.uint8).reshape(4, 6),
                                   np.arange(5, dtype=np.int32).reshape(5, 1),
                                   np.arange(7, dtype=np.uint8), np.zeros((0, 3), np.uint8)])
def test_array_view_is_the_whole_array(array):
    view, block = array_view(array)
    assert len(view) == array.nbytes and block.arrays[0] is array
    got = np.from_dlpack(view)
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)
    assert block.in_use
    del got
    gc.collect()
    assert not block.in_use


@pytest.mark.parametrize("array", [np.zeros(3, np.int64), np.zeros((2, 2, 2), np.uint8),
                                   np.zeros((4, 6), np.uint8)[:, ::2]])
def test_array_view_refuses(array):
    with pytest.raises(ValueError, match="array_view: takes a C-contiguous uint8 or int32"):
        array_view(array)


def test_dali_takes_a_whole_batch():
    pytest.importorskip("nvidia.dali")
    from nvidia.dali.tensors import TensorListCPU

    rows = np.arange(12, dtype=np.uint8).reshape(3, 4)
    view, block = array_view(rows)
    tl = TensorListCPU(view.__dlpack__(), "")
    assert [np.array(tl[i]).tolist() for i in range(3)] == rows.tolist()
    del tl
    gc.collect()
    assert not block.in_use
