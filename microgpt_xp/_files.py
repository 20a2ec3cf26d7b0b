"""Files the project writes: atomic writes, a claim on an output, checks before the work.

A write goes to a temporary file ``.NAME.<16 hex digits>.tmp`` in the target's folder and
is renamed over the target, so a reader sees the old file (or none) or the whole new one.
Its writer holds an exclusive ``flock`` on it until after the rename; a lock dies with its
process, so a temporary file whose lock can be taken is stale (its writer is gone), and
after each write the stale temporary files of exactly that target are removed. A cleaner
locks a file before removing it, and a writer checks, once it holds the lock on its new
file, that the name still leads to it, so a live writer's file is never removed. Without
``flock`` (some file systems, Windows) no other writer's file is removed.

:func:`claim` holds an ``flock`` on ``.NAME.lock`` next to the target while the run lives,
so that two runs never write one output; a dead run releases it with its process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

#: ``(st_dev, st_ino)`` of the files this process holds locked: its cleaners and claims
#: skip them unopened (closing any descriptor drops a process's POSIX locks, which is
#: what ``flock`` is over NFS).
_HELD: set[tuple[int, int]] = set()


class NotWritableError(OSError):
    """A path that a save could not write (a folder, a path under a file, a read-only or
    missing folder)."""


def check_writable(path: str | Path, *, make_parents: bool = True) -> Path:
    """``path``, once a temporary file could be created (and removed) in its folder, as a
    save does (missing folders made first when ``make_parents``); else
    :class:`NotWritableError`, one line naming the path and why."""
    path = Path(path)
    if path.is_dir():
        raise NotWritableError(f"cannot write {str(path)!r}: it is a folder")
    folder = _folder(path, make_parents)
    try:
        fd, tmp = _new_temp(path)
    except OSError as exc:
        raise NotWritableError(
            f"cannot write {str(path)!r}: cannot create a file in folder {str(folder)!r} "
            f"({exc.strerror or exc})"
        ) from exc
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    _release(fd)
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one existing file (through links and other spellings):
    an output that would replace an input."""
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except (OSError, ValueError):
        return False


def _folder(path: Path, make_parents: bool) -> Path:
    """The folder of ``path``, created first when ``make_parents``."""
    folder = path.parent
    if not make_parents:
        if not folder.is_dir():
            raise NotWritableError(
                f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist"
            )
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists()), folder)
        raise NotWritableError(
            f"cannot write {str(path)!r}: {str(blocker)!r} is a file, not a folder"
        ) from exc
    except OSError as exc:
        raise NotWritableError(
            f"cannot write {str(path)!r}: cannot create folder {str(folder)!r} "
            f"({exc.strerror or exc})"
        ) from exc
    return folder


def atomic_open(
    path: str | Path, mode: str = "w", *, make_parents: bool = True
) -> contextlib.AbstractContextManager[IO[Any]]:
    """``with atomic_open(path) as f: f.write(...)`` writes ``path`` atomically and durably
    (``mode`` ``"w"``, UTF-8, or ``"wb"``): the temporary file is fsynced and renamed over
    ``path`` when the block ends, removed when it raises (``path`` left as it was). Its
    mode is ``open()``'s; missing folders are made when ``make_parents``, else
    :class:`NotWritableError` before the block runs."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes with mode 'w' or 'wb', not {mode!r}")
    return _atomic_open(Path(path), mode, make_parents)


@contextlib.contextmanager
def _atomic_open(path: Path, mode: str, make_parents: bool) -> Iterator[IO[Any]]:
    _folder(path, make_parents)
    fd, tmp = _new_temp(path)
    try:
        # the file object gets its own descriptor: the lock on ``fd`` outlives its close
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(os.dup(fd), mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the content is on disk before the name points to it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    finally:
        _release(fd)
    _fsync_dir(path.parent)
    _remove_stale_temps(path)


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_open`; returns it."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_open(path, "wb") as f:
        f.write(raw)
    return path


def _new_temp(path: Path) -> tuple[int, Path]:
    """A new temporary file for ``path``, created and locked (release with :func:`_release`)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        # 0o666: the kernel applies the umask, as open() does
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        _lock(fd, blocking=True)
        # a cleaner may have removed it before we locked it
        if _still_named(fd, tmp):
            _HELD.add(_key(os.fstat(fd)))
            return fd, tmp
        os.close(fd)


def _remove_stale_temps(path: Path) -> None:
    """Remove the temporary files of ``path`` whose writers are gone (their lock is free)."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{16}}\.tmp")
    try:
        with os.scandir(path.parent) as entries:
            names = [e.name for e in entries if pattern.fullmatch(e.name)]
    except OSError:
        return
    for name in names:
        candidate = path.parent / name
        with contextlib.suppress(OSError):  # gone already, or not ours to open
            if _key(os.stat(candidate)) in _HELD:
                continue  # this process writes it now
            fd = os.open(candidate, os.O_RDONLY)
            try:
                if _lock(fd, blocking=False) and _still_named(fd, candidate):
                    candidate.unlink()
            finally:
                os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform where folders cannot be opened (Windows)
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _lock(fd: int, *, blocking: bool) -> bool | None:
    """``flock(fd, LOCK_EX)``: ``True`` once held, ``False`` when held elsewhere (only when
    not ``blocking``), ``None`` without ``flock``."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise
    return True


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still leads to the open file ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _release(fd: int) -> None:
    """Forget and close a descriptor this process locked (closing drops the lock)."""
    with contextlib.suppress(OSError):
        _HELD.discard(_key(os.fstat(fd)))
    os.close(fd)


class Claim:
    """A claim on the output ``path`` (see :func:`claim`), given up by :meth:`release`,
    by leaving its ``with`` block, or by the process's death."""

    def __init__(self, path: Path, lock_path: Path, fd: int) -> None:
        self.path = path
        self._lock_path = lock_path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether the claim is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Give up the claim and remove its lock file (again: nothing)."""
        if self._fd is None:
            return
        # removed while locked: a claimer holding the old file sees it unnamed and retries
        with contextlib.suppress(FileNotFoundError):
            self._lock_path.unlink()
        fd, self._fd = self._fd, None
        _release(fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Claim({str(self.path)!r}, held={self.held})"


def claim(path: str | Path, *, exist_ok: bool = False) -> Claim:
    """Claim ``path`` as this run's output (``with claim(path): ...``), so that no other
    run, in any process, writes it meanwhile: :func:`check_writable`, then an ``flock``
    on ``.NAME.lock``. ``FileExistsError`` (one line) while another run holds it, or,
    unless ``exist_ok``, when ``path`` exists once the lock is held (of several runs
    started together on a new path, one proceeds). Without ``flock`` only the existence
    check is made."""
    path = Path(path)
    check_writable(path)
    lock_path = path.parent / f".{path.name}.lock"
    busy = FileExistsError(
        f"{str(path)!r} is claimed by another run that is still writing it "
        f"(it holds {str(lock_path)!r}); wait for it to end or choose another path"
    )
    while True:
        with contextlib.suppress(FileNotFoundError):
            if _key(os.stat(lock_path)) in _HELD:
                raise busy
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        if _lock(fd, blocking=False) is False:
            os.close(fd)
            raise busy
        if _still_named(fd, lock_path):  # else its holder released (removed) it meanwhile
            break
        os.close(fd)
    _HELD.add(_key(os.fstat(fd)))
    held = Claim(path, lock_path, fd)
    if not exist_ok and path.exists():
        held.release()
        raise FileExistsError(f"{str(path)!r} already exists")
    return held
