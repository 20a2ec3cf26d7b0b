"""Batch shards on this host's CPU cores: one Python thread per shard of rows.

NumPy runs its elementwise kernels and reductions on one core and releases the GIL while
it does, and only its BLAS uses more. A batch of NumPy arrays split by rows into shards,
each computed by its own thread, therefore puts the elementwise work on every core as
well. Each thread's BLAS is held to its share of the cores meanwhile, so that the
threads' matrix products do not oversubscribe them. Splitting pays only when each
shard's work is large against the per-call cost of NumPy (a few microseconds, taken
with the GIL held): :func:`plan` asks for a minimum of work per shard.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from .config import GPTConfig

R = TypeVar("R")

#: The least work (multiply-adds, as :func:`work` counts them) that one shard must get.
#: Measured on 2 cores (docs/performance.md): below about a million multiply-adds a
#: shard, the threads' per-call overhead and their contention for the GIL cost more
#: than the second core gives.
MIN_SHARD_WORK = 1_000_000

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_workers(workers: int | None) -> int | None:
    """Return ``workers`` if it is ``None`` or a positive int, else raise ``ValueError``."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int or None (automatic), got {workers!r}")
    return workers


def work(config: GPTConfig, tokens: int) -> int:
    """A size measure of running ``tokens`` positions through the model:
    ``tokens * C * (C + T)``, the shape of the per-position matrix products (``∝ C²``) and
    attention (``∝ T C``)."""
    c, t = config.n_embd, config.block_size
    return tokens * c * (c + t)


@dataclass(frozen=True)
class Plan:
    """How a batch runs on the host: ``shards`` row ranges, one thread each, with NumPy's
    BLAS held to ``blas_threads`` threads while they run (``None``: left as it is); with
    ``processes``, one worker process each instead (the first in this process), see
    :mod:`microgpt_xp._procs`."""

    shards: int
    blas_threads: int | None
    processes: bool = False


def plan(config: GPTConfig, rows: int, row_tokens: int, workers: int | None) -> Plan:
    """The :class:`Plan` for ``rows`` rows of ``row_tokens`` positions each (one position
    per row for a decoding step).

    ``workers=None`` gives the batch one core per :data:`MIN_SHARD_WORK` of its work (at
    least one, at most the usable cores) and one shard per core. An int asks for that
    many threads (at most one per row). The shards share the usable cores between their
    BLAS; a single shard leaves the BLAS as it is.
    """
    check_workers(workers)
    if workers is None:
        by_size = work(config, rows * row_tokens) // MIN_SHARD_WORK
        workers = max(1, min(usable_cpus(), by_size))
    shards = max(1, min(workers, rows))
    return Plan(shards, None if shards == 1 else max(1, usable_cpus() // shards))


def sequence_plan(config: GPTConfig, rows: int, length: int, workers: int | None) -> Plan:
    """The :class:`Plan` for ``rows`` documents of ``length`` tokens each (training or
    scoring: ``min(length - 1, block_size)`` predicted positions a row)."""
    return plan(config, rows, min(length - 1, config.block_size), workers)


def decode_plan(config: GPTConfig, rows: int, workers: int | None) -> Plan:
    """The :class:`Plan` for decoding ``rows`` sequences: a step handles one position of
    each row, so each call's work is that of ``rows`` positions."""
    return plan(config, rows, 1, workers)


#: The plan that changes nothing: one shard in the calling thread, BLAS as it is.
UNCHANGED = Plan(1, None)


def shard_bounds(rows: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous ``(start, stop)`` row ranges of near-equal size covering
    ``0..rows``."""
    return [(i * rows // shards, (i + 1) * rows // shards) for i in range(shards)]


def _forget_pool() -> None:
    """In a forked child: the parent's worker threads do not exist there, so a new pool
    is made on first use (the old one would queue work that no thread runs)."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=max(2, usable_cpus()), thread_name_prefix="microgpt_xp"
            )
        return _pool


@functools.cache
def _blas_controller() -> Any:
    """threadpoolctl's controller of the BLAS libraries loaded now (built once: finding
    them takes milliseconds)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


def blas_limit(threads: int | None) -> contextlib.AbstractContextManager[Any]:
    """A context in which NumPy's BLAS uses ``threads`` threads (``None``: as it is)."""
    if threads is None:
        return contextlib.nullcontext()
    return _blas_controller().limit(limits=threads)  # type: ignore[no-any-return]


def run(plan: Plan, fn: Callable[[int, int], R], rows: int) -> list[R]:
    """``[fn(start, stop) for each shard]`` of ``rows`` rows as ``plan`` says: one thread
    per shard (none for a single shard), with the BLAS limited meanwhile.

    An exception in a shard is raised here, after every shard has finished.
    """
    bounds = shard_bounds(rows, plan.shards)
    with blas_limit(plan.blas_threads):
        if len(bounds) == 1:
            return [fn(*bounds[0])]
        futures = [_executor().submit(fn, start, stop) for start, stop in bounds]
        for f in futures:
            f.exception()  # wait for every shard before raising any error
        return [f.result() for f in futures]
