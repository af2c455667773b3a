"""Exceptions raised by fastread."""
import errno as _errno
import os


class ReadError(OSError):
    """A sample could not be read. ``filename`` is its path, ``errno`` why.

    When a batch has several failures, ``failures`` lists every
    ``(path, errno)``; the exception itself describes the first.
    """

    def __init__(self, err, filename, failures=None):
        super().__init__(err, os.strerror(err), filename)
        self.failures = list(failures) if failures else [(filename, err)]

    def __str__(self):
        msg = f"cannot read {self.filename!r}: {self.strerror}"
        if self.errno == _errno.EISDIR:
            msg += " (a directory was given as a file)"
        if len(self.failures) > 1:
            msg += f" (and {len(self.failures) - 1} more failed samples in this batch)"
        return msg
