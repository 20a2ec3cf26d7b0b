"""ndonnx's overrides of :mod:`microgpt_xp.primitives`: the forms that export as fewer or
cheaper ONNX nodes than the generic code (measured: benchmarks/onnx_graphs.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

import ndonnx as ndx
import numpy as np
import spox.opset.ai.onnx.v21

from . import _generic

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


def sum_first(x: Any) -> Any:
    """``(n, …)`` -> ``(1, …)`` of a float ``x``: ones ``(1, n)`` times ``x`` as ``(n, -1)``
    (one ``MatMul``), where onnxruntime's ``ReduceSum`` over the leading axis took 5-9x as
    long (``(P, 4, 4, 10000)``, ``P`` 4 to 16). Sizes known at export are constants: no
    shape read where ``n`` is, no reshape for a matrix."""
    if not ndx.isdtype(x.dtype, "real floating"):
        return _generic.sum_first.__wrapped__(x)  # type: ignore[attr-defined]
    v, n, rest = _var(x), x.shape[0], x.shape[1:]
    one = np.ones(1, dtype=x.dtype.unwrap_numpy())
    if isinstance(n, int):
        ones = op.const(np.ones((1, n), dtype=one.dtype))
    else:
        ones = op.constant_of_shape(op.concat([_ints(1), op.shape(v, end=1)], axis=0), value=one)
    if x.ndim == 2:
        return ndx.asarray(op.matmul(ones, v))
    total = op.matmul(ones, op.reshape(v, _ints(0, -1)))
    if sum(d is None for d in rest) <= 1:  # -1 for the one unknown size
        shape = _ints(1, *(-1 if d is None else d for d in rest))
    else:
        shape = op.concat([_ints(1), op.shape(v, start=1)], axis=0)
    return ndx.asarray(op.reshape(total, shape, allowzero=1))  # a 0 in it is a size


def rsqrt(x: Any) -> Any:
    """``1 / sqrt(x)``: ``Sqrt`` then ``Reciprocal``, where onnxruntime's ``Pow`` by -0.5 took
    5-9x as long (10,000 values: 46 us against 5); the values within an ulp of ``Pow``'s
    and of NumPy's."""
    return ndx.asarray(op.reciprocal(op.sqrt(_var(x))))


def scale_rows(x: Any, s: Any) -> Any:
    """One ``Mul`` by ``s`` widened to ``x``'s rows by a ``MatMul`` with ones ``(1, n)``
    (``n`` known; else the generic form), where onnxruntime's broadcast of a length-1 last
    axis took twice as long: ``(32, 16, 16)`` by ``(32, 16, 1)`` 10 us more."""
    n = x.shape[-1]
    if not isinstance(n, int):
        return _generic.scale_rows.__wrapped__(x, s)  # type: ignore[attr-defined]
    ones = op.const(np.ones((1, n), dtype=x.dtype.unwrap_numpy()))
    wide = op.matmul(op.unsqueeze(_var(s), _ints(-1)), ones)
    return ndx.asarray(op.mul(_var(x), wide))


def max_first(x: Any) -> Any:
    """``(n, …)`` -> ``(1, …)``: ``n`` known, the ``Max`` of its ``n`` rows (one ``Split``),
    where onnxruntime's ``ReduceMax`` over the leading axis took 1.3-3.4x as long (``(27,
    10000)``); else the generic form."""
    n = x.shape[0]
    if not isinstance(n, int) or n < 2:
        return _generic.max_first.__wrapped__(x)  # type: ignore[attr-defined]
    rows = op.split(_var(x), axis=0, num_outputs=n)
    return ndx.asarray(op.max(rows))


def matmul(a: Any, b: Any) -> Any:
    """``a @ b``, one ``MatMul``: ndonnx's ``@`` wraps it in a zero-size guard, an ``If``
    whose output's shape is unknown at export, so every size after it was unknown too."""
    return ndx.asarray(op.matmul(_var(a), _var(b)))


def sum_last(x: Any) -> Any:
    """``(…, n)`` -> ``(…, 1)``: one ``ReduceSum``."""
    return ndx.asarray(op.reduce_sum(_var(x), _ints(-1), keepdims=1))


def linear(x: Any, w: Any) -> Any:
    """``x @ w.T``: ``x (…, n_in)``, ``w (n_out, n_in)`` -> ``(…, n_out)``."""
    return ndx.asarray(op.matmul(_var(x), op.transpose(_var(w), perm=(1, 0))))


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
    """``dy`` times ``y > 0`` (the derivative at 0 is 0), as the generic form: a ``Cast`` and
    a ``Mul``, where onnxruntime's broadcasting ``Where`` took 4x as long (measured)."""
    zero = op.const(np.zeros((), dtype=dy.dtype.unwrap_numpy()))
    return ndx.asarray(op.mul(_var(dy), op.cast_like(op.greater(_var(y), zero), _var(dy))))


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
    return scale_rows(ndx.asarray(op.sub(p, onehot)), dlosses)


def _head_masks(n_head: int, head_dim: int, dtype: Any, scale: float, x: Any) -> Any:
    """``(H, T, C)`` (``T``: axis 1 of ``x``): ``scale`` on head ``h``'s channels, else 0;
    ``(B, H, T, C)`` times it broadcasts over ``B`` only (measured in onnxruntime: ``(32, 1,
    16, 16) x (4, 1, 16)`` took 33 us, the copy per head and this product 15 us)."""
    heads = np.arange(n_head * head_dim) // head_dim == np.arange(n_head)[:, None]
    mask = op.const((heads * scale).astype(dtype)[:, None, :])
    return op.expand(mask, _dims(x, n_head, "T", n_head * head_dim))


def _per_head(x: Any, n_head: int) -> Any:
    """``(B, T, C)`` -> ``(B, H, T, C)``, ``H`` copies (one ``Concat``)."""
    x = op.unsqueeze(x, _ints(1))
    return op.concat([x] * n_head, axis=1)


def _dims(x: Any, *dims: Any) -> Any:
    """A shape for ``Reshape``: ints as they are, ``"B"``/``"T"`` the sizes of axes 0/1 of
    ``x`` (known at run time only)."""
    parts = [op.shape(x, start=0, end=1) if d == "B" else op.shape(x, start=1, end=2)
             if d == "T" else _ints(d) for d in dims]  # fmt: skip
    return op.concat(parts, axis=0)


#: The largest head size for which :func:`causal_attention` keeps the heads in the channels
#: (measured: 4 is 1.2x faster in the forward at B=1024 than per-head products, 32 is
#: 1.4x slower: it multiplies the scores' work by ``H``).
MASKED_HEAD_DIM = 8


class _MaskedHeads(NamedTuple):
    """:func:`causal_attention`'s cache: ``qh (B, H·T, C)``, ``k, v (B, T, C)``, ``att (B,
    H·T, T)``, the head masks ``scaled, ones (H, T, C)``."""

    n_head: int
    head_dim: int
    qh: Any
    k: Any
    v: Any
    att: Any
    scaled: Any
    ones: Any


def causal_attention(
    qkv: Any, n_head: int, head_dim: int, doc_positions: Any = None
) -> tuple[Any, Any]:
    """Packed rows (``doc_positions``) and heads of more than :data:`MASKED_HEAD_DIM`
    channels: the generic code (with this module's heads and attention). Smaller ones: the
    heads kept in the channels. The queries of every head are ``(B, H·T, C)`` rows (copied
    per head, then masked by ``(H, T, C)``: :func:`_head_masks`), zero outside their head's
    channels (and scaled), so that the scores of all heads are one product per sequence
    with ``k (B, T, C)``, and the output one product with ``v`` whose other heads' channels
    are masked off. No head is transposed out, and the products are ``B`` of ``(H·T, C)``
    matrices where per-head ones are ``B·H`` tiny ones (measured:
    benchmarks/onnx_graphs.py). Exact zeros are added, so the values are the generic
    code's to rounding. Cache: ``(qh, k, v, att)`` and the masks."""
    if doc_positions is not None or head_dim > MASKED_HEAD_DIM:
        generic: Any = _generic.causal_attention.__wrapped__  # type: ignore[attr-defined]
        return generic(qkv, n_head, head_dim, doc_positions)  # type: ignore[no-any-return]
    c = n_head * head_dim
    dtype = qkv.dtype.unwrap_numpy()
    x = _var(qkv)
    q, k, v = op.split(x, axis=-1, num_outputs=3)
    scaled = _head_masks(n_head, head_dim, dtype, float(head_dim) ** -0.5, x)
    qh = op.reshape(op.mul(_per_head(q, n_head), scaled), _ints(0, -1, c))  # (B, H·T, C)
    scores = op.reshape(
        op.matmul(qh, op.transpose(k, perm=(0, 2, 1))), _dims(x, 0, n_head, "T", "T")
    )
    bias = _generic.causal_bias(positions(qkv[:1, :, 0]), qkv.dtype)  # (T, T)
    att = op.reshape(op.softmax(op.add(scores, _var(bias)), axis=-1), _dims(x, 0, -1, "T"))
    heads = op.reshape(op.matmul(att, v), _dims(x, 0, n_head, -1, c))  # (B, H, T, C)
    ones = _head_masks(n_head, head_dim, dtype, 1.0, x)
    y = op.reduce_sum(op.mul(heads, ones), _ints(1), keepdims=0)
    return ndx.asarray(y), _MaskedHeads(n_head, head_dim, qh, k, v, att, scaled, ones)


def causal_attention_backward(dy: Any, cache: Any) -> Any:
    """``dy (B, T, C)`` -> ``dqkv (B, T, 3C)`` of :func:`causal_attention` (its cache)."""
    if not isinstance(cache, _MaskedHeads):
        generic: Any = _generic.causal_attention_backward.__wrapped__  # type: ignore[attr-defined]
        return generic(dy, cache)
    n_head, head_dim, qh, k, v, att, scaled, ones = cache
    c = n_head * head_dim
    g = _var(dy)
    dyh = op.reshape(op.mul(_per_head(g, n_head), ones), _ints(0, -1, c))  # (B, H·T, C)
    datt = op.matmul(dyh, op.transpose(v, perm=(0, 2, 1)))  # (B, H·T, T)
    # each row's sum over the keys in every column: one product with ones (T, T), where a
    # ReduceSum and a Sub broadcasting its length-1 axis took 1.4x as long
    one = np.ones(1, dtype=dy.dtype.unwrap_numpy())
    sums = op.matmul(op.mul(datt, att), op.constant_of_shape(_dims(g, "T", "T"), value=one))
    dscores = op.mul(att, op.sub(datt, sums))
    dq_heads = op.reshape(op.matmul(dscores, k), _dims(g, 0, n_head, -1, c))
    dq = op.reduce_sum(op.mul(dq_heads, scaled), _ints(1), keepdims=0)
    dk = op.matmul(op.transpose(dscores, perm=(0, 2, 1)), qh)
    dv = op.matmul(op.transpose(att, perm=(0, 2, 1)), dyh)
    return ndx.asarray(op.concat([dq, dk, dv], axis=-1))


# -- decoding (the decode and generate graphs) --------------------------------------------
# (No ``Softmax`` for the slots' axis 0: it made the generate graph 1.2x slower than the
# generic form.)


def embed_columns(ids: Any, table: Any) -> Any:
    """Rows taken then transposed: one ``Gather`` of rows, where onnxruntime gathers along the
    last axis element by element (measured: a fifth of the generate graph's time)."""
    return ndx.matrix_transpose(ndx.take(table, ids, axis=0))


def cache_write(keys: Any, values: Any, k: Any, v: Any, pos: Any) -> tuple[Any, ...]:
    """Buffers of an unknown number of slots (the generate graph's ``Loop`` carries them so)
    hold exactly the ``pos`` slots written: the new one is appended (one ``Concat``), and
    ``seen`` is ``None``, every slot (no mask, no attention to unwritten slots; measured:
    the generate graph 2x faster than by ``where``). Buffers of a known size (the decode
    graph, eager arrays): the generic ``where``."""
    if keys.shape[0] is not None:
        return _generic.cache_write.__wrapped__(keys, values, k, v, pos)  # type: ignore[attr-defined,no-any-return]
    grown = (ndx.concat([old, new[None, ...]], axis=0) for old, new in ((keys, k), (values, v)))
    return (*grown, None)


def slot_heads(x: Any, n_head: int, head_dim: int) -> Any:
    """One ``Reshape`` to ``(0, H, D, -1)`` (``0``: the slot count as it is), where ndonnx
    reads the sizes at run time (five more nodes a layer and position)."""
    return ndx.asarray(op.reshape(_var(x), _ints(0, n_head, head_dim, -1)))


def keep_columns(buf: Any, idx: Any, filled: int | None = None) -> Any:
    """A vector: one ``GatherElements``, where onnxruntime's ``Gather`` copies 1-d values one
    by one (10,000 of them: 6x as long). A buffer: every slot (``filled`` unused: the
    generate graph's buffers hold the slots written only), transposed, whole rows taken,
    transposed back: onnxruntime's ``Gather`` on the last axis took 4.1 ms for an ``(8, 16,
    10000)`` buffer, this 0.95 ms (2 threads)."""
    if buf.ndim == 1:
        return ndx.asarray(op.gather_elements(_var(buf), _var(idx), axis=0))
    taken = ndx.take(ndx.permute_dims(buf, (2, 0, 1)), idx, axis=0)
    return ndx.permute_dims(taken, (1, 2, 0))
