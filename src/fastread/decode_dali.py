"""DALI's image decoder for decoded packs (``fastread pack --decode
--decoder dali``): nvImageCodec through ``fn.decoders.image``, on the GPU
(``device="mixed"``: host bytes in, GPU pixels out) or on the CPU, with the
meaning of :class:`fastread.decode.Preprocess` (which Pillow's path defines).

Per batch of ``batch_size`` files:

1. fastread's engine reads the files' bytes (:func:`fastread.read_batches`:
   native, batched, a few batches ahead);
2. Pillow parses each file's header only (no decoding) for its upright size
   (EXIF orientation applied), from which :meth:`Preprocess.target_size` and
   :func:`fastread.decode.crop_box` give the exact output size and crop;
3. one DALI pipeline run: ``fn.decoders.image`` (RGB, EXIF orientation
   applied), ``fn.resize`` to exactly that size per sample (linear with
   antialiasing, as Pillow's reducing bilinear filter), ``fn.slice`` at the
   crop's absolute anchors, uint8 HWC copied to the host;
4. stored as raw pixels or re-encoded as JPEG (Pillow's encoder, one
   function for both decoders: :func:`fastread.decode.encode_pixels`).

Errors per sample. A DALI pipeline fails a whole batch on one file it cannot
decode, and is unusable afterwards; then the pipeline is built again (a few
ms) and the batch's samples run one at a time, so the good ones are kept.
A sample DALI cannot take (a format nvImageCodec lacks, such as GIF; a
header Pillow cannot parse; an orientation DALI read otherwise than Pillow)
goes to Pillow's path for that sample (:func:`fastread.decode.preprocess_one`),
whose verdict is final: the same files fail (or are skipped) as with
``decoder="pillow"``, named with Pillow's reason, and the files Pillow
decoded instead are listed (:attr:`DaliDecoder.by_pillow`).

The pipeline runs on a thread of its own, one batch ahead of the one being
stored (DALI releases the GIL while it decodes), so the header parsing, the
JPEG re-encoding and the writing overlap the decoding.

Memory: the batches of file bytes read ahead (:func:`fastread.read_batches`:
``prefetch`` + reader ``workers`` - 1), plus :data:`IN_FLIGHT` batches
handed to the pipeline and not yet yielded (their bytes and pixels).
"""
import collections
import errno
import io
import os

import numpy as np

from fastread.batches import read_batches
from fastread.decode import crop_box, encode_pixels, preprocess_one
from fastread.errors import ReadError
from fastread.files import read_files

__all__ = ["DaliDecoder"]

#: EXIF orientations that swap width and height (transpose, rotate 90/270).
_SWAPS = (5, 6, 7, 8)


def upright_size(data):
    """(width, height) of the image in ``data`` as shown, EXIF orientation
    applied (what ``ImageOps.exif_transpose`` gives and DALI's decoders
    output), from its header: Pillow opens lazily and decodes nothing.
    Raises what Pillow raises for a file it does not recognise."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        # A PNG's getexif() decodes the whole image to find an eXIf chunk
        # after the pixels; one in the header is in info already. A late
        # one that DALI applies shows as a shape mismatch (-> Pillow).
        if im.format == "PNG" and "exif" not in im.info:
            return w, h
        orientation = im.getexif().get(0x0112, 1)
    return (h, w) if orientation in _SWAPS else (w, h)


#: Batches handed to the pipeline's thread and not yet yielded: the one
#: being decoded and the one being stored.
IN_FLIGHT = 2

#: Words of DALI errors that are the machine's, not a file's.
_DEVICE_FAULTS = ("cuda error", "cudaerror", "cuda_error", "out of memory",
                  "cuda driver", "no cuda-capable device")


def _raise_if_not_a_files_fault(e):
    text = str(e)
    if any(w in text.lower() for w in _DEVICE_FAULTS):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        # OSError: what pack's callers (the CLI) report as a failed run.
        raise OSError(errno.EIO, "DALI's decoding pipeline failed, not on a file: "
                      f"{lines[-1] if lines else text}") from e


class _Job:
    """A batch between reading and yielding. ``out``: per sample its item,
    set already for those settled before decoding (unreadable; left to
    Pillow); ``todo``: (position, bytes, upright (w, h)) of the samples for
    DALI; ``sizes``: their target (w, h); ``base``: the batch's first
    position in the paths; ``future``: DALI's results for ``todo``."""
    __slots__ = ("out", "todo", "sizes", "base", "future")

    def __init__(self, n, base):
        self.out, self.todo, self.sizes, self.base, self.future = [None] * n, [], [], base, None


class DaliDecoder:
    """Decodes lists of files with one DALI pipeline (see the module).

    ``device``: "cpu" or "gpu" (``device_id``, default 0). ``threads``:
    DALI's ``num_threads`` (default: every CPU this process may use).
    ``batch_size``: files per pipeline run (and per native read). Engine
    arguments go to :func:`fastread.read_batches`."""

    def __init__(self, pre, *, device="cpu", device_id=None, batch_size=64, threads=None,
                 engine="auto", prefetch=None, workers=None, **engine_options):
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if threads is None:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
                (os.cpu_count() or 1)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        self.pre, self.device, self.batch_size, self.threads = pre, device, batch_size, threads
        self.device_id = (0 if device_id is None else device_id) if device == "gpu" else None
        self.read_args = dict(engine=engine, prefetch=prefetch, workers=workers, **engine_options)
        #: Positions (in the paths given to :meth:`batches`) of the files
        #: Pillow decoded because DALI could not.
        self.by_pillow = []
        self.pipelines_built = 0
        self._pipe = None

    # -- the pipeline ---------------------------------------------------------

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        crop = self.pre.crop
        mixed = self.device == "gpu"

        # One batch is fed, run and fetched at a time (prefetch depth 1), so
        # a failed run names its batch (and the pipeline, which DALI may call
        # invalid after an error, is simply built again). DALI's own threads
        # decode and resize the batch in parallel. The dynamic executor: the
        # decoded shapes of GPU images come back to the CPU (a GPU-to-CPU
        # step the older executors refuse).
        @pipeline_def(batch_size=self.batch_size, num_threads=self.threads,
                      device_id=self.device_id, exec_dynamic=True, prefetch_queue_depth=1)
        def pipe():
            raw = fn.external_source(name="raw", dtype=types.UINT8, ndim=1)
            width = fn.external_source(name="width", dtype=types.FLOAT, ndim=0)
            height = fn.external_source(name="height", dtype=types.FLOAT, ndim=0)
            images = fn.decoders.image(raw, device="mixed" if mixed else "cpu",
                                       output_type=types.RGB)   # adjust_orientation=True
            decoded = images.shape(device="cpu")
            images = fn.resize(images, resize_x=width, resize_y=height,
                               interp_type=types.INTERP_LINEAR, antialias=True)
            if crop is not None:
                anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
                images = fn.slice(images, start=anchor,
                                  shape=np.array([crop, crop], dtype=np.int32),
                                  axis_names="HW", out_of_bounds_policy="error")
            return images, decoded

        p = pipe()
        p.build()
        self.pipelines_built += 1
        return p

    def _pipeline(self):
        """The pipeline, built if there is none. A pipeline that cannot be
        built is no file's fault: OSError (not the per-file RuntimeError)."""
        if self._pipe is None:
            try:
                self._pipe = self._build()
            except Exception as e:
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                where = f"GPU {self.device_id}" if self.device == "gpu" else "CPU"
                raise OSError(errno.EIO, f"DALI's decoding pipeline ({where}) cannot be "
                              f"built: {lines[-1] if lines else type(e).__name__}") from e
        return self._pipe

    def _run(self, datas, sizes):
        """One pipeline run over ``datas`` (uint8 arrays of file bytes) with
        target ``sizes`` [(w, h)]: a list of (HWC uint8 array, decoded
        (H, W)). Raises what DALI raises (the pipeline is then dropped)."""
        p = self._pipeline()
        try:
            p.feed_input("raw", datas)
            p.feed_input("width", [np.float32(w) for w, _ in sizes])
            p.feed_input("height", [np.float32(h) for _, h in sizes])
            if self.pre.crop is not None:
                p.feed_input("anchor", [np.array(crop_box(w, h, self.pre.crop)[::-1],
                                                 dtype=np.int32) for w, h in sizes])
            images, decoded = p.run()
        except Exception:
            self._pipe = None   # DALI: "Current pipeline object is no longer valid"
            raise
        if self.device == "gpu":
            images = images.as_cpu()
        return [(np.array(images.at(i)), tuple(int(x) for x in np.array(decoded.at(i))[:2]))
                for i in range(len(datas))]

    def _decode(self, datas, sizes):
        """Per sample: (array, decoded (H, W)) or None where DALI failed on
        it. A failed batch runs again one sample at a time. A failure that
        is the device's, not a file's (CUDA errors, out of memory), raises:
        else every file would quietly go to Pillow."""
        try:
            return self._run(datas, sizes)
        except (RuntimeError, ValueError) as e:
            _raise_if_not_a_files_fault(e)
            if len(datas) == 1:
                return [None]
        out = []
        for d, s in zip(datas, sizes):
            try:
                out.extend(self._run([d], [s]))
            except (RuntimeError, ValueError) as e:
                _raise_if_not_a_files_fault(e)
                out.append(None)
        return out

    # -- batches ---------------------------------------------------------------

    def _read_one(self, path):
        """One file's bytes, or why it cannot be read (named by the engine)."""
        opts = {k: v for k, v in self.read_args.items() if k not in ("prefetch", "workers")}
        try:
            return read_files([path], **opts)[0]
        except ReadError as e:
            return f"cannot read: {e}"

    def batches(self, paths):
        """Yields, in ``paths`` order, one list per batch of ``(payload,
        (H, W, 3), None)`` or ``(None, None, why)``, as
        :func:`fastread.decode.decoded_batches` does. ``paths`` is sliced
        lazily, a few batches ahead of the caller. Close it (or exhaust it)
        to stop the reader and the decoding thread.

        The pipeline runs on one thread of its own, a batch ahead: while
        it decodes batch k+1, this thread parses the headers of the next,
        stores batch k and hands it on (DALI releases the GIL while it
        runs). At most :data:`IN_FLIGHT` batches are with the pipeline."""
        from concurrent.futures import ThreadPoolExecutor

        n = self.batch_size
        pending = collections.deque()   # the lists handed to the reader, not yet decoded

        def lists():
            for i in range(0, len(paths), n):
                chunk = list(paths[i:i + n])
                pending.append(chunk)
                yield chunk

        jobs = collections.deque()
        base = 0
        # One thread: the pipeline is used by it alone, one batch after another.
        pool = ThreadPoolExecutor(1, thread_name_prefix="fastread-dali")
        try:
            with read_batches(lists(), **self.read_args) as it:
                while True:
                    try:
                        arrays = next(it)
                    except StopIteration:
                        break
                    except ReadError:   # a file of the list failed: read one by one to name it
                        arrays = None
                    chunk = pending.popleft()
                    if arrays is None:
                        arrays = [self._read_one(p) for p in chunk]
                    job = self._prepare(arrays, base)
                    if job.todo:
                        job.future = pool.submit(self._decode, [a for _, a, _ in job.todo],
                                                 job.sizes)
                    jobs.append(job)
                    base += len(chunk)
                    if len(jobs) >= IN_FLIGHT:
                        yield self._finish(jobs.popleft())
            while jobs:
                yield self._finish(jobs.popleft())
        finally:
            for job in jobs:
                if job.future is not None:
                    job.future.cancel()
            pool.shutdown(wait=True)   # the batch running now ends (a batch's time at most)
            self._pipe = None

    def _prepare(self, arrays, base):
        """A batch before decoding (a :class:`_Job`)."""
        job = _Job(len(arrays), base)
        out, todo = job.out, job.todo
        for j, a in enumerate(arrays):
            if isinstance(a, str):
                out[j] = (None, None, a)
                continue
            try:
                todo.append((j, a, upright_size(a)))
            except Exception:   # not an image Pillow's header parser knows: Pillow decides
                out[j] = self._by_pillow(base + j, a)
        job.sizes = [self.pre.target_size(w, h) for _, _, (w, h) in todo]
        return job

    def _finish(self, job):
        """The batch's items, once DALI has decoded ``job.todo``."""
        out, base = job.out, job.base
        results = job.future.result() if job.future is not None else []
        for (j, a, (w, h)), got in zip(job.todo, results):
            if got is None or got[1] != (h, w):
                # DALI could not decode it, or turned it otherwise than
                # Pillow's reading of its EXIF orientation.
                out[j] = self._by_pillow(base + j, a)
                continue
            pixels = got[0]
            out[j] = (encode_pixels(pixels, self.pre), pixels.shape, None)
        return out

    def _by_pillow(self, position, data):
        item = preprocess_one(io.BytesIO(memoryview(data)), self.pre)
        if item[2] is None:
            self.by_pillow.append(position)
        return item
