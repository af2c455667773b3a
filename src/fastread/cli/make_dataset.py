"""``fastread make-dataset``: a synthetic dataset tree, JPEG files or ``.npy`` arrays.

A thin front end to :func:`fastread.datasets.make_imagenet_like` (``--format
jpeg``, the default) and :func:`fastread.datasets.make_npy_dataset`
(``--format npy``), which show a progress bar and reuse a complete tree made
with the same parameters.
"""
import argparse
import os
import re
import sys

from fastread.cli._args import positive_int, positive_float, nonnegative_int
from fastread.cli.upload import add_s3_options, upload

# Options of one format only, with the defaults they take when not given
# (None on the parser, so that giving one with the other format is an error).
_JPEG_ONLY = {"mean_kb": 92.0, "width": 500, "height": 375}
_NPY_ONLY = {"shape": (3, 224, 224), "dtype": "uint8", "array_bytes": None}
# Formats whose files are not one sample each (fastread.formats reads them).
_RECORD_FORMATS = ("cifar10", "webdataset", "squirrel")
# Options of the JPEG tree that the record formats of JPEGs take too.
_SHARED_WITH = {"webdataset": ("width", "height"), "squirrel": ("shape",)}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def byte_size(text):
    """``4MiB`` -> 4194304; ``92kB`` -> 92000 (SI without the i); plain bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes such as 4MiB, 150528, 92kB, got {text!r}")
    unit = (m.group(2) or "").lower()
    if unit != "b":
        unit = unit.rstrip("b")
    return int(m.group(1)) * _UNITS[unit]


def shape_arg(text):
    """``3,224,224`` -> (3, 224, 224); ``""`` -> () (0-d arrays)."""
    parts = [t.strip() for t in text.split(",")] if text.strip() else []
    try:
        dims = tuple(int(t) for t in parts)
    except ValueError:
        dims = (-1,)
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated non-negative ints such as 3,224,224, got {text!r}")
    return dims


def dtype_arg(text):
    import numpy as np

    try:
        dt = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a NumPy dtype") from None
    if dt.kind not in "biuf" or dt.hasobject:
        raise argparse.ArgumentTypeError(
            f"expected a bool, integer or float dtype such as uint8 or float32, got {text!r}")
    return dt.name if dt.isnative else dt.str


def add_parser(sub):
    p = sub.add_parser(
        "make-dataset",
        help="write a synthetic ImageNet-like JPEG tree (or .npy arrays)",
        description="Write (or reuse) CLASSES x PER_CLASS synthetic files under DIR, one "
                    "directory per class, as fn.readers.file expects: baseline JPEGs (--format "
                    "jpeg, the default) or random .npy arrays of one shape and dtype (--format "
                    "npy, for fn.readers.numpy). Deterministic for a given --seed; a complete "
                    "tree made with the same parameters is reused.")
    p.add_argument("dir", metavar="DIR", help="dataset root (absent, empty, or made by fastread)")
    p.add_argument("--format", choices=("jpeg", "npy") + _RECORD_FORMATS, default="jpeg",
                   help="file format (default: jpeg); cifar10: the CIFAR-10 batch files "
                        "(binary and pickle layouts)")
    p.add_argument("--classes", type=positive_int, default=None, metavar="N",
                   help="number of class directories (required for jpeg and npy)")
    p.add_argument("--per-class", type=positive_int, default=None, metavar="M",
                   help="files per class (required for jpeg and npy); cifar10: train images "
                        "per class (default 5000, the real set's; test gets a fifth)")
    p.add_argument("--seed", type=nonnegative_int, default=0, metavar="S",
                   help="random seed (default: 0)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="W",
                   help="generator processes (jpeg), writer threads (npy) or shard writer processes "
                        "(squirrel) (default: one per CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--upload", default=None, metavar="s3://BUCKET/PREFIX",
                   help="then upload the dataset's files under this prefix (fastread upload)")
    add_s3_options(p)
    g = p.add_argument_group("--format jpeg")
    g.add_argument("--mean-kb", type=positive_float, default=None, metavar="KB",
                   help="target mean file size in KB of 1000 bytes (default: 92)")
    g.add_argument("--width", type=positive_int, default=None, help="nominal width (default: 500)")
    g.add_argument("--height", type=positive_int, default=None, help="nominal height (default: 375)")
    g = p.add_argument_group("--format webdataset")
    g.add_argument("--shards", type=positive_int, default=None, metavar="S",
                   help="tar shards (default: 10); --width/--height size the JPEGs "
                        "(default 160x120)")
    g.add_argument("--per-shard", type=positive_int, default=None, metavar="N",
                   help="samples (jpg, cls, json) per shard (default: 1000)")
    g.add_argument("--compress", action="store_true", help="write .tar.gz shards")
    g = p.add_argument_group("--format squirrel",
                             "a squirrel-core MessagePack store: --shards S x --per-shard N "
                             "samples {image: uint8 --shape (default 3,300,300), label} "
                             "(default 10 x 1000, the Squirrel + DALI tutorial's Imagenette)")
    g = p.add_argument_group("--format npy")
    g.add_argument("--shape", type=shape_arg, default=None, metavar="D0,D1,...",
                   help="array shape (default: 3,224,224)")
    g.add_argument("--dtype", type=dtype_arg, default=None, metavar="DTYPE",
                   help="array dtype: bool, integer or float, e.g. uint8, float32, >f4 "
                        "(default: uint8)")
    g.add_argument("--array-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="instead of --shape: 1-D arrays of exactly SIZE bytes of data "
                        "(each file SIZE + a 128-byte header), e.g. 4MiB (1024s) or 4MB "
                        "(1000s); a multiple of the dtype's itemsize")
    p.set_defaults(run=run, _parser=p)
    return p


def _check_format_options(args):
    """Fills in per-format defaults; a usage error for the other format's options."""
    if args.format in _RECORD_FORMATS:
        given = [f"--{d.replace('_', '-')}" for d in list(_JPEG_ONLY) + list(_NPY_ONLY)
                 if getattr(args, d) is not None and d not in _SHARED_WITH.get(args.format, ())]
        if args.format == "cifar10":
            given += [f"--{d.replace('_', '-')}" for d in ("shards", "per_shard")
                      if getattr(args, d) is not None]
        if args.format != "webdataset" and args.compress:
            given.append("--compress")
        if args.format == "cifar10" and args.classes not in (None, 10):
            given.append("--classes (CIFAR-10 has 10)")
        if given:
            args._parser.error(f"{', '.join(given)} do not apply to --format {args.format}")
        return
    for dest in ("classes", "per_class"):
        if getattr(args, dest) is None:
            args._parser.error(f"--{dest.replace('_', '-')} is required for --format {args.format}")
    mine, other = (_JPEG_ONLY, _NPY_ONLY) if args.format == "jpeg" else (_NPY_ONLY, _JPEG_ONLY)
    other_format = "npy" if args.format == "jpeg" else "jpeg"
    for dest in other:
        if getattr(args, dest) is not None:
            args._parser.error(f"--{dest.replace('_', '-')} applies to --format {other_format} "
                               f"only, not {args.format}")
    for dest, default in mine.items():
        if getattr(args, dest) is None and not (dest == "shape" and args.array_bytes is not None):
            setattr(args, dest, default)
    if args.format == "npy" and args.array_bytes is not None:
        import numpy as np

        if args.shape is not None:
            args._parser.error("give --shape or --array-bytes, not both")
        itemsize = np.dtype(args.dtype).itemsize
        if args.array_bytes % itemsize:
            args._parser.error(f"--array-bytes {args.array_bytes} is not a multiple of the "
                               f"{itemsize}-byte itemsize of --dtype {args.dtype}")
        args.shape_from_bytes = (args.array_bytes // itemsize,)


def run(args):
    if args.upload is not None and not args.upload.startswith("s3://"):
        args._parser.error(f"--upload must be an s3:// URL, got {args.upload!r}")
    status = _make(args)
    if status == 0 and args.upload is not None:
        # The tree as made (its class directories, shards or arrays under
        # the prefix), so a bucket reads back as the directory does.
        status = upload("make-dataset", [args.dir], args.upload, args)
    return status


def _make(args):
    from fastread.datasets import MARKER_NAME, make_imagenet_like, make_npy_dataset

    _check_format_options(args)
    marker = os.path.join(os.path.abspath(args.dir), MARKER_NAME)
    before = _mtime(marker)
    what = ""
    try:
        if args.format in _RECORD_FORMATS:
            return _run_record_format(args, marker, before)
        if args.format == "jpeg":
            info = make_imagenet_like(args.dir, classes=args.classes, per_class=args.per_class,
                                      seed=args.seed, mean_kb=args.mean_kb, width=args.width,
                                      height=args.height, workers=args.workers,
                                      progress=not args.quiet)
        else:
            info = make_npy_dataset(args.dir, classes=args.classes, per_class=args.per_class,
                                    shape=args.shape, nbytes=args.array_bytes, dtype=args.dtype,
                                    seed=args.seed, workers=args.workers,
                                    progress=not args.quiet)
            shape = args.shape if args.array_bytes is None else args.shape_from_bytes
            what = f", arrays of shape {shape} {args.dtype}"
    except (ValueError, OSError) as e:  # FileExistsError, permissions, bad sizes
        print(f"fastread make-dataset: error: {e}", file=sys.stderr)
        return 1
    reused = before is not None and _mtime(marker) == before
    print(f"{info.root}: {info.files} files in {info.classes} classes, "
          f"{info.total_bytes / 1e9:.3f} GB total, mean {info.mean_bytes / 1e3:.1f} KB"
          f"{what}{' (reused)' if reused else ''}")
    return 0


def _run_record_format(args, marker, before):
    from fastread.datasets.cifar10 import make_cifar10
    from fastread.datasets.webdataset import make_webdataset

    if args.format == "squirrel":
        from fastread.datasets.squirrel import make_squirrel
        shards = 10 if args.shards is None else args.shards
        per_shard = 1000 if args.per_shard is None else args.per_shard
        info = make_squirrel(args.dir, samples=shards * per_shard, per_shard=per_shard,
                             shape=args.shape or (3, 300, 300),
                             classes=10 if args.classes is None else args.classes,
                             seed=args.seed, progress=not args.quiet, workers=args.workers)
        reused = before is not None and _mtime(marker) == before
        print(f"{info.root}: Squirrel store, {info.files} samples in {shards} shards, "
              f"{info.total_bytes / 1e9:.3f} GB{' (reused)' if reused else ''}")
        return 0
    if args.format == "webdataset":
        shards = 10 if args.shards is None else args.shards
        per_shard = 1000 if args.per_shard is None else args.per_shard
        info = make_webdataset(args.dir, shards=shards, per_shard=per_shard,
                               classes=10 if args.classes is None else args.classes,
                               width=args.width or 160, height=args.height or 120,
                               compress=args.compress, seed=args.seed, progress=not args.quiet)
        reused = before is not None and _mtime(marker) == before
        print(f"{info.root}: WebDataset, {info.files} samples in {shards} shards "
              f"({'.tar.gz' if args.compress else '.tar'}), {info.total_bytes / 1e9:.3f} GB"
              f"{' (reused)' if reused else ''}")
        return 0

    per_class = 5000 if args.per_class is None else args.per_class
    info = make_cifar10(args.dir, train_per_class=per_class,
                        test_per_class=max(1, per_class // 5), seed=args.seed,
                        progress=not args.quiet)
    reused = before is not None and _mtime(marker) == before
    print(f"{info.root}: CIFAR-10, {info.files} images (train {per_class * 10}, test "
          f"{max(1, per_class // 5) * 10}) in cifar-10-batches-bin and cifar-10-batches-py, "
          f"{info.total_bytes / 1e9:.3f} GB{' (reused)' if reused else ''}")
    return 0


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
