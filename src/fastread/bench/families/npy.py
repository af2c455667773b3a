"""Modes over a tree of ``.npy`` arrays (``fastread make-dataset --format
npy``), against DALI's own numpy reader.

===========================  ================================================
``numpy-dali``               DALI's ``fn.readers.numpy`` (with ``--device
                             gpu``: ``device="gpu"``, DALI's GDS reader): the
                             baseline
``numpy-dali-cpu``           DALI's ``fn.readers.numpy(device="cpu")``, then
                             ``.gpu()`` with ``--device gpu`` (where cuFile
                             cannot run)
``numpy-fastread-<e>``       ``fastread.dali.readers.numpy(engine=<e>)``, on
                             the same device
===========================  ================================================

The tree is indexed as ``fn.readers.numpy`` indexes it.
"""
from fastread.bench.registry import Mode, default_engine
from fastread.bench.runners import DaliRunner

NAME = "npy"
ORDER = 30
BOTH = ("cpu", "gpu")


def modes(env):
    auto = default_engine(env)
    yield Mode("numpy-dali", NAME, "npy", "fn.readers.numpy",
               "DALI's fn.readers.numpy (device='gpu' with --device gpu: GDS): the baseline",
               check=_check, dali=True, build=_build_dali, role="baseline", default=BOTH)
    yield Mode("numpy-dali-cpu", NAME, "npy", "fn.readers.numpy(device='cpu')",
               "DALI's fn.readers.numpy on the CPU, then .gpu() with --device gpu",
               check=_check, dali=True, build=_build_dali, role="baseline", default=("gpu",),
               params=(("cpu_reader", True),))
    for e in env.engines:
        yield Mode(f"numpy-fastread-{e}", NAME, "npy", f"readers.numpy(engine={e!r})",
                   f"fastread.dali.readers.numpy(engine={e!r}), on the bench's device",
                   engine=e, check=_check, dali=True, build=_build_fastread,
                   default=BOTH if e == auto else ())


def _check(mode, cfg):
    if mode.engine is not None:
        why = cfg.env.engine_error(mode.engine)
        if why:
            return why
    why = cfg.env.dali_error_for(fastread_reader=mode.engine is not None)
    if why:
        return why
    if cfg.decode:
        return "arrays are not decoded; drop --decode"
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _build_dali(mode, cfg):
    gpu = cfg.device == "gpu"
    on_gpu = gpu and not mode.param("cpu_reader")

    def outputs():
        from nvidia.dali import fn
        data = fn.readers.numpy(file_root=cfg.data_dir, device="gpu" if on_gpu else "cpu",
                                random_shuffle=False, name="Reader")
        return data.gpu() if gpu and not on_gpu else data
    return DaliRunner(cfg, None, outputs=outputs)


def _build_fastread(mode, cfg):
    gpu = cfg.device == "gpu"

    def outputs():
        from fastread.dali import readers
        return readers.numpy(file_root=cfg.data_dir, engine=mode.engine,
                             device="gpu" if gpu else "cpu", random_shuffle=False,
                             **cfg.engine_options)
    return DaliRunner(cfg, None, outputs=outputs)
