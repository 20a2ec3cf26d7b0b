"""The operations whose best form differs between namespaces: a generic version
(:mod:`._generic`) and overrides (:mod:`._numpy`, :mod:`._torch`, ...) kept where measured to
pay (docs/performance.md), picked by :func:`native_module`. The reductions that define the
math never go through a product of lowerable precision (only NumPy's sums are products)."""

from __future__ import annotations

from ._dispatch import native_module, writable
from ._generic import *  # noqa: F403
from ._generic import __all__ as _generic_all

__all__ = [*_generic_all, "native_module", "writable"]
