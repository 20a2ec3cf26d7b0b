"""The operations whose best form differs between array namespaces, each in one place.

Each has a generic version in standard Array API calls (:mod:`._generic`), what every
namespace runs unless its own module overrides it (:mod:`._numpy`, :mod:`._torch`,
:mod:`._jax`, :mod:`._cupy`, :mod:`._dask`), an override kept only where a measurement on
that namespace shows it pays (docs/performance.md). One predicate, :func:`native_module`
(array-api-compat's ``is_*_array`` of the first array argument, cached per type), picks the
module; another, :func:`writable`, lets :func:`cache_write` write in place.

Precision: the reductions that define the math (norms, softmax denominators, the loss)
never go through a product where its precision can be lowered (TF32, JAX's default
precision): only the NumPy overrides use products for sums.
"""

from __future__ import annotations

from ._dispatch import native_module, writable
from ._generic import *  # noqa: F403
from ._generic import __all__ as _generic_all

__all__ = [*_generic_all, "native_module", "writable"]
