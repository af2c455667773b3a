"""``fastread pack`` and ``fastread verify``: a dataset tree into one packed
image with aligned samples (:mod:`fastread.image`), and checking it."""
import os
import sys
import time

from fastread.cli._args import key_value, positive_int


def _engine_opts(args, parser):
    from fastread.engine import OPTION_NAMES

    opts = {}
    for key, value in args.engine_options:
        if key not in OPTION_NAMES:
            parser.error(f"--engine-option {key}={value}: unknown option {key!r}; "
                         f"valid options: {', '.join(OPTION_NAMES)}")
        opts[key] = value
    return opts


def _common(p):
    p.add_argument("--engine", default="auto", help="fastread engine (default: auto)")
    p.add_argument("--batch-size", type=positive_int, default=256, metavar="N",
                   help="samples per native read (default: 256)")
    p.add_argument("--engine-option", dest="engine_options", type=key_value, action="append",
                   default=[], metavar="KEY=VALUE",
                   help="engine option (repeatable), e.g. queue_depth=128, o_direct=1")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_parser(sub):
    p = sub.add_parser(
        "pack", help="pack a dataset tree into one image with aligned samples",
        description="Write the samples of FILE_ROOT (fastread.scan order and labels) into the "
                    "image OUT, each starting at a multiple of --alignment, plus an index "
                    "(OUT.index: name, label, offset, length, CRC-32). Atomic: written under a "
                    "temporary name and renamed when complete.")
    p.add_argument("file_root", metavar="FILE_ROOT",
                   help="dataset root, one directory per class; or a Parquet data set (a "
                        ".parquet file or a directory of them, e.g. data/train-*.parquet)")
    p.add_argument("--split", metavar="NAME",
                   help="Parquet data sets: pack the files of this split (train-*.parquet)")
    p.add_argument("out", metavar="OUT", help="image file to write (or, with --block-device, "
                                              "a block device to overwrite)")
    p.add_argument("--index", metavar="PATH", help="index file (default: OUT.index; required "
                                                    "with --block-device)")
    p.add_argument("--alignment", type=positive_int, default=4096, metavar="BYTES",
                   help="sample alignment, a power of two >= 512 (default: 4096)")
    p.add_argument("--block-device", action="store_true",
                   help="OUT is a block device: overwrite it (its data is lost)")
    p.add_argument("--index-format", choices=("auto", "json", "binary"), default="auto",
                   help="json: index versions 1/2, read by older fastread; binary: version 3, "
                        "memory-mapped columns (32 bytes a sample plus names); auto (default): "
                        "binary from 2^20 samples on")
    d = p.add_argument_group(
        "decoding once (--decode)",
        "Decode every image here (Pillow, a process per CPU; or DALI's nvImageCodec "
        "decoder, on the GPU where present: --decoder), resize it, optionally "
        "center-crop it, and store pixels (or a re-encoded JPEG): training then reads "
        "without decoding. docs/decoded.md says what this changes.")
    d.add_argument("--decode", action="store_true",
                   help="store decoded images instead of the files' bytes")
    size = d.add_mutually_exclusive_group()
    size.add_argument("--resize", type=positive_int, metavar="S",
                      help="shorter side to S pixels (aspect kept; up- or downscaled)")
    size.add_argument("--max-side", type=positive_int, metavar="M",
                      help="longer side at most M pixels (aspect kept; never enlarged)")
    d.add_argument("--crop", type=positive_int, metavar="S",
                   help="then a center crop of S x S (needs --resize >= S): one shape for all")
    d.add_argument("--encode", choices=("raw", "jpeg"), default="raw",
                   help="raw: uint8 HWC pixels (default); jpeg: re-encoded at --quality")
    d.add_argument("--quality", type=positive_int, default=90, metavar="Q",
                   help="JPEG quality 1..100 for --encode jpeg (default: 90)")
    d.add_argument("--skip-bad", action="store_true",
                   help="leave out files that cannot be decoded (listed here and in the "
                        "index) instead of failing")
    d.add_argument("--decode-workers", type=positive_int, metavar="N",
                   help="decoding processes (DALI: threads; default: one per CPU)")
    d.add_argument("--decoder", choices=("auto", "pillow", "dali"), default="auto",
                   help="auto (default): Pillow (with --decode-device gpu: DALI on the GPU); "
                        "dali: DALI's fn.decoders.image (nvImageCodec), --batch-size files per "
                        "pipeline run")
    d.add_argument("--decode-device", choices=("cpu", "gpu"), default=None,
                   help="where DALI decodes (gpu: device='mixed'); default: the GPU if "
                        "present. Pillow is CPU only")
    _common(p)
    p.set_defaults(run=run_pack, _parser=p)

    v = sub.add_parser(
        "verify", help="check every sample of a packed image against its checksum",
        description="Read every sample of the packed image OUT and compare its CRC-32 with the "
                    "index; names every bad sample. Exit status 1 if any is bad.")
    v.add_argument("out", metavar="OUT", help="packed image")
    v.add_argument("--index", metavar="PATH", help="index file (default: OUT.index)")
    _common(v)
    v.set_defaults(run=run_verify, _parser=v)
    return p


def run_pack(args):
    from fastread.image import pack

    opts = _engine_opts(args, args._parser)
    decode = {}
    if args.decode:
        decode = dict(decode=True, resize=args.resize, max_side=args.max_side, crop=args.crop,
                      encode=args.encode, quality=args.quality, skip_bad=args.skip_bad,
                      decode_workers=args.decode_workers, decoder=args.decoder,
                      decode_device=args.decode_device)
    else:
        given = [f"--{k.replace('_', '-')}" for k in ("resize", "max_side", "crop",
                                                      "decode_workers", "decode_device")
                 if getattr(args, k) is not None]
        given += ["--decoder"] if args.decoder != "auto" else []
        given += ["--skip-bad"] if args.skip_bad else []
        given += ["--encode/--quality"] if (args.encode, args.quality) != ("raw", 90) else []
        if given:
            args._parser.error(f"{', '.join(given)} apply only with --decode")
    t0 = time.perf_counter()
    try:
        img = pack(args.file_root, args.out, index=args.index, alignment=args.alignment,
                   block_device=args.block_device, batch_size=args.batch_size,
                   index_format=args.index_format, split=args.split,
                   engine=args.engine, progress=False if args.quiet else None, **decode,
                   **opts)
    except (OSError, ValueError, TypeError) as e:
        print(f"fastread pack: error: {e}", file=sys.stderr)
        return 1
    dt = time.perf_counter() - t0
    data = int(img.lengths.sum())
    print(f"{img.path}: {len(img)} samples, {data / 1e9:.3f} GB of data in "
          f"{img.image_size / 1e9:.3f} GB (alignment {img.alignment}), index "
          f"{img.index_path}; {dt:.1f} s, {data / 1e6 / max(dt, 1e-9):.0f} MB/s")
    if img.decoded:
        shape = img.sample_shape
        print(f"decoded ({img.encoding}): {len(img) / max(dt, 1e-9):.0f} images/s, "
              f"{data / max(len(img), 1):.0f} bytes per image, "
              + (f"shape {shape}" if shape else "shapes vary (no --crop)"))
        pre = img.preprocess or {}
        print(f"decoder: {pre.get('decoder')} ({pre.get('decoder_why')})")
        by_pillow = pre.get("decoded_by_pillow") or []
        if by_pillow:
            print(f"{len(by_pillow)} file(s) DALI could not decode were decoded by Pillow "
                  f"(index: preprocess['decoded_by_pillow']), e.g. {by_pillow[0]}")
        for name, why in img.skipped:
            print(f"SKIPPED {name}: {why}")
        if img.skipped:
            print(f"{len(img.skipped)} file(s) could not be decoded and were left out",
                  file=sys.stderr)
    return 0


def run_verify(args):
    from fastread.image import verify

    opts = _engine_opts(args, args._parser)
    try:
        bad = verify(args.out, index=args.index, batch_size=args.batch_size, engine=args.engine,
                     progress=False if args.quiet else None, **opts)
    except (OSError, ValueError, TypeError) as e:
        print(f"fastread verify: error: {e}", file=sys.stderr)
        return 1
    for name, why in bad:
        print(f"BAD {name}: {why}")
    if bad:
        print(f"{args.out}: {len(bad)} bad sample(s)", file=sys.stderr)
        return 1
    print(f"{os.fspath(args.out)}: all samples match their checksums")
    return 0
