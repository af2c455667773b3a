"""Opening a file the user named, for reading, as untrusted input.

Every Python path that reads a user's file (the index builds of the record
formats, the ``.npy`` probe, packed images and their indexes, feature
stores, bmaps, file lists, decoding) opens it here, so that a FIFO, a
socket, a device or a directory where a data file should be is refused by
name, at once, instead of blocking (``open()`` of a FIFO waits for a writer;
a read of ``/dev/zero`` never ends) or being parsed as data.

How: ``open(O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)``, then ``fstat``
of the *descriptor*, then ``O_NONBLOCK`` cleared. The check is made on what
was opened, not on a name looked at before, so a file swapped for a FIFO
between a ``stat`` and the ``open`` cannot slip through (and a FIFO opened
without a writer does not wait: O_NONBLOCK). Symlinks are followed, as the
native engines follow them (datasets are often trees of links); the target
is what is checked. A device is opened (never read) before it is refused:
opening a device cannot block with O_NONBLOCK, and O_NOCTTY keeps a terminal
from becoming the process's controlling one. The C engines refuse the same
files the same way (``psync.c`` ``open_one``, ``fr_open_image``).

Block devices are refused unless the caller reads them by design
(``block_devices=True``: packed images, ``FileRanges`` and feature stores
over a device).
"""
import errno
import os
import stat

from fastread.errors import SpecialFileError, kind_of

__all__ = ["open_fd", "open_file"]

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# What open(2) of a special file fails with: a socket (ENXIO), a device
# without a driver (ENXIO, ENODEV), some file systems' special files.
_SPECIAL_OPEN_ERRNOS = (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP)


def _kind_now(path):
    """What ``path`` is now when no regular file, else None (a failed
    open's cause, looked up after it: the open's error stands otherwise)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def open_fd(path, *, block_devices=False, blocking=True):
    """``(fd, st)``: a descriptor of ``path`` open for reading and its
    ``os.stat_result``; the caller closes the descriptor. Raises
    :class:`fastread.errors.SpecialFileError` (a ReadError naming the path
    and what it is) for anything but a regular file (or a block device,
    with ``block_devices``); the OSError of ``open`` itself (naming the path)
    for a missing or unreadable one. ``blocking=False`` leaves O_NONBLOCK
    set, which regular files and block devices ignore: two system calls
    fewer for callers that only ``pread`` (the ``.npy`` probe)."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as e:
        # A socket cannot be opened at all (ENXIO): say what it is.
        kind = _kind_now(path) if e.errno in _SPECIAL_OPEN_ERRNOS else None
        if kind is not None:
            raise SpecialFileError(os.fsdecode(path), kind) from None
        raise
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not (stat.S_ISREG(mode) or (block_devices and stat.S_ISBLK(mode))):
            raise SpecialFileError(os.fsdecode(path), kind_of(mode) or "not a regular file")
        if blocking:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_file(path, *, block_devices=False):
    """``path`` opened with :func:`open_fd`, as a binary file object
    (``open(path, "rb")`` for untrusted paths)."""
    fd, _ = open_fd(path, block_devices=block_devices)
    try:
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
