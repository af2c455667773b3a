"""The Python layer's GPU path, end to end, on machines without a GPU.

A child interpreter runs with LD_LIBRARY_PATH pointing at the mock CUDA
driver and cuFile (csrc/tests/mock, compiled here), whose "device memory"
is host memory: device output of every engine, the cufile engine with host
and device output, packed images through cufile, and DeviceArray's
``__cuda_array_interface__`` are checked byte for byte. The real thing runs
in tests/test_gpu.py on the GPU machine.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import fastread

HERE = os.path.dirname(os.path.abspath(__file__))
MOCK_SRC = os.path.join(HERE, "..", "csrc", "tests", "mock", "mock_cuda.c")


@pytest.fixture(scope="module")
def mock_dir(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not os.path.exists(MOCK_SRC):
        pytest.skip("needs a C compiler and the checkout's csrc/tests/mock")
    d = tmp_path_factory.mktemp("mockcuda")
    for soname in ("libcuda.so.1", "libcufile.so.0"):
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(d / soname), MOCK_SRC,
                        "-lpthread"], check=True)
    return str(d)


def run_child(mock_dir, body, **env):
    code = textwrap.dedent(body)
    e = dict(os.environ, LD_LIBRARY_PATH=mock_dir, **env)
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
assert fastread.engines()["cufile"] is True
""")
    assert "compatibility mode" in out


def test_device_output_of_every_engine(mock_dir, edge_tree):
    root, content = edge_tree
    run_child(mock_dir, PRELUDE + f"""
content = {{p: open(p, "rb").read() for p in fastread.scan({root!r})[0]}}
for engine in ("io_uring", "psync", "cufile"):
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
