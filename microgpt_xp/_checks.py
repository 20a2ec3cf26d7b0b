"""Checks of a batch at the edge of the model, done once before any model code runs.

Eager arrays are checked on the host (their values copied there); lazy ones get their
value checks attached to the graph (Dask) or skipped (traced arrays under ``jax.jit``,
whose values are not known), so that nothing inside a step reads values to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import device

from . import _xp
from . import primitives as P
from ._xp import array_namespace
from .params import Params

Array = Any


def _check_same_place(params: Params, arrays: dict[str, Array]) -> Any:
    for name, a in arrays.items():
        try:
            xp = array_namespace(a, params.wte)
        except TypeError as exc:
            raise TypeError(
                f"{name} and params are arrays of different namespaces "
                f"({type(a).__module__}.{type(a).__name__} vs {params.backend}): {exc}"
            ) from exc
        # traced (jax.jit) arrays have no device; they are placed by the tracer
        if (
            device(a) is not None
            and params.device is not None
            and str(device(a)) != str(params.device)
        ):
            raise ValueError(f"{name} is on device {device(a)} but params are on {params.device}")
    return xp


def _eager_values(x: Array) -> np.ndarray | None:
    """Host values of an eager array for validation; ``None`` for lazy arrays."""
    if _xp.is_lazy(x):
        return None
    return _xp.to_numpy(x)


def check_tokens(
    params: Params, tokens: Array, lengths: Array | None, *, max_len: int, min_length: int
) -> tuple[Array, Array]:
    """Validate ``tokens (B, T)`` / ``lengths (B,)`` and return them (lengths filled in).

    Value checks (ids in range, lengths that fit) run on eager arrays; on Dask they are
    attached to the graph and raise when computed.
    """
    if not hasattr(tokens, "shape") or not hasattr(tokens, "dtype"):
        raise TypeError(f"tokens must be an array, got {type(tokens).__name__}")
    xp = _check_same_place(params, {"tokens": tokens})
    if not _xp.is_integral(xp, tokens.dtype):
        raise TypeError(f"tokens must have an integer dtype, got {tokens.dtype}")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be 2-d (batch, time), got shape {tuple(tokens.shape)}")
    b, t = tokens.shape
    if b == 0:
        raise ValueError(f"an empty batch: tokens of shape {tuple(tokens.shape)} hold no rows")
    if t > max_len:
        raise ValueError(f"sequence length {t} exceeds the model's limit {max_len}")
    if t < min_length:
        raise ValueError(f"sequences need at least {min_length} tokens, got {t}")
    if lengths is None:
        lengths = P.full((b,), t, tokens)
    else:
        _check_same_place(params, {"lengths": lengths})
        if not _xp.is_integral(xp, lengths.dtype):
            raise TypeError(f"lengths must have an integer dtype, got {lengths.dtype}")
        if tuple(lengths.shape) != (b,):
            raise ValueError(
                f"lengths must have shape ({b},) to match tokens, got {tuple(lengths.shape)}"
            )
    vocab = params.config.vocab_size
    tok_host, len_host = _eager_values(tokens), _eager_values(lengths)
    if (
        len_host is not None
        and len_host.size
        and (len_host.min() < min_length or len_host.max() > t)
    ):
        raise ValueError(
            f"lengths must lie in [{min_length}, {t}] for tokens of shape {(b, t)}, "
            f"got min {len_host.min()} max {len_host.max()}"
        )
    if (
        tok_host is not None
        and len_host is not None
        and tok_host.size
        and (tok_host.min() < 0 or tok_host.max() >= vocab)
    ):
        # out-of-range ids are allowed in the padding: look for one at a real position
        real = np.arange(t)[None, :] < len_host[:, None]
        bad = real & ((tok_host < 0) | (tok_host >= vocab))
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ValueError(
                f"token id {tok_host[row, col]} at [{row}, {col}] is outside [0, {vocab})"
            )
    if _xp.is_lazy(tokens) or _xp.is_lazy(lengths):
        tokens = _xp.lazy_value_check(
            tokens,
            lambda blk: bool(((blk >= 0) & (blk < vocab)).all()) if blk.size else True,
            f"token ids must lie in [0, {vocab}) (padding included, on lazy arrays)",
        )
        lengths = _xp.lazy_value_check(
            lengths,
            lambda blk: bool(((blk >= min_length) & (blk <= t)).all()) if blk.size else True,
            f"lengths must lie in [{min_length}, {t}] for tokens of shape {(b, t)} (on lazy arrays)",
        )
    return tokens, lengths
