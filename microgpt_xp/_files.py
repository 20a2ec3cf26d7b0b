"""Files the project writes: atomic writes (a locked ``.NAME.<16 hex>.tmp`` renamed over the
target; one whose ``flock`` can be taken is stale), claims on outputs (``.NAME.lock`` locked
while a run lives) and writability checked before the work."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows: no flock, and no other writer's file is removed
    fcntl = None  # type: ignore[assignment]

#: ``(st_dev, st_ino)`` of the files this process holds locked, never opened again (closing any
#: descriptor drops a process's POSIX locks, which ``flock`` is over NFS).
_HELD: set[tuple[int, int]] = set()


class NotWritableError(OSError):
    """A path that a save could not write (a folder, under a file, a read-only folder)."""


def _cannot(path: Path, why: str) -> NotWritableError:
    return NotWritableError(f"cannot write {str(path)!r}: {why}")


def check_writable(path: str | Path, *, make_parents: bool = True) -> Path:
    """``path``, once a temporary file could be made in its folder (missing folders first when
    ``make_parents``); else :class:`NotWritableError`, one line naming the path and why."""
    path = Path(path)
    if path.is_dir():
        raise _cannot(path, "it is a folder")
    folder = _folder(path, make_parents)
    try:
        fd, tmp = _new_temp(path)
    except OSError as exc:
        why = f"cannot create a file in folder {str(folder)!r} ({exc.strerror or exc})"
        raise _cannot(path, why) from exc
    tmp.unlink(missing_ok=True)
    _release(fd)
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one existing file (an output that would replace an input)."""
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except (OSError, ValueError):
        return False


def _folder(path: Path, make_parents: bool) -> Path:
    folder = path.parent
    if not make_parents:
        if not folder.is_dir():
            raise _cannot(path, f"folder {str(folder)!r} does not exist")
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists()), folder)
        raise _cannot(path, f"{str(blocker)!r} is a file, not a folder") from exc
    except OSError as exc:
        why = f"cannot create folder {str(folder)!r} ({exc.strerror or exc})"
        raise _cannot(path, why) from exc
    return folder


def atomic_open(
    path: str | Path, mode: str = "w", *, make_parents: bool = True
) -> contextlib.AbstractContextManager[IO[Any]]:
    """``with atomic_open(path) as f:`` writes ``path`` (``"w"``: UTF-8, or ``"wb"``) atomically
    and durably when the block ends; left as it was when it raises."""
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
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _release(fd)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # folders cannot be opened on Windows
        pass
    else:
        try:
            os.fsync(dir_fd)  # the rename is on disk
        finally:
            os.close(dir_fd)
    _remove_stale_temps(path)


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_open`; returns it."""
    with atomic_open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def _new_temp(path: Path) -> tuple[int, Path]:
    """A new temporary file for ``path``, created and locked (release with :func:`_release`)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
        _lock(fd, blocking=True)
        if _still_named(fd, tmp):  # else a cleaner removed it before we locked it
            _HELD.add(_key(os.fstat(fd)))
            return fd, tmp
        os.close(fd)


def _remove_stale_temps(path: Path) -> None:
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


def _lock(fd: int, *, blocking: bool) -> bool | None:
    """``flock``: ``True`` once held, ``False`` held elsewhere, ``None`` without ``flock``."""
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


@dataclass(repr=False, eq=False)
class Claim:
    """A claim on ``path`` (:func:`claim`), given up by :meth:`release`, ``with`` or death."""

    path: Path
    _lock_path: Path
    _fd: int | None

    @property
    def held(self) -> bool:
        """Whether the claim is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Give up the claim and remove its lock file (again: nothing)."""
        if self._fd is None:
            return
        # removed while locked: a claimer holding the old file sees it unnamed and retries
        self._lock_path.unlink(missing_ok=True)
        fd, self._fd = self._fd, None
        _release(fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Claim({str(self.path)!r}, held={self.held})"


def claim(path: str | Path, *, exist_ok: bool = False) -> Claim:
    """Claim ``path`` as this run's output (an ``flock`` on ``.NAME.lock``): ``FileExistsError``
    while another run holds it or, unless ``exist_ok``, when ``path`` exists."""
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
