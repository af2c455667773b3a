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
def tree(disk_tmp):
    root = os.path.join(disk_tmp, "gpu-tree")
    rng = np.random.default_rng(11)
    for c in range(3):
        os.makedirs(os.path.join(root, f"c{c}"))
        for j in range(9):
            size = [0, 1, 4097, 100_000, 3 << 20][j % 5]
            with open(os.path.join(root, f"c{c}", f"{j}.jpg"), "wb") as f:
                f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return root


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


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
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
    got = decoded(lambda r: readers.file(file_root=r))
    for wb, gb in zip(want, got):
        for w, g in zip(wb, gb):
            assert np.array_equal(w, g)
