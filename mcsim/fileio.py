"""Writing a file atomically: a reader sees the old file or the whole new one, never a part.

The new content goes to a temporary file in the same folder (so the final rename stays on one file system),
which then replaces the target with :func:`os.replace`. If anything fails first, KeyboardInterrupt included,
the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mcsim.errors import OutputError
from mcsim.text import one_line

#: What every temporary name mcsim makes carries, so that cleanup can never take a user's file for its own.
TEMP_MARK = "mcsim-tmp"
#: First bytes of what mcsim writes through a temporary file that a later run may clean up: NetCDF-4 (HDF5) and
#: npz (zip) files. A look-alike name with other content is left alone.
_OWN_MAGICS = (b"\x89HDF\r\n\x1a\n", b"PK\x03\x04")


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
    """A new empty file named ``.<name>.mcsim-tmp-<16 hex>.tmp`` next to ``path``, with the permissions ``open()``
    gives a new file (0666 less the umask, applied by the system: the umask is never changed, so threads are
    safe)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{TEMP_MARK}-{secrets.token_hex(8)}.tmp")
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


def temporary_pattern(name_pattern: str) -> str:
    """The regular expression of the temporary names :func:`atomic_path` gives a file whose name matches
    ``name_pattern`` (itself a regular expression)."""
    return r"\." + name_pattern + r"\." + re.escape(TEMP_MARK) + r"-[0-9a-f]{16}\.tmp"


def stale_temporaries(path) -> list[Path]:
    """The temporary files a write of ``path`` cut short by a kill left beside it, and only those.

    A file counts as mcsim's own when its name is exactly ``.<name>.mcsim-tmp-<16 hex>.tmp``, it is a regular
    file (a link is never followed, nor removed) and it is empty or starts as a NetCDF-4 or npz file does. Any
    other file, whatever its name, belongs to the user and is never touched.
    """
    path = Path(path)
    pattern = re.compile(temporary_pattern(re.escape(path.name)))
    folder = path.parent if str(path.parent) else Path(".")
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if not pattern.fullmatch(name):
            continue
        candidate = folder / name
        try:
            if not stat.S_ISREG(os.lstat(candidate).st_mode):
                continue
            with open(candidate, "rb") as f:
                head = f.read(8)
        except OSError:
            continue
        if not head or any(head.startswith(magic) for magic in _OWN_MAGICS):
            found.append(candidate)
    return found


def same_file(a, b) -> bool:
    """Whether two paths name one file (through links, relative parts and hard links); False when either is
    missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_inputs(output, inputs: Iterable, what: str = "the output") -> None:
    """Raise :class:`~mcsim.errors.OutputError` when ``output`` is one of the command's own ``inputs``:
    ``--force`` replaces an earlier result, never what the command reads."""
    for source in inputs:
        if source and same_file(output, source):
            raise OutputError(f"{output}: is an input of this command ({source}); give another path for {what}, "
                              "--force or not")


# -- folders of outputs ------------------------------------------------------------------------------------------

#: The file that lists what an output folder's earlier writer put there: a folder mcsim replaces must hold that
#: list and nothing else.
MANIFEST = ".mcsim-manifest.json"


def _listed_files(folder: Path, kind: str) -> list[str] | None:
    """The files the folder's manifest says an earlier ``kind`` wrote, or None without a valid manifest."""
    path = folder / MANIFEST
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, encoding="utf-8") as f:
            listed = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(listed, dict):
        return None
    files = listed.get("files")
    if listed.get("kind") != kind or not isinstance(files, list) or not all(
            isinstance(n, str) and n and "/" not in n and n not in (".", "..") for n in files):
        return None
    return files


def _stage_name(name: str) -> bool:
    return bool(re.fullmatch(r"\..*" + re.escape(TEMP_MARK) + r"-[0-9a-z_]+\.tmp", name))


def earlier_output_folder(folder, kind: str, overwrite: bool) -> list[str] | None:
    """What ``folder`` holds of an earlier ``kind`` (a report, say) before one is written into it.

    Returns None where the folder does not exist, ``[]`` where it is empty and the earlier files where it holds
    only an earlier ``kind`` that mcsim wrote (its manifest lists them). Raises :class:`~mcsim.errors.OutputError`
    for a link, a file, or a folder holding anything else (the working folder, an input's folder, any user's
    folder: ``--force`` never empties one), and :class:`FileExistsError` for an earlier ``kind`` without
    ``overwrite``.
    """
    folder = Path(folder)
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        raise OutputError(f"{folder}: is a symbolic link; mcsim writes a {kind} only into a real folder, --force "
                          "or not")
    if not stat.S_ISDIR(mode):
        raise OutputError(f"{folder}: exists and is not a folder")
    entries = sorted(n for n in os.listdir(folder) if not _stage_name(n))
    if not entries:
        return []
    files = _listed_files(folder, kind)
    # without a valid manifest every entry is the user's, a file named like the manifest included
    foreign = entries if files is None else [n for n in entries if n != MANIFEST and n not in files]
    if foreign:
        raise OutputError(f"{folder}: holds files that are not an earlier mcsim {kind} (e.g. "
                          f"{one_line(foreign[0], 80)!s}); give a new or empty folder, --force or not")
    for name in files:
        try:
            if not stat.S_ISREG(os.lstat(folder / name).st_mode):
                raise OutputError(f"{folder / one_line(name, 80)}: is not a regular file, so not part of an "
                                  f"earlier {kind}; give a new or empty folder")
        except FileNotFoundError:
            continue
    if not overwrite:
        raise FileExistsError(f"{folder} holds an earlier {kind}; use --force to replace it")
    return files


@contextmanager
def output_folder(folder, kind: str, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder; when the block ends normally its files become ``folder``'s.

    ``folder`` must be new, empty or hold only an earlier ``kind`` of mcsim's (see
    :func:`earlier_output_folder`). A new folder is renamed into place whole; into an existing one each file moves
    by its own rename, the earlier files no longer written are removed, and the manifest is replaced last. Nothing
    else in the folder is touched, and a failure leaves it as it was.

    Examples
    --------
    >>> with output_folder("outputs/r", "report") as stage:  # doctest: +SKIP
    ...     (stage / "summary.md").write_text("...")
    """
    folder = Path(folder)
    earlier = earlier_output_folder(folder, kind, overwrite)
    if earlier is None:
        parent = Path(os.path.abspath(folder)).parent
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.{TEMP_MARK}-", suffix=".tmp", dir=parent))
    else:
        stage = Path(tempfile.mkdtemp(prefix=f".{TEMP_MARK}-", suffix=".tmp", dir=folder))
    try:
        yield stage
        names = sorted(os.listdir(stage))
        for name in names:
            if not stat.S_ISREG(os.lstat(stage / name).st_mode):
                raise OutputError(f"{stage / name}: an output folder holds regular files only")
        with open(stage / MANIFEST, "w", encoding="utf-8") as f:
            json.dump({"kind": kind, "files": names}, f, indent=1)
        if earlier is None:
            os.rename(stage, folder)  # fails where the folder appeared meanwhile with something in it
        else:
            for name in names:
                os.replace(stage / name, folder / name)
            for name in set(earlier) - set(names):
                try:
                    if stat.S_ISREG(os.lstat(folder / name).st_mode):
                        os.unlink(folder / name)
                except FileNotFoundError:
                    pass
            os.replace(stage / MANIFEST, folder / MANIFEST)
            stage.rmdir()
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
