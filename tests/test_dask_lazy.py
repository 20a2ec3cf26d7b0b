"""Dask: graphs built without computing, NumPy's results whatever the batch chunks, and the
weights in the graph once (not copied per chunk)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import array_api_compat
import numpy as np
import pytest
from xp_testing import xp_assert_close

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

from array_api_extra.testing import lazy_xp_function, patch_lazy_xp_functions  # noqa: E402

from microgpt_xp import GPTConfig, Params, forward, init_params, loss_and_grads, score  # noqa: E402

# under patch_lazy_xp_functions these must not call dask.compute / persist at all
lazy_xp_function(forward)
lazy_xp_function(loss_and_grads)
lazy_xp_function(score)

CONFIG = GPTConfig(vocab_size=11, n_layer=2, n_embd=8, n_head=2, block_size=8)
B = 6
RTOL = 1e-12


class ComputeCalled(AssertionError):
    """Raised by :func:`forbid_compute`'s scheduler."""


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise ComputeCalled("dask computed something while the graph was being built")


@pytest.fixture
def forbid_compute() -> Iterator[None]:
    """Any compute or persist inside the block raises :class:`ComputeCalled`."""
    with dask.config.set(scheduler=_refuse):
        yield


@pytest.fixture(autouse=True)
def _synchronous() -> Iterator[None]:
    with dask.config.set(scheduler="synchronous"):
        yield


def batch() -> tuple[np.ndarray, np.ndarray]:
    """Documents ``(B, block_size + 1)`` right-padded, lengths in ``[2, block_size + 1]``."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CONFIG.vocab_size, size=(B, CONFIG.block_size + 1))
    lengths = np.array([9, 2, 5, 7, 3, 9])
    return tokens, lengths


def on_dask(host: np.ndarray, rows_per_chunk: int) -> Any:
    chunks = (rows_per_chunk,) + (-1,) * (host.ndim - 1)
    return da.from_array(np.asarray(host, dtype=np.int64), chunks=chunks)


@pytest.fixture(scope="module")
def host_params() -> Params:
    return init_params(CONFIG, seed=1, dtype="float64")


@pytest.fixture
def dask_params(host_params: Params) -> Params:
    p = host_params.to("dask")
    assert all(a.numblocks == (1,) * a.ndim for a in p.arrays().values())
    return p


def test_nothing_is_computed_until_compute(dask_params: Params, forbid_compute: None) -> None:
    tokens, lengths = batch()
    tok, lens = on_dask(tokens, 2), on_dask(lengths, 2)
    logits = forward(dask_params, tok[:, :-1], lens - 1)
    loss, grads = loss_and_grads(dask_params, tok, lens)
    scores = score(dask_params, tok, lens)
    token_mean, _ = loss_and_grads(dask_params, tok, lens, reduction="token_mean")
    for out in (logits, loss, scores, token_mean, *grads.arrays().values()):
        assert isinstance(out, da.Array)
        assert array_api_compat.is_lazy_array(out)
    # outputs keep the batch chunks; a gradient is one chunk per weight matrix (and layer)
    assert logits.chunks[0] == tok.chunks[0] == scores.chunks[0]
    assert tuple(loss.shape) == ()
    assert all(a.numblocks[-2:] == (1, 1) for a in grads.arrays().values())
    # the guard is real: a compute inside it fails
    with pytest.raises(ComputeCalled):
        loss.compute()


def test_lazy_xp_function(request: pytest.FixtureRequest, dask_params: Params) -> None:
    """array-api-extra's harness: the tagged functions never call ``dask.compute``."""
    tokens, lengths = batch()
    tok, lens = on_dask(tokens, 2), on_dask(lengths, 2)
    with patch_lazy_xp_functions(request, xp=array_api_compat.array_namespace(tok)):
        forward(dask_params, tok[:, :-1], lens - 1)
        loss_and_grads(dask_params, tok, lens)
        score(dask_params, tok, lens)


def test_invalid_ids_fail_at_compute_not_before(dask_params: Params, forbid_compute: None) -> None:
    tokens, lengths = batch()
    tokens[3, 1] = CONFIG.vocab_size
    loss, _ = loss_and_grads(dask_params, on_dask(tokens, 2), on_dask(lengths, 2))
    with dask.config.set(scheduler="synchronous"), pytest.raises(ValueError, match="token ids"):
        loss.compute()


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 4, B])
def test_results_equal_numpy(host_params: Params, dask_params: Params, rows_per_chunk: int) -> None:
    tokens, lengths = batch()
    tok, lens = on_dask(tokens, rows_per_chunk), on_dask(lengths, rows_per_chunk)
    logits = forward(dask_params, tok[:, :-1], lens - 1)
    expected = forward(host_params, tokens[:, :-1], lengths - 1)
    like = dask_params.wte
    for row, n in enumerate(lengths - 1):  # the real positions: the first n of a row
        xp_assert_close(logits[row, :n, :], expected[row, :n], rtol=RTOL, like=like, what=f"{row}")
    for reduction in ("mean", "token_mean"):
        loss, grads = loss_and_grads(dask_params, tok, lens, reduction=reduction)
        ref_loss, ref_grads = loss_and_grads(host_params, tokens, lengths, reduction=reduction)
        xp_assert_close(loss, ref_loss, rtol=RTOL, like=like, what=f"{reduction} loss")
        for name, g in grads.arrays().items():
            xp_assert_close(g, ref_grads.arrays()[name], rtol=RTOL, like=like, what=f"d{name}")
    scores = score(dask_params, tok, lens)
    xp_assert_close(scores, score(host_params, tokens, lengths), rtol=RTOL, like=like, what="score")


def test_chunked_equals_unchunked(dask_params: Params) -> None:
    tokens, lengths = batch()
    loss_one, g_one = loss_and_grads(dask_params, on_dask(tokens, B), on_dask(lengths, B))
    loss_many, g_many = loss_and_grads(dask_params, on_dask(tokens, 2), on_dask(lengths, 2))
    like = dask_params.wte
    xp_assert_close(loss_many, loss_one, rtol=RTOL, like=like, what="loss")
    for name, g in g_many.arrays().items():
        xp_assert_close(g, g_one.arrays()[name], rtol=RTOL, like=like, what=f"d{name}")


def _layers(x: Any) -> dict[str, int]:
    """Layer name -> number of tasks of a Dask collection's high-level graph."""
    return {name: len(layer) for name, layer in x.__dask_graph__().layers.items()}


def _key_name(key: Any) -> str:
    return key[0] if isinstance(key, tuple) else key


def test_weights_enter_the_graph_once(dask_params: Params, forbid_compute: None) -> None:
    tokens, lengths = batch()
    weight_names = {a.name for a in dask_params.arrays().values()}
    assert len(weight_names) == len(dask_params.arrays())

    def build(rows_per_chunk: int) -> Any:
        tok, lens = on_dask(tokens[:, :-1], rows_per_chunk), on_dask(lengths - 1, rows_per_chunk)
        return forward(dask_params, tok, lens)

    graphs = {k: build(B // k) for k in (1, 3, 6)}  # 1, 3 and 6 batch chunks
    for k, logits in graphs.items():
        assert logits.numblocks[0] == k
        keys = [_key_name(key) for key in dict(logits.__dask_graph__())]
        for name in weight_names:
            assert keys.count(name) == 1, f"{k} chunks: weight {name} has {keys.count(name)} keys"

    # layers of the weights alone keep their names and sizes whatever the chunking; the rest
    # grow per chunk
    one, three, six = (_layers(graphs[k]) for k in (1, 3, 6))
    assert len(one) == len(three) == len(six)
    shared = set(one) & set(three) & set(six)
    assert weight_names <= shared
    assert all(one[n] == three[n] == six[n] for n in shared)
    fixed = sum(one[n] for n in shared)
    per_chunk = sum(one.values()) - fixed
    assert sum(three.values()) == fixed + 3 * per_chunk
    assert sum(six.values()) == fixed + 6 * per_chunk


def test_gradient_graph_reads_each_weight_once(dask_params: Params, forbid_compute: None) -> None:
    tokens, lengths = batch()
    loss, grads = loss_and_grads(dask_params, on_dask(tokens, 1), on_dask(lengths, 1))
    collection = da.stack([da.sum(g) for g in grads.arrays().values()] + [loss])
    keys = [_key_name(key) for key in dict(collection.__dask_graph__())]
    for name in (a.name for a in dask_params.arrays().values()):
        assert keys.count(name) == 1, name
