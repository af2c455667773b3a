"""Lists of files read ahead on native threads (:func:`read_batches`)."""
import collections
import itertools
import os
import threading
import weakref

from fastread import _core, _defaults
from fastread.engine import EngineOptions, for_paths, open_engine, warn_if_few_fds
from fastread.errors import ReadError
from fastread.files import raise_failures, s3_detail
from fastread.s3 import S3Options


def read_batches(lists, prefetch=None, *, workers=None, engine="auto", options=None,
                 **engine_options):
    """Iterates over ``lists`` (an iterable of lists of paths or s3:// URLs),
    yielding for each list, in order, what :func:`fastread.read_files` returns
    for it: a list of uint8 arrays, one per path, in the list's order.

    The lists are read ahead on the native threads of a
    :class:`fastread.NativeReader` (the machinery of :class:`fastread.Reader`),
    with the GIL released: while the caller works on one list, the next
    ``prefetch + workers - 1`` lists are being read, as a Reader reads
    batches ahead. ``prefetch``: default 2 (``FASTREAD_PREFETCH``);
    ``workers``: native threads, each with its own engine context, reading
    lists side by side (default: one per 2 CPUs, at most 8,
    ``FASTREAD_WORKERS``). Reading starts when
    this function is called; ``lists`` is consumed lazily, a few lists ahead
    of the caller.

    Buffers: each yielded list's arrays are views into an engine-owned arena
    that stays valid as long as any of them is referenced (as with
    read_files), also after the caller has moved on to later lists; an
    arena is reused only once every array of its list is gone.

    Errors, each at its list's position: a list with a failed path raises
    :class:`fastread.ReadError` naming it (all failures are in its
    ``failures``), and iteration goes on with the next list; an error raised
    by ``lists`` itself (or a list that is a single path) is raised after
    the lists before it have been yielded, and ends the iteration. A
    KeyboardInterrupt while waiting leaves that list queued: the next
    ``next()`` returns it. Empty lists yield ``[]``.

    The engine: ``engine`` ('auto': s3 for s3:// URLs, judged by the first
    path of the first non-empty list; else the core's choice) and engine
    options (``options`` and/or keyword arguments), as for read_files. One
    engine reads every list: a local path among s3:// URLs (or the other
    way round) fails as that path's error.

    The iterator is also a context manager; ``close()`` (or leaving the
    ``with`` block, or dropping the iterator) stops the native threads.
    One thread at a time may use it.
    """
    return BatchIterator(lists, prefetch=prefetch, workers=workers, engine=engine,
                         options=options, **engine_options)


def _as_list(paths):
    """``paths`` as a list (read_files' check of one list)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"read_batches() takes lists of paths, got one path {paths!r} "
                        "as a list: pass [path]")
    # Always a copy: the paths are named (errors) lists after they were
    # pulled, and a caller may refill one list object for every yield.
    return list(paths)


class BatchIterator:
    """The iterator :func:`read_batches` returns."""

    def __init__(self, lists, *, prefetch=None, workers=None, engine="auto", options=None,
                 **engine_options):
        prefetch = _defaults.get("prefetch") if prefetch is None else prefetch
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or \
                not 1 <= prefetch <= 4096:
            raise ValueError(f"prefetch must be an integer in 1..4096 (lists read ahead), "
                             f"got {prefetch!r}")
        self.workers = _defaults.reader_workers(workers)
        self.prefetch = prefetch
        s3 = engine_options.get("s3")
        if s3 is not None and not isinstance(s3, S3Options):
            engine_options["s3"] = S3Options.coerce(s3)
        # Checked now (a wrong option fails here, not at the first list).
        self.options = EngineOptions.coerce(options, **engine_options)
        self._engine_arg = engine
        self.engine = None  # what the native reader reads with, once open
        self._lists = iter(lists)
        # Lists submitted and not yet yielded, oldest first, each as [paths]
        # or [paths, its batch] (see _next); an empty list is never submitted
        # and yields [] in turn.
        self._queued = collections.deque()
        self._error = None      # what iterating `lists` raised, after _queued
        self._exhausted = False
        self._pulled = []       # the next list, taken from `lists`, not yet queued (_fill)
        self._copied = False    # _pulled[0] is our copy (_as_list), not the caller's list
        self._native = None
        self._checked_fds = 0
        self._pid = os.getpid()
        self._inside = None  # the thread inside __next__ (see there)
        _LIVE.add(self)
        self._fill()
        if self._error is not None and not self._queued:
            # The first list already failed (an engine that does not open,
            # a wrong argument): say so at the call.
            e, self._error = self._error, None
            self.close()
            raise e

    # Lists submitted ahead of the caller: what the native reader reads at
    # once at most (prefetch + workers - 1, a Reader's read-ahead); more
    # would only wait in its queue, fewer would leave a worker idle.
    @property
    def _ahead(self):
        return self.prefetch + self.workers - 1

    def _open(self, first):
        name = for_paths(self._engine_arg, first)
        opts = self.options

        def open_one(n):
            return _core.NativeReader([], n, prefetch=self.prefetch, workers=self.workers,
                                      **opts.resolve(n))

        _, self._native = open_engine(name, open_one)
        self.engine = self._native.engine

    def _fill(self, taken=0):
        """Submits lists until ``_ahead`` are queued (besides ``taken``, the
        entry at the head whose batch is taken) or ``lists`` ends. What
        goes wrong with a list (``lists`` raising, a list that is one path, a
        path with a NUL byte, the engine not opening) is kept for that list's
        turn: the lists before it are yielded first.

        Each list goes from ``lists`` into ``_pulled`` (list.extend, in C),
        then off it and into the native queue and ``_queued`` together
        (submit_paths appends the entry in the same native call): a
        KeyboardInterrupt at any call here neither loses a list nor submits
        one twice."""
        pulled = self._pulled
        while not self._exhausted and len(self._queued) - taken < self._ahead:
            try:
                if not pulled:
                    self._copied = False   # the list about to be pulled is the caller's
                    pulled.extend(itertools.islice(self._lists, 1))
                    if not pulled:
                        self._exhausted = True
                        break
                if not self._copied:
                    pulled[0] = _as_list(pulled[0])
                    self._copied = True
                paths = pulled[0]
                if paths:
                    if self._native is None:
                        self._open(paths[0])
                    if len(paths) > self._checked_fds:
                        warn_if_few_fds(self.workers, len(paths))
                        self._checked_fds = len(paths)
                    del pulled[0]
                    self._native.submit_paths(paths, self._queued, [paths])
                else:
                    del pulled[0]
                    self._queued.append([paths])
            except Exception as e:  # noqa: BLE001 - raised at its position, in order
                pulled.clear()
                self._exhausted = True
                self._error = e
                break

    def __iter__(self):
        return self

    def __next__(self):
        # One thread at a time: the thread inside, marked and unmarked by
        # plain assignments (no lock: a signal that interrupts a lock's
        # acquire after it succeeded would leave it held for good). Under
        # the GIL the test and the mark run with no call between them, so
        # no other thread runs there.
        me = threading.get_ident()
        inside = self._inside
        if inside is not None and inside != me:
            raise RuntimeError("read_batches: the iterator is in use by another thread "
                               "(one thread at a time)")
        self._inside = me
        try:
            arrays, taken = self._next()
        except BaseException:
            self._inside = None
            raise
        # A signal is seen by Python only at a call (or a loop's jump): from
        # here to the return there is none. The list leaves the queue, its
        # batch with it, right before its arrays are returned; a
        # KeyboardInterrupt anywhere before leaves it for the next call.
        self._inside = None
        if taken:
            del self._queued[0]
        return arrays

    def _next(self):
        """(the next list's arrays, whether its entry is still to leave the
        queue)."""
        if self._pid != os.getpid():
            raise RuntimeError(f"this read_batches iterator was made in process {self._pid} and "
                               f"cannot be used after fork() (pid {os.getpid()}): its native "
                               "threads stay in the parent")
        if not self._queued:
            self._fill()  # a fill a signal cut short
        if not self._queued:
            if self._error is not None:
                e, self._error = self._error, None
                self.close()
                raise e
            self.close()
            raise StopIteration
        # The entry is [paths], then [paths, batch] once its batch is taken:
        # next_into puts the batch there in the native call that takes it,
        # and the entry leaves the queue in one step, after the arrays are
        # made. A KeyboardInterrupt anywhere in between (while waiting, as
        # the batch comes, in the caller's iterator, while the arrays are
        # made) leaves the list queued: the next call returns it.
        entry = self._queued[0]
        paths = entry[0]
        if not paths:
            self._fill(1)
            return [], True
        if len(entry) == 1:
            native = self._native
            taken = native.taken
            try:
                got = native.next_into(entry)
            except BaseException:
                # A batch the engine failed as a whole was used up by the
                # raise (taken moved, nothing in the entry): so is this
                # list, or every later list would pair with the batch
                # before it. An interrupt leaves both queued (taken kept).
                if len(entry) == 1 and native.taken != taken and self._queued and \
                        self._queued[0] is entry:
                    self._queued.popleft()
                    if self._native is not None:
                        self._fill()
                raise
            if not got:
                raise RuntimeError(f"read_batches: the native reader ended with "
                                   f"{len(self._queued)} list(s) still queued (a bug)")
            # The freed slot goes to the next list before this one's Python
            # work (checks, views), which then overlaps its reading.
            self._fill(1)
        batch = entry[1]
        detail = (lambda url: s3_detail(self.options, url)) if self.engine == "s3" else None
        try:
            raise_failures(batch, paths.__getitem__, detail_of=detail)
        except ReadError:
            self._queued.popleft()  # a failed list is used up
            raise
        return batch.arrays(), True  # the caller (__next__) takes the entry off the queue

    def close(self):
        """Stops the native threads; lists not yet yielded are dropped.
        Arrays already yielded stay valid. Closing twice is fine."""
        native, self._native = self._native, None
        self._queued.clear()
        self._exhausted = True
        if native is not None:
            if self._pid != os.getpid():
                _FORKED_NATIVE.append(native)  # its threads are the parent's
            else:
                native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# Iterators alive in this process: a fork()ed child must not join the
# native threads of its copies (they stayed in the parent); it keeps them.
_LIVE = weakref.WeakSet()
_FORKED_NATIVE = []


def _after_fork_in_child():
    for it in list(_LIVE):
        it._inside = None  # a parent thread may have been inside


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
