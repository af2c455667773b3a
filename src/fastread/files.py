"""Reading lists of files in one native call."""
import os
import threading

from fastread.engine import cached_context, for_paths, warn_if_few_fds
from fastread.errors import ReadError
from fastread.s3 import S3Options

# The list lengths this thread was checked for (RLIMIT_NOFILE): a
# getrlimit per call is a syscall for an advisory warning. The contexts
# themselves are engine.cached_context's.
_checked = threading.local()


def _context(engine, options, engine_options, nfiles):
    """The engine context read_files() reads with: this thread's, from
    :func:`fastread.engine.cached_context` (one helper thread per CPU
    unless ``threads`` says otherwise), opened on first use."""
    ctx = cached_context(engine, options, all_cpus=True, **engine_options)
    if nfiles > getattr(_checked, "nfiles", -1):
        warn_if_few_fds(1, nfiles)
        _checked.nfiles = nfiles
    return ctx


def raise_failures(batch, path_of, paths=True, context=None, detail_of=None):
    """Raises ReadError for a batch with failed samples; path_of(i) names
    sample i. ``paths``: the names are file paths (the error then says what
    a path that is no regular file is); False for names inside an image.
    A batch with a ``failure_detail(i)`` method says why sample i failed
    itself (rows of Parquet files); else ``context``: the Context that read
    the batch, when it may say more about a failure than its errno (the s3
    engine: the HTTP status and S3's error code); else ``detail_of(name)``,
    when given, asks for it."""
    failures = batch.failures()
    if failures:
        named = [(path_of(i), err) for i, err in failures]
        detail = None if paths else ""
        own = getattr(batch, "failure_detail", None)   # a batch that keeps its own words
        if own is not None and own(failures[0][0]):
            said = own(failures[0][0])
        elif context is not None:
            said = context.sample_error(failures[0][0])
        else:
            said = detail_of(named[0][0]) if detail_of is not None else None
        if said:
            # The engine's message starts with the name the error shows anyway.
            prefix = f"{named[0][0]}: "
            detail = said[len(prefix):] if said.startswith(prefix) else said
        raise ReadError(named[0][1], named[0][0], named, detail=detail)


def s3_detail(options, url):
    """The s3 engine's words for why ``url`` cannot be read now (the HTTP
    status and S3's error code), from a fresh read of it on this thread's
    context: for a Reader's errors, whose native threads keep no message
    (as errors.describe looks at a local path again). None if it reads now,
    or the engine says nothing more."""
    try:
        ctx = cached_context("s3", options)
        batch = ctx.read([url])
        return ctx.sample_error(0) if batch.failures() else None
    except (OSError, ValueError, TypeError):
        return None


def read_files(paths, engine="auto", options=None, **engine_options):
    """Reads every file and returns a list of uint8 arrays, in input order.

    One native call with the GIL released reads the whole list with many I/Os
    in flight. The arrays are views into one engine-owned arena that stays
    alive as long as any of them does. Raises ReadError naming the first path
    that failed (all failures are in its ``failures``). Engine options:
    ``options`` (a :class:`fastread.EngineOptions` or a mapping) and/or
    keyword arguments.

    One call uses the whole machine: unless ``threads`` (or FASTREAD_THREADS)
    says otherwise, the context has one io_uring ring or psync thread per CPU
    (at most 16), where a Reader's contexts have ``threads`` each, one per
    worker. (With 4, one call on a 16-core machine used a quarter of it and
    ran at 13-24% of a Reader's speed.)
    """
    return _read(paths, engine, options, engine_options, "read_files").arrays()


def read_files_packed(paths, engine="auto", options=None, **engine_options):
    """Reads every file into one buffer, back to back in input order, and
    returns ``(data, offsets)``: ``data`` 1-D uint8, ``offsets`` int64 with
    ``len(paths) + 1`` entries, file i being ``data[offsets[i]:offsets[i + 1]]``
    (the buffers of an Arrow binary column, for consumers that take a batch
    as one buffer: Ray Data blocks).

    Engines that lay whole files out themselves (io_uring, psync, s3)
    read them there directly, and ``data`` is a view of the engine's arena
    (kept alive by it, no copy); the others (O_DIRECT, which needs aligned
    slots; xnvme) are copied into it once. Same engine options and errors
    as :func:`read_files`.
    """
    return packed(_read(paths, engine, options, engine_options, "read_files_packed",
                        dense=True))


def packed(batch):
    """``(data, offsets)`` of a checked host Batch: its arena where the
    samples lie back to back there (``Batch.packed()``), else the samples
    copied into one buffer."""
    import numpy as np

    out = batch.packed()
    if out is not None:
        return out
    arrays = batch.arrays()
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    data = np.concatenate(arrays) if arrays else np.zeros(0, np.uint8)
    return data, offsets


def _read(paths, engine, options, engine_options, caller, dense=False):
    """The checked Batch of one native read of ``paths`` (ReadError naming
    the first that failed)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"{caller}() takes a list of paths, got one path {paths!r}: "
                        "pass [path]")
    if type(paths) is not list:
        # Context.read() makes its own copy, which keeps the paths alive while
        # the GIL is released; this one is only for naming a failed path.
        paths = list(paths)
    if paths:
        engine = for_paths(engine, paths[0])
    s3 = engine_options.get("s3")
    if s3 is not None and not isinstance(s3, S3Options):
        # A mapping cannot key the context cache: as S3Options (hashable) the
        # next call with the same options reuses this context's connections.
        engine_options["s3"] = S3Options.coerce(s3)
    ctx = _context(engine, options, engine_options, len(paths))
    batch = ctx.read(paths, dense=dense)
    raise_failures(batch, lambda i: paths[i], context=ctx)
    return batch
