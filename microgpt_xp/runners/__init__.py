"""How a batch's rows are spread over workers: one interface (:class:`Runner`, whose ``map``
every driver calls) run here (:class:`Local`), in worker processes (:class:`Processes`) or as
Dask tasks (:class:`DaskTasks`); results in row order or added by :func:`tree_sum`."""

from .. import _xp
from .._errors import ArgumentTypeError, ArgumentValueError
from ._base import Combine, Local, Runner, chunk_bounds, host_params, run_on, shard_bounds, tree_sum
from .dask import DaskTasks
from .processes import Processes, WorkerDied, check_workers


def pick(
    runner: Runner | None,
    backend: str,
    *,
    workers: int | None = None,
    chunk_size: int | None = None,
    jit: bool | None = None,
) -> Runner:
    """The runner of a call: ``runner`` itself; else ``workers=N`` (:class:`Processes`);
    else, for a chunked ``backend`` (``"dask"``), :class:`DaskTasks` of ``chunk_size``
    rows; else :class:`Local` with ``jit``. Mixing ``runner`` with those, or
    ``chunk_size`` without Dask, is a ``ValueError``. Place the weights with
    :meth:`Runner.place`."""
    check_workers(workers)
    chunked = _xp.entry(backend).chunked
    if runner is not None:
        if not isinstance(runner, Runner):
            raise ArgumentTypeError(
                "runner", f"runner must be a Runner, got {type(runner).__name__}"
            )
        given = [n for n, v in (("workers", workers), ("chunk_size", chunk_size)) if v is not None]
        if given or chunked:
            raise ArgumentValueError(
                "runner",
                f"runner={runner!r} says how the batch is spread; "
                f"{' and '.join(given) or f'backend={backend!r}'} cannot be given with it",
            )
        return runner
    if chunked:
        if workers not in (None, 1):
            raise ArgumentValueError(
                "workers",
                f"workers={workers} shares a batch over processes; backend {backend!r} "
                "spreads it over Dask tasks (give one of the two)",
            )
        return DaskTasks(chunk_size=chunk_size)
    if chunk_size is not None:
        raise ArgumentValueError(
            "chunk_size", "chunk size is the rows of a Dask task: it needs backend='dask'"
        )
    if workers not in (None, 1):
        return Processes(workers)  # type: ignore[arg-type]
    return Local(jit)


# fmt: off
__all__ = [
    "Combine", "DaskTasks", "Local", "Processes", "Runner", "WorkerDied", "chunk_bounds",
    "host_params", "pick", "run_on", "shard_bounds", "tree_sum",
]
# fmt: on
