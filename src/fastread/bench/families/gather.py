"""Row gathers from a feature matrix (GNN node features, embedding tables):
``fastread.FeatureStore`` against the ``np.memmap`` fancy index users write
today.

DATA is one 2-D ``.npy`` file (rows x features); every timed step gathers
``--batchsize`` uniformly random row ids (use 10,000 to 1,000,000: gathers
are fine-grained, a batch of 64 ids measures call overhead).

=======================  ====================================================
``gather-memmap``        ``np.memmap(...)[ids]`` (then ``torch``
                         ``pin_memory().cuda()`` with ``--device gpu``):
                         the baseline
``gather-host``          ``FeatureStore(backend="host")``: ids sorted on the
                         host, adjacent rows coalesced into range reads, one
                         upload
``xnvme-bam``            ``FeatureStore(backend="proxy")`` (``--device gpu``
                         only): GPU threads look rows up in an HBM page
                         cache and request misses through rings served by
                         native host threads (BaM's data path with a host
                         proxy; ``backend="xnvme-cuda"`` where xNVMe's GPU
                         queues and an NVMe device exist)
=======================  ====================================================

``bench/gather/gather.py`` is the full matrix (batch sizes, skew, warm/hot/cold,
UVA and KvikIO baselines) for the GPU machine.
"""
import os

import numpy as np

from fastread.bench.registry import Dataset, Mode, add_dataset_kind

NAME = "gather"
ORDER = 50
BOTH = ("cpu", "gpu")

add_dataset_kind("features", "a 2-D .npy feature matrix, gathered by row id")


def detect(path):
    """A 2-D ``.npy`` file is a feature matrix; anything else is not ours."""
    if not (os.path.isfile(path) and path.endswith(".npy")):
        return None
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    if arr.ndim != 2:
        return None
    return Dataset(root=path, primary="features", kinds=("features",), samples=arr.shape[0],
                   nbytes=arr.nbytes)


def modes(env):
    yield Mode("gather-memmap", NAME, "features", "np.memmap(...)[ids]",
               "np.memmap fancy index (+ pin_memory().cuda() with --device gpu): the baseline",
               check=_check, build=_build, role="baseline", default=BOTH,
               params=(("backend", None),))
    yield Mode("gather-host", NAME, "features", "FeatureStore(backend='host').gather(ids)",
               "fastread's host backend: sorted, coalesced range reads, one upload",
               check=_check, build=_build, default=BOTH, params=(("backend", "host"),))
    yield Mode("xnvme-bam", NAME, "features", "FeatureStore(backend='proxy').gather(ids)",
               "GPU-initiated gathers: HBM page cache, request rings, host proxy (GPU only)",
               check=_check, build=_build, default=("gpu",), params=(("backend", "proxy"),))


def _check(mode, cfg):
    if cfg.decode:
        return "feature rows are not decoded; drop --decode"
    backend = mode.param("backend")
    if cfg.device == "gpu" or backend == "proxy":
        if cfg.env.cuda_error:
            return f"needs a CUDA device; {cfg.env.cuda_error}"
        if backend is None:
            try:
                import torch  # noqa: F401
            except ImportError:
                return "the baseline's upload needs torch"
    return None


class _GatherRunner:
    """One gather of ``batch_size`` random ids per step; the previous
    result stays referenced until the next step, as a training step would
    hold it."""

    def __init__(self, mode, cfg):
        self.cfg = cfg
        self.gpu = cfg.device == "gpu" or mode.param("backend") == "proxy"
        self.rows = cfg.dataset.samples
        self.rng = np.random.default_rng(0)
        self.last = None
        backend = mode.param("backend")
        if backend is None:
            self.memmap = np.load(cfg.dataset.root, mmap_mode="r")
            self.row_bytes = self.memmap.strides[0]
            self.store = None
        else:
            from fastread.features import FeatureStore
            opts = {"device_id": 0} if self.gpu else {}
            self.store = FeatureStore(cfg.dataset.root, backend=backend, **opts)
            self.row_bytes = self.store.row_bytes
            self.memmap = None

    def next(self):
        ids = self.rng.integers(0, self.rows, size=self.cfg.batch_size, dtype=np.int64)
        if self.store is not None:
            if self.gpu:
                import torch
                out = self.store.gather(torch.from_numpy(ids).cuda(), device="cuda")
                torch.cuda.synchronize()
            else:
                out = self.store.gather(ids, device="cpu")
        else:
            out = self.memmap[ids]
            if self.gpu:
                import torch
                out = torch.from_numpy(out).pin_memory().cuda()
                torch.cuda.synchronize()
        self.last = out
        return len(ids), len(ids) * self.row_bytes

    def close(self):
        self.last = None
        if self.store is not None:
            self.store.close()
        self.memmap = None


def _build(mode, cfg):
    return _GatherRunner(mode, cfg)
