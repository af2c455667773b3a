"""``fastread index SHARDS...``: index files of WebDataset shards.

``--format fastread`` (default) writes fastread's memory-mappable index
(``SHARD.fridx``, or one file for all shards with ``--combined``), built
for the reader's spec (``--ext``, ``--missing``, ``--case-insensitive``,
``--grouping``: a reader with another spec builds its own index);
``--format wds2idx`` writes DALI's text index (``SHARD_STEM.idx``, as DALI's
``wds2idx`` names it), which fastread's readers and DALI's
``fn.readers.webdataset(index_paths=)`` both read. Files go beside the
shards, or into ``--out DIR``; each is written atomically.
(:mod:`fastread.formats._index_files` documents both formats.)
"""
import mmap
import os
import sys
import time


def add_parser(sub):
    p = sub.add_parser(
        "index",
        help="write index files of WebDataset shards (fastread's or DALI's wds2idx)",
        description="Index WebDataset tar shards once, natively, so readers open the index "
                    "instead of parsing every shard's headers at start-up.")
    p.add_argument("shards", nargs="+", help="tar shards (.tar; .tar.gz for --format fastread)")
    p.add_argument("--format", choices=("fastread", "wds2idx"), default="fastread",
                   help="fastread: .fridx, memory-mapped, for one reader spec; wds2idx: "
                        "DALI's text index of every component (default: %(default)s)")
    p.add_argument("--ext", action="append", default=[],
                   help="components, as WebDataset(ext=...): repeat it or separate entries "
                        "by commas; alternatives by ';' (e.g. --ext 'jpg;png,cls'); "
                        "needed for --format fastread")
    p.add_argument("--missing", choices=("empty", "skip", "error"), default="empty",
                   help="missing_component_behavior (default: %(default)s)")
    p.add_argument("--case-insensitive", action="store_true",
                   help="case_sensitive_extensions=False")
    p.add_argument("--grouping", choices=("webdataset", "dali"), default="webdataset",
                   help="WebDataset(grouping=...): 'dali' for fastread.dali.readers.webdataset "
                        "(default: %(default)s)")
    p.add_argument("--out", metavar="DIR", help="directory for the index files (default: "
                                                "beside each shard)")
    p.add_argument("--combined", metavar="FILE",
                   help="one .fridx file for all the shards (--format fastread)")
    p.set_defaults(run=run, _parser=p)
    return p


def _target(shard, out, suffix_of):
    name = suffix_of(os.path.basename(shard))
    return os.path.join(out if out else os.path.dirname(shard) or ".", name)


def _dali_name(base):
    """DALI's wds2idx default: the name up to its first dot (after the first
    character), plus .idx."""
    dot = base.find(".", 1)
    return (base[:dot] if dot > 0 else base) + ".idx"


def run(args):
    from fastread.formats import _index_files
    from fastread.formats.cifar import FormatError

    if args.out:
        os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    try:
        if args.format == "wds2idx":
            if args.combined:
                args._parser.error("--combined is for --format fastread (wds2idx is one file "
                                   "per shard)")
            from fastread import _formats
            from fastread._safe_open import open_file

            for shard in args.shards:
                if shard.endswith((".gz", ".tgz")):
                    raise ValueError(f"{shard}: DALI's reader cannot read gzip'd shards; "
                                     "wds2idx indexes plain tars")
                with open_file(shard) as f:
                    if os.fstat(f.fileno()).st_size == 0:
                        raise FormatError(shard, 0, "empty file (not a tar archive)")
                    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                        members = _formats.walk_tar(m, shard)
                dest = _target(shard, args.out, _dali_name)
                _index_files.write_wds2idx(dest, *members[:4])
                print(dest)
        else:
            ext = [e for arg in args.ext for e in arg.split(",") if e]
            if not ext:
                args._parser.error("--format fastread needs --ext (the components the "
                                   "readers will ask for)")
            from fastread.formats.webdataset import WebDataset

            src = WebDataset(args.shards, ext, missing_component_behavior=args.missing,
                             case_sensitive_extensions=not args.case_insensitive,
                             grouping=args.grouping, index_cache="off")
            if args.combined:
                src.index.write(args.combined)
                print(args.combined)
            else:
                for i, shard in enumerate(args.shards):
                    dest = _target(shard, args.out, lambda b: b + _index_files.FRIDX_SUFFIX)
                    src.index.select(i, i + 1).write(dest)
                    print(dest)
    except (FormatError, OSError, ValueError) as e:
        print(f"fastread index: {e}", file=sys.stderr)
        return 1
    print(f"indexed {len(args.shards)} shards in {time.perf_counter() - t0:.2f} s",
          file=sys.stderr)
    return 0
