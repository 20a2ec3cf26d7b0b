"""Worker processes that share the rows of a batch: :class:`Processes`, a runner.

``Processes(N)`` (``workers=N``) splits each batch into ``N`` row shards: this process
computes the first, ``N - 1`` *spawned* workers (safe with threads, Jupyter, CUDA) the
others, combined in a fixed order. Each worker holds its BLAS to one thread and exits as
soon as its parent ends (``SIGKILL`` included). A worker that dies mid-step makes the
step raise one :class:`WorkerDied`; the next step starts a fresh pool. Weights and rows
travel pickled with each shard (see ``docs/training.md`` for when that pays).
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import numpy as np

from .._errors import ArgumentValueError
from ..params import Params
from ._base import Combine, Runner, host_params, run_on, shard_bounds, tree_sum

R = TypeVar("R")


class WorkerDied(RuntimeError):
    """A worker process ended during a step (killed, out of memory): the step's result
    is lost; the next step starts new workers."""


def check_workers(workers: Any) -> int | None:
    """Return ``workers`` if it is ``None`` or a positive int, else raise ``ValueError``."""
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ArgumentValueError(
            "workers",
            f"workers must be a positive int (processes that share a batch) or None, got {workers!r}",
        )
    return workers


def _start_worker() -> None:
    """A worker's initializer: one BLAS thread (the cores are shared by the processes),
    and a thread that ends the process as soon as its parent is gone."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    """Block until ``sentinel`` (the parent's end of a pipe) closes, then exit now: a
    parent killed by a signal runs no clean-up that could stop us."""
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


class WorkerPool:
    """This process and ``processes - 1`` spawned workers (started on first use; this
    process's BLAS then held to one thread, as each worker's). Close it, or use it as a
    context manager."""

    def __init__(self, processes: int) -> None:
        check_workers(processes)
        self.processes = processes
        self._executor: ProcessPoolExecutor | None = None
        self._blas: Any = None  # this process's BLAS limit while the workers run

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (waiting for them) and give this process's BLAS its threads back."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None

    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        if self._executor is None:
            return []
        return [p.pid for p in self._executor._processes.values() if p.pid is not None]

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            if multiprocessing.current_process().daemon:
                raise RuntimeError(
                    f"workers={self.processes} cannot start processes from a daemonic process "
                    "(such as a multiprocessing.Pool worker); use workers=None there"
                )
            if self._blas is None:
                # else this process's BLAS helper threads spin on the workers' cores
                from threadpoolctl import ThreadpoolController

                self._blas = ThreadpoolController().select(user_api="blas").limit(limits=1)
            self._executor = ProcessPoolExecutor(
                max_workers=self.processes - 1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
            )
        return self._executor

    def _run(self, first: Any, submit: list[tuple[Any, ...]]) -> list[Any]:
        """``submit``'s calls on the workers while ``first()`` runs here; the results in
        order, first's first. A lost worker raises one :class:`WorkerDied` (after every
        shard has finished or failed); the pool is then replaced at the next call."""
        if not submit:
            return [first()]
        pool = self._pool()
        try:
            futures: list[Future[Any]] = [pool.submit(*call) for call in submit]
        except BrokenProcessPool as exc:
            self._broken()
            raise WorkerDied(f"a microgpt_xp worker process died: {exc}") from None
        try:
            here = first()
        finally:
            for f in futures:
                f.exception()  # wait for every shard before raising any error
        try:
            return [here, *(f.result() for f in futures)]
        except BrokenProcessPool as exc:
            self._broken()
            raise WorkerDied(
                f"a microgpt_xp worker process died during the step ({exc}); "
                "the step's result is lost, the next step starts new workers"
            ) from None

    def _broken(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def map(
        self, fn: Callable[..., R], params: Params, rows: Sequence[np.ndarray], *args: Any
    ) -> list[tuple[tuple[int, int], R]]:
        """:meth:`Runner.map` without ``combine``, the first shard here: returns
        ``[((start, stop), result), ...]`` in shard order."""
        bounds = shard_bounds(int(rows[0].shape[0]), self.processes)
        shards = [tuple(r[a:b] for r in rows) for a, b in bounds]
        calls = [(fn, params, *shard, *args) for shard in shards[1:]]
        results = self._run(lambda: fn(params, *shards[0], *args), calls)
        return list(zip(bounds, results, strict=True))


class Processes(Runner):
    """A runner over a :class:`WorkerPool` of ``processes`` processes; the weights travel
    as NumPy arrays and run on their own backend in the workers."""

    def __init__(self, processes: int) -> None:
        if check_workers(processes) is None:
            raise ArgumentValueError("workers", "Processes needs a number of processes")
        self.processes = processes
        self._pool = WorkerPool(processes)

    def bounds(self, rows: int) -> list[tuple[int, int]]:
        return shard_bounds(rows, self.processes)

    def map(
        self,
        fn: Callable[..., Any],
        params: Params,
        rows: Sequence[np.ndarray],
        *args: Any,
        combine: Combine | None = None,
    ) -> Any:
        host = host_params(params)
        task = functools.partial(run_on, fn, params.backend, params.device)
        parts = self._pool.map(task, host, rows, *args)
        results = [result for _, result in parts]
        return tree_sum(results, combine) if combine is not None else results

    def close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return f"Processes({self.processes})"
