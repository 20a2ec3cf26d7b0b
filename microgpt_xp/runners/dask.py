"""Dask tasks as a runner (:class:`DaskTasks`, needs the ``dask`` extra): one task per chunk
of a batch, the weights one key of the graph, the chunks' results added by a tree fixed by the
chunk count, on the active scheduler (threads, or a cluster from ``cluster.connect``)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from .. import _xp
from .._errors import ArgumentValueError
from ..params import Params
from ._base import Combine, Runner, chunk_bounds, host_params, run_on, tree_sum


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
        # unhashed: a hashed key dropped by the last map may still be in release now
        return client.scatter(host, broadcast=True, hash=False)

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
        for i, (a, b) in enumerate(chunk_bounds(int(rows[0].shape[0]), self.chunk_size)):
            chunk = (r[a:b] for r in rows)
            keys.append(key := f"microgpt-chunk-{tag}-{i}")
            graph[key] = (_task, fn, params.backend, params.device, weights_key, *chunk, *args)
        if combine is None:
            return graph, keys
        counter = itertools.count()

        def add(x: str, y: str) -> str:
            graph[key := f"microgpt-sum-{tag}-{next(counter)}"] = (combine, x, y)
            return key

        return graph, [tree_sum(keys, add)]

    def map(
        self,
        fn: Callable[..., Any],
        params: Params,
        rows: Sequence[np.ndarray],
        *args: Any,
        combine: Combine | None = None,
    ) -> Any:
        try:
            import dask.array
            import dask.threaded
        except ImportError as exc:
            raise ImportError(f"this needs Dask: {_xp.entry('dask').install} ({exc})") from exc
        from ..cluster import computing

        graph, keys = self.graph(fn, params, rows, *args, combine=combine)
        with computing():
            results = (dask.base.get_scheduler() or dask.threaded.get)(graph, keys)
        return results[0] if combine is not None else list(results)

    def __repr__(self) -> str:
        return f"DaskTasks(chunk_size={self.chunk_size}, weights={self.weights!r})"
