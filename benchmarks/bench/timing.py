"""The one timing harness of the benchmarks. A *round* measures every contender once, in
forward order on even rounds and reverse order on odd ones (slow drift of the machine
touches both sides of a ratio alike); around it ``/proc/stat`` and our CPU time (this
process, reaped children, given workers) are read, and a round in which *other* processes
used more than a share of the CPUs is dropped and counted. Ratios are taken per round,
then summarized. Also: threads, the allocator, page faults, the matmul yardstick."""

from __future__ import annotations

import importlib
import importlib.util
import math
import resource
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from microgpt_xp._alloc import tune_malloc as tune_malloc
from microgpt_xp.resources import cpu_sample, other_cpu_share


def summary(values: Sequence[float]) -> dict[str, float]:
    """``n``, ``median``, ``min``, ``max`` and quartiles ``q1``/``q3`` of ``values``."""
    v = sorted(values)
    if not v:
        return dict.fromkeys(("median", "min", "max", "q1", "q3"), math.nan) | {"n": 0}
    q1, q3 = (v[0], v[0]) if len(v) == 1 else statistics.quantiles(v, n=4)[::2]
    return {
        "n": len(v),
        "median": statistics.median(v),
        "min": v[0],
        "max": v[-1],
        "q1": q1,
        "q3": q3,
    }


@dataclass
class Timed:
    """A callable to time: one call does ``tokens`` tokens of work; a measurement is
    ``repeat`` calls (set by :func:`calibrate`) and gives seconds per call."""

    name: str
    fn: Callable[[], Any]
    tokens: int = 1
    repeat: int = 1

    def measure(self) -> float:
        """Seconds per call, over ``repeat`` calls."""
        start = time.perf_counter()
        for _ in range(self.repeat):
            self.fn()
        return (time.perf_counter() - start) / self.repeat


@dataclass
class Figures:
    """A contender whose one call returns its own figures (e.g. seconds a step, from a
    training run's callback): the whole calls of ``benchmarks.e2e``."""

    name: str
    measure: Callable[[], dict[str, Any]]


def calibrate(t: Timed, warmup: int, min_time: float) -> float:
    """Warm ``t`` up (at least one call) and set ``t.repeat`` so that a measurement lasts
    about ``min_time`` seconds. Returns the fastest warm-up call's seconds."""
    best = math.inf
    for _ in range(max(1, warmup)):
        start = time.perf_counter()
        t.fn()
        best = min(best, time.perf_counter() - start)
    t.repeat = max(1, math.ceil(min_time / max(best, 1e-9)))
    return best


@dataclass
class Rounds:
    """Per round of :func:`interleave`: each contender's measurement, the other processes'
    CPU share, and whether the round was kept."""

    measured: list[dict[str, Any]] = field(default_factory=list)
    other_share: list[float | None] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        """Rounds dropped because other processes used the CPUs."""
        return self.kept.count(False)

    @property
    def filtered(self) -> bool:
        """Whether a round was kept (if none was, :meth:`use` returns them all)."""
        return any(self.kept)

    def use(self) -> list[dict[str, Any]]:
        """The kept rounds' measurements, or every round's when none was kept."""
        return [m for m, k in zip(self.measured, self.kept, strict=True) if k] or list(
            self.measured
        )


def interleave(
    contenders: Sequence[Timed | Figures],
    repeats: int,
    *,
    max_other: float = 0.05,
    max_rounds: int | None = None,
    deadline: float | None = None,
    gap: float = 0.0,
    pids: Iterable[int] = (),
) -> Rounds:
    """Run rounds until ``repeats`` are clean (other processes used at most ``max_other`` of
    the CPUs; ``pids``: workers whose CPU time is ours), ``max_rounds`` (``3 * repeats``)
    have run, or the clock passes ``deadline``. Each measurement follows ``gap`` idle
    seconds: OpenBLAS's and PyTorch's threads spin for about 0.1 s after a call, and
    ``/proc/self`` counts them as ours, so the filter could not see them share the CPUs."""
    max_rounds = 3 * repeats if max_rounds is None else max(max_rounds, repeats)
    pids, out = list(pids), Rounds()
    for r in range(max_rounds):
        if out.kept.count(True) >= repeats or (deadline and r and time.perf_counter() > deadline):
            break
        before, measured = cpu_sample(pids), {}
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            if gap > 0:
                time.sleep(gap)
            measured[c.name] = c.measure()
        share = other_cpu_share(before, cpu_sample(pids))
        out.measured.append(measured)
        out.other_share.append(share)
        out.kept.append(share is None or share <= max_other)
    return out


def blas_threads() -> int | None:
    """NumPy's BLAS threads (threadpoolctl); ``None`` when no BLAS library is found."""
    from threadpoolctl import threadpool_info

    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return int(counts[0]) if counts else None


def set_threads(n: int | None) -> dict[str, Any]:
    """Set NumPy's BLAS threads to ``n`` (``None``: leave them) and torch's, where it is
    installed, to the same number. Returns ``blas_threads``, ``torch``, ``torch_threads``."""
    from threadpoolctl import threadpool_limits

    if n is not None:
        threadpool_limits(limits=n, user_api="blas")
    blas, torch = (
        blas_threads(),
        importlib.import_module("torch") if importlib.util.find_spec("torch") else None,
    )
    if torch is not None and (n or blas):
        torch.set_num_threads(int(n or blas))  # type: ignore[arg-type]
    return {
        "blas_threads": blas,
        "torch": torch and torch.__version__,
        "torch_threads": torch and torch.get_num_threads(),
    }


def minor_faults() -> int:
    """Minor page faults of this process so far."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def square_matmul_gflops(size: int = 1024, dtype: str = "float32", repeat: int = 5) -> float:
    """GFLOP/s of one ``size x size`` NumPy product (best of ``repeat``): the machine's peak."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size)).astype(dtype) for _ in range(2))
    best = math.inf
    for _ in range(repeat + 1):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9
