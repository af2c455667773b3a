"""The native DALI operator's GPU outputs (fn.fastread.readers.file(device="gpu")).

Everywhere: the operator is registered for the GPU backend, and
readers.file(device="gpu") builds it into a GPU pipeline's graph (or says why
it cannot). On a GPU (skipped without one; `bash bench/gpu.sh tests` runs
them): the outputs equal fn.readers.file's moved with .gpu(), batch for batch
across epoch rolls, shards and padding; dense and per-sample copies; long runs
whose arenas are reused behind the copies; checkpoints; a missing file's
error naming it. The copy ring itself (arenas recycled only after their
copy's event) is tested on the mock driver: dali_plugin/tests/test_upload_ring.c.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from dali_helpers import (COUNTS, GPU_CASES, OP, assert_checkpoint_resumes,
                          assert_long_run_cycles_the_files, assert_missing_file_fails_naming_it,
                          assert_two_epochs_are_the_files, batches, case_id, dali_gpu,
                          gpu_operator, has_gpu, make_gpu_pipe, needs_gpu, op_name,
                          write_class_tree)
from nvidia.dali import pipeline_def  # noqa: E402 (dali_helpers skips without DALI)

from fastread.dali import readers  # noqa: E402
from fastread.index import scan  # noqa: E402


@pytest.fixture(scope="module")
def tree(disk_tmp):
    # On a disk-backed file system: the o_direct case needs one.
    root = os.path.join(disk_tmp, "plugin_gpu_tree")
    if os.path.exists(root):
        shutil.rmtree(root)
    return write_class_tree(root, seed=11, max_size=70000)


# ---- everywhere (no GPU needed: graphs are defined, not built) -------------

def test_gpu_operator_is_registered():
    from nvidia.dali import backend
    assert OP in backend.RegisteredGPUOps()
    assert OP in backend.RegisteredCPUOps()


def test_readers_file_device_gpu_builds_the_gpu_operator(tree):
    seen = {}

    @pipeline_def(batch_size=4, num_threads=1, device_id=0)
    def pipe():
        data, labels = readers.file(file_root=tree, device="gpu", name="R")
        seen["auto"] = (data.device, labels.device, op_name(data))
        data, labels = readers.file(file_root=tree, device="gpu", native=True)
        seen["native"] = (data.device, labels.device, op_name(data))
        # Host output in a GPU pipeline: the CPU operator, page-locked.
        data, _ = readers.file(file_root=tree)
        seen["cpu"] = (data.device, op_name(data))
        return data, labels

    pipe()  # defined only: building needs a GPU
    assert seen["auto"] == ("gpu", "gpu", OP)
    assert seen["native"] == ("gpu", "gpu", OP)
    assert seen["cpu"] == ("cpu", OP)


@pytest.mark.skipif(not has_gpu(), reason="the external source opens its GPU reader at "
                    "definition: needs a CUDA GPU (device 0)")
def test_device_gpu_falls_back_where_the_operator_cannot_serve(tree):
    seen = {}

    @pipeline_def(batch_size=4, num_threads=1, device_id=0)
    def pipe():
        # Epochs that end for real are the external source's.
        data, _ = readers.file(file_root=tree, device="gpu", epoch_end="stop")
        seen["stop"] = op_name(data)
        data, _ = readers.file(file_root=tree, device="gpu", native=False)
        seen["native=False"] = op_name(data)
        return data

    p = pipe()
    assert seen["stop"] != OP and seen["native=False"] != OP
    assert len(p._fastread_readers) == 2  # both are external sources


@pytest.mark.parametrize("pipe_device,kw,match", [
    (None, {}, "without a device_id"),
    (0, {"device_id": 1}, "device_id=1 is not the pipeline's device"),
    (0, {"pin_memory": False}, "pin_memory=False"),
])
def test_native_true_device_gpu_refusals(tree, pipe_device, kw, match):
    @pipeline_def(batch_size=4, num_threads=1, device_id=pipe_device)
    def pipe():
        return readers.file(file_root=tree, device="gpu", native=True, **kw)

    with pytest.raises(ValueError, match=match):
        pipe()


def test_native_true_device_gpu_without_the_plugin_says_why(tree):
    code = textwrap.dedent(f"""
        from nvidia.dali import pipeline_def
        from fastread.dali import readers

        @pipeline_def(batch_size=4, num_threads=1, device_id=0)
        def pipe():
            return readers.file(file_root={tree!r}, device="gpu", native=True)
        try:
            pipe()
        except RuntimeError as e:
            print("RAISED", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, FASTREAD_DALI_PLUGIN="0"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "RAISED" in r.stdout and "FASTREAD_DALI_PLUGIN=0" in r.stdout, r.stdout


# ---- on a GPU ---------------------------------------------------------------

def gpu_native(tree, **kw):
    paths, labels = scan(tree)
    return gpu_operator(files=paths, labels=labels.tolist(), **kw)


@needs_gpu
@pytest.mark.parametrize("batch_size", [1, 4, 7])
@pytest.mark.parametrize("kw", GPU_CASES, ids=case_id)
def test_gpu_outputs_equal_dali_moved_to_the_gpu(tree, kw, batch_size):
    iters = 3 * (sum(COUNTS) // batch_size + 1)  # three epochs and their rolls
    want = batches(make_gpu_pipe(dali_gpu(tree, **kw), batch_size), iters)
    got = batches(make_gpu_pipe(gpu_native(tree, **kw), batch_size), iters)
    assert got == want


@needs_gpu
@pytest.mark.parametrize("op_kw", [dict(dense=False), dict(o_direct=True), dict(engine="psync"),
                                   dict(engine="io_uring")],
                         ids=["per-sample-copies", "o_direct", "psync", "io_uring"])
def test_every_layout_and_engine_gives_the_files(tree, op_kw):
    paths, labels = scan(tree)
    got = batches(make_gpu_pipe(gpu_native(tree, **op_kw), 5), 2 * len(paths) // 5)
    assert_two_epochs_are_the_files(got, paths, labels.tolist())


@needs_gpu
@pytest.mark.parametrize("exec_dynamic", [False, True])
def test_long_run_reuses_arenas_behind_the_copies(tree, exec_dynamic):
    p = make_gpu_pipe(gpu_native(tree, prefetch_queue_depth=3), 8, prefetch_queue_depth=3,
                      exec_dynamic=exec_dynamic)
    assert_long_run_cycles_the_files(p, scan(tree)[0])


@needs_gpu
def test_readers_file_gpu_through_the_operator(tree):
    p = make_gpu_pipe(lambda: readers.file(file_root=tree, device="gpu", name="R"), 6)
    assert p.reader_meta("R")["epoch_size"] == sum(COUNTS)
    paths, labels = scan(tree)
    got = batches(p, 5)
    assert [b for d, _ in got for b in d][:25] == [open(x, "rb").read() for x in paths]
    assert [x for _, lab in got for x in lab][:25] == labels.tolist()


@needs_gpu
def test_gpu_checkpoint_restores_the_stream(tree):
    assert_checkpoint_resumes(
        gpu_native(tree, random_shuffle=True, seed=3, num_shards=2, shard_id=1), make_gpu_pipe)


@needs_gpu
def test_missing_file_raises_with_its_path(tree, tmp_path):
    assert_missing_file_fails_naming_it(tree, tmp_path / "t", make_gpu_pipe, device="gpu")

