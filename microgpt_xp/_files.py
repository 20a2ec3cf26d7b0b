"""Atomic file writes: a file is either its old self (or absent) or complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically and durably.

    The bytes go to a temporary file in the same folder (``.NAME.*.tmp``), which is
    fsynced, given the mode a new file gets under the process's umask (``0666 & ~umask``,
    as ``open()`` would; ``mkstemp`` makes it 0600), renamed over ``path``, and the folder
    is fsynced. A crash at any moment leaves ``path`` as it was; the temporary files that
    earlier crashed writes of ``path`` left behind are removed once this write succeeds.
    Creates missing parent folders. Returns the path.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    for stale in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        with contextlib.suppress(OSError):  # another writer's file in flight may go first
            stale.unlink()
    return path


def glob_escape(name: str) -> str:
    """``name`` with the glob metacharacters ``*?[`` matched literally."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform where folders cannot be opened (Windows)
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
