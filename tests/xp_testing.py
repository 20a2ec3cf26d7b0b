"""The one closeness check of the tests, in the spirit of SciPy's ``xp_assert_close``: a
result must have the expected namespace, dtype and device, and values close to the
expected ones."""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from microgpt_xp import _xp


def xp_assert_close(
    actual: Any,
    desired: Any,
    *,
    rtol: float,
    atol: float = 0.0,
    like: Any = None,
    what: str = "",
) -> None:
    """Assert that ``actual`` is an array like ``like`` and close to ``desired``.

    ``like`` (default: ``desired`` itself) is an array whose namespace, dtype and device
    ``actual`` must share; pass it when ``desired`` is a host (NumPy or list) reference
    for a result of another backend. Values are compared norm-wise on the host, in
    float64: ``max|actual - desired| <= atol + rtol * max|desired|`` (a relative error
    that does not blow up at entries near zero), with equal shapes.
    """
    like = desired if like is None else like
    label = f"{what}: " if what else ""
    if not isinstance(like, (list, tuple, float, int)):
        want_xp = _xp.array_namespace(like)
        got_xp = _xp.array_namespace(actual)
        assert got_xp is want_xp, f"{label}namespace {got_xp.__name__} != {want_xp.__name__}"
        assert actual.dtype == like.dtype, f"{label}dtype {actual.dtype} != {like.dtype}"
        got_dev, want_dev = array_api_compat.device(actual), array_api_compat.device(like)
        assert str(got_dev) == str(want_dev), f"{label}device {got_dev} != {want_dev}"
    got = np.asarray(_host(actual), dtype=np.float64)
    want = np.asarray(_host(desired), dtype=np.float64)
    assert got.shape == want.shape, f"{label}shape {got.shape} != {want.shape}"
    if got.size == 0:
        return
    assert not np.isnan(got).any() or np.isnan(want).any(), f"{label}NaN in the result"
    err = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    assert err <= atol + rtol * scale, (
        f"{label}max abs error {err:.3e} > {atol:g} + {rtol:g} * {scale:.3e}"
    )


def _host(x: Any) -> Any:
    if isinstance(x, (list, tuple, float, int, np.ndarray, np.generic)):
        return x
    return _xp.to_numpy(x)
