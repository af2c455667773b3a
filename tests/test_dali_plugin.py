"""The native DALI operator (fn.fastread.readers.file) against DALI's own
fn.readers.file, on CPU-only DALI: the same samples, labels, shards,
padding and epoch sizes; epochs that roll over; errors from pipe.run()
naming the path; and the loader's reasons when the plugin cannot load."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dali_helpers import (COUNTS, assert_missing_file_fails_naming_it, batches, case_id,
                          make_pipe, rewrite_op_checkpoints, write_class_tree)
from nvidia.dali import fn, pipeline_def  # noqa: E402 (dali_helpers skips without DALI)

from fastread.dali import _plugin  # noqa: E402
from fastread.index import scan  # noqa: E402


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """COUNTS files of 1 to 4999 bytes (no empty file here: DALI's reader
    fails to mmap one; test_empty_file covers ours), and a file that is not
    a sample."""
    root = write_class_tree(tmp_path_factory.mktemp("plugin_tree"), seed=7, max_size=5000)
    with open(os.path.join(root, "class2", "notes.txt"), "wb") as f:
        f.write(b"not a sample")
    return root


def native(tree, **kw):
    paths, labels = scan(tree)
    return fn.fastread.readers.file(files=paths, labels=labels.tolist(), name="R", **kw)


READER_CASES = [
    dict(),
    dict(pad_last_batch=True),
    dict(num_shards=3, shard_id=0),
    dict(num_shards=3, shard_id=2),
    dict(num_shards=3, shard_id=1, pad_last_batch=True),
    dict(num_shards=4, shard_id=3, stick_to_shard=True),
    dict(num_shards=4, shard_id=1, stick_to_shard=True, pad_last_batch=True),
    dict(num_shards=2, shard_id=1, prefetch_queue_depth=3),
]


@pytest.mark.parametrize("batch_size", [1, 4, 7])
@pytest.mark.parametrize("kw", READER_CASES, ids=case_id)
def test_parity_with_fn_readers_file(tree, kw, batch_size):
    ours = make_pipe(lambda: native(tree, **kw), batch_size)
    dalis = make_pipe(lambda: fn.readers.file(file_root=tree, name="R", **kw), batch_size)
    assert ours.reader_meta("R") == dalis.reader_meta("R")
    # Several epochs of every shard: epochs roll over, never StopIteration.
    iterations = 3 * (sum(COUNTS) // batch_size + 2)
    assert batches(ours, iterations) == batches(dalis, iterations)


def test_labels_and_bytes_are_the_files(tree):
    paths, labels = scan(tree)
    pipe = make_pipe(lambda: native(tree), len(paths))
    (data, labs), = batches(pipe, 1)
    assert labs == labels.tolist()
    assert data == [open(p, "rb").read() for p in paths]


def test_zero_copy_samples_stay_valid_behind_consumers(tree):
    # The operator hands DALI views of its batches' memory; a batch goes back
    # to the reader only when DALI drops it. A consumer inside the pipeline
    # (the views reach fn.cat, which copies them after the reader has gone on
    # reading ahead into recycled batches) must still see each file's bytes.
    paths, labels = scan(tree)
    want = [open(p, "rb").read() for p in paths]

    @pipeline_def(batch_size=4, num_threads=2, device_id=None, prefetch_queue_depth=3)
    def pipe():
        data, labs = fn.fastread.readers.file(files=paths, labels=labels.tolist(),
                                              prefetch_queue_depth=3, workers=2)
        return fn.cat(data, data), labs

    p = pipe()
    p.build()
    got = []
    for _ in range(3 * len(paths) // 4 + 1):
        data, _ = p.run()
        got += [np.array(data[i]).tobytes() for i in range(len(data))]
    expect = (want * 4)[:len(got)]
    assert got == [w + w for w in expect]


def test_dense_batches_are_the_files(tree):
    # dense=True (the default): every batch read is laid out back to back
    # and goes to DALI as one buffer, holding exactly fn.readers.file's bytes.
    paths, _ = scan(tree)
    pipe = make_pipe(lambda: native(tree), 8)
    dalis = make_pipe(lambda: fn.readers.file(file_root=tree, name="R"), 8)
    iterations = 2 * len(paths) // 8 + 1
    assert batches(pipe, iterations) == batches(dalis, iterations)


def test_dense_batches_reach_the_output_uncopied(tree):
    # The pipeline's output is the reader's own arena: the first sample at
    # its base (mmap'ed, page-aligned), the rest back to back. A copy by
    # DALI (MakeContiguous, as for dense=False) lands in DALI's own buffers.
    import mmap
    pipe = make_pipe(lambda: native(tree), 8)
    for _ in range(10):
        data, _ = pipe.run()
        ptrs = [data[i].data_ptr() for i in range(len(data))]
        sizes = [np.array(data[i]).size for i in range(len(data))]
        assert ptrs[0] % mmap.PAGESIZE == 0
        assert all(ptrs[i] + sizes[i] == ptrs[i + 1] for i in range(len(data) - 1))


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_dense_file_that_grows_between_epochs(tmp_path, engine):
    # The reader remembers sizes as hints; a file that grew since reads one
    # byte past its dense slot, onto the next file's first byte, and the
    # operator reads first bytes again. Every batch: the unchanged files
    # exactly, the grown one old or new.
    d = tmp_path / "c"
    d.mkdir()
    rng = np.random.default_rng(3)
    files = []
    for i in range(6):
        f = d / f"{i}.jpg"
        f.write_bytes(rng.integers(0, 256, 300 + 50 * i, dtype=np.uint8).tobytes())
        files.append(f)
    old = [f.read_bytes() for f in files]
    pipe = make_pipe(lambda: native(str(tmp_path), engine=engine, workers=1), 6)
    assert batches(pipe, 1)[0][0] == old
    # One append (write_bytes would truncate first: a reader reading ahead
    # could catch the file empty): it is the old file or the new one.
    with open(files[2], "ab") as f:
        f.write(b"grown" * 40)
    new = files[2].read_bytes()
    for data, _ in batches(pipe, 8):
        assert data[:2] == old[:2] and data[3:] == old[3:]
        assert data[2] in (old[2], new)
    assert batches(pipe, 1)[0][0] == old[:2] + [new] + old[3:]


@pytest.mark.parametrize("kw", [dict(dense=False), dict(o_direct=True)],
                         ids=["dense=False", "o_direct"])
def test_padded_batches_still_read_right(tree, kw):
    # Without dense layout (asked for, or O_DIRECT's aligned slots) samples
    # have gaps between them and go out one view each: same bytes.
    ours = make_pipe(lambda: native(tree, **kw), 6)
    dalis = make_pipe(lambda: fn.readers.file(file_root=tree, name="R"), 6)
    assert batches(ours, 10) == batches(dalis, 10)


def test_dense_outputs_kept_by_the_caller_stay_valid(tree):
    # Outputs held past many iterations keep their batch out of the pool
    # (the reader reads ahead into other batches, fresh ones unmarked at
    # first): every held batch still holds its files' bytes at the end.
    paths, _ = scan(tree)
    want = [open(p, "rb").read() for p in paths]
    pipe = make_pipe(lambda: native(tree), 5)
    held = [pipe.run()[0] for _ in range(30)]
    got = [np.array(d[i]).tobytes() for d in held for i in range(len(d))]
    assert got == (want * 7)[:len(got)]


def test_source_info_is_the_path(tree):
    paths, labels = scan(tree)
    pipe = make_pipe(lambda: native(tree), 5)
    data, _ = pipe.run()
    assert [data[i].source_info() for i in range(5)] == paths[:5]


def test_empty_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0.jpg").write_bytes(b"")
    (tmp_path / "a" / "1.jpg").write_bytes(b"x")
    pipe = make_pipe(lambda: native(str(tmp_path)), 2)
    assert batches(pipe, 2) == [([b"", b"x"], [0, 0])] * 2


def test_exec_dynamic(tree):
    ours = make_pipe(lambda: native(tree, num_shards=2, shard_id=1), 4, exec_dynamic=True)
    dalis = make_pipe(lambda: fn.readers.file(file_root=tree, num_shards=2, shard_id=1, name="R"),
                      4)
    assert batches(ours, 20) == batches(dalis, 20)


def test_shuffle_epochs_partition_the_data(tree):
    n = sum(COUNTS)
    seen = []
    for shard in range(3):
        pipe = make_pipe(lambda: native(tree, random_shuffle=True, seed=5, num_shards=3,
                                        shard_id=shard, pad_last_batch=True, stick_to_shard=True),
                         3)
        meta = pipe.reader_meta("R")
        per_shard = meta["epoch_size_padded"] // meta["number_of_shards"]
        steps = -(-per_shard // 3)
        epochs = [batches(pipe, steps) for _ in range(2)]
        seen.append([sorted(set(b for bs, _ in e for b in bs)) for e in epochs])
    paths, _ = scan(tree)
    every = sorted(set(open(p, "rb").read() for p in paths))
    for epoch in range(2):
        union = sorted(set().union(*(set(s[epoch]) for s in seen)))
        assert union == every
    # Two pipelines with one seed agree; epochs differ from each other.
    a = make_pipe(lambda: native(tree, random_shuffle=True, seed=5), 5)
    b = make_pipe(lambda: native(tree, random_shuffle=True, seed=5), 5)
    ea, eb = batches(a, 10), batches(b, 10)
    assert ea == eb
    assert ea[:5] != ea[5:]
    assert len(ea) * 5 == 2 * n


@pytest.mark.parametrize("kw", [dict(), dict(num_shards=3, shard_id=1),
                                dict(num_shards=2, shard_id=0, pad_last_batch=True),
                                dict(num_shards=2, shard_id=1, stick_to_shard=True)],
                         ids=case_id)
def test_shuffled_order_does_not_depend_on_the_path(tree, kw):
    # One seed, one order: the operator and the external source (fastread.Reader)
    # both shuffle with the core's fr_permutation, batch for batch over three
    # epochs, so whether the plugin loads does not change a seeded run.
    from fastread.dali import readers
    n = sum(COUNTS)
    steps = 3 * -(-n // 4)

    def run(native_flag):
        return batches(make_pipe(lambda: readers.file(file_root=tree, random_shuffle=True, seed=9,
                                                      native=native_flag, **kw), 4), steps)
    assert run(True) == run(False)


def test_missing_file_raises_with_its_path(tree, tmp_path):
    assert_missing_file_fails_naming_it(tree, tmp_path / "t", make_pipe)


CHECKPOINT_CASES = [dict(), dict(pad_last_batch=True, num_shards=3, shard_id=2),
                    dict(random_shuffle=True, seed=3, num_shards=2, shard_id=1),
                    dict(random_shuffle=True, stick_to_shard=True, num_shards=2, shard_id=0,
                         prefetch_queue_depth=3)]


@pytest.mark.parametrize("pipe_depth", [1, 3])
@pytest.mark.parametrize("kw", CHECKPOINT_CASES, ids=case_id)
def test_checkpoint_restores_the_stream(tree, kw, pipe_depth):
    # pipe.checkpoint() after k batches; a pipeline built from it yields what
    # the original yields after them (mid-epoch, at and past epoch ends).
    for k in (0, 2, 9):
        a = make_pipe(lambda: native(tree, **kw), 4, enable_checkpointing=True,
                      prefetch_queue_depth=pipe_depth)
        batches(a, k)
        cp = a.checkpoint()
        want = batches(a, 8)
        b = make_pipe(lambda: native(tree, **kw), 4, enable_checkpointing=True,
                      prefetch_queue_depth=pipe_depth, checkpoint=cp)
        assert batches(b, 8) == want, f"after {k} batches"


SAVED_WITH = dict(num_shards=2, shard_id=0, pad_last_batch=True)
# (restoring reader's arguments, batch size, the argument the refusal names)
OTHER_READERS = [
    (dict(num_shards=4, shard_id=0, pad_last_batch=True), 4, "num_shards"),
    (dict(num_shards=2, shard_id=1, pad_last_batch=True), 4, "shard_id"),
    (dict(SAVED_WITH, random_shuffle=True), 4, "random_shuffle"),
    (dict(num_shards=2, shard_id=0), 4, "pad_last_batch"),
    (dict(SAVED_WITH, stick_to_shard=True), 4, "stick_to_shard"),
    (SAVED_WITH, 3, "batch_size"),  # padding to whole batches: another epoch length
    (dict(SAVED_WITH, n=20), 4, "num_samples"),
]


@pytest.mark.parametrize("other,batch_size,differs", OTHER_READERS,
                         ids=[case[2] for case in OTHER_READERS])
def test_checkpoint_refuses_a_reader_of_other_arguments(tree, other, batch_size, differs):
    # The checkpoint's position fits all of these readers: only the
    # arguments it records tell that it would resume another stream.
    a = make_pipe(lambda: native(tree, **SAVED_WITH), 4, enable_checkpointing=True)
    batches(a, 2)
    cp = a.checkpoint()
    kw = dict(other)
    n = kw.pop("n", None)
    paths, labels = scan(tree)
    graph = (lambda: native(tree, **kw)) if n is None else (
        lambda: fn.fastread.readers.file(files=paths[:n], labels=labels[:n].tolist(), name="R",
                                         **kw))
    with pytest.raises(Exception, match=f"saved by a reader with {differs}=.*this reader has "
                                        f"{differs}="):
        make_pipe(graph, batch_size, enable_checkpointing=True, checkpoint=cp)


def test_checkpoint_ignores_arguments_that_do_not_change_the_stream(tree):
    # Without padding the batch size only cuts the same stream differently.
    a = make_pipe(lambda: native(tree, num_shards=2, shard_id=1), 4, enable_checkpointing=True)
    batches(a, 3)
    cp = a.checkpoint()
    flat = [x for data, _ in batches(a, 6) for x in data]
    b = make_pipe(lambda: native(tree, num_shards=2, shard_id=1), 3, enable_checkpointing=True,
                  checkpoint=cp)
    assert [x for data, _ in batches(b, 8) for x in data] == flat


def test_checkpoint_of_the_old_form_still_restores(tree):
    # Checkpoints saved before the arguments were recorded hold the position
    # only ("<tag> <epoch> <pos> <seed>"): taken as they are.
    kw = dict(random_shuffle=True, seed=4, num_shards=3, shard_id=1)
    a = make_pipe(lambda: native(tree, **kw), 4, enable_checkpointing=True)
    batches(a, 3)
    cp = a.checkpoint()
    want = batches(a, 5)
    old = rewrite_op_checkpoints(cp, lambda text: " ".join(text.split()[:4]))
    assert old != cp
    b = make_pipe(lambda: native(tree, **kw), 4, enable_checkpointing=True, checkpoint=old)
    assert batches(b, 5) == want
    damaged = rewrite_op_checkpoints(cp, lambda text: text + " shard_id=x")
    with pytest.raises(Exception, match="not a checkpoint of this reader .field 'shard_id=x'"):
        make_pipe(lambda: native(tree, **kw), 4, enable_checkpointing=True, checkpoint=damaged)


def test_checkpoint_through_readers_file(tree):
    from fastread.dali import readers

    def pipe(cp=None):
        @pipeline_def(batch_size=5, num_threads=2, device_id=None, enable_checkpointing=True)
        def p():
            return readers.file(file_root=tree, native=True, random_shuffle=True)
        pp = p(checkpoint=cp) if cp is not None else p()
        pp.build()
        return pp

    a = pipe()
    batches(a, 7)
    cp = a.checkpoint()
    assert batches(pipe(cp), 6) == batches(a, 6)


def test_bad_arguments_name_themselves(tree):
    paths, _ = scan(tree)
    with pytest.raises(Exception, match="no_such_argument"):
        make_pipe(lambda: fn.fastread.readers.file(files=paths, no_such_argument=1), 2)
    with pytest.raises(Exception, match="no-such-engine"):
        make_pipe(lambda: fn.fastread.readers.file(files=paths, engine="no-such-engine"), 2)
    with pytest.raises(Exception, match="3 labels for"):
        make_pipe(lambda: fn.fastread.readers.file(files=paths, labels=[1, 2, 3]), 2)
    with pytest.raises(Exception, match="files="):
        make_pipe(lambda: fn.fastread.readers.file(file_root=tree), 2)
    with pytest.raises(Exception, match="num_shards"):
        make_pipe(lambda: fn.fastread.readers.file(files=paths[:2], num_shards=3), 2)


def test_dali_iterator_with_reader_name(tree):
    pytorch = pytest.importorskip("nvidia.dali.plugin.pytorch", reason="DALI's torch plugin")
    torch = pytest.importorskip("torch")
    for policy in (pytorch.LastBatchPolicy.PARTIAL, pytorch.LastBatchPolicy.DROP):
        got = {}
        for which in ("native", "dali"):
            reader = ((lambda: native(tree, num_shards=2, shard_id=1)) if which == "native" else
                      (lambda: fn.readers.file(file_root=tree, num_shards=2, shard_id=1,
                                               name="R")))
            pipe = make_pipe(lambda: reader()[1:], 4)  # labels: a dense batch
            it = pytorch.DALIGenericIterator(pipe, ["label"], reader_name="R",
                                             last_batch_policy=policy, auto_reset=True)
            epochs = []
            for _ in range(2):
                epochs.append([b[0]["label"].reshape(-1).tolist() for b in it])
            got[which] = epochs
            assert isinstance(epochs[0][0], list) and torch is not None
        assert got["native"] == got["dali"]


# -- loading -------------------------------------------------------------------

def _load_in_subprocess(env_extra):
    code = textwrap.dedent("""
        from fastread.dali import _plugin
        print("LOADED", _plugin.load())
        print("REASON", _plugin.reason())
    """)
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr  # never a crash of the interpreter
    return r.stdout


def test_load_failure_reasons(tmp_path):
    missing = str(tmp_path / "nope" / "libfastread_dali.so")
    out = _load_in_subprocess({"FASTREAD_DALI_PLUGIN_PATH": missing})
    assert "LOADED False" in out and missing in out and "not built" in out

    junk = tmp_path / "junk" / "libfastread_dali.so"
    junk.parent.mkdir()
    junk.write_bytes(b"not a shared object")
    out = _load_in_subprocess({"FASTREAD_DALI_PLUGIN_PATH": str(junk)})
    assert "LOADED False" in out and "could not load" in out and str(junk) in out

    other = tmp_path / "other" / "libfastread_dali.so"
    other.parent.mkdir()
    shutil.copy(_plugin.library_path(), other)
    (other.parent / "fastread_dali.version").write_text("0.0.1\n")
    out = _load_in_subprocess({"FASTREAD_DALI_PLUGIN_PATH": str(other)})
    assert "LOADED False" in out and "built against DALI 0.0.1" in out

    out = _load_in_subprocess({"FASTREAD_DALI_PLUGIN": "0"})
    assert "LOADED False" in out and "FASTREAD_DALI_PLUGIN=0" in out


def test_require_raises_with_the_reason(tmp_path):
    code = textwrap.dedent("""
        from fastread.dali import _plugin
        try:
            _plugin.require()
        except RuntimeError as e:
            print("RAISED", e)
    """)
    env = dict(os.environ, FASTREAD_DALI_PLUGIN="0")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "RAISED" in r.stdout and "FASTREAD_DALI_PLUGIN=0" in r.stdout


def test_fastread_info_reports_the_plugin():
    # Every operator the library registers, with its backends.
    # (readers.cassandra, where built, comes first: "loaded: " is checked apart.)
    for env, want in (({}, "fn.fastread.readers.file (CPU, GPU, Mixed), "
                           "fn.fastread.readers.webdataset (CPU)"),
                      ({"FASTREAD_DALI_PLUGIN": "0"}, "unavailable: disabled by FASTREAD_DALI_PLUGIN=0")):
        r = subprocess.run([sys.executable, "-m", "fastread.cli", "info"], capture_output=True,
                           text=True, env=dict(os.environ, **env), timeout=300)
        assert r.returncode == 0, r.stderr
        line = [x for x in r.stdout.splitlines() if "DALI plugin" in x]
        assert len(line) == 1 and want in line[0], r.stdout
        assert ("loaded: fn.fastread." in line[0]) == (not env), r.stdout


PINNED_CHILD = """
import ctypes, gc, sys, numpy as np
from nvidia.dali import fn, pipeline_def
from fastread.dali import _plugin
from fastread.index import scan
assert _plugin.load(), _plugin.reason()
paths, labels = scan(sys.argv[1])

@pipeline_def(batch_size=4, num_threads=2, device_id=None)
def pipe():
    return tuple(fn.fastread.readers.file(files=paths, labels=labels.tolist(), pin_device=0))
p = pipe()
p.build()
seen = []
for _ in range(10):
    data, _ = p.run()
    seen += [np.array(data[i]).tobytes() for i in range(len(data))]
assert seen[:len(paths)] == [open(x, "rb").read() for x in paths]
if sys.argv[2] == "mock":
    live = ctypes.CDLL("libcuda.so.1").mock_cuda_live
    live.argtypes, live.restype = [ctypes.c_char_p], ctypes.c_long
    assert live(b"pins") > 0, "no buffer was page-locked"
    del p, data
    gc.collect()
    assert live(b"pins") == 0, live(b"pins")
print("ok")
"""


def test_pinned_buffers_through_the_driver(tree, mock_cuda_dir):
    # pin_device: the reader's buffers are page-locked through the CUDA
    # driver (here the mock, whose counters say what is pinned), the bytes
    # are the files', and nothing stays pinned once the pipeline is gone.
    path = os.pathsep.join(x for x in (mock_cuda_dir, os.environ.get("LD_LIBRARY_PATH")) if x)
    r = subprocess.run([sys.executable, "-c", PINNED_CHILD, tree, "mock"], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, LD_LIBRARY_PATH=path))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_pinned_buffers_without_a_driver(tree):
    # Where the driver cannot pin (none here): a warning naming the device,
    # pageable memory, the same bytes.
    from fastread import _core
    if _core.gpu_probe(0)[0]:
        pytest.skip("a CUDA driver and device 0 are present: the buffers are pinned")
    r = subprocess.run([sys.executable, "-c", PINNED_CHILD, tree, "none"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    assert "cannot page-lock its buffers on device 0" in r.stderr, r.stderr


def test_plugin_shares_dalis_cpp_runtime():
    # The plugin must use the libstdc++ that DALI runs with, never carry its
    # own: a toolchain whose -lstdc++ is a static archive (the GPU machine's)
    # copied iostreams into it, and checkpoint parsing and errors formatting
    # numbers crashed in that second copy (cmake/dali_plugin.cmake).
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    lib = _plugin.library_path()
    if not os.path.exists(lib):
        pytest.skip(f"no plugin built: {lib}")
    dynamic = subprocess.run([readelf, "-d", "-W", lib], capture_output=True, text=True,
                             check=True).stdout
    assert "[libstdc++.so.6]" in dynamic, f"{lib} does not link the shared libstdc++"
    symbols = subprocess.run([readelf, "--dyn-syms", "-W", lib], capture_output=True,
                             text=True, check=True).stdout
    own = [line for line in symbols.splitlines()
           if line.split()[-1:] and line.split()[-1].split("@")[0] == "_ZNSi10_M_extractIlEERSiRT_"
           and " UND " not in line]
    assert not own, f"{lib} carries its own copy of libstdc++'s iostreams: {own}"
