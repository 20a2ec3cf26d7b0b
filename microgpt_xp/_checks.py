"""Checks of a batch before any model code runs: integer arrays of the params' namespace and
device, 2-d tokens, known sizes; where values can be read, ids in ``[0, V)`` at real positions
and lengths in range (on Dask, part of the graph; on tracers and symbolic arrays, none)."""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from . import _xp
from . import primitives as P
from ._errors import ArgumentTypeError, ArgumentValueError
from ._xp import array_namespace
from .params import Params

Array = Any


def check_reduction(reduction: str) -> None:
    """``ArgumentValueError`` unless ``reduction`` is ``"mean"`` or ``"token_mean"``."""
    if reduction not in ("mean", "token_mean"):
        raise ArgumentValueError(
            "reduction", f"reduction must be 'mean' or 'token_mean', got {reduction!r}"
        )


def _check_array(params: Params, name: str, a: Array) -> Any:
    """The namespace of ``a`` once it is an integer array of the params' namespace and device."""
    ours, theirs = (f"{type(x).__module__}.{type(x).__name__}" for x in (params.wte, a))
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        why = f"{name} must be an array of the params' namespace ({ours}), got {theirs}"
        raise ArgumentTypeError(name, why)
    try:
        xp = array_namespace(a, params.wte)
    except TypeError:
        why = f"{name} and params are arrays of different namespaces ({name}: {theirs}, params: {ours})"
        raise ArgumentTypeError(name, why) from None
    # traced (jax.jit) arrays have no device; they are placed by the tracer
    where, home = device(a), params.device
    if where is not None and home is not None and str(where) != str(home):
        raise ArgumentValueError(name, f"{name} is on device {where} but params are on {home}")
    if not _xp.is_integral(xp, a.dtype):
        raise ArgumentTypeError(name, f"{name} must have an integer dtype, got {a.dtype}")
    return xp


def check_tokens(
    params: Params, tokens: Array, lengths: Array | None, *, max_len: int, min_length: int
) -> tuple[Array, Array | None]:
    """``tokens (B, T)`` and ``lengths (B,)`` (``None``: rows of ``T``) checked (the
    module's docstring), on Dask with their value checks attached."""
    xp = _check_array(params, "tokens", tokens)
    if tokens.ndim != 2:
        raise ArgumentValueError(
            "tokens", f"tokens must be 2-d (batch, time), got shape {tuple(tokens.shape)}"
        )
    b, t = tokens.shape
    if b == 0:
        raise ArgumentValueError(
            "tokens", f"an empty batch: tokens of shape {tuple(tokens.shape)} hold no rows"
        )
    if isinstance(t, int) and t > max_len:
        raise ArgumentValueError(
            "tokens", f"sequence length {t} exceeds the model's limit {max_len}"
        )
    if isinstance(t, int) and t < min_length:
        raise ArgumentValueError("tokens", f"sequences need at least {min_length} tokens, got {t}")
    if lengths is not None:
        _check_array(params, "lengths", lengths)
        if lengths.ndim != 1 or (
            isinstance(b, int) and isinstance(lengths.shape[0], int) and lengths.shape[0] != b
        ):
            raise ArgumentValueError(
                "lengths",
                f"lengths must have shape ({b},) to match tokens, got {tuple(lengths.shape)}",
            )
    if _xp.is_lazy(tokens) or (lengths is not None and _xp.is_lazy(lengths)):
        return _attach_checks(params, tokens, lengths, min_length)
    _check_values(xp, params.config.vocab_size, tokens, lengths, min_length)
    return tokens, lengths


def _check_values(
    xp: Any, vocab: int, tokens: Array, lengths: Array | None, min_length: int
) -> None:
    b, t = tokens.shape
    if not (isinstance(b, int) and isinstance(t, int)):
        return  # symbolic arrays: their values are not there to read
    if lengths is not None:
        out = _xp.read_scalar(xp.any((lengths < min_length) | (lengths > t)), bool)
        if out:
            raise ArgumentValueError(
                "lengths",
                f"lengths must lie in [{min_length}, {t}] for tokens of shape "
                f"{tuple(tokens.shape)}, got min {int(xp.min(lengths))} max {int(xp.max(lengths))}",
            )
    # cheap first: only look for the position when some id is out of range
    if not _xp.read_scalar(xp.any((tokens < 0) | (tokens >= vocab)), bool):
        return
    bad = (tokens < 0) | (tokens >= vocab)
    if lengths is not None:  # out-of-range ids are allowed in the padding
        bad = bad & (P.positions(tokens)[None, :] < lengths[:, None])
    flat = xp.reshape(bad, (-1,))
    if not bool(xp.any(flat)):
        return
    index = int(xp.argmax(xp.astype(flat, xp.int8)))
    row, col = divmod(index, t)
    raise ArgumentValueError(
        "tokens",
        f"token id {int(xp.reshape(tokens, (-1,))[index])} at [{row}, {col}] is outside [0, {vocab})",
    )


def _attach_checks(
    params: Params, tokens: Array, lengths: Array | None, min_length: int
) -> tuple[Array, Array | None]:
    vocab = params.config.vocab_size
    b, t = tokens.shape
    attach = _xp.entry(_xp.backend_of(tokens)).attach_check
    if attach is None:
        return tokens, lengths
    tokens = attach(
        tokens,
        lambda blk: bool(((blk >= 0) & (blk < vocab)).all()) if blk.size else True,
        "tokens",
        f"token ids must lie in [0, {vocab}) (padding included, on lazy arrays)",
    )
    if lengths is not None:
        lengths = attach(
            lengths,
            lambda blk: bool(((blk >= min_length) & (blk <= t)).all()) if blk.size else True,
            "lengths",
            f"lengths must lie in [{min_length}, {t}] for tokens of shape {(b, t)} (on lazy arrays)",
        )
    return tokens, lengths
