"""Reading lists of files in one native call."""
import dataclasses
import os
import threading

from fastread import _defaults
from fastread.engine import EngineOptions, cached_context, warn_if_few_fds
from fastread.errors import ReadError

# This thread's contexts by read_files()'s own arguments and the FASTREAD_*
# environment, looked up before the options are checked and coerced: that
# costs ~60-90 us a call on the 2-core VM, 1-1.4 us a file of a list of 64
# small files (a sixth of the read). See _context.
_local = threading.local()


def _context(engine, options, engine_options, nfiles):
    """The engine context read_files() reads with, opened on first use."""
    if options is None and not engine_options:
        key = (engine, _defaults.env_snapshot())  # the common call: no options to order
    else:
        try:
            given = options if options is None or isinstance(options, EngineOptions) else \
                tuple(sorted(dict(options).items()))
            key = (engine, given, tuple(sorted(engine_options.items())),
                   _defaults.env_snapshot())
            hash(key)
        except TypeError:  # an unhashable option value: no shortcut
            key = None
    if getattr(_local, "pid", None) != os.getpid():
        _local.contexts, _local.pid = {}, os.getpid()  # a fork()ed child opens its own
        _local.fds_checked = -1
    ctx = _local.contexts.get(key) if key is not None else None
    if ctx is None:
        opts = EngineOptions.coerce(options, **engine_options)
        if opts.threads is None and "FASTREAD_THREADS" not in os.environ:
            opts = dataclasses.replace(opts, threads=0)
        ctx = cached_context(engine, opts)
        if key is not None:
            _local.contexts[key] = ctx
    # RLIMIT_NOFILE once per list length this thread has not read yet (a
    # getrlimit per call is a syscall for an advisory warning).
    if nfiles > getattr(_local, "fds_checked", -1):
        warn_if_few_fds(1, nfiles)
        _local.fds_checked = nfiles
    return ctx


def raise_failures(batch, path_of, paths=True):
    """Raises ReadError for a batch with failed samples; path_of(i) names
    sample i. ``paths``: the names are file paths (the error then says what
    a path that is no regular file is); False for names inside an image."""
    failures = batch.failures()
    if failures:
        named = [(path_of(i), err) for i, err in failures]
        raise ReadError(named[0][1], named[0][0], named, detail=None if paths else "")


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
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"read_files() takes a list of paths, got one path {paths!r}: "
                        "pass [path]")
    paths = list(paths)
    batch = _context(engine, options, engine_options, len(paths)).read(paths)
    raise_failures(batch, lambda i: paths[i])
    return batch.arrays()
