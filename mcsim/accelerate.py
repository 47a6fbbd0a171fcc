"""One place for Numba's options.

Every kernel in :mod:`mcsim.kernels` is compiled through :func:`kernel`, so the project's defaults
(nopython mode, released GIL, on-disk cache policy) are set here and nowhere else.

Environment
-----------
MCSIM_NUMBA_CACHE
    ``"1"`` (default) keeps compiled kernels on disk next to their source so a new process does not
    recompile them; ``"0"`` turns the cache off (for example in worker processes that could race to
    write it).

Numba checks a cached kernel against its own source file only, but the kernels inline helpers from the other files
of :mod:`mcsim.kernels`: a change there would leave a stale kernel in the cache, silently. So the cache lives in a
folder named by a digest of every kernel source (``kernels/__pycache__/numba-<digest>``), unless ``NUMBA_CACHE_DIR``
says otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import llvmlite.binding
import numba

CACHE = os.environ.get("MCSIM_NUMBA_CACHE", "1") != "0"


def _cache_folder() -> Path | None:
    """``kernels/__pycache__/numba-<digest of every kernel source>``, or None where the kernels cannot be found."""
    spec = importlib.util.find_spec("mcsim.kernels")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    digest = hashlib.sha256()
    for source in sorted(folder.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return folder / "__pycache__" / f"numba-{digest.hexdigest()[:16]}"


if CACHE and not os.environ.get("NUMBA_CACHE_DIR"):
    _folder = _cache_folder()
    if _folder is not None:
        numba.config.CACHE_DIR = str(_folder)

# LLVM's instruction selection merges runs of consecutive stores into wider ones, at a cost that grows faster than
# the run: the step loop's generator saves and restores about 900 values at each yield, and that one pass took
# 96 of its 122 s of LLVM time (NUMBA_LLVM_PASS_TIMINGS=1). Without it: 5 s, and the kernels run within a few per
# cent of their speed with it (benchmarks/README.md). Off for every kernel: off for the step loop alone, its
# preemption cases ran 6-10 % slower. An option LLVM does not know is ignored (the C API reports to a null stream).
llvmlite.binding.set_option("mcsim", "-combiner-store-merging=0")


def kernel(*args, refcounts: bool = True, **kwargs):
    """``numba.njit`` with the project's defaults: nogil, cache per ``MCSIM_NUMBA_CACHE``.

    Use bare (``@kernel``) or with extra options (``@kernel(error_model="numpy")``).

    ``refcounts=False`` compiles the kernel without Numba's runtime (``_nrt=False``): it can allocate no array (it
    fails to compile if it tries; its caller passes every buffer in), and in exchange no array it touches is
    reference-counted. With the runtime, every array handed to an inlined helper is counted up and down again,
    each count an atomic operation behind an indirect call, and Numba's pruning pass does not remove the counts
    that branches or loops separate (numba/numba#2345, #2350): the KV tiers' replay loop ran 12x slower with them
    on a repeated request and 3.6x on the factory's requests (``python benchmarks/refcounts.py``). For loops that
    call helpers over arrays they do not own.
    """
    options = {"nogil": True, "cache": CACHE}
    if not refcounts:
        options["_nrt"] = False
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return numba.njit(**options)(args[0])
    options.update(kwargs)
    return numba.njit(*args, **options)
