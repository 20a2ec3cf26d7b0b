"""A namespace the backends table does not know runs the one generic code path through
the public API: ndonnx (eager and lazy) and marray (masked arrays over NumPy), each in a
nox session of its own (``MICROGPT_XP_FOREIGN=ndonnx``). Results equal NumPy's in float64
to 1e-10, are arrays of the namespace on the params' device, and no override applies
(but ndonnx's own module, :data:`OVERRIDES`)."""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import pytest
from xp_testing import xp_assert_close

import microgpt_xp as mx
from microgpt_xp import primitives as P
from microgpt_xp.data import pack_batch

CONFIG = mx.GPTConfig(vocab_size=11, n_layer=2, n_embd=8, n_head=2, block_size=8)
RTOL = 1e-10
#: The namespaces outside the table that have an override module (the rest: none).
OVERRIDES = {"ndonnx": "microgpt_xp.primitives._ndonnx"}


@functools.cache
def _namespace(name: str) -> Any:
    if name == "ndonnx":
        return pytest.importorskip("ndonnx")
    marray = pytest.importorskip("marray")
    return marray.masked_namespace(np)  # a new namespace object at every call


SELECTED = os.environ.get("MICROGPT_XP_FOREIGN", "").strip() or "ndonnx,marray"


@pytest.fixture(params=[n.strip() for n in SELECTED.split(",") if n.strip()])
def xp(request: pytest.FixtureRequest) -> Any:
    """A namespace outside the backends table."""
    return _namespace(request.param)


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.array([9, 5, 2, 7])
    tokens = rng.integers(0, CONFIG.vocab_size, (4, 9))
    tokens[np.arange(9)[None, :] >= lengths[:, None]] = 10  # BOS padding
    return tokens, lengths


@pytest.fixture
def reference() -> mx.Params:
    return mx.init_params(CONFIG, seed=3, dtype="float64")


def test_weights_go_there_by_every_door_and_train_as_on_numpy(
    xp: Any, reference: mx.Params
) -> None:
    moved = reference.to(xp)
    made = mx.init_params(CONFIG, seed=3, backend=xp, dtype="float64")
    loaded = mx.Params.from_state_dict(reference.to_state_dict(), config=CONFIG, backend=xp)
    for params in (moved, made, loaded):
        assert params.xp is xp and params.backend == xp.__name__
        for name, a in params.arrays().items():
            xp_assert_close(a, getattr(reference, name), rtol=RTOL, like=params.wte, what=name)
        # the generic code; ndonnx: its module of graph-friendly forms (primitives/_ndonnx.py)
        module = P.native_module(params.wte)
        assert getattr(module, "__name__", None) == OVERRIDES.get(xp.__name__)
    # training steps equal numpy
    params, state = reference.to(xp), mx.adam_init(reference.to(xp))
    close = functools.partial(xp_assert_close, rtol=RTOL, like=params.wte)
    want_params, want_state = reference, mx.adam_init(reference)
    for step in range(3):
        tokens, lengths = _batch(step)
        params, state, loss = mx.train_step(params, state, xp.asarray(tokens), xp.asarray(lengths))
        want_params, want_state, want_loss = mx.train_step(want_params, want_state, tokens, lengths)
        close(loss, want_loss, what="loss")
    for name, a in params.arrays().items():
        close(a, getattr(want_params, name), what=name)
        close(getattr(state.m, name), getattr(want_state.m, name), what=f"m.{name}")
        close(getattr(state.v, name), getattr(want_state.v, name), what=f"v.{name}")
    assert int(state.step) == 3
    _, grads = mx.loss_and_grads(params, xp.asarray(tokens), xp.asarray(lengths))
    updated, _ = mx.adam_update(params, grads, state)
    want_grads = mx.loss_and_grads(want_params, tokens, lengths)[1]
    close(updated.wte, mx.adam_update(want_params, want_grads, want_state)[0].wte, what="adam")


def test_the_model_equals_numpy(xp: Any, reference: mx.Params) -> None:
    params = reference.to(xp)
    close = functools.partial(xp_assert_close, rtol=RTOL, like=params.wte)
    tokens, lengths = _batch()
    tok, lens = xp.asarray(tokens), xp.asarray(lengths)
    want = mx.forward(reference, tokens[:, :8], lengths - 1)
    close(mx.forward(params, tok[:, :8], lens - 1), want, what="forward")
    close(mx.score(params, tok, lens), mx.score(reference, tokens, lengths), what="score")
    for reduction in ("mean", "token_mean"):
        loss, grads = mx.loss_and_grads(params, tok, lens, reduction=reduction)
        want_loss, want_grads = mx.loss_and_grads(reference, tokens, lengths, reduction=reduction)
        close(loss, want_loss, what="loss")
        for name, g in grads.arrays().items():
            close(g, getattr(want_grads, name), what=f"d{name}")
    # a packed batch (several documents a row) equals numpy's
    rows, lens_p, pos, weights = pack_batch(tokens, lengths, CONFIG.block_size)
    on_xp = {"positions": xp.asarray(pos), "weights": xp.asarray(weights)}
    loss, grads = mx.loss_and_grads(params, xp.asarray(rows), xp.asarray(lens_p), **on_xp)
    want_loss, want_grads = mx.loss_and_grads(
        reference, rows, lens_p, positions=pos, weights=weights
    )
    close(loss, want_loss, what="packed loss")
    close(grads.wpe, want_grads.wpe, what="packed dwpe")
    # decoding equals numpy
    tokens, _ = _batch(1)
    cache, want_cache = mx.KVCache(), mx.KVCache()
    for pos in range(CONFIG.block_size):
        logits, cache = mx.decode_step(params, xp.asarray(tokens[:, pos]), cache)
        want, want_cache = mx.decode_step(reference, tokens[:, pos], want_cache)
        close(logits, want, what=f"logits at {pos}")
    with pytest.raises(ValueError, match="the cache is full"):
        mx.decode_step(params, xp.asarray(tokens[:, 0]), cache)


def test_values_are_checked_where_they_can_be_read(xp: Any, reference: mx.Params) -> None:
    params = reference.to(xp)
    tokens, lengths = _batch()
    bad = tokens.copy()
    bad[2, 1] = 11
    with pytest.raises(ValueError, match=r"token id 11 at \[2, 1\] is outside \[0, 11\)"):
        mx.loss_and_grads(params, xp.asarray(bad), xp.asarray(lengths))
    bad[2, 1], bad[2, 6] = 0, 11  # in the padding: allowed
    mx.loss_and_grads(params, xp.asarray(bad), xp.asarray(lengths))
    with pytest.raises(ValueError, match="lengths must lie in"):
        mx.loss_and_grads(params, xp.asarray(tokens), xp.asarray(lengths + 1))
    with pytest.raises(ValueError, match="exceeds the model's limit"):
        mx.forward(params, xp.asarray(tokens))
    # mixed namespaces and non arrays are one line type errors
    with pytest.raises(TypeError, match=r"different namespaces \(tokens: numpy\.ndarray, params: "):
        mx.loss_and_grads(params, tokens, xp.asarray(lengths))
    with pytest.raises(TypeError, match=r"lengths and params are arrays of different namespaces"):
        mx.loss_and_grads(params, xp.asarray(tokens), lengths)
    with pytest.raises(TypeError, match=r"tokens must be an array of the params' namespace"):
        mx.forward(params, [[1, 2]])
    with pytest.raises(TypeError, match="grads are"):
        mx.Adam(params).step(params, reference)


def test_names_and_namespaces_of_the_table() -> None:
    """An unknown name or object is refused; a namespace of the table is that backend."""
    with pytest.raises(
        ValueError, match=r"unknown backend .numpyy.*or pass an Array API namespace"
    ):
        mx.init_params(CONFIG, backend="numpyy")
    with pytest.raises(TypeError, match="backend must be a backend name or an Array API namespace"):
        mx.init_params(CONFIG, backend=object())
    # a namespace of the table is that backend
    compat = pytest.importorskip("array_api_compat.numpy")
    assert mx.init_params(CONFIG, backend=compat).backend == "numpy"
    assert mx.init_params(CONFIG, backend=np).backend == "numpy"


def test_ndonnx_lazy_arrays_build_the_forward_with_unknown_batch_and_time(
    reference: mx.Params,
) -> None:
    ndx = pytest.importorskip("ndonnx")
    params = reference.to(ndx)
    tokens = ndx.argument(shape=("batch", "time"), dtype=ndx.int64)
    lengths = ndx.argument(shape=("batch",), dtype=ndx.int64)
    logits = mx.forward(params, tokens, lengths)
    assert tuple(logits.shape)[:2] == (None, None)
    logits_t = mx.forward(params, ndx.argument(shape=(3, 9), dtype=ndx.int64)[:, :8])
    assert tuple(logits_t.shape)[:2] == (3, 8)
    # sizes that are known are still checked; values are not there to check
    with pytest.raises(ValueError, match="exceeds the model's limit"):
        mx.forward(params, ndx.argument(shape=(2, 9), dtype=ndx.int64))
    with pytest.raises(TypeError, match="integer dtype"):
        mx.forward(params, ndx.argument(shape=("b", "t"), dtype=ndx.float64))
    # training on a dynamic batch (issue 32): no Python int is read from the batch
    tokens = ndx.argument(shape=("batch", 9), dtype=ndx.int64)
    for reduction in ("mean", "token_mean"):
        state = mx.adam_init(params)
        new, new_state, loss = mx.train_step(params, state, tokens, lengths, reduction=reduction)
        assert loss.ndim == 0 and tuple(new.wpe.shape) == (8, 8)
        assert tuple(new_state.m.mlp_fc2.shape) == tuple(state.m.mlp_fc2.shape)
