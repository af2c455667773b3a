"""GPU delivery (run on a CUDA machine; skipped with the reason elsewhere).

On the GPU machine: `cd tests && python3 -m pytest -q test_gpu.py`.
"""
import os

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed")
cupy = pytest.importorskip("cupy", reason="cupy is not installed")


def _cuda_devices():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        return str(e)


_n = _cuda_devices()
pytestmark = pytest.mark.skipif(not isinstance(_n, int) or _n < 1,
                                reason=f"no CUDA device here: {_n}")

from nvidia.dali import fn, pipeline_def  # noqa: E402

from fastread.dali import readers  # noqa: E402


@pytest.fixture(scope="module")
def tree(class_tree):
    return class_tree("gpu-tree", [9] * 3, seed=11, max_size=None,
                      sizes=[0, 1, 4097, 100_000, 3 << 20], file_name="{j}.jpg")[0]


def run(pipe_fn, batches):
    p = pipe_fn()
    p.build()
    out = []
    for _ in range(batches):
        data, labels = p.run()
        data = data.as_cpu()
        labels = labels.as_cpu()
        out.append([(bytes(np.array(data[i])), int(np.array(labels[i])[0]))
                    for i in range(len(data))])
    return out


ENGINES = ["io_uring", "psync", "cufile"]


@pytest.mark.parametrize("engine", ENGINES)
def test_gpu_output_equals_dali_gpu(tree, engine):
    @pipeline_def(batch_size=5, num_threads=2, device_id=0)
    def ref():
        # DALI's reader cannot mmap the empty file in the tree.
        data, labels = fn.readers.file(file_root=tree, dont_use_mmap=True)
        return data.gpu(), labels.gpu()

    @pipeline_def(batch_size=5, num_threads=2, device_id=0)
    def ours():
        return readers.file(file_root=tree, engine=engine, device="gpu")

    assert run(ours, 5) == run(ref, 5)


def test_mixed_decoder_on_fastread_input(disk_tmp):
    from fastread.datasets import make_imagenet_like
    root = os.path.join(disk_tmp, "gpu-jpegs")
    make_imagenet_like(root, classes=2, per_class=6, seed=2, mean_kb=8, width=96, height=72,
                       workers=1, progress=False)

    def decoded(reader):
        @pipeline_def(batch_size=4, num_threads=2, device_id=0)
        def p():
            data, labels = reader(root)
            return fn.decoders.image(data, device="mixed"), labels
        return [[np.array(img) for img in out[0].as_cpu()] for out in
                (lambda pp: [pp.build()] and [pp.run() for _ in range(3)])(p())]

    want = decoded(lambda r: fn.readers.file(file_root=r))
    # In a pipeline with a device the arenas are pinned: DALI's uploads for
    # the mixed decoder read them (no_copy) or its own copies of them.
    for no_copy in (False, True):
        got = decoded(lambda r: readers.file(file_root=r, no_copy=no_copy))
        for wb, gb in zip(want, got):
            for w, g in zip(wb, gb):
                assert np.array_equal(w, g)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("o_direct", [False, True])
def test_bytes_equal_for_every_engine_and_output_device(tree, engine, device, o_direct):
    import fastread
    paths, _ = fastread.scan(tree)
    want = [open(p, "rb").read() for p in paths]
    with fastread.Reader(tree, batch_size=4, engine=engine, device=device, device_id=0,
                         o_direct=o_direct, workers=2) as r:
        got = []
        for _ in range(2):  # a second epoch reuses arenas, handles, device buffers
            for arrays, _labels in r:
                got += [cupy.asarray(a).get().tobytes() if device == "gpu" else a.tobytes()
                        for a in arrays]
            assert got == want
            got = []
        mem = r.memory()
        assert mem["batches"] <= r.workers + 2 + 1


def test_cufile_reports_its_mode():
    from fastread import _core
    ok, why = _core.probe("cufile")
    assert ok, why
    assert "compatibility mode" in why or "GPUDirect Storage" in why


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_image_to_gpu(tree, disk_tmp, engine):
    import fastread
    img_path = os.path.join(disk_tmp, "gpu-tree.img")
    if not os.path.exists(img_path):
        fastread.pack(tree, img_path)
    img = fastread.PackedImage(img_path)
    want = [bytes(a) for a in img.read(range(len(img)), engine="psync")]

    @pipeline_def(batch_size=5, num_threads=2, device_id=0)
    def ours():
        return readers.image(image=img_path, engine=engine, device="gpu", o_direct=True)

    got = [b for batch in run(ours, 3) for b, _ in batch]
    assert got == want[:15]


@pytest.mark.parametrize("engine", ENGINES)
def test_numpy_gpu_output_equals_dali_numpy(disk_tmp, engine):
    root = os.path.join(disk_tmp, "gpu-npy")
    if not os.path.isdir(root):
        rng = np.random.default_rng(3)
        for c in range(2):
            os.makedirs(os.path.join(root, f"c{c}"))
            for j in range(6):
                a = rng.standard_normal((3, 5 + j, 7)).astype(np.float32)
                np.save(os.path.join(root, f"c{c}", f"{j}.npy"),
                        np.asfortranarray(a) if j == 4 else a)

    def arrays(reader):
        @pipeline_def(batch_size=4, num_threads=2, device_id=0)
        def p():
            return reader()
        pp = p()
        pp.build()
        return [np.array(t) for _ in range(3) for t in pp.run()[0].as_cpu()]

    # DALI's CPU numpy reader finds and decodes the same arrays as its GPU
    # (GDS) reader, which cannot run where cuFile registers no file (our VM).
    want = arrays(lambda: fn.readers.numpy(file_root=root, device="cpu").gpu())
    got = arrays(lambda: readers.numpy(file_root=root, device="gpu", engine=engine))
    assert len(got) == len(want) == 12
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and np.array_equal(w, g)
    # The native operator (C-ordered files only: the Fortran one would send
    # the reader back to the external source; host engines only: cufile
    # keeps the external source): each array copied to the GPU from its
    # file's data part, headers left behind.
    if engine == "cufile":
        return
    c_files = [f"c{c}/{j}.npy" for c in range(2) for j in range(6) if j != 4]
    want = arrays(lambda: fn.readers.numpy(file_root=root, files=c_files, device="cpu").gpu())
    got = arrays(lambda: readers.numpy(file_root=root, files=c_files, device="gpu",
                                       engine=engine, native=True))
    assert len(got) == len(want) == 12
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape and np.array_equal(w, g)
