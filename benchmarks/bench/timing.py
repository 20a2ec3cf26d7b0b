"""Interleaved timing rounds with a ``/proc/stat`` filter, BLAS thread control, and
robust statistics.

A *round* times our implementation and each peer once, back to back, in an order that
alternates from round to round (ours first, then peers first), so that slow drift of
the machine (frequency, other tenants) affects both sides of a ratio alike. Around each
round the machine-wide CPU counters of ``/proc/stat`` and this process's own CPU time are
read; a round in which *other* processes used more than a small share of the CPUs is
dropped (and counted), because on a shared machine such rounds can be 10x off.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from microgpt_xp._alloc import tune_malloc as tune_malloc

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU counters at one instant: machine-wide busy and total jiffies, this
    process's user+system jiffies (all its threads) and the wall clock."""

    busy: int
    total: int
    own: int
    wall: float


def cpu_sample() -> CpuSample | None:
    """Read ``/proc/stat`` and ``/proc/self/stat``; ``None`` where they do not exist."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        own = _process_jiffies("self")
    except (OSError, ValueError, IndexError):
        return None
    # user nice system idle iowait irq softirq steal (guest is already inside user).
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    busy = user + nice + system + irq + softirq + steal
    return CpuSample(busy, busy + idle + iowait, own, time.perf_counter())


def _process_jiffies(pid: str) -> int:
    """User + system jiffies of process ``pid`` (``"self"`` for this one), all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def other_cpu_share(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """Share of the machine's CPU capacity (0..1) used by other processes between two
    samples, or ``None`` when ``/proc`` is unavailable.

    Capacity is the elapsed total jiffies over all CPUs; "other" is busy jiffies (steal
    included) minus this process's own.
    """
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return 0.0
    other = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, other / total)


# -- BLAS threads --------------------------------------------------------------------------
def blas_threads() -> int | None:
    """Number of threads of NumPy's BLAS (through threadpoolctl); ``None`` when no BLAS
    library is found."""
    from threadpoolctl import threadpool_info

    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return int(counts[0]) if counts else None


def set_blas_threads(n: int) -> bool:
    """Set NumPy's BLAS threads to ``n`` (for the rest of the process); returns whether a
    BLAS library was found to set."""
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(limits=n, user_api="blas")
    return any(i.get("user_api") == "blas" for i in threadpool_info())


# -- the C allocator ----------------------------------------------------------------------------
def minor_faults() -> int:
    """Minor page faults of this process so far (0 where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


# -- statistics ------------------------------------------------------------------------------
def summary(values: Sequence[float]) -> dict[str, float]:
    """``median``, ``min``, ``max``, quartiles ``q1``/``q3`` and the number ``n`` of values."""
    v = sorted(values)
    if not v:
        return {
            "n": 0,
            "median": math.nan,
            "min": math.nan,
            "max": math.nan,
            "q1": math.nan,
            "q3": math.nan,
        }
    q1, q3 = (v[0], v[0]) if len(v) == 1 else tuple(statistics.quantiles(v, n=4)[::2])
    return {
        "n": len(v),
        "median": statistics.median(v),
        "min": v[0],
        "max": v[-1],
        "q1": q1,
        "q3": q3,
    }


# -- rounds -------------------------------------------------------------------------------------
@dataclass
class Timed:
    """A callable to time: one call does ``tokens`` tokens of work; ``repeat`` calls make
    one measurement (set by :func:`calibrate`)."""

    name: str
    fn: Callable[[], Any]
    tokens: int
    repeat: int = 1


def _time(t: Timed) -> float:
    start = time.perf_counter()
    for _ in range(t.repeat):
        t.fn()
    return (time.perf_counter() - start) / t.repeat


def calibrate(t: Timed, warmup: int, min_time: float) -> float:
    """Warm ``t`` up (``warmup`` calls, at least one) and set ``t.repeat`` so that one
    measurement lasts about ``min_time`` seconds. Returns the fastest warm-up call's time."""
    best = math.inf
    for _ in range(max(1, warmup)):
        start = time.perf_counter()
        t.fn()
        best = min(best, time.perf_counter() - start)
    t.repeat = max(1, math.ceil(min_time / max(best, 1e-9)))
    return best


@dataclass
class Rounds:
    """The outcome of :func:`interleave`: per-round seconds per call of every timed
    callable, the other-process CPU share of each round, and which rounds were kept."""

    names: list[str]
    seconds: list[dict[str, float]] = field(default_factory=list)
    other_share: list[float | None] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)
    filtered: bool = True

    @property
    def dropped(self) -> int:
        """Rounds dropped because other processes used the CPUs."""
        return self.kept.count(False)

    def kept_seconds(self) -> list[dict[str, float]]:
        """Seconds per call of the kept rounds (all rounds if none was kept, in which case
        ``filtered`` is False)."""
        out = [s for s, k in zip(self.seconds, self.kept, strict=True) if k]
        return out if out else list(self.seconds)


def interleave(
    timed: Sequence[Timed],
    repeats: int,
    *,
    max_other: float = 0.05,
    max_rounds: int | None = None,
    deadline: float | None = None,
    gap: float = 0.0,
) -> Rounds:
    """Run rounds until ``repeats`` of them are clean or ``max_rounds`` (default
    ``3 * repeats``) have run, or ``time.perf_counter()`` passes ``deadline``.

    Each round measures every callable once, in forward order on even rounds and reverse
    order on odd ones, after ``gap`` idle seconds each. A round is clean when other
    processes used at most ``max_other`` of the machine's CPU capacity during it (always
    clean where ``/proc`` is missing).

    The gap matters when the callables use different thread pools in one process: after a
    call, OpenBLAS's workers spin for about 0.1 s and so can PyTorch's, and a measurement
    that starts right after another library's would share the CPUs with those spinning
    threads (which ``/proc/self`` counts as this process, not as a disturbance).
    """
    max_rounds = 3 * repeats if max_rounds is None else max(max_rounds, repeats)
    out = Rounds([t.name for t in timed])
    clean = 0
    for r in range(max_rounds):
        if clean >= repeats or (deadline is not None and r >= 1 and time.perf_counter() > deadline):
            break
        order = list(timed) if r % 2 == 0 else list(reversed(timed))
        before = cpu_sample()
        seconds = {}
        for t in order:
            if gap > 0:
                time.sleep(gap)
            seconds[t.name] = _time(t)
        share = other_cpu_share(before, cpu_sample())
        ok = share is None or share <= max_other
        out.seconds.append(seconds)
        out.other_share.append(share)
        out.kept.append(ok)
        clean += ok
    out.filtered = clean > 0
    return out
