"""The model's blocks as forward/backward pairs (llm.c's style): ``*_forward`` returns ``(out,
cache)``, ``*_backward(dout, cache)`` the input gradients. Nothing mutated, no value branched
on: runs eagerly, lazily, traced and symbolically. ``V`` vocab, ``H`` heads, ``D`` head size."""

from __future__ import annotations

from typing import Any

from . import primitives as P
from ._xp import array_namespace

#: Added to the mean square in RMSNorm (the spec's 1e-5).
RMSNORM_EPS = 1e-5

Array = Any


def embedding_forward(
    tokens: Array, wte: Array, wpe: Array, positions: Array | None = None
) -> tuple[Array, Any]:
    """``e (B, T, C)``, ``wte[tokens[b, t]] + wpe[t]`` (exact lookups) of ``tokens (B, T)``
    ids in ``[0, V)``, ``wte (V, C)`` and ``wpe (block_size, C)``; packed rows: ``wpe[
    positions[b, t]]``, ``positions (B, T)`` each token's position in its document."""
    xp = array_namespace(tokens, wte, wpe)
    if positions is not None:
        e = P.embed(tokens, wte) + P.embed(positions, wpe)
        return e, (tokens, positions, wte.shape[0], wpe.shape[0])
    pos = P.positions(tokens)
    e = P.embed(tokens, wte) + xp.take(wpe, pos, axis=0)
    return e, (tokens, pos, wte.shape[0], wpe.shape[0])


def embedding_backward(de: Array, cache: Any) -> tuple[Array, Array]:
    """``de (B, T, C)`` -> ``(dwte (V, C), dwpe (block_size, C))`` by scatter-adds (``wpe``'s
    by the positions of packed rows); rows not used are exactly zero."""
    xp = array_namespace(de)
    tokens, pos, vocab, block_size = cache
    c = de.shape[-1]
    dwte = P.scatter_add_rows(xp.reshape(tokens, (-1,)), xp.reshape(de, (-1, c)), vocab)
    if pos.ndim == 2:  # packed rows: (B, T) positions
        dwpe = P.scatter_add_rows(xp.reshape(pos, (-1,)), xp.reshape(de, (-1, c)), block_size)
    else:
        dwpe = P.scatter_add_rows(pos, xp.sum(de, axis=0), block_size)
    return dwte, dwpe


def linear_forward(x: Array, w: Array) -> tuple[Array, Any]:
    """``y = x @ w.T`` for ``x (…, n_in)`` and ``w (n_out, n_in)``: ``y (…, n_out)``."""
    return P.linear(x, w), (x, w)


def linear_backward(dy: Array, cache: Any) -> tuple[Array, Array]:
    """``dy (…, n_out)`` -> ``(dx (…, n_in), dw (n_out, n_in))``."""
    x, w = cache
    return P.linear_input_grad(dy, w), P.weight_grad(dy, x)


def rmsnorm_forward(x: Array, size: int) -> tuple[Array, Any]:
    """RMSNorm without gain, ``x * (sum(x²) * (1/C) + 1e-5) ** -0.5``: ``x (…, C)`` -> ``(…, C)``,
    ``C = size``; the scale ``s (…,)`` one per row, applied by ``scale_rows`` (ONNX runtimes
    are slow on a length-1 axis)."""
    ms = P.sum_last(x * x)[..., 0] * (1.0 / size)
    s = P.rsqrt(ms + RMSNORM_EPS)
    return P.scale_rows(x, s), (x, s, size)


def rmsnorm_columns(x_t: Array, size: int) -> Array:
    """:func:`rmsnorm_forward` of each column of ``x_t (C, B)`` (decoding's layout)."""
    ms = P.sum_first(x_t * x_t) * (1.0 / size)
    return x_t * P.rsqrt(ms + RMSNORM_EPS)


def rmsnorm_backward(dy: Array, cache: Any) -> Array:
    """``dy (…, C)`` -> ``dx (…, C)``: ``dx = s·(dy − (s²/C)·Σ(dy·x)·x)``."""
    x, s, size = cache
    dot = P.sum_last(dy * x)[..., 0]
    return P.scale_rows(dy - P.scale_rows(x, s * s * (1.0 / size) * dot), s)


def decode_attention(
    q_t: Array, keys: Array, values: Array, seen: Any, *, n_head: int, head_dim: int
) -> Array:
    """One query per sequence over the cache: ``q_t (C, B)``, ``keys, values (P, C, B)`` ->
    ``(C, B)``. ``seen`` from :func:`~microgpt_xp.primitives.cache_write`: an int ``n`` (slots
    ``0..n-1``), a ``(P,)`` mask (hidden slots add exact zeros: the same sums) or ``None``
    (every slot); ``P`` may be unknown."""
    xp = array_namespace(q_t, keys, values)
    if isinstance(seen, int):
        keys, values = keys[:seen, ...], values[:seen, ...]
    d = head_dim
    qs = q_t * float(d) ** -0.5
    scores = xp.sum(P.slot_heads(keys * qs, n_head, d), axis=2)  # (P, H, B)
    if seen is not None and not isinstance(seen, int):
        scores = xp.where(seen[:, None, None], scores, xp.full_like(scores, -xp.inf))
    att = P.softmax(scores, axis=0)
    y = P.sum_first(att[:, :, None, :] * P.slot_heads(values, n_head, d))[0, ...]
    return xp.reshape(y, (n_head * d, -1))
