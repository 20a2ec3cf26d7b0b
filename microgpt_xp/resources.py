"""What a run takes of the machine: BLAS threads for a model's size (``auto``: less the busy
cores), and how many documents are scored at once within a memory budget."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ._errors import ArgumentValueError
from ._xp import NATIVE_INT_MAX, check_dtype, check_positive_int
from .config import GPTConfig

WORKLOADS = ("train", "score", "decode")  # a training step, scoring, a decoding position
WORK_PER_THREAD = 1 << 19  # ``tokens * n_embd**2`` per BLAS thread (measured on 2 cores)
LOAD_WINDOW = 0.1  # seconds over which :func:`busy_cpus` watches the other processes
DEFAULT_BUDGET = 500_000_000  # the default memory budget of a chunk's activations, bytes
FAST_SCORE_BYTES = 16 << 20  # activation bytes of a scoring chunk at its fastest (measured)


class CpuSample(NamedTuple):
    """Cumulative jiffies: machine ``busy`` and ``total``, and ``own`` (ours and ``pids``)."""

    busy: int
    total: int
    own: int


def _jiffies(pid: int | str, children: bool = False) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in v[11 : 15 if children else 13])  # utime stime [cutime cstime]


def cpu_sample(pids: Iterable[int] = ()) -> CpuSample | None:
    """``/proc/stat`` and our processes' counters; ``None`` without ``/proc``."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # steal counts
    own = _jiffies("self", children=True) + sum(_jiffies(p) for p in pids)
    return CpuSample(busy, busy + v[3] + v[4], own)


def other_cpu_share(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """Share (0..1) of the CPU other processes used between two samples (``None``: no data)."""
    if before is None or after is None:
        return None
    total = max(after.total - before.total, 1)
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / total)


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cpus(window: float = LOAD_WINDOW) -> float:
    """CPUs other processes keep busy over the next ``window`` seconds (0.0 without /proc)."""
    before = cpu_sample()
    time.sleep(window)
    share = other_cpu_share(before, cpu_sample())
    return 0.0 if share is None else share * (os.cpu_count() or 1)


def default_threads(
    config: GPTConfig, batch_size: int, *, workload: str = "train", cpus: int | None = None
) -> int:
    """The BLAS threads for ``batch_size`` rows of ``workload`` (of :data:`WORKLOADS`):
    ``tokens * n_embd**2 // WORK_PER_THREAD`` in ``[1, cpus]``."""
    if workload not in WORKLOADS:
        raise ArgumentValueError(
            "workload", f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}"
        )
    check_positive_int(batch_size, "batch_size")
    cpus = usable_cpus() if cpus is None else check_positive_int(cpus, "cpus", most=NATIVE_INT_MAX)
    tokens = batch_size * (1 if workload == "decode" else config.block_size)
    return min(cpus, max(1, tokens * config.n_embd**2 // WORK_PER_THREAD))


def auto_threads(
    config: GPTConfig,
    batch_size: int,
    *,
    workload: str = "train",
    cpus: int | None = None,
    busy: float | None = None,
) -> int:
    """:func:`default_threads` less the CPUs others keep ``busy`` (default :func:`busy_cpus`,
    sampled only when more than one thread is wanted), at least 1."""
    if (wanted := default_threads(config, batch_size, workload=workload, cpus=cpus)) == 1:
        return 1
    busy = busy_cpus() if busy is None else busy
    return max(1, min(wanted, (cpus or usable_cpus()) - int(busy + 0.5)))


def check_threads(threads: Any) -> int | str | None:
    """``threads`` checked: ``None``, ``"auto"``, or a positive int capped at
    :func:`usable_cpus` (with a warning); else :class:`ArgumentValueError`."""
    if threads is None or (isinstance(threads, str) and threads == "auto"):
        return threads
    count = check_positive_int(threads, "threads")
    cpus = usable_cpus()
    if count > cpus:
        warnings.warn(
            f"threads={count}: this process may use {cpus} cores; using {cpus}", stacklevel=2
        )
        return cpus
    return count


@contextlib.contextmanager
def use_threads(
    threads: int | str | None,
    *,
    config: GPTConfig | None = None,
    batch_size: int | None = None,
    workload: str = "train",
) -> Iterator[int | None]:
    """Run the block on ``threads`` BLAS (and imported torch's) threads, restored on exit;
    yields the count (``None``: unchanged). ``"auto"``: :func:`auto_threads` of the rest."""
    count = check_threads(threads)
    if count == "auto":
        if config is None or batch_size is None:
            raise ValueError("use_threads('auto') needs the config and batch_size to choose")
        count = auto_threads(config, batch_size, workload=workload)
    if count is None:
        yield None
        return
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")  # set only where already in use: never imported here
    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=count, user_api="blas"):
        if torch is not None:
            torch.set_num_threads(count)
        try:
            yield int(count)
        finally:
            if torch is not None:
                torch.set_num_threads(before)


def activation_bytes(config: GPTConfig, docs: int, *, dtype: str = "float32") -> int:
    """Peak activation bytes of scoring ``docs`` documents of ``T = block_size`` tokens at once:
    ``T*C*(2 + 12*L) + (L+1)*H*T**2 + max(5*T*C, 4*V*T)`` elements and ``32*(T + 1)`` bytes each."""
    check_positive_int(docs, "docs")
    t, c, layers = config.block_size, config.n_embd, config.n_layer
    elements = t * c * (2 + 12 * layers) + (layers + 1) * config.n_head * t * t
    elements += max(5 * t * c, 4 * config.vocab_size * t)
    itemsize = {"float32": 4, "float64": 8}[check_dtype(dtype)]
    return docs * (elements * itemsize + 32 * (t + 1))


def chunk_for_budget(
    config: GPTConfig, *, budget_bytes: int = DEFAULT_BUDGET, dtype: str = "float32"
) -> int:
    """The most documents (at least 1) scored at once within ``budget_bytes``."""
    check_positive_int(budget_bytes, "budget_bytes")
    return max(1, budget_bytes // activation_bytes(config, 1, dtype=dtype))


def score_chunk(
    config: GPTConfig, *, budget_bytes: int = DEFAULT_BUDGET, dtype: str = "float32"
) -> int:
    """The default scoring chunk: within :data:`FAST_SCORE_BYTES` and ``budget_bytes``."""
    return chunk_for_budget(config, budget_bytes=min(budget_bytes, FAST_SCORE_BYTES), dtype=dtype)
