"""Where the time of our training step goes, found by a profiler.

Extra, untimed training steps run under :mod:`cProfile`, and the profile is summed by the
functions of :mod:`microgpt_xp.layers` and of ``microgpt_xp.primitives`` where that module
(or package) exists. A function is found by its code object, so nothing in the library is
patched and it does not matter how ``model.py`` spells its calls.

A row's *own* time is the time inside the function and in everything it calls outside these
modules (NumPy's own Python functions, array-api-compat's wrappers, the C calls), without the
time of the other rows' functions that it calls: the rows do not overlap, and with ``optim``
(``Adam.step``) and ``other`` (the rest: ``model.py``'s glue, the loss to the host) they add
up to the profiled step. The profiler's overhead is in every row, so the breakdown is for
shares, not absolute times. On an asynchronous device (CuPy, CUDA torch) the rows are host
time; the device's work is charged where the host waits for it.
"""

from __future__ import annotations

import cProfile
import importlib
import importlib.util
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from types import CodeType
from typing import Any

import numpy as np

from microgpt_xp import _xp
from microgpt_xp.model import loss_and_grads
from microgpt_xp.optim import Adam

from .timing import cpu_sample, minor_faults, other_cpu_share
from .workloads import Case, sync

#: Modules (or packages) whose functions are the rows of the breakdown.
PROFILED: tuple[str, ...] = ("microgpt_xp.layers", "microgpt_xp.primitives")



def _path(p: str) -> str:
    return os.path.normcase(os.path.abspath(p))


def _in_its_package(name: str) -> bool:
    """Whether module ``name`` exists and, for a submodule, lives in its parent package's
    folders: an editable install of another checkout can make ``find_spec`` find a
    submodule there that this package does not have."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False
    parent, _, _ = name.rpartition(".")
    if not parent:
        return True
    folders = [_path(f) + os.sep for f in importlib.import_module(parent).__path__]
    places = list(spec.submodule_search_locations or []) or [spec.origin or ""]
    return all(any(_path(p).startswith(f) for f in folders) for p in places)


class ModuleMatcher:
    """Tells which of some modules a source file belongs to: ``label(filename)`` is the
    module's name without its ``microgpt_xp.`` prefix (a package's submodule keeps its
    dotted path), or ``None``. Modules that this package does not have are left out."""

    def __init__(self, names: Sequence[str]) -> None:
        self.files: dict[str, str] = {}
        self.packages: dict[str, str] = {}
        for name in names:
            if not _in_its_package(name):
                continue
            module = importlib.import_module(name)
            short = name.removeprefix("microgpt_xp.")
            paths = getattr(module, "__path__", None)
            if paths:
                for path in paths:
                    self.packages[_path(path) + os.sep] = short
            elif module.__file__:
                self.files[_path(module.__file__)] = short

    def label(self, filename: str) -> str | None:
        """The short module name of ``filename``, or ``None`` when it is none of these."""
        path = _path(filename)
        if path in self.files:
            return self.files[path]
        for root, short in self.packages.items():
            if path.startswith(root):
                sub = os.path.splitext(path[len(root) :])[0].replace(os.sep, ".")
                return short if sub == "__init__" else f"{short}.{sub.removesuffix('.__init__')}"
        return None


Rows = dict[str, dict[str, float]]
Key = tuple[str, int, str]  # cProfile's (file, first line, name) of a code object


def _owners(keys: list[Key], rows: ModuleMatcher) -> tuple[dict[Key, str], set[Key]]:
    """The row that each profiled key of ``rows``' modules belongs to, and the keys whose
    time is their row's (the others' time is inside it already). A generator expression,
    comprehension or lambda (``<genexpr>``, ...) belongs to the function whose body holds
    it (the nearest named function starting above it in the same file), which consumes it,
    possibly through a builtin such as ``sum``; one at module level is a row of its own."""
    named: dict[str, list[tuple[int, str]]] = defaultdict(list)
    owners: dict[Key, str] = {}
    heads: set[Key] = set()
    for key in keys:
        module = rows.label(key[0])
        if module is not None and not key[2].startswith("<"):
            named[key[0]].append((key[1], f"{module}.{key[2]}"))
            owners[key] = f"{module}.{key[2]}"
            heads.add(key)
    for key in keys:
        module = rows.label(key[0])
        if module is not None and key[2].startswith("<"):
            above = [(line, name) for line, name in named[key[0]] if line <= key[1]]
            if above:
                owners[key] = max(above)[1]
            else:
                owners[key] = f"{module}.{key[2]}:{key[1]}"
                heads.add(key)
    return owners, heads


def profile_call(
    fn: Callable[[], Any], rows: ModuleMatcher, codes: Mapping[str, CodeType]
) -> tuple[Rows, Rows, float]:
    """Run ``fn()`` once under cProfile. Returns ``(functions, timed, seconds)``:
    ``functions`` maps ``module.function`` of every function in ``rows`` that ran to its
    ``calls``, ``own_s`` and ``inclusive_s`` (own: without the time of the other functions
    in ``rows`` that it called); ``timed`` maps each name of ``codes`` whose code ran to its
    ``calls`` and ``inclusive_s``; ``seconds`` is the wall time of the profiled call."""
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(fn)
    seconds = time.perf_counter() - start
    profile.create_stats()
    stats: dict[Key, tuple[Any, ...]] = profile.stats  # type: ignore[attr-defined]
    owners, heads = _owners(list(stats), rows)
    functions: Rows = defaultdict(lambda: defaultdict(float))
    for key, (_, calls, _, inclusive, callers) in stats.items():
        if key not in heads:
            continue  # not in a row, or inside its row's time already
        owner = owners[key]
        row = functions[owner]
        row["calls"] += calls
        row["inclusive_s"] += inclusive
        row["own_s"] += inclusive
        # what the callers in other rows spent in this one is not their own time
        for caller, (*_, from_caller) in callers.items():
            if owners.get(caller) not in (None, owner):
                functions[owners[caller]]["own_s"] -= from_caller
    timed: Rows = {}
    for name, code in codes.items():
        key = (code.co_filename, code.co_firstlineno, code.co_name)
        if key in stats:
            _, calls, _, inclusive, _ = stats[key]
            timed[name] = {"calls": calls, "inclusive_s": inclusive}
    return {k: dict(v) for k, v in functions.items()}, timed, seconds


def _dtypes(out: Any) -> set[str]:
    """The dtype names of the arrays in ``out`` (an array or nested tuples)."""
    if isinstance(out, tuple):
        return set().union(*(_dtypes(o) for o in out)) if out else set()
    dtype = getattr(out, "dtype", None)
    return set() if dtype is None else {str(dtype).split(".")[-1]}


def returned_dtypes(fn: Callable[[], Any], rows: ModuleMatcher) -> dict[str, set[str]]:
    """Run ``fn()`` once and collect the dtypes of the arrays that each function of ``rows``
    returned (seen by a ``sys.setprofile`` hook, so nothing is patched)."""
    seen: dict[str, set[str]] = defaultdict(set)

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "return":
            module = rows.label(frame.f_code.co_filename)
            if module is not None and not frame.f_code.co_name.startswith("<"):
                seen[f"{module}.{frame.f_code.co_name}"] |= _dtypes(arg)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return dict(seen)


def breakdown(
    case: Case, steps: int = 5, warmup: int = 2, max_other: float = 0.05
) -> dict[str, Any]:
    """Where the time of our training step (``loss_and_grads``, ``Adam.step``, the loss to
    the host) goes on ``case``, a ``train`` case of an eager backend: ``warmup`` plain steps,
    one step that records the dtypes every profiled function returns (to catch silent
    upcasts), then ``steps`` steps each under its own profile. Steps in which other
    processes used more than ``max_other`` of the CPUs are dropped; the rows are the means
    over the kept ones (all, if none was kept), sorted by own time, then ``optim`` and
    ``other``."""
    params = case.params()
    if _xp.is_lazy(params.wte):
        return {"skipped": f"breakdown needs an eager backend, not {case.backend}"}
    rows = ModuleMatcher(PROFILED)
    codes = {"optim": Adam.step.__code__}
    tok = case.asarray(case.host_tokens())
    lens = case.asarray(np.full(case.batch, case.seq_len + 1, dtype=np.int64))
    adam = Adam(params, num_steps=2**62)
    state = {"params": params}

    def step() -> None:
        loss, grads = loss_and_grads(state["params"], tok, lens)
        state["params"] = adam.step(state["params"], grads)
        sync(loss)

    for _ in range(warmup):
        step()
    dtypes = returned_dtypes(step, rows)
    profiles: list[tuple[Rows, Rows, float, int]] = []
    clean: list[bool] = []
    for _ in range(steps):
        before, faults = cpu_sample(), minor_faults()
        functions, timed, seconds = profile_call(step, rows, codes)
        faults = minor_faults() - faults
        share = other_cpu_share(before, cpu_sample())
        profiles.append((functions, timed, seconds, faults))
        clean.append(share is None or share <= max_other)
    use = [p for p, ok in zip(profiles, clean, strict=True) if ok] or profiles
    n = len(use)
    step_s = sum(p[2] for p in use) / n
    names = sorted({name for p in use for name in p[0]})
    table = []
    for name in names:
        mean = {
            key: sum(p[0].get(name, {}).get(key, 0.0) for p in use) / n
            for key in ("calls", "own_s", "inclusive_s")
        }
        table.append({"function": name, **mean})
    table.sort(key=lambda r: -r["own_s"])
    for name in codes:
        calls, seconds = (
            sum(p[1].get(name, {}).get(key, 0.0) for p in use) / n
            for key in ("calls", "inclusive_s")
        )
        table.append({"function": name, "calls": calls, "own_s": seconds, "inclusive_s": seconds})
    rest = step_s - sum(r["own_s"] for r in table)
    table.append({"function": "other", "calls": 0.0, "own_s": rest, "inclusive_s": rest})
    for r in table:
        r["share"] = r["own_s"] / step_s if step_s else math.nan
    return {
        "method": "cProfile; rows: own time of the functions of "
        + ", ".join(sorted(set(rows.files.values()) | set(rows.packages.values())))
        + "; includes the profiler's overhead: for shares, not absolute times",
        "step_s": step_s,
        "minor_faults_per_step": sum(p[3] for p in use) / n,
        "steps_kept": clean.count(True),
        "steps_dropped": clean.count(False),
        "rows": table,
        "dtypes": {k: sorted(v) for k, v in sorted(dtypes.items())},
        "upcasts": sorted(k for k, v in dtypes.items() if v - {case.dtype, "bool", "int64"}),
    }
