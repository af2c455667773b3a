"""Token-aware routing on a real 2-node Apache Cassandra cluster, loopback
only: node A on 127.0.0.1 (token -2^62), node B on 127.0.0.2 (token 2^62),
RF 1, so every row lives on one node. CassandraSource(hosts=[A, B]) reads
2,000 rows; each node's `system_views.clients` (node-local) says how many
requests fastread's connections sent it, against how many keys its token
range owns.

    python bench/cassandra/two_nodes.py      # ~2 JVMs of 768 MB; a few minutes

Not a test (two JVMs on 2 shared cores cost minutes): run by hand; the
routing itself is tested everywhere by test_cql_engine (two in-process
nodes) and the token function against a real node by test_cassandra.py.
"""
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))

import cassandra_server as cs  # noqa: E402

N = 2000
A_TOKEN, B_TOKEN = -(2 ** 62), 2 ** 62


def owner(token):
    """The node owning `token` on the ring [A_TOKEN: A, B_TOKEN: B]."""
    return "B" if A_TOKEN < token <= B_TOKEN else "A"


def free_on(port, host):
    import socket
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_on_both():
    for _ in range(200):
        p = cs.choose_ports(2)
        if all(free_on(x, "127.0.0.2") for x in p):
            return tuple(p)
    raise RuntimeError("no ports free on both 127.0.0.1 and 127.0.0.2")


_pinned = {}


def pinned_session(node):
    """A driver session whose every query runs on `node` itself: virtual
    tables (system_views) are node-local, and the driver's default policy
    sends a query to any node of the cluster."""
    if node.host not in _pinned:
        from cassandra.cluster import Cluster
        from cassandra.policies import WhiteListRoundRobinPolicy
        cluster = Cluster([node.host], port=node.port, protocol_version=4,
                          load_balancing_policy=WhiteListRoundRobinPolicy([node.host]))
        _pinned[node.host] = (cluster, cluster.connect())
    return _pinned[node.host][1]


def our_requests(node):
    """Requests fastread's connections (no driver name) sent this node."""
    rows = pinned_session(node).execute(
        "SELECT driver_name, request_count FROM system_views.clients")
    return sum(r.request_count for r in rows if not r.driver_name)


def main():
    import numpy as np

    import fastread
    from fastread import _core
    from fastread.cassandra import CassandraSource
    ports = free_on_both()
    a = cs.Cassandra(host="127.0.0.1", initial_token=A_TOKEN, ports=ports)
    b = cs.Cassandra(host="127.0.0.2", initial_token=B_TOKEN, ports=ports,
                     seeds=f"127.0.0.1:{ports[1]}")
    t0 = time.monotonic()
    a.start()
    b.start()
    try:
        s = a.session()
        deadline = time.monotonic() + 180
        while len(s.execute("SELECT peer FROM system.peers").all()) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("node B never joined")
            time.sleep(1)
        print(f"2 nodes up in {time.monotonic() - t0:.1f} s", flush=True)
        s.execute("CREATE KEYSPACE IF NOT EXISTS two WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        s.execute("CREATE TABLE IF NOT EXISTS two.rows (id uuid PRIMARY KEY, label int, "
                  "data blob)")
        # Both nodes on the new schema before any write (the driver waits 10 s
        # at most; a node that lags refuses writes: INCOMPATIBLE_SCHEMA).
        deadline = time.monotonic() + 120
        while len({pinned_session(n).execute("SELECT schema_version FROM system.local")
                   .one()[0] for n in (a, b)}) > 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the two nodes never agreed on the schema")
            time.sleep(0.5)
        ins = s.prepare("INSERT INTO two.rows (id, label, data) VALUES (?, ?, ?)")
        ids = [uuid.uuid4() for _ in range(N)]
        from cassandra.concurrent import execute_concurrent_with_args
        execute_concurrent_with_args(s, ins, [(u, i, u.bytes * 8) for i, u in enumerate(ids)],
                                     concurrency=32, raise_on_first_error=True)
        for u in ids[:20]:  # the C token is the cluster's
            tok = s.execute("SELECT token(id) FROM two.rows WHERE id = %s", (u,)).one()[0]
            assert _core.cql_token(u.bytes) == tok
        want = {"A": 0, "B": 0}
        for u in ids:
            want[owner(_core.cql_token(u.bytes))] += 1
        before = {"A": our_requests(a), "B": our_requests(b)}
        src = CassandraSource("two.rows", ids, hosts=[f"127.0.0.1:{ports[0]}",
                                                      f"127.0.0.2:{ports[0]}"])
        with fastread.Reader(source=src, batch_size=200, workers=1) as r:
            got = [bytes(x) for arrays, _ in r for x in arrays]
            stats = r.stats()
            # While its connections are open: the table lists open ones only.
            sent = {"A": our_requests(a) - before["A"], "B": our_requests(b) - before["B"]}
        assert got == [u.bytes * 8 for u in ids], "bytes differ"
        print(f"keys owned: {want}; fastread's requests per node: {sent} "
              f"(cql_requests {stats['cql_requests']})")
        # Besides the keys: each connection's STARTUP, PREPARE and ring query.
        ok = all(0 <= sent[k] - want[k] <= 4 for k in want)
        print("routing: every key to its owner" if ok else "routing: MISMATCH")
        return 0 if ok else 1
    finally:
        for cluster, _ in _pinned.values():
            cluster.shutdown()
        b.stop()
        a.stop()


if __name__ == "__main__":
    sys.exit(main())
