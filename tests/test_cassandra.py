"""fastread.cassandra against a real Apache Cassandra 5 node (the session's
`cassandra_server` fixture, authentication on): exact bytes and labels of
thousands of rows (0-byte and multi-MB blobs), missing ids, the token
function against the node's token(), wrong credentials, shards, resume,
added latency through a delay proxy, a dead node within the deadline and
the node killed and restarted mid-epoch, SIGINT, labels as blobs."""
import os
import threading
import time
import uuid

import numpy as np
import pytest

import fastread
from conftest import interruptible_child
from fastread import _core
from fastread.cassandra import CassandraSource, read_id_file, uuid_table, write_id_file

N_ROWS = 3000
BIG = 4 << 20


@pytest.fixture(scope="module")
def rows(cassandra_server):
    """Keyspace fr_test, table rows: N_ROWS rows (ids, labels, bytes),
    row 0 empty, rows 1 and 2 of 4 MiB, the rest 0-20 KB."""
    from cassandra.concurrent import execute_concurrent_with_args
    s = cassandra_server.session()
    s.execute("CREATE KEYSPACE IF NOT EXISTS fr_test WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS fr_test.rows (id uuid PRIMARY KEY, label int, "
              "data blob, tag blob)")
    rng = np.random.default_rng(38)
    ids = [uuid.UUID(bytes=rng.bytes(16), version=4) for _ in range(N_ROWS)]
    sizes = [0, BIG, BIG + 7] + list(rng.integers(0, 20000, N_ROWS - 3))
    data = [rng.bytes(int(n)) for n in sizes]
    labels = rng.integers(-5, 1000, N_ROWS).astype(np.int32)
    ins = s.prepare("INSERT INTO fr_test.rows (id, label, data, tag) VALUES (?, ?, ?, ?)")
    args = [(u, int(lab), d, d[:3]) for u, lab, d in zip(ids, labels, data)]
    for a in args[:3]:  # the driver calls a connection with MBs in flight overloaded
        s.execute(ins, a)
    res = execute_concurrent_with_args(s, ins, args[3:], concurrency=16,
                                       raise_on_first_error=True)
    assert all(ok for ok, _ in res)
    return ids, labels, data


def source(server, ids, **kw):
    kw.setdefault("username", server.username)
    kw.setdefault("password", server.password)
    return CassandraSource("fr_test.rows", ids, hosts=server.host, port=server.port, **kw)


def read_all(reader):
    out = []
    for arrays, labels in reader:
        out.extend(zip((bytes(a) for a in arrays), labels))
    return out


def test_every_row_exact_in_order(cassandra_server, rows):
    ids, labels, data = rows
    with fastread.Reader(source=source(cassandra_server, ids), batch_size=97) as r:
        assert r.engine == "cql"
        got = read_all(r)
        stats = r.stats()
    assert len(got) == N_ROWS
    assert [g[0] for g in got] == data
    assert np.array_equal(np.array([g[1] for g in got], np.int32), labels)
    assert stats["cql_requests"] == N_ROWS and stats["cql_bytes"] == sum(map(len, data))


def test_shuffled_epochs_and_exact_shards(cassandra_server, rows):
    ids, labels, data = rows
    by_label = {}
    seen = []
    for shard in range(2):
        with fastread.Reader(source=source(cassandra_server, ids), batch_size=128,
                             shard_id=shard, num_shards=2, random_shuffle=True, seed=7) as r:
            for arrays, labs in r:
                for a, lab in zip(arrays, labs):
                    seen.append(bytes(a))
                    by_label.setdefault(int(lab), set()).add(bytes(a))
    assert sorted(seen) == sorted(data)  # every row once over both shards: no overlap
    for i in range(0, N_ROWS, 101):
        assert data[i] in by_label[int(labels[i])]


def test_resume_mid_epoch(cassandra_server, rows):
    ids, _, data = rows
    src = source(cassandra_server, ids[:600])
    with fastread.Reader(source=src, batch_size=50, random_shuffle=True, seed=3) as r:
        full = read_all(r)
        r.set_epoch(0)
        it = iter(r)
        first = [bytes(a) for a in next(it)[0]] + [bytes(a) for a in next(it)[0]]
        state = r.state_dict()
    with fastread.Reader(source=src, batch_size=50, random_shuffle=True, seed=3) as r2:
        r2.load_state_dict(state)
        rest = [g[0] for g in read_all(r2)]
    assert first + rest == [g[0] for g in full]


def test_labels_as_blobs_and_given(cassandra_server, rows):
    ids, labels, data = rows
    src = source(cassandra_server, ids[:300], label_col="tag", label_type="blob")
    with fastread.Reader(source=src, batch_size=64) as r:
        got = [(bytes(a), bytes(t)) for arrays, tags in r for a, t in zip(arrays, tags)]
    assert got == [(d, d[:3]) for d in data[:300]]
    src = source(cassandra_server, ids[:100], label_type="none", labels=labels[:100] + 1)
    with fastread.Reader(source=src, batch_size=64) as r:
        assert np.array_equal(np.concatenate([lab for _, lab in r]), labels[:100] + 1)


def test_missing_id_names_it(cassandra_server, rows):
    ids, _, _ = rows
    ghost = uuid.uuid4()
    with fastread.Reader(source=source(cassandra_server, ids[:10] + [ghost]),
                         batch_size=11) as r:
        with pytest.raises(fastread.ReadError) as e:
            read_all(r)
    assert str(ghost) in str(e.value) and "not found" in str(e.value)
    assert e.value.errno == 2


def test_token_matches_the_node(cassandra_server, rows):
    ids, _, _ = rows
    s = cassandra_server.session()
    for u in ids[:50]:
        tok = s.execute("SELECT token(id) FROM fr_test.rows WHERE id = %s", (u,)).one()[0]
        assert _core.cql_token(u.bytes) == tok
    s.execute("CREATE TABLE IF NOT EXISTS fr_test.bykey (k bigint PRIMARY KEY, v blob)")
    for k in (0, 1, -1, 2 ** 40 + 3, -(2 ** 62)):
        s.execute("INSERT INTO fr_test.bykey (k, v) VALUES (%s, 0x00)", (k,))
        tok = s.execute("SELECT token(k) FROM fr_test.bykey WHERE k = %s", (k,)).one()[0]
        assert _core.cql_token(k.to_bytes(8, "big", signed=True)) == tok


def test_wrong_password_is_clear_and_secret_free(cassandra_server, rows):
    ids, _, _ = rows
    secret = "not-the-password-Xq7"
    src = source(cassandra_server, ids[:5], password=secret)
    assert secret not in repr(src)
    with pytest.raises(PermissionError) as e:
        fastread.Reader(source=src, batch_size=5)
    msg = str(e.value)
    assert "authentication failed" in msg and cassandra_server.username in msg
    assert secret not in msg
    opts = fastread.engine.EngineOptions(engine_args=src.engine_args())
    assert secret not in repr(opts)
    with pytest.raises(PermissionError, match="asks for authentication"):
        fastread.Reader(source=source(cassandra_server, ids[:5], username=None, password=None),
                        batch_size=5)


def test_unknown_table_and_bad_options(cassandra_server, rows):
    ids, _, _ = rows
    with pytest.raises(ValueError, match="nosuch"):
        fastread.Reader(source=CassandraSource(
            "fr_test.nosuch", ids[:3], hosts=cassandra_server.host, port=cassandra_server.port,
            username="cassandra", password="cassandra"), batch_size=3)
    with pytest.raises(ValueError, match="label_type"):
        source(cassandra_server, ids, label_type="float")
    with pytest.raises(ValueError, match="KEYSPACE.TABLE"):
        CassandraSource("rows", ids, hosts="127.0.0.1")
    with pytest.raises(ValueError, match="not a uuid"):
        uuid_table(["nope"])


def test_dead_node_fails_within_deadline(cassandra_server, rows):
    ids, _, _ = rows
    import socket
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConnectionRefusedError, match=f"127.0.0.1:{port}"):
        fastread.Reader(source=CassandraSource("fr_test.rows", ids[:4], hosts="127.0.0.1",
                                               port=port), batch_size=4)
    assert time.monotonic() - t0 < 10


def test_delay_proxy_hides_latency(cassandra_server, rows):
    from cassandra_proxy import DelayProxy
    ids, labels, data = rows
    with DelayProxy((cassandra_server.host, cassandra_server.port), delay_ms=10) as p:
        src = CassandraSource("fr_test.rows", ids[3:1203], hosts="127.0.0.1", port=p.port,
                              username="cassandra", password="cassandra")
        with fastread.Reader(source=src, batch_size=200) as r:
            t0 = time.monotonic()
            got = read_all(r)
            took = time.monotonic() - t0
    assert [g[0] for g in got] == data[3:1203]
    # 1200 rows one at a time would wait >= 1200 x 20 ms = 24 s; in flight
    # together, a handful of round trips (a bound far from flaky: 12 s).
    assert took < 12, took


def test_request_timeout_names_the_host(cassandra_server, rows):
    from cassandra_proxy import DelayProxy
    ids, _, _ = rows
    with DelayProxy((cassandra_server.host, cassandra_server.port), delay_ms=0) as p:
        src = CassandraSource("fr_test.rows", ids[3:8], hosts="127.0.0.1", port=p.port,
                              username="cassandra", password="cassandra", timeout_ms=100,
                              deadline_ms=1500, retries=2)
        with fastread.Reader(source=src, batch_size=5) as r:
            p.delay = 0.4  # answers now come after the request timeout
            t0 = time.monotonic()
            with pytest.raises(fastread.ReadError) as e:
                read_all(r)
            took = time.monotonic() - t0
    assert took < 6
    assert e.value.errno == 110  # ETIMEDOUT


def test_killed_and_restarted_mid_epoch(cassandra_server, rows):
    """A reader with the default deadline (60 s) rides over the node being
    killed and restarted mid-epoch, every row exact; one with a short
    deadline, started while the node is down, fails within it naming it."""
    ids, labels, data = rows
    src = source(cassandra_server, ids[3:2003])
    got, errors = [], []
    started = threading.Event()

    def consume():
        try:
            with fastread.Reader(source=src, batch_size=50, prefetch=1) as r:
                for arrays, labs in r:
                    got.extend(bytes(a) for a in arrays)
                    started.set()
                    time.sleep(0.05)
        except Exception as e:  # reported below
            errors.append(e)
            started.set()

    t = threading.Thread(target=consume)
    t.start()
    assert started.wait(60)
    down_reader = fastread.Reader(source=source(cassandra_server, ids[3:10], deadline_ms=1500),
                                  batch_size=7)
    try:
        cassandra_server.kill()
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            read_all(down_reader)
        assert time.monotonic() - t0 < 20  # deadline 1.5 s; a loaded 2-core machine
        assert f"{cassandra_server.host}:{cassandra_server.port}" in str(e.value) or \
            e.value.errno in (111, 113, 110)
    finally:
        down_reader.close()
        cassandra_server.restart()
    t.join(180)
    assert not t.is_alive() and not errors, errors
    assert got == data[3:2003]


def test_sigint_interrupts_a_stalled_read(cassandra_server, rows, tmp_path):
    """A child's reader whose node stops answering (the delay proxy holds
    every answer 60 s) after it connected: SIGINT reaches Python at once."""
    import signal
    import subprocess
    from cassandra_proxy import DelayProxy
    ids, _, _ = rows
    path = tmp_path / "ids"
    write_id_file(path, ids[:64])
    with DelayProxy((cassandra_server.host, cassandra_server.port), delay_ms=0) as p:
        script = f"""
import os, time, fastread
from fastread.cassandra import CassandraSource, read_id_file
r = fastread.Reader(source=CassandraSource('fr_test.rows', read_id_file({str(path)!r})[0],
                    hosts='127.0.0.1', port={p.port}, username='cassandra',
                    password='cassandra'), batch_size=64)
print("ready", flush=True)
time.sleep(1.5)
try:
    for arrays, _ in r:
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
    os._exit(0)
print("finished without interruption", flush=True)
os._exit(1)
"""
        child = interruptible_child(script)
        try:
            assert child.stdout.readline().strip() == "ready"
            p.delay = 60.0
            time.sleep(3.0)
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            pytest.fail("SIGINT did not interrupt the stalled read")
        assert child.returncode == 0 and out.startswith("interrupted"), (out, err)


def test_id_files_round_trip(tmp_path, rows):
    ids, labels, _ = rows
    path = tmp_path / "train.ids"
    write_id_file(path, ids[:20], labels[:20])
    table, labs = read_id_file(path)
    assert table.tobytes() == b"".join(u.bytes for u in ids[:20])
    assert np.array_equal(labs, labels[:20])
    (tmp_path / "bad.ids").write_text(f"{ids[0]}\nnot-a-uuid\n")
    with pytest.raises(ValueError, match="line 2"):
        read_id_file(tmp_path / "bad.ids")


def test_tls(cassandra_server, rows):
    ok, why = _core.cql_tls()
    if not ok:
        pytest.skip(why)
    ids, labels, data = rows
    src = source(cassandra_server, ids[3:203], ssl=True, ssl_ca=cassandra_server.tls_ca,
                 ssl_host="localhost")
    with fastread.Reader(source=src, batch_size=50) as r:
        got = read_all(r)
        assert r.stats()["cql_requests"] == 200
    assert [g[0] for g in got] == data[3:203]
    with pytest.raises(OSError, match="certificate"):  # another name than the certificate's
        fastread.Reader(source=source(cassandra_server, ids[3:5], ssl=True,
                                      ssl_ca=cassandra_server.tls_ca, ssl_host="example.org"),
                        batch_size=2)
