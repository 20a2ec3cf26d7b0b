"""Every ``>>>`` example runs: the docstrings of all microgpt_xp modules and the
``pycon`` examples of the documentation pages (docs/*.md).

A module or page whose examples need a package that is not installed (torch, jax, …)
is skipped, not failed, so each nox session runs what its environment can.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import re
import types
from pathlib import Path

import pytest

import microgpt_xp

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
#: Optional packages an example may import; without them the example is skipped.
OPTIONAL = (
    "torch",
    "jax",
    "cupy",
    "dask",
    "distributed",
    "array_api_strict",
    "matplotlib",
    "marray",
    "ndonnx",
)


def _modules() -> list[str]:
    names = [microgpt_xp.__name__]
    for info in pkgutil.walk_packages(microgpt_xp.__path__, prefix=f"{microgpt_xp.__name__}."):
        # importing a __main__ module would run the program
        if info.name.rsplit(".", 1)[-1] != "__main__":
            names.append(info.name)
    return sorted(names)


def _examples_text(page: Path) -> str:
    """The page with its code fences blanked out (line numbers kept), so that a closing
    fence is not read as expected output; only ``>>>`` lines are examples anyway."""
    return re.sub(r"^[ \t]*(```|~~~).*$", "", page.read_text("utf-8"), flags=re.M)


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def _skip_unless_importable(text: str, where: str) -> None:
    for name in OPTIONAL:
        imported = re.search(rf"^\s*(>>>|\.\.\.)\s*(import|from)\s+{name}\b", text, re.M)
        if imported and importlib.util.find_spec(name) is None:
            pytest.skip(f"{where}: its examples need {name}, which is not installed")


class _Checker(doctest.OutputChecker):
    """An example expecting ``ValueError: ...`` passes on the library's subclass that names
    the argument (``ArgumentValueError``), as ``except ValueError`` would."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        got = re.sub(r"^microgpt_xp\._errors\.Argument(Value|Type)Error:", r"\1Error:", got)
        return super().check_output(want, got, optionflags)


def _run(test: doctest.DocTest) -> doctest.TestResults:
    runner = doctest.DocTestRunner(checker=_Checker(), optionflags=FLAGS)
    runner.run(test)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    for test in finder.find(module, name, globs={}):
        _skip_unless_importable("\n".join(e.source for e in test.examples), test.name)
        result = _run(test)
        assert result.failed == 0, (
            f"{result.failed} of {result.attempted} examples failed in {test.name}"
        )


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_documentation_examples(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _examples_text(page)
    _skip_unless_importable(text, page.name)
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    test = doctest.DocTestParser().get_doctest(text, {}, page.name, str(page), 0)
    result = _run(test)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {page}"


def test_the_harness_reports_a_failing_example() -> None:
    """A wrong example must fail, or the tests above would pass on anything."""
    module = types.ModuleType("fake_module")
    module.__doc__ = ">>> 1 + 1\n3\n"
    (test,) = doctest.DocTestFinder().find(module, "fake_module", globs={})
    assert _run(test) == doctest.TestResults(failed=1, attempted=1)


def test_the_documentation_has_examples() -> None:
    """The pages hold ``>>>`` examples (so the page tests do not pass vacuously)."""
    parser = doctest.DocTestParser()
    counts = {p.name: len(parser.get_examples(_examples_text(p))) for p in _pages()}
    for page in ("index.md", "model.md", "training.md", "exact.md", "backends.md"):
        assert counts.get(page, 0) > 0, f"docs/{page} has no examples: {counts}"
