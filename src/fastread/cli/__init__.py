"""The ``fastread`` command line.

Subcommands, one module each:

* ``fastread make-dataset DIR ...`` -- a synthetic ImageNet-like JPEG tree
  (:mod:`fastread.cli.make_dataset`).
* ``fastread info`` -- version, engines, optional packages, CUDA devices and
  run-time defaults (:mod:`fastread.cli.info`).
* ``fastread bench DATA ...`` -- fastread against DALI's reader and the
  plain Python external source over one dataset (:mod:`fastread.cli.bench`
  parses; the benchmark itself is :mod:`fastread.bench`).
* ``fastread pack FILE_ROOT OUT`` / ``fastread verify OUT`` -- a dataset in one
  image with aligned samples, and its checksums checked (:mod:`fastread.cli.pack`).
* ``fastread bmap FILE_ROOT -o bmap.json`` -- extent map of the files in place
  (:mod:`fastread.cli.bmap`).
* ``fastread upload SRC... s3://bucket/prefix`` -- files and dataset trees
  into a bucket (:mod:`fastread.cli.upload`; ``make-dataset --upload`` too).
* ``fastread index SHARDS...`` -- index files of WebDataset shards,
  fastread's memory-mapped ones or DALI's wds2idx (:mod:`fastread.cli.index`).
* ``fastread cassandra ingest|ids`` -- a tree into Cassandra tables, id
  lists (:mod:`fastread.cli.cassandra`).

Heavy imports (DALI, torch, matplotlib) happen inside the subcommand that
needs them, so ``fastread --help`` and ``fastread info`` stay quick.
"""
import argparse
import sys

from fastread.cli import bench, bmap, cassandra, index, info, make_dataset, pack, upload

#: Subcommand modules; each has ``add_parser(subparsers)`` which registers a
#: parser whose defaults carry ``run(args) -> int``.
COMMANDS = (make_dataset, info, bench, pack, bmap, upload, cassandra, index)


def build_parser():
    from fastread import __version__

    parser = argparse.ArgumentParser(
        prog="fastread",
        description="Native batch reads of training samples for DALI and PyTorch: "
                    "dataset generation, environment report and benchmarks.")
    parser.add_argument("--version", action="version", version=f"fastread {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv=None):
    """Runs the command line; returns the exit status (argparse errors exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args._argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("fastread: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `fastread info | head -1`
        return 0


__all__ = ["main", "build_parser"]
