"""microgpt_xp._files: atomic writes that concurrent writers (real processes started together)
cannot break, claims that let one run of several write a new output, writability checked first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from microgpt_xp._files import (
    NotWritableError,
    atomic_open,
    atomic_write,
    check_writable,
    claim,
    same_file,
)

fcntl = pytest.importorskip("fcntl")  # the locks are flock locks

#: Each process says it started (after its imports) and waits for the ``go`` file.
READY = """
import os, sys, time
from pathlib import Path
from microgpt_xp._files import atomic_write, claim
path, tag, go = sys.argv[1], sys.argv[2], Path(sys.argv[-1])
Path(f"{go}.{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.002)
"""
#: Each writer saves ``n`` times.
WRITER = (
    READY
    + """
for i in range(int(sys.argv[3])):
    atomic_write(path, f"{tag} {i}\\n" * 4000)
"""
)
#: Claims ``path``; the winner writes it before releasing.
CLAIMER = (
    READY
    + """
try:
    with claim(path):
        time.sleep(0.2)
        atomic_write(path, tag)
except FileExistsError as exc:
    print("refused:", exc)
else:
    print("claimed")
"""
)


def _run_together(script: str, argvs: list[list[str]], go: Path) -> list[tuple[int, str, str]]:
    """Start one process per argument list, let them go at once: ``(status, out, err)`` each."""
    pipe, command = subprocess.PIPE, [sys.executable, "-c", script]
    procs = [
        subprocess.Popen([*command, *argv, str(go)], stdout=pipe, stderr=pipe, text=True)
        for argv in argvs
    ]
    deadline = time.monotonic() + 120
    while sum(1 for p in go.parent.glob(f"{go.name}.*")) < len(procs):
        assert time.monotonic() < deadline, "the processes did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, *out) for p, out in zip(procs, outs, strict=True)]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("names", [("nb.npz",) * 3, ("nb.npz", "nb.npz.x")])
def test_concurrent_writers_never_break_each_other(tmp_path: Path, names: tuple[str, ...]) -> None:
    """Writers of one file, or of names sharing a prefix (each other's temporaries spared)."""
    n, tags = 150 if len(names) == 3 else 300, "abc"[: len(names)]
    argvs = [[str(tmp_path / name), t, str(n)] for name, t in zip(names, tags, strict=True)]
    for status, _, err in _run_together(WRITER, argvs, tmp_path / "go"):
        assert status == 0, err
    for name in set(names):
        text = (tmp_path / name).read_text()
        tag, i = text.split("\n", 1)[0].split()
        assert tag in tags and text == f"{tag} {i}\n" * 4000  # one writer's whole file
        assert len(names) == 3 or int(i) == n - 1
    assert _leftovers(tmp_path) == []


def _hold(code: str) -> subprocess.Popen[str]:
    """A process that runs ``code`` (taking a lock) and waits for its stdin to close."""
    script = f"import fcntl, sys\n{code}\nprint('held', flush=True)\nsys.stdin.read()\n"
    pipe = subprocess.PIPE
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=pipe, stdout=pipe, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_only_stale_temporaries_of_exactly_that_file_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "nb.npz"
    stale = [tmp_path / f".nb.npz.{i:016x}.tmp" for i in range(3)]  # writers gone: no lock
    for f in stale:
        f.write_bytes(b"half a file")
    keep = [
        tmp_path / ".nb.npz.x.0123456789abcdef.tmp",  # another file's (nb.npz.x) temporary
        tmp_path / ".nb.npz.crash.tmp",  # not a name this module writes
        tmp_path / ".nb.npz.lock",
    ]
    for f in keep:
        f.write_bytes(b"")
    live = tmp_path / ".nb.npz.fedcba9876543210.tmp"
    # a live writer in another process
    writer = _hold(f"f = open({str(live)!r}, 'wb'); fcntl.flock(f, fcntl.LOCK_EX)")
    try:
        atomic_write(path, b"new")
        assert path.read_bytes() == b"new"
        assert not any(f.exists() for f in stale)
        assert all(f.exists() for f in keep) and live.exists()
    finally:
        writer.communicate("")
    atomic_write(path, b"newer")  # the writer is gone: its file is stale now
    assert not live.exists() and all(f.exists() for f in keep)


def test_a_temporary_in_flight_in_this_process_is_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    with atomic_open(path) as f:
        f.write("first")
        atomic_write(path, "second")  # its clean-up must spare the file being written
        f.write(" file")
    assert path.read_text() == "first file"
    assert _leftovers(tmp_path) == []


def test_atomic_open_writes_text_and_bytes(tmp_path: Path) -> None:
    with atomic_open(tmp_path / "a.txt") as f:
        f.write("héllo\n")
    assert (tmp_path / "a.txt").read_bytes() == "héllo\n".encode()
    with atomic_open(tmp_path / "sub" / "b.bin", "wb") as g:
        g.write(b"\x00\x01")
    assert (tmp_path / "sub" / "b.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="mode"):
        atomic_open(tmp_path / "c.txt", "a")


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_block_leaves_the_old_file(tmp_path: Path, error: type[BaseException]) -> None:
    path = tmp_path / "names.txt"
    path.write_text("old\n")
    with pytest.raises(error), atomic_open(path) as f:
        f.write("half")
        raise error("stop")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["names.txt"]


def test_of_runs_claiming_one_new_path_together_exactly_one_proceeds(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    tags = ["p", "q", "r", "s"]
    results = _run_together(CLAIMER, [[str(path), t] for t in tags], tmp_path / "go")
    assert all(status == 0 for status, _, _ in results), results
    outcomes = [out.strip() for _, out, _ in results]
    winners = [t for t, out in zip(tags, outcomes, strict=True) if out == "claimed"]
    assert len(winners) == 1, outcomes
    assert path.read_text() == winners[0]
    for out in outcomes:
        assert out == "claimed" or out.startswith("refused:"), out
        assert "\n" not in out
    assert _leftovers(tmp_path) == []


def test_a_claim_is_refused_while_held_and_free_after(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    with claim(path) as held:
        assert held.held and held.path == path
        with pytest.raises(FileExistsError, match="claimed by another run"):
            claim(path)
        with pytest.raises(FileExistsError, match="claimed by another run"):
            claim(path, exist_ok=True)
        path.write_text("saved")
    assert not held.held
    with pytest.raises(FileExistsError, match="already exists"):
        claim(path)
    with claim(path, exist_ok=True):
        pass
    held.release()  # again: nothing
    assert _leftovers(tmp_path) == []


def test_the_claim_of_a_killed_run_does_not_block_the_next(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    proc = _hold(f"from microgpt_xp._files import claim; c = claim({str(path)!r})")
    try:
        with pytest.raises(FileExistsError, match="claimed by another run"):
            claim(path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert (tmp_path / ".run.ckpt.lock").exists()  # left behind by the killed run
    with claim(path) as held:
        assert held.held
    assert _leftovers(tmp_path) == []


def test_check_writable_accepts_a_new_path_and_makes_its_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "run.ckpt"
    assert check_writable(path) == path
    assert path.parent.is_dir() and not path.exists()
    (tmp_path / "old.ckpt").write_text("keep")
    check_writable(tmp_path / "old.ckpt")
    assert (tmp_path / "old.ckpt").read_text() == "keep"
    assert _leftovers(path.parent) == [] and _leftovers(tmp_path) == []


def test_what_a_save_could_not_write_is_refused_first(tmp_path: Path) -> None:
    """A folder, a path under a file, a missing folder: refused by each writer, first."""
    with pytest.raises(NotWritableError, match="it is a folder") as info:
        check_writable(tmp_path)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(NotWritableError, match="is a folder"):
        claim(tmp_path)
    (tmp_path / "data.txt").write_text("abc\n")
    for path in (tmp_path / "data.txt" / "run.ckpt", tmp_path / "data.txt" / "sub" / "run.ckpt"):
        with pytest.raises(NotWritableError, match=r"data\.txt' is a file, not a folder"):
            check_writable(path)
    assert (tmp_path / "data.txt").read_text() == "abc\n"
    with pytest.raises(NotWritableError, match="does not exist"):
        check_writable(tmp_path / "no" / "x.txt", make_parents=False)
    with (
        pytest.raises(NotWritableError, match="does not exist"),
        atomic_open(tmp_path / "no" / "names.txt", make_parents=False),
    ):
        pass
    assert not (tmp_path / "no").exists()


def test_check_writable_refuses_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user (root?) writes read-only folders: permissions not enforced")
        with pytest.raises(NotWritableError, match="cannot create a file in folder"):
            check_writable(folder / "run.ckpt")
        with pytest.raises(NotWritableError, match="cannot create folder"):
            check_writable(folder / "sub" / "run.ckpt")
    finally:
        folder.chmod(0o755)


def test_same_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x")
    b.write_text("x")
    (tmp_path / "link.txt").symlink_to(a)
    os.link(a, tmp_path / "hard.txt")
    assert same_file(a, a) and same_file(a, tmp_path / "." / "a.txt")
    assert same_file(str(a), tmp_path / "link.txt") and same_file(a, tmp_path / "hard.txt")
    assert not same_file(a, b)  # equal contents, other files
    assert not same_file(a, tmp_path / "missing") and not same_file(tmp_path / "missing", a)
