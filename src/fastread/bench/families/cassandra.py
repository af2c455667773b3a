"""Modes over rows of a Cassandra table: ``fastread bench
cassandra://HOST:PORT/KEYSPACE.data_SPLIT``.

DATA names the node and the data table (the layout ``fastread cassandra
ingest`` writes); the ids are listed from ``KEYSPACE.metadata_SPLIT``, or
read from an id file given as ``?ids=PATH``. Credentials come from
FASTREAD_CASSANDRA_USERNAME and FASTREAD_CASSANDRA_PASSWORD.

======================  ==============================================================
``cassandra-python``    cassandra-driver's ``execute_concurrent_with_args`` per batch
                        (a prepared SELECT, 256 in flight): what a Python user writes
``cassandra-reader``    :class:`fastread.Reader` over a
                        :class:`fastread.cassandra.CassandraSource` (the cql engine)
``cassandra-dali``      ``fastread.dali.readers.cassandra`` in a DALI pipeline
======================  ==============================================================

The page cache does not apply (the rows are the node's business):
``--cache cold`` is refused. The full comparison, with added latency,
the server's CPU and ``fn.readers.file`` on the same files, is
bench/cassandra/loop_read.py.
"""
import os
import urllib.parse

import numpy as np

from fastread.bench.registry import BenchError, Dataset, Mode, add_dataset_kind
from fastread.bench.runners import DaliRunner, EpochRunner, ReaderRunner

NAME = "cassandra"
ORDER = 65
KIND = "cassandra"
add_dataset_kind(KIND, "rows of a Cassandra table (cassandra://HOST:PORT/KS.data_SPLIT)")

PY_CONCURRENCY = 256


def _parse(url):
    u = urllib.parse.urlparse(url)
    table = u.path.strip("/")
    if u.scheme != "cassandra" or not u.hostname or table.count(".") != 1:
        raise BenchError(f"DATA {url}: expected cassandra://HOST:PORT/KEYSPACE.data_SPLIT")
    ids = urllib.parse.parse_qs(u.query).get("ids", [None])[0]
    return u.hostname, u.port or 9042, table, ids


def _credentials():
    return (os.environ.get("FASTREAD_CASSANDRA_USERNAME"),
            os.environ.get("FASTREAD_CASSANDRA_PASSWORD"))


def detect(path, engine_options=None):
    if not (isinstance(path, str) and path.startswith("cassandra://")):
        return None
    host, port, table, ids_path = _parse(path)
    if ids_path:
        from fastread.cassandra import read_id_file
        try:
            table_ids, labels = read_id_file(ids_path)
        except (OSError, ValueError) as e:
            raise BenchError(f"DATA {path}: {e}") from None
        import uuid
        ids = [uuid.UUID(bytes=t.tobytes()) for t in table_ids]
        labels = list(labels) if labels is not None else [0] * len(ids)
    else:
        ks, data = table.split(".")
        if not data.startswith("data_"):
            raise BenchError(f"DATA {path}: the table is not KEYSPACE.data_SPLIT; give ?ids=FILE")
        try:
            from fastread.cassandra_tools import connect, list_ids
            user, password = _credentials()
            ids, labels = list_ids(connect([host], port, user, password), ks, data[5:])
        except Exception as e:  # the driver's errors: NoHostAvailable, ...
            raise BenchError(f"DATA {path}: cannot list its ids: {type(e).__name__}: {e}") \
                from None
    if not ids:
        raise BenchError(f"DATA {path} holds no rows")
    return Dataset(root=path, primary=KIND, kinds=(KIND,), paths=ids, labels=labels,
                   samples=len(ids), nbytes=0, page_cache=False)


def modes(env):
    yield Mode("cassandra-python", NAME, KIND, "execute_concurrent_with_args",
               f"cassandra-driver, a prepared SELECT per row, {PY_CONCURRENCY} in flight",
               check=_check_python, build=_build_python, role="python", default=("cpu",))
    yield Mode("cassandra-reader", NAME, KIND, "Reader(source=CassandraSource(...))",
               "fastread.Reader over the rows (engine cql)", engine="cql",
               check=_check, build=_build_reader, default=("cpu", "gpu"))
    yield Mode("cassandra-dali", NAME, KIND, "readers.cassandra",
               "fastread.dali.readers.cassandra (fn.crs4.cassandra's arguments)", engine="cql",
               check=_check_dali, build=_build_dali, dali=True, default=("cpu",))


def _check(mode, cfg):
    if cfg.decode:
        return "does not decode"
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_python(mode, cfg):
    from fastread.bench.environment import try_import
    mod, why = try_import("cassandra")
    if mod is None:
        return f"cassandra-driver {why} (pip install cassandra-driver)"
    return "reads into host memory only" if cfg.device == "gpu" else _check(mode, cfg)


def _check_dali(mode, cfg):
    return cfg.env.dali_error_for() or _check(mode, cfg)


def _source(cfg):
    from fastread.cassandra import CassandraSource
    host, port, table, _ = _parse(cfg.data_dir)
    user, password = _credentials()
    return CassandraSource(table, cfg.paths, hosts=host, port=port, username=user,
                           password=password)


def _build_reader(mode, cfg):
    import fastread
    opts = cfg.engine_options_without("s3")
    return ReaderRunner(fastread.Reader(source=_source(cfg), batch_size=cfg.batch_size,
                                        device="gpu" if cfg.device == "gpu" else "cpu", **opts))


def _build_dali(mode, cfg):
    host, port, table, _ = _parse(cfg.data_dir)
    user, password = _credentials()

    def reader():
        from fastread.dali import readers
        return readers.cassandra(table=table, source_uuids=cfg.paths, cassandra_ips=[host],
                                 cassandra_port=port, username=user, password=password,
                                 name="Reader")
    return DaliRunner(cfg, reader)


class _PythonRunner(EpochRunner):
    def __init__(self, cfg):
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import Cluster
        host, port, table, _ = _parse(cfg.data_dir)
        user, password = _credentials()
        auth = PlainTextAuthProvider(user, password) if user else None
        self.cluster = Cluster([host], port=port, auth_provider=auth, protocol_version=4)
        self.session = self.cluster.connect()
        self.stmt = self.session.prepare(f"SELECT data FROM {table} WHERE id = ?")
        self.ids, self.batch = cfg.paths, cfg.batch_size
        super().__init__()

    def new_epoch(self):
        from cassandra.concurrent import execute_concurrent_with_args
        for start in range(0, len(self.ids), self.batch):
            rows = execute_concurrent_with_args(
                self.session, self.stmt, [(u,) for u in self.ids[start:start + self.batch]],
                concurrency=PY_CONCURRENCY, raise_on_first_error=True)
            arrays = [np.frombuffer(res.one().data, np.uint8) for _, res in rows]
            yield arrays, None

    def close(self):
        super().close()
        self.cluster.shutdown()


def _build_python(mode, cfg):
    return _PythonRunner(cfg)
