"""Dask tasks as a runner: :class:`DaskTasks`, one task per chunk of a batch, running the
drivers' own functions on the weights' namespace (NumPy, CuPy on GPU workers, ...).

A Dask array program of the model is a few dozen tasks per chunk per step, whose
scheduling costs more than the arithmetic at these sizes; here a chunk is one task, the
weights enter each graph once (one key, or one scattered future), and the chunks'
results are added by a tree whose shape is fixed by the chunk count
(:func:`~microgpt_xp.runners.tree_pairs`), so the sums do not depend on which worker
finishes first. The graphs run on the active Dask scheduler: threads, or a
``dask.distributed`` cluster after :func:`microgpt_xp.cluster.connect`. Needs the
``dask`` extra.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from .. import _xp
from .._errors import ArgumentValueError
from ..params import Params
from ._base import Combine, Runner, chunk_bounds, host_params, run_on, tree_pairs


def dask_modules() -> tuple[Any, Any]:
    """``(dask, dask.array)``, or ``ImportError`` saying what to install."""
    try:
        import dask
        import dask.array as da
    except ImportError as exc:
        raise ImportError(f"this needs Dask: {_xp.entry('dask').install} ({exc})") from exc
    return dask, da


def _task(fn: Callable[..., Any], backend: str, device: Any, host: Params, *rest: Any) -> Any:
    """One chunk's task: :func:`~microgpt_xp.runners.run_on`, once any import of
    ``dask.array`` begun by another thread of this worker has finished (a half-imported
    module makes ``array_api_compat``'s ``is_dask_array`` fail)."""
    import dask.array  # noqa: F401

    return run_on(fn, backend, device, host, *rest)


class DaskTasks(Runner):
    """A runner of one Dask task per chunk of ``chunk_size`` rows (``None``: one chunk),
    on the active Dask scheduler. ``weights``: ``"graph"`` (one key of each graph) or
    ``"scatter"`` (``client.scatter(..., broadcast=True)``; ``client``: the active
    distributed client by default)."""

    def __init__(
        self,
        chunk_size: int | None = None,
        *,
        weights: Literal["graph", "scatter"] = "graph",
        client: Any = None,
    ) -> None:
        if chunk_size is not None:
            _xp.check_positive_int(chunk_size, "chunk_size", most=_xp.NATIVE_INT_MAX)
        if weights not in ("graph", "scatter"):
            raise ArgumentValueError(
                "weights", f"weights must be 'graph' or 'scatter', got {weights!r}"
            )
        self.chunk_size, self.weights, self.client = chunk_size, weights, client

    def bounds(self, rows: int) -> list[tuple[int, int]]:
        return chunk_bounds(rows, self.chunk_size)

    def place(self, params: Params) -> Params:
        meta = _xp.entry(params.backend).chunk_meta
        return params if meta is None else params.to(_xp.backend_of(meta(params.wte)))

    def _weights(self, host: Params) -> Any:
        if self.weights == "graph":
            return host
        client = self.client
        if client is None:
            from distributed import get_client

            try:
                client = get_client()
            except ValueError as exc:
                raise ArgumentValueError(
                    "weights",
                    "weights='scatter' needs a distributed client (microgpt_xp.cluster.connect)",
                ) from exc
        return client.scatter(host, broadcast=True, hash=False)  # a hashed key dropped by
        # the last map may still be in release when the same weights come again

    def graph(
        self,
        fn: Callable[..., Any],
        params: Params,
        rows: Sequence[np.ndarray],
        *args: Any,
        combine: Combine | None = None,
    ) -> tuple[dict[Any, Any], list[Any]]:
        """The task graph of :meth:`map` and the keys of its results: one key holding the
        weights (as NumPy arrays), one task per chunk and, with ``combine``, the
        ``chunks - 1`` additions of the tree (one result key)."""
        tag = uuid.uuid4().hex
        weights_key = f"microgpt-weights-{tag}"
        graph: dict[Any, Any] = {weights_key: self._weights(host_params(params))}
        keys = []
        for i, (a, b) in enumerate(self.bounds(int(rows[0].shape[0]))):
            key = f"microgpt-chunk-{tag}-{i}"
            chunk = (r[a:b] for r in rows)
            graph[key] = (_task, fn, params.backend, params.device, weights_key, *chunk, *args)
            keys.append(key)
        if combine is None:
            return graph, keys
        level = keys
        for depth, pairs in enumerate(tree_pairs(len(keys))):
            odd = [level[-1]] if len(level) % 2 else []
            nxt = [f"microgpt-sum-{tag}-{depth}-{i // 2}" for i, _ in pairs]
            graph.update(
                {k: (combine, level[i], level[j]) for k, (i, j) in zip(nxt, pairs, strict=True)}
            )
            level = nxt + odd
        return graph, level

    def map(
        self,
        fn: Callable[..., Any],
        params: Params,
        rows: Sequence[np.ndarray],
        *args: Any,
        combine: Combine | None = None,
    ) -> Any:
        dask, _ = dask_modules()
        from ..cluster import computing

        graph, keys = self.graph(fn, params, rows, *args, combine=combine)
        get = dask.base.get_scheduler() or dask.threaded.get
        with computing():
            results = get(graph, keys)
        return results[0] if combine is not None else list(results)

    def __repr__(self) -> str:
        return f"DaskTasks(chunk_size={self.chunk_size}, weights={self.weights!r})"
