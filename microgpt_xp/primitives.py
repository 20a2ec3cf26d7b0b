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
  computed in the arrays' precision, so these tricks cost no accuracy there. Causal
  attention lays its scores out ``(H, Tk, B, Tq)``, so that the softmax and its backward
  reduce over a leading axis, and writes its products' results in place
  (:func:`causal_attention`). One-hot matrices are zeros with ones written at flat
  indices, and the loss picks its targets' entries by indexing (:func:`one_hot`,
  :func:`cross_entropy`). Constants (the ones of :func:`sum_last`, aranges, the causal
  mask) are cached read-only arrays, built once per shape and dtype. Only plain
  ``numpy.ndarray`` inputs take these overrides (a subclass, a Dask array or a CuPy
  array takes the generic code).
- **PyTorch**: causal attention with torch's fused softmax and softmax backward
  (``torch.softmax``, ``torch._softmax_backward_data``: one kernel each, where the
  generic softmax is six and its backward four) and the mask added in place; the loss
  with ``log_softmax``, ``gather`` and ``scatter_add_`` (:func:`cross_entropy`); ReLU
  with ``torch.relu`` and ``threshold_backward`` (:func:`relu`).
- **PyTorch, JAX, CuPy**: the scatter-add of the embedding gradient uses the library's
  own indexed add (``index_add``, ``.at[].add``, ``cupyx.scatter_add``) instead of a
  one-hot product, which would also be rounded to TF32/bfloat16 where products may be.
- **Dask**: zero-padding rows keeps the single chunk of a weight's gradient.
- **CuPy** has no fused kernels here: it runs the generic code (no GPU was at hand to
  measure one on).

Precision: the reductions that define the math (RMSNorm's mean square, softmax
denominators, the loss, Adam's moments) never go through a product on a namespace whose
product precision can be lowered (TF32 on CUDA, JAX's default precision on GPUs and
TPUs): only the NumPy overrides use products for sums.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import array_api_compat
import numpy as np
from array_api_compat import device

from ._xp import array_namespace

Array = Any


def _is_numpy(xp: Any) -> bool:
    return bool(array_api_compat.is_numpy_namespace(xp))


def _all_numpy(*arrays: Any) -> bool:
    """Whether every argument is exactly a NumPy ndarray (not a subclass, not a chunk
    stand-in): what the NumPy overrides take."""
    return all(type(a) is np.ndarray for a in arrays)


# -- reductions over the last axis -----------------------------------------------------------
def sum_last(x: Array) -> Array:
    """``(…, n)`` -> ``(…, 1)``: the sum over the last axis.

    NumPy: ``x @ ones((n, 1))`` (for 2-d ``x`` two columns of ones, of which the first is
    kept: BLAS rounds a matrix-vector product of a row differently depending on how many
    rows there are, and a matrix-matrix product does not, so a row's sum does not depend
    on its batch). The columns of ones are a cached read-only constant.
    """
    if type(x) is np.ndarray:
        return (x @ _numpy_ones(x.shape[-1], 2 if x.ndim == 2 else 1, x.dtype))[..., :1]
    xp = array_namespace(x)
    return xp.sum(x, axis=-1, keepdims=True)


@functools.lru_cache(maxsize=16)
def _numpy_ones(n: int, cols: int, dtype: Any) -> Any:
    """A read-only ``(n, cols)`` NumPy array of ones (an eager constant)."""
    ones = np.ones((n, cols), dtype)
    ones.flags.writeable = False
    return ones


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
    device; with ``axis=0``, 1-d ``ids (N,)`` -> ``(num_classes, N)`` one-hot columns.

    NumPy, for ids in ``[0, num_classes)`` (what the model passes; the generic code gives
    a row of zeros for an id outside): zeros with a 1 written at each id's flat index,
    instead of comparing every id with every class and converting the booleans.
    """
    if _all_numpy(ids):
        return _numpy_one_hot(ids, num_classes, dtype, axis)
    return _one_hot(ids, num_classes, dtype, axis)


def _one_hot(ids: Array, num_classes: int, dtype: Any, axis: int) -> Array:
    """The generic :func:`one_hot`."""
    xp = array_namespace(ids)
    classes = arange(num_classes, ids, dtype=ids.dtype)
    if axis == 0:
        return xp.astype(classes[:, None] == ids[None, :], dtype)
    return xp.astype(ids[..., None] == classes, dtype)


def _numpy_one_hot(ids: Any, num_classes: int, dtype: Any, axis: int) -> Any:
    """NumPy's :func:`one_hot`."""
    flat_ids = ids.reshape(-1)
    n = flat_ids.shape[0]
    if axis == 0:
        out = np.zeros((num_classes, n), dtype)
        out.reshape(-1)[flat_ids * n + np.arange(n)] = 1
    else:
        out = np.zeros((*ids.shape, num_classes), dtype)
        out.reshape(-1)[np.arange(n) * num_classes + flat_ids] = 1
    return out


# -- creation --------------------------------------------------------------------------------
def arange(n: int, like: Array, *, dtype: Any = None) -> Array:
    """``arange(n)`` of ``dtype`` (default: the namespace's default integer dtype) on
    ``like``'s device. Dask: one chunk, of the same array type as ``like``'s chunks
    (NumPy, CuPy, ...), so that nothing is created on the host for GPU chunks. NumPy: a
    cached read-only array (an eager constant)."""
    if type(like) is np.ndarray:
        return _numpy_arange(n, dtype)
    xp = array_namespace(like)
    if array_api_compat.is_dask_namespace(xp):
        import dask.array as da

        return da.arange(n, dtype=dtype, chunks=-1, like=like._meta)
    return xp.arange(n, dtype=dtype, device=device(like))


@functools.lru_cache(maxsize=16)
def _numpy_arange(n: int, dtype: Any) -> Any:
    """A read-only ``np.arange(n, dtype=dtype)``."""
    out = np.arange(n, dtype=dtype)
    out.flags.writeable = False
    return out


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


# -- activations ------------------------------------------------------------------------------
def relu(x: Array) -> tuple[Array, Any]:
    """``max(0, x)`` elementwise and the cache of :func:`relu_backward`: generic, the 0/1
    mask (``x * mask`` is the output). PyTorch: ``torch.relu``, its output the cache (the
    mask's comparison, conversion and product cost torch ten times as much)."""
    if array_api_compat.is_torch_array(x):
        import torch

        y = torch.relu(x)
        return y, _TorchReLU(y)
    xp = array_namespace(x)
    mask = xp.astype(x > 0, x.dtype)
    return x * mask, mask


def relu_backward(dy: Array, cache: Any) -> Array:
    """``dy * mask`` from the cache of :func:`relu`. PyTorch: ``threshold_backward`` of the
    output (one kernel, what autograd runs)."""
    if isinstance(cache, _TorchReLU):
        import torch

        return torch.ops.aten.threshold_backward(dy, cache.y, 0)
    return dy * cache


class _TorchReLU(NamedTuple):
    """The cache of PyTorch's :func:`relu`: its output."""

    y: Any


# -- attention --------------------------------------------------------------------------------
def softmax(z: Array, axis: int = -1) -> Array:
    """Softmax over ``axis`` (the last, or 0) as the original computes it: ``e * (Σe)**-1``
    with ``e = exp(z - max(z))``. Entries of ``-inf`` get probability 0."""
    xp = array_namespace(z)
    if axis == -1:
        e = xp.exp(z - max_last(z))
        return e * sum_last(e) ** -1
    if axis != 0:
        raise ValueError(f"softmax runs over axis -1 or 0, not {axis}")
    # a reduction over the leading axis is already one vectorized pass per row
    e = xp.exp(z - xp.max(z, axis=0, keepdims=True))
    return e * xp.sum(e, axis=0, keepdims=True) ** -1


def causal_bias(t: int, like: Array) -> Array:
    """``(T, T)`` additive mask: 0 where key ≤ query (the diagonal included), ``-inf`` above,
    on ``like``'s device with its dtype."""
    xp = array_namespace(like)
    pos = arange(t, like)
    zero = full((t, t), 0.0, like)
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


def attention(q: Array, k: Array, v: Array, bias: Array | None) -> tuple[Array, Any]:
    """Scaled dot-product attention for ``q (B, H, Tq, D)`` over ``k, v (B, H, Tk, D)``:
    ``softmax((q * D**-0.5) @ k.T + bias) @ v`` -> ``(B, H, Tq, D)`` and the cache of
    :func:`attention_backward` (bias ``(Tq, Tk)`` of 0/−inf, or ``None``)."""
    scale = float(q.shape[-1]) ** -0.5
    qs = q * scale
    scores = matmul_nt(qs, k)
    if bias is not None:
        scores = scores + bias
    att = softmax(scores)
    return att @ v, (qs, k, v, att, scale)


def attention_backward(dy: Array, cache: Any) -> tuple[Array, Array, Array]:
    """``dy (B, H, Tq, D)`` -> ``(dq, dk, dv)`` with the shapes of ``q, k, v``."""
    xp = array_namespace(dy)
    qs, k, v, att, scale = cache
    datt = matmul_nt(dy, v)
    dv = xp.matrix_transpose(att) @ dy
    dscores = att * (datt - sum_last(datt * att))
    return (dscores @ k) * scale, xp.matrix_transpose(dscores) @ qs, dv


def causal_attention(qkv: Array, b: int, t: int, n_head: int) -> tuple[Array, Any]:
    """Causal multi-head self-attention over fused projections: ``qkv (B*T, 3C)`` holds
    ``q | k | v`` side by side; returns ``(B*T, C)`` (the heads' outputs in head order) and
    the cache of :func:`causal_attention_backward`.

    NumPy: :func:`_numpy_causal_attention`, the scores laid out key-major with the heads
    and the batch outside, so that the softmax reduces over a leading axis.
    """
    if _all_numpy(qkv):
        return _numpy_causal_attention(qkv, b, t, n_head)
    if array_api_compat.is_torch_array(qkv):
        return _torch_causal_attention(qkv, b, t, n_head)
    return _causal_attention(qkv, b, t, n_head)


def causal_attention_backward(dy: Array, cache: Any) -> Array:
    """``dy (B*T, C)`` -> ``dqkv (B*T, 3C)`` from the cache of :func:`causal_attention`."""
    if isinstance(cache, _NumpyAttention):
        return _numpy_causal_attention_backward(dy, cache)
    if isinstance(cache, _TorchAttention):
        return _torch_causal_attention_backward(dy, cache)
    return _causal_attention_backward(dy, cache)


def _causal_attention(qkv: Array, b: int, t: int, n_head: int) -> tuple[Array, Any]:
    """The generic :func:`causal_attention`."""
    c = qkv.shape[-1] // 3
    q, k, v = (split_heads(qkv[:, i * c : (i + 1) * c], b, t, n_head) for i in range(3))
    y, cache = attention(q, k, v, causal_bias(t, qkv))
    return merge_heads(y), cache


def _causal_attention_backward(dy: Array, cache: Any) -> Array:
    """The generic :func:`causal_attention_backward`."""
    xp = array_namespace(dy)
    b, h, t, d = cache[0].shape
    dq, dk, dv = attention_backward(split_heads(dy, b, t, h), cache)
    # (B, 3, H, T, D) -> (B, T, 3, H, D): one relayout copy instead of three and a concat
    stacked = xp.permute_dims(xp.stack([dq, dk, dv], axis=1), (0, 3, 1, 2, 4))
    return xp.reshape(stacked, (b * t, 3 * h * d))


class _NumpyAttention(NamedTuple):
    """The cache of :func:`_numpy_causal_attention`: views of ``q``, ``k``, ``v`` ``(B, H,
    T, D)`` into the forward's ``qkv``, the probabilities ``att[h, key, b, query]`` and the
    scale."""

    q: Any
    k: Any
    v: Any
    att: Any
    scale: float


def _numpy_causal_attention(qkv: Any, b: int, t: int, n_head: int) -> tuple[Any, Any]:
    """NumPy's :func:`causal_attention`.

    The scores are laid out ``(H, Tk, B, Tq)``: each ``(b, h)`` block ``k @ (q*scale).T``
    is a ``(Tk, Tq)`` matrix with unit column stride, so the batched product writes it in
    place (``out=``), and the softmax over the keys is a reduction over axis 1 of an
    ``(H, Tk, B*Tq)`` array, vectorized over whole contiguous rows (the scores' last axis
    is short: a reduction over it runs row by row, and even a relaid copy for it costs
    more than the rest of the softmax). The causal mask is added in place: a cached
    full-size constant up to ``_NUMPY_MASK_CACHE_BYTES`` (a broadcast add of a 16-long
    inner loop costs several times a contiguous one), broadcast above that size. The output product reads the probabilities as transposed blocks and
    writes the heads' outputs straight into the merged ``(B, T, H, D)`` layout.
    """
    c = qkv.shape[-1] // 3
    h, d = n_head, c // n_head
    dtype = qkv.dtype
    scale = float(d) ** -0.5
    x5 = qkv.reshape(b, t, 3, h, d)
    q, k, v = (x5[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (B, H, T, D) views
    qs_t = np.empty((b, h, d, t), dtype)
    np.multiply(q.transpose(0, 1, 3, 2), scale, out=qs_t)
    att = np.empty((h, t, b, t), dtype)  # att[h, key, b, query]
    np.matmul(k, qs_t, out=att.transpose(2, 0, 1, 3))
    rows = att.reshape(h, t, b * t)
    if att.nbytes <= _NUMPY_MASK_CACHE_BYTES:
        np.add(rows, _numpy_key_query_bias(h, t, b, dtype), out=rows)
    else:  # a big batch: broadcast the (Tk, Tq) mask rather than keep a full-size copy
        np.add(att, _numpy_key_query(t, dtype)[None, :, None, :], out=att)
    np.subtract(rows, rows.max(axis=1, keepdims=True), out=rows)
    np.exp(rows, out=rows)
    total = rows.sum(axis=1, keepdims=True)
    np.multiply(rows, np.reciprocal(total, out=total), out=rows)
    y = np.empty((b, t, h, d), dtype)
    np.matmul(att.transpose(2, 0, 3, 1), v, out=y.transpose(0, 2, 1, 3))
    return y.reshape(b * t, c), _NumpyAttention(q, k, v, att, scale)


def _numpy_causal_attention_backward(dy: Any, cache: _NumpyAttention) -> Any:
    """NumPy's :func:`causal_attention_backward`, in the layout of the forward: the
    gradient of the probabilities is written as ``(H, Tk, B, Tq)``, the softmax's
    backward reduces over its axis 1, and ``dq``, ``dk``, ``dv`` are written straight into
    their column blocks of ``dqkv``. The scale goes on the scores' gradient once (the
    generic code scales ``dq`` and, through ``q * scale``, ``dk``)."""
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
    return dqkv.reshape(b * t, 3 * h * d)


#: The largest full-size causal mask NumPy's attention keeps (bytes; 4 MiB is the default
#: model at B=1024 in float32); :func:`_numpy_key_query_bias` keeps at most 4 of them.
_NUMPY_MASK_CACHE_BYTES = 4 << 20


@functools.lru_cache(maxsize=4)
def _numpy_key_query_bias(h: int, t: int, b: int, dtype: Any) -> Any:
    """The causal mask in the layout of :func:`_numpy_causal_attention`'s scores, ``(H, Tk,
    B*Tq)``: ``-inf`` where the key comes after the query, else 0. Built once per shape
    and dtype and read-only (an eager constant: NumPy arrays only)."""
    key_query = _numpy_key_query(t, dtype)
    mask = np.ascontiguousarray(np.broadcast_to(key_query[None, :, None, :], (h, t, b, t)))
    mask = mask.reshape(h, t, b * t)
    mask.flags.writeable = False
    return mask


@functools.lru_cache(maxsize=8)
def _numpy_key_query(t: int, dtype: Any) -> Any:
    """The ``(Tk, Tq)`` causal mask, read-only: ``-inf`` where the key comes after the
    query, else 0."""
    pos = np.arange(t)
    mask = np.where(pos[:, None] > pos[None, :], -np.inf, 0.0).astype(dtype)
    mask.flags.writeable = False
    return mask


class _TorchAttention(NamedTuple):
    """The cache of :func:`_torch_causal_attention`: ``q * scale``, ``k``, ``v`` ``(B, H, T,
    D)``, the probabilities ``(B, H, Tq, Tk)`` and the scale."""

    qs: Any
    k: Any
    v: Any
    att: Any
    scale: float


def _torch_causal_attention(qkv: Any, b: int, t: int, n_head: int) -> tuple[Any, Any]:
    """PyTorch's :func:`causal_attention`: the generic math with torch's fused kernels,
    the mask added in place to the scores and ``torch.softmax`` (one kernel for the six of
    the generic softmax). ``q``, ``k``, ``v`` are laid out head-major by one copy (a
    batched product copies a strided operand each time it reads it: twice each here and
    in the backward)."""
    import torch

    c = qkv.shape[-1] // 3
    h, d = n_head, c // n_head
    scale = float(d) ** -0.5
    heads = qkv.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).contiguous()  # (3, B, H, T, D)
    q, k, v = heads.unbind(0)
    qs = q * scale
    scores = torch.matmul(qs, k.transpose(-1, -2))
    scores.add_(_torch_causal_bias(t, qkv.dtype, qkv.device))
    att = torch.softmax(scores, dim=-1)
    y = torch.matmul(att, v)
    return y.transpose(1, 2).reshape(b * t, c), _TorchAttention(qs, k, v, att, scale)


def _torch_causal_attention_backward(dy: Any, cache: _TorchAttention) -> Any:
    """PyTorch's :func:`causal_attention_backward`: the softmax's backward is torch's
    one kernel (``_softmax_backward_data``, what autograd runs); ``dq``, ``dk``, ``dv``
    are written into one head-major buffer and relaid into ``dqkv`` by one copy."""
    import torch

    qs, k, v, att, scale = cache
    b, h, t, d = qs.shape
    dy_heads = dy.reshape(b, t, h, d).transpose(1, 2).contiguous()
    datt = torch.matmul(dy_heads, v.transpose(-1, -2))
    dscores = torch._softmax_backward_data(datt, att, -1, att.dtype)
    grads = torch.empty((3, b, h, t, d), dtype=dy.dtype, device=dy.device)
    torch.matmul(dscores, k, out=grads[0])
    grads[0].mul_(scale)
    torch.matmul(dscores.transpose(-1, -2), qs, out=grads[1])
    torch.matmul(att.transpose(-1, -2), dy_heads, out=grads[2])
    return grads.permute(1, 3, 0, 2, 4).reshape(b * t, 3 * h * d)


@functools.lru_cache(maxsize=8)
def _torch_causal_bias(t: int, dtype: Any, dev: Any) -> Any:
    """The ``(T, T)`` causal mask of :func:`causal_bias` as a torch tensor, built once per
    size, dtype and device (an eager constant, never written to)."""
    import torch

    return torch.full((t, t), float("-inf"), dtype=dtype, device=dev).triu(1)


# -- the loss ---------------------------------------------------------------------------------
def cross_entropy(logits_t: Array, targets: Array, valid: Array | None) -> tuple[Array, Any]:
    """Per-position ``log Σ exp(z − max z) − (z[target] − max z)`` of ``logits_t (V, N)``
    (one column per position) and ``targets (N,)``: ``losses (N,)``, 0 where ``valid``
    (if given) is 0, and the cache of :func:`cross_entropy_backward`.

    NumPy: the target's entry is picked by indexing (the generic code multiplies by a
    one-hot matrix and sums: the same exact value), and the one-hot matrix is written by
    flat indices. PyTorch: ``log_softmax`` and ``gather`` (one kernel each), and a
    ``scatter_add_`` in the backward."""
    if _all_numpy(logits_t, targets):
        return _numpy_cross_entropy(logits_t, targets, valid)
    if array_api_compat.is_torch_array(logits_t):
        return _torch_cross_entropy(logits_t, targets, valid)
    return _cross_entropy(logits_t, targets, valid)


def cross_entropy_backward(dlosses: Array, cache: Any) -> Array:
    """``dlosses (N,)`` -> ``dlogits_t (V, N) = (p − onehot(target)) * dlosses`` from the
    cache of :func:`cross_entropy`."""
    if isinstance(cache, _PickedTargets):
        return _torch_cross_entropy_backward(dlosses, cache)
    return _cross_entropy_backward(dlosses, cache)


def _cross_entropy(logits_t: Array, targets: Array, valid: Array | None) -> tuple[Array, Any]:
    """The generic :func:`cross_entropy`."""
    xp = array_namespace(logits_t, targets)
    shifted = logits_t - xp.max(logits_t, axis=0, keepdims=True)
    e = xp.exp(shifted)
    total = xp.sum(e, axis=0)
    p = e * total[None, :] ** -1
    onehot = one_hot(targets, logits_t.shape[0], logits_t.dtype, axis=0)
    losses = xp.log(total) - xp.sum(shifted * onehot, axis=0)
    if valid is not None:
        losses = xp.where(valid != 0, losses, xp.zeros_like(losses))
    return losses, (p, onehot)


def _cross_entropy_backward(dlosses: Array, cache: Any) -> Array:
    """The generic :func:`cross_entropy_backward`."""
    p, onehot = cache
    return (p - onehot) * dlosses[None, :]


class _PickedTargets(NamedTuple):
    """The cache of PyTorch's :func:`cross_entropy`: the log-probabilities ``(V, N)`` and
    the targets as ``(1, N)`` int64 (the index of ``gather`` and ``scatter_add_``)."""

    p: Any
    targets: Any


def _numpy_cross_entropy(logits_t: Any, targets: Any, valid: Any) -> tuple[Any, Any]:
    """NumPy's :func:`cross_entropy`: the generic arithmetic, with the target's entry
    picked and the one-hot matrix of the backward written by flat indices."""
    v, n = logits_t.shape
    shifted = logits_t - logits_t.max(axis=0)
    e = np.exp(shifted)
    total = e.sum(axis=0)
    np.multiply(e, np.reciprocal(total), out=e)
    flat = targets.reshape(-1) * n + np.arange(n)
    losses = np.log(total) - shifted.reshape(-1)[flat]
    if valid is not None:
        losses = np.where(valid != 0, losses, losses.dtype.type(0))
    onehot = np.zeros((v, n), logits_t.dtype)
    onehot.reshape(-1)[flat] = 1
    return losses, (e, onehot)


def _torch_cross_entropy(logits_t: Any, targets: Any, valid: Any) -> tuple[Any, Any]:
    """PyTorch's :func:`cross_entropy`: ``-log_softmax(z)[target]``."""
    import torch

    index = targets[None, :].long()  # gather's index (no copy for int64 ids)
    logp = torch.log_softmax(logits_t, dim=0)
    losses = logp.gather(0, index)[0].neg_()
    if valid is not None:
        losses = torch.where(valid != 0, losses, 0.0)
    return losses, _PickedTargets(logp, index)


def _torch_cross_entropy_backward(dlosses: Any, cache: _PickedTargets) -> Any:
    """PyTorch's :func:`cross_entropy_backward`: ``exp(logp) * dlosses``, ``dlosses``
    subtracted at the targets (``scatter_add_`` into its own temporary)."""
    import torch

    out = torch.exp(cache.p).mul_(dlosses[None, :])
    return out.scatter_add_(0, cache.targets, -dlosses[None, :])
