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
import numba.core.event

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

#: Kernels compiled without LLVM's store merging (:func:`kernel`'s ``store_merging``), by ``id``.
_WITHOUT_STORE_MERGING: set = set()


class _StoreMerging(numba.core.event.Listener):
    """Turns LLVM's merging of consecutive stores off while a kernel of :data:`_WITHOUT_STORE_MERGING` compiles
    (with whatever it compiles on the way), and back on after.

    LLVM's instruction selection merges runs of consecutive stores into wider ones, at a cost that grows faster than
    the run. The step loop's generator saves and restores about 900 values at each yield: that one pass took 96 of
    its 122 s of LLVM time (``NUMBA_LLVM_PASS_TIMINGS=1``), 5 s without it, and the step loop runs as fast
    (benchmarks/README.md). The other kernels keep LLVM's default. Numba compiles under one lock, so no other
    compile sees the option changed. An option LLVM does not know is ignored (its C API reports to a null stream).
    """

    depth = 0

    def on_start(self, event):
        if id(event.data["dispatcher"]) in _WITHOUT_STORE_MERGING:
            if self.depth == 0:
                llvmlite.binding.set_option("mcsim", "-combiner-store-merging=0")
            self.depth += 1

    def on_end(self, event):
        if id(event.data["dispatcher"]) in _WITHOUT_STORE_MERGING:
            self.depth -= 1
            if self.depth == 0:
                llvmlite.binding.set_option("mcsim", "-combiner-store-merging=1")


numba.core.event.register("numba:compile", _StoreMerging())


def kernel(*args, store_merging: bool = True, **kwargs):
    """``numba.njit`` with the project's defaults: nogil, cache per ``MCSIM_NUMBA_CACHE``.

    Use bare (``@kernel``) or with extra options (``@kernel(error_model="numpy")``). ``store_merging=False``
    compiles it without LLVM's merging of consecutive stores (:class:`_StoreMerging`).
    """
    options = {"nogil": True, "cache": CACHE, **kwargs}
    if len(args) == 1 and callable(args[0]):
        return _register(numba.njit(**options)(args[0]), store_merging)
    return lambda function: _register(numba.njit(*args, **options)(function), store_merging)


def _register(dispatcher, store_merging: bool):
    if not store_merging:
        _WITHOUT_STORE_MERGING.add(id(dispatcher))
    return dispatcher
