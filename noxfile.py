"""The test matrix: one ``tests`` session per array namespace, plus lint, typecheck, docs.

nox -s tests-numpy           # NumPy (runs every test: CLI, data, checkpoints, exact replay)
nox -s tests-dask            # only the tests that take the ``backend`` fixture, on Dask
nox -s lint typecheck
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

def _backends() -> dict[str, object]:
    """The package's table of backends (microgpt_xp/_backends.py, stdlib-only), loaded by
    path: nox runs outside the environments it builds."""
    path = Path(__file__).parent / "microgpt_xp" / "_backends.py"
    spec = importlib.util.spec_from_file_location("_microgpt_xp_backends", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return dict(module.BACKENDS)


BACKENDS = _backends()


def _tests(session: nox.Session, backend: str) -> None:
    """Run the tests on one array namespace (``MICROGPT_XP_BACKENDS=<backend>``)."""
    spec = BACKENDS[backend]
    if spec.test_install:  # type: ignore[attr-defined]
        session.install(*spec.test_install)  # type: ignore[attr-defined]
    session.install("-e", f".[{spec.test_extras}]")  # type: ignore[attr-defined]
    env = {"MICROGPT_XP_BACKENDS": backend}
    if backend != "numpy":
        env["MICROGPT_XP_BACKEND_ONLY"] = "1"
    session.run("pytest", *session.posargs, env=env)


for _backend in BACKENDS:
    nox.session(name=f"tests-{_backend}")(
        lambda session, _b=_backend: _tests(session, _b)
    )


#: Namespaces outside the backends table, each tested through the public API alone
#: (tests/test_any_namespace.py): the extra or package that brings it.
FOREIGN = {"ndonnx": ".[test,onnx]", "marray": "marray"}


def _foreign(session: nox.Session, name: str) -> None:
    """The generic code path on a namespace the backends table does not know."""
    session.install("-e", ".[test,onnx]" if name == "ndonnx" else ".[test]")
    if FOREIGN[name] != ".[test,onnx]":
        session.install(FOREIGN[name])
    files = ["tests/test_any_namespace.py"]
    if name == "ndonnx":
        files.append("tests/test_export.py")
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
