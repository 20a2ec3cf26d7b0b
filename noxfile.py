"""The test matrix: one ``tests`` session per array namespace, plus lint, typecheck, docs.

nox -s tests-numpy           # NumPy (runs every test: CLI, data, checkpoints, exact replay)
nox -s tests-dask            # only the tests that take the ``backend`` fixture, on Dask
nox -s lint typecheck
nox -s browser               # the web page in Debian's headless chromium (skips without it)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

#: One ``tests-<backend>`` session per backend of microgpt_xp._backends.BACKENDS: the
#: extras it installs, and what goes in first (a CPU build pinned where a plain install
#: would pull a GPU one). tests/conftest.py holds the device each runs on.
BACKENDS = {
    "numpy": ("test,dask,plot", ()),
    "dask": ("test,dask", ()),
    "cupy": ("test,cupy", ()),
    "array_api_strict": ("test,strict", ()),
    "torch": ("test", ("torch==2.13.0",)),
    "jax": ("test,jax", ()),
}


def _tests(session: nox.Session, backend: str) -> None:
    """Run the tests on one array namespace (``MICROGPT_XP_BACKENDS=<backend>``)."""
    extras, first = BACKENDS[backend]
    if first:
        session.install(*first)
    session.install("-e", f".[{extras}]")
    env = {"MICROGPT_XP_BACKENDS": backend}
    if backend != "numpy":
        env["MICROGPT_XP_BACKEND_ONLY"] = "1"
    session.run("pytest", *session.posargs, env=env)


for _backend in BACKENDS:
    nox.session(name=f"tests-{_backend}")(lambda session, _b=_backend: _tests(session, _b))


#: Namespaces outside the backends table, tested through the public API alone: what
#: they install, and the test files.
FOREIGN = {
    "ndonnx": (
        (".[test,onnx]",),
        [
            "tests/test_any_namespace.py",
            "tests/test_export.py",
            "tests/test_graphs.py",
            "tests/test_primitives.py",  # its overrides against the generic code
        ],
    ),
    "marray": ((".[test]", "marray"), ["tests/test_any_namespace.py"]),
}


def _foreign(session: nox.Session, name: str) -> None:
    """The generic code path on a namespace the backends table does not know."""
    packages, files = FOREIGN[name]
    session.install("-e", *packages)
    session.run("pytest", *files, *session.posargs, env={"MICROGPT_XP_FOREIGN": name})


for _name in FOREIGN:
    nox.session(name=f"tests-{_name}")(lambda session, _n=_name: _foreign(session, _n))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, tests, examples and benchmarks."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy (strict-leaning, see pyproject.toml) over the package."""
    session.install("mypy", "-e", ".")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (warnings are errors)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks' own tests (``benchmarks/tests``: the harness, the peers against our
    model, the whole-call tools on tiny settings), with what they time against: PyTorch
    (pinned by the ``bench`` extra), JAX and Dask."""
    session.install("-e", ".[test,bench,jax,dask]")
    session.run("pytest", "benchmarks/tests", *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    """The web page (examples/web) in Debian's headless chromium, driven by Playwright's
    Python package through ``/usr/bin/chromium`` (no browser download); onnxruntime-web
    from the lock file (``npm ci``). Writes the trained page's screenshot to
    ``docs/assets/web-page.png``. Then README's command lines, whose ONNX export and
    ``serve.py`` need what this session installs (tests-numpy skips those two). Skips
    without chromium or npm."""
    if not Path("/usr/bin/chromium").exists() or shutil.which("npm") is None:
        session.skip("needs /usr/bin/chromium (apt-get install chromium) and npm")
    session.install("-e", ".[test,onnx]", "playwright")
    with session.chdir("examples/web"):
        session.run("npm", "ci", "--no-audit", "--no-fund", external=True)
    env = {"MICROGPT_XP_SCREENSHOT": "docs/assets/web-page.png"}
    session.run("pytest", "tests/test_browser.py", *session.posargs, env=env)
    session.run("pytest", "tests/test_first_steps.py", "-k", "command and README", *session.posargs)
