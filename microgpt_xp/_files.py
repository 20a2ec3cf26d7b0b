"""Files the project writes: atomic writes, a claim on a new output, and checks made
before the work.

A write goes to a temporary file in the target's folder and is renamed over the target,
so a reader sees the old file (or none) or the complete new one, never a part.

**Temporary files and concurrent writers.** The temporary file of ``NAME`` is
``.NAME.<16 hex digits>.tmp``; its writer holds an exclusive ``flock`` on it from its
creation until after the rename. A lock dies with its process, so a temporary file
whose lock can be taken is *provably stale*: its writer is gone (crashed, killed). After
each successful write, the stale temporary files of exactly that target (a name that
matches the pattern in full, so ``.nb.npz.x.*.tmp`` is not ``nb.npz``'s) are removed;
those of live writers, in this process or another, on this machine or over NFS, are
left alone. A cleaner locks a file before removing it, and a writer checks, once it
holds the lock on its new file, that the name still leads to it (else it starts again
with another name), so a file is never removed between its creation and its lock. On a
file system without ``flock`` (or on Windows) no other writer's file is removed.

**Claims.** :func:`claim` stops two runs from writing one output: it holds an ``flock``
on ``.NAME.lock`` next to the target while the run lives, and refuses (one-line
``FileExistsError``) while another process holds it. A run that dies releases its claim
with its process; the lock file it leaves is reused by the next claim.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, overload

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

#: ``(st_dev, st_ino)`` of the files this process holds a lock on (its temporary files in
#: flight, its claims): skipped by this process's cleaners and claims without opening
#: them (closing any descriptor of a file drops a process's POSIX locks, which is what
#: ``flock`` is over NFS).
_HELD: set[tuple[int, int]] = set()


class NotWritableError(OSError):
    """A path that a save could not write (a folder, a read-only folder, a path under a
    regular file, a missing folder that cannot be created)."""


# -- checks before the work ---------------------------------------------------------------
def check_writable(path: str | Path, *, make_parents: bool = True) -> Path:
    """Fail now, not after the work, if ``path`` cannot be written by :func:`atomic_write`.

    Creates (and removes) a temporary file in the target's folder, as a save does, after
    creating missing folders when ``make_parents`` (as :func:`atomic_write` does; folders
    made are kept). Returns the path.

    Raises :class:`NotWritableError` (an ``OSError``), one line naming the path, when
    ``path`` is a folder, a folder on its way is a regular file, the folder cannot be
    created, or no file can be created in it (read-only, permissions); when
    ``make_parents`` is false and the folder does not exist, the message says so.
    """
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
    """Whether ``a`` and ``b`` are one existing file (same device and inode, through links
    and other spellings); ``False`` when either does not exist. Use it to refuse an
    output that would replace an input."""
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


# -- atomic writes --------------------------------------------------------------------------
@overload
def atomic_open(
    path: str | Path, mode: Literal["w"] = "w", *, make_parents: bool = True
) -> contextlib.AbstractContextManager[IO[str]]: ...


@overload
def atomic_open(
    path: str | Path, mode: Literal["wb"], *, make_parents: bool = True
) -> contextlib.AbstractContextManager[IO[bytes]]: ...


def atomic_open(
    path: str | Path, mode: str = "w", *, make_parents: bool = True
) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file to write ``path`` through, atomically and durably: ``with atomic_open(path)
    as f: f.write(...)``.

    ``mode`` ``"w"`` (UTF-8 text) or ``"wb"``. The file is a temporary one in the same
    folder (see the module's doc); when the block ends without an error it is flushed,
    fsynced, renamed over ``path`` and the folder fsynced; when the block raises
    (``KeyboardInterrupt`` included) it is removed and ``path`` is left as it was. The
    new file gets the mode ``open()`` gives (``0o666`` less the umask). Missing folders
    are created when ``make_parents``; otherwise a missing folder raises
    :class:`NotWritableError` before the block runs. After the rename, the stale
    temporary files of ``path`` (their writers gone) are removed.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes with mode 'w' or 'wb', not {mode!r}")
    return _atomic_open(Path(path), mode, make_parents)


@contextlib.contextmanager
def _atomic_open(path: Path, mode: str, make_parents: bool) -> Iterator[IO[Any]]:
    _folder(path, make_parents)
    fd, tmp = _new_temp(path)
    try:
        # the file object gets its own descriptor: closing it keeps the lock, which
        # lives on ``fd`` until the rename is done
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
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically and durably, through
    :func:`atomic_open` (missing folders are created). A crash at any moment leaves
    ``path`` as it was. Returns the path."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_open(path, "wb") as f:
        f.write(raw)
    return path


def _new_temp(path: Path) -> tuple[int, Path]:
    """A new temporary file for ``path``, created and locked: ``(descriptor, its path)``.
    Release it with :func:`_release`."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        # 0o666: the kernel applies the umask, as open() does
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        _lock(fd, blocking=True)
        # a cleaner may have taken the lock and removed the file before we locked it:
        # the file is ours only if its name still leads to it
        if _still_named(fd, tmp):
            st = os.fstat(fd)
            _HELD.add((st.st_dev, st.st_ino))
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
            st = os.stat(candidate)
            if (st.st_dev, st.st_ino) in _HELD:
                continue  # this process writes it now
            fd = os.open(candidate, os.O_RDONLY)
            try:
                if _lock(fd, blocking=False) and os.path.samestat(os.fstat(fd), os.stat(candidate)):
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


# -- locks and claims -----------------------------------------------------------------------
def _lock(fd: int, *, blocking: bool) -> bool | None:
    """``flock(fd, LOCK_EX)``: ``True`` once held, ``False`` when another open file holds
    it (only when not ``blocking``), ``None`` where the file system has no ``flock``."""
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
    """Whether ``path`` still leads to the open file ``fd`` (not removed or replaced since
    it was opened)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _release(fd: int) -> None:
    """Forget and close a descriptor this process locked (closing drops the lock)."""
    with contextlib.suppress(OSError):
        st = os.fstat(fd)
        _HELD.discard((st.st_dev, st.st_ino))
    os.close(fd)


class Claim:
    """A held claim on an output path (see :func:`claim`); a context manager.

    ``path`` is the claimed target. :meth:`release` (or leaving the ``with`` block)
    gives it up; the death of the process does too.
    """

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
        # removed while locked: a claimer that opened the old file finds, once it gets
        # the lock, that the name no longer leads to it, and starts again
        with contextlib.suppress(FileNotFoundError):
            self._lock_path.unlink()
        fd, self._fd = self._fd, None
        _release(fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Claim({str(self.path)!r}, held={self.held})"


def claim(path: str | Path, *, exist_ok: bool = False) -> Claim:
    """Claim ``path`` as this run's output until :meth:`Claim.release`, so that no other
    run (process, or claim in this process) writes it meanwhile.

    Checks the path first (:func:`check_writable`, which creates missing folders), then
    takes an exclusive ``flock`` on ``.NAME.lock`` in its folder. With ``exist_ok``
    false, an existing ``path`` is refused once the lock is held, so of several runs
    started together on a new path exactly one proceeds. Hold the claim for the whole
    run (``with claim(path): ...``): a run that dies releases it with its process (its
    lock file stays, and the next claim reuses it). On a file system without ``flock``
    only the existence check is made.

    Raises ``FileExistsError`` (one line) when another run holds the claim or, unless
    ``exist_ok``, when ``path`` exists; :class:`NotWritableError` as
    :func:`check_writable` does.
    """
    path = Path(path)
    check_writable(path)
    lock_path = path.parent / f".{path.name}.lock"
    busy = FileExistsError(
        f"{str(path)!r} is claimed by another run that is still writing it "
        f"(it holds {str(lock_path)!r}); wait for it to end or choose another path"
    )
    while True:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(lock_path)
            if (st.st_dev, st.st_ino) in _HELD:
                raise busy
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        locked = _lock(fd, blocking=False)
        if locked is False:
            os.close(fd)
            raise busy
        # the holder may have released (and removed) the file before we locked it
        current = _still_named(fd, lock_path)
        st = os.fstat(fd)
        if current:
            break
        os.close(fd)
    _HELD.add((st.st_dev, st.st_ino))
    held = Claim(path, lock_path, fd)
    if not exist_ok and path.exists():
        held.release()
        raise FileExistsError(f"{str(path)!r} already exists")
    return held
