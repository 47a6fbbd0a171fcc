"""The root of the exceptions mcsim defines.

Each of them derives from :class:`McsimError` and keeps the built-in base it has always had (``ValueError``,
``KeyError``, ...), so ``except McsimError`` catches any of them and ``except ValueError`` still does too.
"""


class McsimError(Exception):
    """Base class of every exception mcsim defines."""


class OutputError(McsimError, OSError):
    """An output the run cannot write (a folder where the file should go, a path under a file, a folder that is
    not writable); found before any work starts."""


class RunLimitError(McsimError, ValueError):
    """A scenario value the simulation cannot run with, found while a sample runs (a value drawn from a
    distribution, or a workload too large for a mode's memory). ``str(err)`` is the one-line message, naming the
    key."""
