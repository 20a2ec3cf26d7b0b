"""The operations whose best form differs between array namespaces, each in one place.

Every function here has a generic version written with standard Array API calls
(:mod:`._generic`), which is what every namespace runs — a library nobody tuned for
included — unless its own module overrides that function: :mod:`._numpy`,
:mod:`._torch`, :mod:`._jax`, :mod:`._cupy`, :mod:`._dask` (the layout of array-api-extra,
with the generic code apart). An override is kept only where a measurement on that
namespace shows it pays (docs/performance.md has the figures and a table of what each is
for). ``layers.py`` and ``model.py`` call the standard API and this package only; no
other module of the model names a backend.

**Which inputs take an override** is decided by one predicate, :func:`native_module`:
the array-api-compat ``is_*_array`` test of the function's first array argument picks
the module (NumPy arrays, subclasses included; torch tensors; JAX arrays and tracers;
CuPy arrays; Dask arrays); every other array takes the generic code. The inputs of one
call share a namespace (the model's edge checks that), so the first decides for all.
The choice is cached per array type.

Precision: the reductions that define the math (RMSNorm's mean square, softmax
denominators, the loss, Adam's moments) never go through a product on a namespace whose
product precision can be lowered (TF32 on CUDA, JAX's default precision on GPUs and
TPUs): only the NumPy overrides use products for sums.
"""

from __future__ import annotations

from ._dispatch import native_module, writable
from ._generic import (
    arange,
    attention,
    attention_backward,
    cache_write,
    causal_attention,
    causal_attention_backward,
    causal_bias,
    cross_entropy,
    cross_entropy_backward,
    cumulative_sum0,
    embed,
    full,
    head_cross_entropy,
    head_cross_entropy_backward,
    linear,
    linear_input_grad,
    max_last,
    merge_heads,
    one_hot,
    positions,
    relu,
    relu_backward,
    scatter_add_rows,
    softmax,
    split_heads,
    sum_last,
    weight_grad,
)

__all__ = [
    "arange",
    "attention",
    "attention_backward",
    "cache_write",
    "causal_attention",
    "causal_attention_backward",
    "causal_bias",
    "cross_entropy",
    "cross_entropy_backward",
    "cumulative_sum0",
    "embed",
    "full",
    "head_cross_entropy",
    "head_cross_entropy_backward",
    "linear",
    "linear_input_grad",
    "max_last",
    "merge_heads",
    "native_module",
    "one_hot",
    "positions",
    "relu",
    "relu_backward",
    "scatter_add_rows",
    "softmax",
    "split_heads",
    "sum_last",
    "weight_grad",
    "writable",
]
