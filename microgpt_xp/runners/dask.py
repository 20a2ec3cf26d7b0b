"""Dask tasks as a runner: :class:`DaskTasks`, one task per chunk of a batch, running the
drivers' own functions.

A Dask array program of the model is a graph of a few dozen tasks per chunk per step;
building and scheduling that graph costs far more than the arithmetic at these sizes.
Here each chunk of a batch is instead **one task** that runs the model on the weights'
namespace (NumPy, or CuPy for GPU workers, or any other), and the chunks' results are
combined by a tree of additions whose shape is fixed by the chunk count
(:func:`~microgpt_xp.runners.tree_pairs`), so the sums happen in the same order whichever
worker finishes first. The weights enter a graph once, as one key that every chunk task
depends on (or one scattered future): each worker receives them once per computation.

The graphs run on whatever Dask scheduler is active: threads by default, or a
``dask.distributed`` cluster after :func:`microgpt_xp.cluster.connect`.

Needs the ``dask`` extra.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from .. import _xp
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


Weights = Literal["graph", "scatter"]


def check_chunk_size(chunk_size: Any) -> int:
    """``chunk_size`` if it is a positive int, else ``ValueError``."""
    return _xp.check_positive_int(chunk_size, "chunk size")


def spec_array(payload: list[tuple[int, int, Any]], name: str) -> Any:
    """A 1-d object Dask array with one chunk (one key) per entry of ``payload``; the block
    of chunk ``k`` is a length-1 object array holding ``payload[k]``."""
    _, da = dask_modules()
    from dask.highlevelgraph import HighLevelGraph

    layer: dict[Any, Any] = {}
    for k, item in enumerate(payload):
        block = np.empty(1, dtype=object)
        block[0] = item
        layer[(name, k)] = block
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return da.Array(graph, name, chunks=((1,) * len(payload),), meta=np.empty((0,), dtype=object))


def weights_node(host: Params, weights: Weights, client: Any) -> Any:
    """The weights ``host`` as one dependency of every chunk task: one key of the graph
    (``"graph"``, computed on one worker and fetched once by each other that needs it) or
    a future of ``client.scatter(..., broadcast=True)`` (``"scatter"``)."""
    dask, _ = dask_modules()
    if weights == "graph":
        return dask.delayed(host, pure=True, traverse=False)
    if weights == "scatter":
        if client is None:
            from distributed import get_client

            try:
                client = get_client()
            except ValueError as exc:
                raise ValueError(
                    "weights='scatter' needs a distributed client (microgpt_xp.cluster.connect)"
                ) from exc
        return client.scatter(host, broadcast=True, hash=True)
    raise ValueError(f"weights must be 'graph' or 'scatter', got {weights!r}")


def imports_settled() -> None:
    """Wait for any import of ``dask.array`` that another thread of this process has begun.

    A fresh worker imports ``dask.array`` on its own threads (to unpickle the reduction
    tasks) while the first chunk runs; ``array_api_compat``'s ``is_dask_array`` (reached
    through :func:`microgpt_xp._xp.backend_of`) looks the module up in ``sys.modules`` and
    fails on a half-imported one. An ``import`` statement blocks until that import is done.
    """
    import dask.array  # noqa: F401


def check_chunk_backend(backend: str) -> str:
    """``backend`` if it can run a chunk's task (not a chunked one), else ``ValueError``."""
    if _xp.entry(backend).chunked:
        raise ValueError("chunk_backend is where each task runs the model: an eager backend")
    return backend


def _task(fn: Callable[..., Any], backend: str, device: Any, host: Params, *rest: Any) -> Any:
    """One chunk's task: :func:`~microgpt_xp.runners.run_on`, once this worker's imports
    have settled."""
    imports_settled()
    return run_on(fn, backend, device, host, *rest)


class DaskTasks(Runner):
    """A runner of one Dask task per chunk of ``chunk_size`` rows (``None``: one chunk),
    on the active Dask scheduler (threads, or a cluster after
    :func:`microgpt_xp.cluster.connect`). ``weights``: ``"graph"`` (one key of each
    graph) or ``"scatter"`` (``client.scatter(..., broadcast=True)``; ``client``: the
    active distributed client by default)."""

    def __init__(
        self, chunk_size: int | None = None, *, weights: Weights = "graph", client: Any = None
    ) -> None:
        if chunk_size is not None:
            check_chunk_size(chunk_size)
        if weights not in ("graph", "scatter"):
            raise ValueError(f"weights must be 'graph' or 'scatter', got {weights!r}")
        self.chunk_size, self.weights, self.client = chunk_size, weights, client

    def bounds(self, rows: int) -> list[tuple[int, int]]:
        return chunk_bounds(rows, self.chunk_size)

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
        host = host_params(params)
        # one key holds the weights: the record itself, or the future of a scatter
        weights = host if self.weights == "graph" else weights_node(host, "scatter", self.client)
        graph: dict[Any, Any] = {weights_key: weights}
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
            nxt = []
            for i, j in pairs:
                key = f"microgpt-sum-{tag}-{depth}-{i // 2}"
                graph[key] = (combine, level[i], level[j])
                nxt.append(key)
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
