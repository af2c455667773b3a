"""Modes over a tree of sample files (``fn.readers.file``'s datasets).

======================  ========================================================
``dali``                DALI's own C++ reader, ``fn.readers.file``: the baseline
``python-file``         DALI ``fn.external_source`` over the seed's Python
                        :class:`~fastread.bench.baselines.FileInputIterator`
                        (``np.fromfile`` per sample, the GIL held)
``fastread-<e>``        DALI with ``fastread.dali.readers.file(engine=<e>)``
``fastread-gpu-<e>``    the same with ``device="gpu"`` (``--device gpu``)
``reader-<e>``          :class:`fastread.Reader` with engine ``<e>``, no DALI
``reader-xnvme-file-<a>``  the same over xNVMe's file backend with its async
                        engine ``<a>``
``read_files-<e>``      the :func:`fastread.read_files` function on lists of
                        ``batch`` files, no read-ahead
``python-loop``         ``np.fromfile`` per sample in a Python loop, no DALI
``memory``              DALI ``external_source`` cycling over batches already
                        in memory: no I/O (with ``--decode``, decode-only)
======================  ========================================================

Engine modes exist for every engine :func:`fastread.engines` lists, so a new
engine gets its modes without changes here. The headline run is ``dali``,
``python-file``, ``fastread-<auto>`` (``fastread-gpu-<auto>`` with
``--device gpu``) and ``reader-<auto>``, where ``<auto>`` is the engine
``engine="auto"`` picks here.
"""
from fastread.bench.registry import Mode, default_engine
from fastread.bench.runners import DaliRunner, EpochRunner, LoopRunner, ReaderRunner

NAME = "files"
ORDER = 10

#: xNVMe async engines that get a reader-xnvme-file-<async> mode.
XNVME_ASYNC = ("io_uring", "posix", "thrpool", "emu")

BOTH = ("cpu", "gpu")


def modes(env):
    auto = default_engine(env)
    yield Mode("dali", NAME, "files", "fn.readers.file",
               "DALI's fn.readers.file (C++ reader): the baseline",
               check=_check_dali, dali=True, build=_build_dali, role="baseline", default=BOTH)
    yield Mode("python-file", NAME, "files", "external_source(np.fromfile loop)",
               "DALI external_source over the seed's Python iterator (np.fromfile per sample)",
               check=_check_dali, dali=True, build=_build_python_file, role="python", default=BOTH)
    for e in env.engines:
        yield Mode(f"fastread-{e}", NAME, "files", f"readers.file(engine={e!r})",
                   f"DALI + fastread.dali.readers.file(engine={e!r})",
                   engine=e, check=_check_fastread_dali, dali=True, build=_build_fastread_dali,
                   default=("cpu",) if e == auto else ())
    for e in env.engines:
        yield Mode(f"fastread-gpu-{e}", NAME, "files",
                   f"readers.file(engine={e!r}, device='gpu')",
                   f"DALI + fastread.dali.readers.file(engine={e!r}, device='gpu'): batches "
                   "land in GPU memory (--device gpu)",
                   engine=e, check=_check_fastread_dali_gpu, dali=True, build=_build_fastread_dali,
                   default=("gpu",) if e == auto else (), params=(("device", "gpu"),))
    for e in env.engines:
        yield Mode(f"reader-{e}", NAME, "files", f"fastread.Reader(engine={e!r})",
                   f"fastread.Reader(engine={e!r}) iterated directly, no DALI",
                   engine=e, check=_check_reader, build=_build_reader,
                   default=BOTH if e == auto else ())
    if "xnvme-file" in env.engines:
        for a in XNVME_ASYNC:
            yield Mode(f"reader-xnvme-file-{a}", NAME, "files",
                       f"fastread.Reader(engine='xnvme-file', xnvme_async={a!r})",
                       f"fastread.Reader over xNVMe's file backend with async engine {a!r}",
                       engine="xnvme-file", check=_check_reader, build=_build_reader,
                       params=(("xnvme_async", a),))
    for e in env.engines:
        yield Mode(f"read_files-{e}", NAME, "files", f"fastread.read_files(engine={e!r})",
                   f"the fastread.read_files() function on each batch's list of files "
                   f"(engine {e!r}), no read-ahead, no DALI",
                   engine=e, check=_check_read_files, build=_build_read_files)
    yield Mode("python-loop", NAME, "files", "np.fromfile loop",
               "np.fromfile per sample in a Python loop, no DALI",
               check=_check_host_loop, build=_build_python_loop, role="python")
    yield Mode("memory", NAME, "files", "external_source(batches in memory)",
               "DALI external_source cycling over the first batches, already in memory: "
               "no I/O (with --decode, the decode-only ceiling)",
               check=_check_dali, dali=True, build=_build_memory, role="reference")


# -- checks ---------------------------------------------------------------------------
def _cuda(cfg, what="--device gpu"):
    if cfg.env.cuda_error:
        return f"{what} needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_dali(mode, cfg):
    return cfg.env.dali_error_for() or (_cuda(cfg) if cfg.device == "gpu" else None)


def _check_fastread_dali(mode, cfg):
    return (cfg.env.engine_error(mode.engine) or cfg.env.dali_error_for(fastread_reader=True)
            or (_cuda(cfg) if cfg.device == "gpu" else None))


def _check_fastread_dali_gpu(mode, cfg):
    why = cfg.env.engine_error(mode.engine) or cfg.env.dali_error_for(fastread_reader=True)
    if why:
        return why
    if cfg.device != "gpu":
        return "GPU output: run it with --device gpu"
    if cfg.decode:
        return ("GPU output cannot feed the mixed decoder (it takes host input): "
                "use fastread-<engine> with --decode")
    return _cuda(cfg)


def _no_decode(cfg):
    return "does not decode; --decode applies to DALI modes" if cfg.decode else None


def _check_reader(mode, cfg):
    why = cfg.env.engine_error(mode.engine) or _no_decode(cfg)
    return why or (_cuda(cfg) if cfg.device == "gpu" else None)


def _host_only(cfg):
    if cfg.device == "gpu":
        return "reads into host memory only; --device gpu applies to DALI and reader modes"
    return None


def _check_read_files(mode, cfg):
    return cfg.env.engine_error(mode.engine) or _no_decode(cfg) or _host_only(cfg)


def _check_host_loop(mode, cfg):
    return _no_decode(cfg) or _host_only(cfg)


# -- builds ---------------------------------------------------------------------------
def _build_dali(mode, cfg):
    def reader():
        from nvidia.dali import fn
        return fn.readers.file(file_root=cfg.data_dir, random_shuffle=False, name="Reader")
    return DaliRunner(cfg, reader)


def _build_python_file(mode, cfg):
    def reader():
        from nvidia.dali import fn

        from fastread.bench.baselines import FileInputIterator
        it = FileInputIterator(batch_size=cfg.batch_size, paths=cfg.paths, labels=cfg.labels)
        return fn.external_source(source=it, num_outputs=2, batch=True)
    return DaliRunner(cfg, reader)


def _build_fastread_dali(mode, cfg):
    out = mode.param("device", "cpu")

    def reader():
        from fastread.dali import readers
        # fastread-<e>: CPU output and data.gpu() with --device gpu, as a DALI
        # user writes it (pinned arenas when the pipeline has a GPU).
        return readers.file(file_root=cfg.data_dir, engine=mode.engine, random_shuffle=False,
                            name="Reader", device=out, **cfg.engine_options)
    return DaliRunner(cfg, reader)


def _build_reader(mode, cfg):
    import fastread

    extra = {}
    if mode.param("xnvme_async"):
        extra["xnvme_async"] = mode.param("xnvme_async")
    return ReaderRunner(fastread.Reader(cfg.data_dir, batch_size=cfg.batch_size,
                                        engine=mode.engine, device=cfg.device,
                                        **cfg.engine_options, **extra))


class ReadFilesRunner(EpochRunner):
    """fastread.read_files() on each batch's list of paths, in order, one call
    per batch on the calling thread (Reader options such as workers do not
    apply)."""

    def __init__(self, cfg, engine):
        self.cfg, self.engine = cfg, engine
        self.options = cfg.engine_options_without("workers", "prefetch")
        super().__init__()

    def new_epoch(self):
        import fastread

        paths, bs = self.cfg.paths, self.cfg.batch_size
        for start in range(0, len(paths), bs):
            yield fastread.read_files(paths[start:start + bs], engine=self.engine,
                                      **self.options), None


def _build_read_files(mode, cfg):
    return ReadFilesRunner(cfg, mode.engine)


def _build_python_loop(mode, cfg):
    from fastread.bench.baselines import python_loop
    return LoopRunner(cfg, python_loop)


#: Batches the memory mode holds (it cycles over them).
MEMORY_BATCHES = 32


def _build_memory(mode, cfg):
    import numpy as np

    import fastread

    n = min(len(cfg.paths), MEMORY_BATCHES * cfg.batch_size)
    arrays = [a.copy() for a in fastread.read_files(cfg.paths[:n])]
    labels = np.asarray(cfg.labels[:n], dtype=np.int32).reshape(-1, 1)
    bs = cfg.batch_size
    batches = [(arrays[i:i + bs], labels[i:i + bs]) for i in range(0, n - bs + 1, bs)]
    if not batches:
        raise ValueError(f"the memory mode needs at least one full batch of {bs} samples; "
                         f"the dataset has {len(cfg.paths)}")

    def cycle():
        while True:
            yield from batches

    def reader():
        from nvidia.dali import fn
        # The arrays never change, so DALI may use them in place.
        return fn.external_source(source=cycle(), num_outputs=2, batch=True, no_copy=True)
    return DaliRunner(cfg, reader)
