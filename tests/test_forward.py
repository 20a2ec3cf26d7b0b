"""The forward pass against the scalar oracle (``tests/reference.py``), the KV-cache decoder
against the forward, padding and batch-order invariance, and the weights record; array tests
take the ``backend`` fixture."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from conftest import SPEC_SHAPES, ref_state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from xp_testing import CONFIGS, assert_params_equal, params_on, xp_assert_close

from microgpt_xp import GPTConfig, KVCache, Params, decode_step, forward, init_params
from microgpt_xp.model import decode_hidden
from microgpt_xp.params import INIT_STD

# on JAX these run under jax.jit, on Dask without a compute (conftest's backend fixture);
# decode_step reads its cache position to check it (one compute on Dask)
lazy_xp_function(forward)
lazy_xp_function(decode_step, allow_dask_compute=1)

#: float64 logits agree with the scalar oracle to this relative error, float32 to the next.
RTOL = {"float64": 1e-12, "float32": 1e-5}

#: Where host (NumPy) params live, in the shape of the ``backend`` fixture.
HOST = SimpleNamespace(name="numpy", device=None)


@functools.cache
def ref_logits(config: GPTConfig, seed: int, dtype: str, tokens: tuple[int, ...]) -> np.ndarray:
    """The oracle's logits ``(len(tokens), V)`` for one sequence, weights rounded to ``dtype``."""
    state = ref_state(config, seed)
    sd = {k: np.asarray(v, dtype=dtype).astype(np.float64).tolist() for k, v in state.items()}
    return np.asarray(reference.gpt_logits(sd, list(tokens), n_head=config.n_head))


def random_batch(
    rng: np.random.Generator, config: GPTConfig, b: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """``tokens (b, width)`` of random valid ids (padding included) and ``lengths (b,)`` in
    ``[1, width]``, with the extremes 1 and ``width`` present when ``b >= 2``."""
    tokens = rng.integers(0, config.vocab_size, size=(b, width))
    lengths = rng.integers(1, width + 1, size=b)
    if b >= 2:
        lengths[0], lengths[-1] = width, 1
    return tokens, lengths


def to_backend(backend: Any, tokens: np.ndarray, lengths: np.ndarray) -> tuple[Any, Any]:
    return backend.asarray(tokens, dtype="int64"), backend.asarray(lengths, dtype="int64")


def assert_rows_match_reference(
    logits: Any, params: Params, tokens: np.ndarray, lengths: np.ndarray, seed: int, dtype: str
) -> None:
    """The real positions of each row of ``logits`` equal the oracle's logits of that row."""
    for row, n in enumerate(lengths.tolist()):
        want = ref_logits(params.config, seed, dtype, tuple(int(i) for i in tokens[row, :n]))
        what = f"row {row}"
        xp_assert_close(logits[row, :n, :], want, rtol=RTOL[dtype], like=params.wte, what=what)


# -- forward against the oracle ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_forward_matches_reference(backend: Any, config_name: str, dtype: str) -> None:
    """Padded rows, and (without ``lengths``) rows of the full ``block_size``."""
    config = CONFIGS[config_name]
    params = params_on(backend, config, 7, dtype)
    tokens, lengths = random_batch(np.random.default_rng(1), config, b=5, width=config.block_size)
    logits = forward(params, *to_backend(backend, tokens, lengths))
    assert tuple(logits.shape) == (5, config.block_size, config.vocab_size)
    assert_rows_match_reference(logits, params, tokens, lengths, 7, dtype)
    full = forward(params, backend.asarray(tokens, dtype="int64"))
    assert_rows_match_reference(full, params, tokens, np.full(5, config.block_size), 7, dtype)


@st.composite
def token_batches(draw: Any, config: GPTConfig) -> tuple[np.ndarray, np.ndarray]:
    b, width = draw(st.integers(1, 3)), draw(st.integers(1, config.block_size))
    ids = st.integers(0, config.vocab_size - 1)
    tokens = draw(hnp.arrays(np.int64, (b, width), elements=ids))
    return tokens, draw(hnp.arrays(np.int64, (b,), elements=st.integers(1, width)))


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batch=token_batches(CONFIGS["two_layers"]))
def test_forward_matches_reference_random_batches(
    backend: Any, batch: tuple[np.ndarray, np.ndarray]
) -> None:
    config = CONFIGS["two_layers"]
    tokens, lengths = batch
    params = params_on(backend, config, 11, "float64")
    logits = forward(params, *to_backend(backend, tokens, lengths))
    assert_rows_match_reference(logits, params, tokens, lengths, 11, "float64")


# -- the KV-cache decoder ------------------------------------------------------------------------
# each new position is a new shape, which eager JAX compiles afresh: keep the grid small
@pytest.mark.parametrize(
    ("config_name", "dtype"),
    [("default", "float64"), ("two_layers", "float64"), ("two_layers", "float32"),
     ("three_heads", "float64")],
)  # fmt: skip
def test_decode_step_matches_forward(backend: Any, config_name: str, dtype: str) -> None:
    config = CONFIGS[config_name]
    params = params_on(backend, config, 5, dtype)
    rng = np.random.default_rng(3)
    b, t = 4, config.block_size
    tokens, lengths = random_batch(rng, config, b=b, width=t)
    tok, lens = to_backend(backend, tokens, lengths)
    full = backend.to_numpy(forward(params, tok, lens))
    close = functools.partial(xp_assert_close, rtol=RTOL[dtype], like=params.wte)
    cache = KVCache()
    for pos in range(t):
        step_logits, cache = decode_step(params, tok[:, pos], cache)
        assert int(backend.to_numpy(cache.pos)) == pos + 1
        assert len(cache.keys) == len(cache.values) == config.n_layer
        for k, v in zip(cache.keys, cache.values, strict=True):
            # fixed-size buffers: every step has the same shapes; the slots past pos are 0
            assert tuple(k.shape) == tuple(v.shape) == (t, config.n_embd, b)
            assert not backend.to_numpy(k)[pos + 1 :].any()
            assert not backend.to_numpy(v)[pos + 1 :].any()
        assert tuple(step_logits.shape) == (b, config.vocab_size)
        real = np.flatnonzero(pos < lengths)
        for row in real:
            close(step_logits[int(row), :], full[row, pos], what=f"row {row} position {pos}")
        # the oracle feeds tokens one at a time, as decode_step does: check it directly too
        row = int(real[0])
        expected = ref_logits(config, 5, dtype, tuple(int(i) for i in tokens[row, : pos + 1]))
        close(step_logits[row, :], expected[pos], what=f"row {row} pos {pos}, the oracle")


def test_the_in_place_cache_write_equals_the_functional_one(backend: Any) -> None:
    """The sampler's cache (a Python-int position: written in place where the arrays can
    be) gives the hidden states and buffers of the pure one, whose inputs stay unchanged."""
    config = CONFIGS["two_layers"]
    params = params_on(backend, config, 5, "float64")
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, (3, config.block_size))
    pure, other = KVCache.zeros(params, 3), KVCache.zeros(params, 3)
    fast = KVCache(other.keys, other.values, 0)
    rtol = 0.0 if backend.name == "numpy" else RTOL["float64"]
    for pos in range(config.block_size):
        ids = backend.asarray(tokens[:, pos], "int64")
        before = backend.to_numpy(pure.keys[0]).copy()
        x_pure, new_pure = decode_hidden(params, ids, pure)
        np.testing.assert_array_equal(backend.to_numpy(pure.keys[0]), before)
        x_fast, fast = decode_hidden(params, ids, fast)
        assert fast.pos == pos + 1 and isinstance(fast.pos, int)
        xp_assert_close(x_fast, x_pure, rtol=rtol, what=f"x at {pos}")
        pure = new_pure
    for got, want in zip(fast.keys + fast.values, pure.keys + pure.values, strict=True):
        xp_assert_close(got, want, rtol=rtol, what="buffers")


# -- padding and batch invariances ---------------------------------------------------------------
def test_padding_does_not_leak(backend: Any) -> None:
    config = CONFIGS["default"]
    params = params_on(backend, config, 9, "float64")
    rng = np.random.default_rng(4)
    tokens, lengths = random_batch(rng, config, b=4, width=10)
    lengths[0] = 7  # no row fills the width: every row has padding
    real = np.arange(10)[None, :] < lengths[:, None]
    base = backend.to_numpy(forward(params, *to_backend(backend, tokens, lengths)))

    # other padding values (any valid ids): bitwise the same logits at real positions
    other = np.where(real, tokens, rng.integers(0, config.vocab_size, size=tokens.shape))
    assert (other[~real] != tokens[~real]).any()
    changed = forward(params, *to_backend(backend, other, lengths))

    # less padding (width = the longest row) and more padding (width = block_size)
    width = int(lengths.max())
    narrow = forward(params, *to_backend(backend, tokens[:, :width], lengths))
    pad = rng.integers(0, config.vocab_size, size=(4, config.block_size - 10))
    wide_tokens = np.concatenate([tokens, pad], axis=1)
    wide = forward(params, *to_backend(backend, wide_tokens, lengths))
    close = functools.partial(xp_assert_close, like=params.wte)
    for row, n in enumerate(lengths.tolist()):
        # the real positions (the first n): bitwise the same with other padding
        close(changed[row, :n, :], base[row, :n], rtol=0, what=f"changed row {row}")
        close(narrow[row, :n, :], base[row, :n], rtol=RTOL["float64"], what=f"narrow row {row}")
        close(wide[row, :n, :], base[row, :n], rtol=RTOL["float64"], what=f"wide row {row}")


def test_batch_order_does_not_matter(backend: Any) -> None:
    """A permuted batch, and a row alone, give each row the logits it has in the batch."""
    config = CONFIGS["two_layers"]
    params = params_on(backend, config, 13, "float64")
    close = functools.partial(xp_assert_close, rtol=RTOL["float64"], like=params.wte)
    rng = np.random.default_rng(5)
    tokens, lengths = random_batch(rng, config, b=6, width=config.block_size)
    perm = rng.permutation(6)
    base = backend.to_numpy(forward(params, *to_backend(backend, tokens, lengths)))
    permuted = forward(params, *to_backend(backend, tokens[perm], lengths[perm]))
    n = lengths.tolist()
    for i, row in enumerate(perm.tolist()):
        close(permuted[i, : n[row], :], base[row, : n[row]], what=f"row {row}")
    alone = forward(params, *to_backend(backend, tokens[2:3], lengths[2:3]))
    close(alone[0, : n[2], :], base[2, : n[2]], what="row 2 alone")


# -- the weights record --------------------------------------------------------------------------
def test_init_params_deterministic_and_backend_independent(backend: Any) -> None:
    config = CONFIGS["two_layers"]

    def init(seed: int, dtype: str, on: Any = backend) -> dict[str, np.ndarray]:
        p = init_params(config, seed=seed, dtype=dtype, backend=on.name, device=on.device)
        assert p.backend == on.name
        return p.to_state_dict()

    first, again, on_numpy = init(3, "float64"), init(3, "float64"), init(3, "float64", on=HOST)
    other_seed, single = init(4, "float64"), init(3, "float32")
    assert list(first) == reference.state_dict_keys(config.n_layer)
    for key in first:
        np.testing.assert_array_equal(first[key], again[key], err_msg=key)
        np.testing.assert_array_equal(first[key], on_numpy[key], err_msg=key)
        assert not np.array_equal(first[key], other_seed[key]), key
        assert single[key].dtype == np.float32
        np.testing.assert_array_equal(single[key], first[key].astype(np.float32), err_msg=key)
    flat = np.concatenate([a.ravel() for a in first.values()])
    assert flat.size == config.num_params
    # N(0, 0.08²): a loose statistical check on this fixed draw (1280 values)
    assert abs(float(flat.mean())) < 0.01
    assert abs(float(flat.std()) - INIT_STD) < 0.01


def test_spec_model_layout() -> None:
    """The spec's model: 4192 weights in the original's keys, order and shapes (§4)."""
    config = GPTConfig(vocab_size=27)
    sd = init_params(config, seed=0, dtype="float64").to_state_dict()
    assert [(k, v.shape) for k, v in sd.items()] == list(SPEC_SHAPES.items())
    assert sum(v.size for v in sd.values()) == config.num_params == 4192


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_state_dict_round_trip(backend: Any, dtype: str) -> None:
    config = CONFIGS["two_layers"]
    sd = ref_state(config, 21)
    params = params_on(backend, config, 21, dtype)
    assert params.backend == backend.name
    assert str(params.dtype).split(".")[-1] == dtype
    out = params.to_state_dict()
    assert list(out) == reference.state_dict_keys(config.n_layer)
    assert list(out)[:4] == ["wte", "wpe", "lm_head", "layer0.attn_wq"]
    for key, value in out.items():
        assert isinstance(value, np.ndarray), key
        np.testing.assert_array_equal(value, np.asarray(sd[key], dtype=dtype), err_msg=key)
    # from_state_dict(to_state_dict()) and the stacked layout
    again = Params.from_state_dict(out, config=config, backend=backend.name, device=backend.device)
    assert str(again.dtype) == str(params.dtype)
    assert_params_equal(again, params)
    layer1_wk = backend.asarray(sd["layer1.attn_wk"], dtype=dtype)
    xp_assert_close(params.attn_wk[1, ...], layer1_wk, rtol=0, what="layer1.attn_wk")


def test_params_to_round_trip(backend: Any) -> None:
    """Params.to another backend and back, and to float32 on the backend and its device
    (found when the comparison started to check devices: it copied to the default device)."""
    config = CONFIGS["default"]
    host = params_on(HOST, config, 2, "float64")
    moved = host.to(backend.name, device=backend.device)
    assert (moved.backend, moved.config) == (backend.name, config)
    back = moved.to("numpy")
    assert back.backend == "numpy"
    assert_params_equal(back, host)
    single = moved.to(dtype="float32")
    assert single.backend == backend.name
    assert str(single.dtype).split(".")[-1] == "float32"
    for name, a in host.arrays().items():
        # the expected arrays are put on the backend by the fixture, not by Params.to
        xp_assert_close(getattr(moved, name), backend.asarray(a), rtol=0, what=name)
        want = backend.asarray(a, dtype="float32")
        xp_assert_close(getattr(single, name), want, rtol=0, what=f"{name} in float32")
    # the logits do not depend on where the weights live
    tokens = np.random.default_rng(6).integers(0, config.vocab_size, size=(2, 5))
    on_backend = forward(moved, backend.asarray(tokens, dtype="int64"))
    on_host = forward(host, tokens)
    xp_assert_close(on_backend, on_host, rtol=RTOL["float64"], like=moved.wte, what="logits")
