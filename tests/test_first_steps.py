"""README.md and docs/getting-started.md as written: each ```python block runs as a script and
each ``microgpt-xp``/``python`` command line in order, in a stand-in checkout (skipped where
what it needs is absent; no ``pip install``); the extras tables match pyproject.toml and CI."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
PAGES = ("README.md", "docs/getting-started.md")
TIMEOUT = 120  # seconds a block or a command may take (each takes a few)
#: Packages a Python block may import that the tests session need not have.
OPTIONAL = ("torch", "jax", "cupy", "dask", "distributed", "array_api_strict", "matplotlib",
            "ndonnx", "onnx", "onnxruntime", "marray")  # fmt: skip


def _fences(page: str) -> list[tuple[str, str]]:
    """The page's fenced blocks as (language, dedented body), indented ones included."""
    blocks: list[tuple[str, str]] = []
    lines = (ROOT / page).read_text("utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```|~~~)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        blocks.append((lang, "\n".join(body) + "\n"))
        i += 1
    return blocks


def _python_blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        blocks = [body for lang, body in _fences(page) if lang == "python"]
        found += [(page, i, body) for i, body in enumerate(blocks, 1)]
    return found


PYTHON_BLOCKS = _python_blocks()


def _commands(page: str) -> list[str]:
    """The page's command lines to run, in order: each ``&&`` part that starts with
    ``microgpt-xp`` or ``python`` and is not a ``pip install``."""
    found = []
    for lang, body in _fences(page):
        if lang not in ("console", "bash", "sh", "shell"):
            continue
        for line in body.splitlines():
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                pip = argv[:3] == ["python", "-m", "pip"]
                if argv[:1] in (["microgpt-xp"], ["python"]) and not pip:
                    found.append(shlex.join(argv))
    return found


def _env() -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _missing(*packages: str) -> str | None:
    """The first of ``packages`` that is not installed, or None."""
    return next((p for p in packages if importlib.util.find_spec(p) is None), None)


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    out, err = proc.stdout[-3000:], proc.stderr[-3000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


# -- Python blocks ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("page", "index", "code"), PYTHON_BLOCKS, ids=[f"{p}-python{i}" for p, i, _ in PYTHON_BLOCKS]
)
def test_python_block_runs_as_a_script(page: str, index: int, code: str, tmp_path: Path) -> None:
    for name in OPTIONAL:
        if re.search(rf"^\s*(import|from)\s+{name}\b", code, re.M) and _missing(name):
            pytest.skip(f"{page} block {index} imports {name}, which is not installed")
    for ref in re.findall(r"\.\./shared/[\w./-]+", code):
        if not (ROOT / ref).exists():
            pytest.skip(f"{page} block {index} reads {ref}, absent here")
    script = tmp_path / f"block{index}.py"
    script.write_text(code, "utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, f"{page} block {index}:\n{code}\n{_report(proc)}"
    assert "Traceback" not in proc.stderr, _report(proc)


def test_the_pages_have_blocks() -> None:
    """The parser finds the pages' blocks, an admonition's indented ```bash block dedented."""
    assert len([b for b in PYTHON_BLOCKS if b[0] == "README.md"]) >= 3
    assert "microgpt-xp train" in _commands("README.md")
    assert len(_commands("docs/getting-started.md")) >= 7
    bodies = [b for lang, b in _fences("docs/getting-started.md") if lang == "bash"]
    assert any(b.startswith("python -m pip install torch --index-url") for b in bodies)


# -- command lines ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def run_upto(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], tuple[str, str]]:
    """``run(page, index)``: the page's commands up to ``index`` run in order, each once, in
    one folder a page (a later one reads what an earlier one wrote); ``index``'s outcome."""
    folders: dict[str, Path] = {}
    done: dict[tuple[str, int], tuple[str, str]] = {}  # -> (outcome, text)

    def run(page: str, index: int) -> tuple[str, str]:
        if page not in folders:
            base = tmp_path_factory.mktemp(Path(page).stem)
            folders[page] = cwd = base / "checkout"
            cwd.mkdir()
            (cwd / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
            if SHARED.is_dir():
                (base / "shared").symlink_to(SHARED, target_is_directory=True)
        commands = _commands(page)
        for i in range(index + 1):
            if (page, i) not in done:
                done[page, i] = outcome, text = _run_command(commands[i], folders[page])
                skipped = [done[page, j][1] for j in range(i) if done[page, j][0] == "skip"]
                if outcome == "fail" and skipped:  # it may need what a skipped one writes
                    done[page, i] = "skip", f"after a skipped command ({skipped[-1]}):\n{text}"
        return done[page, index]

    return run


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serve(argv: list[str], cwd: Path) -> tuple[str, str]:
    """The web page's server: it starts, serves its page, and stops on Ctrl-C (SIGINT)."""
    pipe = subprocess.PIPE
    sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)  # as from a terminal
    with subprocess.Popen(
        argv, cwd=cwd, env=_env(), stdout=pipe, stderr=pipe, text=True, preexec_fn=sigint
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "serving http://127.0.0.1:8000/ ..." once ready
            url = re.search(r"http://\S+/", line)
            if url is None:
                proc.kill()
                return "fail", f"no URL in {line!r}\n{proc.stderr.read() if proc.stderr else ''}"
            with urllib.request.urlopen(url.group(0), timeout=30) as reply:
                status = reply.status
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    ok = status == 200 and proc.returncode == 0
    return ("ok" if ok else "fail"), f"status {status}, exit {proc.returncode}"


def _run_command(command: str, cwd: Path) -> tuple[str, str]:
    """Run one command line as written: ("ok" | "fail" | "skip", what to say)."""
    argv = shlex.split(command)
    if "--backend" in argv:
        from microgpt_xp._backends import BACKENDS

        name = argv[argv.index("--backend") + 1]
        if _missing(BACKENDS[name].package):
            return "skip", f"needs {name}, which is not installed"
    for arg in argv:
        if "../shared/" in arg and not (cwd / arg).exists():
            return "skip", f"{arg} is absent here"
    if argv[:2] == ["microgpt-xp", "export"] and "onnx" in argv and _missing("ndonnx", "onnx"):
        return "skip", "needs the [onnx] extra"
    if argv[0] == "microgpt-xp":
        argv = [sys.executable, "-m", "microgpt_xp.cli", *argv[1:]]
    else:
        argv = [sys.executable, *argv[1:]]
    if argv[1:2] == ["examples/web/serve.py"]:
        if _missing("ndonnx", "onnx"):
            return "skip", "the web page needs the [onnx] extra"
        if not (ROOT / "examples/web/node_modules/onnxruntime-web/dist").is_dir():
            return "skip", "the web page needs `npm ci` in examples/web"
        if not _port_free(8000):
            return "skip", "port 8000 is taken"
        return _serve(argv, cwd)
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    took = f"{time.perf_counter() - start:.1f} s"
    if proc.returncode != 0:
        return "fail", _report(proc)
    if "--out" in argv and not (cwd / argv[argv.index("--out") + 1]).is_file():
        return "fail", f"no --out file\n{_report(proc)}"
    return "ok", took


def _command_cases() -> list:  # of pytest.param
    """(page, index, command); a ``--backend torch``/``jax`` line is marked ``needs_<it>``."""
    cases = []
    for page in PAGES:
        for i, command in enumerate(_commands(page)):
            m = re.search(r"--backend (torch|jax)\b", command)
            marks = [getattr(pytest.mark, f"needs_{m.group(1)}")] if m else []
            name = f"{page}-{i}-{command.split()[1] if ' ' in command else command}"
            cases.append(pytest.param(page, i, command, marks=marks, id=name))
    return cases


@pytest.mark.parametrize(("page", "index", "command"), _command_cases())
def test_command_runs_as_written(
    page: str, index: int, command: str, run_upto: Callable[[str, int], tuple[str, str]]
) -> None:
    outcome, text = run_upto(page, index)
    if outcome == "skip":
        pytest.skip(f"{command}: {text}")
    assert outcome == "ok", f"{page}: `{command}` failed:\n{text}"


# -- what the pages say about installing -----------------------------------------------
def _pyproject_extras() -> dict[str, list[str]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    extras = data["project"]["optional-dependencies"]
    # a requirement's name with its own extras, no version: "dask[array]>=2024.8" -> "dask[array]"
    return {
        k: [re.match(r"[\w.\-]+(\[[\w,]+\])?", r).group(0) for r in v] for k, v in extras.items()
    }  # type: ignore[union-attr]


def test_extras_table_matches_pyproject() -> None:
    """The extras tables (getting-started's, README's) name pyproject's extras and packages."""
    extras = _pyproject_extras()
    text = (ROOT / "docs/getting-started.md").read_text("utf-8")
    table = text.split("## Installing extras", 1)[1].split("\n\n", 2)[1]
    seen: set[str] = set()
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[0])
        seen.update(names)
        if len(names) == 1:
            assert re.findall(r"`([^`]+)`", cells[1]) == extras[names[0]], row
            if names[0] == "torch":
                assert "CUDA" in row, row
    assert seen == set(extras)
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    readme = (ROOT / "README.md").read_text("utf-8")
    for extra in re.findall(r"\| `\[(\w+)\]` \|", readme):
        assert extra in extras, f"README's backend table names an extra [{extra}] pyproject lacks"


def test_readme_test_command_is_ci_s() -> None:
    """README's two commands install and train, install and test; CI runs the second."""
    blocks = [body.strip() for lang, body in _fences("README.md") if lang == "bash"]
    assert blocks[:2] == [
        "python -m pip install . && microgpt-xp train",
        "python -m pip install nox && nox -s tests-numpy",
    ]
    assert blocks[1] in (ROOT / ".ci" / "run").read_text("utf-8")
