"""``fastread cassandra ingest FILE_ROOT --keyspace K --split train`` and
``fastread cassandra ids``: the cassandra-dali-plugin workflow's tables and
id lists (:mod:`fastread.cassandra_tools`, through the Python driver).

Credentials come from FASTREAD_CASSANDRA_USERNAME and
FASTREAD_CASSANDRA_PASSWORD, never from the command line (visible to every
user of the machine)."""
import os
import sys


def _connect(args):
    from fastread.cassandra_tools import connect
    user = os.environ.get("FASTREAD_CASSANDRA_USERNAME")
    password = os.environ.get("FASTREAD_CASSANDRA_PASSWORD")
    return connect(args.hosts.split(","), port=args.port, username=user, password=password,
                   ssl_ca=args.ssl_ca)


def _add_common(p):
    p.add_argument("--hosts", default="127.0.0.1", help="nodes, comma-separated "
                   "(default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9042, help="native port (default 9042)")
    p.add_argument("--ssl-ca", default=None, metavar="FILE", help="TLS, checked against FILE")
    p.add_argument("--keyspace", required=True)
    p.add_argument("--split", required=True, help="table suffix: data_SPLIT, metadata_SPLIT")


def add_parser(sub):
    p = sub.add_parser("cassandra", help="training sets in Cassandra: ingest a tree, list ids",
                       description=__doc__)
    cmds = p.add_subparsers(dest="cassandra_command", required=True)
    ing = cmds.add_parser("ingest", help="a class-per-folder tree into K.data_SPLIT and "
                          "K.metadata_SPLIT (resumable)")
    ing.add_argument("file_root")
    _add_common(ing)
    ing.add_argument("--journal", default=None, metavar="FILE",
                     help="resume file (default KEYSPACE_SPLIT.ingest here)")
    ing.add_argument("--concurrency", type=int, default=32, help="inserts in flight")
    ing.add_argument("--quiet", action="store_true", help="no progress line")
    ids = cmds.add_parser("ids", help="the ids (and labels) of a split as a plain file, from "
                          "its metadata table or from the plugin's .rows pickle")
    ids.add_argument("-o", "--output", required=True, metavar="FILE")
    ids.add_argument("--from-rows", default=None, metavar="ROWS",
                     help="convert cassandra-dali-plugin's cached .rows file instead")
    ids.add_argument("--hosts", default="127.0.0.1")
    ids.add_argument("--port", type=int, default=9042)
    ids.add_argument("--ssl-ca", default=None, metavar="FILE")
    ids.add_argument("--keyspace")
    ids.add_argument("--split")
    ids.add_argument("--no-labels", action="store_true", help="ids only")
    p.set_defaults(run=run, _parser=p)
    return p


def run(args):
    from fastread.cassandra import load_plugin_rows, write_id_file
    try:
        if args.cassandra_command == "ingest":
            from fastread.cassandra_tools import ingest
            inserted, skipped = ingest(_connect(args), args.file_root, args.keyspace, args.split,
                                       journal=args.journal, concurrency=args.concurrency,
                                       progress=not args.quiet)
            print(f"{args.keyspace}.data_{args.split}: {inserted} files inserted, {skipped} "
                  f"already there (journal)")
            return 0
        if args.from_rows:
            n = write_id_file(args.output, load_plugin_rows(args.from_rows)["ids"])
        else:
            if not (args.keyspace and args.split):
                print("fastread cassandra ids: --keyspace and --split (or --from-rows)",
                      file=sys.stderr)
                return 2
            from fastread.cassandra_tools import list_ids
            ids, labels = list_ids(_connect(args), args.keyspace, args.split)
            n = write_id_file(args.output, ids, None if args.no_labels else labels)
        print(f"{args.output}: {n} ids")
        return 0
    except (OSError, ValueError, ImportError) as e:
        print(f"fastread cassandra: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the driver's own errors (NoHostAvailable, AuthenticationFailed)
        print(f"fastread cassandra: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
