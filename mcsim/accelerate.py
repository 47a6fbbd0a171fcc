"""One place for Numba's options.

Every kernel in :mod:`mcsim.kernels` is compiled through :func:`kernel`, so the project's defaults
(nopython mode, released GIL, on-disk cache policy) are set here and nowhere else.

Environment
-----------
MCSIM_NUMBA_CACHE
    ``"1"`` (default) keeps compiled kernels on disk next to their source so a new process does not
    recompile them; ``"0"`` turns the cache off (for example in worker processes that could race to
    write it).
"""

from __future__ import annotations

import os

import numba

CACHE = os.environ.get("MCSIM_NUMBA_CACHE", "1") != "0"


def kernel(*args, **kwargs):
    """``numba.njit`` with the project's defaults: nogil, cache per ``MCSIM_NUMBA_CACHE``.

    Use bare (``@kernel``) or with extra options (``@kernel(error_model="numpy")``).
    """
    options = {"nogil": True, "cache": CACHE}
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return numba.njit(**options)(args[0])
    options.update(kwargs)
    return numba.njit(*args, **options)
