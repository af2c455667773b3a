"""``fastread upload SRC... s3://bucket/prefix``: files and dataset trees (a
generated set, a packed image and its index, WebDataset shards) into a
bucket, in parallel with a progress bar (:func:`fastread.s3.upload`).

The bucket is reached with --endpoint-url / --region / --profile and the
AWS environment and files (credentials only from there: a secret on a
command line is visible to every user of the machine)."""
import sys

from fastread.cli._args import positive_int


def add_s3_options(p):
    """The S3 options the subcommands that write to a bucket take."""
    g = p.add_argument_group("S3 (credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                             "AWS_PROFILE or ~/.aws/credentials)")
    g.add_argument("--endpoint-url", default=None, metavar="URL",
                   help="S3 endpoint, e.g. http://127.0.0.1:8333 (default: AWS_ENDPOINT_URL, "
                        "else AWS)")
    g.add_argument("--region", default=None, help="region (default: AWS_REGION)")
    g.add_argument("--profile", default=None, help="profile of the AWS files")
    g.add_argument("--upload-workers", type=positive_int, default=16, metavar="N",
                   help="PUTs in flight (default: 16)")


def s3_options(args):
    return {k: v for k, v in (("endpoint_url", args.endpoint_url), ("region", args.region),
                              ("profile", args.profile)) if v is not None}


def upload(what, sources, dest, args):
    """Uploads; prints a summary line. Returns the exit status."""
    from fastread import s3

    try:
        done = s3.upload(sources, dest, workers=args.upload_workers,
                         progress=False if args.quiet else None, **s3_options(args))
    except (ValueError, OSError) as e:
        print(f"fastread {what}: error: {e}", file=sys.stderr)
        return 1
    total = sum(size for _, size in done)
    print(f"{dest}: {len(done)} objects, {total / 1e9:.3f} GB uploaded")
    return 0


def add_parser(sub):
    p = sub.add_parser(
        "upload", help="upload files or dataset trees to s3://bucket/prefix",
        description="Put files and directory trees into a bucket: a directory's files keep "
                    "their relative paths under the prefix (a class tree reads back as one), "
                    "a single file goes to DEST itself unless DEST ends with '/'.")
    p.add_argument("sources", nargs="+", metavar="SRC", help="file or directory")
    p.add_argument("dest", metavar="DEST", help="s3://bucket/prefix")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_s3_options(p)
    p.set_defaults(run=run, _parser=p)
    return p


def run(args):
    if not args.dest.startswith("s3://"):
        args._parser.error(f"DEST must be an s3:// URL, got {args.dest!r}")
    return upload("upload", args.sources, args.dest, args)
