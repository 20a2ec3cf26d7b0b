"""The generic primitives, standard Array API calls only: what runs where no override applies
and what overrides are tested against (``__wrapped__``). No Python int is read from a batch
or time that may be unknown (ndonnx): heads are channel slices, positions from the tokens."""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from .._xp import array_namespace
from ._dispatch import overridable, writable

Array = Any

__all__ = [
    "arange", "attention", "attention_backward", "cache_write", "causal_attention",
    "causal_attention_backward", "causal_bias", "cross_entropy", "cross_entropy_backward",
    "cumulative_sum0", "embed", "embed_columns", "full", "head_cross_entropy", "head_cross_entropy_backward",
    "keep_columns", "linear", "linear_input_grad", "matmul", "max_first", "merge_heads", "one_hot", "positions", "relu",
    "relu_backward", "rsqrt", "scale_rows", "scatter_add_rows", "slot_heads", "softmax",
    "split_heads", "sum_first", "sum_last", "weight_grad",
]  # fmt: skip


@overridable(1)
def arange(n: int, like: Array, *, dtype: Any = None) -> Array:
    """``arange(n)`` of ``dtype`` (default: the default integer) on ``like``'s device."""
    xp = array_namespace(like)
    return xp.arange(n, dtype=dtype, device=device(like))


@overridable(2)
def full(shape: tuple[int, ...], value: float, like: Array, *, dtype: Any = None) -> Array:
    """``full(shape, value)`` of ``dtype`` (default: ``like``'s) on ``like``'s device."""
    xp = array_namespace(like)
    return xp.full(shape, value, dtype=like.dtype if dtype is None else dtype, device=device(like))


@overridable()
def positions(x: Array, axis: int = 1) -> Array:
    """``(n,)`` int64 ``0 .. n-1`` along ``axis`` of ``x`` (a running count if ``n`` is unknown)."""
    xp = array_namespace(x)
    n = x.shape[axis]
    if isinstance(n, int):
        return xp.arange(n, dtype=xp.int64, device=device(x))
    line = xp.moveaxis(x, axis, -1)[(0,) * (x.ndim - 1) + (...,)]
    return xp.cumulative_sum(xp.ones_like(line, dtype=xp.int64)) - 1


@overridable()
def sum_first(x: Array) -> Array:
    """``(n, …)`` -> ``(1, …)``: the sum over the leading axis."""
    return array_namespace(x).sum(x, axis=0, keepdims=True)


@overridable()
def max_first(x: Array) -> Array:
    """``(n, …)`` -> ``(1, …)``: the largest value along the leading axis."""
    return array_namespace(x).max(x, axis=0, keepdims=True)


@overridable()
def sum_last(x: Array) -> Array:
    """``(…, n)`` -> ``(…, 1)``: the sum over the last axis."""
    return array_namespace(x).sum(x, axis=-1, keepdims=True)


@overridable()
def scale_rows(x: Array, s: Array) -> Array:
    """``x (…, n)`` with each row times its factor in ``s (…,)`` -> ``(…, n)``."""
    return x * s[..., None]


@overridable()
def rsqrt(x: Array) -> Array:
    """``x ** -0.5``, elementwise."""
    return x**-0.5


@overridable()
def linear(x: Array, w: Array) -> Array:
    """``x @ w.T``: ``x (…, n_in)``, ``w (n_out, n_in)`` -> ``(…, n_out)``."""
    return x @ array_namespace(w).matrix_transpose(w)


@overridable()
def matmul(a: Array, b: Array) -> Array:
    """``a @ b``: ``a (…, n, k)``, ``b (…, k, m)`` -> ``(…, n, m)`` (decoding's ``w @ x_t``)."""
    return a @ b


@overridable()
def linear_input_grad(dy: Array, w: Array) -> Array:
    """:func:`linear`'s input gradient ``dy @ w``: ``(…, n_out)`` -> ``(…, n_in)``."""
    return matmul(dy, w)


@overridable()
def weight_grad(dy: Array, x: Array) -> Array:
    """:func:`linear`'s weight gradient, ``Σ dy ⊗ x`` over the leading positions: ``dy (…,
    n_out)``, ``x (…, n_in)`` -> ``(n_out, n_in)`` (``tensordot`` if a last axis is unknown)."""
    xp = array_namespace(dy, x)
    if dy.shape[-1] is None or x.shape[-1] is None:
        lead = list(range(dy.ndim - 1))
        return xp.tensordot(dy, x, axes=(lead, lead))
    dy2 = xp.reshape(dy, (-1, dy.shape[-1]))
    x2 = xp.reshape(x, (-1, x.shape[-1]))
    return xp.matrix_transpose(dy2) @ x2


@overridable()
def cumulative_sum0(x: Array) -> Array:
    """Running sums over the leading axis of ``x (V, B)`` -> ``(V, B)``."""
    return array_namespace(x).cumulative_sum(x, axis=0)


@overridable()
def one_hot(ids: Array, num_classes: int, dtype: Any, *, axis: int = -1) -> Array:
    """``(…,)`` ids -> ``(…, num_classes)`` one-hot rows; ``axis=0``: ``(num_classes, N)``."""
    xp = array_namespace(ids)
    classes = arange(num_classes, ids, dtype=ids.dtype)
    if axis == 0:
        return xp.astype(classes[:, None] == ids[None, :], dtype)
    return xp.astype(ids[..., None] == classes, dtype)


@overridable()
def embed(ids: Array, table: Array) -> Array:
    """Rows of ``table (V, C)`` picked by ``ids (B, T)`` -> ``(B, T, C)``: a ``take``; where
    ``B`` or ``T`` is unknown, ``one_hot(ids) @ table`` (exact in the arrays' precision)."""
    xp = array_namespace(ids, table)
    b, t = ids.shape
    if isinstance(b, int) and isinstance(t, int):
        rows = xp.take(table, xp.reshape(ids, (-1,)), axis=0)
        return xp.reshape(rows, (b, t, table.shape[1]))
    return one_hot(ids, table.shape[0], table.dtype) @ table


@overridable()
def embed_columns(ids: Array, table: Array) -> Array:
    """Rows of ``table (V, C)`` picked by ``ids (B,)`` as the columns of ``(C, B)`` (decoding's
    layout): a ``take`` along ``table.T``'s columns."""
    xp = array_namespace(table)
    return xp.take(xp.matrix_transpose(table), ids, axis=1)


@overridable()
def scatter_add_rows(ids: Array, values: Array, num_rows: int) -> Array:
    """``out[i] = Σ values[j] for ids[j] == i`` -> ``(num_rows, C)`` (a one-hot product)."""
    return one_hot(ids, num_rows, values.dtype, axis=0) @ values


@overridable()
def cache_write(keys: Array, values: Array, k: Array, v: Array, pos: Any) -> tuple[Any, ...]:
    """Write ``k, v (C, B)`` into slot ``pos`` of buffers ``(P, C, B)`` -> ``(keys, values,
    seen)``: in place with ``seen = pos + 1`` for an int ``pos`` and writable buffers, else
    by ``where`` with ``seen`` the ``(P,)`` mask of slots up to ``pos`` (an override may
    return buffers of the slots written only, ``seen`` then ``None``)."""
    if isinstance(pos, int) and writable(keys):
        keys[pos, ...] = k
        values[pos, ...] = v
        return keys, values, pos + 1
    xp = array_namespace(keys, k)
    slots = arange(keys.shape[0], k, dtype=getattr(pos, "dtype", None))
    here = (slots == pos)[:, None, None]
    return xp.where(here, k[None, ...], keys), xp.where(here, v[None, ...], values), slots <= pos


@overridable()
def keep_columns(buf: Array, idx: Array, filled: int | None = None) -> Array:
    """The batch columns ``idx (K,)`` of ``buf (…, B)``, a cache buffer ``(P, C, B)`` or a
    ``(B,)`` vector -> ``(…, K)``: every slot, or, where ``filled`` is given and the buffer
    ``(P, C, B)`` is writable, the first ``filled`` (those written) copied into a new buffer
    whose other slots are left unwritten."""
    xp = array_namespace(buf)
    if filled is None or not writable(buf):
        return xp.take(buf, idx, axis=-1)
    new = xp.empty_like(buf[:, :, : idx.shape[0]])
    new[:filled, ...] = xp.take(buf[:filled, ...], idx, axis=2)
    return new


@overridable()
def slot_heads(x: Array, n_head: int, head_dim: int) -> Array:
    """``(P, H·D, B)`` -> ``(P, H, D, B)``: a cache's channels split into heads (a reshape)."""
    return array_namespace(x).reshape(x, (x.shape[0], n_head, head_dim, -1))


@overridable()
def relu(x: Array) -> tuple[Array, Any]:
    """``x * mask`` and the 0/1 mask as cache (the derivative at 0 is 0)."""
    xp = array_namespace(x)
    mask = xp.astype(x > 0, x.dtype)
    return x * mask, mask


@overridable()
def relu_backward(dy: Array, cache: Any) -> Array:
    """``dy * mask`` from the cache of :func:`relu`."""
    return dy * cache


@overridable()
def softmax(z: Array, axis: int = -1) -> Array:
    """Softmax over ``axis`` (-1 or 0): ``e * (1 / Σe)``, ``e = exp(z - max z)``. Over the
    last axis, ``(…,)`` arrays broadcast back (ONNX runtimes are slow on a length-1 axis)."""
    xp = array_namespace(z)
    if axis == -1:
        return _normalized(xp.exp(z - xp.max(z, axis=-1)[..., None]))
    if axis != 0:
        raise ValueError(f"softmax runs over axis -1 or 0, not {axis}")
    e = xp.exp(z - xp.max(z, axis=0, keepdims=True))
    return e * (1.0 / sum_first(e))


def _normalized(e: Array) -> Array:
    """``e (…, n)`` times the reciprocal of its sums over the last axis."""
    return scale_rows(e, 1.0 / sum_last(e)[..., 0])


def _masked_softmax(z: Array, bias: Array) -> Array:
    """:func:`softmax` of ``z + bias`` (0 or ``-inf``) with no ``exp(-inf)`` (slow on ONNX
    runtimes): hidden entries get ``exp(0) * 0``."""
    xp = array_namespace(z, bias)
    shown = bias > -xp.inf
    s = z + bias
    d = s - xp.max(s, axis=-1)[..., None]
    floor = xp.where(shown, xp.full_like(bias, -xp.inf), xp.zeros_like(bias))
    return _normalized(xp.exp(xp.maximum(d, floor)) * xp.astype(shown, d.dtype))


@overridable()
def causal_bias(pos: Array, dtype: Any, doc_positions: Array | None = None) -> Array:
    """``(T, T)`` additive mask of positions ``pos (T,)``: 0 where key ≤ query, else ``-inf``;
    with ``doc_positions (B, T)``, each query's position inside its document (packed rows),
    ``(B, 1, T, T)``: query ``i`` sees key ``j`` iff ``i - doc_positions[b, i] <= j <= i``."""
    xp = array_namespace(pos)
    visible = pos[:, None] >= pos[None, :]
    if doc_positions is not None:
        first = pos[None, :] - doc_positions  # (B, Tq): each query's document start
        visible = (visible[None, ...] & (pos[None, None, :] >= first[..., None]))[:, None, ...]
    zero = xp.zeros_like(xp.astype(visible, dtype))
    return xp.where(visible, zero, zero - xp.inf)


@overridable()
def split_heads(x: Array, n_head: int, head_dim: int) -> Array:
    """``(B, T, H·D)`` -> ``(B, H, T, D)``: head ``h`` is channels ``h·D .. (h+1)·D - 1``."""
    xp = array_namespace(x)
    d = head_dim
    return xp.stack([x[..., h * d : (h + 1) * d] for h in range(n_head)], axis=1)


@overridable()
def merge_heads(y: Array, n_head: int) -> Array:
    """``(B, H, T, D)`` -> ``(B, T, H·D)``: the heads' channels side by side, in head order."""
    xp = array_namespace(y)
    return xp.concat([y[:, h, ...] for h in range(n_head)], axis=-1)


@overridable()
def attention(q: Array, k: Array, v: Array, bias: Array | None, head_dim: int) -> tuple[Array, Any]:
    """``softmax((q * D**-0.5) @ k.T + bias) @ v`` for ``q (B, H, Tq, D)``, ``k, v (B, H, Tk,
    D)``, ``bias (Tq, Tk)``, ``(B, 1, Tq, Tk)`` or ``None`` -> ``(B, H, Tq, D)`` and the cache."""
    xp = array_namespace(q, k, v)
    scale = float(head_dim) ** -0.5
    qs = q * scale
    scores = qs @ xp.matrix_transpose(k)
    att = softmax(scores) if bias is None else _masked_softmax(scores, bias)
    return att @ v, (qs, k, v, att, scale)


@overridable()
def attention_backward(dy: Array, cache: Any) -> tuple[Array, Array, Array]:
    """``dy (B, H, Tq, D)`` -> ``(dq, dk, dv)`` with the shapes of ``q, k, v``."""
    xp = array_namespace(dy)
    qs, k, v, att, scale = cache
    datt = dy @ xp.matrix_transpose(v)
    dv = xp.matrix_transpose(att) @ dy
    dscores = att * (datt - sum_last(datt * att))
    return (dscores @ k) * scale, xp.matrix_transpose(dscores) @ qs, dv


@overridable()
def causal_attention(
    qkv: Array, n_head: int, head_dim: int, doc_positions: Array | None = None
) -> tuple[Array, Any]:
    """Causal attention of ``qkv (B, T, 3C)`` (``q | k | v``) -> ``(B, T, C)`` and the cache;
    with ``doc_positions (B, T)`` (packed rows: each position's place in its document, see
    :func:`causal_bias`), confined to each document."""
    c = n_head * head_dim
    q, k, v = (split_heads(qkv[..., i * c : (i + 1) * c], n_head, head_dim) for i in range(3))
    pos = positions(qkv[:1, :, 0])  # (1, T): the positions need no more of qkv
    packed = {} if doc_positions is None else {"doc_positions": doc_positions}
    bias = causal_bias(pos, qkv.dtype, **packed)
    y, cache = attention(q, k, v, bias, head_dim)
    return merge_heads(y, n_head), (n_head, head_dim, cache)


@overridable()
def causal_attention_backward(dy: Array, cache: Any) -> Array:
    """``dy (B, T, C)`` -> ``dqkv (B, T, 3C)``."""
    xp = array_namespace(dy)
    n_head, head_dim, inner = cache
    grads = attention_backward(split_heads(dy, n_head, head_dim), inner)
    return xp.concat([merge_heads(g, n_head) for g in grads], axis=-1)


@overridable()
def cross_entropy(logits: Array, targets: Array, valid: Array | None) -> tuple[Array, Any]:
    """``losses (…)`` of ``logits (…, V)`` and ``targets (…)`` (0 where ``valid`` is 0), cache."""
    xp = array_namespace(logits, targets)
    shifted = logits - xp.max(logits, axis=-1, keepdims=True)
    e = xp.exp(shifted)
    total = sum_last(e)
    p = e * total**-1
    onehot = xp.astype(targets[..., None] == positions(logits, axis=-1), logits.dtype)
    losses = xp.log(total[..., 0]) - xp.sum(shifted * onehot, axis=-1)
    if valid is not None:
        losses = xp.where(valid != 0, losses, xp.zeros_like(losses))
    return losses, (p, onehot)


@overridable()
def cross_entropy_backward(dlosses: Array, cache: Any) -> Array:
    """``dlosses (…)`` -> ``dlogits (…, V) = (p − onehot(target)) * dlosses``."""
    p, onehot = cache
    return scale_rows(p - onehot, dlosses)


@overridable()
def head_cross_entropy(
    x: Array, w: Array, targets: Array, valid: Array | None
) -> tuple[Array, Any]:
    """:func:`cross_entropy` of the logits ``x @ w.T`` (``x (…, C)``, ``w (V, C)``)."""
    losses, c_ce = cross_entropy(linear(x, w), targets, valid)
    return losses, (x, w, c_ce)


@overridable()
def head_cross_entropy_backward(dlosses: Array, cache: Any) -> tuple[Array, Array]:
    """``dlosses (…)`` -> ``(dx (…, C), dw (V, C))``."""
    x, w, c_ce = cache
    dlogits = cross_entropy_backward(dlosses, c_ce)
    return linear_input_grad(dlogits, w), weight_grad(dlogits, x)
