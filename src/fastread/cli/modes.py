"""The modes of ``fastread bench``, as one data-driven table.

A mode is a way of getting batches of encoded samples out of a dataset tree:

===================  ==========================================================
``dali``             DALI's own C++ reader, ``fn.readers.file``
``python-file``      DALI ``fn.external_source`` over the seed's Python
                     :class:`~fastread.cli.baselines.FileInputIterator`
``fastread-<e>``     DALI with ``fastread.dali.readers.file(engine=<e>)``
``read_files-<e>``   :class:`fastread.Reader` with engine ``<e>``, no DALI
                     (the native ceiling)
``python-loop``      ``np.fromfile`` per sample in a Python loop, no DALI
``xnvme-ctypes``     the seed's per-file xNVMe loop through the PyPI ``xnvme``
                     ctypes bindings (open, pread, close per sample), no DALI
``xnvme-file``       DALI + fastread's ``xnvme-file`` engine
``fastread-gpu-<e>`` DALI with ``readers.file(engine=<e>, device="gpu")``:
                     batches uploaded natively from pinned arenas (or read
                     into GPU memory by ``cufile``); ``--device gpu`` only
``xnvme-gds``        fastread.Reader over the packed image with the ``xnvme``
                     range engine (queues on one device/image), into host
                     memory (``--mem cpu``) or on to the GPU (``--mem gpu``:
                     pinned arena, one copy per batch)
``xnvme-bam``        not built in this version
===================  ==========================================================

``fastread-<e>`` and ``read_files-<e>`` exist for every engine that
:func:`fastread.engines` lists (available or not), so a new engine added to
``fastread.engine.KNOWN_ENGINES`` gets its modes without changes here.
Modes named after an I/O stack rather than an engine go in STACK_MODES.

Every mode builds a *runner* whose ``next()`` returns ``(samples, bytes)``
for one batch, crossing epoch boundaries by itself, and keeps the previous
batch referenced until the next call, as a training step would.
"""
import dataclasses
import math
import os

import numpy as np


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    #: one of KINDS
    kind: str
    #: the fastread engine it reads with, if any
    engine: str = None
    #: needs a CUDA device even with --device cpu (data lands in GPU memory)
    gpu_only: bool = False
    help: str = ""

    @property
    def uses_dali(self):
        return self.kind in DALI_KINDS


DALI_KINDS = ("dali", "python-file", "fastread-dali", "fastread-dali-gpu")
DALI_KINDS = DALI_KINDS + ("memory",)
KINDS = DALI_KINDS + ("read_files", "python-loop", "xnvme-ctypes", "xnvme-gds")

#: Modes named after an I/O stack. ``engine`` is the fastread engine each
#: needs; while fastread.engines() does not list it the mode reports
#: "engine not built in this version".
STACK_MODES = (
    Mode("xnvme-file", "fastread-dali", engine="xnvme-file",
         help="DALI + fastread over xNVMe's file backend"),
    Mode("xnvme-gds", "xnvme-gds", engine="xnvme",
         help="fastread.Reader over the packed image with the xnvme range engine; --mem gpu "
              "copies each batch from the pinned arena to the GPU"),
    Mode("xnvme-ctypes", "xnvme-ctypes",
         help="the seed's per-file loop through xNVMe's ctypes bindings (pip install xnvme)"),
    Mode("xnvme-bam", "fastread-dali", engine="xnvme-bam", gpu_only=True,
         help="DALI + fastread over xNVMe's BaM backend (GPU-initiated I/O)"),
)

NOT_BUILT = "engine not built in this version"

#: xNVMe async engines that get a read_files-xnvme-file-<async> mode.
XNVME_ASYNC = ("io_uring", "posix", "thrpool", "emu")


def all_modes(engine_status):
    """Every mode, in display order, for ``engine_status`` =
    :func:`fastread.engines` (name -> True or why not)."""
    modes = [
        Mode("dali", "dali", help="DALI's fn.readers.file (C++ reader)"),
        Mode("python-file", "python-file",
             help="DALI external_source over the seed's Python FileInputIterator"),
    ]
    modes += [Mode(f"fastread-{e}", "fastread-dali", engine=e,
                   help=f"DALI + fastread.dali.readers.file(engine={e!r})")
              for e in engine_status]
    modes += [Mode(f"fastread-gpu-{e}", "fastread-dali-gpu", engine=e,
                   help=f"DALI + fastread.dali.readers.file(engine={e!r}, device='gpu')")
              for e in engine_status]
    modes += [Mode(f"read_files-{e}", "read_files", engine=e,
                   help=f"fastread.Reader(engine={e!r}) without DALI")
              for e in engine_status]
    if "xnvme-file" in engine_status:
        # The same engine with each of xNVMe's async engines (--engine-option
        # engine_args=... is kept; these add async=...).
        modes += [Mode(f"read_files-xnvme-file-{a}", "read_files", engine="xnvme-file",
                       help=f"fastread.Reader(engine='xnvme-file', xnvme_async={a!r})")
                  for a in XNVME_ASYNC]
    modes.append(Mode("python-loop", "python-loop", help="np.fromfile per sample, no DALI"))
    modes.append(Mode("memory", "memory",
                      help="DALI external_source cycling over the first batches, already in "
                           "memory: no I/O (with --decode, the decode-only ceiling)"))
    from fastread.cli import image_modes
    modes += image_modes.all_modes(engine_status)
    from fastread.cli import numpy_modes
    modes += numpy_modes.all_modes(engine_status)
    names = {m.name for m in modes}
    modes += [m for m in STACK_MODES if m.name not in names]
    return modes


@dataclasses.dataclass
class Environment:
    """What the modes need to know about this machine."""
    engines: dict            # fastread.engines()
    dali_error: str = None   # why DALI cannot be used, or None
    fastread_dali_error: str = None
    _cuda: list = None

    @property
    def cuda_error(self):
        """Why there is no CUDA device, or None (probed on first use)."""
        if self._cuda is None:
            from fastread.cli import _env
            devices, _why = _env.cuda_devices(quick=True)
            self._cuda = [None if devices else "none found here (`fastread info` says why)"]
        return self._cuda[0]


def probe_environment(engines):
    """Imports what the modes need; never raises."""
    from fastread.cli import _env

    env = Environment(engines=dict(engines))
    mod, why = _env.try_import("nvidia.dali")
    if mod is None:
        env.dali_error = f"DALI {why} (pip install nvidia-dali-cuda120)"
    mod, why = _env.try_import("fastread.dali")
    if mod is None:
        env.fastread_dali_error = f"fastread.dali {why}"
    return env


def range_engine_ok(env, engine):
    from fastread.engine import RANGE_ONLY

    status = env.engines.get(engine, NOT_BUILT)
    if status is True or (engine in RANGE_ONLY and str(status).startswith(RANGE_ONLY[engine])):
        return None
    return str(status) if engine in env.engines else NOT_BUILT


def unavailable(mode, env, *, device="cpu", decode=False, mem=None, cfg=None):
    """Why ``mode`` cannot run here with these settings, or None. ``mem``
    (cpu or gpu) is where xnvme-gds reads land; ``cfg`` lets image-based
    modes check for their image."""
    from fastread.cli import image_modes, numpy_modes
    if mode.kind in numpy_modes.KINDS:
        return numpy_modes.unavailable(mode, env, device=device, decode=decode)
    if mode.kind in image_modes.KINDS:
        return image_modes.unavailable(mode, env, device=device, decode=decode, cfg=cfg)
    if mode.kind == "xnvme-gds":
        if mem is None:
            return ("say where its reads land: --mem cpu (host memory) or --mem gpu (on to the "
                    "GPU, one copy per batch from the pinned arena)")
        why = range_engine_ok(env, mode.engine)
        if why:
            return why
        if mem == "gpu" and env.cuda_error:
            return f"--mem gpu needs a CUDA device; {env.cuda_error}"
        if decode:
            return "does not decode; --decode applies to DALI modes"
        if cfg is not None:
            from fastread.cli import image_modes
            path = image_modes.image_path(cfg)
            if not os.path.exists(path):
                return (f"no packed image at {path} (run `fastread pack {cfg.data_dir} {path}` "
                        "or set FASTREAD_BENCH_IMAGE)")
        return None
    if mode.kind == "xnvme-ctypes":
        from fastread.cli.baselines import xnvme_ctypes_error
        why = xnvme_ctypes_error()
        if why:
            return why
        if device == "gpu":
            return "reads into host memory only; --device gpu applies to DALI modes"
        if decode:
            return "does not decode; --decode applies to DALI modes"
        return None
    if mode.engine is not None:
        status = env.engines.get(mode.engine, NOT_BUILT)
        if status is not True:
            return str(status) if mode.engine in env.engines else NOT_BUILT
    if mode.uses_dali:
        if env.dali_error:
            return env.dali_error
        if mode.kind.startswith("fastread-dali") and env.fastread_dali_error:
            return env.fastread_dali_error
        if mode.kind == "fastread-dali-gpu":
            if device != "gpu":
                return "GPU output: run it with --device gpu"
            if decode:
                return ("GPU output cannot feed the mixed decoder (it takes host input): "
                        "use fastread-<engine> with --decode")
    elif device == "gpu" and mode.kind != "read_files":
        return "reads into host memory only; --device gpu applies to DALI and read_files modes"
    elif decode:
        return "does not decode; --decode applies to DALI modes"
    if (device == "gpu" or mode.gpu_only) and env.cuda_error:
        what = "--device gpu" if device == "gpu" else "this mode"
        return f"{what} needs a CUDA device; {env.cuda_error}"
    return None


@dataclasses.dataclass
class Config:
    data_dir: str
    paths: list
    labels: np.ndarray
    batch_size: int = 64
    threads: int = 4
    device: str = "cpu"
    decode: bool = False
    prefetch_queue_depth: int = 2
    engine_options: dict = dataclasses.field(default_factory=dict)
    #: where xnvme-gds reads land: "cpu" (host memory) or "gpu" (device memory)
    mem: str = "cpu"

    @property
    def epoch_batches(self):
        return math.ceil(len(self.paths) / self.batch_size)


def build(mode, cfg):
    """A runner for one timed run of ``mode``."""
    from fastread.cli import image_modes
    if mode.kind in image_modes.KINDS:
        return image_modes.build(mode, cfg)
    if mode.kind == "dali":
        def reader():
            from nvidia.dali import fn
            return fn.readers.file(file_root=cfg.data_dir, random_shuffle=False, name="Reader")
        return DaliRunner(cfg, reader)
    if mode.kind == "python-file":
        def reader():
            from nvidia.dali import fn
            from fastread.cli.baselines import FileInputIterator
            it = FileInputIterator(batch_size=cfg.batch_size, paths=cfg.paths, labels=cfg.labels)
            return fn.external_source(source=it, num_outputs=2, batch=True)
        return DaliRunner(cfg, reader)
    if mode.kind in ("fastread-dali", "fastread-dali-gpu"):
        out = "gpu" if mode.kind == "fastread-dali-gpu" else "cpu"

        def reader():
            from fastread.dali import readers
            # fastread-<e>: CPU output and data.gpu(), as a DALI user writes
            # it (pinned arenas when the pipeline has a GPU).
            return readers.file(file_root=cfg.data_dir, engine=mode.engine, random_shuffle=False,
                                name="Reader", device=out, **cfg.engine_options)
        return DaliRunner(cfg, reader)
    if mode.kind == "read_files":
        opts = {}
        prefix = "read_files-xnvme-file-"
        if mode.name.startswith(prefix):
            opts["xnvme_async"] = mode.name[len(prefix):]
        import fastread
        return ReaderRunner(fastread.Reader(cfg.data_dir, batch_size=cfg.batch_size,
                                            engine=mode.engine, device=cfg.device,
                                            **cfg.engine_options, **opts))
    if mode.kind == "xnvme-ctypes":
        return LoopRunner(cfg, "xnvme_ctypes_loop")
    if mode.kind == "xnvme-gds":
        from fastread.cli import image_modes
        return image_modes.image_reader_runner(cfg, mode.engine, device=cfg.mem)
    from fastread.cli import numpy_modes
    if mode.kind in numpy_modes.KINDS:
        return numpy_modes.build(mode, cfg)
    if mode.kind == "python-loop":
        return LoopRunner(cfg, "python_loop")
    if mode.kind == "memory":
        return DaliRunner(cfg, _memory_source(cfg))
    raise ValueError(f"mode {mode.name}: unknown kind {mode.kind!r}")


#: Batches the memory mode holds (it cycles over them).
MEMORY_BATCHES = 32


def _memory_source(cfg):
    """A reader() feeding DALI the dataset's first batches from memory."""
    import fastread

    n = min(len(cfg.paths), MEMORY_BATCHES * cfg.batch_size)
    arrays = [a.copy() for a in fastread.read_files(cfg.paths[:n])]
    labels = np.asarray(cfg.labels[:n], dtype=np.int32).reshape(-1, 1)
    bs = cfg.batch_size
    batches = [(arrays[i:i + bs], labels[i:i + bs]) for i in range(0, n - bs + 1, bs)]

    def cycle():
        while True:
            yield from batches

    def reader():
        from nvidia.dali import fn
        # The arrays never change, so DALI may use them in place.
        return fn.external_source(source=cycle(), num_outputs=2, batch=True, no_copy=True)
    return reader


class DaliRunner:
    """Iterates a DALI pipeline with ``pipe.run()``; an epoch that ends with
    StopIteration (external sources) is followed by ``pipe.reset()``."""

    def __init__(self, cfg, reader, outputs=None):
        """``outputs``: the pipeline's body, if not ``reader``'s (data, labels)
        with optional decoding and upload."""
        from nvidia.dali import fn, pipeline_def

        gpu = cfg.device == "gpu"
        decode = cfg.decode and outputs is None

        @pipeline_def
        def pipeline():
            if outputs is not None:
                return outputs()
            data, labels = reader()
            if decode:
                # Encoded sizes come along as a small CPU output (for GB/s).
                sizes = data.shape()
                images = fn.decoders.image(data, device="mixed" if gpu else "cpu")
                return images, labels, sizes
            return (data.gpu() if gpu else data), labels

        self.decode = decode
        self.pipe = pipeline(batch_size=cfg.batch_size, num_threads=cfg.threads,
                             device_id=0 if gpu else None,
                             prefetch_queue_depth=cfg.prefetch_queue_depth)
        self.pipe.build()
        self._keep = None
        self.epochs_ended = 0

    def next(self):
        for _ in range(2):
            try:
                out = self.pipe.run()
            except StopIteration:
                self.epochs_ended += 1
                self.pipe.reset()
                continue
            self._keep = out  # the previous batch is released only now
            return self._count(out)
        raise RuntimeError("the pipeline ended an epoch without a single batch after "
                           "pipe.reset() (does its source restart on reset?)")

    def _count(self, out):
        samples = len(out[1])
        if self.decode:
            nbytes = int(np.asarray(out[2].as_array()).sum())
        else:
            nbytes = sum(math.prod(s) for s in out[0].shape())
        return samples, nbytes

    def close(self):
        self._keep = None
        pipe, self.pipe = self.pipe, None
        # fastread readers hold threads, pinned memory and descriptors: free
        # them now, not whenever the pipeline's reference cycles are collected
        # (a failed mode's leftovers exhausted the next modes' descriptors).
        for reader in getattr(pipe, "_fastread_readers", []):
            reader.close()
        del pipe


class _EpochRunner:
    """Batches from new_epoch() (an iterator of (arrays, labels)), epoch after
    epoch; the last batch is kept alive until the next one."""

    def __init__(self):
        self._it = self.new_epoch()
        self._keep = None

    def new_epoch(self):
        raise NotImplementedError

    def next(self):
        try:
            arrays, labels = next(self._it)
        except StopIteration:
            self._it = self.new_epoch()
            arrays, labels = next(self._it)
        self._keep = arrays
        return len(arrays), sum(a.nbytes for a in arrays)

    def close(self):
        self._keep = None
        self._it = None


class ReaderRunner(_EpochRunner):
    """A fastread.Reader (over files or a packed image) iterated directly,
    epoch after epoch; closed with the runner."""

    def __init__(self, reader):
        self.reader = reader
        super().__init__()

    def new_epoch(self):
        return iter(self.reader)

    def close(self):
        super().close()
        self.reader.close()


class LoopRunner(_EpochRunner):
    """A baseline loop from fastread.cli.baselines (the seed's np.fromfile
    loop, or its per-file xNVMe ctypes loop), epoch after epoch."""

    def __init__(self, cfg, loop_name):
        from fastread.cli import baselines

        self.cfg = cfg
        self.loop = getattr(baselines, loop_name)
        super().__init__()

    def new_epoch(self):
        return self.loop(self.cfg.paths, self.cfg.labels, self.cfg.batch_size)
