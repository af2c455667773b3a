"""DALI's image decoder for decoded packs (``fastread pack --decode
--decoder dali``): nvImageCodec through ``fn.decoders.image``, on the GPU
(``device="mixed"``: host bytes in, GPU pixels out) or on the CPU, with the
meaning of :class:`fastread.decode.Preprocess` (which Pillow's path defines).

Per batch of ``batch_size`` files:

1. fastread's engine reads the files' bytes (:func:`fastread.read_batches`:
   native, batched, a few batches ahead);
2. Pillow parses each file's header only (no decoding) for its upright size
   (EXIF orientation applied), from which :meth:`Preprocess.target_size` and
   :func:`fastread.decode.crop_box` give the exact output size and crop; a
   JPEG whose entropy-coded data has no end (a truncated file) is left to
   Pillow here, since the GPU's decoders return such a file's missing rows
   as pixels, without an error, where Pillow and the CPU decoder refuse it;
3. one DALI pipeline run: ``fn.decoders.image`` (RGB, EXIF orientation
   applied; on the GPU with libjpeg-turbo's "fancy" chroma upsampling, which
   Pillow and DALI's CPU decoder use, instead of nvJPEG's default
   replication), ``fn.resize`` to exactly that size per sample (linear with
   antialiasing, as Pillow's reducing bilinear filter), ``fn.slice`` at the
   crop's absolute anchors, uint8 HWC copied to the host;
4. stored as raw pixels or re-encoded as JPEG (Pillow's encoder, one
   function for both decoders: :func:`fastread.decode.encode_pixels`, on
   a few threads: it releases the GIL).

Three threads overlap the steps: one reads and parses headers (1-2), one
builds the pipeline at once (while the first batch is read) and then
keeps :data:`DEPTH` batches in DALI's pipeline at once (3; DALI runs their
stages side by side and releases the GIL), and the caller's stores and
writes (4). At most :data:`IN_FLIGHT` batches are between the reader and the
caller.

Errors per sample. A failed pipeline run fails its whole batch, and DALI's
pipeline cannot be trusted after it (a later run may find its inputs out of
step: "Current pipeline object is no longer valid"); then the pipeline is
built again (a few ms on the CPU, more on a GPU), the batch's samples run one
at a time, so the good ones are kept, and the batches that were in flight
behind it run again. A sample DALI cannot take (a format nvImageCodec lacks,
such as GIF; a header Pillow cannot parse; a truncated JPEG; an orientation
DALI read otherwise than Pillow) goes to Pillow's path for that sample
(:func:`fastread.decode.preprocess_one`), whose verdict is final: the same
files fail (or are skipped) as with ``decoder="pillow"``, named with
Pillow's reason, and the files Pillow decoded instead are listed
(:attr:`DaliDecoder.by_pillow`).

Memory: the batches of file bytes read ahead (:func:`fastread.read_batches`:
``prefetch`` + reader ``workers`` - 1), plus :data:`IN_FLIGHT` batches past
the reader and not yet yielded (their bytes and pixels).
"""
import collections
import errno
import io
import os
import queue
import threading
import time

import numpy as np

from fastread.batches import read_batches
from fastread.decode import crop_box, encode_pixels, preprocess_one
from fastread.errors import ReadError
from fastread.files import read_files

__all__ = ["DaliDecoder"]

#: EXIF orientations that swap width and height (transpose, rotate 90/270).
_SWAPS = (5, 6, 7, 8)

#: Pipeline runs scheduled in DALI at once: while one batch's pixels come
#: back, the next is being decoded.
DEPTH = 2

#: Batches past the reader and not yet yielded: one being parsed, DEPTH in
#: the pipeline, one being stored by the caller.
IN_FLIGHT = DEPTH + 2

#: The mixed decoder's share for the GPU's hardware JPEG decoder: all of
#: it. The rest goes to nvJPEG's CUDA decoder, whose Huffman decoding runs
#: on the host's threads; on an H200 the host's share was what limited the
#: mixed decoder (1.0 decoded 1.5x as fast as DALI's default 0.65 with 8
#: threads: fastread.torch.ImageLoader's hw_decoder_load).
HW_DECODER_LOAD = 1.0

#: libjpeg-turbo's "fancy" chroma upsampling on the GPU (see
#: :meth:`DaliDecoder.decoder_args`). Measured on the H200 (DALI 2.4,
#: docs/results/gpu-h200-20261204): with it the mixed decoder's pixels are all
#: but the CPU decoder's (mean 0.000, largest 1 level) and the hardware JPEG
#: decoder still decodes (nvidia-smi dmon: its engine 62-67% busy, DALI's own
#: pipeline at 13-22k img/s; 0% with a hardware share of 0); without it
#: (nvJPEG's replication) small outputs part from Pillow's by up to 7-13
#: levels per image (tests/test_pack_dali.py allows 2) and the pack is no
#: faster (docs/decoded.md "Why the GPU pack is not 3x Pillow").
FANCY_UPSAMPLING = True

#: nvJPEG's CUDA decoder: images of more pixels than this get the GPU-hybrid
#: backend (Huffman decoding on the GPU), smaller ones Huffman decoding on
#: the host's threads. None: DALI's default (1,000,000 pixels, so a data set
#: of ~500x375 JPEGs is Huffman-decoded on the host). 0 sends every image to
#: the GPU; bench/decoded/pack_decoders.py's dali-gpu-gpuhuff measures it.
HYBRID_HUFFMAN_THRESHOLD = None

#: Words of DALI errors that are the machine's, not a file's.
_DEVICE_FAULTS = ("cuda error", "cudaerror", "cuda_error", "out of memory",
                  "cuda driver", "no cuda-capable device")


class ForPillow(Exception):
    """A file DALI is not given: Pillow decides it (the message says why)."""


def _scan_start(data):
    """Offset of a JPEG's first start-of-scan marker (its entropy-coded data
    follows), walking the marker segments from the start; None if the
    segments end first."""
    n, i = len(data), 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:          # fill byte
            i += 1
            continue
        if marker == 0xDA:
            return i
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:   # no length
            i += 2
            continue
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


def jpeg_is_truncated(data):
    """True for a JPEG whose data stops before its end-of-image marker after
    the first scan: a file cut short. (In entropy-coded data a 0xFF is always
    followed by 0x00 or a restart marker, so an 0xFF 0xD9 there is the end.)
    False for anything that is not a JPEG."""
    # A byte view, not a copy (ints when indexed, whatever it came as): this
    # runs once per file on the parser's thread, holding the GIL.
    data = memoryview(data).cast("B")
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return False
    sos = _scan_start(data)
    if sos is None:
        return True
    if data[-2:] == b"\xff\xd9":
        return False
    return bytes(data[sos:]).rfind(b"\xff\xd9") < 0   # trailing bytes after the end: rare


#: Start-of-frame markers :func:`_plain_jpeg_size` reads (baseline, extended,
#: progressive Huffman: those nvJPEG and libjpeg-turbo decode); any other
#: frame goes to Pillow's parser.
_PLAIN_SOF = (0xC0, 0xC1, 0xC2)


def _plain_jpeg_size(data):
    """(width, height) of a JPEG that Pillow would open as a plain
    "JPEG" with orientation 1, from its marker segments alone; None where
    anything is out of the ordinary (then Pillow's parser decides: see
    :func:`upright_size`). Ordinary: SOI, then well-formed segments up to the
    first start of scan, one 8-bit frame (:data:`_PLAIN_SOF`) of 1 or 3
    components and non-zero size, no APP1 segment (EXIF and XMP, the
    orientation's sources, live there), no APP2 "MPF" (Pillow opens those as
    MPO), a size under Pillow's decompression-bomb limit.

    Pillow's ``Image.open`` + ``getexif`` cost 0.3-0.6 ms a file (measured,
    2-core VM): on the parser's one thread that capped the GPU decoder near
    2,000 img/s; this walk is some 10 segments of Python."""
    from PIL import Image

    data = memoryview(data).cast("B")
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8 or data[2] != 0xFF:
        return None
    i, size = 2, None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF or 0xD0 <= marker <= 0xD8 or marker == 0x01 or marker == 0x00:
            return None          # fill bytes, stray markers: Pillow's lenient walk decides
        if marker == 0xDA:
            break
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2 or i + 2 + length > n:
            return None
        if marker == 0xE1:
            return None          # EXIF / XMP: the orientation's business
        if marker == 0xE2 and bytes(data[i + 4:i + 8]) == b"MPF\x00":
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in _PLAIN_SOF or size is not None or length < 8:
                return None
            bits, comps = data[i + 4], data[i + 9]
            h, w = (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
            if bits != 8 or comps not in (1, 3) or not w or not h:
                return None
            size = (w, h)
        i += 2 + length
    else:
        return None              # no start of scan
    if size is None:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and size[0] * size[1] > limit:
        return None              # Pillow warns or refuses: its path decides
    return size


def upright_size(data):
    """(width, height) of the image in ``data`` as shown, EXIF orientation
    applied (what ``ImageOps.exif_transpose`` gives and DALI's decoders
    output), from its header: Pillow opens lazily and decodes nothing.
    Raises what Pillow raises for a file it does not recognise, and
    :class:`ForPillow` for one DALI must not be given."""
    from PIL import Image

    size = _plain_jpeg_size(data)
    if size is not None:   # the common case, without Pillow (as Pillow reads it)
        if jpeg_is_truncated(data):
            raise ForPillow("a truncated JPEG")
        return size
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        fmt = im.format
        # A PNG's getexif() decodes the whole image to find an eXIf chunk
        # after the pixels; one in the header is in info already. A late
        # one that DALI applies shows as a shape mismatch (-> Pillow).
        if fmt == "PNG" and "exif" not in im.info:
            return w, h
        orientation = im.getexif().get(0x0112, 1)
        if orientation != 1 and "XML:com.adobe.xmp" in im.info and \
                0x0112 not in Image.Exif().load(im.info.get("exif") or b"") or {}:
            # Pillow took the orientation from XMP (getexif() does where
            # EXIF has none); nvImageCodec reads EXIF only, and a half turn
            # would not even change the shape.
            raise ForPillow("orientation from XMP")
    if fmt == "JPEG" and jpeg_is_truncated(data):
        raise ForPillow("a truncated JPEG")
    return (h, w) if orientation in _SWAPS else (w, h)


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
    position in the paths; ``results``: DALI's per sample (pixels, decoded
    (H, W)) or None, once decoded."""
    __slots__ = ("out", "todo", "sizes", "base", "results")

    def __init__(self, n, base):
        self.out, self.todo, self.sizes, self.base, self.results = [None] * n, [], [], base, None


_END = object()   # the end of a queue's jobs


class DaliDecoder:
    """Decodes lists of files with one DALI pipeline (see the module).

    ``device``: "cpu" or "gpu" (``device_id``, default 0). ``threads``:
    DALI's ``num_threads`` (default: every CPU this process may use).
    ``batch_size``: files per pipeline run (and per native read).
    ``hw_decoder_load`` (GPU): the hardware JPEG decoder's share
    (default :data:`HW_DECODER_LOAD`); ``fancy_upsampling`` (GPU): libjpeg's
    chroma upsampling (default :data:`FANCY_UPSAMPLING`);
    ``hybrid_huffman_threshold`` (GPU): pixels above which nvJPEG decodes
    Huffman on the GPU (default :data:`HYBRID_HUFFMAN_THRESHOLD`). Engine arguments go to
    :func:`fastread.read_batches`."""

    def __init__(self, pre, *, device="cpu", device_id=None, batch_size=64, threads=None,
                 hw_decoder_load=None, fancy_upsampling=None, hybrid_huffman_threshold=None,
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
        if hw_decoder_load is None:
            hw_decoder_load = HW_DECODER_LOAD
        if isinstance(hw_decoder_load, bool) or not isinstance(hw_decoder_load, (int, float)) \
                or not 0 <= hw_decoder_load <= 1:
            raise ValueError(f"hw_decoder_load must be a number in [0, 1], got "
                             f"{hw_decoder_load!r}")
        self.pre, self.device, self.batch_size, self.threads = pre, device, batch_size, threads
        self.hw_decoder_load = float(hw_decoder_load)
        if fancy_upsampling is None:
            fancy_upsampling = FANCY_UPSAMPLING
        if not isinstance(fancy_upsampling, bool):
            raise ValueError(f"fancy_upsampling must be True or False, got {fancy_upsampling!r}")
        self.fancy_upsampling = fancy_upsampling
        if hybrid_huffman_threshold is None:
            hybrid_huffman_threshold = HYBRID_HUFFMAN_THRESHOLD
        if hybrid_huffman_threshold is not None and (
                isinstance(hybrid_huffman_threshold, bool)
                or not isinstance(hybrid_huffman_threshold, int) or hybrid_huffman_threshold < 0):
            raise ValueError(f"hybrid_huffman_threshold must be None or an integer >= 0, got "
                             f"{hybrid_huffman_threshold!r}")
        self.hybrid_huffman_threshold = hybrid_huffman_threshold
        self.device_id = (0 if device_id is None else device_id) if device == "gpu" else None
        self.read_args = dict(engine=engine, prefetch=prefetch, workers=workers, **engine_options)
        #: Positions (in the paths given to :meth:`batches`) of the files
        #: Pillow decoded because DALI could not.
        self.by_pillow = []
        self.pipelines_built = 0
        #: Seconds each pipeline build took (the fixed start's part before
        #: the first run: bench/decoded/pack_decoders.py reports it).
        self.build_seconds = []
        #: Seconds spent per step over :meth:`batches` (each step on its one
        #: thread): "read" (the reader's batches, waited for), "parse" (the
        #: headers), "feed" (inputs fed and runs scheduled), "wait" (a run's
        #: outputs waited for and copied to the host), "store" (the caller's
        #: thread: items made, re-encoded). Where a pack's time goes
        #: (bench/decoded/pack_decoders.py prints them).
        self.seconds = dict.fromkeys(("read", "parse", "feed", "wait", "store"), 0.0)
        self._pipe = None
        self._lock = threading.Lock()   # by_pillow: the caller's thread and the parser's

    # -- the pipeline ---------------------------------------------------------

    def decoder_args(self):
        """fn.decoders.image's arguments: on the GPU the CPU decoder's chroma
        upsampling (libjpeg-turbo's "fancy" one, Pillow's too: nvJPEG's
        default replicates each chroma sample, 2 to 4 levels off Pillow on
        small images, more on noisy ones) and the hardware decoder's share."""
        if self.device != "gpu":
            return dict(device="cpu")
        args = dict(device="mixed", jpeg_fancy_upsampling=self.fancy_upsampling,
                    hw_decoder_load=self.hw_decoder_load)
        if self.hybrid_huffman_threshold is not None:   # else DALI's own default
            args["hybrid_huffman_threshold"] = self.hybrid_huffman_threshold
        return args

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        crop = self.pre.crop
        decoder_args = self.decoder_args()

        # DEPTH runs in flight, each fed and scheduled explicitly (its outputs
        # are its batch's). prefetch_queue_depth 1: a deeper queue makes the
        # first schedule_run prefetch that many runs, for which no input has
        # been fed yet ("Attempted to peek the data batch that doesn't
        # exist"); the dynamic executor queues further scheduled runs all the
        # same. It also lets the decoded shapes of GPU images come back to
        # the CPU (a GPU-to-CPU step the older executors refuse).
        @pipeline_def(batch_size=self.batch_size, num_threads=self.threads,
                      device_id=self.device_id, exec_dynamic=True, prefetch_queue_depth=1)
        def pipe():
            raw = fn.external_source(name="raw", dtype=types.UINT8, ndim=1)
            width = fn.external_source(name="width", dtype=types.FLOAT, ndim=0)
            height = fn.external_source(name="height", dtype=types.FLOAT, ndim=0)
            images = fn.decoders.image(raw, output_type=types.RGB,   # adjust_orientation=True
                                       **decoder_args)
            decoded = images.shape(device="cpu")
            images = fn.resize(images, resize_x=width, resize_y=height,
                               interp_type=types.INTERP_LINEAR, antialias=True)
            if crop is not None:
                anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
                images = fn.slice(images, start=anchor,
                                  shape=np.array([crop, crop], dtype=np.int32),
                                  axis_names="HW", out_of_bounds_policy="error")
            return images, decoded

        t0 = time.perf_counter()
        p = pipe()
        p.build()
        self.pipelines_built += 1
        self.build_seconds.append(time.perf_counter() - t0)
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

    def _start(self, datas, sizes):
        """Feeds one run (``datas``: uint8 arrays of file bytes; target
        ``sizes`` [(w, h)]) and schedules it; its outputs come from
        :meth:`_take`, runs in the order started."""
        p = self._pipeline()
        try:
            p.feed_input("raw", datas)
            p.feed_input("width", [np.float32(w) for w, _ in sizes])
            p.feed_input("height", [np.float32(h) for _, h in sizes])
            if self.pre.crop is not None:
                p.feed_input("anchor", [np.array(crop_box(w, h, self.pre.crop)[::-1],
                                                 dtype=np.int32) for w, h in sizes])
            p.schedule_run()
        except Exception:
            self._pipe = None
            raise

    def _take(self, n):
        """The oldest started run's outputs: a list of ``n`` (HWC uint8 array,
        decoded (H, W)). Raises what DALI raises (the pipeline is then
        dropped, and the runs started after it are lost with it)."""
        try:
            images, decoded = self._pipe.outputs()
            if self.device == "gpu":
                images = images.as_cpu()
            shapes = decoded.as_array()
            if images.is_dense_tensor():   # one shape (a crop): one copy for the batch
                pixels = list(images.as_array())
            else:
                pixels = [np.array(images.at(i)) for i in range(n)]
        except Exception:
            self._pipe = None   # DALI: "Current pipeline object is no longer valid"
            raise
        return [(pixels[i], (int(shapes[i][0]), int(shapes[i][1]))) for i in range(n)]

    def _run(self, datas, sizes):
        """One run, waited for (see :meth:`_start`, :meth:`_take`)."""
        self._start(datas, sizes)
        return self._take(len(datas))

    def _one_by_one(self, job):
        """A failed batch's samples, one run each: per sample (array,
        decoded (H, W)) or None where DALI failed on it. A failure that is
        the device's, not a file's (CUDA errors, out of memory), raises:
        else every file would quietly go to Pillow."""
        if len(job.todo) == 1:
            return [None]
        out = []
        for (_, d, _), s in zip(job.todo, job.sizes):
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
        to stop the reader and the threads (within a batch's time).

        While the caller stores batch k, the pipeline decodes the next
        :data:`DEPTH` and a thread reads and parses the one after (DALI and
        the reader release the GIL)."""
        from concurrent.futures import ThreadPoolExecutor

        permits = threading.Semaphore(IN_FLIGHT)
        stop = threading.Event()
        parsed, decoded = queue.Queue(), queue.Queue()
        parser = threading.Thread(target=self._parse_loop, name="fastread-dali-parse",
                                  args=(paths, permits, stop, parsed), daemon=True)
        decoder = threading.Thread(target=self._decode_loop, name="fastread-dali-decode",
                                   args=(parsed, decoded, stop), daemon=True)
        encoders = ThreadPoolExecutor(min(8, self.threads), thread_name_prefix="fastread-encode") \
            if self.pre.encode != "raw" else None
        parser.start()
        decoder.start()
        try:
            while True:
                job = decoded.get()
                if job is _END:
                    return
                if isinstance(job, BaseException):
                    raise job
                t0 = time.perf_counter()
                items = self._finish(job, encoders)
                self.seconds["store"] += time.perf_counter() - t0
                yield items
                permits.release()
        finally:
            stop.set()
            permits.release(IN_FLIGHT)   # a parser waiting for room wakes, sees stop
            parsed.put(_END)             # a decoder waiting for work wakes
            parser.join()                # reads, parses: a batch's time at most
            decoder.join()               # the runs in flight end
            if encoders is not None:
                encoders.shutdown(wait=True)
            self._pipe = None

    def _parse_loop(self, paths, permits, stop, parsed):
        """The parser's thread: reads the batches, parses their headers, hands
        them to the decoder's; the reader stops when it ends."""
        n = self.batch_size
        pending = collections.deque()   # the lists handed to the reader, not yet read

        def lists():
            for i in range(0, len(paths), n):
                if stop.is_set():
                    return
                chunk = list(paths[i:i + n])
                pending.append(chunk)
                yield chunk

        base = 0
        try:
            with read_batches(lists(), **self.read_args) as it:
                while True:
                    permits.acquire()
                    if stop.is_set():
                        return
                    t0 = time.perf_counter()
                    try:
                        arrays = next(it)
                    except StopIteration:
                        break
                    except ReadError:   # a file of the list failed: read one by one to name it
                        arrays = None
                    chunk = pending.popleft()
                    if arrays is None:
                        arrays = [self._read_one(p) for p in chunk]
                    t1 = time.perf_counter()
                    job = self._prepare(arrays, base)
                    self.seconds["read"] += t1 - t0
                    self.seconds["parse"] += time.perf_counter() - t1
                    parsed.put(job)
                    base += len(chunk)
        except BaseException as e:   # to the caller, in order, after the batches before it
            parsed.put(e)
        finally:
            parsed.put(_END)

    def _decode_loop(self, parsed, decoded, stop):
        """The decoder's thread: keeps up to DEPTH batches' runs in the
        pipeline and hands the batches on, in order, with their results."""
        flight = collections.deque()   # in order; handed on from the head

        def running():
            return sum(1 for j in flight if j.todo and j.results is None)

        try:
            # The pipeline is built now, while the parser's thread reads and
            # parses the first batch: on a GPU the build (CUDA context, the
            # decoders' set-up) is most of a pack's fixed start, and nothing
            # waits for it yet.
            self._pipeline()
            ended = False
            while not stop.is_set():
                while not ended and running() < DEPTH:
                    job = parsed.get()
                    if job is _END:
                        ended = True
                    elif isinstance(job, BaseException):
                        raise job
                    else:
                        if job.todo:
                            self._start_job(job, flight)
                        flight.append(job)
                if not flight:
                    break
                head = flight[0]
                if head.todo and head.results is None:
                    self._take_job(head, flight)
                decoded.put(flight.popleft())
        except BaseException as e:
            decoded.put(e)
        finally:
            decoded.put(_END)

    def _start_job(self, job, flight):
        t0 = time.perf_counter()
        try:
            self._start([a for _, a, _ in job.todo], job.sizes)
        except (RuntimeError, ValueError) as e:
            _raise_if_not_a_files_fault(e)
            self._recover(flight + collections.deque([job]), failed=None)
        finally:
            self.seconds["feed"] += time.perf_counter() - t0

    def _take_job(self, head, flight):
        t0 = time.perf_counter()
        try:
            head.results = self._take(len(head.todo))
        except (RuntimeError, ValueError) as e:
            _raise_if_not_a_files_fault(e)
            self._recover(flight, failed=head)
        finally:
            self.seconds["wait"] += time.perf_counter() - t0

    def _recover(self, jobs, failed):
        """After a failed run (the pipeline dropped): ``failed`` (the job whose
        run failed, or None if a feed failed) runs sample by sample; the other
        jobs not yet decoded, started on the dropped pipeline, start again in
        order on a new one (a failure there is theirs: each is then run
        sample by sample too)."""
        if failed is not None:
            failed.results = self._one_by_one(failed)
        for job in jobs:
            if job is failed or not job.todo or job.results is not None:
                continue
            job.results = self._run_or_split(job)

    def _run_or_split(self, job):
        try:
            return self._run([a for _, a, _ in job.todo], job.sizes)
        except (RuntimeError, ValueError) as e:
            _raise_if_not_a_files_fault(e)
            return self._one_by_one(job)

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
            except Exception:   # not an image Pillow's header parser knows, or ForPillow
                out[j] = self._by_pillow(base + j, a)
        job.sizes = [self.pre.target_size(w, h) for _, _, (w, h) in todo]
        return job

    def _finish(self, job, encoders):
        """The batch's items, once DALI has decoded ``job.todo``."""
        out, base = job.out, job.base
        stored = []
        for (j, a, (w, h)), got in zip(job.todo, job.results or []):
            if got is None or got[1] != (h, w):
                # DALI could not decode it, or turned it otherwise than
                # Pillow's reading of its EXIF orientation.
                out[j] = self._by_pillow(base + j, a)
                continue
            stored.append((j, got[0]))
        if encoders is None:
            for j, pixels in stored:
                out[j] = (encode_pixels(pixels, self.pre), pixels.shape, None)
        else:
            payloads = encoders.map(lambda px: encode_pixels(px, self.pre), [p for _, p in stored])
            for (j, pixels), data in zip(stored, payloads):
                out[j] = (data, pixels.shape, None)
        return out

    def _by_pillow(self, position, data):
        item = preprocess_one(io.BytesIO(memoryview(data)), self.pre)
        if item[2] is None:
            with self._lock:
                self.by_pillow.append(position)
        return item
