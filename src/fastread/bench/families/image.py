"""Modes over a packed image (``fastread pack``): block-level range reads.

===========================  ================================================
``image-<e>``                :class:`fastread.Reader` over the packed image,
                             engine ``<e>``, no DALI
``image-dali-<e>``           DALI with ``fastread.dali.readers.image``
``ceiling-<e>``              the disk's ceiling with engine ``<e>``: the whole
                             image read front to back in 1 MiB O_DIRECT
                             pieces, many in flight (``queue_depth``,
                             ``workers``), no sample boundaries
===========================  ================================================

They run on a packed image given as DATA, or on a file tree whose packed
image is found beside it (``--image``, ``$FASTREAD_BENCH_IMAGE``, else
``DATA.img``: what ``fastread pack DATA DATA.img`` writes; its samples must
be those of the tree, checked by count). Image modes read with ``O_DIRECT``
unless ``--engine-option o_direct=0``. A ceiling's img/s is its GB/s over the
data set's mean sample size: the samples per second the disk could deliver;
the table then shows every mode's share of it.
"""
import os

from fastread.bench.registry import Mode, default_engine
from fastread.bench.runners import DaliRunner, ReaderRunner

NAME = "image"
ORDER = 20


def modes(env):
    auto = default_engine(env)
    for e in env.engines:
        yield Mode(f"image-{e}", NAME, "image", f"fastread.Reader(image=..., engine={e!r})",
                   f"fastread.Reader over the packed image (engine {e!r}, O_DIRECT), no DALI",
                   engine=e, check=_check, build=_build_reader,
                   default=("cpu", "gpu") if e == auto else ())
    for e in env.engines:
        yield Mode(f"image-dali-{e}", NAME, "image", f"readers.image(engine={e!r})",
                   f"DALI + fastread.dali.readers.image(engine={e!r}, O_DIRECT)",
                   engine=e, check=_check_dali, dali=True, build=_build_dali,
                   default=("cpu", "gpu") if e == auto else ())
    for e in env.engines:
        yield Mode(f"ceiling-{e}", NAME, "image", f"1 MiB O_DIRECT pieces (engine {e!r})",
                   f"the disk's ceiling: the packed image read sequentially in 1 MiB "
                   f"O_DIRECT pieces (engine {e!r})",
                   engine=e, check=_check_ceiling, build=_build_ceiling, role="reference",
                   default=("cpu", "gpu") if e == auto else (), params=(("ceiling", True),))


def _check(mode, cfg):
    why = cfg.env.range_engine_error(mode.engine)  # range-only engines (xnvme) serve images
    if why:
        return why
    if cfg.decode:
        return "does not decode; --decode applies to DALI modes"
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_dali(mode, cfg):
    why = (cfg.env.range_engine_error(mode.engine)
           or cfg.env.dali_error_for(fastread_reader=True))
    if why:
        return why
    if cfg.device == "gpu":
        if cfg.decode:
            return "GPU output cannot feed the mixed decoder; drop --decode"
        if cfg.env.cuda_error:
            return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_ceiling(mode, cfg):
    why = cfg.env.range_engine_error(mode.engine)
    if why:
        return why
    return "does not decode; --decode applies to DALI modes" if cfg.decode else None


def options(cfg):
    """Engine options of the image modes: O_DIRECT unless told otherwise."""
    opts = dict(cfg.engine_options)
    opts.setdefault("o_direct", True)
    return opts


def open_image(cfg):
    import fastread

    img = fastread.PackedImage(cfg.image)
    if cfg.paths is not None and len(img) != len(cfg.paths):
        raise ValueError(f"packed image {img.path} holds {len(img)} samples, {cfg.data_dir} "
                         f"{len(cfg.paths)}: pack it again")
    return img


def image_reader_runner(cfg, engine, device=None):
    """fastread.Reader over the packed image, epoch after epoch."""
    import fastread

    return ReaderRunner(fastread.Reader(image=open_image(cfg), batch_size=cfg.batch_size,
                                        engine=engine, device=device or cfg.device,
                                        **options(cfg)))


def _build_reader(mode, cfg):
    return image_reader_runner(cfg, mode.engine)


def _build_dali(mode, cfg):
    img = open_image(cfg)

    def reader():
        from fastread.dali import readers
        return readers.image(image=img, engine=mode.engine, random_shuffle=False,
                             name="Reader", device=cfg.device, **options(cfg))
    return DaliRunner(cfg, reader)


class CeilingRunner:
    """The packed image read front to back in fixed pieces, as fast as the
    engine goes: batches of PIECES_PER_BATCH pieces are kept queued on the
    native reader (``prefetch`` + ``workers`` of them), so the disk never
    waits for Python. Wraps around at the end of the image."""

    PIECE = 1 << 20
    PIECES_PER_BATCH = 32

    def __init__(self, cfg, engine):
        import numpy as np

        import fastread
        from fastread import _defaults
        from fastread.engine import options as engine_options

        img = open_image(cfg)
        self.mean_sample = max(1.0, float(np.mean(img.lengths))) if len(img) else 1.0
        size = os.path.getsize(img.path)
        # An image under 1 MiB (a test's) is read as one aligned piece.
        self.piece = min(self.PIECE, size - size % 4096)
        if self.piece == 0:
            raise ValueError(f"{img.path}: under 4096 bytes, too small to measure a disk by")
        n = size // self.piece
        opts = options(cfg)
        workers = _defaults.reader_workers(opts.pop("workers", None))
        prefetch = opts.pop("prefetch", None) or _defaults.get("prefetch")
        self.native = fastread.NativeReader(
            None, engine, image=img.path, offsets=np.arange(n, dtype=np.int64) * self.piece,
            lengths=np.full(n, self.piece, dtype=np.int64), prefetch=prefetch, workers=workers,
            **engine_options(engine, **opts))
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


def _build_ceiling(mode, cfg):
    return CeilingRunner(cfg, mode.engine)
