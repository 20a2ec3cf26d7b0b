"""The layout the Architecture page describes (docs/architecture.md), checked on the source:
imports go one way (no cycle), the model knows nothing of threads, processes, clusters or
backends by name, and only the primitives module and the backends table name a namespace."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "microgpt_xp"

#: The model: pure math on one batch (docs/architecture.md).
MODEL = {"layers", "model", "params", "optim", "config", "_checks"}
#: What the model may not import: scheduling, clusters, array libraries, the drivers.
SCHEDULING = {"threading", "multiprocessing", "concurrent", "loky", "joblib", "dask", "distributed"}
ARRAY_LIBRARIES = {"numpy", "cupy", "cupyx", "torch", "jax", "array_api_strict"}
DRIVERS = {"train", "sample", "exact", "parallel", "dask_steps", "cluster", "cli"}
#: The only modules that may name a backend in their code: the table and its helpers, the
#: records' registration with JAX, and the primitives.
BACKEND_AWARE = {"_backends", "_xp", "_pytree", "primitives"}
BACKEND_NAMES = {"numpy", "dask", "cupy", "torch", "jax", "array_api_strict"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts) if parts else ""


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (function bodies included), as
    absolute names; this package's modules as ``microgpt_xp.x``."""
    tree = ast.parse(path.read_text())
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                stem = ".".join(["microgpt_xp", *[p for p in base if p]])
                if node.module:
                    found.add(f"{stem}.{node.module}")
                else:  # from . import x, y
                    found.update(f"{stem}.{alias.name}" for alias in node.names)
            elif node.module:
                found.add(node.module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {
        "microgpt_xp" + (f".{_module_name(p)}" if _module_name(p) else ""): p
        for p in PACKAGE.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports(path):
            # `from .x import y` where y is a function: keep the longest existing module
            while imported and imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported in modules and imported != name:
                deps.add(imported)
        graph[name] = deps
    return graph


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    # the package's __init__ imports everything it exports; leave it out of the graph
    graph = {k: v - {"microgpt_xp"} for k, v in graph.items() if k != "microgpt_xp"}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert len(graph) > 15  # the walk saw the package


@pytest.mark.parametrize("module", sorted(MODEL))
def test_the_model_knows_nothing_of_scheduling_or_backends(module: str) -> None:
    imported = _imports(PACKAGE / f"{module}.py")
    tops = {name.split(".")[0] for name in imported}
    assert not tops & SCHEDULING, f"{module} imports {tops & SCHEDULING}"
    ours = {name.split(".")[1] for name in imported if name.startswith("microgpt_xp.")}
    assert not ours & DRIVERS, f"{module} imports the drivers {ours & DRIVERS}"
    if module not in ("params", "_checks"):  # host-side init and edge checks use NumPy
        assert not tops & ARRAY_LIBRARIES, f"{module} imports {tops & ARRAY_LIBRARIES}"


@pytest.mark.parametrize("module", sorted(MODEL))
def test_only_the_table_and_the_primitives_name_a_backend(module: str) -> None:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    # a default argument (backend="numpy", where arrays are created) is the user's choice
    defaults = {
        id(d)
        for n in ast.walk(tree)
        if isinstance(n, ast.arguments)
        for d in [*n.defaults, *n.kw_defaults]
        if d is not None
    }
    docstrings = defaults | {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    named = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docstrings
        and n.value in BACKEND_NAMES
    }
    assert not named, f"{module} names backends {named}; that belongs in {BACKEND_AWARE}"


#: The drivers and what they use to run a step: where a backend's name would be a branch.
DRIVER_FILES = ["train.py", "sample.py", "scoring.py", "resume.py", "export.py", "cli"]


def _sources(entries: list[str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for entry in entries:
        path = PACKAGE / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            files[str(file.relative_to(PACKAGE))] = file.read_text()
    return files


def test_no_driver_branches_on_a_backend_name() -> None:
    """Where arrays live is the backend; how a batch runs is the runner's: no driver
    compares a backend (or anything) with a backend's name."""
    for name, text in _sources(DRIVER_FILES).items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                names = {
                    c.value
                    for c in [node.left, *node.comparators]
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
                assert not names & BACKEND_NAMES, (
                    f"{name}:{node.lineno} compares with {names & BACKEND_NAMES}"
                )


def test_one_predicate_decides_the_overrides() -> None:
    """Only primitives/_dispatch.py asks which library an array belongs to (its
    ``native_module``); the override modules and the generic code never do."""
    folder = PACKAGE / "primitives"
    for file in folder.glob("*.py"):
        text = file.read_text()
        asks = [w for w in ("is_numpy_array", "is_torch_array", "is_jax_array", "is_cupy_array",
                            "is_dask_array", "is_numpy_namespace", "array_namespace(x) is") if w in text]  # fmt: skip
        if file.name == "_dispatch.py":
            assert "is_numpy_array" in text and "def native_module" in text
        else:
            assert not asks, f"primitives/{file.name} asks {asks}"
    assert (folder / "_generic.py").exists()
    generic = (folder / "_generic.py").read_text()
    for library in ("numpy", "torch", "jax", "cupy", "dask"):
        assert f"import {library}" not in generic, f"the generic code imports {library}"


def test_layers_are_building_blocks_not_forwards() -> None:
    """A function of layers.py that only returns a call of a primitive is a forward that
    the model can make itself."""
    tree = ast.parse((PACKAGE / "layers.py").read_text())
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        body = [
            s
            for s in fn.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        ]
        only_call = (
            len(body) == 1
            and isinstance(body[0], ast.Return)
            and isinstance(body[0].value, ast.Call)
        )
        assert not only_call, f"layers.{fn.name} only forwards a call"


def test_every_backend_of_the_table_has_a_nox_session() -> None:
    """The test matrix (noxfile.py) lists exactly the backends of the runtime's table."""
    from microgpt_xp import BACKENDS

    tree = ast.parse((PACKAGE.parent / "noxfile.py").read_text())
    (matrix,) = (
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "BACKENDS"
    )
    assert isinstance(matrix, ast.Dict)
    assert [ast.literal_eval(k) for k in matrix.keys if k is not None] == list(BACKENDS)
