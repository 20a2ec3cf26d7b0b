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

from . import primitives as P
from ._xp import array_namespace

#: Added to the mean square in RMSNorm (the spec's 1e-5).
RMSNORM_EPS = 1e-5

Array = Any


# -- embedding ------------------------------------------------------------------------
def embedding_forward(tokens: Array, wte: Array, wpe_rows: Array) -> tuple[Array, Any]:
    """Token plus position embedding.

    ``tokens (B, T)`` integer ids in ``[0, V)``, ``wte (V, C)``, ``wpe_rows (T, C)`` (the
    position rows of these T positions). Returns ``e (B*T, C)``. The lookup is ``take``
    along the rows of ``wte`` (exact, and supported by every namespace, Dask included).
    """
    xp = array_namespace(tokens, wte, wpe_rows)
    b, t = tokens.shape
    rows = xp.take(wte, xp.reshape(tokens, (b * t,)), axis=0)
    e = xp.reshape(xp.reshape(rows, (b, t, -1)) + wpe_rows, (b * t, wte.shape[1]))
    return e, (tokens, wte.shape[0])


def embedding_backward(de: Array, cache: Any) -> tuple[Array, Array]:
    """``de (B*T, C)`` -> ``(dwte (V, C), dwpe_rows (T, C))``.

    ``dwte`` is the scatter-add of ``de`` into the rows of the used tokens
    (:func:`~microgpt_xp.primitives.scatter_add_rows`); rows of unused tokens are exactly
    zero.
    """
    xp = array_namespace(de)
    tokens, vocab = cache
    b, t = tokens.shape
    dwte = P.scatter_add_rows(xp.reshape(tokens, (b * t,)), de, vocab)
    dwpe_rows = xp.sum(xp.reshape(de, (b, t, de.shape[-1])), axis=0)
    return dwte, dwpe_rows


# -- linear ---------------------------------------------------------------------------
def linear_forward(x: Array, w: Array) -> tuple[Array, Any]:
    """``y = x @ w.T`` for ``x (N, n_in)`` and ``w (n_out, n_in)``; returns ``y (N, n_out)``."""
    xp = array_namespace(x, w)
    return x @ xp.matrix_transpose(w), (x, w)


def linear_backward(dy: Array, cache: Any) -> tuple[Array, Array]:
    """``dy (N, n_out)`` -> ``(dx (N, n_in), dw (n_out, n_in))``."""
    x, w = cache
    return dy @ w, P.weight_grad(dy, x)


def linear_t_forward(x: Array, w: Array) -> tuple[Array, Any]:
    """The transposed linear layer ``y_t = w @ x.T`` for ``x (N, n_in)``, ``w (n_out,
    n_in)``: returns ``y_t (n_out, N)``, one column per row of ``x`` (the layout of the
    logits for the loss, whose softmax then reduces over the leading axis)."""
    xp = array_namespace(x, w)
    return w @ xp.matrix_transpose(x), (x, w)


def linear_t_backward(dy_t: Array, cache: Any) -> tuple[Array, Array]:
    """``dy_t (n_out, N)`` -> ``(dx (N, n_in), dw (n_out, n_in))``."""
    xp = array_namespace(dy_t)
    x, w = cache
    return xp.matrix_transpose(dy_t) @ w, dy_t @ x


# -- rmsnorm --------------------------------------------------------------------------
def rmsnorm_forward(x: Array) -> tuple[Array, Any]:
    """RMSNorm without gain over the last axis: ``y = x * (mean(x²) + 1e-5) ** -0.5``.

    ``x (N, C)`` -> ``y (N, C)``. The mean is ``sum * (1/C)`` and the scale uses
    ``** -0.5`` as the original does.
    """
    ms = P.sum_last(x * x) * (1.0 / x.shape[-1])
    s = (ms + RMSNORM_EPS) ** -0.5
    return x * s, (x, s)


def rmsnorm_columns(x_t: Array) -> Array:
    """:func:`rmsnorm_forward` of each column of ``x_t (C, B)`` (decoding's layout, one
    column per sequence) -> ``(C, B)``; the mean square is a sum over the leading axis."""
    xp = array_namespace(x_t)
    ms = xp.sum(x_t * x_t, axis=0, keepdims=True) * (1.0 / x_t.shape[0])
    return x_t * (ms + RMSNORM_EPS) ** -0.5


def rmsnorm_backward(dy: Array, cache: Any) -> Array:
    """``dy (N, C)`` -> ``dx (N, C)``: ``dx = s·(dy − (s²/C)·Σ(dy·x)·x)``."""
    x, s = cache
    dot = P.sum_last(dy * x)
    return s * (dy - (s * s * (1.0 / x.shape[-1]) * dot) * x)


# -- relu -----------------------------------------------------------------------------
def relu_forward(x: Array) -> tuple[Array, Any]:
    """``max(0, x)`` elementwise; the cache holds the derivative, 1 where ``x > 0`` and 0
    elsewhere (0 at 0) (:func:`~microgpt_xp.primitives.relu`)."""
    return P.relu(x)


def relu_backward(dy: Array, cache: Any) -> Array:
    """``dy`` -> ``dy * mask``."""
    return P.relu_backward(dy, cache)


# -- softmax and attention ----------------------------------------------------------------
def softmax(z: Array, axis: int = -1) -> Array:
    """Softmax over ``axis`` (the last, or 0) as the original computes it: ``e * (Σe)**-1``
    with ``e = exp(z - max(z))``. Entries of ``-inf`` get probability 0
    (:func:`~microgpt_xp.primitives.softmax`)."""
    return P.softmax(z, axis)


def causal_bias(t: int, like: Array) -> Array:
    """``(T, T)`` additive mask: 0 where key ≤ query (the diagonal included), ``-inf`` above.

    Created on ``like``'s device with its dtype.
    """
    return P.causal_bias(t, like)


def split_heads(x: Array, b: int, t: int, n_head: int) -> Array:
    """``(B*T, C)`` -> ``(B, H, T, D)``."""
    return P.split_heads(x, b, t, n_head)


def merge_heads(x: Array) -> Array:
    """``(B, H, T, D)`` -> ``(B*T, C)``: head outputs concatenated in head order."""
    return P.merge_heads(x)


def attend_forward(q: Array, k: Array, v: Array, bias: Array | None) -> tuple[Array, Any]:
    """Scaled dot-product attention for ``q (B, H, Tq, D)`` over ``k, v (B, H, Tk, D)``.

    ``scores = (q * D**-0.5) @ k.T + bias`` (bias ``(Tq, Tk)`` of 0/−inf, or ``None`` when
    every key is visible), ``att = softmax(scores)``, returns ``att @ v (B, H, Tq, D)``.
    The scale goes on ``q``, a quarter of the size of the scores when ``Tk = 4 D``.
    """
    return P.attention(q, k, v, bias)


def attend_backward(dy: Array, cache: Any) -> tuple[Array, Array, Array]:
    """``dy (B, H, Tq, D)`` -> ``(dq, dk, dv)`` with the shapes of ``q, k, v``."""
    return P.attention_backward(dy, cache)


def causal_attention_forward(qkv: Array, b: int, t: int, n_head: int) -> tuple[Array, Any]:
    """Causal multi-head self-attention over fused projections.

    ``qkv (B*T, 3C)`` holds ``q | k | v`` side by side; returns ``(B*T, C)``. Position
    ``t`` attends to positions ``0..t`` (itself included). Right-padding never reaches a
    real position, because padding only ever comes after it. The math is
    :func:`attend_forward` over :func:`split_heads` with :func:`causal_bias`, then
    :func:`merge_heads` (:func:`~microgpt_xp.primitives.causal_attention`; NumPy lays the
    scores out for its reductions there).
    """
    return P.causal_attention(qkv, b, t, n_head)


def causal_attention_backward(dy: Array, cache: Any) -> Array:
    """``dy (B*T, C)`` -> ``dqkv (B*T, 3C)``."""
    return P.causal_attention_backward(dy, cache)


def decode_attention(
    q_t: Array, keys: Array, values: Array, n_head: int, visible: Array | None = None
) -> Array:
    """One query per sequence over the cached positions, in decoding's column layout:
    ``q_t (C, B)``, ``keys, values (P, C, B)`` (positions first) -> ``(C, B)``, the heads'
    outputs stacked in head order. ``visible (P,)``, where given, marks the positions to
    attend to (the others, e.g. cache slots not written yet, get weight exactly 0).

    The same attention as :func:`attend_forward` with ``Tq = 1``. With the batch along
    the last axis, a head's ``D`` channels are ``D`` contiguous planes of ``B`` values, so
    the scores are one product and a sum over the head-channel axis, the softmax runs
    over the leading position axis and the output is one product and a sum over
    positions: every step is a vectorized pass over the whole batch, summing in the
    original's order (channel by channel, position by position; the hidden positions
    add exact zeros after the visible ones).
    """
    xp = array_namespace(q_t, keys, values)
    c, b = q_t.shape
    p, d = keys.shape[0], c // n_head
    qs = q_t * float(d) ** -0.5
    scores = xp.sum(xp.reshape(keys * qs, (p, n_head, d, b)), axis=2)  # (P, H, B)
    if visible is not None:
        scores = xp.where(visible[:, None, None], scores, xp.full_like(scores, -xp.inf))
    att = softmax(scores, axis=0)
    y = xp.sum(att[:, :, None, :] * xp.reshape(values, (p, n_head, d, b)), axis=0)
    return xp.reshape(y, (c, b))


# -- cross-entropy ----------------------------------------------------------------------
def cross_entropy_forward(
    logits_t: Array, targets: Array, valid: Array | None = None
) -> tuple[Array, Any]:
    """Per-position ``−log softmax(logits)[target]``, computed stably as
    ``log Σ exp(z − max z) − (z[target] − max z)``.

    ``logits_t (V, N)`` (one column per position, see :func:`linear_t_forward`),
    ``targets (N,)`` integer ids -> ``losses (N,)``. In this layout the max, the sum and
    the pick of the target run over the leading axis, a vectorized pass per id. Taking the
    log of the probability, as the original does, gives ``inf`` once the target's
    probability underflows (a logit ~104 below the max in float32), while the true loss is
    finite; this form never does, and in float64 it prints the original's losses.
    ``valid (N,)``, where given, marks real positions with a nonzero value: the others
    (padding) get loss 0 whatever the model predicts there.
    """
    return P.cross_entropy(logits_t, targets, valid)


def cross_entropy_backward(dlosses: Array, cache: Any) -> Array:
    """``dlosses (N,)`` (the weight of each position in the total loss) ->
    ``dlogits_t (V, N) = (p − onehot(target)) * dlosses``."""
    return P.cross_entropy_backward(dlosses, cache)
