"""Modes over a tree of sample files read through Ray Data on a local Ray
cluster (``pip install fastread[ray]``), the bench process its driver.

===========================  ================================================
``ray-binary``               ``ray.data.read_binary_files(root)``: the
                             baseline (bytes; not with ``--decode``)
``ray-images``               ``ray.data.read_images(root, mode="RGB")``:
                             the baseline with ``--decode`` (decoded on
                             Ray's workers)
``ray-fastread-<e>``         ``fastread.ray.read_files(root, engine=<e>)``
                             (``decode=True`` with ``--decode``)
===========================  ================================================

Each epoch builds the dataset anew (its listing included) and consumes it
on the driver with ``iter_batches(batch_size=--batch-size,
batch_format="pyarrow")``; bytes count the batches' Arrow buffers. The
cluster (``ray.init()``: every CPU) is started by the first mode
that runs and shared by the rest; an existing one (``RAY_ADDRESS``) is
used as it is. Host batches only (``--device cpu``). ``bench/ray/bench_ray.py``
is the same comparison as one standalone script.
"""
from fastread.bench.registry import Mode

NAME = "ray"
ORDER = 70


def modes(env):
    yield Mode("ray-binary", NAME, "files", "ray.data.read_binary_files",
               "Ray Data's read_binary_files over the tree: the baseline (bytes)",
               check=_check, build=_build, role="baseline", params=(("reader", "binary"),))
    yield Mode("ray-images", NAME, "files", "ray.data.read_images(mode='RGB')",
               "Ray Data's read_images (decoded on Ray's workers): the baseline with --decode",
               check=_check, build=_build, role="baseline", params=(("reader", "images"),))
    for e in env.engines:
        yield Mode(f"ray-fastread-{e}", NAME, "files", f"fastread.ray.read_files(engine={e!r})",
                   f"fastread.ray.read_files(engine={e!r}): batches read natively in Ray tasks "
                   "(decode=True with --decode)", engine=e, check=_check, build=_build,
                   params=(("reader", "fastread"),))


def _check(mode, cfg):
    from fastread.ray import ray_reason

    why = ray_reason()
    if why:
        return why
    if mode.engine is not None:
        why = cfg.env.engine_error(mode.engine)
        if why:
            return why
    if cfg.device != "cpu":
        return "Ray Data delivers host batches: run with --device cpu"
    reader = mode.param("reader")
    if reader == "binary" and cfg.decode:
        return "reads bytes: drop --decode (ray-images decodes)"
    if reader == "images" and not cfg.decode:
        return "decodes: run with --decode (ray-binary reads bytes)"
    return None


class RayRunner:
    """Batches of a Ray Dataset made anew each epoch by ``make()``; the last
    batch kept alive until the next."""

    def __init__(self, make, batch_size):
        self._make, self._batch_size = make, batch_size
        self._it = None
        self._keep = None

    def _epoch(self):
        return iter(self._make().iter_batches(batch_size=self._batch_size,
                                              batch_format="pyarrow"))

    def next(self):
        if self._it is None:
            self._it = self._epoch()
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = self._epoch()
            batch = next(self._it)
        self._keep = batch
        return batch.num_rows, batch.nbytes

    def close(self):
        self._keep = None
        self._it = None


def _build(mode, cfg):
    import os

    import ray
    import ray.data

    import fastread.ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            # Every CPU, Ray's default (--threads is the engines' and DALI's).
            ray.init(include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    root = cfg.data_dir
    reader = mode.param("reader")
    if reader == "binary":
        def make():
            return ray.data.read_binary_files(root, include_paths=True)
    elif reader == "images":
        def make():
            return ray.data.read_images(root, include_paths=True, mode="RGB")
    else:
        opts = dict(cfg.engine_options)

        def make():
            return fastread.ray.read_files(root, batch_size=cfg.batch_size, decode=cfg.decode,
                                           engine=mode.engine, **opts)
    return RayRunner(make, cfg.batch_size)
