"""Every native override against the generic code (its ``__wrapped__``) on the same arrays:
the same results (float64 1e-12, float32 1e-5, norm-wise), type, dtype and shape, no input
modified; an override without a case fails :func:`test_every_override_has_a_case`."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from array_api_compat import is_array_api_obj
from xp_testing import xp_assert_close

from microgpt_xp import _xp
from microgpt_xp import primitives as P
from microgpt_xp.primitives import _numpy

#: Norm-wise relative error allowed between an override and the generic code.
RTOL = {"float64": 1e-12, "float32": 1e-5}

#: ``(B, T, C, H)`` of the attention cases: the default model, odd sizes, one of everything.
ATTENTION_SHAPES = [(64, 16, 16, 4), (3, 7, 12, 3), (2, 5, 6, 2), (1, 1, 4, 1), (2, 64, 128, 4)]

#: The primitives with a backward, each fed its forward's cache.
BACKWARD = {
    n: f"{n}_backward"
    for n in ("relu", "attention", "causal_attention", "cross_entropy", "head_cross_entropy")
}

#: The override modules and the library each needs.
MODULES = {
    "_numpy": "numpy",
    "_torch": "torch",
    "_jax": "jax",
    "_dask": "dask",
    "_cupy": "cupy",
    "_ndonnx": "ndonnx",
}


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng(list(seed))


def _floats(shape: tuple[int, ...], dtype: str, seed: int, scale: float = 1.0) -> np.ndarray:
    return (scale * _rng(seed, len(shape)).standard_normal(shape)).astype(dtype)


def _ids(shape: tuple[int, ...], high: int, seed: int) -> np.ndarray:
    return _rng(seed, high).integers(0, high, shape)


def _cases(dtype: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each primitive's argument lists: host NumPy arrays (moved to the library under test),
    ints and ``"DTYPE"`` (the library's ``dtype``); a backward is fed its forward's cache."""
    f = lambda *shape, seed=0, scale=1.0: _floats(shape, dtype, seed, scale)  # noqa: E731
    relu_x = f(64, 48)
    relu_x[0, :4] = 0.0  # the derivative at 0 is 0
    ce_valid = (_rng(4).random((5, 7)) > 0.2).astype(dtype)
    ce = (f(5, 7, 27, scale=5.0), _ids((5, 7), 27, 4))
    head_valid = (_rng(5).random((4, 6)) > 0.2).astype(dtype)
    head = (f(4, 6, 16), f(27, 16, seed=1, scale=3.0), _ids((4, 6), 27, 5))
    q, k, v = (f(2, 3, 5, 4, seed=i, scale=1.5) for i in range(3))
    causal = np.where(np.tri(5, dtype=bool), 0.0, -np.inf).astype(dtype)
    return {
        "sum_last": [(f(5, 7, 16),), (f(4, 16),), (f(16),)],
        "sum_first": [(f(7, 4, 4, 9),), (f(16, 3),), (_ids((5, 3), 7, 1),)],
        "max_first": [(f(27, 9),), (f(7, 4, 5),), (f(1, 3),)],
        "rsqrt": [(np.abs(f(4, 9)) + 1e-5,), (np.abs(f(1, 300)),)],
        "scale_rows": [(f(5, 7, 16), f(5, 7, seed=1)), (f(3, 27), f(3, seed=2))],
        "linear": [(f(3, 5, 16), f(48, 16, seed=1)), (f(7, 16), f(27, 16, seed=1))],
        "matmul": [(f(48, 16), f(16, 9, seed=1)), (f(27, 16), f(16, 1, seed=1))],
        "linear_input_grad": [(f(3, 5, 48), f(48, 16, seed=1))],
        "weight_grad": [(f(3, 5, 48), f(3, 5, 16, seed=1)), (f(3, 5, 8), f(3, 5, 16))],
        "cumulative_sum0": [(f(27, 9),), (f(1, 3),)],
        "one_hot": [
            (_ids(shape, 7, seed), 7, "DTYPE") for seed, shape in enumerate([(4, 5), (96,), (0,)])
        ],
        "positions": [(_ids((3, 7), 5, 0),), (_ids((1, 1), 5, 0),), (f(2, 3, 9), -1)],
        "arange": [(9, f(2, 3))],
        "full": [((4, 3), 0.0, f(2, 3))],
        "scatter_add_rows": [(_ids((20,), 27, 3), f(20, 16), 27)],
        "merge_heads": [(f(2, 4, 5, 3), 4)],
        "split_heads": [(f(2, 5, 12), 4, 3), (f(1, 1, 4), 1, 4)],
        "embed": [(_ids((3, 5), 27, 1), f(27, 16)), (_ids((1, 1), 27, 2), f(27, 16))],
        "embed_columns": [(_ids((5,), 27, 1), f(27, 16))],
        "slot_heads": [(f(3, 12, 5), 4, 3)],
        "keep_columns": [
            (f(4, 6, 5), np.array([3, 0, 4]), 4),
            (f(4, 6, 5), np.array([1])),
            (f(9), np.array([8, 0, 4])),
        ],
        "cache_write": [(f(4, 6, 3), f(4, 6, 3, seed=1), f(6, 3, seed=2), f(6, 3), np.asarray(2))],
        "attention": [(q, k, v, causal, 4), (q, k[:, :, :3], v[:, :, :3], None, 4)],
        "relu": [(relu_x,)],
        "causal_attention": [
            (f(b, t, 3 * c, scale=1.5), h, c // h) for b, t, c, h in ATTENTION_SHAPES
        ],
        "cross_entropy": [(*ce, ce_valid), (*ce, None)],
        "head_cross_entropy": [(*head, head_valid), (*head, None)],
    }


def _overrides(module: str) -> list[str]:
    """The forward primitives a module overrides (a backward goes with its forward)."""
    mod = importlib.import_module(f"microgpt_xp.primitives.{module}")
    return sorted(n for n in P.__all__ if hasattr(mod, n) and n not in BACKWARD.values())


def _library(module: str) -> tuple[Callable[[Any], Any], Any]:
    """``(to_library, library_dtype_of)`` for the library of an override module."""
    lib = pytest.importorskip(MODULES[module])
    if module == "_numpy":
        return (lambda a: a), np.dtype
    if module == "_torch":
        return lib.from_numpy, lambda name: getattr(lib, name)
    if module == "_jax":
        jnp = _xp.namespace("jax")  # x64 mode
        return jnp.asarray, lambda name: getattr(jnp, name)
    if module == "_dask":
        import dask.array as da

        return (lambda a: da.from_array(a, chunks=-1)), np.dtype
    if module == "_ndonnx":
        return lib.asarray, lambda name: getattr(lib, name)
    return lib.asarray, lib.dtype


def _convert(args: tuple[Any, ...], to_lib: Callable[[Any], Any], dtype: Any) -> list[Any]:
    """Host arrays moved by ``to_lib``, ``"DTYPE"`` replaced by ``dtype``, the rest as is."""
    return [to_lib(a) if isinstance(a, np.ndarray) else dtype if a == "DTYPE" else a for a in args]


def _host(x: Any) -> np.ndarray:
    if hasattr(x, "unwrap_numpy"):  # ndonnx's eager arrays offer neither DLPack nor __array__
        return np.asarray(x.unwrap_numpy(), dtype=np.float64)
    return np.asarray(_xp.to_numpy(x), dtype=np.float64)


def assert_same(actual: Any, desired: Any, dtype: str, what: str) -> None:
    """``actual`` (an override's result) is of ``desired``'s type (the generic one's) and
    close to it (:func:`xp_assert_close`, ``RTOL[dtype]``; tuples element by element)."""
    if isinstance(desired, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(desired), what
        for i, (a, d) in enumerate(zip(actual, desired, strict=True)):
            assert_same(a, d, dtype, f"{what}[{i}]")
        return
    assert type(actual) is type(desired), f"{what}: {type(actual)} vs {type(desired)}"
    xp_assert_close(actual, desired, rtol=RTOL[dtype], what=what)


CASES = [
    (module, name)
    for module in MODULES
    if importlib.util.find_spec(MODULES[module]) is not None
    for name in _overrides(module)
]


def test_every_override_has_a_case() -> None:
    for module, name in CASES:
        assert _cases("float64").get(name), f"{module}.{name} has no case"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("module", "name"), CASES)
def test_override_equals_the_generic_code(module: str, name: str, dtype: str) -> None:
    """The dispatched primitive runs the module's override (not the generic body), and
    gives the generic body's results; so does its backward, each fed its own cache."""
    to_lib, dtype_of = _library(module)
    dispatched = getattr(P, name)
    override = getattr(importlib.import_module(f"microgpt_xp.primitives.{module}"), name)
    for args in _cases(dtype)[name]:
        inputs = _convert(args, to_lib, dtype_of(dtype))
        before = [_host(a) for a in inputs if is_array_api_obj(a)]
        got, direct, want = dispatched(*inputs), override(*inputs), dispatched.__wrapped__(*inputs)
        if name in BACKWARD:
            (got, got_cache), (direct, _), (want, want_cache) = got, direct, want
        assert_same(got, direct, dtype, f"{module}.{name} dispatch")
        assert_same(got, want, dtype, f"{module}.{name}")
        if name in BACKWARD:
            backward = getattr(P, BACKWARD[name])
            dy = to_lib(_floats(tuple(want.shape), dtype, 1))
            want_d = backward.__wrapped__(dy, want_cache)
            assert_same(backward(dy, got_cache), want_d, dtype, f"{module}.{BACKWARD[name]}")
        after = [_host(a) for a in inputs if is_array_api_obj(a)]
        assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(before, after, strict=True))


def test_the_predicate_picks_one_module_per_array_type() -> None:
    class Sub(np.ndarray):
        pass

    x = np.zeros((2, 3))
    assert P.native_module(x) is _numpy
    assert P.native_module(x.view(Sub)) is _numpy  # subclasses are NumPy arrays too
    assert P.native_module(3.0) is None
    strict = pytest.importorskip("array_api_strict")
    assert P.native_module(strict.asarray([1.0])) is None  # the generic code


def test_numpy_attention_of_a_big_batch_keeps_no_full_size_mask() -> None:
    """Above the cache's size the (T, T) mask is broadcast: nothing the size of the
    scores stays pinned in the cache, and the results are the generic code's."""
    b, t, c, h = 1100, 16, 16, 4  # scores of 4.5 MB in float32: over the 4 MiB cap
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((b, t, 3 * c)).astype(np.float32)
    dy = rng.standard_normal((b, t, c)).astype(np.float32)
    _numpy._key_query_bias.cache_clear()
    y, cache = P.causal_attention(qkv, h, c // h)
    assert isinstance(cache, _numpy.Attention)
    assert _numpy._key_query_bias.cache_info().currsize == 0
    want_y, want_cache = P.causal_attention.__wrapped__(qkv, h, c // h)
    assert_same(y, want_y, "float32", "y")
    dqkv = P.causal_attention_backward(dy, cache)
    assert_same(dqkv, P.causal_attention_backward.__wrapped__(dy, want_cache), "float32", "dqkv")


def test_keep_columns_copies_the_slots_written_where_buffers_are_writable() -> None:
    buf = np.arange(4 * 3 * 5, dtype=np.float32).reshape(4, 3, 5)
    idx = np.array([4, 1])
    kept = P.keep_columns(buf, idx, 2)
    assert kept.shape == (4, 3, 2) and not np.shares_memory(kept, buf)
    np.testing.assert_array_equal(kept[:2], buf[:2, :, idx])
    np.testing.assert_array_equal(P.keep_columns(buf, idx), buf[:, :, idx])  # every slot


def test_numpy_constants_are_cached_and_read_only() -> None:
    """``arange``, the ones, the positions and the attention mask: built once, read-only."""
    x = np.ones((5, 3), np.float32)
    assert P.arange(4, x) is P.arange(4, x)
    assert P.arange(4, x, dtype=np.int32).dtype == np.int32
    np.testing.assert_array_equal(P.arange(4, x), np.arange(4))
    ones = _numpy._ones(3, 2, np.dtype("float32"))
    assert ones is _numpy._ones(3, 2, np.dtype("float32"))
    mask = _numpy._key_query_bias(2, 3, 4, np.dtype("float32"))
    assert mask is _numpy._key_query_bias(2, 3, 4, np.dtype("float32"))
    for const in (P.arange(4, x), ones, P.positions(np.zeros((2, 6), np.int64)), mask):
        assert not const.flags.writeable
    with pytest.raises(ValueError):
        mask[0, 0, 0] = 1.0
    # (H, Tk, B*Tq): -inf where the key comes after the query
    key_query = mask.reshape(2, 3, 4, 3)[1, :, 2, :]
    assert np.array_equal(np.isinf(key_query), np.triu(np.ones((3, 3), bool), k=1).T)
    np.testing.assert_array_equal(P.sum_last(x), np.full((5, 1), 3.0, np.float32))


@pytest.mark.needs_torch
def test_torch_int32_targets_are_gathered_as_well() -> None:
    torch = pytest.importorskip("torch")
    logits = torch.from_numpy(_floats((3, 4, 27), "float64", 0))
    targets = torch.from_numpy(_ids((3, 4), 27, 0))
    losses, _ = P.cross_entropy(logits, targets, None)
    losses32, _ = P.cross_entropy(logits, targets.to(torch.int32), None)
    assert torch.equal(losses32, losses)
