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


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=pytest.mark.needs_torch)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
def test_causal_attention_override_equals_the_generic_code(
    lib: str, shape: tuple[int, int, int, int], dtype: str
) -> None:
    """NumPy's and PyTorch's overrides give the generic code's output and gradient, and
    write to neither input."""
    b, t, c, h = shape
    rng = np.random.default_rng(sum(shape))
    qkv_np = (1.5 * rng.standard_normal((b * t, 3 * c))).astype(dtype)
    dy_np = rng.standard_normal((b * t, c)).astype(dtype)
    if lib == "torch":
        torch = pytest.importorskip("torch")
        qkv, dy, override = torch.from_numpy(qkv_np), torch.from_numpy(dy_np), P._TorchAttention
    else:
        qkv, dy, override = qkv_np, dy_np, P._NumpyAttention
    before = qkv_np.copy(), dy_np.copy()  # the torch tensors share these buffers
    y, cache = P.causal_attention(qkv, b, t, h)
    assert isinstance(cache, override)  # the override ran
    want_y, want_cache = P._causal_attention(qkv, b, t, h)
    assert_same(y, want_y, dtype, "output")
    dqkv = P.causal_attention_backward(dy, cache)
    assert_same(dqkv, P._causal_attention_backward(dy, want_cache), dtype, "dqkv")
    np.testing.assert_array_equal(qkv_np, before[0])
    np.testing.assert_array_equal(dy_np, before[1])
    if lib == "torch":  # the cached mask is never written to
        assert torch.equal(P._torch_causal_bias(t, qkv.dtype, qkv.device), P.causal_bias(t, qkv))


def test_numpy_attention_of_a_big_batch_keeps_no_full_size_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Above the cache's size limit, the mask is broadcast (the same results) and no
    full-size copy is kept."""
    b, t, c, h = 8, 5, 6, 2
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((b * t, 3 * c))
    dy = rng.standard_normal((b * t, c))
    monkeypatch.setattr(P, "_NUMPY_MASK_CACHE_BYTES", h * t * b * t * 8 - 1)
    P._numpy_key_query_bias.cache_clear()
    y, cache = P.causal_attention(qkv, b, t, h)
    assert isinstance(cache, P._NumpyAttention)
    assert P._numpy_key_query_bias.cache_info().currsize == 0
    want_y, want_cache = P._causal_attention(qkv, b, t, h)
    assert_same(y, want_y, "float64", "output")
    dqkv = P.causal_attention_backward(dy, cache)
    assert_same(dqkv, P._causal_attention_backward(dy, want_cache), "float64", "dqkv")


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


def _loss_inputs(dtype: str, v: int = 27, n: int = 96) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "logits_t": (5 * rng.standard_normal((v, n))).astype(dtype),
        "targets": rng.integers(0, v, n),
        "valid": (rng.random(n) > 0.2).astype(dtype),
        "dlosses": rng.random(n).astype(dtype),
    }


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("with_valid", [True, False])
def test_numpy_cross_entropy_equals_the_generic_code(
    dtype: str, with_valid: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _loss_inputs(dtype)
    valid = a["valid"] if with_valid else None
    before = {k: x.copy() for k, x in a.items()}
    calls = []
    override = P._numpy_cross_entropy
    monkeypatch.setattr(P, "_numpy_cross_entropy", lambda *args: calls.append(1) or override(*args))
    losses, cache = P.cross_entropy(a["logits_t"], a["targets"], valid)
    assert calls  # the override ran
    want, want_cache = P._cross_entropy(a["logits_t"], a["targets"], valid)
    # the same arithmetic: the same bits, and the cache of the generic backward
    np.testing.assert_array_equal(losses, want)
    assert losses.dtype == want.dtype
    got_d = P.cross_entropy_backward(a["dlosses"], cache)
    np.testing.assert_array_equal(got_d, P._cross_entropy_backward(a["dlosses"], want_cache))
    for k, x in a.items():
        np.testing.assert_array_equal(x, before[k])


@pytest.mark.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("with_valid", [True, False])
def test_torch_cross_entropy_equals_the_generic_code(dtype: str, with_valid: bool) -> None:
    torch = pytest.importorskip("torch")
    a = {k: torch.from_numpy(x) for k, x in _loss_inputs(dtype).items()}
    valid = a["valid"] if with_valid else None
    before = {k: x.clone() for k, x in a.items()}
    losses, cache = P.cross_entropy(a["logits_t"], a["targets"], valid)
    assert isinstance(cache, P._PickedTargets)  # the override ran
    want, want_cache = P._cross_entropy(a["logits_t"], a["targets"], valid)
    assert_same(losses, want, dtype, "losses")
    got_d = P.cross_entropy_backward(a["dlosses"], cache)
    assert_same(got_d, P._cross_entropy_backward(a["dlosses"], want_cache), dtype, "dlogits")
    assert all(torch.equal(x, before[k]) for k, x in a.items())
    # int32 ids are gathered as well
    losses32, _ = P.cross_entropy(a["logits_t"], a["targets"].to(torch.int32), valid)
    assert torch.equal(losses32, losses)


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("shape", [(96,), (4, 5), (0,), (1,)])
def test_numpy_one_hot_equals_the_generic_code(shape: tuple[int, ...], axis: int) -> None:
    if axis == 0 and len(shape) != 1:
        pytest.skip("axis=0 takes 1-d ids")
    ids = np.random.default_rng(1).integers(0, 7, shape)
    for dtype in (np.float32, np.float64):
        got = P.one_hot(ids, 7, dtype, axis=axis)
        want = P._one_hot(ids, 7, dtype, axis)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_relu_equals_the_generic_code(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    host = rng.standard_normal((64, 48)).astype(dtype)
    host[0, :4] = 0.0  # the derivative at 0 is 0
    x, dy = torch.from_numpy(host), torch.from_numpy(rng.standard_normal((64, 48)).astype(dtype))
    before = x.clone()
    y, cache = P.relu(x)
    assert isinstance(cache, P._TorchReLU)  # the override ran
    mask = (x > 0).to(x.dtype)  # the generic code's cache
    np.testing.assert_array_equal(y.numpy(), (x * mask).numpy())
    np.testing.assert_array_equal(P.relu_backward(dy, cache).numpy(), (dy * mask).numpy())
    assert torch.equal(x, before)


def test_numpy_constants_are_cached_and_read_only() -> None:
    x = np.ones((5, 3), np.float32)
    assert P.arange(4, x) is P.arange(4, x)
    assert P.arange(4, x, dtype=np.int32).dtype == np.int32
    np.testing.assert_array_equal(P.arange(4, x), np.arange(4))
    ones = P._numpy_ones(3, 2, np.dtype("float32"))
    assert ones is P._numpy_ones(3, 2, np.dtype("float32"))
    for const in (P.arange(4, x), ones):
        assert not const.flags.writeable
    np.testing.assert_array_equal(P.sum_last(x), np.full((5, 1), 3.0, np.float32))
