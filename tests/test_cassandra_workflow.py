"""The cassandra-dali-plugin workflow end to end against the real node:
`fastread cassandra ingest` of a class tree (labels as fn.readers.file
numbers them, resumable), `fastread cassandra ids` (from the metadata
table, and from the plugin's .rows pickle through the restricted
unpickler), readers.cassandra in a DALI pipeline (its outputs, reader_meta,
checkpoints), ImageLoader-style GPU delivery through the mock CUDA
driver and, on a real GPU (`bash bench/gpu.sh cassandra`), Reader(device=
"gpu") and ImageLoader(cassandra=, device="cuda") against their host
outputs, and 2 torchrun ranks (gloo) reading exact shards."""
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import fastread
from fastread.cassandra import CassandraSource, load_plugin_rows, read_id_file

KS = "fr_flow"


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fastread.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def ingested(cassandra_server, class_tree, tmp_path_factory):
    """A 3-class tree of 150 files (some empty) ingested as fr_flow.*_train,
    its ids listed to a file: (tree root, {relpath: bytes}, ids file)."""
    root, _ = class_tree("cassandra-flow", [50, 60, 40], seed=38, max_size=30000)
    work = tmp_path_factory.mktemp("cassandra-flow")
    env = dict(os.environ, FASTREAD_CASSANDRA_USERNAME=cassandra_server.username,
               FASTREAD_CASSANDRA_PASSWORD=cassandra_server.password)
    base = ["--keyspace", KS, "--split", "train", "--port", str(cassandra_server.port)]
    journal = str(work / "train.ingest")
    r = cli("cassandra", "ingest", root, *base, "--journal", journal, "--quiet", env=env)
    assert r.returncode == 0, r.stderr
    assert "150 files inserted, 0 already there" in r.stdout
    # Resumable: a second run finds every file in the journal.
    r = cli("cassandra", "ingest", root, *base, "--journal", journal, "--quiet", env=env)
    assert r.returncode == 0 and "0 files inserted, 150 already there" in r.stdout, r.stderr
    ids_path = str(work / "train.ids")
    r = cli("cassandra", "ids", "-o", ids_path, *base, env=env)
    assert r.returncode == 0 and "150 ids" in r.stdout, r.stderr
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, root)] = f.read()
    journal_ids = {}
    with open(journal) as f:
        for line in f:
            u, rel = line.split()
            journal_ids[uuid.UUID(u)] = rel
    return root, files, ids_path, journal_ids


def test_ingest_labels_match_fn_readers_file(cassandra_server, ingested):
    root, files, ids_path, journal_ids = ingested
    paths, labels = fastread.scan(root)
    want_label = {os.path.relpath(p, root): int(lab) for p, lab in zip(paths, labels)}
    table, id_labels = read_id_file(ids_path)
    assert len(table) == 150 and id_labels is not None
    src = CassandraSource(f"{KS}.data_train", table, hosts=cassandra_server.host,
                          port=cassandra_server.port, username="cassandra",
                          password="cassandra")
    with fastread.Reader(source=src, batch_size=32) as r:
        k = 0
        for arrays, labs in r:
            for a, lab in zip(arrays, labs):
                rel = journal_ids[uuid.UUID(bytes=table[k].tobytes())]
                assert bytes(a) == files[rel]
                assert lab == want_label[rel] == id_labels[k]
                k += 1
    assert k == 150
    meta = cassandra_server.session().execute(
        f"SELECT or_label, label FROM {KS}.metadata_train").all()
    classes = {m.or_label: m.label for m in meta}
    assert classes == {"c0": 0, "c1": 1, "c2": 2}  # sorted class folders, as fn.readers.file


def test_plugin_rows_pickle(tmp_path, ingested):
    _, _, ids_path, _ = ingested
    table, _ = read_id_file(ids_path)
    rows = {"row_keys": [uuid.UUID(bytes=t.tobytes()) for t in table],
            "config": {"table": f"{KS}.metadata_train", "id_col": "id"}, "split": None}
    path = tmp_path / "train.rows"
    path.write_bytes(pickle.dumps(rows))
    got = load_plugin_rows(path)
    assert got["ids"].tobytes() == table.tobytes() and got["config"]["id_col"] == "id"
    r = cli("cassandra", "ids", "--from-rows", str(path), "-o", str(tmp_path / "x.ids"))
    assert r.returncode == 0, r.stderr
    assert read_id_file(tmp_path / "x.ids")[0].tobytes() == table.tobytes()

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    bad = tmp_path / "evil.rows"
    bad.write_bytes(pickle.dumps({"row_keys": [Evil()]}))
    with pytest.raises(ValueError, match="refused global"):
        load_plugin_rows(bad)


def dali_or_skip():
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        pytest.skip("DALI is not installed")


def test_dali_reader_outputs_and_checkpoint(cassandra_server, ingested):
    dali_or_skip()
    from nvidia.dali import pipeline_def
    from fastread.dali import readers
    root, files, ids_path, journal_ids = ingested
    table, id_labels = read_id_file(ids_path)
    uuids = [str(uuid.UUID(bytes=t.tobytes())) for t in table]

    @pipeline_def(batch_size=16, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return readers.cassandra(name="Reader", table=f"{KS}.data_train",
                                 source_uuids=uuids, cassandra_ips=[cassandra_server.host],
                                 cassandra_port=cassandra_server.port, username="cassandra",
                                 password="cassandra", shuffle_every_epoch=True, seed=4,
                                 prefetch_buffers=2, io_threads=1, ooo=True, slow_start=4)

    p = pipe()
    p.build()
    assert p.reader_meta("Reader")["epoch_size"] == 150
    seen = {}
    for _ in range(10):  # one epoch is ceil(150 / 16) = 10 iterations
        data, label = p.run()
        for i in range(len(data)):
            blob = np.array(data.at(i)).tobytes()
            lab = np.array(label.at(i))
            assert lab.shape == (1,) and lab.dtype == np.int32
            seen.setdefault(blob, int(lab[0]))
    want = {files[rel]: None for rel in journal_ids.values()}
    assert set(seen) <= set(want) and len(seen) >= 140  # the last batch rolls over


def test_fastread_bench_reads_the_table(cassandra_server, ingested, tmp_path):
    """`fastread bench cassandra://HOST:PORT/KS.data_SPLIT` (the family
    cassandra, src/fastread/bench/families/cassandra.py): its ids listed
    from the metadata table, one epoch of every row in the fastread Reader
    and the Python driver's modes, the byte counts the rows'."""
    _, files, _, _ = ingested
    out = tmp_path / "bench.json"
    env = dict(os.environ, FASTREAD_CASSANDRA_USERNAME=cassandra_server.username,
               FASTREAD_CASSANDRA_PASSWORD=cassandra_server.password)
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/{KS}.data_train"
    r = cli("bench", url, "--no-progress", "--device", "cpu", "--modes",
            "cassandra-reader,cassandra-python", "--batchsize", "10", "--repeat", "1",
            "--warmup-runs", "0", "--json", str(out), env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    doc = json.loads(out.read_text())
    ran = {x["mode"]: x for x in doc["results"]}
    assert set(ran) == {"cassandra-reader", "cassandra-python"}, doc["skipped"]
    assert doc["dataset"]["files"] == len(files)
    for name, x in ran.items():
        assert x["samples"] == len(files), name
        assert x["bytes"] == sum(len(d) for d in files.values()), name
        assert x["img_per_s"] > 0


GPU_CHILD = """
import ctypes, sys, fastread
from fastread.cassandra import CassandraSource, read_id_file
table, _ = read_id_file(sys.argv[1])
src = CassandraSource("{table}", table, hosts="127.0.0.1", port={port},
                      username="cassandra", password="cassandra")
host = [bytes(a) for arrays, _ in fastread.Reader(source=src, batch_size=40) for a in arrays]
n = 0
with fastread.Reader(source=src, batch_size=40, device="gpu", device_id=0) as r:
    for arrays, labels in r:
        for a in arrays:
            cai = a.__cuda_array_interface__
            got = ctypes.string_at(cai["data"][0], a.nbytes) if a.nbytes else b""
            assert got == host[n], n
            n += 1
assert n == 150
print("ok", n)
"""


def test_gpu_delivery_with_the_mock_driver(cassandra_server, ingested, mock_cuda_dir):
    _, _, ids_path, _ = ingested
    code = GPU_CHILD.format(table=f"{KS}.data_train", port=cassandra_server.port)
    path = os.pathsep.join(p for p in (mock_cuda_dir, os.environ.get("LD_LIBRARY_PATH")) if p)
    r = subprocess.run([sys.executable, "-c", code, ids_path], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, LD_LIBRARY_PATH=path))
    assert r.returncode == 0 and "ok 150" in r.stdout, r.stdout + r.stderr


DDP_CHILD = textwrap.dedent('''
    import json, os, sys, uuid
    import torch.distributed as dist
    import fastread
    from fastread.cassandra import CassandraSource, read_id_file
    ids_path, port, out_dir = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    table, _ = read_id_file(ids_path)
    src = CassandraSource("TABLE", table, hosts="127.0.0.1", port=int(port),
                          username="cassandra", password="cassandra")
    got = []
    with fastread.Reader(source=src, batch_size=16, shard_id=rank, num_shards=world,
                         random_shuffle=True, seed=2) as r:
        for arrays, labels in r:
            got.extend(a.tobytes().hex()[:40] + ":" + str(len(a)) for a in arrays)
    dist.barrier()
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()
''')


def test_torchrun_two_ranks_read_exact_shards(cassandra_server, ingested, tmp_path):
    pytest.importorskip("torch.distributed")
    from test_elastic import torchrun
    _, files, ids_path, _ = ingested
    script = tmp_path / "child.py"
    script.write_text(DDP_CHILD.replace("TABLE", f"{KS}.data_train"))
    out = tmp_path / "out"
    out.mkdir()
    torchrun(str(script), [ids_path, str(cassandra_server.port), str(out)], 1, 2, tmp_path,
             "cassandra")
    shards = [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]
    want = sorted(d.hex()[:40] + ":" + str(len(d)) for d in files.values())
    assert sorted(shards[0] + shards[1]) == want  # every row once: no overlap, no padding
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def gpu_or_skip():
    from fastread import _core
    if not _core.gpu_probe(0)[0]:
        pytest.skip("needs a CUDA GPU (device 0)")


def test_gpu_delivery_on_a_real_gpu(cassandra_server, ingested):
    """Reader(device="gpu") and ImageLoader(cassandra=, device="cuda",
    decode=False): every row's bytes in GPU memory equal the host reader's,
    in order (the empty rows too), labels alike."""
    torch = pytest.importorskip("torch")
    gpu_or_skip()
    from fastread.torch import ImageLoader
    _, _, ids_path, _ = ingested
    ids, _ = read_id_file(ids_path)
    src = CassandraSource(f"{KS}.data_train", ids, hosts=cassandra_server.host,
                          port=cassandra_server.port, username="cassandra",
                          password="cassandra")
    host = [(bytes(a), int(lab)) for arrays, labels in fastread.Reader(source=src, batch_size=40)
            for a, lab in zip(arrays, labels)]
    assert len(host) == 150
    got = []
    with fastread.Reader(source=src, batch_size=40, device="gpu", device_id=0) as r:
        for arrays, labels in r:
            labels = torch.as_tensor(labels).cpu().tolist()
            for a, lab in zip(arrays, labels):
                assert "data" in a.__cuda_array_interface__
                blob = torch.as_tensor(a, device="cuda:0").cpu().numpy().tobytes() \
                    if a.nbytes else b""
                got.append((blob, int(lab)))
    assert got == host
    loader = ImageLoader(cassandra=src, batch_size=40, device="cuda", device_id=0,
                         decode=False)
    got = []
    for images, labels in loader:
        assert labels.device.type == "cuda" and labels.dtype == torch.int64
        for t, lab in zip(images, labels.cpu().tolist()):
            assert t.device.type == "cuda" and t.dtype == torch.uint8
            got.append((t.cpu().numpy().tobytes(), lab))
    assert got == host


def ingest_jpegs(cassandra_server, tmp_path, split):
    from fastread.cassandra_tools import ingest, list_ids
    from fastread.datasets import make_imagenet_like
    root = str(tmp_path / "jpegs")
    make_imagenet_like(root, classes=2, per_class=12, mean_kb=2, width=48, height=40,
                       progress=False)
    session = cassandra_server.session()
    ingest(session, root, KS, split, journal=str(tmp_path / f"{split}.ingest"),
           progress=False)
    ids, labels = list_ids(session, KS, split)
    src = CassandraSource(f"{KS}.data_{split}", ids, hosts=cassandra_server.host,
                          port=cassandra_server.port, username="cassandra",
                          password="cassandra")
    return root, src, labels


def test_image_loader_decodes_rows_on_the_gpu(cassandra_server, tmp_path):
    """ImageLoader(cassandra=, device="cuda"): the rows' JPEGs decoded by
    DALI's mixed decoder into the same (N, 3, 32, 32) batches as on the CPU,
    labels in order; pixels within the decoders' rounding (nvJPEG against
    libjpeg-turbo: a few levels of 255 at most, measured in the message)."""
    pytest.importorskip("torch")
    dali_or_skip()
    gpu_or_skip()
    from fastread.torch import ImageLoader
    _, src, labels = ingest_jpegs(cassandra_server, tmp_path, "imggpu")
    cpu = [(x.clone(), y.clone())
           for x, y in ImageLoader(cassandra=src, batch_size=8, size=32, num_threads=1)]
    got = []
    worst = 0.0
    loader = ImageLoader(cassandra=src, batch_size=8, size=32, num_threads=2, device="cuda",
                         device_id=0)
    for (images, labs), (want, want_labs) in zip(loader, cpu):
        assert images.device.type == "cuda" and tuple(images.shape) == (8, 3, 32, 32)
        assert labs.cpu().tolist() == want_labs.tolist()
        got.extend(labs.cpu().tolist())
        worst = max(worst, float((images.cpu() - want).abs().mean()))
    assert got == labels
    # Normalized units (std ~0.225 of [0, 1]): 0.1 is about 6 levels of 255.
    assert worst < 0.1, f"GPU and CPU decodes differ by {worst:.4f} on average"


def test_image_loader_decodes_rows(cassandra_server, tmp_path):
    pytest.importorskip("torch")
    dali_or_skip()
    from fastread.torch import ImageLoader
    root, src, labels = ingest_jpegs(cassandra_server, tmp_path, "img")
    loader = ImageLoader(cassandra=src, batch_size=8, size=32, num_threads=1)
    got = []
    for images, labs in loader:
        assert tuple(images.shape) == (8, 3, 32, 32)
        got.extend(labs.tolist())
    assert got == labels  # in order, the rows' labels
    with pytest.raises(ValueError, match="not several"):
        ImageLoader(root, cassandra=src)
