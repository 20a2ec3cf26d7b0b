"""The test matrix: one ``tests`` session per array namespace, plus lint, typecheck, docs.

nox -s tests-numpy           # NumPy (runs every test: CLI, data, checkpoints, exact replay)
nox -s tests-dask            # only the tests that take the ``backend`` fixture, on Dask
nox -s lint typecheck
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

BACKENDS = ["numpy", "array_api_strict", "dask", "torch", "jax", "cupy"]
EXTRAS = {
    "numpy": "test,dask,plot",
    "array_api_strict": "test,strict",
    "dask": "test,dask",
    "torch": "test",
    "jax": "test,jax",
    "cupy": "test,cupy",
}


def _tests(session: nox.Session, backend: str) -> None:
    """Run the tests on one array namespace (``MICROGPT_XP_BACKENDS=<backend>``)."""
    if backend == "torch":
        # the CPU build; a bare "torch" would pull a multi-GB CUDA build
        session.install("torch==2.13.0")
    session.install("-e", f".[{EXTRAS[backend]}]")
    env = {"MICROGPT_XP_BACKENDS": backend}
    if backend != "numpy":
        env["MICROGPT_XP_BACKEND_ONLY"] = "1"
    session.run("pytest", *session.posargs, env=env)


for _backend in BACKENDS:
    nox.session(name=f"tests-{_backend}")(
        lambda session, _b=_backend: _tests(session, _b)
    )


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
