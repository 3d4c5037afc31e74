"""Atomic renames and hidden sibling paths: the OS-level part of writing outputs without ever losing data.

- :func:`rename_noreplace` moves a file or directory to a path that must not
  exist; if something appeared there it fails with :class:`FileExistsError`
  and nothing is changed.
- :func:`rename_exchange` swaps two paths in one step: at every instant each
  path holds the old or the new entry, never nothing.
- :func:`sibling_path` names a hidden sibling ``.{name}{infix}{pid}-{start}-{rand}``
  that records the process that owns it (its pid and its start time, so a
  reused pid is not mistaken for the owner); :func:`remove_stale_siblings`
  removes those whose process is gone (killed with SIGKILL, a power loss).
- :func:`write_file_atomic` writes a file through such a sibling.

On Linux both renames are ``renameat2(2)`` (glibc 2.28+, kernel 3.15+; ext4,
xfs, btrfs, tmpfs and overlayfs support both flags). Where it is missing
(other systems) or the file system refuses the flag (``EINVAL``, e.g. some
network file systems):

- :func:`rename_noreplace` of a file uses ``link`` + ``unlink``, which never
  replaces anything. Of a directory it checks that the target does not exist
  and then uses ``rename``, which fails on an existing file or non-empty
  directory: the only thing it can replace is an *empty* directory created in
  the instant between the check and the rename, so no data is ever lost.
- :func:`rename_exchange` raises :class:`ExchangeUnsupported`: an exchange by
  two renames would leave a moment with nothing at one path, so callers refuse
  instead.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

#: ``renameat2`` flags (linux/fs.h).
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: Errors meaning "this system or file system cannot do this rename flag", not "this rename failed".
_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})
_renameat2_fn = None


class ExchangeUnsupported(OSError):
    """The system or the file system cannot exchange two paths atomically."""


def _renameat2():
    """libc's ``renameat2``, or None where there is none."""
    global _renameat2_fn
    if _renameat2_fn is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (AttributeError, OSError):
            fn = False
        _renameat2_fn = fn
    return _renameat2_fn or None


def _call_renameat2(src: os.PathLike | str, dst: os.PathLike | str, flags: int) -> int:
    """0 on success, else the errno (-1: no ``renameat2`` here)."""
    fn = _renameat2()
    if fn is None:
        return -1
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno()


def rename_noreplace(src: os.PathLike | str, dst: os.PathLike | str) -> None:
    """Move ``src`` to ``dst``, which must not exist (:class:`FileExistsError` if it does; nothing changes)."""
    err = _call_renameat2(src, dst, RENAME_NOREPLACE)
    if err == 0:
        return
    if err not in _UNSUPPORTED and err != -1:
        raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))
    if not os.path.isdir(src) or os.path.islink(src):
        os.link(src, dst, follow_symlinks=False)  # fails with FileExistsError: never replaces
        os.unlink(src)
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
    os.rename(src, dst)  # fails on a file or a non-empty directory at dst


def rename_exchange(a: os.PathLike | str, b: os.PathLike | str) -> None:
    """Swap ``a`` and ``b`` (both must exist) atomically, or raise :class:`ExchangeUnsupported`."""
    err = _call_renameat2(a, b, RENAME_EXCHANGE)
    if err == 0:
        return
    if err in _UNSUPPORTED or err == -1:
        reason = "no renameat2 in this system's C library" if err == -1 else os.strerror(err)
        raise ExchangeUnsupported(errno.ENOTSUP if err == -1 else err,
                                  f"atomic exchange not supported here ({reason})", os.fspath(a), None, os.fspath(b))
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))


# ------------------------------------------------------------------------------------------ owned hidden siblings

def process_start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: fields after the last ')'
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def process_alive(pid: int, start_time: int | None) -> bool:
    """Whether the process that had ``pid`` and ``start_time`` (None: unknown) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    if start_time is None:
        return True
    now = process_start_time(pid)
    return now is None or now == start_time  # another start time: the pid was reused


def sibling_path(path: Path, infix: str) -> Path:
    """A new hidden sibling name of ``path`` owned by this process (nothing is created)."""
    start = process_start_time(os.getpid())
    return path.parent / f".{path.name}{infix}{os.getpid()}-{start or 0}-{os.urandom(4).hex()}"


def _sibling_pattern(path: Path, infixes: tuple[str, ...]) -> re.Pattern:
    alternatives = "|".join(re.escape(i) for i in infixes)
    # Names written before start times were recorded have no "-{start}" part: their pid alone decides.
    return re.compile(rf"^\.{re.escape(path.name)}(?:{alternatives})(?P<pid>\d+)-(?:(?P<start>\d+)-)?[0-9a-f]{{8}}$")


def stale_siblings(path: Path, infixes: tuple[str, ...]) -> list[Path]:
    """Hidden siblings of ``path`` (see :func:`sibling_path`) whose owning process is gone, sorted."""
    pattern = _sibling_pattern(path, infixes)
    try:
        names = sorted(os.listdir(path.parent))
    except OSError:
        return []
    stale = []
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        pid, start = int(match["pid"]), match["start"]
        if not process_alive(pid, int(start) if start and start != "0" else None):
            stale.append(path.parent / name)
    return stale


def remove_stale_siblings(path: Path, infixes: tuple[str, ...]) -> list[Path]:
    """Remove the stale hidden siblings of ``path``; returns what was removed (failures are logged)."""
    removed = []
    for sibling in stale_siblings(path, infixes):
        try:
            if sibling.is_dir() and not sibling.is_symlink():
                shutil.rmtree(sibling)
            else:
                sibling.unlink()
            removed.append(sibling)
        except OSError as err:
            logger.warning("tflms: cannot remove %s, left by a process that is gone: %s", sibling, err)
    return removed


# ------------------------------------------------------------------------------------------ durability

def fsync_path(path: os.PathLike | str) -> None:
    """Flush a file or directory to disk (a directory: its entries, i.e. renames and new names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: os.PathLike | str) -> None:
    """Flush every file and directory under ``root`` (so a renamed-in tree is complete after a power loss)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                fsync_path(full)
        fsync_path(dirpath)


#: Infix of the hidden temporary file :func:`write_file_atomic` writes first.
FILE_TEMP_INFIX = ".tflms-tmp-"


def write_file_atomic(path: os.PathLike | str, data: bytes, *, replace: bool) -> None:
    """Write ``data`` to ``path`` through a hidden sibling and one rename: ``path`` is old or complete, never partial.

    ``replace=False``: an existing ``path`` raises :class:`FileExistsError`
    (also one created while writing) and is left alone. Temporary files left
    by killed writers of ``path`` are removed first. The new file gets the
    mode a new file gets (the umask applies); a replaced file keeps its mode.
    """
    path = Path(path)
    remove_stale_siblings(path, (FILE_TEMP_INFIX,))
    tmp = sibling_path(path, FILE_TEMP_INFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            try:
                os.chmod(tmp, os.stat(path).st_mode & 0o7777)
            except FileNotFoundError:
                pass
            os.replace(tmp, path)
        else:
            rename_noreplace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_path(path.parent)
