"""Bench modes for block-level reads of a packed image (``fastread pack``).

===========================  ================================================
``image-<e>``                :class:`fastread.Reader` over the packed image,
                             engine ``<e>``, no DALI
``image-dali-<e>``           DALI with ``fastread.dali.readers.image``
``ceiling-<e>``              the disk's ceiling with engine ``<e>``: the whole
                             image read front to back in 1 MiB O_DIRECT
                             pieces, many in flight (``queue_depth``,
                             ``workers``), no sample boundaries
===========================  ================================================

Image modes read with ``O_DIRECT`` unless ``--engine-option o_direct=0``.
The image is ``cfg.image`` if the Config has one, else ``$FASTREAD_BENCH_IMAGE``,
else ``DATA_DIR.img`` (what ``fastread pack DATA_DIR DATA_DIR.img`` writes);
its samples must be those of DATA_DIR (checked by count). A ceiling's img/s
is its GB/s over the data set's mean sample size: the samples per second the
disk could deliver; `fastread bench` then shows every mode's share of it.

``python -m fastread.cli.image_modes`` runs these modes (and the file-level
baselines) over a queue-depth sweep on its own; ``--help`` says how.
"""
import argparse
import dataclasses
import os
import sys

from fastread.cli import modes as M

KINDS = ("image", "image-dali", "ceiling")


def all_modes(engine_status):
    """Image modes for every engine :func:`fastread.engines` lists."""
    out = [M.Mode(f"image-{e}", "image", engine=e,
                  help=f"fastread.Reader over the packed image (engine {e!r}, O_DIRECT)")
           for e in engine_status]
    out += [M.Mode(f"image-dali-{e}", "image-dali", engine=e,
                   help=f"DALI + fastread.dali.readers.image(engine={e!r}, O_DIRECT)")
            for e in engine_status]
    out += [M.Mode(f"ceiling-{e}", "ceiling", engine=e,
                   help=f"the disk's ceiling: the packed image read sequentially in 1 MiB "
                        f"O_DIRECT pieces (engine {e!r})")
            for e in engine_status]
    return out


def image_path(cfg):
    return (getattr(cfg, "image", None) or os.environ.get("FASTREAD_BENCH_IMAGE")
            or os.path.normpath(cfg.data_dir) + ".img")


def unavailable(mode, env, *, device="cpu", decode=False, cfg=None):
    """Why ``mode`` cannot run here, or None (``cfg`` also checks the image)."""
    why = M.range_engine_ok(env, mode.engine)  # range-only engines (xnvme) serve images
    if why:
        return why
    if mode.kind == "image-dali":
        if env.dali_error:
            return env.dali_error
        if env.fastread_dali_error:
            return env.fastread_dali_error
        if device == "gpu" and decode:
            return "GPU output cannot feed the mixed decoder; drop --decode"
    elif decode:
        return "does not decode; --decode applies to DALI modes"
    if device == "gpu" and mode.kind != "ceiling" and env.cuda_error:
        return f"--device gpu needs a CUDA device; {env.cuda_error}"
    if cfg is not None:
        path = image_path(cfg)
        if not os.path.exists(path):
            return (f"no packed image at {path} (run `fastread pack {cfg.data_dir} {path}` "
                    "or set FASTREAD_BENCH_IMAGE)")
    return None


def _options(cfg):
    opts = dict(cfg.engine_options)
    opts.setdefault("o_direct", True)
    return opts


def _image(cfg):
    import fastread

    img = fastread.PackedImage(image_path(cfg))
    if len(img) != len(cfg.paths):
        raise ValueError(f"packed image {img.path} holds {len(img)} samples, {cfg.data_dir} "
                         f"{len(cfg.paths)}: pack it again")
    return img


def image_reader_runner(cfg, engine, device=None):
    """fastread.Reader over the packed image, epoch after epoch."""
    import fastread

    return M.ReaderRunner(fastread.Reader(image=_image(cfg), batch_size=cfg.batch_size,
                                          engine=engine, device=device or cfg.device,
                                          **_options(cfg)))


class CeilingRunner:
    """The packed image read front to back in fixed pieces, as fast as the
    engine goes: batches of PIECES_PER_BATCH pieces are kept queued on the
    native reader (``prefetch`` + ``workers`` of them), so the disk never
    waits for Python. Wraps around at the end of the image."""

    PIECE = 1 << 20
    PIECES_PER_BATCH = 32

    def __init__(self, cfg, engine):
        import numpy as np

        from fastread import _core, _defaults
        from fastread.engine import options

        img = _image(cfg)
        self.mean_sample = max(1.0, float(np.mean(img.lengths))) if len(img) else 1.0
        size = os.path.getsize(img.path)
        # An image under 1 MiB (a test's) is read as one aligned piece.
        self.piece = min(self.PIECE, size - size % 4096)
        if self.piece == 0:
            raise ValueError(f"{img.path}: under 4096 bytes, too small to measure a disk by")
        n = size // self.piece
        opts = _options(cfg)
        workers = _defaults.reader_workers(opts.pop("workers", None))
        prefetch = opts.pop("prefetch", None) or _defaults.get("prefetch")
        self.native = _core.NativeReader(
            None, engine, image=img.path, offsets=np.arange(n, dtype=np.int64) * self.piece,
            lengths=np.full(n, self.piece, dtype=np.int64), prefetch=prefetch, workers=workers,
            **options(engine, **opts))
        self.pieces = n
        self.next_piece = 0
        for _ in range(prefetch + workers):
            self._submit()

    def _submit(self):
        import numpy as np

        k = min(self.PIECES_PER_BATCH, self.pieces)
        idx = (self.next_piece + np.arange(k, dtype=np.int64)) % self.pieces
        self.next_piece = int(idx[-1] + 1) % self.pieces
        self.native.submit(idx)

    def next(self):
        batch = self.native.next()
        failures = batch.failures()
        if failures:
            pos, err = failures[0]
            raise OSError(err, f"{self.native.path(int(batch.indices()[pos]))}: "
                               f"{os.strerror(err)} reading the image")
        nbytes = batch.nbytes
        batch.release()
        self._submit()
        return round(nbytes / self.mean_sample), nbytes

    def close(self):
        self.native.close()


def build(mode, cfg):
    """A runner for one timed run of an image mode."""
    if mode.kind == "ceiling":
        return CeilingRunner(cfg, mode.engine)
    if mode.kind == "image":
        return image_reader_runner(cfg, mode.engine)
    if mode.kind == "image-dali":
        img = _image(cfg)

        def reader():
            from fastread.dali import readers
            return readers.image(image=img, engine=mode.engine, random_shuffle=False,
                                 name="Reader", device=cfg.device, **_options(cfg))
        return M.DaliRunner(cfg, reader)
    raise ValueError(f"mode {mode.name}: not an image mode")


def _evict(paths):
    """Drops these files' pages from the page cache (dirty pages are synced first)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- standalone: a queue-depth sweep of image and file-level modes -----------------

def main(argv=None):
    import fastread
    from fastread.cli import bench as B
    from fastread.cli._args import key_value, positive_int

    p = argparse.ArgumentParser(
        prog="python -m fastread.cli.image_modes",
        description="Time block-level reads of a packed image against file-level modes, for "
                    "each queue depth (warm, or --cold: page cache dropped before each run).")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--image", help="packed image (default: DATA_DIR.img)")
    p.add_argument("--modes", default="image-io_uring,read_files-io_uring,dali",
                   help="comma-separated modes, image-* or any `fastread bench` mode")
    p.add_argument("--queue-depths", default="32,64,128", metavar="A,B,...",
                   help="queue depths to sweep (fastread modes; default: 32,64,128)")
    p.add_argument("--batchsize", dest="batch_size", type=positive_int, default=64)
    p.add_argument("--batches", type=positive_int, default=None,
                   help="timed batches per run (default: one epoch)")
    p.add_argument("--threads", type=positive_int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=positive_int, default=1)
    p.add_argument("--cold", action="store_true",
                   help="drop the whole page cache before each run (needs a quiet machine)")
    p.add_argument("--evict", action="store_true",
                   help="cold for this data only: evict the dataset's files and the image from "
                        "the page cache (posix_fadvise DONTNEED) before each run")
    p.add_argument("--engine-option", dest="engine_options", type=key_value, action="append",
                   default=[], metavar="KEY=VALUE")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)

    paths, labels = fastread.scan(args.data_dir)
    env = M.probe_environment(fastread.engines())
    table = {m.name: m for m in M.all_modes(env.engines) + all_modes(env.engines)}
    names = [n.strip() for n in args.modes.split(",") if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error(f"unknown modes {unknown}; valid: {', '.join(table)}")
    depths = [int(x) for x in args.queue_depths.split(",")]
    base = {"threads": args.threads}
    base.update(dict(args.engine_options))
    cold = B._Cold(args.cold)
    results = []
    epoch = -(-len(paths) // args.batch_size)
    batches = args.batches or epoch
    print(f"{args.data_dir}: {len(paths)} files; {batches} batches of {args.batch_size}"
          f"{', cold' if args.cold else ', evicted' if args.evict else ', warm'}", flush=True)
    for name in names:
        mode = table[name]
        sweep = depths if mode.engine else [None]
        for qd in sweep:
            opts = dict(base, **({"queue_depth": qd} if qd else {}))
            cfg = M.Config(data_dir=args.data_dir, paths=paths, labels=labels,
                           batch_size=args.batch_size, threads=args.threads,
                           engine_options=opts)
            if args.image:
                cfg = dataclasses.replace(cfg)
                cfg.image = args.image
            if mode.kind in KINDS:
                why = unavailable(mode, env, cfg=cfg)
            else:
                why = M.unavailable(mode, env)
            label = f"{name}" + (f" qd={qd}" if qd else "")
            if why:
                print(f"{label}: not available: {why}", flush=True)
                continue
            runs = []
            for _ in range(args.repeat):
                cold.drop()
                if args.evict:
                    _evict(paths + [args.image or image_path(cfg)])
                runner = build(mode, cfg) if mode.kind in KINDS else M.build(mode, cfg)
                try:
                    runs.append(B._timed_run(runner, warmup=args.warmup, batches=batches,
                                             epoch_batches=epoch, rss=False, progress=False,
                                             desc=label))
                finally:
                    runner.close()
            res = B._summarize(dataclasses.replace(mode, name=label), runs, False)
            results.append(res)
            print(f"{label}: {res['img_per_s']:,.0f} img/s, {res['gb_per_s']:.3f} GB/s",
                  flush=True)
    print()
    print(B.format_table(results))
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "cold": args.cold, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
