"""Files accel writes whole or not at all: checkpoints, the plan cache's entries, compile's markers.

Each is written to a temporary file in the same folder, flushed, and renamed over its name: a reader sees the old
file or the new one (a crash, a full disk, SIGKILL). The temporary name is short, unique to its writer (two writers
never share one) and names the writer's host and process, so a later write removes what a killed writer left.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import socket
import stat
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from accel.errors import loops_level

PREFIX = ".accel-"
SUFFIX = ".tmp"


def _tag(text: str) -> str:
    return hashlib.blake2b(text.encode(errors="surrogateescape"), digest_size=4).hexdigest()


HOST = _tag(socket.gethostname())


def temporary_name(path: Path) -> Path:
    """A fresh temporary name for writing path: its folder, a digest of its name, this host and process."""
    return path.parent / f"{PREFIX}{_tag(path.name)}-{HOST}-{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # (beyond any process id: none such)
        return True
    except OSError:  # another user's process: alive
        return False
    return False


_WRITING: set[str] = set()  # the names of this process's temporary files being written now (by any thread): a name,
# unique to its writer, whatever spelling of the folder (relative, through a link) clear() or another write uses


def left_over(temporary: Path) -> bool:
    """Whether one of accel's temporary files is left over: its writer on this host died, or it is this process's
    own and no write holds it any more (a Ctrl-C at the worst moment). A live writer's, or another host's (whose
    processes this one cannot see), is being written."""
    _, host, pid, _ = (temporary.name[len(PREFIX):-len(SUFFIX)].split("-") + ["", "", "", ""])[:4]
    if host != HOST or not (pid.isascii() and pid.isdigit()):  # ('²' is a digit to isdigit, not to int)
        return False
    return temporary.name not in _WRITING if int(pid) == os.getpid() else _gone(int(pid))


def remove_leftovers(path: Path) -> None:
    """Remove the temporary files that writers of path on this host left (left_over)."""
    for leftover in path.parent.glob(f"{PREFIX}{_tag(path.name)}-{HOST}-*{SUFFIX}"):
        if left_over(leftover):
            with contextlib.suppress(IsADirectoryError):  # a folder of that name is not accel's: the next goes on
                leftover.unlink(missing_ok=True)


def write_atomically(path, write: Callable[[BinaryIO], None]) -> None:
    """Write path whole through ``write(file)``, or leave it as it was (raising why)."""
    path = Path(path)
    with contextlib.suppress(OSError):  # an unreadable folder: the write says why
        remove_leftovers(path)
    temporary = temporary_name(path)
    _WRITING.add(temporary.name)
    try:
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask decides, as for open()
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # or, if a Ctrl-C skips this, the next write of path
        raise
    finally:
        _WRITING.discard(temporary.name)
    with contextlib.suppress(OSError):  # the rename itself on the disk (a power cut could lose it), where it can be
        handle = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def read_small(path, limit: int = 1 << 20) -> bytes:
    """The bytes of a small regular file (a pointer, a cache entry, a tag), or an OSError saying why not: a named
    pipe, a device or a folder under that name is refused without waiting on it, a file over ``limit`` bytes unread,
    a symbolic link not followed (errno ELOOP: the open itself refuses it, so no link swapped in after a check is
    read; a shared folder's link would point the read anywhere)."""
    try:  # a named pipe opens at once, with no writer
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, not followed", str(path)) from None
        raise
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if status.st_size > limit:
            size, most = size_text(status.st_size), size_text(limit)
            size, most = (size, most) if size != most else (f"{status.st_size} bytes", f"{limit}")  # (both 1.0 MiB)
            raise OSError(errno.EFBIG, f"{size}, more than the {most} expected", str(path))
        with os.fdopen(handle, "rb", closefd=False) as file:
            data = file.read(limit + 1)
        if len(data) > limit:  # it grew since, or says no size (/proc): never a silently cut read
            raise OSError(errno.EFBIG, f"more than the {size_text(limit)} expected", str(path))
        return data
    finally:
        os.close(handle)


def linked(path: Path, cache: str, then: str) -> bool:
    """Whether one of a cache's own files or folders is a symbolic link, said with what ``then`` happens: accel
    follows none in its caches (a shared or hostile cache would point its reads and writes anywhere)."""
    if not path.is_symlink():
        return False
    warnings.warn(f"accel: {path} in {cache} is a symbolic link, and accel does not follow links there: {then}",
                  stacklevel=loops_level())
    return True


def write_text(path, text: str) -> None:
    write_atomically(path, lambda file: file.write(text.encode()))


def disk_full(error: BaseException) -> bool:
    """Whether an error writing a file came from a full disk or quota (torch's writer hides the errno)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(words in str(error) for words in ("No space left", "unexpected pos", "file write failed"))


def space(folder: Path) -> str:
    """How much room the disk holding folder has: '12.0 MiB free of 1.0 GiB'."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return "its free space unknown"
    return f"{size_text(usage.free)} free of {size_text(usage.total)}"


def size_text(count: float) -> str:
    """12582912 -> '12.0 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def cache_dir(where: Any = True) -> Path:
    """accel's cache folder: ``where`` when it is a path, else $ACCEL_CACHE_DIR, else $XDG_CACHE_HOME/accel/plans,
    else ~/.cache/accel/plans (compile's artifacts in its ``compile/``)."""
    if where not in (True, None) and not isinstance(where, bool):
        return Path(where)
    if os.environ.get("ACCEL_CACHE_DIR"):
        return Path(os.environ["ACCEL_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "accel" / "plans"
