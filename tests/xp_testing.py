"""The tests' shared checks: the one closeness check (in the spirit of SciPy's
``xp_assert_close``), weights records equal bit for bit, errors naming their argument."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import array_api_compat
import numpy as np
import pytest
import reference
from conftest import ref_state

# _xp.to_numpy: the host copy of any backend's array, as the fixtures of conftest use it
from microgpt_xp import GPTConfig, Params, _xp

#: The models of the oracle comparisons: the spec's, two layers, three heads.
CONFIGS = {
    "default": GPTConfig(vocab_size=27),
    "two_layers": GPTConfig(vocab_size=11, n_layer=2, n_embd=8, n_head=2, block_size=8),
    "three_heads": GPTConfig(vocab_size=7, n_layer=1, n_embd=12, n_head=3, block_size=5),
}


def xp_assert_close(
    actual: Any,
    desired: Any,
    *,
    rtol: float,
    atol: float = 0.0,
    like: Any = None,
    what: str = "",
    elementwise: bool = False,
) -> None:
    """``actual`` has the namespace, dtype and device of ``like`` (default ``desired``), and
    ``desired``'s shape and values: in float64, ``max|a - d| <= atol + rtol * max|d|`` (per entry
    with ``elementwise=True``); ``rtol=0``: equal; NaNs and infinities where ``desired``'s are."""
    label = f"{what}: " if what else ""
    if like is None:
        if not array_api_compat.is_array_api_obj(desired):
            raise TypeError(f"{label}pass like=: the desired values are not an array")
        like = desired
    assert array_api_compat.is_array_api_obj(actual), (
        f"{label}not an array: {type(actual).__name__}"
    )
    want_xp = array_api_compat.array_namespace(like)
    got_xp = array_api_compat.array_namespace(actual)
    assert got_xp is want_xp, f"{label}namespace {got_xp.__name__} != {want_xp.__name__}"
    assert actual.dtype == like.dtype, f"{label}dtype {actual.dtype} != {like.dtype}"
    got_dev, want_dev = array_api_compat.device(actual), array_api_compat.device(like)
    assert str(got_dev) == str(want_dev), f"{label}device {got_dev} != {want_dev}"

    got = np.asarray(_host(actual), dtype=np.float64)
    want = np.asarray(_host(desired), dtype=np.float64)
    assert got.shape == want.shape, f"{label}shape {got.shape} != {want.shape}"
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    finite = np.isfinite(got) & np.isfinite(want)
    odd = ~same & ~finite
    assert not odd.any(), (
        f"{label}{int(odd.sum())} non-finite value(s) differ, first at "
        f"{tuple(int(i) for i in np.argwhere(odd)[0])}: {got[odd][0]!r} != {want[odd][0]!r}"
    )
    if not finite.any():
        return
    got, want = np.where(finite, got, 0.0), np.where(finite, want, 0.0)
    err = np.abs(got - want)
    if elementwise:
        bound = atol + rtol * np.abs(want)
        bad = err > bound
        assert not bad.any(), (
            f"{label}{int(bad.sum())} of {bad.size} entries differ, the worst by "
            f"{float(np.max(err - bound)):.3e} over {atol:g} + {rtol:g} * |desired|"
        )
        return
    worst = float(np.max(err))
    scale = float(np.max(np.abs(want)))
    assert worst <= atol + rtol * scale, (
        f"{label}max abs error {worst:.3e} > {atol:g} + {rtol:g} * {scale:.3e}"
    )


def assert_params_equal(actual: Params, desired: Params) -> None:
    """The same config; every field equal bit for bit, on ``desired``'s namespace, device, dtype."""
    assert actual.config == desired.config, f"config {actual.config} != {desired.config}"
    for name, a in actual.arrays().items():
        xp_assert_close(a, getattr(desired, name), rtol=0, what=name)


def host_arrays(params: Params) -> dict[str, np.ndarray]:
    """``params``' fields as NumPy arrays on the host."""
    return {k: np.asarray(v) for k, v in params.to("numpy").arrays().items()}


def state_dict_arrays(params: Params) -> dict[str, Any]:
    """``params`` by the original's state-dict keys, arrays of its own namespace and device."""
    out = {}
    for key in reference.state_dict_keys(params.config.n_layer):
        layer, _, name = key.rpartition(".")
        field = getattr(params, name)
        out[key] = field[int(layer.removeprefix("layer")), ...] if layer else field
    return out


@contextlib.contextmanager
def raises_about(
    error: type, param: str | None, match: str | None = None, attr: str = "param"
) -> Iterator[Any]:
    """``pytest.raises(error, match=match)`` whose error also names ``param`` (its ``attr``
    attribute, ``option`` for a ResumeError; ``None``: not checked)."""
    with pytest.raises(error, match=match) as info:
        yield info
    if param is not None:
        assert getattr(info.value, attr, None) == param, f"{attr} of {info.value!r}"


def params_on(backend: Any, config: GPTConfig, seed: Any, dtype: str = "float64") -> Params:
    """The reference state dict of ``config`` and ``seed`` (or a state dict) on ``backend``."""
    state = ref_state(config, seed) if isinstance(seed, int) else seed
    return Params.from_state_dict(
        state, config=config, backend=backend.name, device=backend.device, dtype=dtype
    )


def pickle_by_value(module: str) -> None:
    """Send ``module``'s functions to worker processes by value (they cannot import tests/)."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module])


def _host(x: Any) -> Any:

    if isinstance(x, (list, tuple, float, int, np.ndarray, np.generic)):
        return x
    if hasattr(x, "unwrap_numpy"):  # ndonnx's eager arrays offer neither DLPack nor __array__
        return np.asarray(x.unwrap_numpy())
    return _xp.to_numpy(x)
