"""What the native DALI operator's tests share (test_dali_plugin*.py,
test_webdataset_native.py): the skip when DALI or fastread's plugin is
absent, trees of class directories, pipelines built around a reader, their
batches as bytes and labels, and the GPU checks.

Importing this module skips the importing test module, with the reason, where
DALI is not installed or the plugin does not load (pytest's skip exceptions
propagate through the import), so each test module imports it first.
"""
import os

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")
from nvidia.dali import fn, pipeline_def  # noqa: E402

import fastread  # noqa: E402
from fastread import _core  # noqa: E402
from fastread.dali import _plugin  # noqa: E402

if not _plugin.load():
    pytest.skip(f"fastread's DALI plugin is not loaded: {_plugin.reason()}",
                allow_module_level=True)

OP = _plugin.OP_NAME

# 3 classes of 7, 8 and 10 files (25 samples: shards of unequal size).
COUNTS = (7, 8, 10)


def has_gpu():
    """Whether CUDA device 0 is usable (the driver loads and it answers)."""
    return bool(_core.gpu_probe(0)[0])


needs_gpu = pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU (device 0)")


def case_id(kw):
    """A parametrize id for a dict of reader arguments: `k=v,k=v`, or "plain"."""
    return ",".join(f"{k}={v}" for k, v in kw.items()) or "plain"


def write_class_tree(root, *, seed, max_size):
    """COUNTS files of random bytes under root/class0.., named 000.jpg..,
    of 1 to max_size - 1 bytes each (so every sample is recognisable), drawn
    from `seed`. The root, as a string."""
    from conftest import write_class_tree as write
    return write(root, COUNTS, seed=seed, min_size=1, max_size=max_size, class_name="class{c}")[0]


def packed_class_tree(base, name, *, seed, max_size):
    """write_class_tree at base/name, packed into base/name.img:
    (directory, PackedImage)."""
    root = write_class_tree(os.path.join(base, name), seed=seed, max_size=max_size)
    return root, fastread.pack(root, os.path.join(base, f"{name}.img"), progress=False)


def make_pipe(graph, batch_size, *, device_id=None, **pipe_kw):
    """A built pipeline (2 threads) whose outputs are graph()'s: a node, or a
    tuple/list of them."""
    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=device_id, **pipe_kw)
    def pipe():
        out = graph()
        return tuple(out) if isinstance(out, (list, tuple)) else out
    p = pipe()
    p.build()
    return p


def make_gpu_pipe(graph, batch_size, **pipe_kw):
    """make_pipe on GPU 0."""
    return make_pipe(graph, batch_size, device_id=0, **pipe_kw)


def batches(pipe, iterations):
    """`iterations` runs of a (data, labels) pipeline: [(sample bytes, labels
    as ints)] a batch, GPU outputs copied to the host first."""
    out = []
    for _ in range(iterations):
        data, labels = pipe.run()
        if hasattr(data, "as_cpu"):
            data, labels = data.as_cpu(), labels.as_cpu()
        out.append(([np.array(data[i]).tobytes() for i in range(len(data))],
                    [int(np.array(labels[i])[0]) for i in range(len(labels))]))
    return out


def file_bytes(paths):
    """Each file's bytes, in order: what the readers must deliver."""
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def assert_two_epochs_are_the_files(got, paths, labels):
    """`got` (batches) opens with two whole epochs of `paths`' bytes in order,
    the first with `labels`."""
    want = file_bytes(paths)
    flat = [b for data, _ in got for b in data]
    n = len(paths)
    assert flat[:n] == want and flat[n:2 * n] == want
    assert [x for _, lab in got for x in lab][:n] == list(labels)


def assert_long_run_cycles_the_files(pipe, paths, iterations=200):
    """`iterations` batches of an unshuffled pipeline over `paths` are the
    files' bytes round and round: many more batches than the reader's pool
    and the copy ring's slots, so an arena read into again before its copy
    (or DALI's use) finished would show as wrong bytes."""
    want = file_bytes(paths)
    seen = [b for data, _ in batches(pipe, iterations) for b in data]
    assert seen == [want[i % len(want)] for i in range(len(seen))]


def assert_checkpoint_resumes(graph, make, *, before=5, after=8):
    """A pipeline of graph() with checkpointing (make(graph, batch 4, ...)),
    checkpointed after `before` batches: one built from the checkpoint yields
    the `after` batches the original yields next."""
    p = make(graph, 4, enable_checkpointing=True)
    batches(p, before)
    checkpoint = p.checkpoint()
    want = batches(p, after)
    q = make(graph, 4, enable_checkpointing=True, checkpoint=checkpoint)
    assert batches(q, after) == want


def assert_missing_file_fails_naming_it(tree, copy_root, make, **op_kw):
    """The operator over a copy of `tree` (at copy_root), one worker reading
    one batch ahead: a file removed after the first batch fails a later
    pipe.run() with an error naming it."""
    import shutil

    from fastread.index import scan
    shutil.copytree(tree, copy_root)
    paths, labels = scan(str(copy_root))
    victim = paths[9]
    p = make(lambda: fn.fastread.readers.file(files=paths, labels=labels.tolist(),
                                              prefetch_queue_depth=1, workers=1, **op_kw), 4)
    p.run()  # the first batches are read ahead: the missing file is further on
    os.remove(victim)
    with pytest.raises(RuntimeError, match=victim):
        for _ in range(10):
            p.run()


def op_name(node):
    """The schema name of the operator that produced `node`."""
    return node.source._op.schema.Name()


def image_ranges(img):
    """The operator's arguments that read PackedImage `img` by its ranges."""
    return dict(image=img.path, range_offsets=img.offsets.tolist(),
                range_lengths=img.lengths.tolist(), files=list(img.names),
                labels=img.labels.tolist())


# Reader arguments the GPU parity tests run (each at several batch sizes).
GPU_CASES = [
    dict(),
    dict(pad_last_batch=True),
    dict(num_shards=3, shard_id=2),
    dict(num_shards=3, shard_id=1, pad_last_batch=True),
    dict(num_shards=4, shard_id=1, stick_to_shard=True),
]


def gpu_operator(**kw):
    """A graph: fn.fastread.readers.file(device="gpu", name="R", **kw),
    checking that both outputs are on the GPU."""
    def graph():
        data, lab = fn.fastread.readers.file(name="R", device="gpu", **kw)
        assert data.device == "gpu" and lab.device == "gpu"
        return data, lab
    return graph


def dali_gpu(root, **kw):
    """A graph: fn.readers.file over `root`, its outputs moved with .gpu()."""
    def graph():
        data, lab = fn.readers.file(file_root=root, name="R", **kw)
        return data.gpu(), lab.gpu()
    return graph


def _varint(buf, i):
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _put_varint(value):
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(buf):
    """A protobuf message's fields as [(key, bytes)], all length-delimited
    (every field of DALI's checkpoint message is: names, texts, messages)."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        assert key & 7 == 2, f"unexpected protobuf wire type {key & 7}"
        n, i = _varint(buf, i)
        out.append((key, bytes(buf[i:i + n])))
        i += n
    return out


def _message(fields):
    return b"".join(_put_varint(k) + _put_varint(len(v)) + v for k, v in fields)


def rewrite_op_checkpoints(checkpoint, change):
    """`checkpoint` (pipe.checkpoint(): DALI's serialized protobuf) with
    every fastread operator's checkpoint text replaced by change(text): to
    make checkpoints of an older form, or damaged ones."""
    data = checkpoint if isinstance(checkpoint, bytes) else checkpoint.encode("latin-1")
    top = []
    for key, value in _fields(data):
        if key >> 3 == 1:  # one operator's (name, checkpoint text)
            inner = [(k, change(v.decode()).encode() if k >> 3 == 2 and v.startswith(b"fastread")
                      else v) for k, v in _fields(value)]
            value = _message(inner)
        top.append((key, value))
    out = _message(top)
    return out if isinstance(checkpoint, bytes) else out.decode("latin-1")
