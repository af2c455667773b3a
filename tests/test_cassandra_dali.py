"""fn.fastread.readers.cassandra, the native DALI operator behind
fastread.dali.readers.cassandra (dali_plugin/fastread_cassandra.cc), against
the real Apache Cassandra 5 node: exact bytes and labels (0-byte and
multi-MB blobs), the same order as the external-source reader, exact
shards, checkpoint resume, a missing id named, labels given or as blobs,
a wrong password that fails naming the user but never the secret (nor
does pipe.serialize() hold the right one), and, on a GPU (`bash bench/gpu.sh
cassandra` runs them there), device="gpu" outputs equal to the CPU ones
byte for byte, for the operator and the external source."""
import uuid

import numpy as np
import os

import pytest

N = 300
KS = "fr_dali"


def plugin_or_skip():
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        pytest.skip("DALI is not installed")
    from fastread.dali import _plugin
    if not _plugin.load():
        pytest.skip(f"fastread's DALI plugin is not loaded: {_plugin.reason()}")


@pytest.fixture(scope="module")
def table(cassandra_server):
    """fr_dali.rows: N rows (ids, labels, bytes): rows 0 and 7 empty, row 3
    of 3 MiB, the rest 0-30 KB; a tag blob column of each row's first bytes."""
    plugin_or_skip()
    s = cassandra_server.session()
    s.execute(f"CREATE KEYSPACE IF NOT EXISTS {KS} WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute(f"CREATE TABLE IF NOT EXISTS {KS}.rows (id uuid PRIMARY KEY, label int, "
              "data blob, tag blob)")
    rng = np.random.default_rng(380)
    ids = [uuid.UUID(bytes=rng.bytes(16), version=4) for _ in range(N)]
    sizes = [int(x) for x in rng.integers(1, 30000, N)]
    sizes[0] = sizes[7] = 0
    sizes[3] = 3 << 20
    data = [rng.bytes(n) for n in sizes]
    labels = rng.integers(-3, 1000, N).astype(np.int32)
    ins = s.prepare(f"INSERT INTO {KS}.rows (id, label, data, tag) VALUES (?, ?, ?, ?)")
    for u, lab, d in zip(ids, labels, data):
        s.execute(ins, (u, int(lab), d, d[:5]))
    return [str(u) for u in ids], labels, data


def gpu_or_skip():
    from fastread import _core
    if not _core.gpu_probe(0)[0]:
        pytest.skip("needs a CUDA GPU (device 0)")


def build(server, uuids, *, batch=25, password=None, checkpoint=None, **kw):
    from nvidia.dali import pipeline_def

    from fastread.dali import readers
    kw.setdefault("native", True)
    device_id = 0 if kw.get("device") == "gpu" else None

    @pipeline_def(batch_size=batch, num_threads=1, device_id=device_id, prefetch_queue_depth=1,
                  enable_checkpointing=True)
    def pipe():
        return readers.cassandra(name="Reader", table=f"{KS}.rows", source_uuids=uuids,
                                 cassandra_ips=[server.host], cassandra_port=server.port,
                                 username=server.username,
                                 password=password or server.password, **kw)
    p = pipe(checkpoint=checkpoint) if checkpoint is not None else pipe()
    p.build()
    return p


def run(p, iterations, *, gpu=False):
    out = []
    for _ in range(iterations):
        data, label = p.run()
        infos = [data[i].source_info() for i in range(len(data))]
        if gpu:  # device="gpu": both outputs in GPU memory, copied back to compare
            from nvidia.dali.backend import TensorListGPU
            assert isinstance(data, TensorListGPU) and isinstance(label, TensorListGPU)
            data, label = data.as_cpu(), label.as_cpu()
        for i in range(len(data)):
            out.append((np.array(data[i]).tobytes(), np.array(label[i]), infos[i]))
    return out


def test_bytes_and_labels_exact_in_order(cassandra_server, table):
    uuids, labels, data = table
    p = build(cassandra_server, uuids, batch=25)
    assert "fastread__readers__Cassandra" in p.serialize().decode("latin-1")
    meta = p.reader_meta("Reader")
    assert meta["epoch_size"] == N and meta["number_of_shards"] == 1
    got = run(p, N // 25 + 2)  # one epoch and two batches of the next: epochs roll
    for k, (blob, lab, info) in enumerate(got):
        i = k % N
        assert blob == data[i], i
        assert lab.dtype == np.int32 and lab.shape == (1,) and lab[0] == labels[i]
        assert info == f"{KS}.rows[{uuids[i]}]"


def test_same_order_as_the_external_source_and_exact_shards(cassandra_server, table):
    uuids, _, data = table
    by_bytes = {}
    for i, d in enumerate(data):
        by_bytes.setdefault(d, i)
    shards = []
    for shard in range(3):  # 100 ids a shard: 5 batches of 20 are one epoch of it
        kw = dict(batch=20, shuffle_every_epoch=True, seed=9, shard_id=shard, num_shards=3)
        native = [b for b, _, _ in run(build(cassandra_server, uuids, **kw), 5)]
        ext = [b for b, _, _ in run(build(cassandra_server, uuids, native=False, **kw), 5)]
        assert native == ext  # fastread's sampling, whichever reader runs
        shards.append(native)
    flat = [d for s in shards for d in s]
    assert len(flat) == N
    # Every row exactly once over the shards (the two empty rows are equal bytes).
    assert sorted(flat) == sorted(data)
    assert flat != data  # shuffled


def test_checkpoint_resumes_where_it_was(cassandra_server, table):
    uuids, _, _ = table
    kw = dict(batch=16, shuffle_every_epoch=True, seed=3)
    p = build(cassandra_server, uuids, **kw)
    run(p, 4)
    cpt = p.checkpoint()
    assert b"password=" not in (cpt if isinstance(cpt, bytes) else cpt.encode())
    want = run(p, 20)  # crosses the epoch's end (300 / 16)
    del p
    q = build(cassandra_server, uuids, checkpoint=cpt, **kw)
    got = run(q, 20)
    assert [b for b, _, _ in got] == [b for b, _, _ in want]


def test_labels_given_and_as_blobs(cassandra_server, table):
    uuids, _, data = table
    given = np.arange(N, dtype=np.int32) * 7
    p = build(cassandra_server, uuids, batch=30, label_type="none", labels=given)
    for k, (blob, lab, _) in enumerate(run(p, 10)):
        assert blob == data[k] and lab[0] == given[k]
    p = build(cassandra_server, uuids, batch=30, label_type="blob", label_col="tag",
              epoch_end="roll")
    for k, (blob, lab, _) in enumerate(run(p, 10)):
        assert blob == data[k] and lab.dtype == np.uint8 and lab.tobytes() == data[k][:5]


def test_missing_id_is_named(cassandra_server, table):
    uuids, _, _ = table
    ghost = str(uuid.UUID(int=38))
    p = build(cassandra_server, uuids[:9] + [ghost], batch=10)
    with pytest.raises(RuntimeError) as e:
        p.run()
    assert f"{KS}.rows[{ghost}]" in str(e.value)


def test_wrong_password_fails_without_the_secret(cassandra_server, table):
    uuids, _, _ = table
    secret = "not-the-password-Zk3"
    with pytest.raises(RuntimeError) as e:
        build(cassandra_server, uuids[:20], batch=10, password=secret)
    msg = str(e.value)
    assert "authentication failed" in msg and cassandra_server.username in msg
    assert secret not in msg
    # The right password reaches the operator by reference only (the
    # fixture's password is "cassandra", which names the user and the
    # table too: look for the engine's key).
    p = build(cassandra_server, uuids[:20], batch=10)
    text = p.serialize()
    assert b"password=" not in text and b"fastread_engine_args_ref=" in text


def test_native_true_says_why_not(cassandra_server, table):
    uuids, _, _ = table
    with pytest.raises(ValueError, match="epoch_end='stop'"):
        build(cassandra_server, uuids[:20], batch=10, epoch_end="stop")


def test_reader_reports_requests_in_flight(cassandra_server, table):
    import fastread
    from fastread.cassandra import CassandraSource
    uuids, _, data = table
    src = CassandraSource(f"{KS}.rows", uuids, hosts=cassandra_server.host,
                          port=cassandra_server.port, username=cassandra_server.username,
                          password=cassandra_server.password)
    with fastread.Reader(source=src, batch_size=50) as r:
        # half the CPUs, 4 to 16: the threads bound the requests in flight
        cpus = len(os.sched_getaffinity(0))
        assert r.workers == CassandraSource.default_workers == max(4, min(16, cpus // 2))
        got = [bytes(a) for arrays, _ in r for a in arrays]
        stats = r.stats()
    assert got == data
    # Each worker had up to its batch in flight, never more.
    assert 1 <= stats["cql_inflight_max"] <= CassandraSource.default_workers * 50
    assert stats["cql_requests"] == N


GPU_CASES = [dict(batch=25), dict(batch=20, shuffle_every_epoch=True, seed=9, shard_id=1,
                                  num_shards=3),
             dict(batch=32, label_type="none", labels=list(range(0, 3 * N, 3)))]


@pytest.mark.parametrize("native", [True, False], ids=["operator", "external-source"])
@pytest.mark.parametrize("kw", GPU_CASES, ids=["plain", "shuffled-shard", "labels-given"])
def test_gpu_outputs_equal_the_cpu_ones(cassandra_server, table, native, kw):
    """device="gpu": the same samples, bytes, labels and source_info as the
    CPU outputs, batch for batch, over two epochs and a half (the batches'
    memory reused behind the copies, the 3 MiB row and the empty ones in
    them), with both outputs in GPU memory."""
    gpu_or_skip()
    uuids, _, _ = table
    kw = dict(kw)
    if "labels" in kw:
        kw["labels"] = np.asarray(kw["labels"], dtype=np.int32)
    iterations = (5 * N) // (2 * kw["batch"]) + 1
    cpu = build(cassandra_server, uuids, native=native, **kw)
    want = run(cpu, iterations)
    del cpu
    gpu = build(cassandra_server, uuids, native=native, device="gpu", **kw)
    if native:
        assert "fastread__readers__Cassandra" in gpu.serialize().decode("latin-1")
    got = run(gpu, iterations, gpu=True)
    assert len(got) == len(want)
    for k, ((gb, gl, gi), (wb, wl, wi)) in enumerate(zip(got, want)):
        assert gb == wb, k
        assert gl.dtype == wl.dtype == np.int32 and gl.shape == wl.shape == (1,), k
        assert gl[0] == wl[0], k
        assert gi == wi, k
