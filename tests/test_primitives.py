"""Every native override of ``microgpt_xp.primitives`` against the generic code that every
other namespace runs: the same results (float64 to 1e-12, float32 to 1e-5, norm-wise
relative), no input modified, and constants that cannot be written to.

The generic code is called directly (the ``_``-prefixed generic functions, or the
overrides' own fallbacks), so each test compares the two forms on the same arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from microgpt_xp import _xp
from microgpt_xp import primitives as P

#: Norm-wise relative error allowed between an override and the generic code.
RTOL = {"float64": 1e-12, "float32": 1e-5}

#: ``(B, T, C, H)`` of the attention tests: the default model, odd sizes, one of everything.
ATTENTION_SHAPES = [(64, 16, 16, 4), (3, 7, 12, 3), (2, 5, 6, 2), (1, 1, 4, 1), (2, 64, 128, 4)]


def assert_same(actual: Any, desired: Any, dtype: str, what: str) -> None:
    """``actual`` (an override's result) equals ``desired`` (the generic one) in type,
    dtype and shape, and to ``RTOL[dtype]`` in value."""
    assert type(actual) is type(desired), what
    assert actual.dtype == desired.dtype, what
    assert tuple(actual.shape) == tuple(desired.shape), what
    got, want = (np.asarray(_xp.to_numpy(a), dtype=np.float64) for a in (actual, desired))
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    assert float(np.max(np.abs(got - want), initial=0.0)) <= RTOL[dtype] * scale, what


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
def test_numpy_causal_attention_equals_the_generic_code(
    shape: tuple[int, int, int, int], dtype: str
) -> None:
    b, t, c, h = shape
    rng = np.random.default_rng(sum(shape))
    qkv = (1.5 * rng.standard_normal((b * t, 3 * c))).astype(dtype)
    dy = rng.standard_normal((b * t, c)).astype(dtype)
    before = qkv.copy(), dy.copy()
    y, cache = P.causal_attention(qkv, b, t, h)
    assert isinstance(cache, P._NumpyAttention)  # the override ran
    want_y, want_cache = P._causal_attention(qkv, b, t, h)
    assert_same(y, want_y, dtype, "output")
    dqkv = P.causal_attention_backward(dy, cache)
    assert_same(dqkv, P._causal_attention_backward(dy, want_cache), dtype, "dqkv")
    np.testing.assert_array_equal(qkv, before[0])
    np.testing.assert_array_equal(dy, before[1])


def test_numpy_attention_mask_is_a_read_only_constant() -> None:
    mask = P._numpy_key_query_bias(2, 3, 4, np.dtype("float32"))
    assert mask is P._numpy_key_query_bias(2, 3, 4, np.dtype("float32"))  # built once
    assert not mask.flags.writeable
    with pytest.raises(ValueError):
        mask[0, 0, 0] = 1.0
    # (H, Tk, B*Tq): -inf where the key comes after the query
    key_query = mask.reshape(2, 3, 4, 3)[1, :, 2, :]
    assert np.array_equal(np.isinf(key_query), np.triu(np.ones((3, 3), bool), k=1).T)


def test_attention_of_a_numpy_subclass_takes_the_generic_code() -> None:
    """Only plain ndarrays take the NumPy override (a subclass may not allow ``out=``)."""

    class Sub(np.ndarray):
        pass

    qkv = np.random.default_rng(0).standard_normal((8, 12)).view(Sub)
    _, cache = P.causal_attention(qkv, 2, 4, 2)
    assert not isinstance(cache, P._NumpyAttention)


@pytest.mark.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
def test_torch_causal_attention_equals_the_generic_code(
    shape: tuple[int, int, int, int], dtype: str
) -> None:
    torch = pytest.importorskip("torch")
    b, t, c, h = shape
    rng = np.random.default_rng(sum(shape))
    qkv = torch.from_numpy((1.5 * rng.standard_normal((b * t, 3 * c))).astype(dtype))
    dy = torch.from_numpy(rng.standard_normal((b * t, c)).astype(dtype))
    before = qkv.clone(), dy.clone()
    y, cache = P.causal_attention(qkv, b, t, h)
    assert isinstance(cache, P._TorchAttention)  # the override ran
    want_y, want_cache = P._causal_attention(qkv, b, t, h)
    assert_same(y, want_y, dtype, "output")
    dqkv = P.causal_attention_backward(dy, cache)
    assert_same(dqkv, P._causal_attention_backward(dy, want_cache), dtype, "dqkv")
    assert torch.equal(qkv, before[0]) and torch.equal(dy, before[1])
    # the cached mask is never written to
    assert torch.equal(P._torch_causal_bias(t, qkv.dtype, qkv.device), P.causal_bias(t, qkv))
