"""``fastread bmap``: the extent map of every sample file in place
(FIEMAP), as a bmap.json that is a superset of the seed's (see
:mod:`fastread.bmap`)."""
import sys

from fastread.cli._args import positive_int


def add_parser(sub):
    p = sub.add_parser(
        "bmap", help="map where each sample file lies on its block device (FIEMAP)",
        description="Write bmap.json: for every sample of FILE_ROOT (fastread.scan order), "
                    "all extents with physical offsets in bytes and in LBAs of --lba-size, "
                    "keyed <basename of FILE_ROOT>/<class>/<file> with the seed's "
                    "startblock/endblock.")
    p.add_argument("file_root", metavar="FILE_ROOT", help="dataset root, one directory per class")
    p.add_argument("-o", "--output", required=True, metavar="BMAP.json", help="file to write")
    p.add_argument("--lba-size", type=positive_int, default=512, metavar="BYTES",
                   help="bytes per LBA of startblock/endblock (default: 512)")
    p.add_argument("--prefix", default=None,
                   help="key prefix (default: the basename of FILE_ROOT, e.g. 'train')")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run, _parser=p)
    return p


def run(args):
    from fastread.bmap import UNMAPPABLE, build_bmap, check_output_dir, write_bmap

    try:
        check_output_dir(args.output)   # before the tree is mapped
        bm = build_bmap(args.file_root, lba_size=args.lba_size, prefix=args.prefix,
                        progress=False if args.quiet else None)
        write_bmap(bm, args.output)
    except (OSError, ValueError) as e:
        print(f"fastread bmap: error: {e}", file=sys.stderr)
        return 1
    extents = sum(len(e["extents"]) for e in bm.values())
    fragmented = sum(not e["contiguous"] for e in bm.values())
    odd = sum(any(set(x["flags"]) & UNMAPPABLE for x in e["extents"]) for e in bm.values())
    print(f"{args.output}: {len(bm)} files, {extents} extents, {fragmented} not contiguous "
          "(more than one extent, or holes)"
          + (f", {odd} with extents not addressable on the device" if odd else ""))
    return 0
