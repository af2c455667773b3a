"""The Cassandra workflow's writing side, through the Python driver
(``pip install fastread[cassandra]``: cassandra-driver), as
cassandra-dali-plugin lays a data set out:

- :func:`create_tables`: keyspace ``K`` with ``K.data_SPLIT (id uuid
  PRIMARY KEY, label int, data blob)`` (uncompressed: JPEGs do not shrink)
  and ``K.metadata_SPLIT (id uuid PRIMARY KEY, label int, or_label text,
  or_split text)``;
- :func:`ingest`: a class-per-folder tree into them, labels numbered as
  ``fn.readers.file`` numbers them (:func:`fastread.scan`: sorted class
  directories), a uuid4 per file, inserts in flight concurrently; resumable
  through a journal of the files done (``uuid path`` lines, appended after
  each chunk), so a second run inserts only what the first did not;
- :func:`list_ids`: the ids (and labels) of a split from its metadata table.

Reading never goes through here: :class:`fastread.cassandra.CassandraSource`
reads with the C core's own client.
"""
import os
import sys
import time
import uuid

from fastread.index import scan

__all__ = ["connect", "create_tables", "ingest", "list_ids"]

CHUNK = 256  # files per round of concurrent inserts (and per journal append)


def connect(hosts, port=9042, username=None, password=None, ssl_ca=None, timeout=60):
    """A cassandra-driver session (protocol v4). ImportError naming the
    package when the driver is missing."""
    try:
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import Cluster
    except ImportError:
        raise ImportError("fastread cassandra ingest/ids use the Python driver: "
                          "pip install cassandra-driver (or fastread[cassandra])") from None
    auth = PlainTextAuthProvider(username, password) if username else None
    ssl_context = None
    if ssl_ca:
        import ssl
        ssl_context = ssl.create_default_context(cafile=ssl_ca)
    cluster = Cluster(list(hosts), port=port, auth_provider=auth, protocol_version=4,
                      ssl_context=ssl_context, connect_timeout=timeout)
    session = cluster.connect()
    session.default_timeout = timeout
    return session


def _check_name(what, v):
    if not v.replace("_", "a").isalnum() or v[0].isdigit():
        raise ValueError(f"{what} must be an identifier (letters, digits, _), got {v!r}")
    return v


def create_tables(session, keyspace, split, replication=1):
    """The plugin's two tables of one split (IF NOT EXISTS)."""
    ks, sp = _check_name("keyspace", keyspace), _check_name("split", split)
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = "
                    f"{{'class': 'SimpleStrategy', 'replication_factor': {int(replication)}}}")
    session.execute(f"CREATE TABLE IF NOT EXISTS {ks}.data_{sp} (id uuid, label int, "
                    f"data blob, PRIMARY KEY ((id))) WITH compression = {{'enabled': 'false'}}")
    session.execute(f"CREATE TABLE IF NOT EXISTS {ks}.metadata_{sp} (label int, or_label text, "
                    f"or_split text, id uuid, PRIMARY KEY ((id)))")


def _read_journal(path):
    done = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                u, _, rel = line.rstrip("\n").partition(" ")
                if rel:
                    done[rel] = u
    return done


def _progress(done, total, nbytes, t0, final=False, out=sys.stderr):
    dt = max(time.monotonic() - t0, 1e-9)
    end = "\n" if final else "\r"
    out.write(f"ingest: {done}/{total} files, {nbytes / 1e6:.1f} MB, {done / dt:.0f} files/s"
              f"{end}")
    out.flush()


def ingest(session, file_root, keyspace, split, *, journal=None, concurrency=32,
           progress=True, **scan_options):
    """Every file of the class tree ``file_root`` (``fn.readers.file``'s
    rules and labels) into ``keyspace.data_SPLIT`` and its metadata table.
    ``journal``: the resume file (default ``KEYSPACE_SPLIT.ingest`` in the
    current directory; files listed there are skipped). Returns
    ``(inserted, skipped)``."""
    from cassandra.concurrent import execute_concurrent_with_args

    create_tables(session, keyspace, split)
    paths, labels = scan(file_root, **scan_options)
    root = os.path.abspath(file_root)
    journal = journal or f"{keyspace}_{split}.ingest"
    done = _read_journal(journal)
    data_q = session.prepare(f"INSERT INTO {keyspace}.data_{split} (id, label, data) "
                             "VALUES (?, ?, ?)")
    meta_q = session.prepare(f"INSERT INTO {keyspace}.metadata_{split} (id, label, or_label, "
                             "or_split) VALUES (?, ?, ?, ?)")
    todo = [(p, int(lab)) for p, lab in zip(paths, labels)
            if os.path.relpath(os.path.abspath(p), root) not in done]
    t0, nbytes, inserted, last = time.monotonic(), 0, 0, 0.0
    with open(journal, "a") as jf:
        for start in range(0, len(todo), CHUNK):
            chunk = todo[start:start + CHUNK]
            rows, metas, lines = [], [], []
            for p, lab in chunk:
                with open(p, "rb") as f:
                    blob = f.read()
                u = uuid.uuid4()
                rel = os.path.relpath(os.path.abspath(p), root)
                rows.append((u, lab, blob))
                metas.append((u, lab, os.path.basename(os.path.dirname(rel)) or "", split))
                lines.append(f"{u} {rel}\n")
                nbytes += len(blob)
            for q, args in ((data_q, rows), (meta_q, metas)):
                for ok, res in execute_concurrent_with_args(session, q, args,
                                                            concurrency=concurrency,
                                                            raise_on_first_error=False):
                    if not ok:
                        raise OSError(f"insert into {keyspace}.*_{split} failed: {res}")
            jf.writelines(lines)
            jf.flush()
            os.fsync(jf.fileno())
            inserted += len(chunk)
            if progress and time.monotonic() - last > 0.5:
                last = time.monotonic()
                _progress(inserted, len(todo), nbytes, t0)
    if progress:
        _progress(inserted, len(todo), nbytes, t0, final=True)
    return inserted, len(paths) - len(todo)


def list_ids(session, keyspace, split, id_col="id", label_col="label"):
    """``(ids, labels)`` of a split from its metadata table (paged), sorted
    by id so the list is the same however the nodes page it."""
    ks, sp = _check_name("keyspace", keyspace), _check_name("split", split)
    rows = session.execute(f"SELECT {_check_name('id_col', id_col)}, "
                           f"{_check_name('label_col', label_col)} FROM {ks}.metadata_{sp}")
    pairs = sorted((r[0].bytes, r[1]) for r in rows)
    return [uuid.UUID(bytes=b) for b, _ in pairs], [lab for _, lab in pairs]
