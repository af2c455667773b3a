"""The Python layer's GPU path, end to end, on machines without a GPU.

A child interpreter runs with LD_LIBRARY_PATH pointing at the mock CUDA
driver and cuFile (csrc/tests/mock, compiled here), whose "device memory"
is host memory: device output of every engine, the cufile engine with host
and device output, packed images through cufile, and DeviceArray's
``__cuda_array_interface__`` are checked byte for byte. The real thing runs
in tests/test_gpu.py on the GPU machine.
"""
import os
import subprocess
import sys
import textwrap

import pytest

import fastread

@pytest.fixture(scope="module")
def mock_dir(mock_cuda_dir):
    return mock_cuda_dir


def run_child(mock_dir, body, **env):
    code = textwrap.dedent(body)
    # The mock first; what the environment had stays behind it (a carried
    # liburing, for one).
    path = os.pathsep.join(p for p in (mock_dir, os.environ.get("LD_LIBRARY_PATH")) if p)
    e = dict(os.environ, LD_LIBRARY_PATH=path, **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


PRELUDE = """
import ctypes, os, numpy as np, fastread
from fastread import _core

def device_bytes(a):
    cai = a.__cuda_array_interface__
    assert cai["typestr"] == "|u1" and cai["shape"] == (a.nbytes,) and cai["version"] == 3
    return ctypes.string_at(cai["data"][0], a.nbytes) if a.nbytes else b""

def check_image_on_gpu(path, engine):
    # Reader(image=path, device="gpu") must deliver psync's bytes; returns them.
    img = fastread.PackedImage(path)
    want = img.read(range(len(img)), engine="psync")
    with fastread.Reader(image=path, batch_size=5, device="gpu", engine=engine) as r:
        n = 0
        for arrays, labels in r:
            for a in arrays:
                assert device_bytes(a) == bytes(want[n]), (engine, n)
                n += 1
        assert n == len(img)
    return img, want
"""


def test_engines_report_cufile_in_compat_mode(mock_dir):
    out = run_child(mock_dir, PRELUDE + """
ok, why = _core.probe("cufile")
print(ok, why)
assert fastread.engines()["cufile"].files is True
""")
    assert "compatibility mode" in out


# One case per host engine, so the engine-skip hook (conftest) skips io_uring
# where it is not built, naming it, instead of the loop failing on it (issue
# 39: the GPU machine's build without liburing failed here). cufile is a case
# of its own: it exists only under the mock driver, in the child, so the hook
# (which asks this process) must not see it.
@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_device_output_of_every_engine(mock_dir, edge_tree, engine):
    check_device_output(mock_dir, edge_tree, engine)


def test_device_output_of_cufile(mock_dir, edge_tree):
    check_device_output(mock_dir, edge_tree, "cufile")


def check_device_output(mock_dir, edge_tree, engine):
    root, content = edge_tree
    run_child(mock_dir, PRELUDE + f"""
content = {{p: open(p, "rb").read() for p in fastread.scan({root!r})[0]}}
for engine in ({engine!r},):
    for o_direct in (False, True):
        with fastread.Reader({root!r}, batch_size=4, device="gpu", engine=engine,
                             o_direct=o_direct, workers=2) as r:
            seen = 0  # unshuffled: samples come in scan order
            for arrays, labels in r:
                for a in arrays:
                    assert isinstance(a, fastread.DeviceArray)
                    path = r.paths[seen]
                    assert device_bytes(a) == content[path], (engine, o_direct, path)
                    seen += 1
            assert seen == len(content)
        # Host output of the GPU engine: read into the GPU, copied back once.
        if engine == "cufile":
            got = fastread.read_files(list(content), engine="cufile", o_direct=o_direct)
            assert [bytes(a) for a in got] == list(content.values())
""")


@pytest.fixture(scope="module")
def packed(edge_tree, disk_tmp):
    out = os.path.join(disk_tmp, "mock-gpu.img")
    fastread.pack(edge_tree[0], out)
    return out


def test_cufile_packed_image(mock_dir, packed):
    run_child(mock_dir, PRELUDE + f"""
img, want = check_image_on_gpu({packed!r}, "cufile")
for o_direct in (False, True):
    got = img.read(range(len(img)), engine="cufile", o_direct=o_direct)
    assert [bytes(a) for a in got] == [bytes(a) for a in want]
""")


def test_gpu_options_are_checked(mock_dir):
    run_child(mock_dir, PRELUDE + """
import pytest

import fastread
from fastread.engine import options
assert options("psync")["device_id"] == -1          # no GPU unless asked
o = options("psync", device_output=True)
assert o["device_id"] == 0 and o["pin_memory"] is True
assert options("cufile")["device_id"] == 0 and options("cufile")["pin_memory"] is False
with pytest.raises(ValueError, match="device_id"):
    options("psync", device_id="0")
try:
    import sys
    fastread.Reader(files=[sys.executable], batch_size=1, device="gpu", device_id=3,
                    engine="psync")
except OSError as e:
    assert "no CUDA device 3" in str(e), e
else:
    raise AssertionError("device 3 should not exist")
""")


def test_xnvme_ranges_to_gpu(mock_dir, packed):
    """xnvme-gds --mem gpu: the xnvme range engine into the pinned arena,
    then one upload per batch."""
    if "xnvme" not in fastread._core.engine_names():
        pytest.skip("xNVMe engines not built here")
    run_child(mock_dir, PRELUDE + f"""
check_image_on_gpu({packed!r}, "xnvme")
""")


def test_dlpack_export_keeps_its_batch_without_python(mock_dir, edge_tree):
    # DALI's from_dlpack_list (what readers.file(device="gpu") feeds) frees
    # samples on its own threads: each capsule holds its batch natively and
    # the batch goes back to the pool only after every capsule's deleter ran,
    # whether a consumer called it or the capsule was never consumed.
    root, content = edge_tree
    run_child(mock_dir, PRELUDE + f"""
import pytest

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
class DLManagedTensor(ctypes.Structure):
    pass
DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

def managed(capsule):
    return ctypes.cast(api.PyCapsule_GetPointer(capsule, b"dltensor"),
                       ctypes.POINTER(DLManagedTensor)).contents

def consume(capsule):  # what a consumer does: take it, rename it, delete later
    m = managed(capsule)
    api.PyCapsule_SetName(capsule, b"used_dltensor")
    return m

paths = fastread.scan({root!r})[0]
content = {{p: open(p, "rb").read() for p in paths}}
rd = _core.NativeReader(paths, "psync", device_id=0, pin_memory=True, device_output=True,
                        prefetch=1, workers=1)
rd.submit(np.arange(len(paths)))
batch = rd.next()
arrays = batch.device_arrays(0)
assert arrays[0].__dlpack_device__() == (2, 0)
caps = [a.__dlpack__(stream=7) for a in arrays]
for a, cap, path in zip(arrays, caps, paths):
    t = managed(cap).dl_tensor
    assert (t.device.device_type, t.device.device_id, t.ndim) == (2, 0, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)
    assert t.shape[0] == a.nbytes == len(content[path]) and not t.strides
    assert t.data == a.ptr and t.byte_offset == 0
    if a.nbytes:
        assert ctypes.string_at(t.data, a.nbytes) == content[path]
big = next(a for a in arrays if a.nbytes >= 8)
t = managed(big.view(0, (2,), "<f4", 4).__dlpack__()).dl_tensor
assert (t.dtype.code, t.dtype.bits, t.shape[0]) == (2, 32, 2)
with pytest.raises(BufferError):
    big.__dlpack__(dl_device=(1, 0))
with pytest.raises(BufferError):
    big.__dlpack__(copy=True)
with pytest.raises(BufferError):
    big.view(0, (2,), ">f4", 4).__dlpack__()

assert rd.pool_batches() == 1
taken = [consume(c) for c in caps[::2]]
del arrays, big
batch.release()  # the Python side lets go: the capsules still hold the batch
assert rd.pool_idle_device_bytes() == 0
for m in taken:
    m.deleter(ctypes.pointer(m))
assert rd.pool_idle_device_bytes() == 0
del caps, cap, a  # the rest were never consumed: their capsules' destructors let go
assert rd.pool_idle_device_bytes() > 0
with pytest.raises(ValueError, match="released"):
    batch.device_arrays(0)
rd.close()
""")


def test_cufile_reads_on_the_host_where_cufile_refuses_the_files(mock_dir, edge_tree, packed):
    # As on VMs whose disk GDS cannot place: cuFile refuses every file. The
    # engine falls back to pread into the pinned arena and one upload, unless
    # engine_args="compat=off", which fails those samples with EIO.
    root, content = edge_tree
    run_child(mock_dir, PRELUDE + f"""
import pytest
content = {{p: open(p, "rb").read() for p in fastread.scan({root!r})[0]}}
with fastread.Reader({root!r}, batch_size=7, device="gpu", engine="cufile") as r:
    seen = 0
    for arrays, labels in r:
        for a in arrays:
            assert device_bytes(a) == content[r.paths[seen]], r.paths[seen]
            seen += 1
    assert seen == len(content)
got = fastread.read_files(list(content), engine="cufile", o_direct=True)
assert [bytes(a) for a in got] == list(content.values())
check_image_on_gpu({packed!r}, "cufile")
with pytest.raises(fastread.ReadError) as e:
    fastread.read_files(list(content)[:2], engine="cufile", engine_args="compat=off")
assert e.value.errno == 5  # EIO, naming the file
""", MOCK_CUFILE_REFUSE_FILES="/")
