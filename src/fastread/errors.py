"""Exceptions raised by fastread."""
import errno as _errno
import os
import stat as _stat

_KINDS = ((_stat.S_ISFIFO, "a FIFO"), (_stat.S_ISSOCK, "a socket"),
          (_stat.S_ISCHR, "a character device"), (_stat.S_ISBLK, "a block device"),
          (_stat.S_ISDIR, "a directory"))


def describe(path, err):
    """Why reading ``path`` failed with ``err``, in words beyond strerror:
    what the path is when that explains it (a FIFO, a socket, a device, a
    dangling symlink), else ''. Looks at the path now; never raises."""
    try:
        if err in (_errno.EINVAL, _errno.ENXIO, _errno.EISDIR, _errno.ENODEV,
                   _errno.EOPNOTSUPP):
            mode = os.stat(path).st_mode
            for test, kind in _KINDS:
                if test(mode):
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
