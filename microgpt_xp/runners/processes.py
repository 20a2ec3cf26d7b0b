"""Worker processes that share the rows of a batch (:class:`Processes`, ``workers=N``): this
process computes the first shard, ``N - 1`` *spawned* workers the others, combined in a fixed
order. A worker that dies mid-step makes the step raise one :class:`WorkerDied`."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn, TypeVar

import numpy as np

from .._errors import ArgumentValueError
from .._xp import check_positive_int
from ..params import Params
from ._base import Combine, Runner, host_params, run_on, shard_bounds, tree_sum

R = TypeVar("R")
_NO_GUARD = 87  # a worker's exit code: it re-ran a script that has no __main__ guard


class WorkerDied(RuntimeError):
    """A worker process ended during a step (killed, out of memory): the step's result
    is lost; the next step starts new workers."""


def check_workers(workers: Any) -> int | None:
    """``workers`` if it is ``None`` or a positive int of at most 4 processes a core this
    process may use, else :class:`ArgumentValueError` naming ``workers``."""
    if workers is None:
        return None
    from ..resources import usable_cpus

    return check_positive_int(workers, "workers", most=4 * usable_cpus())


def _serve(conn: Connection) -> None:
    """A worker's loop: one BLAS thread (the cores are shared by the processes), Ctrl-C
    left to the parent, exit as soon as the parent is gone; then ``(ok, value)`` for each
    call received, until ``None`` or a closed pipe."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    while (call := _recv(conn)) is not None:
        try:
            out: tuple[bool, Any] = (True, call[0](*call[1:]))
        except BaseException as exc:
            out = (False, exc)
        try:
            conn.send(out)
        except Exception as exc:  # a result or an error that does not pickle
            conn.send((False, RuntimeError(f"a worker's result could not be sent: {exc!r}")))


def _recv(conn: Connection) -> Any:
    try:
        return conn.recv()
    except EOFError:
        return None


def _exit_with(sentinel: int) -> None:
    """Block until ``sentinel`` (the parent's end of a pipe) closes, then exit now: a
    parent killed by a signal runs no clean-up that could stop us."""
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


class WorkerPool:
    """This process and ``processes - 1`` spawned workers (started on first use; this
    process's BLAS then held to one thread, as each worker's), each on a pipe of its own.
    Close it, or use it as a context manager."""

    def __init__(self, processes: int) -> None:
        check_workers(processes)
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            os._exit(_NO_GUARD)  # a spawned worker re-running an unguarded script: end
            # quietly (no traceback), its parent says what to do
        self.processes = processes
        self._workers: list[tuple[BaseProcess, Connection]] = []
        self._blas: Any = None  # this process's BLAS limit while the workers run

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (waiting for them) and give this process's BLAS its threads back."""
        self._stop(wait=5.0)
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None

    def _stop(self, wait: float) -> None:
        """Ask every worker to end; kill those still running after ``wait`` seconds."""
        for _, conn in self._workers:
            with contextlib.suppress(OSError):
                conn.send(None)
            conn.close()
        deadline = time.monotonic() + wait
        for proc, _ in self._workers:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join(1.0)
        self._workers = []

    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [p.pid for p, _ in self._workers if p.pid is not None]

    def _start(self) -> list[tuple[BaseProcess, Connection]]:
        if self._workers:
            return self._workers
        if multiprocessing.current_process().daemon:
            raise RuntimeError(
                f"workers={self.processes} cannot start processes from a daemonic process "
                "(such as a multiprocessing.Pool worker); use workers=None there"
            )
        if self._blas is None:  # else this process's BLAS helper threads spin on the workers' cores
            from threadpoolctl import ThreadpoolController

            self._blas = ThreadpoolController().select(user_api="blas").limit(limits=1)
        spawn = multiprocessing.get_context("spawn")
        for _ in range(self.processes - 1):
            here, there = spawn.Pipe()
            proc = spawn.Process(target=_serve, args=(there,), daemon=True)
            proc.start()
            there.close()  # the worker's end lives in the worker only: its death is our EOF
            self._workers.append((proc, here))
        return self._workers

    def _died(self) -> NoReturn:
        # a worker's pipe closes just before it exits: give the exit codes a moment (1 s in
        # all, the live workers are stopped next) so that the reason is the worker's own
        deadline = time.monotonic() + 1.0
        for proc, _ in self._workers:
            proc.join(max(0.0, deadline - time.monotonic()))
        codes = [p.exitcode for p, _ in self._workers]
        self._stop(wait=0.0)
        if _NO_GUARD in codes:
            raise RuntimeError(
                "the worker processes re-ran the script that starts them: put the code that "
                'calls microgpt_xp under `if __name__ == "__main__":` (see Python\'s '
                "multiprocessing docs, 'Safe importing of main module')"
            ) from None
        died = ", ".join(str(c) for c in codes if c is not None)
        raise WorkerDied(
            f"a microgpt_xp worker process died during the step (exit code {died or '?'})"
        ) from None

    def map(
        self, fn: Callable[..., R], params: Params, rows: Sequence[np.ndarray], *args: Any
    ) -> list[tuple[tuple[int, int], R]]:
        """:meth:`Runner.map` without ``combine``, the first shard here, the others on the
        workers: ``[((start, stop), result), ...]`` in shard order. A worker's error is
        raised once every shard is back; a lost worker raises one :class:`WorkerDied` at
        once (the pool stopped, the next call starts new workers)."""
        bounds = shard_bounds(int(rows[0].shape[0]), self.processes)
        shards = [tuple(r[a:b] for r in rows) for a, b in bounds]
        if len(shards) < 2:  # nothing for the workers
            return [(bounds[0], fn(params, *shards[0], *args))]
        workers = self._start()[: len(shards) - 1]
        try:
            for (_, conn), shard in zip(workers, shards[1:], strict=True):
                conn.send((fn, params, *shard, *args))
        except OSError:  # a worker that is gone
            self._died()
        try:
            here = fn(params, *shards[0], *args)
        except BaseException:
            self._stop(wait=0.0)  # Ctrl-C, or an error here: the workers' replies are not awaited
            raise
        results: dict[int, tuple[bool, Any]] = {}
        try:
            while len(results) < len(workers):
                waiting = {i: w for i, w in enumerate(workers) if i not in results}
                ready = multiprocessing.connection.wait(
                    [x for p, c in waiting.values() for x in (c, p.sentinel)]
                )
                for i, (proc, conn) in waiting.items():
                    if conn in ready or proc.sentinel in ready:
                        results[i] = conn.recv()  # EOFError once the worker is gone
        except (OSError, EOFError):
            self._died()
        except BaseException:
            self._stop(wait=0.0)
            raise
        for ok, value in (results[i] for i in range(len(workers))):
            if not ok:
                raise value
        values = [here, *(results[i][1] for i in range(len(workers)))]
        return list(zip(bounds, values, strict=True))


class Processes(Runner):
    """A runner over a :class:`WorkerPool` of ``processes`` processes; the weights travel
    as NumPy arrays and run on their own backend in the workers."""

    def __init__(self, processes: int) -> None:
        if check_workers(processes) is None:
            raise ArgumentValueError("workers", "Processes needs a number of processes")
        self.processes = processes
        self._pool = WorkerPool(processes)

    def map(
        self,
        fn: Callable[..., Any],
        params: Params,
        rows: Sequence[np.ndarray],
        *args: Any,
        combine: Combine | None = None,
    ) -> Any:
        task = functools.partial(run_on, fn, params.backend, params.device)
        results = [r for _, r in self._pool.map(task, host_params(params), rows, *args)]
        return tree_sum(results, combine) if combine is not None else results

    def close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return f"Processes({self.processes})"
