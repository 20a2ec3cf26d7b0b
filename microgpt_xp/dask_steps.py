"""Dask as a driver: one task per chunk of a batch, running the model's own code.

A Dask array program of the model is a graph of a few dozen tasks per chunk per step;
building and scheduling that graph costs far more than the arithmetic at these sizes.
Here each chunk of a batch is instead **one task** that runs the model on the chunk's own
namespace (NumPy, or CuPy for GPU workers), and the chunks' results are combined by a
tree of additions whose shape is fixed by the chunk count, so the sums happen in the same
order whichever worker finishes first. The weights enter a step's graph once, as one
key that every chunk task depends on: each worker receives them once per step.

The graphs run on whatever Dask scheduler is active: threads by default, or a
``dask.distributed`` cluster after :func:`microgpt_xp.cluster.connect`.

Needs the ``dask`` extra.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import numpy as np

from . import _xp
from .model import Reduction, _loss_and_grads
from .params import Params, flatten, unflatten


def dask_modules() -> tuple[Any, Any]:
    """``(dask, dask.array)``, or ``ImportError`` saying what to install."""
    try:
        import dask
        import dask.array as da
    except ImportError as exc:
        raise ImportError(f"this needs Dask: {_xp.entry('dask').install} ({exc})") from exc
    return dask, da


def chunk_bounds(rows: int, chunk_size: int | None) -> list[tuple[int, int]]:
    """Row ranges ``(start, stop)`` of ``chunk_size`` rows (the last may be shorter);
    ``None``: one chunk."""
    size = rows if chunk_size is None else chunk_size
    return [(s, min(s + size, rows)) for s in range(0, rows, size)]


Weights = Literal["graph", "scatter"]


def check_chunk_size(chunk_size: Any) -> int:
    """``chunk_size`` if it is a positive int, else ``ValueError``."""
    return _xp.check_positive_int(chunk_size, "chunk size")


def host_params(params: Params) -> Params:
    """``params`` as NumPy arrays on this host (what a graph carries to its tasks)."""
    if not isinstance(params, Params):
        raise TypeError(f"params must be a Params, got {type(params).__name__}")
    return params if params.backend == "numpy" else params.to("numpy")


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


def on_backend(host: Params, backend: str, device: Any) -> Params:
    """The host weights on a chunk task's ``backend``/``device``."""
    return host if backend == "numpy" and device is None else host.to(backend, device=device)


def check_chunk_backend(backend: str) -> str:
    """``backend`` if it can run a chunk's task (an eager backend), else ``ValueError``."""
    _xp.check_backend(backend)
    if backend == "dask":
        raise ValueError("chunk_backend is where each task runs the model: an eager backend")
    return backend


def tree_sum(keys: list[Any], add: Any, prefix: str) -> tuple[dict[Any, Any], Any]:
    """The tasks that add up the values of ``keys`` pairwise, neighbours first
    (``((k0 + k1) + (k2 + k3)) + k4``): a tree of fixed shape, so the additions happen in
    the same order whatever finishes first. Returns ``(tasks, root key)``."""
    tasks: dict[Any, Any] = {}
    level, depth = list(keys), 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            key = f"{prefix}-{depth}-{i // 2}"
            tasks[key] = (add, level[i], level[i + 1])
            nxt.append(key)
        if len(level) % 2:
            nxt.append(level[-1])
        level, depth = nxt, depth + 1
    return tasks, level[0]


def _chunk_loss_and_grads(
    params: Params, tokens: np.ndarray, lengths: np.ndarray, reduction: Reduction, weight: float
) -> tuple[Any, Any]:
    """One chunk's task: ``weight`` times its loss and its flat gradient, computed on the
    weights' namespace (the batch rows come from the host)."""
    tok = _xp.asarray(tokens, params.backend, device=params.device)
    lens = _xp.asarray(lengths, params.backend, device=params.device)
    loss, grads = _loss_and_grads(params, tok, lens, reduction)
    return weight * loss, weight * flatten(grads)


def _add_pair(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    return a[0] + b[0], a[1] + b[1]


class BlockwiseSteps:
    """The loss and gradients of training batches, one Dask task per chunk of
    ``chunk_size`` rows (``None``: one chunk), combined by :func:`tree_sum`.

    A chunk's loss and gradients are weighted by its share of the rows (``"mean"``) or of
    the predicted tokens (``"token_mean"``): the batch's values up to rounding, and the
    same bits from run to run and on any placement of the tasks.
    """

    def __init__(self, reduction: Reduction, chunk_size: int | None) -> None:
        self.reduction, self.chunk_size = reduction, chunk_size

    def graph(
        self, params: Params, tokens: np.ndarray, lengths: np.ndarray
    ) -> tuple[dict[Any, Any], Any]:
        """The step's task graph and the key of its ``(loss, flat gradient)`` result:
        one key holding the weights, one task per chunk and ``chunks - 1`` additions."""
        tag = uuid.uuid4().hex
        weights_key = f"microgpt-weights-{tag}"
        graph: dict[Any, Any] = {weights_key: params}
        bounds = chunk_bounds(int(tokens.shape[0]), self.chunk_size)
        n = np.minimum(lengths - 1, params.config.block_size)
        keys = []
        for i, (a, b) in enumerate(bounds):
            if self.reduction == "mean":
                weight = (b - a) / len(lengths)
            else:
                weight = float(n[a:b].sum() / n.sum())
            key = f"microgpt-chunk-{tag}-{i}"
            graph[key] = (
                _chunk_loss_and_grads,
                weights_key,
                tokens[a:b],
                lengths[a:b],
                self.reduction,
                weight,
            )
            keys.append(key)
        tasks, root = tree_sum(keys, _add_pair, f"microgpt-sum-{tag}")
        graph.update(tasks)
        return graph, root

    def loss_and_grads(
        self, params: Params, tokens: np.ndarray, lengths: np.ndarray
    ) -> tuple[Any, Params]:
        """Compute one step's ``(loss, grads)`` on the active Dask scheduler; both come back
        in the weights' namespace (``params``, in this process)."""
        dask, _ = dask_modules()
        from .cluster import computing

        graph, root = self.graph(params, tokens, lengths)
        get = dask.base.get_scheduler()
        if get is None:
            get = dask.threaded.get
        with computing():
            loss, flat = get(graph, root)
        return loss, unflatten(flat, params.config)
