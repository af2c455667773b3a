"""Exceptions raised by fastread."""
import errno as _errno
import os
import stat as _stat

_KINDS = ((_stat.S_ISFIFO, "a FIFO"), (_stat.S_ISSOCK, "a socket"),
          (_stat.S_ISCHR, "a character device"), (_stat.S_ISBLK, "a block device"),
          (_stat.S_ISDIR, "a directory"))


def kind_of(mode):
    """What a file of ``st_mode`` ``mode`` is, in words ("a FIFO", "a
    directory", ...), or None for a regular file (or a kind not named)."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return None


def describe(path, err):
    """Why reading ``path`` failed with ``err``, in words beyond strerror:
    what the path is when that explains it (a FIFO, a socket, a device, a
    dangling symlink), else ''. Looks at the path now; never raises."""
    try:
        if err in (_errno.EINVAL, _errno.ENXIO, _errno.EISDIR, _errno.ENODEV,
                   _errno.EOPNOTSUPP):
            kind = kind_of(os.stat(path).st_mode)
            if kind is not None:
                return f"not a regular file: {kind}"
        elif err == _errno.ENOENT and os.path.islink(path):
            return f"a dangling symlink to {os.readlink(path)!r}"
    except (OSError, ValueError, TypeError):
        pass
    return ""


class ReadError(OSError):
    """A sample could not be read. ``filename`` is its path, ``errno`` why.

    When a batch has several failures, ``failures`` lists every
    ``(path, errno)``; the exception itself describes the first.
    ``detail`` says what the path was when that explains the error (a FIFO,
    a socket, a character device, a directory, a dangling symlink).
    """

    def __init__(self, err, filename, failures=None, detail=None):
        super().__init__(err, os.strerror(err), filename)
        self.failures = list(failures) if failures else [(filename, err)]
        self.detail = describe(filename, err) if detail is None else detail

    def __reduce__(self):
        # OSError pickles as cls(errno, strerror, filename), which this
        # __init__ would take as (err, filename, failures): a ReadError sent
        # from another process (a Ray task, a DataLoader worker) came back
        # naming its strerror as the path.
        return (type(self), (self.errno, self.filename, self.failures, self.detail))

    def __str__(self):
        msg = f"cannot read {self.filename!r}: {self.strerror}"
        if self.detail:
            msg += f" ({self.detail})"
        elif self.errno == _errno.EISDIR:
            msg += " (a directory was given as a file)"
        if len(self.failures) > 1:
            msg += f" (and {len(self.failures) - 1} more failed samples in this batch)"
        return msg


class SpecialFileError(ReadError):
    """A path given as a data file names no regular file: a FIFO, a socket,
    a device or a directory. Refused before a byte is read (and without
    waiting for a FIFO's writer); ``kind`` says what it is ("a FIFO", ...),
    ``errno`` is EISDIR for a directory, else EINVAL (the C engines' errno
    for the same refusal)."""

    def __init__(self, filename, kind):
        err = _errno.EISDIR if kind == "a directory" else _errno.EINVAL
        super().__init__(err, filename, detail=f"not a regular file: {kind}")
        self.kind = kind

    def __reduce__(self):
        return (type(self), (self.filename, self.kind))
