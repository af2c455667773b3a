"""Runners and the timing loop shared by every family.

A runner's ``next()`` returns ``(samples, bytes)`` of one batch, crossing
epoch ends by itself, and keeps the previous batch referenced until the next
call, as a training step would; ``close()`` frees what it holds. Optional:
``stats()`` (a dict of the run's counters, e.g. an engine's requests in
flight, recorded with the run) and ``child_cpu_seconds()`` (CPU of helper
processes it runs that no rusage counts yet, added to the run's CPU).
"""
import dataclasses
import math
import os
import resource
import sys
import time

import numpy as np

from fastread.bench.registry import epoch_batches

#: Written with "3" to drop the page cache (a module attribute so tests can
#: redirect it).
DROP_CACHES = "/proc/sys/vm/drop_caches"


@dataclasses.dataclass
class Config:
    """Everything a mode's check and build read."""
    env: object                      # fastread.bench.environment.Environment
    dataset: object = None           # fastread.bench.registry.Dataset, or None
    batch_size: int = 64
    threads: int = 4
    device: str = "cpu"
    decode: bool = False
    prefetch_queue_depth: int = 2
    engine_options: dict = dataclasses.field(default_factory=dict)
    #: where xnvme-gds reads land: None (not said), "cpu" or "gpu"
    mem: str = None

    @property
    def data_dir(self):
        return self.dataset.root

    @property
    def paths(self):
        return self.dataset.paths

    @property
    def labels(self):
        return self.dataset.labels

    @property
    def image(self):
        return self.dataset.image

    @property
    def epoch_batches(self):
        return epoch_batches(self.dataset.samples, self.batch_size)

    def engine_options_without(self, *keys):
        return {k: v for k, v in self.engine_options.items() if k not in keys}


# -- runners ------------------------------------------------------------------------
class DaliRunner:
    """Iterates a DALI pipeline with ``pipe.run()``; an epoch that ends with
    StopIteration (external sources) is followed by ``pipe.reset()``."""

    def __init__(self, cfg, reader, outputs=None):
        """``reader()`` builds (data, labels) inside the pipeline, decoded
        and uploaded as the settings say; ``outputs()`` is the whole body
        instead, its first output the data."""
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
        self.raw_outputs = outputs is not None
        self.pipe = pipeline(batch_size=cfg.batch_size, num_threads=cfg.threads,
                             device_id=0 if gpu else None,
                             prefetch_queue_depth=cfg.prefetch_queue_depth)
        self.pipe.build()
        self._keep = None

    def next(self):
        for _ in range(2):
            try:
                out = self.pipe.run()
            except StopIteration:
                self.pipe.reset()
                continue
            self._keep = out  # the previous batch is released only now
            return self._count(out)
        raise RuntimeError("the pipeline ended an epoch without a single batch after "
                           "pipe.reset() (does its source restart on reset?)")

    def _count(self, out):
        if self.raw_outputs:
            return len(out[0]), tensor_list_nbytes(out[0])
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


def tensor_list_nbytes(tl):
    from nvidia.dali import types

    item = np.dtype(types.to_numpy_type(tl.dtype)).itemsize
    return sum(math.prod(s) for s in tl.shape()) * item


class EpochRunner:
    """Batches from new_epoch() (an iterator of (arrays, labels)), epoch after
    epoch; the last batch is kept alive until the next one."""

    def __init__(self):
        self._it = self.new_epoch()
        self._keep = None

    def new_epoch(self):
        raise NotImplementedError

    def next(self):
        try:
            arrays, _labels = next(self._it)
        except StopIteration:
            self._it = self.new_epoch()
            arrays, _labels = next(self._it)
        self._keep = arrays
        return len(arrays), sum(a.nbytes for a in arrays)

    def close(self):
        self._keep = None
        self._it = None


class ReaderRunner(EpochRunner):
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


class LoopRunner(EpochRunner):
    """``loop(paths, labels, batch_size)`` (one epoch of (arrays, labels)),
    epoch after epoch."""

    def __init__(self, cfg, loop):
        self.cfg = cfg
        self.loop = loop
        super().__init__()

    def new_epoch(self):
        return self.loop(self.cfg.paths, self.cfg.labels, self.cfg.batch_size)


# -- timing --------------------------------------------------------------------------
def time_pipeline(pipe, warmup, batches):
    """A built DALI pipeline run `warmup` untimed then `batches` timed
    iterations (an external source's StopIteration starts its next epoch):
    (samples/s, process CPU microseconds per sample; every thread counts,
    DALI's and fastread's). The interleaved scripts' one measurement."""
    def step():
        try:
            return pipe.run()
        except StopIteration:
            pipe.reset()
            return pipe.run()

    for _ in range(warmup):
        step()
    n = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(batches):
        n += len(step()[1])
    wall = time.perf_counter() - t0
    return n / wall, (time.process_time() - c0) / n * 1e6


def rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PageCache:
    """Drops the page cache before cold runs, if this process may."""

    def __init__(self):
        self.error = None

    def can_drop(self):
        """None if the page cache can be dropped here, else why not (tried
        once: writing needs root and a writable /proc/sys)."""
        if self.error is None:
            self.error = self._drop() or ""
        return self.error or None

    def drop(self):
        why = self._drop()
        if why:
            self.error = why
            raise OSError(why)

    @staticmethod
    def _drop():
        try:
            os.sync()
            with open(DROP_CACHES, "w") as f:
                f.write("3")
        except OSError as e:
            reason = e.strerror or str(e)
            if isinstance(e, PermissionError) and os.geteuid() != 0:
                reason += ": dropping the page cache needs root"
            return f"cannot drop the page cache ({DROP_CACHES}: {reason})"
        return None


def timed_run(runner, *, warmup, batches, epoch_batches, rss=False, progress=None, desc=""):
    """``warmup`` untimed batches, then ``batches`` timed ones."""
    from tqdm import tqdm

    bar = tqdm(total=warmup + batches, desc=desc, unit="batch", leave=False,
               disable=None if progress is None else not progress, file=sys.stderr,
               dynamic_ncols=True)
    try:
        for _ in range(warmup):
            runner.next()
            bar.update()
        samples = nbytes = 0
        rss_samples = []
        cpu0 = client_cpu_seconds(runner)
        t0 = time.perf_counter()
        for i in range(1, batches + 1):
            s, b = runner.next()
            samples += s
            nbytes += b
            if rss and (i % epoch_batches == 0 or i == batches):
                rss_samples.append(rss_bytes())
            bar.update()
        seconds = time.perf_counter() - t0
        cpu = client_cpu_seconds(runner) - cpu0
    finally:
        bar.close()
    out = {"samples": samples, "bytes": nbytes, "batches": batches, "seconds": seconds,
           "img_per_s": samples / seconds if seconds > 0 else math.inf,
           "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else math.inf,
           "rss": rss_samples if rss else None, "cpu_seconds": cpu}
    stats = getattr(runner, "stats", None)
    if stats is not None:
        out["stats"] = stats()
    return out


def client_cpu_seconds(runner=None):
    """CPU seconds of this process (every thread: DALI's, fastread's,
    boto3's pool), its children that ended, and the runner's live helper
    processes (``child_cpu_seconds()``, e.g. curl)."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    extra = getattr(runner, "child_cpu_seconds", None)
    return (time.process_time() + ended.ru_utime + ended.ru_stime
            + (extra() if extra is not None else 0.0))


def summarize(mode, runs, rss=False, cache="warm"):
    """The median run by img/s (the lower median for an even count), with
    every run kept."""
    import statistics

    median = statistics.median_low([r["img_per_s"] for r in runs])
    med = next(r for r in runs if r["img_per_s"] == median)
    out = {"mode": mode.name, "what": mode.what, "family": mode.family, "role": mode.role,
           "dali": mode.dali, "engine": mode.engine, "cache": cache,
           "img_per_s": med["img_per_s"], "gb_per_s": med["gb_per_s"],
           "batches": med["batches"], "seconds": med["seconds"], "samples": med["samples"],
           "bytes": med["bytes"], "runs": runs}
    if mode.ceiling:
        out["ceiling"] = True
    if med.get("cpu_seconds") is not None and med["bytes"]:
        # The client's CPU per GB read (GB = 1e9 bytes): what reading costs
        # the machine besides the time.
        out["cpu_s_per_gb"] = med["cpu_seconds"] / (med["bytes"] / 1e9)
    if med.get("stats"):
        out["stats"] = med["stats"]
    if rss:
        vals = [v for r in runs for v in (r["rss"] or []) if v is not None]
        growth = [r["rss"][-1] - r["rss"][1] for r in runs
                  if r["rss"] and len(r["rss"]) >= 2 and None not in r["rss"]]
        out["rss_max"] = max(vals) if vals else None
        out["rss_growth"] = max(growth) if growth else None
    return out
