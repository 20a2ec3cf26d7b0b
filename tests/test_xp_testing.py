"""The closeness check of the tests (``xp_testing.xp_assert_close``) can fail: on a result
of another namespace, dtype, device or shape, and on values beyond the tolerance."""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np
import pytest
from xp_testing import xp_assert_close

HOST = np.array([[1.0, -2.0], [3.0, 0.0]])
#: 1 at the zero entry of HOST, nothing elsewhere.
AT_ZERO = np.array([[0.0, 0.0], [0.0, 1.0]])


def test_passes_within_the_tolerance(backend: Any) -> None:
    x = backend.asarray(HOST, dtype="float64")
    xp_assert_close(x, HOST, rtol=0, like=x)
    xp_assert_close(x, x, rtol=0)
    xp_assert_close(x, HOST * (1 + 1e-13), rtol=1e-12, like=x)
    # norm-wise: an error of 1e-12 at the zero entry is 1e-12 / 3 of the largest entry
    xp_assert_close(x, HOST + 1e-12 * AT_ZERO, rtol=1e-12, like=x)
    xp_assert_close(x, HOST + 1e-12 * AT_ZERO, rtol=0, atol=1e-12, like=x)


def test_fails_beyond_the_tolerance(backend: Any) -> None:
    x = backend.asarray(HOST, dtype="float64")
    with pytest.raises(AssertionError, match="max abs error"):
        xp_assert_close(x, HOST + 1e-11 * AT_ZERO, rtol=1e-12, like=x)
    with pytest.raises(AssertionError, match="max abs error"):
        xp_assert_close(x, HOST * (1 + 1e-15), rtol=0, like=x)
    # element by element, the zero entry allows no error at all
    with pytest.raises(AssertionError, match="1 of 4 entries differ"):
        xp_assert_close(x, HOST + 1e-12 * AT_ZERO, rtol=1e-12, like=x, elementwise=True)
    with pytest.raises(AssertionError, match="shape"):
        xp_assert_close(x, HOST[:1], rtol=1, like=x)


def test_non_finite_values_must_stand_where_the_desired_ones_do(backend: Any) -> None:
    special = np.array([1.0, np.nan, np.inf, -np.inf])
    x = backend.asarray(special, dtype="float64")
    xp_assert_close(x, special, rtol=0, like=x)
    for other in ([1.0, 0.0, np.inf, -np.inf], [1.0, np.nan, 1e300, -np.inf], [np.nan] * 4):
        with pytest.raises(AssertionError, match="non-finite"):
            xp_assert_close(x, np.array(other), rtol=1, like=x)


def test_fails_on_another_namespace_dtype_or_device(backend: Any) -> None:
    x = backend.asarray(HOST, dtype="float64")
    if backend.name != "numpy":
        # a NumPy copy of the right values is not the result
        with pytest.raises(AssertionError, match="namespace"):
            xp_assert_close(backend.to_numpy(x), HOST, rtol=1, like=x)
    with pytest.raises(AssertionError, match="dtype"):
        xp_assert_close(backend.asarray(HOST, dtype="float32"), HOST, rtol=1, like=x)
    on_default = backend.xp.asarray(HOST)  # the namespace's default device
    if str(array_api_compat.device(on_default)) != str(array_api_compat.device(x)):
        with pytest.raises(AssertionError, match="device"):
            xp_assert_close(on_default, HOST, rtol=1, like=x)
    with pytest.raises(AssertionError, match="not an array"):
        xp_assert_close(HOST.tolist(), HOST, rtol=1, like=x)
    # host references need like= to say what the result should be
    with pytest.raises(TypeError, match="like="):
        xp_assert_close(x, HOST.tolist(), rtol=1)
