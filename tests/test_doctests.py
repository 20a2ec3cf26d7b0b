"""Every ``>>>`` example of the package's docstrings and of docs/*.md runs; one that needs a
package not installed (torch, jax, ...) is skipped."""

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
OPTIONAL = ("torch", "jax", "cupy", "dask", "distributed", "array_api_strict", "matplotlib",
            "marray", "ndonnx")  # fmt: skip


_FOUND = pkgutil.walk_packages(microgpt_xp.__path__, prefix="microgpt_xp.")
# importing a __main__ module would run the program
MODULES = sorted(["microgpt_xp", *(i.name for i in _FOUND if not i.name.endswith(".__main__"))])
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def _examples_text(page: Path) -> str:
    """The page with its code fences blanked out (line numbers kept): not expected output."""
    return re.sub(r"^[ \t]*(```|~~~).*$", "", page.read_text("utf-8"), flags=re.M)


def _skip_unless_importable(text: str, where: str) -> None:
    for name in OPTIONAL:
        imported = re.search(rf"^\s*(>>>|\.\.\.)\s*(import|from)\s+{name}\b", text, re.M)
        if imported and importlib.util.find_spec(name) is None:
            pytest.skip(f"{where}: its examples need {name}, which is not installed")


class _Checker(doctest.OutputChecker):
    """``ValueError: ...`` expected passes on ``ArgumentValueError`` (as ``except`` would)."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        got = re.sub(r"^microgpt_xp\._errors\.Argument(Value|Type)Error:", r"\1Error:", got)
        return super().check_output(want, got, optionflags)


def _run(test: doctest.DocTest) -> doctest.TestResults:
    runner = doctest.DocTestRunner(checker=_Checker(), optionflags=FLAGS)
    runner.run(test)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}")
        raise
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name, globs={}):
        _skip_unless_importable("\n".join(e.source for e in test.examples), test.name)
        failed, attempted = _run(test)
        assert failed == 0, f"{failed} of {attempted} examples failed in {test.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_documentation_examples(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _examples_text(page)
    _skip_unless_importable(text, page.name)
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    test = doctest.DocTestParser().get_doctest(text, {}, page.name, str(page), 0)
    failed, attempted = _run(test)
    assert failed == 0, f"{failed} of {attempted} examples failed in {page}"


def test_the_harness_reports_a_failing_example() -> None:
    """A wrong example must fail, or the tests above would pass on anything."""
    module = types.ModuleType("fake_module")
    module.__doc__ = ">>> 1 + 1\n3\n"
    (test,) = doctest.DocTestFinder().find(module, "fake_module", globs={})
    assert _run(test) == doctest.TestResults(failed=1, attempted=1)


def test_the_documentation_has_examples() -> None:
    """The pages hold ``>>>`` examples (so the page tests do not pass vacuously)."""
    parser = doctest.DocTestParser()
    counts = {p.name: len(parser.get_examples(_examples_text(p))) for p in PAGES}
    for page in ("index.md", "model.md", "training.md", "exact.md", "backends.md"):
        assert counts.get(page, 0) > 0, f"docs/{page} has no examples: {counts}"
