"""The runner interface, the local runner and the helpers every runner shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _xp
from .._errors import ArgumentTypeError
from ..params import Params

Combine = Callable[[Any, Any], Any]


class Runner:
    """Runs a function over the row shards of a batch; subclasses say how."""

    jit: bool | None = False

    def place(self, params: Params) -> Params:
        """``params`` where this runner's tasks run them (Dask-array weights: on their
        chunks' namespace; others unchanged)."""
        return params

    def map(
        self,
        fn: Callable[..., Any],
        params: Params,
        rows: Sequence[np.ndarray],
        *args: Any,
        combine: Combine | None = None,
    ) -> Any:
        """``fn(params, *shard_rows, *args)`` for each shard of the host arrays ``rows``
        (split alike along their first axis), on ``params``' backend and device. Returns
        the results in shard order, or, with ``combine``, their :func:`tree_sum`. ``fn``
        must be a module-level function (it may be pickled by name)."""
        result = fn(params, *rows, *args)
        return result if combine is not None else [result]

    def close(self) -> None:
        """Release what the runner started (worker processes); reusable until then."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Local(Runner):
    """The whole batch in the calling process, on the arrays' own namespace. ``jit``:
    ``None`` compiles where the namespace has a compiler (JAX), ``False`` never, ``True``
    always (``ValueError`` elsewhere)."""

    def __init__(self, jit: bool | None = None) -> None:
        self.jit = _xp.check_jit(jit)

    def __repr__(self) -> str:
        return f"Local(jit={self.jit})"


def shard_bounds(rows: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous ``(start, stop)`` row ranges of near-equal size covering
    ``0..rows`` (empty ranges dropped)."""
    bounds = [(i * rows // shards, (i + 1) * rows // shards) for i in range(shards)]
    return [(a, b) for a, b in bounds if b > a]


def chunk_bounds(rows: int, chunk_size: int | None) -> list[tuple[int, int]]:
    """Row ranges ``(start, stop)`` of ``chunk_size`` rows (the last may be shorter);
    ``None``: one chunk."""
    size = rows if chunk_size is None else chunk_size
    return [(s, min(s + size, rows)) for s in range(0, rows, size)]


def tree_sum(values: Sequence[Any], add: Combine) -> Any:
    """``values`` added pairwise, neighbours first (``((v0 + v1) + (v2 + v3)) + v4``): the
    order depends on their count only, never on which value was computed first."""
    level = list(values)
    while len(level) > 1:
        sums = [add(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = sums + level[2 * len(sums) :]
    return level[0]


def host_params(params: Params) -> Params:
    """``params`` as NumPy arrays on this host (what travels to workers)."""
    if not isinstance(params, Params):
        raise ArgumentTypeError("params", f"params must be a Params, got {type(params).__name__}")
    return params if params.backend == "numpy" else params.to("numpy")


def run_on(
    fn: Callable[..., Any], backend: str, device: Any, host: Params, *rows_and_args: Any
) -> Any:
    """In a worker: ``fn`` on the weights moved from the host to ``backend``/``device``."""
    params = host if backend == "numpy" and device is None else host.to(backend, device=device)
    return fn(params, *rows_and_args)
