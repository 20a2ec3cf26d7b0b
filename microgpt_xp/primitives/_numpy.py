"""NumPy's overrides of :mod:`microgpt_xp.primitives`, each measured (docs/performance.md):
sums as BLAS products with ones (a short last axis is reduced row by row; products run in
the arrays' precision), leading axes flattened into one matrix, constants cached read-only."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np


def arange(n: int, like: Any, *, dtype: Any = None) -> Any:
    """A cached read-only ``np.arange(n, dtype=dtype)``."""
    return _arange(n, dtype)


@functools.lru_cache(maxsize=16)
def _arange(n: int, dtype: Any) -> Any:
    out = np.arange(n, dtype=dtype)
    out.flags.writeable = False
    return out


def positions(x: Any, axis: int = 1) -> Any:
    """The cached int64 ``arange`` of the length of ``axis``."""
    return _arange(x.shape[axis], np.int64)


def sum_first(x: Any) -> Any:
    """``x.sum(axis=0, keepdims=True)``: the generic form's namespace lookup made the sampler
    5% slower."""
    return x.sum(axis=0, keepdims=True)


def sum_last(x: Any) -> Any:
    """``x @ ones((n, 2))``, first column (a matrix-vector product rounds by row count)."""
    n = x.shape[-1]
    if x.ndim == 1:
        return x @ _ones(n, 1, x.dtype)
    rows = x.reshape(-1, n) @ _ones(n, 2, x.dtype)
    return rows[:, :1].reshape(*x.shape[:-1], 1)


@functools.lru_cache(maxsize=16)
def _ones(n: int, cols: int, dtype: Any) -> Any:
    ones = np.ones((n, cols), dtype)
    ones.flags.writeable = False
    return ones


def linear(x: Any, w: Any) -> Any:
    """``x @ w.T``, leading axes flattened (one BLAS call)."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])


def linear_input_grad(dy: Any, w: Any) -> Any:
    """``dy @ w``, leading axes flattened."""
    return (dy.reshape(-1, dy.shape[-1]) @ w).reshape(*dy.shape[:-1], w.shape[1])


def weight_grad(dy: Any, x: Any) -> Any:
    """``dy.T @ x``; ``(x.T @ dy).T`` when ``n_in > n_out`` (BLAS: longer side first, 2x)."""
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    if dy2.shape[1] < x2.shape[1]:
        return (x2.T @ dy2).T
    return dy2.T @ x2


def cumulative_sum0(x: Any) -> Any:
    """A product with a lower-triangular ones matrix (several times ``cumulative_sum``)."""
    ids = np.arange(x.shape[0])
    return (ids[:, None] >= ids[None, :]).astype(x.dtype) @ x


def relu(x: Any) -> tuple[Any, Any]:
    """``np.maximum(x, 0)``, the output as cache: one pass where the mask takes three."""
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dy: Any, y: Any) -> Any:
    return dy * (y > 0)


def one_hot(ids: Any, num_classes: int, dtype: Any, *, axis: int = -1) -> Any:
    """Ones written at the ids' flat indices (ids in range, as the model passes them)."""
    flat_ids = ids.reshape(-1)
    n = flat_ids.shape[0]
    if axis == 0:
        out = np.zeros((num_classes, n), dtype)
        out.reshape(-1)[flat_ids * n + np.arange(n)] = 1
    else:
        out = np.zeros((*ids.shape, num_classes), dtype)
        out.reshape(-1)[np.arange(n) * num_classes + flat_ids] = 1
    return out


class Attention(NamedTuple):
    """:func:`causal_attention`'s cache: ``q, k, v (B, H, T, D)`` views, ``att[h, k, b, q]``."""

    q: Any
    k: Any
    v: Any
    att: Any
    scale: float


#: The largest full-size causal mask kept (bytes: the default model at B=1024, float32).
MASK_CACHE_BYTES = 4 << 20


def causal_attention(
    qkv: Any, n_head: int, head_dim: int, doc_positions: Any = None
) -> tuple[Any, Any]:
    """Scores laid out ``(H, Tk, B, Tq)``, written in place by the batched product, so the
    softmax reduces axis 1 over contiguous rows; the mask added in place (a cached full-size
    copy up to :data:`MASK_CACHE_BYTES`: a 16-long broadcast costs several times more; packed
    rows' ``doc_positions (B, T)``: a ``(Tk, B, Tq)`` mask of the batch, broadcast over the
    heads); the output product writes straight into the merged ``(B, T, H, D)`` layout."""
    b, t, _ = qkv.shape
    h, d = n_head, head_dim
    c = h * d
    dtype = qkv.dtype
    scale = float(d) ** -0.5
    x5 = qkv.reshape(b, t, 3, h, d)
    q, k, v = (x5[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (B, H, T, D) views
    qs_t = np.empty((b, h, d, t), dtype)
    np.multiply(q.transpose(0, 1, 3, 2), scale, out=qs_t)
    att = np.empty((h, t, b, t), dtype)  # att[h, key, b, query]
    np.matmul(k, qs_t, out=att.transpose(2, 0, 1, 3))
    rows = att.reshape(h, t, b * t)
    if doc_positions is not None:
        np.add(att, _document_mask(doc_positions, dtype)[None], out=att)
    elif att.nbytes <= MASK_CACHE_BYTES:
        np.add(rows, _key_query_bias(h, t, b, dtype), out=rows)
    else:  # a big batch: broadcast the (Tk, Tq) mask rather than keep a full-size copy
        np.add(att, _key_query(t, dtype)[None, :, None, :], out=att)
    np.subtract(rows, rows.max(axis=1, keepdims=True), out=rows)
    np.exp(rows, out=rows)
    total = rows.sum(axis=1, keepdims=True)
    np.multiply(rows, np.reciprocal(total, out=total), out=rows)
    y = np.empty((b, t, h, d), dtype)
    np.matmul(att.transpose(2, 0, 3, 1), v, out=y.transpose(0, 2, 1, 3))
    return y.reshape(b, t, c), Attention(q, k, v, att, scale)


def causal_attention_backward(dy: Any, cache: Attention) -> Any:
    """In the forward's layout; ``dq``, ``dk``, ``dv`` written straight into ``dqkv``."""
    q, k, v, att, scale = cache
    b, h, t, d = q.shape
    dtype = att.dtype
    dy_heads = dy.reshape(b, t, h, d).transpose(0, 2, 1, 3)  # (B, H, T, D) view
    dy_t = np.empty((b, h, d, t), dtype)
    np.copyto(dy_t, dy_heads.transpose(0, 1, 3, 2))
    datt = np.empty((h, t, b, t), dtype)  # datt[h, key, b, query]
    np.matmul(v, dy_t, out=datt.transpose(2, 0, 1, 3))
    rows, probs = datt.reshape(h, t, b * t), att.reshape(h, t, b * t)
    dot = np.multiply(rows, probs).sum(axis=1, keepdims=True)
    np.subtract(rows, dot, out=rows)
    np.multiply(rows, probs, out=rows)
    np.multiply(rows, scale, out=rows)  # the scores' gradient, times the scale
    dqkv = np.empty((b, t, 3, h, d), dtype)
    dscores_t = datt.transpose(2, 0, 1, 3)  # (B, H, Tk, Tq)
    np.matmul(dscores_t.transpose(0, 1, 3, 2), k, out=dqkv[:, :, 0].transpose(0, 2, 1, 3))
    np.matmul(dscores_t, q, out=dqkv[:, :, 1].transpose(0, 2, 1, 3))
    np.matmul(att.transpose(2, 0, 1, 3), dy_heads, out=dqkv[:, :, 2].transpose(0, 2, 1, 3))
    return dqkv.reshape(b, t, 3 * h * d)


@functools.lru_cache(maxsize=4)
def _key_query_bias(h: int, t: int, b: int, dtype: Any) -> Any:
    """The causal mask ``(H, Tk, B*Tq)`` as the scores are laid out, read-only."""
    key_query = _key_query(t, dtype)
    mask = np.ascontiguousarray(np.broadcast_to(key_query[None, :, None, :], (h, t, b, t)))
    mask = mask.reshape(h, t, b * t)
    mask.flags.writeable = False
    return mask


def _document_mask(doc_positions: Any, dtype: Any) -> Any:
    """``(Tk, B, Tq)``: 0 where query ``q`` of row ``b`` sees key ``k`` (``q - doc_positions[b,
    q] <= k <= q``), else ``-inf``."""
    ids = np.arange(doc_positions.shape[1])
    first = ids[None, :] - doc_positions  # (B, Tq)
    keys = ids[:, None, None]
    visible = (keys <= ids[None, None, :]) & (keys >= first[None, :, :])
    return np.where(visible, dtype.type(0), dtype.type(-np.inf))


@functools.lru_cache(maxsize=8)
def _key_query(t: int, dtype: Any) -> Any:
    """The ``(Tk, Tq)`` causal mask, read-only (``-inf`` where key > query)."""
    pos = np.arange(t)
    mask = np.where(pos[:, None] > pos[None, :], -np.inf, 0.0).astype(dtype)
    mask.flags.writeable = False
    return mask


def head_cross_entropy(x: Any, w: Any, targets: Any, valid: Any) -> tuple[Any, Any]:
    """Logits laid out ``(V, N)`` (one product) so the reductions run over the leading axis,
    vectorized; targets picked and the backward's one-hot written by flat indices."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    logits_t = w @ x2.T
    v, n = logits_t.shape
    shifted = logits_t - logits_t.max(axis=0)
    e = np.exp(shifted)
    total = e.sum(axis=0)
    np.multiply(e, np.reciprocal(total), out=e)
    flat = targets.reshape(-1) * n + np.arange(n)
    losses = np.log(total) - shifted.reshape(-1)[flat]
    if valid is not None:
        losses = np.where(valid.reshape(-1) != 0, losses, losses.dtype.type(0))
    onehot = np.zeros((v, n), logits_t.dtype)
    onehot.reshape(-1)[flat] = 1
    return losses.reshape(lead), (x2, w, e, onehot, lead)


def head_cross_entropy_backward(dlosses: Any, cache: Any) -> tuple[Any, Any]:
    """``dlogits_t = (p − onehot) * dlosses``; ``dx = dlogits_t.T @ w``, ``dw = dlogits_t @ x``."""
    x2, w, p, onehot, lead = cache
    dlogits_t = (p - onehot) * dlosses.reshape(-1)[None, :]
    return (dlogits_t.T @ w).reshape(*lead, w.shape[1]), dlogits_t @ x2
