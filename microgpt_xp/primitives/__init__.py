"""The operations whose best form differs between namespaces: a generic version
(:mod:`._generic`) and overrides (:mod:`._numpy`, :mod:`._torch`, ...) kept where measured to
pay (docs/performance.md), picked by :func:`native_module`. The reductions that define the
math are products only where those run at full precision: NumPy's sums, and the ONNX graphs'
sums over a leading axis (a runtime that lowers ``MatMul`` precision, as TF32 on a GPU,
lowers theirs too)."""

from __future__ import annotations

from ._dispatch import native_module, writable
from ._generic import *  # noqa: F403
from ._generic import __all__ as _generic_all

__all__ = [*_generic_all, "native_module", "writable"]
