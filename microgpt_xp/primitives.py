"""The operations whose best form differs between array namespaces, each in one place.

Every function here has a generic version written with standard Array API calls, which
is what every namespace runs unless an override for it is listed below. An override is a
native form for one namespace, kept only where a measurement on that namespace shows it
pays (docs/performance.md has the figures), in the style of array-api-extra's
``_delegation.py``: the function looks at the namespace of its inputs and either calls
the override or falls through to the generic code. ``layers.py`` and ``model.py`` call
the standard API and this module only; no other module of the model names a backend.

Overrides:

- **NumPy** (one core for elementwise work and reductions, BLAS for products): NumPy
  reduces a short contiguous last axis (16 or 27 long) one row at a time, at several
  times the cost of the rest of a softmax or a norm; a product with a column of ones
  sums rows at BLAS speed, and a max over the middle axis of a relaid copy runs as
  vectorized elementwise maxima. Batched products are several times faster with a
  row-major second operand, BLAS prefers the longer side first in a weight gradient,
  a scatter-add is fastest as a one-hot product, and running sums over the leading
  axis as a product with a triangular matrix of ones. NumPy's products are always
  computed in the arrays' precision, so these tricks cost no accuracy there.
- **PyTorch, JAX, CuPy**: the scatter-add of the embedding gradient uses the library's
  own indexed add (``index_add``, ``.at[].add``, ``cupyx.scatter_add``) instead of a
  one-hot product, which would also be rounded to TF32/bfloat16 where products may be.
- **Dask**: zero-padding rows keeps the single chunk of a weight's gradient.

Precision: the reductions that define the math (RMSNorm's mean square, softmax
denominators, the loss, Adam's moments) never go through a product on a namespace whose
product precision can be lowered (TF32 on CUDA, JAX's default precision on GPUs and
TPUs): only the NumPy overrides use products for sums.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
from array_api_compat import device

from ._xp import array_namespace

Array = Any


def _is_numpy(xp: Any) -> bool:
    return bool(array_api_compat.is_numpy_namespace(xp))


# -- reductions over the last axis -----------------------------------------------------------
def sum_last(x: Array) -> Array:
    """``(…, n)`` -> ``(…, 1)``: the sum over the last axis.

    NumPy: ``x @ ones((n, 1))`` (for 2-d ``x`` two columns of ones, of which the first is
    kept: BLAS rounds a matrix-vector product of a row differently depending on how many
    rows there are, and a matrix-matrix product does not, so a row's sum does not depend
    on its batch).
    """
    xp = array_namespace(x)
    if _is_numpy(xp):
        cols = 2 if x.ndim == 2 else 1
        return (x @ full((x.shape[-1], cols), 1.0, x))[..., :1]
    return xp.sum(x, axis=-1, keepdims=True)


def max_last(x: Array) -> Array:
    """``(…, n)`` -> ``(…, 1)``: the max over the last axis (exact, NaN-propagating).

    NumPy, for ``x.ndim >= 3``: over axis 1 of a ``(B, n, M)`` copy (``M`` the product of
    the middle axes) by halving: each step takes the elementwise maximum of the first and
    the last ``ceil(n/2)`` rows, so every comparison runs over ``M`` contiguous values.
    """
    xp = array_namespace(x)
    if not _is_numpy(xp) or x.ndim < 3:
        return xp.max(x, axis=-1, keepdims=True)
    b, n = x.shape[0], x.shape[-1]
    mid = tuple(x.shape[1:-1])
    moved = xp.permute_dims(x, (0, x.ndim - 1, *range(1, x.ndim - 1)))
    # merging (B, n) cannot be a view of the permuted strides, so this is the copy
    relaid = xp.reshape(xp.reshape(moved, (b * n, math.prod(mid))), (b, n, -1))
    while n > 1:
        half = (n + 1) // 2
        relaid = xp.maximum(relaid[:, :half, :], relaid[:, n - half :, :])
        n = half
    return xp.reshape(relaid, (b, *mid, 1))


# -- products ----------------------------------------------------------------------------
def matmul_nt(a: Array, b: Array) -> Array:
    """``a @ b.mT`` for stacks of matrices ``a (…, m, k)``, ``b (…, n, k)`` -> ``(…, m, n)``.

    NumPy: ``b.mT`` is laid out row-major first (a copy), because NumPy's batched matmul
    is several times slower when its second operand is a transposed view.
    """
    xp = array_namespace(a, b)
    if not _is_numpy(xp):
        return a @ xp.matrix_transpose(b)
    *lead, n, k = b.shape
    flat = xp.reshape(xp.matrix_transpose(b), (*lead, k * n))
    return a @ xp.reshape(flat, (*lead, k, n))


def weight_grad(dy: Array, x: Array) -> Array:
    """The gradient of a linear layer's weight, ``dy.T @ x`` for ``dy (N, n_out)``,
    ``x (N, n_in)`` -> ``(n_out, n_in)``.

    NumPy: computed as ``(x.T @ dy).T`` when ``n_in > n_out``: BLAS is up to twice as fast
    with the longer side first (the same sums either way).
    """
    xp = array_namespace(dy, x)
    mt = xp.matrix_transpose
    if _is_numpy(xp) and dy.shape[-1] < x.shape[-1]:
        return mt(mt(x) @ dy)
    return mt(dy) @ x


# -- indexing and scatter ---------------------------------------------------------------------
def one_hot(ids: Array, num_classes: int, dtype: Any, *, axis: int = -1) -> Array:
    """``(…,)`` integer ids -> ``(…, num_classes)`` one-hot rows of ``dtype``, on the ids'
    device; with ``axis=0``, 1-d ``ids (N,)`` -> ``(num_classes, N)`` one-hot columns."""
    xp = array_namespace(ids)
    classes = arange(num_classes, ids, dtype=ids.dtype)
    if axis == 0:
        return xp.astype(classes[:, None] == ids[None, :], dtype)
    return xp.astype(ids[..., None] == classes, dtype)


# -- creation --------------------------------------------------------------------------------
def arange(n: int, like: Array, *, dtype: Any = None) -> Array:
    """``arange(n)`` of ``dtype`` (default: the namespace's default integer dtype) on
    ``like``'s device. Dask: one chunk, of the same array type as ``like``'s chunks
    (NumPy, CuPy, ...), so that nothing is created on the host for GPU chunks."""
    xp = array_namespace(like)
    if array_api_compat.is_dask_namespace(xp):
        import dask.array as da

        return da.arange(n, dtype=dtype, chunks=-1, like=like._meta)
    return xp.arange(n, dtype=dtype, device=device(like))


def full(shape: tuple[int, ...], value: float, like: Array, *, dtype: Any = None) -> Array:
    """An array of ``shape`` filled with ``value``, of ``dtype`` (default: ``like``'s) on
    ``like``'s device (Dask: one chunk of ``like``'s chunk type)."""
    xp = array_namespace(like)
    dtype = like.dtype if dtype is None else dtype
    if array_api_compat.is_dask_namespace(xp):
        import dask.array as da

        # full_like takes the chunk type from ``like`` (full(..., like=) is broken in
        # dask 2026.8: its blocks compute to a function)
        return da.full_like(like, value, dtype=dtype, shape=shape, chunks=-1)
    return xp.full(shape, value, dtype=dtype, device=device(like))


def scatter_add_rows(ids: Array, values: Array, num_rows: int) -> Array:
    """``out[i] = Σ values[j] over j with ids[j] == i`` for ``ids (N,)`` in ``[0,
    num_rows)`` and ``values (N, C)`` -> ``out (num_rows, C)``; rows no id names are exactly
    zero. The embedding's gradient.

    Generic (the standard has no scatter-add): ``one_hot(ids).T @ values``. PyTorch, JAX
    and CuPy: their own indexed add.
    """
    xp = array_namespace(ids, values)
    shape = (num_rows, values.shape[-1])
    if array_api_compat.is_torch_namespace(xp):
        return full(shape, 0.0, values).index_add(0, ids, values)
    if array_api_compat.is_jax_namespace(xp):
        return full(shape, 0.0, values).at[ids].add(values)
    if array_api_compat.is_cupy_namespace(xp):
        import cupyx

        out = full(shape, 0.0, values)
        cupyx.scatter_add(out, ids, values)
        return out
    return one_hot(ids, num_rows, values.dtype, axis=0) @ values


def pad_rows(x: Array, num_rows: int) -> Array:
    """``x (n, C)`` followed by zero rows up to ``(num_rows, C)``.

    Dask: the result is one chunk, as a weight's gradient must be (a concatenation would
    leave two, and the weight would then split every activation along the positions).
    """
    xp = array_namespace(x)
    if x.shape[0] == num_rows:
        return x
    padded = xp.concat([x, full((num_rows - x.shape[0], x.shape[1]), 0.0, x)], axis=0)
    if array_api_compat.is_dask_namespace(xp):
        return padded.rechunk(-1)
    return padded


# -- running sums ---------------------------------------------------------------------------
def cumulative_sum0(x: Array) -> Array:
    """Running sums over the leading axis of ``x (V, B)`` -> ``(V, B)``.

    NumPy: one product with a lower-triangular matrix of ones (``cumulative_sum`` over
    this axis costs several times more)."""
    xp = array_namespace(x)
    if _is_numpy(xp):
        ids = xp.arange(x.shape[0])
        return xp.astype(ids[:, None] >= ids[None, :], x.dtype) @ x
    return xp.cumulative_sum(x, axis=0)
