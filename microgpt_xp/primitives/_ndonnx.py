"""ndonnx's overrides of :mod:`microgpt_xp.primitives`: the forms that export as fewer or
cheaper ONNX nodes than the generic code (measured: benchmarks/onnx_graphs.py)."""

from __future__ import annotations

from typing import Any

import ndonnx as ndx
import numpy as np
import spox.opset.ai.onnx.v21

#: ONNX's operators at ndonnx's opset (``Any``: most are re-exported from older opsets,
#: which mypy does not follow).
op: Any = spox.opset.ai.onnx.v21

# -- the forward and training graphs ------------------------------------------------------
# Plain ONNX operators through spox where ndonnx's generic forms cost at run time: a lookup
# is one ``Gather`` (not a one-hot product), heads one ``Reshape`` + ``Transpose`` (not
# slices and a concat), products and reductions without ndonnx's zero-size guards, the
# softmax one ``Softmax``. Values equal the generic code's to rounding (tests/test_primitives).


def _var(a: Any) -> Any:
    """The ``spox.Var`` of an ndonnx array."""
    return a.unwrap_spox()


def _ints(*values: int) -> Any:
    """A 1-d int64 constant (shapes, axes, permutations)."""
    return op.const(np.array(values, dtype=np.int64))


def positions(x: Any, axis: int = 1) -> Any:
    """``(n,)`` int64 ``0 .. n-1`` along ``axis``: one ``Range`` of ``x``'s dynamic size."""
    n = x.shape[axis]
    if isinstance(n, int):
        return ndx.arange(n, dtype=ndx.int64)
    axis %= x.ndim
    size = op.squeeze(op.shape(_var(x), start=axis, end=axis + 1), _ints(0))
    one = op.const(np.array(1, dtype=np.int64))
    return ndx.asarray(op.range(op.const(np.array(0, dtype=np.int64)), size, one))


def embed(ids: Any, table: Any) -> Any:
    """Rows of ``table (V, C)`` picked by ``ids (B, T)``: one ``Gather`` -> ``(B, T, C)``."""
    return ndx.asarray(op.gather(_var(table), _var(ids), axis=0))


def scatter_add_rows(ids: Any, values: Any, num_rows: int) -> Any:
    """``out[i] = Σ values[j] for ids[j] == i`` -> ``(num_rows, C)``: one ``ScatterND``
    adding ``values (N, C)`` into zeros."""
    zeros = op.const(np.zeros((num_rows, values.shape[-1]), dtype=values.dtype.unwrap_numpy()))
    rows = op.unsqueeze(_var(ids), _ints(-1))
    return ndx.asarray(op.scatter_nd(zeros, rows, _var(values), reduction="add"))


def split_heads(x: Any, n_head: int, head_dim: int) -> Any:
    """``(B, T, H·D)`` -> ``(B, H, T, D)``: one ``Reshape`` and one ``Transpose``."""
    heads = op.reshape(_var(x), _ints(0, 0, n_head, head_dim))
    return ndx.asarray(op.transpose(heads, perm=(0, 2, 1, 3)))


def merge_heads(y: Any, n_head: int) -> Any:
    """``(B, H, T, D)`` -> ``(B, T, H·D)``: one ``Transpose`` and one ``Reshape``."""
    merged = op.transpose(_var(y), perm=(0, 2, 1, 3))
    return ndx.asarray(op.reshape(merged, _ints(0, 0, -1)))


def attention(q: Any, k: Any, v: Any, bias: Any, head_dim: int) -> tuple[Any, Any]:
    """The generic attention (same cache) with the scores' softmax one ``Softmax`` node
    (``exp(-inf)`` is 0 there) and products without zero-size guards."""
    scale = float(head_dim) ** -0.5
    qs = q * scale
    scores = op.matmul(_var(qs), op.transpose(_var(k), perm=(0, 1, 3, 2)))
    if bias is not None:
        scores = op.add(scores, _var(bias))
    att = op.softmax(scores, axis=-1)
    return ndx.asarray(op.matmul(att, _var(v))), (qs, k, v, ndx.asarray(att), scale)


def sum_last(x: Any) -> Any:
    """``(…, n)`` -> ``(…, 1)``: one ``ReduceSum``."""
    return ndx.asarray(op.reduce_sum(_var(x), _ints(-1), keepdims=1))


def linear(x: Any, w: Any) -> Any:
    """``x @ w.T``: ``x (…, n_in)``, ``w (n_out, n_in)`` -> ``(…, n_out)``."""
    return ndx.asarray(op.matmul(_var(x), op.transpose(_var(w), perm=(1, 0))))


def linear_input_grad(dy: Any, w: Any) -> Any:
    """``dy @ w``: ``(…, n_out)`` -> ``(…, n_in)``."""
    return ndx.asarray(op.matmul(_var(dy), _var(w)))


def weight_grad(dy: Any, x: Any) -> Any:
    """``Σ dy ⊗ x`` over the leading positions: leading axes flattened (``Flatten``), one
    product ``dy2.T @ x2`` -> ``(n_out, n_in)``."""
    dy2, x2 = (op.flatten(_var(a), axis=a.ndim - 1) for a in (dy, x))
    return ndx.asarray(op.matmul(op.transpose(dy2, perm=(1, 0)), x2))


def relu(x: Any) -> tuple[Any, Any]:
    """One ``Relu``, the output as cache."""
    y = ndx.asarray(op.relu(_var(x)))
    return y, y


def relu_backward(dy: Any, y: Any) -> Any:
    """``dy`` where the output is positive, else 0 (the derivative at 0 is 0)."""
    zero = op.const(np.zeros((), dtype=dy.dtype.unwrap_numpy()))
    return ndx.asarray(op.where(op.greater(_var(y), zero), _var(dy), zero))


def cross_entropy(logits: Any, targets: Any, valid: Any) -> tuple[Any, Any]:
    """``-log_softmax(logits)[target]`` by one ``LogSoftmax`` and one ``GatherElements``
    (0 where ``valid`` is 0); the cache ``(logp, targets)``."""
    logp = op.log_softmax(_var(logits), axis=-1)
    picked = op.gather_elements(logp, op.unsqueeze(_var(targets), _ints(-1)), axis=-1)
    losses = op.neg(op.squeeze(picked, _ints(-1)))
    if valid is not None:
        zero = op.const(np.zeros((), dtype=logits.dtype.unwrap_numpy()))
        losses = op.where(op.equal(_var(valid), op.cast_like(zero, _var(valid))), zero, losses)
    return ndx.asarray(losses), (logp, _var(targets), logits.shape[-1])


def cross_entropy_backward(dlosses: Any, cache: Any) -> Any:
    """``dlosses (…)`` -> ``dlogits (…, V) = (exp(logp) − onehot(target)) * dlosses``."""
    logp, targets, vocab = cache
    p = op.exp(logp)
    classes = op.const(np.arange(vocab, dtype=np.int64))
    onehot = op.cast_like(op.equal(op.unsqueeze(targets, _ints(-1)), classes), p)
    return ndx.asarray(op.mul(op.sub(p, onehot), op.unsqueeze(_var(dlosses), _ints(-1))))


# -- decoding (the decode and generate graphs) --------------------------------------------
