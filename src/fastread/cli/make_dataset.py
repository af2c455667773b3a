"""``fastread make-dataset``: a synthetic ImageNet-like tree of JPEG files.

A thin front end to :func:`fastread.datasets.make_imagenet_like` (which shows
a progress bar and reuses a complete tree made with the same parameters).
"""
import os
import sys

from fastread.cli._args import positive_int, positive_float, nonnegative_int


def add_parser(sub):
    p = sub.add_parser(
        "make-dataset",
        help="write a synthetic ImageNet-like JPEG tree",
        description="Write (or reuse) CLASSES x PER_CLASS synthetic baseline JPEGs under DIR, "
                    "one directory per class, as fn.readers.file expects. Deterministic for a "
                    "given --seed; a complete tree made with the same parameters is reused.")
    p.add_argument("dir", metavar="DIR", help="dataset root (absent, empty, or made by fastread)")
    p.add_argument("--classes", type=positive_int, required=True, metavar="N",
                   help="number of class directories")
    p.add_argument("--per-class", type=positive_int, required=True, metavar="M",
                   help="images per class")
    p.add_argument("--seed", type=nonnegative_int, default=0, metavar="S",
                   help="random seed (default: 0)")
    p.add_argument("--mean-kb", type=positive_float, default=92.0, metavar="KB",
                   help="target mean file size in KB of 1000 bytes (default: 92)")
    p.add_argument("--width", type=positive_int, default=500, help="nominal width (default: 500)")
    p.add_argument("--height", type=positive_int, default=375, help="nominal height (default: 375)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="W",
                   help="generator processes (default: one per CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run, _parser=p)
    return p


def run(args):
    from fastread.datasets import MARKER_NAME, make_imagenet_like

    marker = os.path.join(os.path.abspath(args.dir), MARKER_NAME)
    before = _mtime(marker)
    try:
        info = make_imagenet_like(args.dir, classes=args.classes, per_class=args.per_class,
                                  seed=args.seed, mean_kb=args.mean_kb, width=args.width,
                                  height=args.height, workers=args.workers,
                                  progress=not args.quiet)
    except (ValueError, OSError) as e:  # FileExistsError, permissions, bad sizes
        print(f"fastread make-dataset: error: {e}", file=sys.stderr)
        return 1
    reused = before is not None and _mtime(marker) == before
    print(f"{info.root}: {info.files} files in {info.classes} classes, "
          f"{info.total_bytes / 1e9:.3f} GB total, mean {info.mean_bytes / 1e3:.1f} KB"
          f"{' (reused)' if reused else ''}")
    return 0


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
