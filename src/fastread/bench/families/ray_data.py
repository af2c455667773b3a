"""Modes over a tree of sample files read through Ray Data on a local Ray
cluster (``pip install fastread[ray]``), the bench process its driver.

===========================  ================================================
``ray-binary``               ``ray.data.read_binary_files(root)``: the
                             baseline (bytes; not with ``--decode``)
``ray-images``               ``ray.data.read_images(root, mode="RGB")``:
                             the baseline with ``--decode`` (decoded on
                             Ray's workers)
``ray-fastread-<e>``         ``fastread.ray.read_files(root, engine=<e>)``
                             (``decode=True`` with ``--decode``), its read
                             tasks sized by fastread (``batch_size=None``)
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
            # --batch-size is the consumer's; the read tasks are sized as
            # fastread sizes them by default.
            return fastread.ray.read_files(root, decode=cfg.decode, engine=mode.engine, **opts)
    return RayRunner(make, cfg.batch_size)


# -- Ray's floor (bench/ray/bench_ray.py) -----------------------------------------

# The floor's blocks, made once per Ray worker process (this module is what
# the workers import), by task.
_FLOOR_BLOCKS = {}


def _floor_block(key, sizes, labels, names):
    block = _FLOOR_BLOCKS.get(key)
    if block is None:
        import numpy as np

        from fastread.ray.datasource import _columns, _packed_column

        offsets = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        block = _columns(_packed_column(np.zeros(int(offsets[-1]), np.uint8), offsets),
                         labels, names)
        _FLOOR_BLOCKS[key] = block
    return [block]


def floor_dataset(source, sizes):
    """A dataset of the read tasks of ``source`` (a
    :class:`fastread.ray.datasource.FilesDatasource`): the same tasks, each
    returning a block of the same rows, labels, paths and byte count, but
    made once per worker process and then returned as it is, no file read
    and no block built: what Ray itself takes to run those tasks and move
    those blocks to the driver, the ceiling of any reader with that layout.
    ``sizes``: the files' sizes, in ``source.paths`` order."""
    import functools

    import numpy as np
    import ray.data

    from fastread.ray.datasource import _read_task, read

    sizes = np.asarray(sizes, np.int64)
    pos = {p: i for i, p in enumerate(source.paths)}
    tasks = []
    for fn, rows, _size, files in source._tasks:
        idx = np.array([pos[p] for p in files], np.int64)
        tasks.append((functools.partial(_floor_block, (files[0], rows), sizes[idx],
                                        source.labels[idx], list(files)), rows))

    class Floor(ray.data.Datasource):
        num_tasks = len(tasks)

        def estimate_inmemory_data_size(self):
            return int(sizes.sum())

        def get_read_tasks(self, parallelism, per_task_row_limit=None, **_):
            return [_read_task(fn, rows, None, (), per_task_row_limit) for fn, rows in tasks]

        def get_name(self):
            return "Floor"

    return read(Floor())
