"""The layout the Architecture page describes (docs/architecture.md), checked on the source:
imports go one way (no cycle), the model knows nothing of threads, processes, clusters or
backends by name, and only the primitives module and the backends table name a namespace."""

from __future__ import annotations

import ast
import graphlib
from importlib.util import resolve_name
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
    parts = [p for p in path.relative_to(PACKAGE).with_suffix("").parts if p != "__init__"]
    return ".".join(["microgpt_xp", *parts])


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (function bodies included), as
    absolute names; this package's modules as ``microgpt_xp.x``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module):
            base = resolve_name("." * node.level + (node.module or ""), package)
            found.update([base] if node.module else [f"{base}.{a.name}" for a in node.names])
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
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
    # the package's __init__ imports everything it exports; leave it out of the graph
    graph = {k: v - {"microgpt_xp"} for k, v in _graph().items() if k != "microgpt_xp"}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("import cycle: " + " -> ".join(exc.args[1]))
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
    nodes = list(ast.walk(tree))
    skip = {
        id(d) for n in nodes if isinstance(n, ast.arguments) for d in n.defaults + n.kw_defaults
    }
    skip |= {id(ast.get_docstring(n, clean=False) and n.body[0].value) for n in nodes  # type: ignore[attr-defined]
             if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))}  # fmt: skip
    named = {n.value for n in nodes if isinstance(n, ast.Constant) and id(n) not in skip
             and n.value in BACKEND_NAMES}  # fmt: skip
    assert not named, f"{module} names backends {named}; that belongs in {BACKEND_AWARE}"


#: The drivers and what they use to run a step: where a backend's name would be a branch.
DRIVER_FILES = ["train.py", "sample.py", "scoring.py", "resume.py", "export.py", "cli"]


def test_no_driver_branches_on_a_backend_name() -> None:
    """Where arrays live is the backend; how a batch runs is the runner's: no driver
    compares a backend (or anything) with a backend's name."""
    paths = [PACKAGE / entry for entry in DRIVER_FILES]
    for file in (f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])):
        name = file.relative_to(PACKAGE)
        for node in ast.walk(ast.parse(file.read_text())):
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
        body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        only = body[0] if len(body) == 1 else None
        assert not (isinstance(only, ast.Return) and isinstance(only.value, ast.Call)), fn.name


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
