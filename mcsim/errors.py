"""The root of the exceptions mcsim defines.

Each of them derives from :class:`McsimError` and keeps the built-in base it has always had (``ValueError``,
``KeyError``, ...), so ``except McsimError`` catches any of them and ``except ValueError`` still does too.
"""


class McsimError(Exception):
    """Base class of every exception mcsim defines."""
