"""Bench modes for datasets of ``.npy`` arrays (``fastread make-dataset
--format npy``), against DALI's own numpy reader.

===========================  ================================================
``numpy-dali``               DALI's ``fn.readers.numpy`` (with ``--device
                             gpu``: ``device="gpu"``, DALI's GDS reader)
``numpy-dali-cpu``           DALI's ``fn.readers.numpy(device="cpu")``, then
                             ``.gpu()`` with ``--device gpu`` (where cuFile
                             cannot run)
``numpy-fastread-<e>``       ``fastread.dali.readers.numpy(engine=<e>)``, on
                             the same device
===========================  ================================================

Run them on an npy tree only: DATA_DIR is indexed as fn.readers.numpy does.
"""
import math

from fastread.cli import modes as M

KINDS = ("numpy-dali", "numpy-fastread")


def all_modes(engine_status):
    out = [M.Mode("numpy-dali", "numpy-dali",
                  help="DALI's fn.readers.numpy (device='gpu' with --device gpu: GDS)"),
           M.Mode("numpy-dali-cpu", "numpy-dali",
                  help="DALI's fn.readers.numpy on the CPU, then .gpu() with --device gpu")]
    out += [M.Mode(f"numpy-fastread-{e}", "numpy-fastread", engine=e,
                   help=f"fastread.dali.readers.numpy(engine={e!r})") for e in engine_status]
    return out


def unavailable(mode, env, *, device="cpu", decode=False):
    if mode.engine is not None:
        status = env.engines.get(mode.engine, M.NOT_BUILT)
        if status is not True:
            return str(status)
    if env.dali_error:
        return env.dali_error
    if decode:
        return "arrays are not decoded; drop --decode"
    if device == "gpu" and env.cuda_error:
        return f"--device gpu needs a CUDA device; {env.cuda_error}"
    return None


def is_numpy_run(modes):
    """True when every selected mode reads .npy arrays (DATA_DIR is an npy tree)."""
    return bool(modes) and all(m.kind in KINDS for m in modes)


class NumpyRunner(M.DaliRunner):
    """A pipeline whose one output is the arrays, on the bench's device."""

    def __init__(self, cfg, reader):
        super().__init__(cfg, None, outputs=reader)

    def _count(self, out):
        return len(out[0]), _nbytes(out[0])


def _nbytes(tl):
    import numpy as np
    from nvidia.dali import types
    item = np.dtype(types.to_numpy_type(tl.dtype)).itemsize
    return sum(math.prod(s) for s in tl.shape()) * item


def build(mode, cfg):
    gpu = cfg.device == "gpu"
    if mode.kind == "numpy-dali":
        def reader():
            from nvidia.dali import fn
            on_gpu = gpu and mode.name == "numpy-dali"
            data = fn.readers.numpy(file_root=cfg.data_dir, device="gpu" if on_gpu else "cpu",
                                    random_shuffle=False, name="Reader")
            return data.gpu() if gpu and not on_gpu else data
    else:
        def reader():
            from fastread.dali import readers
            return readers.numpy(file_root=cfg.data_dir, engine=mode.engine,
                                 device="gpu" if gpu else "cpu", random_shuffle=False,
                                 **cfg.engine_options)
    return NumpyRunner(cfg, reader)
