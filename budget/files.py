"""Files budget writes beside its output (``search --write``, ``plot -o``,
``validate-model --write-plans``): whole or not at all.

A write that fails half-way (a full disk, a file-size limit, a folder where the file
should go) must leave no cut-off plan or picture behind, and must not destroy the file it
was replacing: each file is written to a temporary name in its own folder and renamed over
the target only once complete (a rename within one file system replaces the target whole).
A set of files (`write_all`) is written to temporary names first and renamed only when
every one was written, so a failure leaves none of them. As a plain write would, a
symbolic link is written through (the file it names is replaced, the link stays; a loop of
links is an error), a file without write permission is refused, and a target that is not
a regular file (``/dev/stdout``, a pipe, a device) is written into as it stands; other
hard links to a replaced file keep its old contents. `target` says where a path's file
lands, and `unwritable` whether it can, before the work that produces it runs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "STDIN_NAME",
    "exists",
    "plan_folder",
    "target",
    "unwritable",
    "write_all",
    "write_atomically",
]

STDIN_NAME = "<stdin>"  # what problems call a plan read from standard input (`-`)


def exists(path: Path) -> bool:
    """`Path.exists`, but False for a path the system cannot even look up (a name over its
    length limit, a NUL byte) instead of an exception: such a path names no file."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def plan_folder(path: Path | str) -> Path:
    """The folder a plan at `path` reads its relative paths (``hf_config``, ``$schema``)
    from: its file's own, through a symbolic link to the file the folder of the file it
    names, so that a plan reads the same by either name; the working folder for one read
    from standard input (`STDIN_NAME`, whatever a file of that name in it is) or through a
    pipe (``budget <(...)``, ``/dev/stdin``: its link names no folder, /proc/<pid>/fd; an
    audit, m422, found config.json looked for there)."""
    if str(path) == STDIN_NAME:
        return Path.cwd()
    try:  # through the links, as the plan was read (a pipe's resolves to no name)
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = True  # no file to ask (a plan gone since it was read): its name's folder
    return Path(os.path.realpath(path)).parent if regular else Path.cwd()


def target(path: Path) -> Path:
    """The file a write to `path` lands in: `path` through its symbolic links (a dangling
    link names the file it would create). `OSError` for a loop of links."""
    try:
        os.stat(path)
    except FileNotFoundError:
        pass  # a new file, or a dangling link: realpath names the file it would create
    except OSError as error:  # ELOOP and the like: open() would fail the same way
        error.filename = str(path)
        raise
    return Path(os.path.realpath(path))


def _special(path: Path) -> bool:
    """`path` exists and is neither a regular file nor a folder (a device, a pipe):
    written into as it stands, since a rename would replace it with a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def unwritable(path: Path) -> str | None:
    """Why a write to `path` would fail, checked before the work that produces it (a
    sweep, a drawing), in the words a problem line uses; None if it would not."""
    try:
        if _special(path):
            return None if os.access(path, os.W_OK) else "permission denied"
        real = target(path)
    except OSError as error:
        return (error.strerror or str(error)).lower()
    folder = real.parent
    if real.is_dir():
        return "is a folder; name the file to write"
    if not folder.is_dir():
        return f"there is no folder {folder}"
    if not os.access(folder, os.W_OK):
        return f"the folder {folder} is not writable"
    if real.exists() and not os.access(real, os.W_OK):
        return "permission denied"
    longest = os.pathconf(folder, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255  # POSIX
    if len(os.fsencode(real.name)) > longest:  # as the file system takes it: bytes undecoded
        return "the file name is longer than the folder allows"
    return None


def _mode(path: Path) -> int:
    """The permissions `path` keeps if it exists, else those a new file gets (the umask's)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _staged(path: Path, write: Callable[[Path], None]) -> Path:
    """`write` run on a new temporary file beside `path`; its name (deleted on failure)."""
    import tempfile  # here: `exists` is on every command's way in, and this is not

    handle, name = tempfile.mkstemp(prefix=f".{path.name[:40]}.", dir=path.absolute().parent)
    os.close(handle)
    staged = Path(name)
    try:
        write(staged)
        staged.chmod(_mode(path))
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged


def _text(data: str) -> Callable[[Path], None]:
    def write(staged: Path) -> None:
        staged.write_text(data, encoding="utf-8")

    return write


def write_atomically(path: Path, data: str | Callable[[Path], None]) -> None:
    """Write `data` (text, or a function writing a file at the path it is given) to `path`
    whole: `OSError` if it could not be, and then `path` is as it was."""
    write_all([(path, data)])


def write_all(files: Iterable[tuple[Path, str | Callable[[Path], None]]]) -> None:
    """Write every (path, data) of `files` as `write_atomically` does, none of them unless
    all could be staged; `OSError` names the file that failed."""
    staged: list[tuple[Path, Path, Path]] = []  # (temporary, the file written, as named)
    direct: list[tuple[Path, Callable[[Path], None]]] = []  # devices and pipes, as they are
    try:
        for path, data in files:
            write = _text(data) if isinstance(data, str) else data
            try:
                if _special(path):
                    direct.append((path, write))
                    continue
                real = target(path)  # through a symbolic link, as open() writes
                if real.is_dir():  # a rename cannot replace a folder: fail before the first
                    raise IsADirectoryError(21, "Is a directory")
                if real.exists() and not os.access(real, os.W_OK):  # a rename would not ask
                    raise PermissionError(13, "Permission denied")
                staged.append((_staged(real, write), real, path))
            except OSError as error:
                error.filename = str(path)
                raise
        for path, write in direct:
            try:
                write(path)
            except OSError as error:
                error.filename = str(path)
                raise
        for temporary, real, path in staged:
            try:
                os.replace(temporary, real)
            except OSError as error:
                error.filename = str(path)
                raise
    finally:
        for temporary, _, _ in staged:
            temporary.unlink(missing_ok=True)
