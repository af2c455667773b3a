"""Reading lists of files in one native call."""
import dataclasses
import os

from fastread.engine import EngineOptions, cached_context
from fastread.errors import ReadError


def raise_failures(batch, path_of):
    """Raises ReadError for a batch with failed samples; path_of(i) names
    sample i."""
    failures = batch.failures()
    if failures:
        named = [(path_of(i), err) for i, err in failures]
        raise ReadError(named[0][1], named[0][0], named)


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
    paths = list(paths)
    opts = EngineOptions.coerce(options, **engine_options)
    if opts.threads is None and "FASTREAD_THREADS" not in os.environ:
        opts = dataclasses.replace(opts, threads=0)
    batch = cached_context(engine, opts).read(paths)
    raise_failures(batch, lambda i: paths[i])
    return batch.arrays()
