"""Overrides for ndonnx's lazy arrays (what :func:`~microgpt_xp.export_onnx` traces):
each primitive one plain ONNX operator (or two) through spox where ndonnx's generic forms
cost, with the batch and the time left dynamic (``benchmarks/onnx_graphs.py`` measures).

| primitive | generic on ndonnx | here |
|---|---|---|
| ``embed`` | one-hot ``(B, T, V)`` product (B, T unknown) | ``Gather(table, ids, axis=0)``: ``(B, T)`` ids give ``(B, T, C)`` |
| ``split_heads`` | ``H`` slices + ``stack`` | ``Reshape [0, 0, H, D]`` + ``Transpose (0, 2, 1, 3)`` |
| ``merge_heads`` | ``H`` slices + ``concat`` | ``Transpose (0, 2, 1, 3)`` + ``Reshape [0, 0, -1]`` |
| ``scatter_add_rows`` | one-hot ``(V, N)`` product | ``ScatterND(zeros, ids[:, None], values, reduction="add")`` |
| ``positions`` (unknown n) | ``cumulative_sum`` of ones | ``Range(0, Shape(x)[axis], 1)`` |
| ``relu`` | ``x * (x > 0)`` | ``Relu(x)`` (the mask for the backward as before) |
| ``weight_grad`` (unknown dims) | reshape needs ``n_out`` | ``Einsum`` over the leading axes |

ONNX ``Reshape``'s ``0`` (copy the input's dimension) is what the standard's ``reshape``
cannot say with unknown dimensions, and ndonnx builds its ``Reshape`` with
``allowzero=1``: hence ops through spox rather than ``ndonnx.reshape``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any


def _ops() -> Any:
    import spox.opset.ai.onnx.v21 as op

    return op


def _var(a: Array) -> Any:
    return a.unwrap_spox()


def _arr(v: Any) -> Array:
    import ndonnx

    return ndonnx.asarray(v)


def _i64(values: list[int]) -> Any:
    return _ops().const(np.asarray(values, dtype=np.int64))


def embed(ids: Array, table: Array) -> Array:
    return _arr(_ops().gather(_var(table), _var(ids), axis=0))


def split_heads(x: Array, n_head: int, head_dim: int) -> Array:
    op = _ops()
    r = op.reshape(_var(x), _i64([0, 0, n_head, head_dim]))
    return _arr(op.transpose(r, perm=[0, 2, 1, 3]))


def merge_heads(y: Array, n_head: int) -> Array:
    op = _ops()
    t = op.transpose(_var(y), perm=[0, 2, 1, 3])
    return _arr(op.reshape(t, _i64([0, 0, -1])))


def scatter_add_rows(ids: Array, values: Array, num_rows: int) -> Array:
    op = _ops()
    v = _var(values)
    zero = op.const(np.zeros((), dtype=values.dtype.unwrap_numpy()))
    shape = op.concat([_i64([num_rows]), op.shape(v, start=1)], axis=0)
    index = op.unsqueeze(_var(ids), _i64([1]))
    return _arr(op.scatter_nd(op.expand(zero, shape), index, v, reduction="add"))


def positions(x: Array, axis: int = 1) -> Array:
    n = x.shape[axis]
    if isinstance(n, int):
        import ndonnx

        return ndonnx.arange(n, dtype=ndonnx.int64)
    op = _ops()
    size = op.squeeze(op.shape(_var(x), start=axis % x.ndim, end=axis % x.ndim + 1), _i64([0]))
    zero, one = op.const(np.int64(0)), op.const(np.int64(1))
    return _arr(op.range(zero, size, one))


def relu(x: Array) -> tuple[Array, Any]:
    import ndonnx

    mask = ndonnx.astype(x > 0, x.dtype)
    return _arr(_ops().relu(_var(x))), mask


def weight_grad(dy: Array, x: Array) -> Array:
    import ndonnx

    lead = list(range(dy.ndim - 1))
    return ndonnx.tensordot(dy, x, axes=(lead, lead))
