"""Writing a file atomically: a reader sees the old file or the whole new one, never a part.

The new content goes to a temporary file in the same folder (so the final rename stays on one file system),
which then replaces the target with :func:`os.replace`. If anything fails first, KeyboardInterrupt included,
the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class NotARegularFile(OSError):
    """An output path that exists and is not a regular file (a device, a pipe, a socket, a folder, a link):
    mcsim never replaces one, ``--force`` or not."""


def not_a_regular_file(path) -> str | None:
    """Why ``path`` cannot be an output (None where it is missing or a regular file): what it is instead."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError:
        return None  # unreadable: writing it reports its own error
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file: mcsim writes only regular files or new paths, --force or not"


def check_regular(path) -> None:
    """Raise :class:`NotARegularFile` for an output path that exists and is not a regular file."""
    reason = not_a_regular_file(path)
    if reason:
        raise NotARegularFile(f"{path}: {reason}")


def readable_kind(path) -> str | None:
    """What an input path is when it is not a regular file (None for a regular file, or a path the open will
    report on itself): reading a named pipe or a device would block or never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return "a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else \
        "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


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
    check_regular(path)  # a device, pipe or folder is never replaced
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
