"""How a batch's rows are spread over workers: one interface, three implementations.

A :class:`Runner` splits the rows of a host batch into shards, runs one function on each
shard — here (:class:`Local`), over worker processes (:class:`Processes`) or as Dask tasks
(:class:`DaskTasks`, on threads or a ``dask.distributed`` cluster) — and gives the results
back in row order, or combined by a fixed-shape tree of additions (:func:`tree_sum`) so
that the sums happen in the same order whoever finishes first. Training, scoring and
generation all use it; *where the arrays live* (the ``backend``) is a separate choice: a
shard's task moves the weights and its rows to the run's backend and device.

This package knows nothing of the model: the functions it runs are the drivers'.
"""

from typing import Any

from .. import _xp
from ._base import (
    Combine,
    Local,
    Runner,
    chunk_bounds,
    host_params,
    run_on,
    shard_bounds,
    tree_pairs,
    tree_sum,
)
from .dask import DaskTasks
from .processes import Processes, WorkerDied, check_workers


def resolve(
    runner: Runner | None,
    backend: str,
    *,
    workers: int | None = None,
    chunk_size: int | None = None,
    jit: bool | None = None,
    like: Any = None,
) -> tuple[Runner, str]:
    """The runner of a call and the backend its weights live on, from the call's
    arguments: ``runner`` itself; else the spellings that predate runners —
    ``workers=N`` (:class:`Processes`), and a chunked backend as ``backend=`` (``"dask"``:
    :class:`DaskTasks` of ``chunk_size`` rows, the weights on the chunks' backend — that
    of ``like``'s chunks, a Dask array of weights, else NumPy); else :class:`Local` with
    ``jit``. Mixing ``runner`` with those spellings, or
    ``chunk_size`` without Dask tasks, is a ``ValueError``."""
    check_workers(workers)
    spec = _xp.entry(backend)
    if runner is not None:
        if not isinstance(runner, Runner):
            raise TypeError(f"runner must be a Runner, got {type(runner).__name__}")
        given = [n for n, v in (("workers", workers), ("chunk_size", chunk_size)) if v is not None]
        if given or spec.chunked:
            raise ValueError(
                f"runner={runner!r} says how the batch is spread; "
                f"{' and '.join(given) or f'backend={backend!r}'} cannot be given with it"
            )
        return runner, backend
    if spec.chunked:
        if workers not in (None, 1):
            raise ValueError(
                f"workers={workers} shares a batch over processes; backend {backend!r} "
                "spreads it over Dask tasks (give one of the two)"
            )
        assert spec.chunk_meta is not None
        chunks = "numpy" if like is None else _xp.backend_of(spec.chunk_meta(like))
        return DaskTasks(chunk_size=chunk_size), chunks
    if chunk_size is not None:
        raise ValueError("chunk size is the rows of a Dask task: it needs backend='dask'")
    if workers not in (None, 1):
        return Processes(workers), backend  # type: ignore[arg-type]
    return Local(jit), backend


__all__ = [
    "Combine",
    "DaskTasks",
    "Local",
    "Processes",
    "Runner",
    "WorkerDied",
    "chunk_bounds",
    "host_params",
    "resolve",
    "run_on",
    "shard_bounds",
    "tree_pairs",
    "tree_sum",
]
