"""Writing a file atomically: a reader sees the old file or the whole new one, never a part.

The new content goes to a temporary file in the same folder (so the final rename stays on one file system),
which then replaces the target with :func:`os.replace`. If anything fails first, KeyboardInterrupt included,
the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _create_temporary(path: Path) -> Path:
    """A new empty file named ``.<name>.<random>.tmp`` next to ``path``, with the permissions ``open()`` gives a
    new file (0666 less the umask, applied by the system: the umask is never changed, so threads are safe)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name next to {path}")


@contextmanager
def atomic_path(path, *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends normally it replaces ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write; its folder must exist. An existing file is replaced (callers that must not overwrite
        check first).
    mode : int, optional
        Permission bits of the written file; by default those a new file gets (0666 less the umask).

    Examples
    --------
    >>> with atomic_path("out.nc") as tmp:  # doctest: +SKIP
    ...     ds.to_netcdf(tmp)
    """
    path = Path(path)
    tmp = _create_temporary(path)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path, data: str | bytes, *, encoding: str | None = "utf-8", fsync: bool = False,
                 mode: int | None = None) -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically (see :func:`atomic_path`); return the path.

    ``encoding`` applies to text (``None``: the locale's, as :meth:`pathlib.Path.write_text`); with ``fsync``
    the data reach the disk before the rename.
    """
    with atomic_path(path, mode=mode) as tmp:
        if isinstance(data, bytes):
            f = open(tmp, "wb")
        else:
            f = open(tmp, "w", encoding=encoding)
        with f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return Path(path)
