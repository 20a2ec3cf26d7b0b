"""The generic primitives: standard Array API calls only, what every namespace runs where
no override of :mod:`microgpt_xp.primitives` applies (and the definition every override
is tested against).

Nothing here takes a Python int from a dimension that may be unknown: the batch and the
time of an activation are never read (lazy or symbolic arrays, such as ndonnx's, have
``None`` there). Activations are laid out ``(B, T, C)`` and never flattened and then
unflattened; heads are split by slicing the channels (``H`` and ``D`` come from the
config) and merged by concatenating them; positions come from the tokens themselves
(:func:`positions`). Every function here is :func:`~._dispatch.overridable`: called with
arrays of a namespace that overrides it, it runs the override instead, inside generic code
too; the generic body is its ``__wrapped__``.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from .._xp import array_namespace
from ._dispatch import overridable, writable

Array = Any


# -- creation ---------------------------------------------------------------------------------
@overridable(1)
def arange(n: int, like: Array, *, dtype: Any = None) -> Array:
    """``arange(n)`` of ``dtype`` (default: the namespace's default integer dtype) on
    ``like``'s device, for a size the config fixes."""
    xp = array_namespace(like)
    return xp.arange(n, dtype=dtype, device=device(like))


@overridable(2)
def full(shape: tuple[int, ...], value: float, like: Array, *, dtype: Any = None) -> Array:
    """An array of ``shape`` filled with ``value``, of ``dtype`` (default: ``like``'s) on
    ``like``'s device."""
    xp = array_namespace(like)
    return xp.full(shape, value, dtype=like.dtype if dtype is None else dtype, device=device(like))


@overridable()
def positions(x: Array, axis: int = 1) -> Array:
    """``(n,)`` int64 the indices ``0 .. n-1`` along ``axis`` of ``x`` (by default the
    positions of tokens ``(B, T)``), on ``x``'s device. Where ``n`` is unknown (symbolic
    arrays), they are the running count of a line of ones along that axis: an array made
    from the input, not from a Python int."""
    xp = array_namespace(x)
    n = x.shape[axis]
    if isinstance(n, int):
        return xp.arange(n, dtype=xp.int64, device=device(x))
    line = xp.moveaxis(x, axis, -1)[(0,) * (x.ndim - 1) + (...,)]
    return xp.cumulative_sum(xp.ones_like(line, dtype=xp.int64)) - 1


# -- reductions and products -----------------------------------------------------------
@overridable()
def sum_last(x: Array) -> Array:
    """``(…, n)`` -> ``(…, 1)``: the sum over the last axis."""
    return array_namespace(x).sum(x, axis=-1, keepdims=True)


@overridable()
def max_last(x: Array) -> Array:
    """``(…, n)`` -> ``(…, 1)``: the max over the last axis (NaN-propagating)."""
    return array_namespace(x).max(x, axis=-1, keepdims=True)


@overridable()
def linear(x: Array, w: Array) -> Array:
    """A linear layer without bias, ``x @ w.T``: ``x (…, n_in)``, ``w (n_out, n_in)`` ->
    ``(…, n_out)``."""
    return x @ array_namespace(w).matrix_transpose(w)


@overridable()
def linear_input_grad(dy: Array, w: Array) -> Array:
    """The gradient of :func:`linear`'s input, ``dy @ w``: ``dy (…, n_out)`` -> ``(…, n_in)``."""
    return dy @ w


@overridable()
def weight_grad(dy: Array, x: Array) -> Array:
    """The gradient of :func:`linear`'s weight, the sum over every leading position of
    ``dy ⊗ x``: ``dy (…, n_out)``, ``x (…, n_in)`` -> ``(n_out, n_in)``. The positions are
    flattened (one ``-1``: their count need not be known)."""
    xp = array_namespace(dy, x)
    dy2 = xp.reshape(dy, (-1, dy.shape[-1]))
    x2 = xp.reshape(x, (-1, x.shape[-1]))
    return xp.matrix_transpose(dy2) @ x2


@overridable()
def cumulative_sum0(x: Array) -> Array:
    """Running sums over the leading axis of ``x (V, B)`` -> ``(V, B)``."""
    return array_namespace(x).cumulative_sum(x, axis=0)


# -- indexing and scatter ------------------------------------------------------------------
@overridable()
def one_hot(ids: Array, num_classes: int, dtype: Any, *, axis: int = -1) -> Array:
    """``(…,)`` integer ids -> ``(…, num_classes)`` one-hot rows of ``dtype``, on the ids'
    device (a row of zeros for an id outside ``[0, num_classes)``); with ``axis=0``, 1-d
    ``ids (N,)`` -> ``(num_classes, N)`` one-hot columns."""
    xp = array_namespace(ids)
    classes = arange(num_classes, ids, dtype=ids.dtype)
    if axis == 0:
        return xp.astype(classes[:, None] == ids[None, :], dtype)
    return xp.astype(ids[..., None] == classes, dtype)


@overridable()
def embed(ids: Array, table: Array) -> Array:
    """Rows of ``table (V, C)`` picked by ``ids (B, T)`` -> ``(B, T, C)``, exactly.

    A ``take`` of the flattened ids, reshaped back to ``(B, T, C)`` where ``B`` and ``T``
    are known; where they are not (symbolic arrays), the one-hot product ``one_hot(ids)
    @ table``, exact wherever products are computed in the arrays' precision (each entry
    is one weight times 1 plus zeros), as ONNX runtimes' CPU kernels compute them."""
    xp = array_namespace(ids, table)
    b, t = ids.shape
    if isinstance(b, int) and isinstance(t, int):
        rows = xp.take(table, xp.reshape(ids, (-1,)), axis=0)
        return xp.reshape(rows, (b, t, table.shape[1]))
    return one_hot(ids, table.shape[0], table.dtype) @ table


@overridable()
def scatter_add_rows(ids: Array, values: Array, num_rows: int) -> Array:
    """``out[i] = Σ values[j] over j with ids[j] == i`` for ``ids (N,)`` in ``[0,
    num_rows)`` and ``values (N, C)`` -> ``out (num_rows, C)``; rows no id names are exactly
    zero. The embeddings' gradient. The standard has no scatter-add: ``one_hot(ids).T @
    values``."""
    return one_hot(ids, num_rows, values.dtype, axis=0) @ values


# -- the KV cache ---------------------------------------------------------------------------
def cache_write(keys: Array, values: Array, k: Array, v: Array, pos: Any) -> tuple[Any, ...]:
    """Write key ``k`` and value ``v`` ``(C, B)`` of position ``pos`` into slot ``pos`` of a
    layer's buffers ``(P, C, B)``; returns ``(keys, values, seen)``: the buffers after the
    write and what the position attends to (see
    :func:`~microgpt_xp.layers.decode_attention`). Where ``pos`` is a Python int and the
    buffers can be written (:func:`~._dispatch.writable`) the write is in place and
    ``seen = pos + 1``, the slots so far; elsewhere (JAX, Dask, a 0-d ``pos``) new buffers
    by ``where`` and ``seen`` the ``(P,)`` mask of the slots up to ``pos``."""
    if isinstance(pos, int) and writable(keys):
        keys[pos, ...] = k
        values[pos, ...] = v
        return keys, values, pos + 1
    xp = array_namespace(keys, k)
    slots = arange(keys.shape[0], k, dtype=getattr(pos, "dtype", None))
    here = (slots == pos)[:, None, None]
    return xp.where(here, k[None, ...], keys), xp.where(here, v[None, ...], values), slots <= pos


# -- activations ------------------------------------------------------------------------------
@overridable()
def relu(x: Array) -> tuple[Array, Any]:
    """``max(0, x)`` elementwise and the cache of :func:`relu_backward`, the 0/1 mask
    (``x * mask`` is the output; the derivative at 0 is 0)."""
    xp = array_namespace(x)
    mask = xp.astype(x > 0, x.dtype)
    return x * mask, mask


@overridable()
def relu_backward(dy: Array, cache: Any) -> Array:
    """``dy * mask`` from the cache of :func:`relu`."""
    return dy * cache


@overridable()
def softmax(z: Array, axis: int = -1) -> Array:
    """Softmax over ``axis`` (the last, or 0) as the original computes it: ``e * (Σe)**-1``
    with ``e = exp(z - max(z))``. Entries of ``-inf`` get probability 0.

    Over the last axis, the max and the reciprocal are taken of ``(…,)`` arrays and
    broadcast back (the same values): ONNX runtimes run an operation between a scalar and
    an array whose last axis has length 1 one element at a time. The reciprocal is ``1 /
    Σe`` (what ``** -1`` computes on NumPy and PyTorch; ONNX runs ``**`` as a general
    power)."""
    xp = array_namespace(z)
    if axis == -1:
        return _normalized(xp.exp(z - xp.max(z, axis=-1)[..., None]))
    if axis != 0:
        raise ValueError(f"softmax runs over axis -1 or 0, not {axis}")
    # a reduction over the leading axis is already one vectorized pass per row
    e = xp.exp(z - xp.max(z, axis=0, keepdims=True))
    return e * (1.0 / xp.sum(e, axis=0, keepdims=True))


def _normalized(e: Array) -> Array:
    """``e (…, n)`` times the reciprocal of its sums over the last axis."""
    return e * (1.0 / sum_last(e)[..., 0])[..., None]


def _masked_softmax(z: Array, bias: Array) -> Array:
    """:func:`softmax` over the last axis of ``z + bias`` for an additive mask ``bias``
    (``-inf`` at the entries to hide, broadcast to ``z``), the same values, with no
    exponential of ``-inf``: ONNX runtimes take an ``exp`` whose result is below the
    normal range (an input below about -87 in float32, ``-inf`` included) many times
    slower than others. The hidden entries' exponent is raised to 0 (``maximum`` with a
    floor of 0 there, ``-inf`` elsewhere), and their ``exp(0)`` multiplied by 0."""
    xp = array_namespace(z, bias)
    shown = bias > -xp.inf
    s = z + bias
    d = s - xp.max(s, axis=-1)[..., None]
    floor = xp.where(shown, xp.full_like(bias, -xp.inf), xp.zeros_like(bias))
    return _normalized(xp.exp(xp.maximum(d, floor)) * xp.astype(shown, d.dtype))


# -- attention --------------------------------------------------------------------------------
@overridable()
def causal_bias(pos: Array, dtype: Any) -> Array:
    """``(T, T)`` additive mask for positions ``pos (T,)``: 0 where key ≤ query (the
    diagonal included), ``-inf`` above, in ``dtype`` on ``pos``'s device."""
    xp = array_namespace(pos)
    visible = pos[:, None] >= pos[None, :]
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
    """Scaled dot-product attention for ``q (B, H, Tq, D)`` over ``k, v (B, H, Tk, D)``
    (``D = head_dim``): ``softmax((q * D**-0.5) @ k.T + bias) @ v`` -> ``(B, H, Tq, D)``
    and the cache of :func:`attention_backward` (bias ``(Tq, Tk)`` of 0/−inf, or
    ``None``). The scale goes on ``q``, a quarter of the size of the scores when ``Tk = 4
    D``."""
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
def causal_attention(qkv: Array, n_head: int, head_dim: int) -> tuple[Array, Any]:
    """Causal multi-head self-attention over fused projections: ``qkv (B, T, 3C)`` holds
    ``q | k | v`` side by side (``C = n_head * head_dim``); returns ``(B, T, C)`` (the
    heads' outputs in head order) and the cache of :func:`causal_attention_backward`.
    Position ``t`` attends to positions ``0..t``."""
    c = n_head * head_dim
    q, k, v = (split_heads(qkv[..., i * c : (i + 1) * c], n_head, head_dim) for i in range(3))
    pos = positions(qkv[:1, :, 0])  # (1, T): the positions need no more of qkv
    y, cache = attention(q, k, v, causal_bias(pos, qkv.dtype), head_dim)
    return merge_heads(y, n_head), (n_head, head_dim, cache)


@overridable()
def causal_attention_backward(dy: Array, cache: Any) -> Array:
    """``dy (B, T, C)`` -> ``dqkv (B, T, 3C)`` from the cache of :func:`causal_attention`."""
    xp = array_namespace(dy)
    n_head, head_dim, inner = cache
    grads = attention_backward(split_heads(dy, n_head, head_dim), inner)
    return xp.concat([merge_heads(g, n_head) for g in grads], axis=-1)


# -- the loss ---------------------------------------------------------------------------------
@overridable()
def cross_entropy(logits: Array, targets: Array, valid: Array | None) -> tuple[Array, Any]:
    """Per-position ``log Σ exp(z − max z) − (z[target] − max z)`` of ``logits (…, V)``
    and integer ``targets (…)``: ``losses (…)``, 0 where ``valid`` (if given) is 0, and the
    cache of :func:`cross_entropy_backward`."""
    xp = array_namespace(logits, targets)
    shifted = logits - max_last(logits)
    e = xp.exp(shifted)
    total = sum_last(e)
    p = e * total**-1
    # the classes from the logits themselves: their number need not be known
    onehot = xp.astype(targets[..., None] == positions(logits, axis=-1), logits.dtype)
    losses = xp.log(total[..., 0]) - xp.sum(shifted * onehot, axis=-1)
    if valid is not None:
        losses = xp.where(valid != 0, losses, xp.zeros_like(losses))
    return losses, (p, onehot)


@overridable()
def cross_entropy_backward(dlosses: Array, cache: Any) -> Array:
    """``dlosses (…)`` -> ``dlogits (…, V) = (p − onehot(target)) * dlosses``."""
    p, onehot = cache
    return (p - onehot) * dlosses[..., None]


@overridable()
def head_cross_entropy(
    x: Array, w: Array, targets: Array, valid: Array | None
) -> tuple[Array, Any]:
    """The output layer and the loss: logits ``x @ w.T`` of ``x (…, C)`` and ``lm_head
    (V, C)``, then :func:`cross_entropy` against ``targets (…)``; returns ``losses (…)`` and
    the cache of :func:`head_cross_entropy_backward`."""
    losses, c_ce = cross_entropy(linear(x, w), targets, valid)
    return losses, (x, w, c_ce)


@overridable()
def head_cross_entropy_backward(dlosses: Array, cache: Any) -> tuple[Array, Array]:
    """``dlosses (…)`` -> ``(dx (…, C), dw (V, C))`` from the cache of
    :func:`head_cross_entropy`."""
    x, w, c_ce = cache
    dlogits = cross_entropy_backward(dlosses, c_ce)
    return linear_input_grad(dlogits, w), weight_grad(dlogits, x)
