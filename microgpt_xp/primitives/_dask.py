"""Dask's overrides: created arrays are one chunk of the inputs' chunk type (NumPy, CuPy)."""

from __future__ import annotations

from typing import Any

import dask.array as da

from . import _generic


def arange(n: int, like: Any, *, dtype: Any = None) -> Any:
    """``arange(n)`` in one chunk of ``like``'s chunk type."""
    return da.arange(n, dtype=dtype, chunks=-1, like=like._meta)


def full(shape: tuple[int, ...], value: float, like: Any, *, dtype: Any = None) -> Any:
    """``full`` in one chunk of ``like``'s chunk type (``full_like`` takes the chunk type
    from ``like``; ``full(..., like=)`` is broken in dask 2026.8: its blocks compute to a
    function)."""
    dtype = like.dtype if dtype is None else dtype
    return da.full_like(like, value, dtype=dtype, shape=shape, chunks=-1)


def positions(x: Any, axis: int = 1) -> Any:
    """The int64 ``arange`` of the length of ``axis``, in one chunk of ``x``'s chunk type."""
    return arange(x.shape[axis], x, dtype="int64")


def merge_heads(y: Any, n_head: int) -> Any:
    """The generic concatenation, rechunked to one chunk along the channels (not one per head)."""
    merged = _generic.merge_heads.__wrapped__(y, n_head)  # type: ignore[attr-defined]
    return merged.rechunk({y.ndim - 2: -1})
