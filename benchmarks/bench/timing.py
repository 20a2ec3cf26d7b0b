"""The one timing harness of the benchmarks. A *round* measures every contender once, in
forward order on even rounds and reverse order on odd ones (slow drift of the machine
touches both sides of a ratio alike); around it ``/proc/stat`` and our CPU time (this
process, reaped children, given workers) are read, and a round in which *other* processes
used more than a share of the CPUs is dropped and counted. Ratios are taken per round,
then summarized. Also: threads, the allocator, page faults, the matmul yardstick."""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from microgpt_xp._alloc import tune_malloc as tune_malloc


class CpuSample(NamedTuple):
    """Cumulative jiffies: machine ``busy`` and ``total``, and ``own`` (this process, its
    reaped children and the given worker processes)."""

    busy: int
    total: int
    own: int


def _jiffies(pid: int | str, children: bool = False) -> int:
    """User + system jiffies of process ``pid`` (all threads; plus reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in v[11 : 15 if children else 13])  # utime stime [cutime cstime]


def cpu_sample(pids: Iterable[int] = ()) -> CpuSample | None:
    """Read ``/proc/stat`` and our processes' counters; ``None`` without ``/proc``."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # steal counts
    own = _jiffies("self", children=True) + sum(_jiffies(p) for p in pids)
    return CpuSample(busy, busy + v[3] + v[4], own)


def other_cpu_share(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """Share (0..1) of the machine's CPU capacity that other processes used between two
    samples (busy jiffies minus our own, over all CPUs' jiffies); ``None`` without data."""
    if before is None or after is None:
        return None
    total = max(after.total - before.total, 1)
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / total)


def summary(values: Sequence[float]) -> dict[str, float]:
    """``n``, ``median``, ``min``, ``max`` and quartiles ``q1``/``q3`` of ``values``."""
    v = sorted(values)
    if not v:
        return dict.fromkeys(("median", "min", "max", "q1", "q3"), math.nan) | {"n": 0}
    q1, q3 = (v[0], v[0]) if len(v) == 1 else statistics.quantiles(v, n=4)[::2]
    return {"n": len(v), "median": statistics.median(v), "min": v[0], "max": v[-1], "q1": q1, "q3": q3}


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
        return [m for m, k in zip(self.measured, self.kept, strict=True) if k] or list(self.measured)


def interleave(contenders: Sequence[Timed | Figures], repeats: int, *, max_other: float = 0.05,
               max_rounds: int | None = None, deadline: float | None = None, gap: float = 0.0,
               pids: Iterable[int] = ()) -> Rounds:
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
    if n is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")
    blas = blas_threads()
    try:
        import torch
    except ImportError:
        return {"blas_threads": blas, "torch": None, "torch_threads": None}
    if n or blas:
        torch.set_num_threads(int(n or blas))  # type: ignore[arg-type]
    return {"blas_threads": blas, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


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
