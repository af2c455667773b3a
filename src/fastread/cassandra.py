"""Training sets in Apache Cassandra (or ScyllaDB): samples that are rows
``(id uuid PRIMARY KEY, label int, data blob)`` read by fastread's own CQL
client, the ``cql`` engine of the C core (csrc/engines/cql/: protocol v4,
many requests in flight per connection, token-aware routing, retries
within a deadline; docs/cassandra.md says why a client of our own).

    src = CassandraSource("imagenette.data_train", ids, hosts=["10.0.0.5"],
                          username="u", password="p")
    for arrays, labels in fastread.Reader(source=src, batch_size=256):
        ...

``ids`` are held as one (n, 16) uint8 table (16 bytes a uuid, no Python
object per sample): uuid.UUID objects, their strings, their 16-byte forms,
such a table, or a file written by ``fastread cassandra ids`` (one uuid a
line, optionally its label). Labels come from the rows (``label_type``
"int": the ``label_col`` int; "blob": its bytes, a list of uint8 arrays
per batch) or, with ``label_type="none"``, from ``labels=`` (e.g. the
metadata table's, as an id file carries them).

Plugin compatibility: :func:`load_plugin_rows` reads cassandra-dali-plugin's
``*.rows`` pickles with an unpickler that admits only their dict, lists,
strings, numbers and ``uuid.UUID``.
"""
import io
import os
import pickle
import re
import uuid

import numpy as np

from fastread import _core
from fastread.source import SampleSource

__all__ = ["CassandraSource", "uuid_table", "read_id_file", "write_id_file",
           "load_plugin_rows", "LABEL_TYPES"]

LABEL_TYPES = ("int", "blob", "none")
UUID_BYTES = 16
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def uuid_table(ids):
    """``ids`` as a C-contiguous (n, 16) uint8 array: from such an array
    (kept as it is), from bytes of n * 16, or from a sequence of
    ``uuid.UUID``, uuid strings or 16-byte values. ValueError naming the
    first id that is none."""
    if isinstance(ids, np.ndarray) and ids.dtype == np.uint8:
        if ids.ndim != 2 or ids.shape[1] != UUID_BYTES:
            raise ValueError(f"an id table has shape (n, 16), got {ids.shape}")
        return np.ascontiguousarray(ids)
    if isinstance(ids, (bytes, bytearray, memoryview)):
        raw = bytes(ids)
        if len(raw) % UUID_BYTES:
            raise ValueError(f"{len(raw)} bytes of ids are not a whole number of 16-byte uuids")
        return np.frombuffer(raw, np.uint8).reshape(-1, UUID_BYTES).copy()
    if isinstance(ids, str):
        raise TypeError("ids must be a sequence of ids (or an id table); for an id file use "
                        "read_id_file(path)")
    out = bytearray(UUID_BYTES * len(ids))
    for i, u in enumerate(ids):
        try:
            if isinstance(u, uuid.UUID):
                b = u.bytes
            elif isinstance(u, str):
                b = uuid.UUID(u).bytes
            else:
                b = bytes(u)
                if len(b) != UUID_BYTES:
                    raise ValueError(f"{len(b)} bytes")
        except (ValueError, TypeError) as e:
            raise ValueError(f"id {i} ({u!r:.60}) is not a uuid: {e}") from None
        out[UUID_BYTES * i:UUID_BYTES * (i + 1)] = b
    return np.frombuffer(bytes(out), np.uint8).reshape(-1, UUID_BYTES).copy()


def write_id_file(path, ids, labels=None):
    """Writes ids (anything :func:`uuid_table` takes) one uuid a line,
    each followed by its label when ``labels`` is given; atomically (a
    temporary file renamed). Returns the number written."""
    table = uuid_table(ids)
    if labels is not None and len(labels) != len(table):
        raise ValueError(f"{len(labels)} labels for {len(table)} ids")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        for i in range(len(table)):
            u = str(uuid.UUID(bytes=table[i].tobytes()))
            f.write(f"{u} {int(labels[i])}\n" if labels is not None else f"{u}\n")
    os.replace(tmp, path)
    return len(table)


def read_id_file(path):
    """An id file's ids and labels: ``(table, labels)``, labels an int32
    array when every line has one, else None. A line is ``UUID`` or ``UUID
    LABEL``; blank lines and ``#`` comments are skipped. cassandra-dali-
    plugin's ``.rows`` pickles are read too (:func:`load_plugin_rows`; no
    labels). ValueError naming the file and line otherwise."""
    with open(path, "rb") as f:
        head = f.read(2)
    if head[:1] == b"\x80":  # a pickle (protocol 2+)
        return load_plugin_rows(path)["ids"], None
    raw, labels = bytearray(), []
    with open(path, "r", encoding="ascii", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            try:
                raw += uuid.UUID(parts[0]).bytes
                if len(parts) > 2:
                    raise ValueError("more than an id and a label")
                labels.append(int(parts[1]) if len(parts) == 2 else None)
            except ValueError as e:
                raise ValueError(f"{path}, line {lineno}: not 'UUID [LABEL]' ({e}): "
                                 f"{line[:80]!r}") from None
    table = np.frombuffer(bytes(raw), np.uint8).reshape(-1, UUID_BYTES).copy()
    if labels and all(x is not None for x in labels):
        return table, np.asarray(labels, np.int32)
    return table, None


class _RowsUnpickler(pickle.Unpickler):
    """Admits the plugin's rows file only: dicts, lists, strings, numbers,
    None and uuid.UUID (its SafeUUID flag too); any other global is refused,
    so a crafted file cannot run code."""

    _ALLOWED = {("uuid", "UUID"), ("uuid", "SafeUUID")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return getattr(uuid, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name} (a rows file holds "
                                     "only dicts, lists, strings, numbers and uuid.UUID)")


def load_plugin_rows(path):
    """cassandra-dali-plugin's id cache (``cache_uuids.py``'s ``*.rows``:
    a pickled ``{"row_keys": [UUID...], "config": {...}, "split": ...}``)
    as ``{"ids": (n, 16) table, "config": dict, "split": list or None}``,
    read with an unpickler that admits only those types. ValueError naming
    the file otherwise."""
    try:
        with open(path, "rb") as f:
            stuff = _RowsUnpickler(io.BufferedReader(f)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a cassandra-dali-plugin rows file: {e}") from None
    if not isinstance(stuff, dict) or "row_keys" not in stuff:
        raise ValueError(f"{path}: not a cassandra-dali-plugin rows file (no 'row_keys')")
    return {"ids": uuid_table(list(stuff["row_keys"])), "config": stuff.get("config") or {},
            "split": stuff.get("split")}


class _IdNames:
    """The samples' names, made when asked: ``TABLE[uuid]``."""

    def __init__(self, table, ids):
        self._table, self._ids = table, ids

    def __len__(self):
        return len(self._ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return f"{self._table}[{uuid.UUID(bytes=self._ids[i].tobytes())}]"


def _check_value(what, v):
    v = str(v)
    if "," in v:
        raise ValueError(f"CassandraSource: {what} cannot hold ',' (it separates the engine's "
                         "options)")
    return v


class CassandraSource(SampleSource):
    """The rows of ``ids`` in ``table`` (``KEYSPACE.TABLE``) as samples, read
    by the ``cql`` engine with the reader's native threads, the GIL released.

    - ``hosts``: the nodes to connect to (a name or a list; ``host:port``
      allowed); with several, each key goes to the node owning its token.
    - ``id_col``, ``data_col``, ``label_col``: the columns (identifiers).
    - ``label_type``: "int" (the label column, int32 labels), "blob" (its
      bytes: a list of uint8 arrays per batch) or "none" (``labels=``, or
      zeros).
    - ``username``/``password``: SASL PLAIN; never shown in a repr or a
      message. ``ssl``: TLS (``ssl_ca``: the CA file, ``ssl_verify``,
      ``ssl_host``: the name the certificate must carry).
    - ``connections`` per host per reader thread, ``inflight`` requests
      per connection, ``timeout_ms`` per request, ``deadline_ms`` per
      sample (retries included), ``retries``, ``consistency``.

    A sample's bytes are the row's data cell; a missing id fails its batch
    with :class:`fastread.ReadError` naming ``TABLE[uuid]``."""

    reads_ranges = False
    native_engine = "cql"  # the engine it reads with (source._engine_for)
    # Reader threads by default: each has one batch of requests in flight
    # and waits for its slowest row, so the threads bound what is in flight
    # (workers x batch rows) and cost no more CPU per row than one. Four keep
    # a node on 2 cores busy (one left a batch's round trip and its tail
    # idle); on 16 cores four carried 54-67% of the 0 ms rate at 25 ms and
    # eight 85-100%, the node then the limit (bench/cassandra/loop_read.py,
    # docs/cassandra.md "Measured"): half the CPUs, 4 to 16. The native
    # operator's default (fastread_cassandra.cc, DefaultWorkers) is the same rule.
    default_workers = max(4, min(16, (len(os.sched_getaffinity(0))
                                      if hasattr(os, "sched_getaffinity") else
                                      (os.cpu_count() or 2)) // 2))

    def __init__(self, table, ids, *, hosts, port=9042, data_col="data", label_col="label",
                 id_col="id", label_type="int", username=None, password=None, ssl=False,
                 ssl_ca=None, ssl_verify=True, ssl_host=None, consistency="local_one",
                 connections=None, inflight=None, timeout_ms=None, deadline_ms=None,
                 retries=None, labels=None):
        if not isinstance(table, str) or table.count(".") != 1 or \
                not all(_IDENT.match(p) for p in table.split(".")):
            raise ValueError(f"CassandraSource: table must be 'KEYSPACE.TABLE', got {table!r}")
        for what, col in (("id_col", id_col), ("data_col", data_col), ("label_col", label_col)):
            if not isinstance(col, str) or not _IDENT.match(col):
                raise ValueError(f"CassandraSource: {what} must be a column name, got {col!r}")
        if label_type not in LABEL_TYPES:
            raise ValueError(f"CassandraSource: label_type must be one of {LABEL_TYPES}, got "
                             f"{label_type!r}")
        if (username is None) != (password is None):
            raise ValueError("CassandraSource: username and password go together")
        if isinstance(hosts, str):
            hosts = [hosts]
        hosts = [_check_value("hosts", h) for h in hosts]
        if not hosts or any(not h or ";" in h for h in hosts):
            raise ValueError(f"CassandraSource: hosts must name at least one host, got {hosts!r}")
        self.table = table
        self.ids = uuid_table(ids)
        n = len(self.ids)
        self.label_type = label_type
        self.hosts, self.port = list(hosts), int(port)
        self.id_col, self.data_col, self.label_col = id_col, data_col, label_col
        self.username = username
        self._password = password
        self.names = _IdNames(table, self.ids)
        if labels is not None:
            arr = np.asarray(labels)
            if arr.shape != (n,):
                raise ValueError(f"CassandraSource: {arr.size} labels for {n} ids")
            self.labels = arr.astype(np.int32)
        else:
            # Row labels are known once read: -1 until then (never used).
            self.labels = np.full(n, -1 if label_type != "none" else 0, np.int32)
        self._given_labels = labels is not None
        args = {"hosts": ";".join(self.hosts), "port": self.port, "table": table,
                "id_col": id_col, "data_col": data_col, "label_col": label_col,
                "label": "none" if label_type == "none" else label_type,
                "consistency": _check_value("consistency", consistency)}
        if username is not None:
            args["username"] = _check_value("username", username)
            args["password"] = _check_value("password", password)
        if ssl:
            args["ssl"] = 1
            args["ssl_verify"] = int(bool(ssl_verify))
            if ssl_ca:
                args["ssl_ca"] = _check_value("ssl_ca", os.fspath(ssl_ca))
            if ssl_host:
                args["ssl_host"] = _check_value("ssl_host", ssl_host)
            ok, why = _core.cql_tls()
            if not ok:
                raise ValueError(f"CassandraSource: ssl=True: {why}")
        for key, v in (("connections", connections), ("inflight", inflight),
                       ("timeout_ms", timeout_ms), ("deadline_ms", deadline_ms),
                       ("retries", retries)):
            if v is not None:
                if not isinstance(v, int) or isinstance(v, bool):
                    raise ValueError(f"CassandraSource: {key} must be an integer, got {v!r}")
                args[key] = v
        self._args = args

    def __repr__(self):
        who = f", username={self.username!r}, password='***'" if self.username else ""
        return (f"CassandraSource({self.table!r}, {len(self)} ids, hosts={self.hosts!r}, "
                f"port={self.port}, label_type={self.label_type!r}{who})")

    def engine_args(self, extra=""):
        """The cql engine's engine_args for this source (holds the password:
        never print it; fastread.s3.redact_engine_args hides it)."""
        own = ",".join(f"{k}={v}" for k, v in self._args.items())
        return f"{own},{extra}" if extra else own

    @property
    def rows_give_labels(self):
        """True when labels come from the rows (label_type int or blob)."""
        return self.label_type != "none"

    def sample_name(self, i):
        return self.names[i]

    def check_options(self, options):
        if options.get("o_direct"):
            raise ValueError("CassandraSource: o_direct applies to files, not rows")

    def _options(self, options):
        opts = dict(options)
        opts["engine_args"] = self.engine_args(opts.get("engine_args") or "")
        opts.pop("cache_dir", None)
        opts.pop("cache_bytes", None)
        return opts

    def open_native(self, engine, options, *, prefetch, workers):
        if engine != "cql":
            raise ValueError(f"CassandraSource reads with engine 'cql', not {engine!r}")
        return _core.NativeReader(None, engine, prefetch=prefetch, workers=workers,
                                  keys=self.ids, **self._options(options))

    def read_batch(self, context, indices):
        return context.read_keys(self.ids[indices])

    def batch_labels(self, batch, indices):
        """The labels of a batch read from this source: the rows' (int32, or
        a list of uint8 arrays for blobs), else those given."""
        if self.label_type == "int":
            return batch.label_ints()
        if self.label_type == "blob":
            return batch.label_blobs()
        return self.labels[indices]

    def failure_detail(self, name):
        """The engine's words for why the row ``name`` (``TABLE[uuid]``)
        cannot be read (not found, the node's error), from a fresh read on
        this thread's context; None if it reads now."""
        from fastread.engine import cached_context
        try:
            u = uuid.UUID(name[name.rindex("[") + 1:-1])
            ctx = cached_context("cql", engine_args=self.engine_args())
            batch = ctx.read_keys(uuid_table([u]))
            return ctx.sample_error(0) if batch.failures() else None
        except (OSError, ValueError, TypeError):
            return None
