"""Modes named after an xNVMe I/O stack rather than a fastread engine.

======================  ========================================================
``xnvme-ctypes``        the seed's per-file loop through xNVMe's ctypes
                        bindings (PyPI ``xnvme``: open, pread, close per
                        sample), no DALI; a baseline for the xnvme-file engine
                        (``reader-xnvme-file``, ``fastread-xnvme-file``)
``xnvme-gds``           :class:`fastread.Reader` over the packed image with the
                        ``xnvme`` range engine, into host memory (``--mem
                        cpu``) or on to the GPU (``--mem gpu``: pinned arena,
                        one copy per batch)
======================  ========================================================
"""
from fastread.bench.registry import Mode
from fastread.bench.runners import LoopRunner

NAME = "xnvme"
ORDER = 40


def modes(env):
    yield Mode("xnvme-ctypes", NAME, "files", "xnvme_file_pread loop (ctypes)",
               "the seed's per-file loop through xNVMe's ctypes bindings (pip install xnvme)",
               check=_check_ctypes, build=_build_ctypes, role="python")
    yield Mode("xnvme-gds", NAME, "image", "fastread.Reader(image=..., engine='xnvme')",
               "fastread.Reader over the packed image with the xnvme range engine; --mem gpu "
               "copies each batch from the pinned arena to the GPU",
               engine="xnvme", check=_check_gds, build=_build_gds)


def _check_ctypes(mode, cfg):
    from fastread.bench.baselines import xnvme_ctypes_error

    why = xnvme_ctypes_error()
    if why:
        return why
    if cfg.device == "gpu":
        return "reads into host memory only; --device gpu applies to DALI and reader modes"
    if cfg.decode:
        return "does not decode; --decode applies to DALI modes"
    return None


def _build_ctypes(mode, cfg):
    from fastread.bench.baselines import xnvme_ctypes_loop
    return LoopRunner(cfg, xnvme_ctypes_loop)


def _check_gds(mode, cfg):
    if cfg.mem is None:
        return ("say where its reads land: --mem cpu (host memory) or --mem gpu (on to the "
                "GPU, one copy per batch from the pinned arena)")
    why = cfg.env.range_engine_error(mode.engine)
    if why:
        return why
    if cfg.mem == "gpu" and cfg.env.cuda_error:
        return f"--mem gpu needs a CUDA device; {cfg.env.cuda_error}"
    if cfg.decode:
        return "does not decode; --decode applies to DALI modes"
    return None


def _build_gds(mode, cfg):
    from fastread.bench.families.image import image_reader_runner
    return image_reader_runner(cfg, mode.engine, device=cfg.mem)
