"""Where the time of our training step goes, by ``cProfile``. The rows are the functions of
the loaded modules under :data:`PROFILED`, found by their source files (nothing is patched
or named here). A row's *own* time is its body's and that of its calls outside the rows
(each call edge charged to its caller, so a dispatcher that calls back into the rows is
counted right); ``optim`` (``Adam.step``) and ``other`` (the rest) complete the step. The
profiler's overhead is in every row: shares, not absolute times."""

from __future__ import annotations

import cProfile
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from microgpt_xp import _xp
from microgpt_xp.model import loss_and_grads
from microgpt_xp.optim import Adam

from .timing import Figures, interleave, minor_faults
from .workloads import NUM_STEPS, Case, sync

#: Module prefixes whose functions are the rows (``microgpt_xp.primitives._numpy`` too).
PROFILED = ("microgpt_xp.layers", "microgpt_xp.primitives")
Key = tuple[str, int, str]  # cProfile's (file, first line, name) of a code object


def profiled_files(prefixes: tuple[str, ...] = PROFILED) -> dict[str, str]:
    """Source file -> module name without ``microgpt_xp.``, of the loaded modules whose
    name starts with one of ``prefixes``."""
    return {
        os.path.abspath(m.__file__): name.removeprefix("microgpt_xp.")
        for name, m in list(sys.modules.items())
        if name.startswith(prefixes) and getattr(m, "__file__", None)
    }


def profile_call(
    fn: Callable[[], Any], files: dict[str, str]
) -> tuple[dict[str, dict[str, float]], dict[str, float], float]:
    """Run ``fn()`` once under cProfile. Returns ``(rows, optim, seconds)``: ``rows`` maps
    ``module.function`` of each function in ``files`` that ran to its ``calls``, ``own_s``
    and ``inclusive_s``; ``optim`` holds the ``calls`` and ``inclusive_s`` of
    ``Adam.step``; ``seconds`` is the wall time of the call."""
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(fn)
    seconds = time.perf_counter() - start
    profile.create_stats()
    stats: dict[Key, Any] = profile.stats  # type: ignore[attr-defined]
    # a row's function, by its code's (file, line, name); lambdas and generators are not rows:
    # their time is their caller's, as that of any other call outside the rows
    heads = {
        k: f"{files[os.path.abspath(k[0])]}.{k[2]}"
        for k in stats
        if os.path.abspath(k[0]) in files and not k[2].startswith("<")
    }
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, owner in heads.items():
        calls, own, inclusive = stats[key][1:4]
        row = rows[owner]
        row["calls"] += calls
        row["inclusive_s"] += inclusive
        row["own_s"] += own  # the body's own time; its calls outside the rows follow
    for key, (*_, callers) in stats.items():
        if key not in heads:  # not a row's function: its time from a row is that row's
            for caller, (*_, from_caller) in callers.items():
                if caller in heads:
                    rows[heads[caller]]["own_s"] += from_caller
    code = Adam.step.__code__
    _, calls, _, inclusive, _ = stats.get(
        (code.co_filename, code.co_firstlineno, code.co_name), (0, 0, 0, 0.0, {})
    )
    return (
        {k: dict(v) for k, v in rows.items()},
        {"calls": calls, "inclusive_s": inclusive},
        seconds,
    )


def returned_dtypes(fn: Callable[[], Any], files: dict[str, str]) -> dict[str, set[str]]:
    """Run ``fn()`` once; the dtypes of the arrays each function in ``files`` returned
    (a ``sys.setprofile`` hook: nothing is patched)."""
    seen: dict[str, set[str]] = defaultdict(set)

    def dtypes(out: Any) -> set[str]:
        if isinstance(out, tuple):
            return set().union(*map(dtypes, out))
        return {str(out.dtype).split(".")[-1]} if hasattr(out, "dtype") else set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        module = files.get(os.path.abspath(frame.f_code.co_filename))
        if event == "return" and module and not frame.f_code.co_name.startswith("<"):
            seen[f"{module}.{frame.f_code.co_name}"] |= dtypes(arg)

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
    the host) goes on an eager ``train`` case: ``warmup`` steps, one that records the
    dtypes each row returns (to catch upcasts), then ``steps`` profiled steps; steps in
    which other processes used more than ``max_other`` of the CPUs are dropped. Rows are
    means over the kept steps (all, if none was kept), by own time, then optim and other."""
    params = case.params()
    if _xp.is_lazy(params.wte):
        return {"skipped": f"breakdown needs an eager backend, not {case.backend}"}
    tok = case.asarray(case.host_tokens())
    lens = case.asarray(np.full(case.batch, case.seq_len + 1))
    adam, state = Adam(params, num_steps=NUM_STEPS), {"params": params}

    def step() -> None:
        loss, grads = loss_and_grads(state["params"], tok, lens)
        state["params"] = adam.step(state["params"], grads)
        sync(loss)

    for _ in range(warmup):
        step()
    files = profiled_files()  # after the warm-up: every module the step imports is loaded
    dtypes = returned_dtypes(step, files)

    def profiled() -> dict[str, Any]:
        faults = minor_faults()
        rows, optim, seconds = profile_call(step, files)
        return {"rows": rows, "optim": optim, "s": seconds, "faults": minor_faults() - faults}

    rounds = interleave([Figures("step", profiled)], steps, max_rounds=steps, max_other=max_other)
    use = [m["step"] for m in rounds.use()]
    n, step_s = len(use), sum(r["s"] for r in use) / len(use)
    names = sorted({f for r in use for f in r["rows"]})
    keys = ("calls", "own_s", "inclusive_s")
    table = [
        {"function": f, **{k: sum(r["rows"].get(f, {}).get(k, 0.0) for r in use) / n for k in keys}}
        for f in names
    ]
    table.sort(key=lambda r: -r["own_s"])
    calls, optim_s = (sum(r["optim"][k] for r in use) / n for k in ("calls", "inclusive_s"))
    table.append({"function": "optim", "calls": calls, "own_s": optim_s, "inclusive_s": optim_s})
    rest = step_s - sum(r["own_s"] for r in table)
    table.append({"function": "other", "calls": 0.0, "own_s": rest, "inclusive_s": rest})
    for r in table:
        r["share"] = r["own_s"] / step_s
    modules = ", ".join(sorted({m.split(".")[0] for m in files.values()}))
    return {
        "method": f"cProfile; rows: own time of the functions of {modules}; "
        "includes the profiler's overhead: for shares, not absolute times",
        "step_s": step_s,
        "minor_faults_per_step": sum(r["faults"] for r in use) / n,
        "steps_kept": rounds.kept.count(True),
        "steps_dropped": rounds.dropped,
        "rows": table,
        "dtypes": {k: sorted(v) for k, v in sorted(dtypes.items())},
        "upcasts": sorted(k for k, v in dtypes.items() if v - {case.dtype, "bool", "int64"}),
    }
