"""Building blocks as forward/backward pairs, written once against the Array API.

Each ``*_forward(...)`` returns ``(out, cache)`` and each ``*_backward(dout, cache)``
returns the gradients of its inputs, in the style of llm.c's ``train_gpt2``. Every
function takes its namespace from its arguments (``array_namespace``), creates arrays
only with an explicit ``device=`` and ``dtype=``, never mutates an array, and never
branches on array values, so the same code runs eagerly (NumPy, CuPy, PyTorch,
array-api-strict), lazily (Dask) and under tracing (JAX).

Shapes: ``N`` rows (``N = B*T`` flattened positions), ``C`` channels, ``V`` vocabulary,
``B`` batch, ``H`` heads, ``T`` positions, ``D`` head channels.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from ._xp import array_namespace

#: Added to the mean square in RMSNorm (the spec's 1e-5).
RMSNORM_EPS = 1e-5

Array = Any


def one_hot(ids: Array, num_classes: int, dtype: Any) -> Array:
    """``(…,)`` integer ids -> ``(…, num_classes)`` one-hot rows of ``dtype``, on ids' device."""
    xp = array_namespace(ids)
    classes = xp.arange(num_classes, dtype=ids.dtype, device=device(ids))
    return xp.astype(ids[..., None] == classes, dtype)


# -- embedding ------------------------------------------------------------------------
def embedding_forward(tokens: Array, wte: Array, wpe_rows: Array) -> tuple[Array, Any]:
    """Token plus position embedding.

    ``tokens (B, T)`` integer ids in ``[0, V)``, ``wte (V, C)``, ``wpe_rows (T, C)`` (the
    position rows of these T positions). Returns ``e (B*T, C)``. The lookup is a one-hot
    matmul, which every namespace and Dask chunking supports and which is exact (one
    non-zero term per output).
    """
    xp = array_namespace(tokens, wte, wpe_rows)
    b, t = tokens.shape
    onehot = xp.reshape(one_hot(tokens, wte.shape[0], wte.dtype), (b * t, wte.shape[0]))
    e = xp.reshape(xp.reshape(onehot @ wte, (b, t, -1)) + wpe_rows, (b * t, wte.shape[1]))
    return e, (onehot, b, t)


def embedding_backward(de: Array, cache: Any) -> tuple[Array, Array]:
    """``de (B*T, C)`` -> ``(dwte (V, C), dwpe_rows (T, C))``.

    ``dwte`` is the scatter-add of ``de`` into the rows of the used tokens, computed as
    ``onehot.T @ de``; rows of unused tokens are exactly zero.
    """
    xp = array_namespace(de)
    onehot, b, t = cache
    dwte = xp.matrix_transpose(onehot) @ de
    dwpe_rows = xp.sum(xp.reshape(de, (b, t, de.shape[-1])), axis=0)
    return dwte, dwpe_rows


# -- linear ---------------------------------------------------------------------------
def linear_forward(x: Array, w: Array) -> tuple[Array, Any]:
    """``y = x @ w.T`` for ``x (N, n_in)`` and ``w (n_out, n_in)``; returns ``y (N, n_out)``."""
    xp = array_namespace(x, w)
    return x @ xp.matrix_transpose(w), (x, w)


def linear_backward(dy: Array, cache: Any) -> tuple[Array, Array]:
    """``dy (N, n_out)`` -> ``(dx (N, n_in), dw (n_out, n_in))``."""
    xp = array_namespace(dy)
    x, w = cache
    return dy @ w, xp.matrix_transpose(dy) @ x


# -- rmsnorm --------------------------------------------------------------------------
def rmsnorm_forward(x: Array) -> tuple[Array, Any]:
    """RMSNorm without gain over the last axis: ``y = x * (mean(x²) + 1e-5) ** -0.5``.

    ``x (N, C)`` -> ``y (N, C)``. The mean is ``sum * (1/C)`` and the scale uses
    ``** -0.5`` as the original does.
    """
    xp = array_namespace(x)
    ms = xp.sum(x * x, axis=-1, keepdims=True) * (1.0 / x.shape[-1])
    s = (ms + RMSNORM_EPS) ** -0.5
    return x * s, (x, s)


def rmsnorm_backward(dy: Array, cache: Any) -> Array:
    """``dy (N, C)`` -> ``dx (N, C)``: ``dx = s·dy − (s³/C)·x·Σ(dy·x)``."""
    xp = array_namespace(dy)
    x, s = cache
    dot = xp.sum(dy * x, axis=-1, keepdims=True)
    return s * dy - (s * s * s * (1.0 / x.shape[-1])) * dot * x


# -- relu -----------------------------------------------------------------------------
def relu_forward(x: Array) -> tuple[Array, Any]:
    """``max(0, x)`` elementwise; the cache is the 0/1 mask (the derivative, 0 at 0)."""
    xp = array_namespace(x)
    mask = xp.astype(x > 0, x.dtype)
    return x * mask, mask


def relu_backward(dy: Array, cache: Any) -> Array:
    """``dy`` -> ``dy * mask``."""
    return dy * cache


# -- softmax and attention ----------------------------------------------------------------
def softmax(z: Array) -> Array:
    """Softmax over the last axis as the original computes it: ``e * (Σe)**-1`` with
    ``e = exp(z - max(z))``. Entries of ``-inf`` get probability 0."""
    xp = array_namespace(z)
    e = xp.exp(z - xp.max(z, axis=-1, keepdims=True))
    return e * xp.sum(e, axis=-1, keepdims=True) ** -1


def causal_bias(t: int, like: Array) -> Array:
    """``(T, T)`` additive mask: 0 where key ≤ query (the diagonal included), ``-inf`` above.

    Created on ``like``'s device with its dtype.
    """
    xp = array_namespace(like)
    pos = xp.arange(t, device=device(like))
    zero = xp.zeros((t, t), dtype=like.dtype, device=device(like))
    return xp.where(pos[:, None] >= pos[None, :], zero, zero - xp.inf)


def split_heads(x: Array, b: int, t: int, n_head: int) -> Array:
    """``(B*T, C)`` -> ``(B, H, T, D)``."""
    xp = array_namespace(x)
    return xp.permute_dims(xp.reshape(x, (b, t, n_head, x.shape[-1] // n_head)), (0, 2, 1, 3))


def merge_heads(x: Array) -> Array:
    """``(B, H, T, D)`` -> ``(B*T, C)``: head outputs concatenated in head order."""
    xp = array_namespace(x)
    b, h, t, d = x.shape
    return xp.reshape(xp.permute_dims(x, (0, 2, 1, 3)), (b * t, h * d))


def attend_forward(q: Array, k: Array, v: Array, bias: Array | None) -> tuple[Array, Any]:
    """Scaled dot-product attention for ``q (B, H, Tq, D)`` over ``k, v (B, H, Tk, D)``.

    ``scores = q @ k.T * D**-0.5 + bias`` (bias ``(Tq, Tk)`` of 0/−inf, or ``None`` when
    every key is visible), ``att = softmax(scores)``, returns ``att @ v (B, H, Tq, D)``.
    """
    xp = array_namespace(q, k, v)
    scale = float(q.shape[-1]) ** -0.5
    scores = (q @ xp.matrix_transpose(k)) * scale
    if bias is not None:
        scores = scores + bias
    att = softmax(scores)
    return att @ v, (q, k, v, att, scale)


def attend_backward(dy: Array, cache: Any) -> tuple[Array, Array, Array]:
    """``dy (B, H, Tq, D)`` -> ``(dq, dk, dv)`` with the shapes of ``q, k, v``."""
    xp = array_namespace(dy)
    q, k, v, att, scale = cache
    datt = dy @ xp.matrix_transpose(v)
    dv = xp.matrix_transpose(att) @ dy
    dscores = att * (datt - xp.sum(datt * att, axis=-1, keepdims=True)) * scale
    return dscores @ k, xp.matrix_transpose(dscores) @ q, dv


def causal_attention_forward(qkv: Array, b: int, t: int, n_head: int) -> tuple[Array, Any]:
    """Causal multi-head self-attention over fused projections.

    ``qkv (B*T, 3C)`` holds ``q | k | v`` side by side; returns ``(B*T, C)``. Position
    ``t`` attends to positions ``0..t`` (itself included). Right-padding never reaches a
    real position, because padding only ever comes after it.
    """
    c = qkv.shape[-1] // 3
    q, k, v = (split_heads(qkv[:, i * c : (i + 1) * c], b, t, n_head) for i in range(3))
    y, cache = attend_forward(q, k, v, causal_bias(t, qkv))
    return merge_heads(y), cache


def causal_attention_backward(dy: Array, cache: Any) -> Array:
    """``dy (B*T, C)`` -> ``dqkv (B*T, 3C)``."""
    xp = array_namespace(dy)
    q = cache[0]
    b, h, t, _ = q.shape
    dq, dk, dv = attend_backward(split_heads(dy, b, t, h), cache)
    return xp.concat([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)


# -- cross-entropy ----------------------------------------------------------------------
def cross_entropy_forward(logits: Array, targets: Array) -> tuple[Array, Any]:
    """Per-position ``−log softmax(logits)[target]``, taking the log of the probability
    as the original does.

    ``logits (N, V)``, ``targets (N,)`` integer ids -> ``losses (N,)``.
    """
    xp = array_namespace(logits, targets)
    p = softmax(logits)
    onehot = one_hot(targets, logits.shape[-1], logits.dtype)
    return -xp.log(xp.sum(p * onehot, axis=-1)), (p, onehot)


def cross_entropy_backward(dlosses: Array, cache: Any) -> Array:
    """``dlosses (N,)`` (the weight of each position in the total loss) ->
    ``dlogits (N, V) = (p − onehot(target)) * dlosses``."""
    p, onehot = cache
    return (p - onehot) * dlosses[:, None]
