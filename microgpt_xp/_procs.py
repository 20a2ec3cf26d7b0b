"""Row shards of a NumPy training step in forked worker processes.

Threads (:mod:`microgpt_xp._threads`) share a batch well when each shard's NumPy calls
are long, but a small model's step is hundreds of calls of a few microseconds, and every
one of them takes the GIL: two threads then spend more time handing the GIL to each other
than they gain. Worker processes have no GIL to share. Each worker is forked once and
kept; per step it gets the weights and its rows through shared memory, computes its
shard's loss and gradients, and leaves them in shared memory, so that only a few bytes
of messages cross the pipe. Linux only (``fork``); elsewhere :func:`available` is False.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import mmap
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _threads
from ._threads import Plan, work
from .config import GPTConfig
from .params import FIELDS, Params, field_shapes

if TYPE_CHECKING:
    from .model import Reduction

#: The least work (:func:`microgpt_xp._threads.work`) that one process shard must get.
#: Measured on 2 cores (docs/performance.md): a process shard repeats the step's fixed
#: cost (a few hundred microseconds of NumPy calls) and two pipe messages, so a shard
#: needs about a quarter of a million multiply-adds to gain.
MIN_PROCESS_WORK = 250_000

#: Seconds a worker (and this process, waiting for one) polls its pipe before it blocks.
#: A process blocked on a pipe is woken about a quarter of a millisecond after the
#: message arrives on a virtual machine's idle CPU, which is a tenth of a small model's
#: step; polling between the steps of a training loop costs a core that would idle.
SPIN_SECONDS = 0.005

_lock = threading.Lock()
_workers: list[_Worker] = []


def plan(config: GPTConfig, rows: int, length: int) -> Plan:
    """The process :class:`~microgpt_xp._threads.Plan` of a training batch of ``rows``
    documents of ``length`` tokens: one shard per :data:`MIN_PROCESS_WORK` of its work,
    at most one per usable core and per row, each process's BLAS on one thread."""
    by_size = work(config, rows * min(length - 1, config.block_size)) // MIN_PROCESS_WORK
    return Plan(max(1, min(_threads.usable_cpus(), by_size, rows)), 1, processes=True)


def available() -> bool:
    """Whether worker processes can be used here: on Linux (where ``fork`` is safe and
    cheap), and not from a daemonic process (which may not have children)."""
    return sys.platform.startswith("linux") and not multiprocessing.current_process().daemon


def _wait(conn: Any, spin: float = SPIN_SECONDS) -> None:
    """Return when ``conn`` has something to read (or is closed): poll it for ``spin``
    seconds, then block."""
    deadline = time.perf_counter() + spin
    while not conn.poll():
        if time.perf_counter() > deadline:
            conn.poll(None)
            return


@functools.cache
def _layout(config: GPTConfig) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """``(name, start, stop, shape)`` of every field in :func:`flatten`'s vector."""
    out, offset = [], 0
    for name, shape in field_shapes(config).items():
        size = math.prod(shape)
        out.append((name, offset, offset + size, tuple(shape)))
        offset += size
    return tuple(out)


def flatten(params: Params) -> np.ndarray:
    """The fields of NumPy ``params`` one after another as a 1-d array (spec order)."""
    return np.concatenate([np.reshape(getattr(params, name), (-1,)) for name in FIELDS])


def unflatten(flat: np.ndarray, config: GPTConfig) -> Params:
    """The inverse of :func:`flatten`: ``Params`` whose fields are views of ``flat``."""
    fields = {
        name: np.reshape(flat[start:stop], shape) for name, start, stop, shape in _layout(config)
    }
    return Params.trusted(config, fields)


class _Worker:
    """One forked process with shared buffers for the weights (``floats`` float64s), its
    rows' ids (``ids`` int64s) and its results (``floats + 1`` float64s)."""

    def __init__(self, floats: int, ids: int) -> None:
        self.floats, self.ids = floats, ids
        self.weights = mmap.mmap(-1, 8 * floats)
        self.rows = mmap.mmap(-1, 8 * ids)
        self.out = mmap.mmap(-1, 8 * (floats + 1))
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve,
            args=(child, self.weights, self.rows, self.out),
            daemon=True,
            name="microgpt_xp-worker",
        )
        self.proc.start()
        child.close()

    def submit(
        self,
        flat: np.ndarray,
        tokens: np.ndarray,
        lengths: np.ndarray,
        reduction: str,
        config: GPTConfig,
    ) -> None:
        """Start the loss and gradients of ``tokens (b, L)``/``lengths (b,)`` with the
        weights ``flat``."""
        n, (b, length) = flat.shape[0], tokens.shape
        np.frombuffer(self.weights, dtype=flat.dtype, count=n)[:] = flat
        ids = np.frombuffer(self.rows, dtype=np.int64, count=b * length + b)
        ids[: b * length] = np.reshape(tokens, (-1,))
        ids[b * length :] = lengths
        self.conn.send((config, flat.dtype.str, n, b, length, reduction))

    def result(self, config: GPTConfig, dtype: np.dtype) -> tuple[np.ndarray, Params]:
        """Wait for the submitted shard: ``(loss, grads)`` (copied out of shared memory)."""
        try:
            _wait(self.conn)
            error = self.conn.recv()
        except EOFError:
            self.proc.join(timeout=5)
            raise RuntimeError(
                f"a microgpt_xp worker process died (exit code {self.proc.exitcode})"
            ) from None
        if error is not None:
            raise error
        n = config.num_params
        out = np.frombuffer(self.out, dtype=dtype, count=n + 1).copy()
        return out[n], unflatten(out[:n], config)

    def close(self) -> None:
        """Stop the process (it also stops by itself when this process's end of the pipe
        closes)."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _serve(conn: Any, weights: mmap.mmap, rows: mmap.mmap, out: mmap.mmap) -> None:
    """A worker's loop: one shard per message until ``None`` or the pipe closes."""
    from threadpoolctl import threadpool_limits

    from .model import loss_and_grads

    threadpool_limits(limits=1, user_api="blas")  # one core per process
    while True:
        try:
            _wait(conn)
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        config, dtype, n, b, length, reduction = msg
        try:
            params = unflatten(np.frombuffer(weights, dtype=dtype, count=n), config)
            ids = np.frombuffer(rows, dtype=np.int64, count=b * length + b)
            tokens = np.reshape(ids[: b * length], (b, length))
            loss, grads = loss_and_grads(params, tokens, ids[b * length :], reduction=reduction)
            result = np.frombuffer(out, dtype=dtype, count=n + 1)
            result[:n] = flatten(grads)
            result[n] = loss
            conn.send(None)
        except BaseException as exc:
            try:
                conn.send(exc)
            except Exception:  # an exception that does not pickle
                conn.send(RuntimeError(f"in a microgpt_xp worker process: {exc!r}"))


def _pool(count: int, floats: int, ids: int) -> list[_Worker]:
    """``count`` workers whose buffers hold at least ``floats`` weights and ``ids`` ids
    (workers too small or no longer alive are replaced)."""
    for i, w in enumerate(_workers[:count]):
        if w.floats < floats or w.ids < ids or not w.proc.is_alive():
            w.close()
            _workers[i] = _Worker(max(floats, w.floats), max(ids, 2 * w.ids))
    while len(_workers) < count:
        _workers.append(_Worker(floats, max(ids, 4096)))
    return _workers[:count]


def worker_pids() -> list[int]:
    """Process ids of the live workers (for CPU accounting in the benchmark)."""
    return [w.proc.pid for w in _workers if w.proc.pid is not None and w.proc.is_alive()]


def run(
    params: Params,
    tokens: np.ndarray,
    lengths: np.ndarray,
    reduction: Reduction,
    bounds: Sequence[tuple[int, int]],
) -> list[tuple[Any, Params]]:
    """``loss_and_grads`` of each row range in ``bounds``: the first in this process,
    the others in worker processes, all at once. Returns ``[(loss, grads), ...]`` in the
    order of ``bounds``. A worker's error is raised here, after every shard is done."""
    from .model import loss_and_grads

    config = params.config
    flat = flatten(params)
    size = max(stop - start for start, stop in bounds) * (tokens.shape[1] + 1)
    with _lock:
        workers = _pool(len(bounds) - 1, flat.shape[0], size)
        for w, (start, stop) in zip(workers, bounds[1:], strict=True):
            w.submit(flat, tokens[start:stop], lengths[start:stop], reduction, config)
        first: tuple[Any, Params] | BaseException
        try:
            first = loss_and_grads(
                params,
                tokens[bounds[0][0] : bounds[0][1]],
                lengths[bounds[0][0] : bounds[0][1]],
                reduction=reduction,
            )
        except BaseException as exc:
            first = exc
        results: list[tuple[Any, Params] | BaseException] = [first]
        for w in workers:
            try:
                results.append(w.result(config, flat.dtype))
            except BaseException as exc:
                results.append(exc)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def shutdown() -> None:
    """Stop every worker process of this process."""
    with _lock:
        for w in _workers:
            w.close()
        _workers.clear()


def _forget_workers() -> None:
    """In a forked child: the parent's workers are not its children (and the lock may
    have been held by a thread that does not exist there), so it starts afresh."""
    global _lock, _workers
    _lock, _workers = threading.Lock(), []


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_workers)
